//! Truthful cost: every model attempt is priced (a failed one, one dropped at its timeout, one
//! a crash interrupted: estimated, and said so), tool cost is counted beside model cost, a
//! failed workflow's spend is labelled by the step it failed at, and amplification comes from
//! the journal, so a workflow a new process recovered counts whole in that process's figures.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use waymark::inspect::Entry;
use waymark::llm::{Completion, LlmError, LlmProvider, LlmRequest, ModelPrice, PriceTable, Usage};
use waymark::prelude::*;
use waymark::telemetry::names::{
    LLM_COST, LLM_TOKENS, LLM_WASTED_COST, RESUMES, RETRY_AMPLIFICATION, TOOL_COST,
};
use waymark::telemetry::Telemetry;
use waymark::testing::{Boundary, Fault, PlannedFault, TestEnv};
use waymark::WorkerBuilder;
use waymark_tests::{close_gate, count, eventually, executions, open_gate, pass_gate, with_id};

/// Answers every call with 10 prompt and 5 completion tokens, after a wait, as a model
/// behind a network does (so a call is journaled as scheduled before it answers). The first
/// call whose user text says `fail` fails with a 503; the first that says `stall` never
/// answers (its timeout drops it).
#[derive(Default)]
struct Model {
    failed: AtomicU32,
    stalled: AtomicU32,
}

impl LlmProvider for Model {
    fn complete(&self, request: LlmRequest) -> BoxFuture<'static, Result<Completion, LlmError>> {
        let text = request
            .messages
            .last()
            .map(|m| m.content.clone())
            .unwrap_or_default();
        let first = |count: &AtomicU32| count.fetch_add(1, Ordering::SeqCst) == 0;
        let outcome = if text.contains("fail") && first(&self.failed) {
            Some(Err(LlmError::Server {
                status: 503,
                message: "overloaded".into(),
            }))
        } else if text.contains("stall") && first(&self.stalled) {
            None
        } else {
            Some(Ok(Completion {
                text: format!("answer to {text}"),
                provider_model: format!("{}@test", request.model),
                usage: Usage {
                    prompt_tokens: 10,
                    completion_tokens: 5,
                },
                finish_reason: Some("stop".into()),
                tool_calls: Vec::new(),
            }))
        };
        Box::pin(async move {
            tokio::task::yield_now().await;
            match outcome {
                Some(outcome) => outcome,
                None => futures::future::pending().await,
            }
        })
    }
}

/// 1 micro-unit per token of either kind.
fn prices() -> PriceTable {
    let price = ModelPrice {
        prompt_micros_per_mtok: 1_000_000,
        completion_micros_per_mtok: 1_000_000,
    };
    PriceTable::default().with("writer", price)
}

/// Calls a paid geocoding API: 7 micro-units a call.
#[activity(initial_backoff_ms = 10)]
async fn geocode(cx: ActivityContext, address: String) -> Result<String, ActivityError> {
    cx.record_cost(7);
    count(cx.workflow_id(), "geocode");
    pass_gate(cx.workflow_id(), "geocode").await;
    Ok(format!("{address}: 52.37,4.89"))
}

/// Books a carrier, which refuses.
#[activity(effect)]
async fn book(#[key] order_id: String) -> Result<String, ActivityError> {
    Err(ActivityError::terminal(format!(
        "no carrier for {order_id}"
    )))
}

/// Asks the model `prompts`, in order, then geocodes and books.
#[workflow]
async fn plan_trip(ctx: WorkflowContext, prompts: Vec<String>) -> Result<String, WorkflowError> {
    for prompt in prompts {
        ctx.llm(Llm::new("writer").user(prompt)).await?;
    }
    let place = ctx.activity(geocode, "Dam 1".to_owned()).await?;
    ctx.effect(book, "ORD-1".to_owned()).await?;
    Ok(place)
}

fn setup(model: Arc<Model>) -> impl Fn(WorkerBuilder) -> WorkerBuilder + Send + Sync + 'static {
    move |builder: WorkerBuilder| {
        let options = ActivityOptions::default()
            .initial_backoff(Duration::from_millis(10))
            .start_to_close_timeout(Duration::from_secs(5));
        builder
            .register(plan_trip)
            .register(geocode)
            .register(book)
            .llm(model.clone())
            .llm_prices(prices())
            .llm_options(options)
    }
}

fn prompts(texts: &[&str]) -> Vec<String> {
    texts.iter().map(|text| (*text).to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn failed_and_timed_out_attempts_are_priced_and_the_failure_is_labelled_by_its_step() {
    let mut env = TestEnv::start(setup(Arc::default())).await.unwrap();
    let wf = "cost-attempts";
    let texts = prompts(&["fail once", "stall once"]);
    env.worker()
        .start_with(plan_trip, texts, with_id(wf))
        .await
        .unwrap();
    let error = env.finish(plan_trip, wf, 40).await.unwrap().unwrap_err();
    assert!(error.to_string().contains("no carrier"), "{error}");
    let metrics = env.metrics();
    let cost = |attempt: &str, priced: &str| {
        let labels = [
            ("model", "writer"),
            ("attempt", attempt),
            ("priced", priced),
        ];
        metrics.value(LLM_COST, &labels)
    };
    assert_eq!(cost("completed", "reported"), 30.0, "two answers, 15 each");
    // Each lost attempt sent its request: estimated from its size, streamed nothing.
    let failed = cost("failed", "estimated");
    let timed_out = cost("timed_out", "estimated");
    assert!(failed > 0.0 && timed_out > 0.0, "{failed} {timed_out}");
    let prompt_tokens = |attempt: &str| {
        let labels = [("kind", "prompt"), ("attempt", attempt)];
        metrics.value(LLM_TOKENS, &labels)
    };
    assert_eq!(failed, prompt_tokens("failed"), "1 micro-unit a token");
    let wasted = |failed_at: &str, stage: &str| {
        metrics.value(
            LLM_WASTED_COST,
            &[("failed_at", failed_at), ("stage", stage)],
        )
    };
    assert_eq!(wasted("writer", "attempt_failed"), failed);
    assert_eq!(wasted("writer", "attempt_timed_out"), timed_out);
    assert_eq!(
        wasted("book", "effect"),
        30.0,
        "the run's journaled spend, where it failed"
    );
    assert_eq!(metrics.value(TOOL_COST, &[("activity", "geocode")]), 7.0);
}

/// The first process journals a failed model attempt and its retry, and is stopped while a
/// read is in flight; a second process, with figures of its own, finishes the run. Its
/// amplification counts all of it, from the journal: 2 attempts of the first model call, 1 of
/// the second, the read twice (cut off by the stop under attempt 1, which the journal cannot
/// show but the new process knows it ran again, then to its end) and the effect: 6 calls for 4
/// needed.
#[tokio::test(flavor = "multi_thread")]
async fn a_workflow_recovered_by_a_new_process_counts_whole_in_its_amplification() {
    let wf = "cost-recovered";
    let model = Arc::new(Model::default());
    let mut env = TestEnv::start(setup(model.clone())).await.unwrap();
    let first = env.telemetry().clone();
    close_gate(wf, "geocode");
    env.worker()
        .start_with(plan_trip, prompts(&["fail once", "again"]), with_id(wf))
        .await
        .unwrap();
    // The retry waits on the test's clock: move it until the read runs, and its schedule is
    // journaled (written just after its first poll): only then does the journal show the new
    // process a read that was cut off.
    let scheduled = |env: &TestEnv| {
        let journal = env.worker().journal(wf).unwrap_or_default();
        journal.iter().any(|entry| match entry {
            Entry::ActivityScheduled { identity, .. }
            | Entry::ActivityScheduledAt { identity, .. } => identity.name == "geocode",
            _ => false,
        })
    };
    let reading = || executions(wf, "geocode") >= 1 && scheduled(&env);
    for _ in 0..400 {
        if reading() {
            break;
        }
        env.advance(Duration::from_millis(50)).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(reading(), "the read runs");

    let second = Telemetry::new();
    let own = second.clone();
    let recovering = setup(model.clone());
    env.boot_with(move |builder| recovering(builder).telemetry(own.clone()))
        .await
        .unwrap();
    open_gate(wf, "geocode");
    let error = env.finish(plan_trip, wf, 40).await.unwrap().unwrap_err();
    assert!(error.to_string().contains("no carrier"), "{error}");

    let figures = second.snapshot();
    let amplification = |part: &str| figures.value(&format!("{RETRY_AMPLIFICATION}_{part}"), &[]);
    assert_eq!(amplification("count"), 1.0, "the new process saw it end");
    let by_hand = (2.0 + 1.0 + 2.0 + 1.0) / 4.0;
    assert!(
        (amplification("sum") - by_hand).abs() < 1e-9,
        "{} != {by_hand}",
        amplification("sum")
    );
    let resumed = [
        ("point", "in_flight_call"),
        ("step", "geocode"),
        ("stage", "read"),
    ];
    assert_eq!(figures.value(RESUMES, &resumed), 1.0);
    let before = first.snapshot();
    assert_eq!(
        before.value(&format!("{RETRY_AMPLIFICATION}_count"), &[]),
        0.0,
        "the first process never saw it end"
    );
}

/// A model call cut off by a crash after its request went out is priced by the process that
/// runs it again, as an estimate.
#[tokio::test(flavor = "multi_thread")]
async fn a_model_call_a_crash_interrupted_is_priced_by_the_next_process() {
    let wf = "cost-interrupted";
    let crash = PlannedFault::at("waymark.llm", 1, Boundary::AfterCall, Fault::Crash).on_seq(0);
    let mut env = TestEnv::with_faults([crash], setup(Arc::default()))
        .await
        .unwrap();
    env.worker()
        .start_with(plan_trip, prompts(&["hello"]), with_id(wf))
        .await
        .unwrap();
    let error = env.finish(plan_trip, wf, 40).await.unwrap().unwrap_err();
    assert!(error.to_string().contains("no carrier"), "{error}");
    assert_eq!(env.faults().fired().len(), 1);
    let metrics = env.metrics();
    let labels = [("attempt", "interrupted"), ("priced", "estimated")];
    let interrupted = metrics.value(LLM_COST, &labels);
    assert!(interrupted > 0.0, "priced: {interrupted}");
    let wasted = [("failed_at", "writer"), ("stage", "attempt_interrupted")];
    assert_eq!(metrics.value(LLM_WASTED_COST, &wasted), interrupted);
    let completed = [("attempt", "completed")];
    assert_eq!(
        metrics.value(LLM_COST, &completed),
        15.0,
        "one journaled answer"
    );
}

/// A model call waiting for its retry when the process stops had nothing in flight: its failed
/// attempt is priced once, as failed, and nothing is priced as interrupted.
#[tokio::test(flavor = "multi_thread")]
async fn a_retry_waiting_across_a_restart_is_not_priced_as_interrupted() {
    let wf = "cost-backoff";
    let model = Arc::new(Model::default());
    let mut env = TestEnv::start(setup(model.clone())).await.unwrap();
    env.worker()
        .start_with(plan_trip, prompts(&["fail once"]), with_id(wf))
        .await
        .unwrap();
    let failed = |env: &TestEnv| {
        let labels = [("attempt", "failed"), ("priced", "estimated")];
        env.metrics().value(LLM_COST, &labels)
    };
    // The attempt is priced when the provider answers, before its failure is journaled: wait
    // for the journal, so that the stop below finds the retry waiting, not the attempt running.
    let retry_journaled = |env: &TestEnv| {
        let journal = env.worker().journal(wf).unwrap_or_default();
        journal
            .iter()
            .any(|entry| matches!(entry, Entry::ActivityAttemptFailed { .. }))
    };
    assert!(eventually(400, || retry_journaled(&env)).await);
    let priced = failed(&env);
    assert!(priced > 0.0, "the failed attempt is priced");
    env.crash_and_restart().await.unwrap();
    let error = env.finish(plan_trip, wf, 40).await.unwrap().unwrap_err();
    assert!(error.to_string().contains("no carrier"), "{error}");
    assert_eq!(failed(&env), priced, "priced once");
    let interrupted = [("attempt", "interrupted")];
    assert_eq!(env.metrics().value(LLM_COST, &interrupted), 0.0);
}
