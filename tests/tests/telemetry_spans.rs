//! Step spans, captured by a test subscriber: a step delivered from the journal after a crash is
//! marked `executed = false` with replay mode `resume_from_checkpoint` (and its activity does
//! not run), while live attempts say why they run: first execution, in-stage retry, resume from
//! checkpoint, or operator restart.
//!
//! The subscriber is process-wide (workers run on many threads), so this file holds the span
//! tests alone and each test reads only its own workflow's spans.

use std::sync::OnceLock;

use tracing_subscriber::layer::SubscriberExt;
use waymark::operations::OperatorDecision;
use waymark::prelude::*;
use waymark::testing::{Boundary, Fault, PlannedFault, SpanLog, TestEnv};
use waymark::WorkerBuilder;
use waymark_tests::{apply_under_key, eventually, executions, with_id};

/// The process-wide log every test of this file reads.
fn span_log() -> &'static SpanLog {
    static LOG: OnceLock<SpanLog> = OnceLock::new();
    LOG.get_or_init(|| {
        let log = SpanLog::default();
        let subscriber = tracing_subscriber::registry().with(log.layer());
        tracing::subscriber::set_global_default(subscriber).expect("no other subscriber");
        log
    })
}

/// `workflow_id`'s step spans, as `name attempt mode executed outcome` lines in closing order.
fn steps_of(workflow_id: &str) -> Vec<String> {
    let steps = span_log().steps(workflow_id);
    let line = |f: &waymark::testing::SpanFields| {
        let fields = ["attempt", "replay_mode", "executed", "outcome"].map(|name| f.get(name));
        let [attempt, mode, executed, outcome] = fields;
        format!(
            "{} attempt={attempt} {mode} executed={executed} {outcome}",
            f.get("name")
        )
    };
    steps.iter().map(line).collect()
}

#[activity]
async fn fetch(cx: ActivityContext, order_id: String) -> Result<String, ActivityError> {
    waymark_tests::count(cx.workflow_id(), "fetch");
    Ok(format!("order {order_id}"))
}

#[activity(max_attempts = 3, initial_backoff_ms = 100)]
async fn store(cx: ActivityContext, order: String) -> Result<String, ActivityError> {
    waymark_tests::count(cx.workflow_id(), "store");
    Ok(format!("stored {order}"))
}

#[activity(effect, max_attempts = 3)]
async fn notify(cx: ActivityContext, #[key] order_id: String) -> Result<String, ActivityError> {
    Ok(apply_under_key(&cx, &order_id))
}

#[workflow]
async fn fetch_and_store(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    let order = ctx.activity(fetch, order_id).await?;
    Ok(ctx.activity(store, order).await?)
}

#[workflow]
async fn notifying(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    Ok(ctx.effect(notify, order_id).await?)
}

fn setup(b: WorkerBuilder) -> WorkerBuilder {
    b.register(fetch_and_store)
        .register(fetch)
        .register(store)
        .register(notifying)
        .register(notify)
}

#[tokio::test(flavor = "multi_thread")]
async fn replayed_steps_are_marked_and_not_executed_and_live_attempts_say_why_they_run() {
    span_log();
    let wf = "spans-crash";
    let faults = [
        PlannedFault::at("store", 1, Boundary::AfterCall, Fault::Timeout),
        PlannedFault::at("store", 2, Boundary::BeforeCall, Fault::Crash),
    ];
    let mut env = TestEnv::with_faults(faults, setup).await.unwrap();
    env.worker()
        .start_with(fetch_and_store, "ORD-1".into(), with_id(wf))
        .await
        .unwrap();
    let outcome = env.finish(fetch_and_store, wf, 40).await.expect("it ends");
    assert_eq!(outcome.unwrap(), "stored order ORD-1");
    env.stop().await;

    assert_eq!(executions(wf, "fetch"), 1, "replay did not run it again");
    assert_eq!(
        steps_of(wf),
        [
            "fetch attempt=1 first_execution executed=true ok",
            "store attempt=1 first_execution executed=true timeout",
            // The process dies before the retry's call leaves it.
            "store attempt=2 in_stage_retry executed=true crashed",
            "fetch attempt=1 resume_from_checkpoint executed=false replayed",
            "store attempt=2 resume_from_checkpoint executed=true ok",
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_attempt_an_operator_allowed_runs_in_operator_restart_mode() {
    span_log();
    let wf = "spans-operator";
    let lost = PlannedFault::at("notify", 1, Boundary::AfterCall, Fault::AckLost);
    let env = TestEnv::with_faults([lost], setup).await.unwrap();
    let run = env
        .worker()
        .start_with(notifying, "ORD-2".into(), with_id(wf))
        .await
        .unwrap();
    let parked = || !env.worker().awaiting_operator(wf).unwrap().is_empty();
    assert!(eventually(400, parked).await);
    let key = format!(r#"{wf}|notify|["ORD-2"]|v1"#);
    env.worker()
        .resolve_operation(&key, OperatorDecision::NotFound, "ops@example")
        .await
        .unwrap();
    run.result().await.unwrap();

    assert_eq!(
        steps_of(wf),
        [
            "notify attempt=1 first_execution executed=true uncertain",
            "notify attempt=2 operator_restart executed=true ok",
        ]
    );
}
