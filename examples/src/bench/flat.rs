//! Costs that must not grow with what a run already holds: a signal's, however many signals
//! wait unread in the inbox, and a streamed chunk's, however many chunks the stream holds.

use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use waymark::prelude::*;

use super::with_id;

/// How many `tick` signals [`ticks`] has taken so far, told by its step after each.
fn ticks_taken() -> &'static watch::Sender<u64> {
    static TAKEN: OnceLock<watch::Sender<u64>> = OnceLock::new();
    TAKEN.get_or_init(|| watch::Sender::new(0))
}

/// Says that tick `i` was taken.
#[activity]
pub async fn tick_taken(i: u64) -> Result<u64, ActivityError> {
    ticks_taken().send_replace(i + 1);
    Ok(i)
}

/// Takes `n` signals named `tick`, a step after each. Signals of any other name stay in its
/// inbox, unread.
#[workflow]
pub async fn ticks(ctx: WorkflowContext, n: u64) -> Result<u64, WorkflowError> {
    for i in 0..n {
        let _tick: u64 = ctx.signal("tick").await?;
        ctx.activity(tick_taken, i).await?;
    }
    Ok(n)
}

/// What a signal costs in front of an empty inbox and in front of one holding `piled` unread
/// signals: seconds for `window` ticks each, from sending a tick to the step that follows it.
pub struct InboxCosts {
    /// The inbox empty.
    pub early_s: f64,
    /// The inbox holding the piled signals.
    pub late_s: f64,
}

/// Runs [`ticks`] through `window` ticks, piles `piled` signals it never reads into its inbox,
/// then times `window` ticks again.
pub async fn inbox_costs(worker: &Worker, piled: u64, window: u64) -> anyhow::Result<InboxCosts> {
    const ID: &str = "inbox";
    ticks_taken().send_replace(0);
    let run = worker
        .start_with(ticks, 2 * window, with_id(ID.into()))
        .await?;
    let early_s = tick_round_trips(worker, ID, 0..window).await?;
    for i in 0..piled {
        worker.signal(ID, "pile", &format!("pile-{i}"), &i).await?;
    }
    let late_s = tick_round_trips(worker, ID, window..2 * window).await?;
    run.result().await?;
    Ok(InboxCosts { early_s, late_s })
}

/// Sends each tick of `numbers` once the one before was taken; seconds until the last was.
async fn tick_round_trips(
    worker: &Worker,
    id: &str,
    numbers: std::ops::Range<u64>,
) -> anyhow::Result<f64> {
    let mut taken = ticks_taken().subscribe();
    let started = Instant::now();
    for i in numbers {
        worker.signal(id, "tick", &format!("tick-{i}"), &i).await?;
        let wait = taken.wait_for(|count| *count > i);
        tokio::time::timeout(Duration::from_secs(60), wait).await??;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// When each streaming step began.
static STREAM_STEP_STARTS: Mutex<Vec<Instant>> = Mutex::new(Vec::new());

/// Streams `chunks` chunks to the workflow's stream, noting when it began.
#[activity]
pub async fn streams_chunks(cx: ActivityContext, chunks: u64) -> Result<u64, ActivityError> {
    STREAM_STEP_STARTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Instant::now());
    for i in 0..chunks {
        cx.stream(&format!("chunk {i} "));
    }
    Ok(chunks)
}

/// `steps` steps of `chunks` streamed chunks each, then one more that only notes its start.
#[workflow]
pub async fn streams(ctx: WorkflowContext, size: (u64, u64)) -> Result<u64, WorkflowError> {
    let (steps, chunks) = size;
    for _ in 0..steps {
        ctx.activity(streams_chunks, chunks).await?;
    }
    ctx.activity(streams_chunks, 0).await?;
    Ok(steps * chunks)
}

/// What a streamed chunk costs early in a stream and once it holds `steps × chunks` chunks:
/// seconds for `window` steps of `chunks` chunks each. A step's result is journaled after its
/// chunks are written (the writer keeps their order), so a step ends when they are durable.
pub struct StreamCosts {
    /// Steps 1 to `window` (step 0 warms up).
    pub early_s: f64,
    /// The last `window` steps.
    pub late_s: f64,
}

/// Runs [`streams`] and times its first and last steps.
pub async fn stream_costs(
    worker: &Worker,
    steps: u64,
    chunks: u64,
    window: u64,
) -> anyhow::Result<StreamCosts> {
    anyhow::ensure!(
        steps > 2 * window,
        "{steps} steps leave no room for two windows"
    );
    STREAM_STEP_STARTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clear();
    let run = worker
        .start_with(streams, (steps, chunks), with_id("stream".into()))
        .await?;
    run.result().await?;
    let starts = STREAM_STEP_STARTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let (steps, window) = (steps as usize, window as usize);
    anyhow::ensure!(
        starts.len() == steps + 1,
        "{} streaming steps noted their start, {} expected",
        starts.len(),
        steps + 1
    );
    let span = |from: usize, to: usize| starts[to].duration_since(starts[from]).as_secs_f64();
    Ok(StreamCosts {
        early_s: span(1, 1 + window),
        late_s: span(steps - window, steps),
    })
}
