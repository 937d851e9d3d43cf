//! The replay mode, readable by code: an activity learns whether it runs for the first time,
//! as a retry, after a crash or on an operator's word, and workflow code whether it walks
//! recorded history or runs live.

use std::sync::Mutex;

use waymark::prelude::*;
use waymark::testing::{Boundary, Fault, PlannedFault, TestEnv};
use waymark::WorkerBuilder;
use waymark_tests::with_id;

/// What the code saw, in the order it saw it.
static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn saw(what: String) {
    SEEN.lock().unwrap().push(what);
}

/// Fails its first attempt; says which mode each attempt ran in.
#[activity(max_attempts = 3, initial_backoff_ms = 10)]
async fn flaky(cx: ActivityContext, step: String) -> Result<String, ActivityError> {
    saw(format!(
        "{step} attempt {} {:?}",
        cx.attempt(),
        cx.replay_mode()
    ));
    match cx.attempt() {
        1 => Err(ActivityError::retriable("the index is warming up")),
        _ => Ok(step),
    }
}

/// Says which mode it ran in.
#[activity]
async fn load(cx: ActivityContext, step: String) -> Result<String, ActivityError> {
    saw(format!(
        "{step} attempt {} {:?}",
        cx.attempt(),
        cx.replay_mode()
    ));
    Ok(step)
}

#[workflow]
async fn modes(ctx: WorkflowContext, _input: ()) -> Result<String, WorkflowError> {
    saw(format!("workflow at start {:?}", ctx.replay_mode()));
    ctx.activity(flaky, "retried".into()).await?;
    saw(format!("workflow after the retry {:?}", ctx.replay_mode()));
    ctx.activity(load, "resumed".into()).await?;
    saw(format!("workflow at the end {:?}", ctx.replay_mode()));
    Ok("done".into())
}

#[tokio::test]
async fn activities_and_workflow_code_read_why_they_run() {
    // The worker dies right before `load`'s first call: the next process runs it again.
    let crash = PlannedFault::at("load", 1, Boundary::BeforeCall, Fault::Crash);
    let setup = |b: WorkerBuilder| b.register(modes).register(flaky).register(load);
    let mut env = TestEnv::with_faults([crash], setup).await.unwrap();
    let wf = "replay-modes";
    env.worker()
        .start_with(modes, (), with_id(wf))
        .await
        .unwrap();
    let outcome = env.finish(modes, wf, 40).await.expect("the run ends");
    assert_eq!(outcome.unwrap(), "done");
    let seen = SEEN.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            "workflow at start FirstExecution",
            "retried attempt 1 FirstExecution",
            "retried attempt 2 InStageRetry",
            "workflow after the retry FirstExecution",
            // The crash: the journal is replayed by the new process.
            "workflow at start ResumeFromCheckpoint",
            "workflow after the retry ResumeFromCheckpoint",
            "resumed attempt 1 ResumeFromCheckpoint",
            "workflow at the end FirstExecution",
        ]
    );
}
