//! The replay-safety metrics, driven through fault scenarios whose figures are worked out by
//! hand. Every worker of a `TestEnv` counts into one `Telemetry`, so the figures span crashes
//! and restarts the way a scrape series spans a worker's life.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use waymark::llm::{
    ChunkSink, Completion, LlmError, LlmProvider, LlmRequest, ModelPrice, PriceTable, Usage,
    Validator,
};
use waymark::operations::OperatorDecision;
use waymark::prelude::*;
use waymark::telemetry::names::*;
use waymark::testing::{Boundary, Fault, PlannedFault, TestEnv};
use waymark::{Worker, WorkerBuilder};
use waymark_tests::{
    applied_effects, apply_under_key, eventually, executions, with_id, AnswersAfterAWait,
};

#[activity(effect, reconcile = find_booking, max_attempts = 4, initial_backoff_ms = 100)]
async fn book(cx: ActivityContext, #[key] order_id: String) -> Result<String, ActivityError> {
    Ok(apply_under_key(&cx, &order_id))
}

async fn find_booking(
    cx: ActivityContext,
    _order_id: String,
) -> Result<Reconciled<String>, ActivityError> {
    Ok(waymark_tests::reconcile_by_key(&cx))
}

/// An effect without a reconciler: an unknown outcome waits for an operator.
#[activity(effect, max_attempts = 4, initial_backoff_ms = 100)]
async fn notify(cx: ActivityContext, #[key] order_id: String) -> Result<String, ActivityError> {
    waymark_tests::count(cx.workflow_id(), "notify");
    Ok(apply_under_key(&cx, &order_id))
}

#[workflow]
async fn booking(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    Ok(ctx.effect(book, order_id).await?)
}

#[workflow]
async fn notifying(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    Ok(ctx.effect(notify, order_id).await?)
}

/// One model call, then the workflow gives up.
#[workflow]
async fn gives_up(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    ctx.llm(Llm::new("writer").user(format!("can {order_id} ship?")))
        .await?;
    Err(WorkflowError::new("the order cannot ship"))
}

/// Five model calls in a row.
#[workflow]
async fn five_calls(ctx: WorkflowContext, topic: String) -> Result<u32, WorkflowError> {
    for part in 0..5 {
        let request = Llm::new("writer").user(format!("write part {part} on {topic}"));
        ctx.llm(request).await?;
    }
    Ok(5)
}

#[derive(Debug, Serialize, Deserialize)]
struct Plan {
    carrier: String,
}

/// A plan through the repair ladder, then a streamed answer.
#[workflow]
async fn planned(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    let plan = ctx
        .llm(Llm::new("planner").user(format!("plan {order_id}")))
        .validate(Validator::json::<Plan>())
        .repair(2)
        .await?;
    let answer = Llm::new("writer")
        .user(format!("explain {}", plan.response.text))
        .streamed();
    Ok(ctx.llm(answer).await?.text)
}

/// Every call costs 10 prompt and 5 completion tokens; a planner's first answer is not JSON.
/// Counts the calls that reach it.
struct Model;

static MODEL_CALLS: AtomicU32 = AtomicU32::new(0);
const ANSWER: &str = "Your parcel ships today with fastship.";

impl Model {
    fn answer(request: &LlmRequest) -> Completion {
        MODEL_CALLS.fetch_add(1, Ordering::SeqCst);
        let text = match (request.model.as_str(), request.messages.len()) {
            ("planner", 1) => "fastship, probably".to_owned(),
            ("planner", _) => r#"{"carrier":"fastship"}"#.to_owned(),
            _ => ANSWER.to_owned(),
        };
        Completion {
            text,
            provider_model: format!("{}@test", request.model),
            usage: Usage {
                prompt_tokens: 10,
                completion_tokens: 5,
            },
            finish_reason: Some("stop".into()),
            tool_calls: Vec::new(),
        }
    }
}

/// 1 micro-unit per prompt token, 2 per completion token: 20 per call.
fn prices() -> PriceTable {
    let price = ModelPrice {
        prompt_micros_per_mtok: 1_000_000,
        completion_micros_per_mtok: 2_000_000,
    };
    PriceTable::default()
        .with("writer", price)
        .with("planner", price)
}

fn setup(b: WorkerBuilder) -> WorkerBuilder {
    let options = ActivityOptions::default().initial_backoff(Duration::from_millis(100));
    b.register(booking)
        .register(book)
        .register(notifying)
        .register(notify)
        .register(five_calls)
        .register(planned)
        .register(gives_up)
        .llm(AnswersAfterAWait(Model::answer))
        .llm_prices(prices())
        .llm_options(options)
}

async fn env_with(faults: Vec<PlannedFault>) -> TestEnv {
    TestEnv::with_faults(faults, setup).await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn one_lost_acknowledgement_is_one_duplicate_intent_and_no_downstream_repeat() {
    let wf = "tm-ack-lost";
    let lost = PlannedFault::at("book", 1, Boundary::AfterCall, Fault::AckLost);
    let mut env = env_with(vec![lost]).await;
    env.worker()
        .start_with(booking, "ORD-1".into(), with_id(wf))
        .await
        .unwrap();
    let outcome = env.finish(booking, wf, 40).await.expect("it finishes");
    assert_eq!(
        outcome.unwrap(),
        "ref-1",
        "the reconciler found the booking"
    );

    let key = format!(r#"{wf}|book|["ORD-1"]|v1"#);
    assert_eq!(applied_effects(&key).len(), 1, "applied once downstream");
    let metrics = env.metrics();
    let effect = [("effect", "book")];
    assert_eq!(
        metrics.value(DUPLICATE_INTENTS, &effect),
        1.0,
        "reconciled once"
    );
    assert_eq!(metrics.value(DOWNSTREAM_REPEATS, &effect), 0.0);
    assert_eq!(metrics.value(UNKNOWN_OUTCOMES, &effect), 1.0);
    assert_eq!(
        metrics.value(UNKNOWN_OUTCOME_OPERATIONS, &[]),
        0.0,
        "settled"
    );
    assert_eq!(metrics.value(INVOCATIONS, &[("kind", "effect")]), 1.0);
    assert_eq!(metrics.value(IDEAL_INVOCATIONS, &[]), 1.0);
    let amplification = format!("{RETRY_AMPLIFICATION}_sum");
    assert_eq!(metrics.value(&amplification, &[]), 1.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_after_three_of_five_model_calls_amplifies_calls_by_six_fifths() {
    let wf = "tm-five-calls";
    // The fourth call (seq 3) is answered, then the process dies before the answer is
    // journaled: three calls replay, the fourth runs again, the fifth runs once.
    let crash = PlannedFault::at("waymark.llm", 1, Boundary::AfterCall, Fault::Crash).on_seq(3);
    let mut env = env_with(vec![crash]).await;
    let before = MODEL_CALLS.load(Ordering::SeqCst);
    env.worker()
        .start_with(five_calls, "delays".into(), with_id(wf))
        .await
        .unwrap();
    let outcome = env.finish(five_calls, wf, 40).await.expect("it finishes");
    assert_eq!(outcome.unwrap(), 5);
    assert_eq!(env.faults().fired().len(), 1);

    let metrics = env.metrics();
    let by_hand = 6.0 / 5.0;
    assert_eq!(metrics.value(INVOCATIONS, &[("kind", "llm")]), 6.0);
    assert_eq!(metrics.value(IDEAL_INVOCATIONS, &[]), 5.0);
    let amplification = |part: &str| metrics.value(&format!("{RETRY_AMPLIFICATION}_{part}"), &[]);
    assert_eq!(amplification("count"), 1.0);
    assert!(
        (amplification("sum") - by_hand).abs() < 1e-9,
        "{}",
        amplification("sum")
    );
    assert!(
        MODEL_CALLS.load(Ordering::SeqCst) - before >= 6,
        "the provider saw six calls"
    );

    let resumed = metrics.value(RESUMES, &[("point", "in_flight_call")]);
    assert_eq!(resumed, 1.0, "it resumed with the fourth call in flight");
    let recovery = format!("{RECOVERY_LATENCY}_count");
    assert_eq!(metrics.value(&recovery, &[("cause", "worker_start")]), 1.0);
    // Journaled calls are priced from their reported usage; the crashed call's lost answer is
    // priced by the process that ran it again, as an estimate of its request.
    let completed = [("attempt", "completed"), ("priced", "reported")];
    let prompt = [("kind", "prompt"), completed[0], completed[1]];
    assert_eq!(metrics.value(LLM_TOKENS, &prompt), 50.0);
    let generated = [("kind", "completion"), completed[0], completed[1]];
    assert_eq!(metrics.value(LLM_TOKENS, &generated), 25.0);
    let writer = [("model", "writer"), completed[0], completed[1]];
    assert_eq!(metrics.value(LLM_COST, &writer), 100.0);
    let interrupted = [("attempt", "interrupted"), ("priced", "estimated")];
    assert!(metrics.value(LLM_COST, &interrupted) > 0.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_repaired_plan_and_a_retried_stream_are_counted_once_across_a_crash() {
    let wf = "tm-planned";
    // The streamed answer (seq 4, after two calls and two verdicts) loses its first attempt after streaming it; then the process
    // dies before its retry is journaled, so everything before it replays.
    let faults = vec![
        PlannedFault::at("waymark.llm", 1, Boundary::AfterCall, Fault::Timeout).on_seq(4),
        PlannedFault::at("waymark.llm", 2, Boundary::AfterCall, Fault::Crash).on_seq(4),
    ];
    let mut env = env_with(faults).await;
    env.worker()
        .start_with(planned, "ORD-9".into(), with_id(wf))
        .await
        .unwrap();
    let outcome = env.finish(planned, wf, 60).await.expect("it finishes");
    assert_eq!(outcome.unwrap(), ANSWER);
    assert_eq!(env.faults().pending(), [], "both faults fired");

    let metrics = env.metrics();
    let depth = |part: &str| metrics.value(&format!("{VALIDATOR_DEPTH}_{part}"), &[]);
    assert_eq!(
        (depth("count"), depth("sum")),
        (1.0, 1.0),
        "one ladder, one repair"
    );
    let wasted = metrics.value(LLM_WASTED_COST, &[("failed_at", "validator")]);
    assert_eq!(wasted, 20.0, "the rejected first plan");
    assert!(
        metrics.value(STREAM_SUPERSEDED, &[]) >= 1.0,
        "the timed-out version"
    );
    assert_eq!(
        metrics.value(STREAM_DIVERGENCE, &[]),
        0.0,
        "shown = committed"
    );
    // The crash hit the retry of the timed-out answer: the journal's last word on that step is
    // the failed first attempt and when to retry it.
    let resumed = metrics.value(RESUMES, &[("point", "retry_backoff")]);
    assert_eq!(resumed, 1.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_outcome_stays_on_the_gauge_until_an_operator_settles_it() {
    let wf = "tm-operator";
    let lost = PlannedFault::at("notify", 1, Boundary::AfterCall, Fault::AckLost);
    let env = env_with(vec![lost]).await;
    let run = env
        .worker()
        .start_with(notifying, "ORD-4".into(), with_id(wf))
        .await
        .unwrap();
    let parked = || !env.worker().awaiting_operator(wf).unwrap().is_empty();
    assert!(eventually(400, parked).await);
    let gauge = || env.metrics().value(UNKNOWN_OUTCOME_OPERATIONS, &[]);
    assert_eq!(gauge(), 1.0);

    let key = format!(r#"{wf}|notify|["ORD-4"]|v1"#);
    env.worker()
        .resolve_operation(&key, OperatorDecision::NotFound, "ops@example")
        .await
        .unwrap();
    run.result().await.unwrap();
    assert_eq!(gauge(), 0.0);
    assert_eq!(
        executions(wf, "notify"),
        2,
        "the operator allowed a second call"
    );
    let metrics = env.metrics();
    let effect = [("effect", "notify")];
    assert_eq!(metrics.value(UNKNOWN_OUTCOMES, &effect), 1.0);
    // The key came up again for the operator's retry, and reached the downstream again.
    assert_eq!(metrics.value(DUPLICATE_INTENTS, &effect), 2.0);
    assert_eq!(metrics.value(DOWNSTREAM_REPEATS, &effect), 1.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_workflow_counts_its_model_spend_as_wasted_where_it_failed() {
    let wf = "tm-failed";
    let mut env = env_with(Vec::new()).await;
    env.worker()
        .start_with(gives_up, "ORD-7".into(), with_id(wf))
        .await
        .unwrap();
    let outcome = env.finish(gives_up, wf, 40).await.expect("it finishes");
    assert!(outcome.is_err());
    let metrics = env.metrics();
    let wasted = metrics.value(LLM_WASTED_COST, &[("failed_at", "workflow")]);
    assert_eq!(wasted, 20.0, "the one call it made");
    assert_eq!(metrics.value(IDEAL_INVOCATIONS, &[]), 1.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_outcome_leaves_the_gauge_when_its_workflow_is_cancelled() {
    let wf = "tm-cancelled";
    let lost = PlannedFault::at("notify", 1, Boundary::AfterCall, Fault::AckLost);
    let mut env = env_with(vec![lost]).await;
    env.worker()
        .start_with(notifying, "ORD-5".into(), with_id(wf))
        .await
        .unwrap();
    let parked = || !env.worker().awaiting_operator(wf).unwrap().is_empty();
    assert!(eventually(400, parked).await);
    // Counted once the commit that parked it returns to its executor, after the log shows it.
    let counted = || {
        let metrics = env.metrics();
        metrics.value(UNKNOWN_OUTCOMES, &[("effect", "notify")]) == 1.0
    };
    assert!(eventually(400, counted).await);
    // A new worker finds the parked operation: on the gauge once, not counted again.
    env.crash_and_restart().await.unwrap();
    let metrics = env.metrics();
    assert_eq!(metrics.value(UNKNOWN_OUTCOME_OPERATIONS, &[]), 1.0);
    assert_eq!(
        metrics.value(UNKNOWN_OUTCOMES, &[("effect", "notify")]),
        1.0
    );

    env.worker().cancel(wf, "customer withdrew").await.unwrap();
    let metrics = env.metrics();
    assert_eq!(
        metrics.value(UNKNOWN_OUTCOME_OPERATIONS, &[]),
        0.0,
        "nobody can settle it now"
    );
}

/// Streams one text and returns another, as a buggy provider adapter might.
struct Inconsistent;

impl LlmProvider for Inconsistent {
    fn complete(&self, request: LlmRequest) -> BoxFuture<'static, Result<Completion, LlmError>> {
        Box::pin(futures::future::ready(Ok(Model::answer(&request))))
    }

    fn stream(
        &self,
        request: LlmRequest,
        mut chunks: ChunkSink,
    ) -> BoxFuture<'static, Result<Completion, LlmError>> {
        chunks("Your parcel is lost.");
        Box::pin(futures::future::ready(Ok(Model::answer(&request))))
    }
}

#[workflow]
async fn one_streamed_answer(
    ctx: WorkflowContext,
    order_id: String,
) -> Result<String, WorkflowError> {
    let answer = Llm::new("writer")
        .user(format!("explain {order_id}"))
        .streamed();
    Ok(ctx.llm(answer).await?.text)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_that_differs_from_the_committed_answer_is_counted_as_divergence() {
    let wf = "tm-divergence";
    let setup = |b: WorkerBuilder| b.register(one_streamed_answer).llm(Inconsistent);
    let mut env = TestEnv::with_faults(Vec::new(), setup).await.unwrap();
    env.worker()
        .start_with(one_streamed_answer, "ORD-8".into(), with_id(wf))
        .await
        .unwrap();
    let outcome = env
        .finish(one_streamed_answer, wf, 40)
        .await
        .expect("it ends");
    assert_eq!(outcome.unwrap(), ANSWER);
    assert_eq!(env.metrics().value(STREAM_DIVERGENCE, &[]), 1.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_process_puts_a_parked_unknown_outcome_back_on_its_gauge() {
    let wf = "tm-new-process";
    let dir = tempfile::tempdir().unwrap();
    let lost = PlannedFault::at("notify", 1, Boundary::AfterCall, Fault::AckLost);
    let faults = std::sync::Arc::new(waymark::testing::FaultPlan::new([lost]));
    let first = setup(Worker::builder().data_dir(dir.path()).faults(faults))
        .build()
        .await
        .unwrap();
    first
        .start_with(notifying, "ORD-6".into(), with_id(wf))
        .await
        .unwrap();
    let parked = || !first.awaiting_operator(wf).unwrap().is_empty();
    assert!(eventually(400, parked).await);
    first.shutdown().await;

    // A fresh process has fresh figures: the parked operation is found, not counted again.
    let second = setup(Worker::builder().data_dir(dir.path()))
        .build()
        .await
        .unwrap();
    let gauge = || {
        second
            .telemetry()
            .snapshot()
            .value(UNKNOWN_OUTCOME_OPERATIONS, &[])
    };
    assert!(eventually(400, || gauge() == 1.0).await, "{}", gauge());
    let counted = second.telemetry().snapshot().value(UNKNOWN_OUTCOMES, &[]);
    assert_eq!(counted, 0.0);
    second.shutdown().await;
}
