//! The restart matrix: every scenario runs once without faults, then once per synced journal
//! write with the worker stopped right after it (the next synced journal write fails, and every
//! write after it; the worker is dropped, and a new one starts on the same store), and once
//! evicted at every wait (the scenarios that wait). Each must end with the output, the journal
//! and the effect counts of the run without faults.
//!
//! One difference is the protocol's, not a bug: an effect whose
//! call was in flight when the worker stopped is reconciled on resume (`effect_uncertain`, then
//! `effect_reconciled … committed`) where the run without faults journaled
//! `activity_completed`. The comparison reads both as "attempt N completed with this output";
//! every other line must be the same, in order.

use std::sync::Arc;
use std::time::Duration;

use waymark::approvals::{ApprovalOutcome, ApprovalVerdict};
use waymark::llm::{Completion, LlmRequest, Usage};
use waymark::prelude::*;
use waymark::snapshots::{Retrieval, RetrievedDocument};
use waymark::store::{MemoryEngine, MemoryStore, Table};
use waymark::telemetry::names;
use waymark::WorkerBuilder;
use waymark_tests::{applied_effects, with_id, AnswersWith};

/// Fails its first attempt (retriably), so every run journals the same retry.
#[activity(max_attempts = 3, initial_backoff_ms = 1)]
async fn flaky(cx: ActivityContext, i: u64) -> Result<u64, ActivityError> {
    match cx.attempt() {
        1 => Err(ActivityError::retriable("503 on the first attempt")),
        _ => Ok(i * 10),
    }
}

#[activity]
async fn read(i: u64) -> Result<u64, ActivityError> {
    Ok(i + 1)
}

/// A downstream that is not idempotent: each call applies again, so a duplicate shows.
#[activity(effect, reconcile = find_booking, max_attempts = 3, initial_backoff_ms = 1)]
async fn book(cx: ActivityContext, #[key] order_id: String) -> Result<String, ActivityError> {
    Ok(waymark_tests::apply_under_key(&cx, &order_id))
}

async fn find_booking(
    cx: ActivityContext,
    _order_id: String,
) -> Result<Reconciled<String>, ActivityError> {
    Ok(waymark_tests::reconcile_by_key(&cx))
}

#[activity]
async fn search(query: String) -> Result<Retrieval, ActivityError> {
    let document = RetrievedDocument {
        id: "policy".into(),
        version: "v7".into(),
        score: 0.9,
        text: "Delays over 48 h may be rebooked.".into(),
    };
    Ok(Retrieval {
        rewritten_query: None,
        query,
        documents: vec![document],
        index_version: "index-v7".into(),
    })
}

/// Activities, a retry, recorded values, a retrieval snapshot and a streamed model call.
#[workflow]
async fn steps(ctx: WorkflowContext, n: u64) -> Result<String, WorkflowError> {
    let token = ctx.random();
    let _started = ctx.now();
    let mut total = 0;
    for i in 0..n {
        total += ctx.activity(read, i).await?;
        total += ctx.activity(flaky, i).await?;
    }
    let found = ctx.retrieve(search, "rebooking".to_owned()).await?;
    let documents = found.value().documents.len();
    let request = Llm::new("writer").user(format!("{total} found")).streamed();
    let answer = ctx.llm(request).await?.text;
    Ok(format!(
        "{total} from {documents} document(s), token {token}: {answer}"
    ))
}

fn answer(request: &LlmRequest) -> Completion {
    Completion {
        text: format!("Noted: {}.", request.messages[0].content),
        provider_model: "writer@matrix".into(),
        usage: Usage::default(),
        finish_reason: Some("stop".into()),
        tool_calls: Vec::new(),
    }
}

/// An effect under its key, a timer, and values.
#[workflow]
async fn booking(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    let outbound = ctx.effect(book, order_id.clone()).await?;
    // Long enough that the run is still waiting for it when it decides whether to leave
    // memory, on a loaded machine too.
    ctx.sleep(Duration::from_millis(100)).await;
    let id = ctx.uuid();
    let inbound = ctx.effect(book, format!("{order_id}-return")).await?;
    Ok(format!("{outbound}, {inbound}, id {id}"))
}

/// A signal that wins a `select!` over a long timer (dropped), an artifact, an approval
/// nobody decides before its expiry, one a person approves, and a patch marker.
#[workflow]
async fn waits(ctx: WorkflowContext, _input: ()) -> Result<String, WorkflowError> {
    let go = {
        let mut go = ctx.signal::<String>("go");
        let mut later = ctx.sleep(Duration::from_secs(3_600));
        waymark::select! {
            go = go => go?,
            () = later => "timed out".to_owned(),
        }
    };
    let plan = ctx.artifact(serde_json::json!({"plan": go}))?;
    let outcome = ctx
        .approval(&plan)
        .expires_in(Duration::from_millis(3))
        .await;
    let expired = matches!(outcome, ApprovalOutcome::Expired);
    let approved = match ctx.approval(&plan).await {
        ApprovalOutcome::Approved(_) => "approved",
        ApprovalOutcome::Rejected { .. } => "rejected",
        ApprovalOutcome::Expired => "expired",
    };
    let patched = ctx.patched("matrix-v2");
    Ok(format!(
        "{go}, expired {expired}, then {approved}, patched {patched}"
    ))
}

#[derive(Clone, Copy, Debug)]
enum Scenario {
    Steps,
    Booking,
    Waits,
}

const SCENARIOS: [Scenario; 3] = [Scenario::Steps, Scenario::Booking, Scenario::Waits];

/// The seed new random values are drawn with: every worker of every run draws the same value
/// for the same command, so a value drawn after a restart equals the one the run without
/// faults drew. (That a journaled value is replayed rather than drawn again, when the journal
/// lost it, is the power-loss simulation's to show: it checks the effect saw the value the
/// workflow returned.)
const SEED: u64 = 7;

/// How a run is disturbed.
#[derive(Clone, Copy, Debug)]
enum Disturbance {
    None,
    /// The worker stops right after this many synced journal writes, and restarts.
    RestartAfter(u64),
    /// The workflow leaves memory whenever it waits.
    EvictAtEveryWait,
}

/// What a run came to.
#[derive(Debug)]
struct Outcome {
    output: String,
    journal: Vec<String>,
    effects: Vec<Vec<String>>,
    /// Rebuilds of the workflow after it left memory.
    rebuilds: f64,
}

/// A worker on `store`; `seed` draws its new random values.
fn builder(store: Arc<MemoryStore>, disturbance: Disturbance, seed: u64) -> WorkerBuilder {
    let builder = Worker::builder()
        .store(store)
        .register(steps)
        .register(booking)
        .register(waits)
        .register(flaky)
        .register(read)
        .register(book)
        .register(search)
        .llm(AnswersWith(answer))
        .llm_options(ActivityOptions::default().initial_backoff(Duration::ZERO))
        .seeded_random(seed);
    match disturbance {
        Disturbance::EvictAtEveryWait => builder.evict_after(Duration::ZERO),
        Disturbance::None | Disturbance::RestartAfter(_) => builder,
    }
}

async fn worker_on(engine: &Arc<MemoryEngine>, disturbance: Disturbance, seed: u64) -> Worker {
    let store = MemoryStore::ungrouped(engine.clone()).expect("open the store");
    let worker = builder(Arc::new(store), disturbance, seed).build().await;
    worker.expect("start the worker")
}

/// One id per scenario and test: random values are drawn per workflow id, so the runs
/// compared share one (each on a fresh store, its effects forgotten after it).
fn workflow_id(scenario: Scenario, test: &str) -> String {
    format!("matrix-{scenario:?}-{test}").to_lowercase()
}

async fn start(worker: &Worker, scenario: Scenario, id: &str) {
    let started = match scenario {
        Scenario::Steps => worker.start_with(steps, 2, with_id(id)).await.map(drop),
        Scenario::Booking => {
            let order = format!("ORD-{id}");
            worker
                .start_with(booking, order, with_id(id))
                .await
                .map(drop)
        }
        Scenario::Waits => worker.start_with(waits, (), with_id(id)).await.map(drop),
    };
    started.expect("the workflow starts");
}

/// What the outside world sends the run: the `go` signal, sent again after a restart as a
/// sender retrying would (its id makes a second copy a duplicate). A send that meets the
/// failed disk is the sender's to retry after the restart.
async fn send(worker: &Worker, engine: &MemoryEngine, scenario: Scenario, id: &str) {
    let Scenario::Waits = scenario else {
        return;
    };
    match worker.signal(id, "go", "go-1", &"dana").await {
        Ok(_) => {}
        // The first copy was taken before the stop, and the run went on to its end.
        Err(waymark::SignalError::Ended { .. }) => {}
        Err(error) => assert!(engine.has_failed(), "{id}: the signal is refused: {error}"),
    }
}

/// The run's output (every scenario returns a string).
async fn result(worker: &Worker, scenario: Scenario, id: &str) -> Result<String, RunError> {
    match scenario {
        Scenario::Steps => worker.handle(steps, id).result().await,
        Scenario::Booking => worker.handle(booking, id).result().await,
        Scenario::Waits => worker.handle(waits, id).result().await,
    }
}

/// The run's result, or `None` if the disk failed under it first.
async fn result_or_cut(
    worker: &Worker,
    engine: &MemoryEngine,
    scenario: Scenario,
    id: &str,
) -> Option<String> {
    let result = result(worker, scenario, id);
    tokio::pin!(result);
    loop {
        tokio::select! {
            outcome = &mut result => match outcome {
                Ok(output) => return Some(output),
                Err(_) if engine.has_failed() => return None,
                Err(error) => panic!("{id}: the run failed: {error}"),
            },
            () = tokio::time::sleep(Duration::from_millis(1)) => {
                if engine.has_failed() {
                    return None;
                }
                approve_what_is_pending(worker, scenario, id).await;
            }
        }
    }
}

/// The person of the `waits` scenario: approves a request without an expiry once it is
/// pending (the one with an expiry is left to expire). A decision that meets the failed disk
/// is made again after the restart, as a person would.
async fn approve_what_is_pending(worker: &Worker, scenario: Scenario, id: &str) {
    let Scenario::Waits = scenario else {
        return;
    };
    let pending = worker.pending_approvals(id).unwrap_or_default();
    for request in pending
        .iter()
        .filter(|request| request.expires_at_ms.is_none())
    {
        let hash = &request.artifact_hash;
        let decided = worker.decide_approval(id, hash, "dana", ApprovalVerdict::Approve);
        let _ = decided.await;
    }
}

/// Runs `scenario` under `disturbance`; `None` if the disturbance never happened (the cut
/// came after the run's last write).
async fn run(scenario: Scenario, disturbance: Disturbance, id: &str) -> Option<Outcome> {
    let engine = MemoryEngine::new();
    let mut worker = worker_on(&engine, disturbance, SEED).await;
    if let Disturbance::RestartAfter(commits) = disturbance {
        engine.fail_after_synced_writes_to(Table::Journal, commits);
    }
    start(&worker, scenario, id).await;
    send(&worker, &engine, scenario, id).await;
    let mut output = result_or_cut(&worker, &engine, scenario, id).await;
    // The run made no more synced journal writes than the cut allowed: past its last one.
    if !engine.has_failed() && matches!(disturbance, Disturbance::RestartAfter(_)) {
        return None;
    }
    if engine.has_failed() {
        worker.shutdown().await;
        engine.heal();
        worker = worker_on(&engine, disturbance, SEED).await;
        send(&worker, &engine, scenario, id).await;
        output = result_or_cut(&worker, &engine, scenario, id).await;
    }
    let output = output.unwrap_or_else(|| panic!("{id}: the disk failed again"));
    let rendered = worker.render_journal(id).expect("render the journal");
    let rebuilds = worker
        .telemetry()
        .snapshot()
        .value(names::WORKFLOW_LOADS, &[("wake", "event")]);
    worker.shutdown().await;
    let keys = effect_keys(scenario, id);
    let effects = keys.iter().map(|key| applied_effects(key));
    Some(Outcome {
        output,
        journal: comparable(&rendered, id),
        effects: effects.collect(),
        rebuilds,
    })
}

fn effect_keys(scenario: Scenario, id: &str) -> Vec<String> {
    match scenario {
        Scenario::Booking => vec![
            format!("{id}|book|[\"ORD-{id}\"]|v1"),
            format!("{id}|book|[\"ORD-{id}-return\"]|v1"),
        ],
        Scenario::Steps | Scenario::Waits => Vec::new(),
    }
}

/// The journal's lines without their index and the run's id, an effect completed by
/// reconciliation read as the completion of its attempt.
fn comparable(rendered: &str, id: &str) -> Vec<String> {
    let lines = rendered.lines().filter_map(|line| {
        let line = line.trim_start();
        let (_, entry) = line.split_once(' ')?;
        let entry = entry.trim_start().replace(id, "<id>");
        if entry.starts_with("effect_uncertain") {
            return None;
        }
        Some(completed_form(&entry))
    });
    lines.collect()
}

/// `activity_completed seq=1 attempt=1 output=X` and `effect_reconciled seq=1 attempt=1
/// by=reconciler committed output=X` both as `completed seq=1 attempt=1 output=X`.
fn completed_form(entry: &str) -> String {
    let mut words = entry.split_whitespace();
    let (Some(kind), Some(seq), Some(attempt)) = (words.next(), words.next(), words.next()) else {
        return entry.to_owned();
    };
    let rest: Vec<&str> = words.collect();
    let output = rest.iter().position(|word| word.starts_with("output="));
    let committed = kind == "effect_reconciled" && rest.contains(&"committed");
    match output {
        Some(at) if kind == "activity_completed" || committed => {
            format!("completed {seq} {attempt} {}", rest[at..].join(" "))
        }
        _ => entry.to_owned(),
    }
}

fn forget(scenario: Scenario, id: &str) {
    for key in effect_keys(scenario, id) {
        waymark_tests::forget_effects(&key);
    }
}

/// The run without faults, under `id`, with the effects it left.
async fn reference(scenario: Scenario, id: &str) -> Outcome {
    let reference = run(scenario, Disturbance::None, id).await;
    let reference = reference.expect("a run without faults ends");
    forget(scenario, id);
    reference
}

fn assert_same(scenario: Scenario, disturbance: Disturbance, reference: &Outcome, run: &Outcome) {
    let what = format!("{scenario:?} under {disturbance:?}");
    assert_eq!(run.output, reference.output, "{what}: the output");
    assert_eq!(run.journal, reference.journal, "{what}: the journal");
    let counts = |outcome: &Outcome| outcome.effects.iter().map(Vec::len).collect::<Vec<_>>();
    assert_eq!(counts(run), counts(reference), "{what}: the effect counts");
    assert!(
        counts(run).iter().all(|&n| n == 1),
        "{what}: each effect once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_after_every_commit_changes_nothing() {
    for scenario in SCENARIOS {
        let id = workflow_id(scenario, "restart");
        let reference = reference(scenario, &id).await;
        let mut restarts = 0;
        // The first write is the start itself: a worker stopped before it has no run.
        for commits in 1.. {
            let disturbance = Disturbance::RestartAfter(commits);
            let Some(outcome) = run(scenario, disturbance, &id).await else {
                break;
            };
            assert_same(scenario, disturbance, &reference, &outcome);
            forget(scenario, &id);
            restarts += 1;
        }
        println!("{scenario:?}: {restarts} restarts, one after each synced journal write");
        assert!(
            restarts >= 3,
            "{scenario:?}: the matrix reached its commits"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_at_every_wait_changes_nothing() {
    for scenario in SCENARIOS {
        let id = workflow_id(scenario, "evict");
        let disturbance = Disturbance::EvictAtEveryWait;
        let reference = reference(scenario, &id).await;
        let outcome = run(scenario, disturbance, &id).await.expect("the run ends");
        assert_same(scenario, disturbance, &reference, &outcome);
        println!(
            "{scenario:?}: rebuilt {} times after an eviction",
            outcome.rebuilds
        );
        // A pending approval is always a reason to leave memory; a timer only while it is
        // further away than the threshold when the run checks, which a loaded machine may miss.
        if let Scenario::Waits = scenario {
            assert!(outcome.rebuilds >= 1.0, "{scenario:?}: it was evicted");
        }
        forget(scenario, &id);
    }
}
