//! Costs that must not grow with what a run already holds: a signal's, however many signals
//! wait unread in the inbox or however long the history of the parked run it is sent to, and
//! a streamed chunk's, however many chunks the stream holds.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use waymark::prelude::*;
use waymark::RunHandle;

use super::with_id;

/// How many `tick` signals [`ticks`] runs have taken so far, in all, told by the step after
/// each.
fn ticks_taken() -> &'static watch::Sender<u64> {
    static TAKEN: OnceLock<watch::Sender<u64>> = OnceLock::new();
    TAKEN.get_or_init(|| watch::Sender::new(0))
}

/// Says that a run took its tick `i`.
#[activity]
pub async fn tick_taken(i: u64) -> Result<u64, ActivityError> {
    ticks_taken().send_modify(|taken| *taken += 1);
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
/// signals: the median of `window` ticks each, from sending a tick to the step that follows
/// it (a median, so that a slow fsync here and there does not decide the ratio).
pub struct InboxCosts {
    /// The inbox empty.
    pub empty_s: f64,
    /// The inbox holding the piled signals.
    pub piled_s: f64,
}

/// Starts two [`ticks`] runs, piles `piled` signals the second never reads into its inbox, then
/// times `window` ticks of each, in turn: both on the same store, at the same moments, so that
/// neither the disk's drift over the run nor the rows the pile added decides the ratio. Each
/// tick is sent once both runs are out of memory, as a run waiting on people is when its
/// signal comes: every tick rebuilds its run.
pub async fn inbox_costs(worker: &Worker, piled: u64, window: u64) -> anyhow::Result<InboxCosts> {
    const EMPTY: &str = "inbox-empty";
    const PILED: &str = "inbox-piled";
    ticks_taken().send_replace(0);
    let empty_run = worker
        .start_with(ticks, window, with_id(EMPTY.into()))
        .await?;
    let piled_run = worker
        .start_with(ticks, window, with_id(PILED.into()))
        .await?;
    for i in 0..piled {
        worker
            .signal(PILED, "pile", &format!("pile-{i}"), &i)
            .await?;
    }
    let mut taken = ticks_taken().subscribe();
    let (mut empty_s, mut piled_s) = (Vec::new(), Vec::new());
    for i in 0..window {
        for (sent, id) in (2 * i..).zip([EMPTY, PILED]) {
            out_of_memory(worker).await?;
            let seconds = tick_round_trip(worker, &mut taken, id, sent).await?;
            match id {
                EMPTY => empty_s.push(seconds),
                _ => piled_s.push(seconds),
            }
        }
    }
    empty_run.result().await?;
    piled_run.result().await?;
    Ok(InboxCosts {
        empty_s: super::median(empty_s),
        piled_s: super::median(piled_s),
    })
}

/// What a signal of a name no wait listens for costs a parked run: the median seconds from
/// sending one to no run being in memory again, for a run without history and for one of
/// `history` steps.
pub struct UnlistenedCosts {
    /// The run without history.
    pub short_s: f64,
    /// The run of `history` steps.
    pub long_s: f64,
}

/// Starts two [`super::steps_then_wait`] runs, one of no step and one of `history`, then
/// sends each `count` signals of a name neither waits for, in turn, each once both runs are
/// out of memory. A run rebuilt for such a signal would replay its whole history to find
/// itself waiting again.
pub async fn unlistened_signal_costs(
    worker: &Worker,
    history: u64,
    count: u64,
) -> anyhow::Result<UnlistenedCosts> {
    const SHORT: &str = "unlistened-short";
    const LONG: &str = "unlistened-long";
    for (id, steps) in [(SHORT, 0), (LONG, history)] {
        let start = with_id(id.into());
        worker
            .start_with(super::steps_then_wait, steps, start)
            .await?;
    }
    let (mut short_s, mut long_s) = (Vec::new(), Vec::new());
    for i in 0..count {
        for id in [SHORT, LONG] {
            out_of_memory(worker).await?;
            let started = Instant::now();
            worker.signal(id, "note", &format!("note-{i}"), &i).await?;
            out_of_memory(worker).await?;
            let seconds = started.elapsed().as_secs_f64();
            match id {
                SHORT => short_s.push(seconds),
                _ => long_s.push(seconds),
            }
        }
    }
    Ok(UnlistenedCosts {
        short_s: super::median(short_s),
        long_s: super::median(long_s),
    })
}

/// Waits until no run of `worker` is in memory.
async fn out_of_memory(worker: &Worker) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while worker.resident_workflows() > 0 {
        anyhow::ensure!(Instant::now() < deadline, "a run stayed in memory");
        tokio::time::sleep(Duration::from_micros(100)).await;
    }
    Ok(())
}

/// Sends run `id` its tick, the `sent`th of all, and waits for the step after it: the seconds
/// from sending to that step.
async fn tick_round_trip(
    worker: &Worker,
    taken: &mut watch::Receiver<u64>,
    id: &str,
    sent: u64,
) -> anyhow::Result<f64> {
    timed_signal(
        worker,
        id,
        "tick",
        sent,
        (taken, sent),
        Duration::from_secs(60),
    )
    .await
}

/// Sends run `id` signal `name` number `number`; the seconds until `counter` passes `past`,
/// waiting at most `limit`.
async fn timed_signal(
    worker: &Worker,
    id: &str,
    name: &str,
    number: u64,
    (counter, past): (&mut watch::Receiver<u64>, u64),
    limit: Duration,
) -> anyhow::Result<f64> {
    let started = Instant::now();
    let signal_id = format!("{name}-{number}");
    worker.signal(id, name, &signal_id, &number).await?;
    let wait = counter.wait_for(|count| *count > past);
    tokio::time::timeout(limit, wait).await??;
    Ok(started.elapsed().as_secs_f64())
}

/// How many windows of streaming steps [`streams`] runs have finished, in all.
fn windows_done() -> &'static watch::Sender<u64> {
    static DONE: OnceLock<watch::Sender<u64>> = OnceLock::new();
    DONE.get_or_init(|| watch::Sender::new(0))
}

/// Streams `chunks` chunks to the workflow's stream.
#[activity]
pub async fn streams_chunks(cx: ActivityContext, chunks: u64) -> Result<u64, ActivityError> {
    for i in 0..chunks {
        cx.stream(&format!("chunk {i} "));
    }
    Ok(chunks)
}

/// Says that a window of streaming steps finished.
#[activity]
pub async fn window_done(round: u64) -> Result<u64, ActivityError> {
    windows_done().send_modify(|done| *done += 1);
    Ok(round)
}

/// How a [`streams`] run streams: each step `chunks` chunks; `built` steps at once (a window
/// done once they are), then a window of `window` steps at each of `rounds` signals named
/// `next`.
#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize)]
pub struct Streaming {
    /// Steps streamed at once.
    pub built: u64,
    /// Windows streamed, each at a signal.
    pub rounds: u64,
    /// Steps per window.
    pub window: u64,
    /// Chunks per step.
    pub chunks: u64,
}

/// Streams as `how` says. A step's result is journaled after its chunks are written (the
/// writer keeps their order), so a window ends when its chunks are durable.
#[workflow]
pub async fn streams(ctx: WorkflowContext, how: Streaming) -> Result<u64, WorkflowError> {
    for _ in 0..how.built {
        ctx.activity(streams_chunks, how.chunks).await?;
    }
    ctx.activity(window_done, 0).await?;
    for round in 0..how.rounds {
        let _next: u64 = ctx.signal("next").await?;
        for _ in 0..how.window {
            ctx.activity(streams_chunks, how.chunks).await?;
        }
        ctx.activity(window_done, round).await?;
    }
    Ok(how.rounds)
}

/// What a streamed chunk costs in a fresh stream and in one already holding at least
/// `built × chunks` chunks (and the windows before): the median seconds of a window of steps
/// in each, the two timed in turn so that the machine's drift falls on both alike.
pub struct StreamCosts {
    /// A window in a new workflow's stream.
    pub early_s: f64,
    /// A window in the long stream.
    pub late_s: f64,
}

/// Builds a stream of `built` steps of `chunks` chunks, then times `rounds` windows of `window`
/// steps in it, each after a window in a new workflow's stream.
pub async fn stream_costs(
    worker: &Worker,
    built: u64,
    rounds: u64,
    window: u64,
    chunks: u64,
) -> anyhow::Result<StreamCosts> {
    let long = Streaming {
        built,
        rounds,
        window,
        chunks,
    };
    let long_run = started_and_built(worker, long, "stream-long").await?;
    let (mut early, mut late) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let fresh = Streaming {
            built: 0,
            rounds: 1,
            ..long
        };
        let id = format!("stream-fresh-{round}");
        let fresh_run = started_and_built(worker, fresh, &id).await?;
        early.push(timed_window(worker, &id, round).await?);
        fresh_run.result().await?;
        late.push(timed_window(worker, "stream-long", round).await?);
    }
    long_run.result().await?;
    Ok(StreamCosts {
        early_s: super::median(early),
        late_s: super::median(late),
    })
}

/// Starts a [`streams`] run as `id` and waits until it streamed the steps it builds at once,
/// so that no window is timed beside them.
async fn started_and_built(
    worker: &Worker,
    how: Streaming,
    id: &str,
) -> anyhow::Result<RunHandle<u64>> {
    let mut done = windows_done().subscribe();
    let before = *done.borrow_and_update();
    let run = worker.start_with(streams, how, with_id(id.into())).await?;
    let wait = done.wait_for(|count| *count > before);
    tokio::time::timeout(Duration::from_secs(600), wait).await??;
    Ok(run)
}

/// Lets workflow `id` stream its next window; seconds until the window finished.
async fn timed_window(worker: &Worker, id: &str, round: u64) -> anyhow::Result<f64> {
    let mut done = windows_done().subscribe();
    let before = *done.borrow_and_update();
    let limit = Duration::from_secs(600);
    timed_signal(worker, id, "next", round, (&mut done, before), limit).await
}
