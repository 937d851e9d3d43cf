//! The workflows and measurements of the `bench` binary: journaling overhead against a raw
//! synced RocksDB put, throughput under concurrency against raw synced batches, replay speed,
//! memory per waiting workflow, and recovery time.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use waymark::prelude::*;
use waymark::{StartOptions, WorkerBuilder};
use waymark_runtime::journal::{CommandIdentity, CommandKind, Entry, Payload, WorkflowStarted};
use waymark_runtime::store::{Engine as _, Reads as _, RocksStore, Table, Write};

mod decisions;
mod flat;

pub use decisions::{decision_listing_costs, DecisionListingCosts};
pub use flat::{
    inbox_costs, stream_costs, unlistened_signal_costs, InboxCosts, StreamCosts, Streaming,
    UnlistenedCosts,
};

/// A step that does nothing: what is left is the runtime's cost.
#[activity]
pub async fn noop(i: u64) -> Result<u64, ActivityError> {
    Ok(i)
}

/// An effect that does nothing downstream: `prepared` + `committed` around it.
#[activity(effect)]
pub async fn noop_effect(#[key] i: u64) -> Result<u64, ActivityError> {
    Ok(i)
}

/// `n` sequential no-op activities.
#[workflow]
pub async fn steps(ctx: WorkflowContext, n: u64) -> Result<u64, WorkflowError> {
    for i in 0..n {
        ctx.activity(noop, i).await?;
    }
    Ok(n)
}

/// `n` sequential no-op effects.
#[workflow]
pub async fn effects(ctx: WorkflowContext, n: u64) -> Result<u64, WorkflowError> {
    for i in 0..n {
        ctx.effect(noop_effect, i).await?;
    }
    Ok(n)
}

/// `n` no-op activities, then a wait for a signal that never comes: replay stops there.
#[workflow]
pub async fn steps_then_wait(ctx: WorkflowContext, n: u64) -> Result<u64, WorkflowError> {
    for i in 0..n {
        ctx.activity(noop, i).await?;
    }
    ctx.signal::<()>("never").await?;
    Ok(n)
}

/// Says on standard output that it ran: the first new step a restarted worker takes.
#[activity]
pub async fn announce(i: u64) -> Result<u64, ActivityError> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "stepped {i}");
    let _ = out.flush();
    Ok(i)
}

/// How long `steps_then_announce` sleeps between its history and its announced step.
pub const RESTART_NAP: Duration = Duration::from_millis(300);

/// `n` steps, a short sleep, then one announced step. A worker stopped during the sleep leaves
/// a workflow whose next step is due: a new worker takes it as soon as it has started.
#[workflow]
pub async fn steps_then_announce(ctx: WorkflowContext, n: u64) -> Result<u64, WorkflowError> {
    for i in 0..n {
        ctx.activity(noop, i).await?;
    }
    ctx.sleep(RESTART_NAP).await;
    Ok(ctx.activity(announce, n).await?)
}

/// Waits for a signal: what a workflow waiting out of memory costs.
#[workflow]
pub async fn awaits_wake(ctx: WorkflowContext, _n: u64) -> Result<u64, WorkflowError> {
    ctx.signal::<u64>("wake").await
}

/// [`awaits_wake`] as a deploy changes it: the same commands from code written otherwise, so a
/// worker hosting it rebuilds every parked run of `awaits_wake` at start, and each replays.
#[workflow(name = "awaits_wake")]
pub async fn awaits_wake_redeployed(ctx: WorkflowContext, _n: u64) -> Result<u64, WorkflowError> {
    let woken: u64 = ctx.signal("wake").await?;
    Ok(woken)
}

/// Bytes the Rust heap holds now, from the benchmark binary's counting allocator (unset
/// elsewhere): what the process holds apart from RocksDB's own (C++) memory, whose memtable
/// keeps the journal until a flush.
pub static HEAP_LIVE: std::sync::OnceLock<fn() -> usize> = std::sync::OnceLock::new();

fn heap_live_bytes() -> usize {
    HEAP_LIVE.get().map_or(0, |live| live())
}

/// One sample of a long run: the step, when it ran, and the Rust heap's bytes then.
pub type Stamp = (u64, Instant, usize);

/// Samples of the long run, taken by its activity every [`STAMP_EVERY`] steps.
pub static STAMPS: std::sync::Mutex<Vec<Stamp>> = std::sync::Mutex::new(Vec::new());

/// Holds the long run's last step until the benchmark has read the run's footprint.
static LAST_STEP: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// How often the long run's activity samples: each sample ends one of the windows whose median
/// stands for its thousand steps.
pub const STAMP_EVERY: u64 = 100;

/// The steps at each end of the long run that are compared: its first and its last thousand.
pub const LONG_RUN_WINDOW: u64 = 1_000;

/// A no-op step that samples time every [`STAMP_EVERY`] steps, from outside the workflow (an
/// activity may read the clock). Step `last` waits to be released.
#[activity]
pub async fn stamped(step: (u64, u64)) -> Result<u64, ActivityError> {
    let (i, last) = step;
    if i.is_multiple_of(STAMP_EVERY) {
        let mut stamps = STAMPS.lock().unwrap_or_else(|e| e.into_inner());
        stamps.push((i, Instant::now(), heap_live_bytes()));
    }
    if i == last {
        LAST_STEP.notified().await;
    }
    Ok(i)
}

/// `n + 1` sequential sampled steps: steps 0 to `n`.
#[workflow]
pub async fn long_run(ctx: WorkflowContext, n: u64) -> Result<u64, WorkflowError> {
    for i in 0..=n {
        ctx.activity(stamped, (i, n)).await?;
    }
    Ok(n)
}

/// What a long run of `count` steps costs: the seconds of its first and of its last
/// [`LONG_RUN_WINDOW`] steps, and what the run holds in memory at its last step. Each end's
/// seconds are ten times the median of its ten windows of [`STAMP_EVERY`] steps: a thousand
/// steps last about a seventh of a second here, and one slow `fsync` moved their sum by a
/// third.
pub struct LongRun {
    /// Steps 0 to 1,000.
    pub early_s: f64,
    /// The last 1,000 steps.
    pub late_s: f64,
    /// Rust heap bytes at step 1,000 (the run, the worker and everything else in the process).
    pub early_heap: usize,
    /// Rust heap bytes at the last step.
    pub late_heap: usize,
    /// At the last step.
    pub footprint: waymark::RunFootprint,
}

/// Runs a workflow of `count` steps and measures it (see [`LongRun`]).
pub async fn long_run_costs(worker: &Worker, count: u64) -> anyhow::Result<LongRun> {
    STAMPS.lock().unwrap_or_else(|e| e.into_inner()).clear();
    let run = worker
        .start_with(long_run, count, with_id("long-run".into()))
        .await?;
    let reached_last = || {
        let stamps = STAMPS.lock().unwrap_or_else(|e| e.into_inner());
        stamps.last().is_some_and(|(i, _, _)| *i == count)
    };
    while !reached_last() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let footprint = worker.footprint("long-run").await;
    LAST_STEP.notify_one();
    run.result().await?;
    let footprint = footprint.ok_or_else(|| anyhow::anyhow!("the long run was not resident"))?;
    let stamps = STAMPS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let at = |step: u64| stamps.iter().find(|(i, _, _)| *i == step).copied();
    let (Some(early_end), Some(last)) = (at(LONG_RUN_WINDOW), at(count)) else {
        anyhow::bail!("the long run took no samples");
    };
    let late_from = count.checked_sub(LONG_RUN_WINDOW);
    let late_from = late_from.ok_or_else(|| anyhow::anyhow!("a long run of {count} steps"))?;
    Ok(LongRun {
        early_s: window_seconds(&stamps, 0)?,
        late_s: window_seconds(&stamps, late_from)?,
        early_heap: early_end.2,
        late_heap: last.2,
        footprint,
    })
}

/// The seconds of the [`LONG_RUN_WINDOW`] steps from step `from`, as the median of their
/// windows of [`STAMP_EVERY`] steps times how many there are.
fn window_seconds(stamps: &[Stamp], from: u64) -> anyhow::Result<f64> {
    let at = |step: u64| stamps.iter().find(|(i, _, _)| *i == step).map(|s| s.1);
    let mut windows = Vec::new();
    for start in (from..from + LONG_RUN_WINDOW).step_by(STAMP_EVERY as usize) {
        let (Some(begun), Some(ended)) = (at(start), at(start + STAMP_EVERY)) else {
            anyhow::bail!("the long run took no sample at step {start} or after it");
        };
        windows.push(ended.duration_since(begun).as_secs_f64());
    }
    let count = windows.len() as f64;
    Ok(median(windows) * count)
}

/// Registers the benchmark's workflows and activities.
pub fn setup(builder: WorkerBuilder) -> WorkerBuilder {
    all_but_awaits_wake(builder).register(awaits_wake)
}

fn all_but_awaits_wake(builder: WorkerBuilder) -> WorkerBuilder {
    builder
        .register(long_run)
        .register(stamped)
        .register(noop)
        .register(noop_effect)
        .register(steps)
        .register(effects)
        .register(steps_then_wait)
        .register(steps_then_announce)
        .register(announce)
        .register(flat::ticks)
        .register(flat::tick_taken)
        .register(flat::streams)
        .register(flat::streams_chunks)
        .register(flat::window_done)
        .register(decisions::unanswered_effect)
        .register(decisions::awaits_operator)
}

/// A worker on `dir`.
pub async fn worker(dir: &Path) -> anyhow::Result<Worker> {
    Ok(setup(Worker::builder().data_dir(dir)).build().await?)
}

/// A worker on `dir` hosting changed code for `awaits_wake` ([`awaits_wake_redeployed`]).
pub async fn redeployed_worker(dir: &Path) -> anyhow::Result<Worker> {
    let builder = all_but_awaits_wake(Worker::builder().data_dir(dir));
    Ok(builder.register(awaits_wake_redeployed).build().await?)
}

fn with_id(id: String) -> StartOptions {
    StartOptions {
        workflow_id: Some(id),
        ..StartOptions::default()
    }
}

/// Leaves in `dir` a workflow with a `history`-step history whose next step is due, as a
/// stopped worker does: started, run until it sleeps, stopped.
pub async fn due_after_history(dir: &Path, history: u64) -> anyhow::Result<()> {
    let worker = worker(dir).await?;
    let id = "restart";
    worker
        .start_with(steps_then_announce, history, with_id(id.to_owned()))
        .await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let journal = worker.journal(id)?;
        if matches!(journal.last(), Some(Entry::TimerStarted { .. })) {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "the workflow never slept");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    worker.shutdown().await;
    tokio::time::sleep(RESTART_NAP).await;
    Ok(())
}

/// The median of `values`.
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Seconds per raw synced RocksDB put of `size` bytes, over `count` puts.
pub struct SyncedPuts {
    /// The middle put: what one put costs when the disk is not having a slow moment.
    pub median: f64,
    /// Total time over count: comparable with a step's seconds, which are a mean too and pay
    /// the disk's slow moments.
    pub mean: f64,
}

/// Times `count` raw synced RocksDB puts of `size` bytes on a new store in `dir`.
pub fn synced_puts(dir: &Path, size: usize, count: usize) -> anyhow::Result<SyncedPuts> {
    let db = rocksdb::DB::open_default(dir)?;
    let mut options = rocksdb::WriteOptions::default();
    options.set_sync(true);
    let value = vec![7u8; size];
    let mut times = Vec::with_capacity(count);
    for i in 0..count {
        let started = Instant::now();
        db.put_opt(format!("key-{i:08}"), &value, &options)?;
        times.push(started.elapsed().as_secs_f64());
    }
    let mean = times.iter().sum::<f64>() / count.max(1) as f64;
    Ok(SyncedPuts {
        median: median(times),
        mean,
    })
}

/// Records per second written as raw synced batches of `batch` records of `size` bytes.
pub fn synced_batch_rate(
    dir: &Path,
    size: usize,
    total: usize,
    batch: usize,
) -> anyhow::Result<f64> {
    let db = rocksdb::DB::open_default(dir)?;
    let mut options = rocksdb::WriteOptions::default();
    options.set_sync(true);
    let value = vec![7u8; size];
    let started = Instant::now();
    for chunk in 0..total.div_ceil(batch) {
        let mut write = rocksdb::WriteBatch::default();
        for i in 0..batch.min(total - chunk * batch) {
            write.put(format!("key-{chunk:06}-{i:04}"), &value);
        }
        db.write_opt(write, &options)?;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

/// Every row `workflow_ids` left in the store at `dir` (a store no worker holds), in the order
/// concurrent runs write them: each workflow's first row, then each one's second, and so on.
/// Every table is searched for rows keyed by a workflow's id (its journal, its record, and any
/// other row whose key begins with the id), and the two rows that list an ended workflow by its
/// end time are taken too.
pub fn rows_of(dir: &Path, workflow_ids: &[String]) -> anyhow::Result<Vec<Write>> {
    use waymark_runtime::keys::{ended_at_key, ended_key, id_key};
    let store = RocksStore::open(dir)?;
    let engine = store.engine().inner();
    let mut per_workflow = Vec::with_capacity(workflow_ids.len());
    for id in workflow_ids {
        let prefix = id_key(id);
        let mut rows = Vec::new();
        for table in Table::ALL {
            let found = engine.scan(table, &prefix, &prefix, usize::MAX)?;
            rows.extend(
                found
                    .into_iter()
                    .map(|(key, value)| Write::Put(table, key.into_vec(), value.into_vec())),
            );
        }
        let by_id = ended_at_key(id);
        if let Some(when) = engine.get(Table::Ended, &by_id)? {
            let at = <[u8; 8]>::try_from(when.as_slice())
                .map_err(|_| anyhow::anyhow!("{id}: an end time of {} bytes", when.len()))?;
            let by_time = ended_key(u64::from_be_bytes(at), id);
            anyhow::ensure!(
                engine.get(Table::Ended, &by_time)?.is_some(),
                "{id}: listed by id as ended, not by time"
            );
            rows.push(Write::Put(Table::Ended, by_time, Vec::new()));
            rows.push(Write::Put(Table::Ended, by_id, when));
        }
        per_workflow.push(rows.into_iter());
    }
    let mut interleaved = Vec::new();
    loop {
        let before = interleaved.len();
        interleaved.extend(per_workflow.iter_mut().filter_map(Iterator::next));
        if interleaved.len() == before {
            return Ok(interleaved);
        }
    }
}

/// Seconds to write `rows` to a new store at `dir` as synced batches of `batch` rows, straight
/// through the store's engine (its families and options), one batch after the other: the raw
/// group commit of those rows.
pub fn synced_batches_seconds(dir: &Path, rows: Vec<Write>, batch: usize) -> anyhow::Result<f64> {
    let store = RocksStore::open(dir)?;
    let engine = store.engine().inner();
    let mut rows = rows.into_iter().peekable();
    let started = Instant::now();
    while rows.peek().is_some() {
        engine.write(rows.by_ref().take(batch).collect(), true)?;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// The id of the `i`th of `concurrency` workflows [`steps_per_second`] starts in `round`.
pub fn concurrent_id(concurrency: usize, round: usize, i: usize) -> String {
    format!("concurrent-{concurrency}-{round}-{i}")
}

/// Seconds per step of one workflow of `n` steps (`effects` or `steps`).
pub async fn seconds_per_step(
    worker: &Worker,
    effect: bool,
    n: u64,
    id: String,
) -> anyhow::Result<f64> {
    let started = Instant::now();
    match effect {
        true => {
            worker
                .start_with(effects, n, with_id(id))
                .await?
                .result()
                .await?
        }
        false => {
            worker
                .start_with(steps, n, with_id(id))
                .await?
                .result()
                .await?
        }
    };
    Ok(started.elapsed().as_secs_f64() / n as f64)
}

/// Steps per second of `concurrency` workflows of `n` steps each, started all at once, as
/// `concurrency` callers would start them. (Started one after another, each start waited for
/// its own synced write while the runs already started took their steps: with 1,024 runs of
/// 20 steps, the starts alone took about half the time.)
pub async fn steps_per_second(
    worker: &Arc<Worker>,
    concurrency: usize,
    n: u64,
    round: usize,
) -> anyhow::Result<f64> {
    let started = Instant::now();
    let starts = (0..concurrency).map(|i| {
        let id = concurrent_id(concurrency, round, i);
        worker.start_with(steps, n, with_id(id))
    });
    let runs = futures::future::try_join_all(starts).await?;
    futures::future::try_join_all(runs.iter().map(|run| run.result())).await?;
    Ok((concurrency as u64 * n) as f64 / started.elapsed().as_secs_f64())
}

/// A synthetic journal of `count` completed no-op activities followed by a signal wait: what
/// `steps_then_wait` writes, without running it.
pub fn long_journal(count: u64) -> Vec<Entry> {
    let started = WorkflowStarted {
        workflow_name: "steps_then_wait".into(),
        input: Payload::from_u64(count),
        request_id: None,
        started_at_ms: 0,
    };
    let mut entries = vec![Entry::WorkflowStarted(started)];
    for i in 0..count {
        let input = Payload::from_u64(i);
        let seq = u32::try_from(i).unwrap_or(u32::MAX);
        let identity = CommandIdentity::new(CommandKind::Activity, "noop", &input);
        entries.push(Entry::ActivityScheduledAt {
            seq,
            identity,
            input: input.clone(),
            scheduled_at_ms: 0,
            idempotency_key: None,
        });
        entries.push(Entry::ActivityCompletedAt {
            seq,
            attempt: 1,
            output: input,
            completed_at_ms: 0,
        });
    }
    entries
}

/// This process's resident memory, in bytes (Linux).
pub fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// Starts `count` workflows that wait for a signal; waits until none is resident.
pub async fn start_waiting(worker: &Worker, count: usize, prefix: &str) -> anyhow::Result<()> {
    for i in 0..count {
        worker
            .start_with(awaits_wake, 0, with_id(format!("{prefix}-{i}")))
            .await?;
    }
    wait_until_idle(worker, Duration::from_secs(300)).await
}

/// Waits until no workflow is resident (all waiting out of memory, or done).
pub async fn wait_until_idle(worker: &Worker, within: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    while worker.resident_workflows() > 0 {
        anyhow::ensure!(
            Instant::now() < deadline,
            "workflows did not leave memory in time"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

/// The machine the benchmark ran on.
pub fn machine() -> serde_json::Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo.lines().find_map(|l| {
        l.strip_prefix("model name")
            .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
    });
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    serde_json::json!({"cpu": model, "cores": cores, "os": std::env::consts::OS})
}

/// Seconds per transition committed through the store's group-commit writer, one after the
/// other (median of `count`): the storage part of a step, synced (`durable`) or not.
pub async fn store_commit_seconds(dir: &Path, durable: bool, count: usize) -> anyhow::Result<f64> {
    use waymark_runtime::store::{Store, Transition, WorkflowRecord};
    let store = RocksStore::open(dir)?;
    let mut record = WorkflowRecord::new("steps", None, Payload::unit().digest());
    let mut times = Vec::with_capacity(count);
    for i in 0..count {
        let seq = u32::try_from(i).unwrap_or(u32::MAX);
        let output = Payload::from_u64(i as u64);
        let entry = Entry::ActivityCompletedAt {
            seq,
            attempt: 1,
            output,
            completed_at_ms: 0,
        };
        let mut transition = Transition::append("profile", &record, vec![entry]);
        transition.durable = durable;
        let next = transition.record.clone();
        let started = Instant::now();
        store.commit(transition).await?;
        times.push(started.elapsed().as_secs_f64());
        record = next;
    }
    Ok(median(times))
}

/// Answers the text it is given: an agent's tool whose result is as long as its argument.
#[activity]
pub async fn echo(text: String) -> Result<String, ActivityError> {
    Ok(text)
}

/// An agent that runs until its model stops calling `echo`; answers the bytes of its
/// conversation's messages (contents and tool-call arguments).
#[workflow]
pub async fn chatty(ctx: WorkflowContext, turns: u64) -> Result<u64, WorkflowError> {
    let agent = Agent::new("bench")
        .tool(echo)
        .budget(Budget::default().model_calls(turns + 1));
    let answer = ctx.agent(&agent, vec![Message::user("go")]).await?;
    let bytes = answer.transcript.iter().map(|m| {
        let arguments = m.tool_calls.iter().map(|c| c.arguments.len());
        m.content.len() + arguments.sum::<usize>()
    });
    Ok(bytes.sum::<usize>() as u64)
}

/// A model that calls `echo` with a 200-byte text at each of its first `turns` answers, then
/// answers in text: instant and deterministic, so what is measured is the runtime.
#[derive(Debug, Clone, Copy)]
pub struct EchoModel {
    /// Answers with a tool call before the final one.
    pub turns: usize,
}

impl waymark::llm::LlmProvider for EchoModel {
    fn complete(
        &self,
        request: waymark::llm::LlmRequest,
    ) -> futures::future::BoxFuture<'static, Result<waymark::llm::Completion, waymark::llm::LlmError>>
    {
        let turn = request
            .messages
            .iter()
            .filter(|m| m.role == waymark::llm::Role::Assistant)
            .count();
        let text = format!("turn {turn:04} ").repeat(20);
        let tool_calls = match turn < self.turns {
            true => vec![waymark::llm::ToolCall {
                id: format!("call-{turn}"),
                name: "echo".into(),
                arguments: serde_json::json!({ "text": text }).to_string(),
            }],
            false => Vec::new(),
        };
        let completion = waymark::llm::Completion {
            text: if tool_calls.is_empty() {
                text
            } else {
                String::new()
            },
            provider_model: "bench".into(),
            usage: waymark::llm::Usage::default(),
            finish_reason: None,
            tool_calls,
        };
        Box::pin(futures::future::ready(Ok(completion)))
    }
}

/// What an agent of `turns` turns costs: seconds per turn (one model call and one tool call,
/// journaled), the journal's bytes, and the bytes of its messages.
pub struct AgentCosts {
    /// Seconds per turn.
    pub turn_s: f64,
    /// Bytes of the journal, framed as exported.
    pub journal_bytes: usize,
    /// Bytes of the conversation's messages.
    pub message_bytes: u64,
}

/// Runs one agent of `turns` turns on a worker of its own in `dir`.
pub async fn agent_costs(dir: &Path, turns: usize) -> anyhow::Result<AgentCosts> {
    let builder = Worker::builder()
        .data_dir(dir)
        .register(chatty)
        .register(echo);
    let worker = builder.llm(EchoModel { turns }).build().await?;
    let id = format!("agent-{turns}");
    let started = Instant::now();
    let run = worker
        .start_with(chatty, turns as u64, with_id(id.clone()))
        .await?;
    let message_bytes = run.result().await?;
    let turn_s = started.elapsed().as_secs_f64() / (turns + 1) as f64;
    let journal = worker.journal(&id)?;
    let journal_bytes = waymark::inspect::write_framed(&journal).len();
    worker.shutdown().await;
    Ok(AgentCosts {
        turn_s,
        journal_bytes,
        message_bytes,
    })
}

/// A bound a figure must keep.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Bound {
    /// `≤`
    AtMost(f64),
    /// `<`
    Below(f64),
    /// `≥`
    AtLeast(f64),
}

impl Bound {
    /// Whether `value` keeps the bound.
    pub fn met(self, value: f64) -> bool {
        match self {
            Bound::AtMost(bound) => value <= bound,
            Bound::Below(bound) => value < bound,
            Bound::AtLeast(bound) => value >= bound,
        }
    }
}

impl std::fmt::Display for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Bound::AtMost(bound) => write!(f, "<= {bound}"),
            Bound::Below(bound) => write!(f, "< {bound}"),
            Bound::AtLeast(bound) => write!(f, ">= {bound}"),
        }
    }
}

/// The targets the figures are held to (BENCHMARKS.md says where each comes from). A target
/// whose figure the run did not measure counts as missed.
pub const TARGETS: [(&str, Bound); 15] = [
    ("step_vs_synced_put", Bound::AtMost(1.3)),
    ("effect_vs_synced_put", Bound::AtMost(2.3)),
    ("concurrent_vs_group_commit", Bound::AtLeast(0.5)),
    ("long_run_late_vs_early_steps", Bound::AtMost(1.2)),
    ("signal_piled_vs_empty_inbox", Bound::AtMost(1.2)),
    (
        "signal_unlistened_long_vs_short_history",
        Bound::AtMost(1.2),
    ),
    ("chunk_long_vs_fresh_stream", Bound::AtMost(1.2)),
    ("decisions_listed_settled_vs_none", Bound::AtMost(1.2)),
    ("decisions_listed_fresh_settled_vs_none", Bound::AtMost(1.2)),
    ("waiting_rss_bytes_per_workflow", Bound::Below(1024.0)),
    ("replay_entries_per_s", Bound::AtLeast(1_000_000.0)),
    ("recovery_ms_per_100k", Bound::Below(1000.0)),
    ("restart_to_first_step_ms", Bound::Below(10.0)),
    ("long_run_held_at_last_step", Bound::AtMost(4.0)),
    ("long_run_heap_growth_bytes", Bound::Below(65_536.0)),
];

/// A figure beside its target.
#[derive(Clone, Debug, PartialEq)]
pub struct Judged {
    /// The figure's name in the output.
    pub name: &'static str,
    /// Its value; `None` if the run did not measure it.
    pub value: Option<f64>,
    /// Its target.
    pub bound: Bound,
}

impl Judged {
    /// Measured, and within its target.
    pub fn met(&self) -> bool {
        self.value.is_some_and(|value| self.bound.met(value))
    }
}

/// Every target with the figure `figures` holds for it.
pub fn judge(figures: &serde_json::Value) -> Vec<Judged> {
    TARGETS
        .iter()
        .map(|&(name, bound)| Judged {
            name,
            value: figures[name].as_f64(),
            bound,
        })
        .collect()
}

/// The targets as the JSON output holds them: each figure's target, value and verdict.
pub fn targets_json(judged: &[Judged]) -> serde_json::Value {
    let entries = judged.iter().map(|judged| {
        let verdict = serde_json::json!({
            "target": judged.bound.to_string(),
            "value": judged.value,
            "met": judged.met(),
        });
        (judged.name.to_owned(), verdict)
    });
    serde_json::Value::Object(entries.collect())
}

#[cfg(test)]
mod target_tests {
    use super::*;

    #[test]
    fn each_bound_is_kept_at_its_edge_as_stated() {
        assert!(Bound::AtMost(1.3).met(1.3) && !Bound::AtMost(1.3).met(1.31));
        assert!(!Bound::Below(10.0).met(10.0) && Bound::Below(10.0).met(9.9));
        assert!(Bound::AtLeast(0.5).met(0.5) && !Bound::AtLeast(0.5).met(0.49));
    }

    #[test]
    fn an_unmeasured_figure_is_a_missed_target() {
        let figures = serde_json::json!({"step_vs_synced_put": 1.2, "effect_vs_synced_put": 3.0});
        let judged = judge(&figures);
        let verdict = |name: &str| judged.iter().find(|j| j.name == name).unwrap().met();
        assert!(verdict("step_vs_synced_put"));
        assert!(!verdict("effect_vs_synced_put"));
        assert!(!verdict("restart_to_first_step_ms"), "not measured");
        let json = targets_json(&judged);
        assert_eq!(json["effect_vs_synced_put"]["target"], "<= 2.3");
        assert_eq!(json["effect_vs_synced_put"]["met"], false);
        assert!(json["restart_to_first_step_ms"]["value"].is_null());
    }
}

#[cfg(test)]
mod yardstick_tests {
    use super::*;

    /// The concurrency figure's yardstick writes the rows the runs left, every one of them,
    /// in the order concurrent runs write them: each run's first row before any run's second.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_yardstick_takes_every_row_of_the_runs_in_turn() {
        let dir = tempfile::tempdir().unwrap();
        let worker = Arc::new(worker(dir.path()).await.unwrap());
        steps_per_second(&worker, 3, 2, 0).await.unwrap();
        let Ok(worker) = Arc::try_unwrap(worker) else {
            panic!("the worker is still shared")
        };
        worker.shutdown().await;
        let ids: Vec<String> = (0..3).map(|i| concurrent_id(3, 0, i)).collect();
        let rows = rows_of(dir.path(), &ids).unwrap();
        // A row is keyed by its workflow's id first, or, listing it as ended, last.
        let owner = |write: &Write| match write {
            Write::Put(_, key, _) => ids
                .iter()
                .map(|id| waymark_runtime::keys::id_key(id))
                .position(|id| key.starts_with(&id) || key.ends_with(&id))
                .unwrap(),
            other => panic!("not a row: {other:?}"),
        };
        // Started, two steps of two entries, completed: six journal rows, the record, and the
        // two rows listing the ended workflow.
        assert!(rows.len() >= 3 * 9, "{} rows", rows.len());
        let owners: Vec<usize> = rows.iter().map(owner).collect();
        for turn in owners.chunks(3).take(rows.len() / 3) {
            let mut turn = turn.to_vec();
            turn.sort();
            assert_eq!(turn, [0, 1, 2], "{owners:?}");
        }
        let journal_rows = rows
            .iter()
            .filter(|write| write.table() == Table::Journal)
            .count();
        assert_eq!(journal_rows, 3 * 6);
        let ended_rows = rows
            .iter()
            .filter(|write| write.table() == Table::Ended)
            .count();
        assert_eq!(ended_rows, 3 * 2);
    }
}
