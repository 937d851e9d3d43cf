//! A seeded simulation over the in-memory engine, for what killing a process cannot reach: a
//! power loss drops every write that was not synced (recorded values, read schedules; stream
//! events before they were synced too), not only the process.
//!
//! Each seed runs one workflow (a recorded value, a read, an effect keyed by intent, a timer, a
//! streamed model call) while a reader follows its stream, cuts the disk at a seeded journal
//! write (every later write fails: the moment the power went), drops the worker, loses the
//! unsynced writes (all of them, some, or none: a plain crash), and restarts on the same engine,
//! a seeded number of times. Every seed must keep the invariants:
//!
//! 1. the effect ran once for its key, with the values the workflow saw;
//! 2. the workflow completes with the output a run without faults gives;
//! 3. every stream event a reader was shown is still in the store under the same number, and
//!    the committed response is what the workflow returned.
//!
//! A failing seed prints itself; `WAYMARK_SEED=<seed>` runs that one alone, `WAYMARK_SEEDS=<n>`
//! the first `n`. Three seeds in four write one job per batch, so that which writes a power
//! loss drops follows from the seed alone: such a seed replays exactly, and 25 of them run twice
//! leave the same trace (plan, cuts hit, output, final journal). The fourth groups jobs into
//! batches as production does, where thread timing decides the batches.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use waymark::llm::{Completion, LlmRequest, Usage};
use waymark::prelude::*;
use waymark::store::{MemoryEngine, MemoryStore, Store, StreamEvent, StreamItem, Table};
use waymark::streams::visible_text;
use waymark::WorkerBuilder;
use waymark_tests::{applied_effects, with_id, AnswersWith};

const SEEDS: u64 = 500;
const TWICE: u64 = 25;
/// Restarts a seed may plan; each cuts the disk at one of its journal writes.
const MAX_CUTS: usize = 4;

#[activity(max_attempts = 5, initial_backoff_ms = 1)]
async fn load_quote(order_id: String) -> Result<String, ActivityError> {
    Ok(format!("quote-for-{order_id}"))
}

/// A downstream that is not idempotent: each call applies again, so a duplicate shows.
#[activity(effect, reconcile = find_booking, max_attempts = 5, initial_backoff_ms = 1)]
async fn book(
    cx: ActivityContext,
    #[key] order_id: String,
    token: u64,
) -> Result<String, ActivityError> {
    Ok(waymark_tests::apply_under_key(
        &cx,
        &format!("{order_id}:{token}"),
    ))
}

async fn find_booking(
    cx: ActivityContext,
    _order_id: String,
    _token: u64,
) -> Result<Reconciled<String>, ActivityError> {
    Ok(waymark_tests::reconcile_by_key(&cx))
}

#[workflow]
async fn simulated(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    let token = ctx.random();
    let quote = ctx.activity(load_quote, order_id.clone()).await?;
    let booking = ctx.effect(book, (order_id.clone(), token)).await?;
    ctx.sleep(Duration::from_millis(2)).await;
    let request = Llm::new("writer")
        .user(format!("Tell {order_id}: {quote}, {booking}"))
        .streamed();
    let answer = ctx.llm(request).await?.text;
    Ok(format!("{token}|{quote}|{booking}|{answer}"))
}

fn answer(request: &LlmRequest) -> Completion {
    let said = &request.messages[0].content;
    Completion {
        text: format!("Dear customer, we can now say: {said}. Thank you for waiting."),
        provider_model: format!("{}@sim", request.model),
        usage: Usage::default(),
        finish_reason: Some("stop".into()),
        tool_calls: Vec::new(),
    }
}

/// What a seed does to the disk: at which journal write each cut comes, and what each power
/// loss keeps of the unsynced writes.
#[derive(Debug, Clone, Hash)]
struct Plan {
    cuts: Vec<Cut>,
    latency_us: u64,
    /// Whether the store's writer groups queued jobs into one batch, as in production. Which
    /// jobs share a batch then depends on thread timing, which the seed does not decide; an
    /// ungrouped seed replays exactly.
    grouped: bool,
}

#[derive(Debug, Clone, Copy, Hash)]
struct Cut {
    /// Synced journal writes that succeed before the disk fails: counting those puts the cut at
    /// the same step of the run however the writer grouped the writes around it.
    after_journal_writes: u64,
    loss: Loss,
}

#[derive(Debug, Clone, Copy, Hash)]
enum Loss {
    /// Every unsynced write is lost.
    All,
    /// The older half of the unsynced writes survives.
    Half,
    /// Nothing is lost: the process died, the machine did not.
    None,
}

impl Plan {
    fn of(seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let count = rng.random_range(0..=MAX_CUTS);
        let cuts = (0..count)
            .map(|_| Cut {
                after_journal_writes: rng.random_range(0..8),
                loss: match rng.random_range(0..3) {
                    0 => Loss::All,
                    1 => Loss::Half,
                    _ => Loss::None,
                },
            })
            .collect();
        let latency_us = [0, 0, 50, 300][rng.random_range(0..4)];
        let grouped = rng.random_range(0..4) == 0;
        Plan {
            cuts,
            latency_us,
            grouped,
        }
    }
}

/// Cuts hit, by what their power loss kept (all, half, none of the unsynced writes lost), and
/// the unsynced batches power losses dropped: a simulation that stopped reaching its faults
/// would pass for the wrong reason.
static CUTS_HIT: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];
static BATCHES_LOST: AtomicU64 = AtomicU64::new(0);
/// The tag of the runs those count: the main test's, not the ones run twice beside it.
const COUNTED: &str = "a";

impl Loss {
    fn index(self) -> usize {
        match self {
            Loss::All => 0,
            Loss::Half => 1,
            Loss::None => 2,
        }
    }
}

/// Every stream event a reader was shown, by number.
type Shown = Arc<Mutex<BTreeMap<u64, StreamItem>>>;

struct Outcome {
    output: String,
    journal: String,
    cuts_hit: usize,
}

async fn worker_on(engine: &Arc<MemoryEngine>, seed: u64) -> (Worker, Arc<MemoryStore>) {
    let store = match Plan::of(seed).grouped {
        true => MemoryStore::on(engine.clone()),
        false => MemoryStore::ungrouped(engine.clone()),
    };
    let store = Arc::new(store.expect("open the store"));
    let builder: WorkerBuilder = Worker::builder()
        .store(store.clone())
        .register(simulated)
        .register(load_quote)
        .register(book)
        .llm(AnswersWith(answer))
        .llm_options(ActivityOptions::default().initial_backoff(Duration::ZERO))
        .seeded_random(seed);
    (builder.build().await.expect("start the worker"), store)
}

/// Follows the workflow's stream as an SSE client would, resuming after the last event it saw.
fn follow(
    store: Arc<MemoryStore>,
    workflow_id: String,
    shown: Shown,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let after = shown
                .lock()
                .unwrap()
                .keys()
                .next_back()
                .copied()
                .unwrap_or(0);
            if let Ok(events) = store.stream(&workflow_id, after) {
                let mut shown = shown.lock().unwrap();
                for StreamEvent { seq, item } in events {
                    shown.insert(seq, item);
                }
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
    })
}

/// Stops the reader and the worker and closes the store, its writer included: a write still
/// queued there must fail on the failed disk now, not land after the power comes back. The
/// worker's shutdown promises that nothing of it holds the store once it returns.
async fn stop(reader: tokio::task::JoinHandle<()>, worker: Worker, store: Arc<MemoryStore>) {
    reader.abort();
    let _ = reader.await;
    worker.shutdown().await;
    let store = Arc::try_unwrap(store).ok();
    drop(store.expect("nothing holds the store after the worker's shutdown"));
}

/// Waits for the run's result, or for the disk to fail under it.
async fn until_result_or_cut(
    worker: &Worker,
    engine: &MemoryEngine,
    workflow_id: &str,
) -> Option<String> {
    let handle = worker.handle(simulated, workflow_id);
    let result = handle.result();
    tokio::pin!(result);
    loop {
        tokio::select! {
            outcome = &mut result => return outcome.ok(),
            () = tokio::time::sleep(Duration::from_millis(1)) => {
                if engine.has_failed() {
                    return None;
                }
            }
        }
    }
}

/// One seed's run: the workflow under the plan's cuts, then to its end without faults.
async fn run(seed: u64, tag: &str) -> Outcome {
    let plan = Plan::of(seed);
    let engine = MemoryEngine::new();
    engine.set_write_latency(Duration::from_micros(plan.latency_us));
    let workflow_id = format!("sim-{tag}-{seed}");
    let shown: Shown = Shown::default();
    let mut cuts_hit = 0;
    let (mut worker, mut store) = worker_on(&engine, seed).await;
    let mut reader = follow(store.clone(), workflow_id.clone(), shown.clone());
    worker
        .start_with(simulated, "ORD-7".into(), with_id(&workflow_id))
        .await
        .expect("start");
    for cut in &plan.cuts {
        engine.fail_after_synced_writes_to(Table::Journal, cut.after_journal_writes);
        let finished = until_result_or_cut(&worker, &engine, &workflow_id).await;
        if finished.is_some() {
            break;
        }
        cuts_hit += 1;
        stop(reader, worker, store).await;
        let unsynced = engine.unsynced_batches();
        let lost = engine.lose_power(match cut.loss {
            Loss::All => 0,
            Loss::Half => unsynced / 2,
            Loss::None => unsynced,
        });
        if tag == COUNTED {
            CUTS_HIT[cut.loss.index()].fetch_add(1, Ordering::Relaxed);
            BATCHES_LOST.fetch_add(lost as u64, Ordering::Relaxed);
        }
        engine.heal();
        (worker, store) = worker_on(&engine, seed).await;
        reader = follow(store.clone(), workflow_id.clone(), shown.clone());
    }
    engine.heal();
    let output = worker
        .handle(simulated, &workflow_id)
        .result()
        .await
        .unwrap_or_else(|e| panic!("seed {seed}: the run did not complete: {e}"));
    reader.abort();
    check_stream(seed, &store, &workflow_id, &shown, &output);
    let journal = render(&worker, &workflow_id);
    worker.shutdown().await;
    Outcome {
        output,
        journal,
        cuts_hit,
    }
}

fn render(worker: &Worker, workflow_id: &str) -> String {
    worker
        .render_journal(workflow_id)
        .unwrap_or_else(|e| format!("unreadable: {e}"))
}

fn check_stream(seed: u64, store: &MemoryStore, workflow_id: &str, shown: &Shown, output: &str) {
    let events = store.stream(workflow_id, 0).expect("read the stream");
    let stored: HashMap<u64, &StreamItem> = events.iter().map(|e| (e.seq, &e.item)).collect();
    for (seq, item) in shown.lock().unwrap().iter() {
        assert_eq!(
            stored.get(seq),
            Some(&item),
            "seed {seed}: a reader was shown event {seq}, which the store no longer has \
             (a power loss took it, and a reader resuming after it would splice attempts)"
        );
    }
    let answer = output.rsplit('|').next().unwrap_or_default();
    let streamed = events.iter().find(|e| e.item.is_generation());
    let step = streamed.map_or(0, |e| e.item.step());
    assert_eq!(
        visible_text(&events, step),
        answer,
        "seed {seed}: stream == committed"
    );
}

fn effect_key(workflow_id: &str) -> String {
    format!("{workflow_id}|book|[\"ORD-7\"]|v1")
}

fn check_effect(seed: u64, workflow_id: &str, output: &str) {
    let applied = applied_effects(&effect_key(workflow_id));
    let token = output.split('|').next().unwrap_or_default();
    assert_eq!(
        applied,
        vec![format!("ORD-7:{token}")],
        "seed {seed}: the effect ran once, with the value the workflow saw"
    );
}

/// The output without the recorded random value, which differs from run to run.
fn shape(output: &str) -> String {
    output
        .split_once('|')
        .map_or(output, |(_, rest)| rest)
        .to_owned()
}

/// What a seed's run came to, as text: its plan, the cuts it hit, its output and the journal it
/// ended with, without the run's tag and the recorded random value. The journals between cuts
/// are left out: which unsynced writes a partial power loss keeps depends on how the writer
/// thread grouped them, which the seed does not decide.
fn trace(seed: u64, outcome: &Outcome, tag: &str) -> String {
    let mut trace = format!("{:?}\ncuts hit: {}\n", Plan::of(seed), outcome.cuts_hit);
    trace.push_str(&shape(&outcome.output));
    trace.push('\n');
    trace.push_str(&outcome.journal.replace(tag, "<tag>"));
    trace
}

fn hash(trace: &str) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    trace.hash(&mut hasher);
    hasher.finish()
}

async fn check_seed(seed: u64, tag: &str) -> String {
    let outcome = run(seed, tag).await;
    let workflow_id = format!("sim-{tag}-{seed}");
    check_effect(seed, &workflow_id, &outcome.output);
    let reference = "quote-for-ORD-7|ref-1|Dear customer, we can now say: \
                     Tell ORD-7: quote-for-ORD-7, ref-1. Thank you for waiting.";
    assert_eq!(shape(&outcome.output), reference, "seed {seed}: the output");
    trace(seed, &outcome, tag)
}

/// `WAYMARK_SEED=<seed>` runs one seed; `WAYMARK_SEEDS=<n>` runs the first `n`.
fn seeds() -> Vec<u64> {
    let number = |name: &str| {
        let value = std::env::var(name).ok()?;
        Some(
            value
                .parse::<u64>()
                .unwrap_or_else(|_| panic!("{name} is a number")),
        )
    };
    match (number("WAYMARK_SEED"), number("WAYMARK_SEEDS")) {
        (Some(seed), _) => vec![seed],
        (None, Some(count)) => (0..count).collect(),
        (None, None) => (0..SEEDS).collect(),
    }
}

/// Runs `seeds` a few at a time; a failure names its seed.
async fn run_all(seeds: Vec<u64>, tag: &'static str) -> Vec<(u64, String)> {
    let mut traces = Vec::with_capacity(seeds.len());
    for chunk in seeds.chunks(8) {
        let runs = chunk.iter().map(|&seed| async move {
            let trace = tokio::spawn(check_seed(seed, tag)).await;
            (
                seed,
                trace.unwrap_or_else(|e| panic!("seed {seed} failed: {e}")),
            )
        });
        traces.extend(futures::future::join_all(runs).await);
    }
    traces
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_seed_keeps_the_invariants_through_power_losses() {
    let seeds = seeds();
    let traces = run_all(seeds.clone(), COUNTED).await;
    assert_eq!(traces.len(), seeds.len());
    let hit = CUTS_HIT
        .each_ref()
        .map(|count| count.load(Ordering::Relaxed));
    let lost = BATCHES_LOST.load(Ordering::Relaxed);
    println!(
        "{} seeds; cuts hit: {} losing every unsynced write, {} losing half, {} losing none; \
         {lost} unsynced batches lost",
        seeds.len(),
        hit[0],
        hit[1],
        hit[2]
    );
    if seeds.len() >= SEEDS as usize {
        assert!(
            hit.iter().all(|&n| n > 0) && lost > 0,
            "the faults were reached"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_seed_run_twice_leaves_the_same_trace() {
    let ungrouped = (0..).filter(|seed| !Plan::of(*seed).grouped);
    let seeds: Vec<u64> = ungrouped.take(TWICE as usize).collect();
    let first = run_all(seeds.clone(), "twice").await;
    for seed in &seeds {
        waymark_tests::forget_effects(&effect_key(&format!("sim-twice-{seed}")));
    }
    let second = run_all(seeds, "twice").await;
    for ((seed, a), (_, b)) in first.iter().zip(&second) {
        assert_eq!(a, b, "seed {seed}: two runs left different traces");
        println!("seed {seed}: trace {:016x}", hash(a));
    }
}
