//! The largest payload a worker journals: a start, a step's input, a step's result and a
//! workflow's output over it get an error naming the step and both sizes, and nothing over it
//! reaches the store. An effect whose result is too large happened all the same: it is
//! recorded as committed and never called again.

use std::time::Duration;

use waymark::inspect::{OperationStatus, WorkflowStatus};
use waymark::prelude::*;
use waymark::testing::TestEnv;
use waymark::{RunError, StartError};
use waymark_tests::{count, executions, with_id};

const MAX: usize = 1_024;

fn big(bytes: usize) -> String {
    "x".repeat(bytes)
}

#[activity]
async fn echo(cx: ActivityContext, text: String) -> Result<usize, ActivityError> {
    count(cx.workflow_id(), "echo");
    Ok(text.len())
}

#[activity]
async fn produce(cx: ActivityContext, bytes: usize) -> Result<String, ActivityError> {
    count(cx.workflow_id(), "produce");
    Ok(big(bytes))
}

#[activity(effect)]
async fn export_report(
    cx: ActivityContext,
    #[key] report: String,
) -> Result<String, ActivityError> {
    count(cx.workflow_id(), "export_report");
    Ok(format!("{report}:{}", big(2 * MAX)))
}

/// Asks for each step with a size, and says how each went.
#[workflow]
async fn sizes(ctx: WorkflowContext, plan: (usize, usize, bool)) -> Result<String, WorkflowError> {
    let (input_bytes, result_bytes, export) = plan;
    let mut said = Vec::new();
    match ctx.activity(echo, big(input_bytes)).await {
        Ok(len) => said.push(format!("echo {len}")),
        Err(error) => said.push(format!("echo failed: {error}")),
    }
    match ctx.activity(produce, result_bytes).await {
        Ok(text) => said.push(format!("produce {}", text.len())),
        Err(error) => said.push(format!("produce failed: {error}")),
    }
    // The second call is the same intent: answered from the operation log, as the first went.
    for _ in 0..if export { 2 } else { 0 } {
        match ctx.effect(export_report, "r-1".to_owned()).await {
            Ok(_) => said.push("exported".into()),
            Err(error) => said.push(format!("export failed: {error}")),
        }
    }
    Ok(said.join("\n"))
}

#[workflow]
async fn grows(_ctx: WorkflowContext, bytes: usize) -> Result<String, WorkflowError> {
    Ok(big(bytes))
}

async fn env() -> TestEnv {
    let registered = |b: waymark::WorkerBuilder| {
        b.max_payload_bytes(MAX)
            .register(sizes)
            .register(grows)
            .register(echo_workflow)
            .register(echo)
            .register(produce)
            .register(export_report)
    };
    TestEnv::start(registered).await.unwrap()
}

async fn result<T>(run: waymark::RunHandle<T>) -> Result<T, RunError>
where
    T: serde::de::DeserializeOwned,
{
    tokio::time::timeout(Duration::from_secs(10), run.result())
        .await
        .expect("the run ends")
}

#[tokio::test]
async fn a_start_over_the_limit_is_refused_and_writes_nothing() {
    let env = env().await;
    let big_start = env
        .worker()
        .start_with(echo_workflow, big(MAX * 2), with_id("too-large"))
        .await;
    let Err(StartError::PayloadTooLarge(message)) = big_start else {
        panic!(
            "expected PayloadTooLarge, got {:?}",
            big_start.map(|r| r.id().to_owned())
        );
    };
    assert!(
        message.contains("the input of workflow `echo_workflow`")
            && message.contains(&format!("{MAX} bytes")),
        "{message}"
    );
    assert_eq!(env.worker().workflow_status("too-large").unwrap(), None);
}

#[workflow]
async fn echo_workflow(_ctx: WorkflowContext, text: String) -> Result<usize, WorkflowError> {
    Ok(text.len())
}

#[tokio::test]
async fn a_step_input_or_result_over_the_limit_fails_that_step_naming_it() {
    let env = env().await;
    let id = "steps-too-large";
    let run = env
        .worker()
        .start_with(sizes, (MAX * 2, MAX * 2, false), with_id(id))
        .await
        .unwrap();
    let said = result(run).await.unwrap();
    let lines: Vec<&str> = said.lines().collect();
    assert!(
        lines[0].starts_with("echo failed:")
            && lines[0].contains("the input of `echo` (seq 0)")
            && lines[0].contains("was not called"),
        "{said}"
    );
    assert!(
        lines[1].starts_with("produce failed:")
            && lines[1].contains("the result of `produce` (seq 1, attempt 1)"),
        "{said}"
    );
    assert_eq!(
        executions(id, "echo"),
        0,
        "an input too large is never sent"
    );
    assert_eq!(
        executions(id, "produce"),
        1,
        "a result too large is not retried"
    );
    // Nothing over the limit is in the journal.
    for entry in env.worker().journal(id).unwrap() {
        let encoded = format!("{entry:?}");
        assert!(
            encoded.len() < MAX * 2,
            "an entry holds the payload: {}",
            encoded.len()
        );
    }
}

#[tokio::test]
async fn an_effect_whose_result_is_too_large_is_committed_and_not_called_again() {
    let mut env = env().await;
    let id = "effect-too-large";
    let run = env
        .worker()
        .start_with(sizes, (1, 1, true), with_id(id))
        .await
        .unwrap();
    let said = result(run).await.unwrap();
    let lines: Vec<&str> = said.lines().collect();
    assert!(
        lines[2].starts_with("export failed:")
            && lines[2].contains("the result of `export_report`"),
        "{said}"
    );
    assert!(
        lines[3].starts_with("export failed:") && lines[3].contains("too large to journal"),
        "the same intent again is answered with the failure, not the placeholder: {said}"
    );
    let operations = env.worker().operations(id).unwrap();
    let (_, record) = &operations[0];
    assert!(
        matches!(record.status, OperationStatus::Committed { .. }),
        "{record:?}"
    );
    // A restart replays the failure; the effect is not asked again.
    env.crash_and_restart().await.unwrap();
    assert_eq!(executions(id, "export_report"), 1);
}

#[tokio::test]
async fn a_workflow_output_over_the_limit_fails_the_workflow_saying_so() {
    let env = env().await;
    let run = env
        .worker()
        .start_with(grows, MAX * 2, with_id("output-too-large"))
        .await
        .unwrap();
    let error = result(run).await.unwrap_err();
    assert!(
        error.to_string().contains("the workflow's output is"),
        "{error}"
    );
    let status = env.worker().workflow_status("output-too-large").unwrap();
    assert_eq!(status, Some(WorkflowStatus::Failed));
}

/// A 10 MiB result, then a wait: replayed after a restart from the journal.
#[workflow]
async fn large_then_wait(ctx: WorkflowContext, bytes: usize) -> Result<usize, WorkflowError> {
    let text = ctx.activity(produce, bytes).await?;
    let _: String = ctx.signal("go").await?;
    Ok(text.len())
}

#[tokio::test]
async fn a_ten_mebibyte_result_replays_after_a_restart_without_running_again() {
    let id = "ten-mebibytes";
    let registered = |b: waymark::WorkerBuilder| b.register(large_then_wait).register(produce);
    let mut env = TestEnv::start(registered).await.unwrap();
    env.worker()
        .start_with(large_then_wait, 10 << 20, with_id(id))
        .await
        .unwrap();
    let waits = || {
        let journal = env.worker().journal(id).unwrap_or_default();
        journal
            .iter()
            .any(|e| matches!(e, waymark::inspect::Entry::SignalAwaitedAt { .. }))
    };
    assert!(waymark_tests::eventually(400, waits).await);
    env.crash_and_restart().await.unwrap();
    env.worker().signal(id, "go", "go-1", &"now").await.unwrap();
    let run = env.worker().handle(large_then_wait, id);
    assert_eq!(result(run).await.unwrap(), 10 << 20);
    assert_eq!(executions(id, "produce"), 1, "replayed from the journal");
}
