//! Measures, in one run on temporary data dirs, what journaling costs against the storage
//! limit: per-step overhead against a raw synced put, throughput under concurrency against raw
//! synced batches, replay speed, memory per waiting workflow, and recovery time. Each figure is
//! the median over rounds; ratios compare figures measured in this same run.
//!
//! `cargo run --release -p waymark-examples --bin bench -- [--quick] [--json]
//! [--database-url postgres://…]`; with a database, the PostgreSQL figures too, in a schema of
//! their own that is dropped after.
// The figures' `json!` object is deeper than the macro's default recursion allows.
#![recursion_limit = "256"]

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use futures::future::try_join_all;
use serde_json::json;
use waymark::inspect::{import_workflow, write_framed, DataDir};
use waymark::testing::Replayer;
use waymark::Worker;
use waymark_examples::bench::{self, median, noop, steps_then_wait};
use waymark_examples::bench_postgres::{self as pg, Schema};
use waymark_examples::heap_count::{heap_counts, CountingAllocator};
use waymark_runtime::store::Engine as _;

/// Counts the Rust heap's allocations and bytes, for the allocation and long-run figures.
#[global_allocator]
static HEAP: CountingAllocator = CountingAllocator;

/// Heap allocations made so far (reallocations count), by the Rust code: RocksDB's C++
/// allocates apart.
fn allocations() -> usize {
    heap_counts().allocations
}

fn heap_live() -> usize {
    heap_counts().live_bytes()
}

/// Benchmark the runtime against the storage limit.
#[derive(Parser)]
struct Args {
    /// Smaller sizes: finishes within about two minutes on two cores.
    #[arg(long)]
    quick: bool,
    /// Print one JSON object instead of lines.
    #[arg(long)]
    json: bool,
    /// Exit with status 1 when a figure misses its target (or was not measured).
    #[arg(long)]
    check: bool,
    /// A PostgreSQL database to measure the shared store on, too.
    #[arg(long, env = "WAYMARK_BENCH_DATABASE_URL")]
    database_url: Option<String>,
    #[command(subcommand)]
    role: Option<Role>,
}

/// What a process the benchmark starts does.
#[derive(Subcommand)]
enum Role {
    /// Starts `count` workflows that wait on the database, says `waiting`, and waits to be killed.
    #[command(hide = true)]
    WaitOnPostgres {
        #[arg(long)]
        database_url: String,
        #[arg(long)]
        schema: String,
        #[arg(long)]
        count: usize,
        #[arg(long)]
        lease_ms: u64,
    },
    /// Starts a worker on `data_dir` and waits to be killed (its workflow's step says when it
    /// ran).
    #[command(hide = true)]
    RestartProbe {
        #[arg(long)]
        data_dir: std::path::PathBuf,
    },
    /// Says `started` and waits to be killed: what a restart spends before any of its work.
    #[command(hide = true)]
    StartProbe,
    /// Opens the store in `data_dir` as a worker does, says `opened`, and waits to be killed:
    /// what a restart spends before it reads any of the store's rows.
    #[command(hide = true)]
    OpenProbe {
        #[arg(long)]
        data_dir: std::path::PathBuf,
    },
    /// Runs one workflow of `steps` sequential no-op steps (or effects) on a new store and
    /// prints the heap allocations per step: a fixed amount of work for
    /// `valgrind --tool=callgrind`, whose instruction counts for two step counts give the
    /// instructions per step (see BENCHMARKS.md).
    StepProfile {
        #[arg(long)]
        steps: u64,
        #[arg(long)]
        effects: bool,
    },
    /// Makes `count` raw synced RocksDB puts on a new store, as the figures' yardstick does,
    /// and prints their median and mean: the baseline `step-profile` is compared with under
    /// `perf stat`.
    PutProfile {
        #[arg(long)]
        count: usize,
    },
    /// Leaves in `data_dir` what the restart figure restarts on (one workflow with a 999-step
    /// history whose next step is due), for `restart-probe` under a profiler.
    RestartPrepare {
        #[arg(long)]
        data_dir: std::path::PathBuf,
        /// Steps of history before the due step (the figure's is 999).
        #[arg(long, default_value_t = RESTART_HISTORY)]
        history: u64,
    },
    /// Leaves in `data_dir` `count` workflows waiting for a signal, out of memory, as the
    /// recovery figure does before it restarts: for `recovery-probe` under a profiler.
    RecoveryPrepare {
        #[arg(long)]
        data_dir: std::path::PathBuf,
        #[arg(long)]
        count: usize,
    },
    /// Starts a worker on `data_dir`, waits until every workflow it recovered is replayed and
    /// out of memory again, and prints how long that took from the start of the worker.
    RecoveryProbe {
        #[arg(long)]
        data_dir: std::path::PathBuf,
    },
    /// Runs `concurrency` workflows of `steps` no-op steps each at once on a new store, as the
    /// concurrency figure does, `rounds` times on one worker, and prints each round's steps per
    /// second: for `perf` or callgrind. The figure takes the median of its rounds, most of
    /// which find the memory the first one touched already mapped.
    ConcurrentProfile {
        #[arg(long)]
        concurrency: usize,
        #[arg(long)]
        steps: u64,
        #[arg(long, default_value_t = 1)]
        rounds: usize,
    },
    /// Replays a journal of `steps` steps `rounds` times, as the replay figure does: for
    /// `valgrind --tool=callgrind`.
    ReplayProfile {
        #[arg(long)]
        steps: u64,
        #[arg(long)]
        rounds: usize,
    },
    /// Times signals in front of an empty inbox and of one holding `piled` unread signals, and
    /// streamed chunks in new streams and in one of `stream_steps` steps, as the two figures
    /// do, and prints them.
    FlatProfile {
        #[arg(long)]
        piled: u64,
        #[arg(long)]
        stream_steps: u64,
    },
}

/// Sizes of one run.
struct Sizes {
    rounds: usize,
    puts: usize,
    steps: u64,
    effect_steps: u64,
    steps_per_workflow: u64,
    replay_steps: u64,
    waiting: usize,
    long_run: u64,
    /// Signals left unread in a run's inbox before its signals are timed again.
    piled_signals: u64,
    /// Steps of [`CHUNKS_PER_STEP`] streamed chunks each that the long stream holds before its
    /// windows are timed.
    stream_steps: u64,
    /// Workflows a killed PostgreSQL worker had in flight.
    taken_over: usize,
}

impl Sizes {
    fn new(quick: bool) -> Self {
        match quick {
            true => Self {
                rounds: 3,
                puts: 300,
                steps: 500,
                effect_steps: 300,
                steps_per_workflow: 20,
                replay_steps: 5_000,
                waiting: 10_000,
                long_run: 10_000,
                piled_signals: 10_000,
                stream_steps: 40,
                taken_over: 2_000,
            },
            false => Self {
                rounds: 5,
                puts: 2_000,
                steps: 2_000,
                effect_steps: 2_000,
                steps_per_workflow: 100,
                replay_steps: 5_000,
                waiting: 100_000,
                long_run: 50_000,
                piled_signals: 20_000,
                stream_steps: 100,
                taken_over: 10_000,
            },
        }
    }
}

/// Chunks each step of the stream figure streams.
const CHUNKS_PER_STEP: u64 = 500;

/// Streaming steps in each timed window of the stream figure.
const STREAM_WINDOW: u64 = 6;

/// Windows timed in each stream, the fresh ones and the long one, in turn.
const STREAM_ROUNDS: u64 = 11;

/// Signals timed in front of the empty inbox, and again in front of the piled one.
const TICK_WINDOW: u64 = 200;

/// Steps of history of the parked run that signals no wait listens for are sent to, and how
/// many such signals each of the two runs is sent.
const UNLISTENED_HISTORY: u64 = 1_000;
const UNLISTENED_SIGNALS: u64 = 50;

/// Operations left awaiting an operator's decision on each store the listing is timed on.
const AWAITING_DECISIONS: u64 = 50;

/// Listings timed on each of those stores, in turn.
const DECISION_LISTINGS: usize = 21;

/// The value of each raw synced put, the step figures' yardstick, and of each row of the
/// 256-byte-put batches the concurrency figure was once compared with: about what a step's
/// commit wrote when it wrote a journal entry and the workflow's record.
const WRITE_BYTES: usize = 256;

/// Rows in each synced batch of the concurrency figure's yardstick: the rows of as many steps
/// (two each) as the store's writer folds into one batch at most (256 transitions).
const RAW_BATCH_ROWS: usize = 512;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    match args.role {
        Some(Role::WaitOnPostgres {
            database_url,
            schema,
            count,
            lease_ms,
        }) => return wait_on_postgres(&database_url, schema, count, lease_ms).await,
        Some(Role::RestartProbe { data_dir }) => {
            let _worker = bench::worker(&data_dir).await?;
            std::future::pending::<()>().await;
        }
        Some(Role::StartProbe) => {
            say("started");
            std::future::pending::<()>().await;
        }
        Some(Role::OpenProbe { data_dir }) => {
            let open = move || waymark::store::RocksStore::open(&data_dir);
            let _store = tokio::task::spawn_blocking(open).await??;
            say("opened");
            std::future::pending::<()>().await;
        }
        Some(Role::StepProfile { steps, effects }) => {
            return step_profile(steps, effects).await;
        }
        Some(Role::PutProfile { count }) => {
            let dir = tempfile::tempdir()?;
            let puts = bench::synced_puts(dir.path(), WRITE_BYTES, count)?;
            println!(
                "synced put: median {:.1} µs, mean {:.1} µs",
                puts.median * 1e6,
                puts.mean * 1e6
            );
            return Ok(());
        }
        Some(Role::RestartPrepare { data_dir, history }) => {
            return bench::due_after_history(&data_dir, history).await;
        }
        Some(Role::RecoveryPrepare { data_dir, count }) => {
            let worker = bench::worker(&data_dir).await?;
            bench::start_waiting(&worker, count, "waiting").await?;
            worker.shutdown().await;
            return Ok(());
        }
        Some(Role::RecoveryProbe { data_dir }) => {
            let started = Instant::now();
            let worker = bench::worker(&data_dir).await?;
            bench::wait_until_idle(&worker, std::time::Duration::from_secs(600)).await?;
            let ms = started.elapsed().as_secs_f64() * 1e3;
            println!("recovered in {ms:.1} ms");
            worker.shutdown().await;
            return Ok(());
        }
        Some(Role::ConcurrentProfile {
            concurrency,
            steps,
            rounds,
        }) => {
            let root = tempfile::tempdir()?;
            let worker = Arc::new(bench::worker(root.path()).await?);
            for round in 0..rounds {
                let rate = bench::steps_per_second(&worker, concurrency, steps, round).await?;
                println!("{rate:.0} steps/s");
            }
            return Ok(());
        }
        Some(Role::FlatProfile {
            piled,
            stream_steps,
        }) => return flat_profile(piled, stream_steps).await,
        Some(Role::ReplayProfile { steps, rounds }) => {
            let root = tempfile::tempdir()?;
            let (ms, entries) = replay_ms(root.path(), steps, rounds).await?;
            println!("replayed {entries} entries in {ms:.1} ms");
            return Ok(());
        }
        None => {}
    }
    let _ = bench::HEAP_LIVE.set(heap_live);
    let sizes = Sizes::new(args.quick);
    let root = tempfile::tempdir()?;
    let dir = |name: &str| root.path().join(name);
    let started = Instant::now();

    // Where a step's time goes: the store's share, synced and not, through the writer thread.
    let commit_synced =
        bench::store_commit_seconds(&dir("commit-synced"), true, sizes.puts).await?;
    let commit_unsynced =
        bench::store_commit_seconds(&dir("commit-unsynced"), false, sizes.puts).await?;
    let worker = bench::worker(&dir("steps")).await?;
    let mut rounds = Vec::new();
    for round in 0..sizes.rounds {
        rounds.push(step_round(&worker, &sizes, &dir(&format!("raw-put-{round}")), round).await?);
    }
    worker.shutdown().await;
    let of = |figure: fn(&StepRound) -> f64| median(rounds.iter().map(figure).collect());
    let (step, effect) = (of(|r| r.step), of(|r| r.effect));
    let (step_vs_put, effect_vs_put) = (
        of(|r| r.step / r.put.median),
        of(|r| r.effect / r.put.median),
    );
    let (step_allocations, effect_allocations) =
        (of(|r| r.step_allocations), of(|r| r.effect_allocations));
    let put = of(|r| r.put.median);
    let put_mean = of(|r| r.put.mean);

    let worker = Arc::new(bench::worker(&dir("concurrent")).await?);
    let mut rates = Vec::new();
    for concurrency in [1, 64, 1024] {
        let mut round_rates = Vec::new();
        for round in 0..sizes.rounds.min(3) {
            let rate =
                bench::steps_per_second(&worker, concurrency, sizes.steps_per_workflow, round)
                    .await?;
            round_rates.push(rate);
        }
        rates.push(median(round_rates));
    }
    // Shut down, not dropped: the rows are read next from the same store.
    let Ok(worker) = Arc::try_unwrap(worker) else {
        anyhow::bail!("the concurrency figure's worker is still shared");
    };
    worker.shutdown().await;
    let total = 1024 * sizes.steps_per_workflow as usize;
    let raw_puts = bench::synced_batch_rate(&dir("raw-batch"), WRITE_BYTES, total, 256)?;
    let ids: Vec<String> = (0..1024)
        .map(|i| bench::concurrent_id(1024, 0, i))
        .collect();
    let rows = bench::rows_of(&dir("concurrent"), &ids)?;
    let rows_written = rows.len();
    // A median, as the runtime's rate is: one write of these rows lasts a tenth of a second,
    // and a slow fsync or a neighbour's burst moves it by half.
    let mut raw_seconds = Vec::new();
    for round in 0..sizes.rounds.min(3) {
        let raw_dir = dir(&format!("raw-rows-{round}"));
        let rows = rows.clone();
        raw_seconds.push(bench::synced_batches_seconds(
            &raw_dir,
            rows,
            RAW_BATCH_ROWS,
        )?);
    }
    let raw_steps = total as f64 / median(raw_seconds);

    let worker = bench::worker(&dir("long-run")).await?;
    let long = bench::long_run_costs(&worker, sizes.long_run).await?;
    let held = long.footprint;
    worker.shutdown().await;

    let worker = bench::worker(&dir("inbox")).await?;
    let inbox = bench::inbox_costs(&worker, sizes.piled_signals, TICK_WINDOW).await?;
    let unlistened =
        bench::unlistened_signal_costs(&worker, UNLISTENED_HISTORY, UNLISTENED_SIGNALS).await?;
    worker.shutdown().await;
    let worker = bench::worker(&dir("stream")).await?;
    let stream = bench::stream_costs(
        &worker,
        sizes.stream_steps,
        STREAM_ROUNDS,
        STREAM_WINDOW,
        CHUNKS_PER_STEP,
    )
    .await?;
    worker.shutdown().await;

    let agent = bench::agent_costs(&dir("agent"), AGENT_TURNS).await?;

    let (replay_ms, replayed) = replay_ms(&dir("replay"), sizes.replay_steps, sizes.rounds).await?;
    // Each round's restart first, so that nothing the other probes read is cached for it.
    let (mut restarts, mut opens, mut starts) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..sizes.rounds.min(3) {
        restarts.push(restart_probe(&dir(&format!("restart-{round}"))).await?);
        opens.push(store_open_probe(&dir(&format!("open-{round}"))).await?);
        starts.push(probe("start-probe", None, "started")?);
    }
    let cpu = |probes: &[Probe]| median(probes.iter().filter_map(|p| p.cpu_ms).collect());
    let wall = |probes: &[Probe]| median(probes.iter().map(|p| p.wall_ms).collect());
    let waiting = wait_and_recover(&dir("waiting"), sizes.waiting).await?;
    let (rss_per_workflow, recovery_ms) = (waiting.rss_per_workflow, waiting.recovery_ms);
    // After the resident-memory figure, whose baseline the listings' allocations would move.
    // As many settled operations as parked workflows there: a store's effects outnumber its
    // workflows.
    let decisions = bench::decision_listing_costs(
        &dir("decisions-bare"),
        &dir("decisions-settled"),
        AWAITING_DECISIONS,
        sizes.waiting,
        DECISION_LISTINGS,
    )
    .await?;
    let postgres = match &args.database_url {
        Some(url) => postgres_figures(url, &sizes).await?,
        None => serde_json::Value::Null,
    };

    let figures = json!({
        "step_vs_synced_put": step_vs_put,
        "effect_vs_synced_put": effect_vs_put,
        "steps_per_s_1": rates[0],
        "steps_per_s_64": rates[1],
        "steps_per_s_1024": rates[2],
        "concurrent_vs_group_commit": rates[2] / raw_steps,
        "concurrent_vs_synced_256_byte_puts": rates[2] / raw_puts,
        "replay_10k_ms": replay_ms,
        "waiting_rss_bytes_per_workflow": rss_per_workflow,
        "recovery_10k_ms": recovery_ms,
        "replay_entries_per_s": replayed as f64 / (replay_ms / 1e3),
        "recovery_ms_per_100k": recovery_ms * 100_000.0 / sizes.waiting as f64,
        "restart_to_first_step_ms": wall(&restarts),
        "long_run_late_vs_early_steps": long.late_s / long.early_s,
        "signal_piled_vs_empty_inbox": inbox.piled_s / inbox.empty_s,
        "signal_unlistened_long_vs_short_history": unlistened.long_s / unlistened.short_s,
        "chunk_long_vs_fresh_stream": stream.late_s / stream.early_s,
        "decisions_listed_settled_vs_none": decisions.compacted_s[1] / decisions.compacted_s[0],
        "decisions_listed_fresh_settled_vs_none": decisions.fresh_s[1] / decisions.fresh_s[0],
        "agent_turn_vs_step": agent.turn_s / step,
        "agent_50_turns_journal_vs_messages": agent.journal_bytes as f64 / agent.message_bytes as f64,
        "long_run_held_at_last_step": held.core.open_commands + held.core.kept_facts
            + held.core.kept_inputs + held.undelivered + held.inbox,
        "long_run_heap_growth_bytes": long.late_heap as f64 - long.early_heap as f64,
        "postgres": postgres,
        "measured": {
            "long_run_steps": sizes.long_run,
            "signals_piled": sizes.piled_signals,
            "signal_empty_inbox_us": inbox.empty_s * 1e6,
            "signal_piled_inbox_us": inbox.piled_s * 1e6,
            "signal_unlistened_history_steps": UNLISTENED_HISTORY,
            "signal_unlistened_short_history_us": unlistened.short_s * 1e6,
            "signal_unlistened_long_history_us": unlistened.long_s * 1e6,
            "decisions_awaited": AWAITING_DECISIONS,
            "decisions_settled_operations": sizes.waiting,
            "decisions_listed_bare_us": decisions.compacted_s[0] * 1e6,
            "decisions_listed_beside_settled_us": decisions.compacted_s[1] * 1e6,
            "decisions_listed_bare_fresh_us": decisions.fresh_s[0] * 1e6,
            "decisions_listed_beside_settled_fresh_us": decisions.fresh_s[1] * 1e6,
            "stream_chunks": sizes.stream_steps * CHUNKS_PER_STEP,
            "chunk_fresh_stream_us": stream.early_s * 1e6 / (STREAM_WINDOW * CHUNKS_PER_STEP) as f64,
            "chunk_long_stream_us": stream.late_s * 1e6 / (STREAM_WINDOW * CHUNKS_PER_STEP) as f64,
            "long_run_early_1k_steps_ms": long.early_s * 1e3,
            "long_run_late_1k_steps_ms": long.late_s * 1e3,
            "long_run_footprint": format!("{held:?}"),
            "long_run_heap_at_step_1k_bytes": long.early_heap,
            "long_run_heap_at_last_step_bytes": long.late_heap,
            "synced_put_us": put * 1e6,
            "store_commit_synced_us": commit_synced * 1e6,
            "store_commit_unsynced_us": commit_unsynced * 1e6,
            "step_us": step * 1e6,
            "agent_turn_us": agent.turn_s * 1e6,
            "agent_turns": AGENT_TURNS,
            "agent_journal_bytes": agent.journal_bytes,
            "agent_message_bytes": agent.message_bytes,
            "effect_step_us": effect * 1e6,
            "raw_synced_batches_records_per_s": raw_puts,
            "raw_same_rows_steps_per_s": raw_steps,
            "raw_same_rows_per_step": rows_written as f64 / total as f64,
            "waiting_workflows": sizes.waiting,
            "waiting_memtable_bytes_per_workflow": waiting.memtable_per_workflow,
            "steps_per_workflow_concurrent": sizes.steps_per_workflow,
            "rounds": sizes.rounds,
            "quick": args.quick,
            "seconds": started.elapsed().as_secs_f64(),
        },
        "machine": bench::machine(),
    });
    let mut figures = figures;
    // Set here: one more in the json! above passes its recursion limit.
    let rebuild_per_100k = waiting.rebuild_ms * 100_000.0 / sizes.waiting as f64;
    figures["redeploy_rebuild_ms_per_100k"] = json!(rebuild_per_100k);
    figures["measured"]["allocations_per_step"] = json!(step_allocations);
    figures["measured"]["allocations_per_effect_step"] = json!(effect_allocations);
    // The ratios take the median put; the mean says whether the disk's slow moments, which a
    // step's mean pays, would change them.
    figures["measured"]["synced_put_mean_us"] = json!(put_mean * 1e6);
    // The same ratios against the put's mean, the statistic a run of steps pays: what is left
    // of the effect's above 2.0 then is the runtime's, not the disk's spread.
    figures["measured"]["step_vs_synced_put_mean"] = json!(of(|r| r.step / r.put.mean));
    figures["measured"]["effect_vs_synced_put_mean"] = json!(of(|r| r.effect / r.put.mean));
    // Where a restart's time goes: what is not the worker's (the process's start, then the
    // store's open), so that the rest of `restart_to_first_step_ms` is.
    figures["measured"]["restart_process_start_ms"] = json!(wall(&starts));
    figures["measured"]["restart_store_open_ms"] = json!(wall(&opens));
    // The CPU time of every thread of the probe, up to its line: on two cores, a restart is
    // bound by it more than by its syncs.
    figures["measured"]["restart_cpu_ms"] = json!(cpu(&restarts));
    figures["measured"]["restart_store_open_cpu_ms"] = json!(cpu(&opens));
    let judged = bench::judge(&figures);
    figures["targets"] = bench::targets_json(&judged);
    print(&figures, &judged, args.json);
    let missed: Vec<&str> = judged.iter().filter(|j| !j.met()).map(|j| j.name).collect();
    if args.check && !missed.is_empty() {
        eprintln!("targets missed or not measured: {}", missed.join(", "));
        std::process::exit(1);
    }
    Ok(())
}

/// One workflow of `steps` sequential steps on a new store; prints the heap allocations per
/// step (the workflow's start and end included).
async fn step_profile(steps: u64, effects: bool) -> anyhow::Result<()> {
    let root = tempfile::tempdir()?;
    let worker = bench::worker(root.path()).await?;
    let before = allocations();
    let seconds = bench::seconds_per_step(&worker, effects, steps, "profile".into()).await?;
    let per_step = (allocations() - before) as f64 / steps as f64;
    worker.shutdown().await;
    println!("allocations per step: {per_step:.1}");
    println!("mean step: {:.1} µs", seconds * 1e6);
    Ok(())
}

async fn flat_profile(piled: u64, stream_steps: u64) -> anyhow::Result<()> {
    let root = tempfile::tempdir()?;
    let worker = bench::worker(&root.path().join("inbox")).await?;
    let inbox = bench::inbox_costs(&worker, piled, TICK_WINDOW).await?;
    let unlistened =
        bench::unlistened_signal_costs(&worker, UNLISTENED_HISTORY, UNLISTENED_SIGNALS).await?;
    worker.shutdown().await;
    let per_tick = |seconds: f64| seconds * 1e6;
    println!(
        "signal: {:.0} µs in front of an empty inbox, {:.0} µs with {piled} piled (x{:.2})",
        per_tick(inbox.empty_s),
        per_tick(inbox.piled_s),
        inbox.piled_s / inbox.empty_s
    );
    println!(
        "signal no wait listens for: {:.0} µs to a parked run without history, {:.0} µs to \
         one of {UNLISTENED_HISTORY} steps (x{:.2})",
        per_tick(unlistened.short_s),
        per_tick(unlistened.long_s),
        unlistened.long_s / unlistened.short_s
    );
    let worker = bench::worker(&root.path().join("stream")).await?;
    let stream = bench::stream_costs(
        &worker,
        stream_steps,
        STREAM_ROUNDS,
        STREAM_WINDOW,
        CHUNKS_PER_STEP,
    )
    .await?;
    worker.shutdown().await;
    let per_chunk = |seconds: f64| seconds * 1e6 / (STREAM_WINDOW * CHUNKS_PER_STEP) as f64;
    println!(
        "chunk: {:.1} µs in a new stream, {:.1} µs in one of at least {} chunks (x{:.2})",
        per_chunk(stream.early_s),
        per_chunk(stream.late_s),
        stream_steps * CHUNKS_PER_STEP,
        stream.late_s / stream.early_s
    );
    Ok(())
}

/// Steps of history of the workflow a restarted worker resumes.
const RESTART_HISTORY: u64 = 999;

/// From starting a new worker process on a store holding one workflow with a 999-step history
/// to that workflow's first new step (the process says when it took it).
async fn restart_probe(dir: &std::path::Path) -> anyhow::Result<Probe> {
    bench::due_after_history(dir, RESTART_HISTORY).await?;
    let expected = format!("stepped {RESTART_HISTORY}");
    probe("restart-probe", Some(dir), &expected)
}

/// The part of a restart that is not the worker's: from starting a new process on a store
/// like the restart's to the store opened, as a worker opens it.
async fn store_open_probe(dir: &std::path::Path) -> anyhow::Result<Probe> {
    bench::due_after_history(dir, RESTART_HISTORY).await?;
    probe("open-probe", Some(dir), "opened")
}

/// What a probe took, up to its line.
struct Probe {
    /// Milliseconds from its spawn.
    wall_ms: f64,
    /// Milliseconds its threads spent on a CPU, where the system tells (Linux).
    cpu_ms: Option<f64>,
}

/// Spawns this binary as `role` (on `data_dir`, if given) and times it to its first line,
/// which must say `expected`; the process is killed then.
fn probe(role: &str, data_dir: Option<&std::path::Path>, expected: &str) -> anyhow::Result<Probe> {
    use std::io::BufRead as _;
    let mut command = std::process::Command::new(std::env::current_exe()?);
    command.arg(role).stdout(std::process::Stdio::piped());
    if let Some(dir) = data_dir {
        command.arg("--data-dir").arg(dir);
    }
    let started = Instant::now();
    let mut child = command.spawn()?;
    let stdout = child.stdout.take().expect("piped");
    let mut lines = std::io::BufReader::new(stdout).lines();
    let said = lines.next().transpose()?;
    let wall_ms = started.elapsed().as_secs_f64() * 1e3;
    let cpu_ms = cpu_ms_of(child.id());
    let _ = child.kill();
    let _ = child.wait();
    anyhow::ensure!(said.as_deref() == Some(expected), "the probe said {said:?}");
    Ok(Probe { wall_ms, cpu_ms })
}

/// The milliseconds every thread of process `pid` has spent on a CPU so far: the first field
/// of each thread's `schedstat`, in nanoseconds. `None` where there is no such file.
fn cpu_ms_of(pid: u32) -> Option<f64> {
    let threads = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let on_cpu_ns = |thread: std::fs::DirEntry| -> Option<u64> {
        let stat = std::fs::read_to_string(thread.path().join("schedstat")).ok()?;
        stat.split_whitespace().next()?.parse().ok()
    };
    let total: u64 = threads.flatten().filter_map(on_cpu_ns).sum();
    Some(total as f64 / 1e6)
}

/// Writes `line` to standard output at once: a probe's word to the process timing it.
fn say(line: &str) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// One round of the step figures: the synced puts they are measured against, timed right
/// before them, then a run of steps and a run of effects.
struct StepRound {
    put: bench::SyncedPuts,
    step: f64,
    effect: f64,
    step_allocations: f64,
    effect_allocations: f64,
}

/// Each round's puts are timed right before its steps, and each ratio is taken within its
/// round: the host's speed drifts over a run, and a yardstick timed once, before everything
/// else, measured the steps against another machine than theirs.
async fn step_round(
    worker: &Worker,
    sizes: &Sizes,
    put_dir: &std::path::Path,
    round: usize,
) -> anyhow::Result<StepRound> {
    let put = bench::synced_puts(put_dir, WRITE_BYTES, sizes.puts)?;
    let before = allocations();
    let step =
        bench::seconds_per_step(worker, false, sizes.steps, format!("steps-{round}")).await?;
    let between = allocations();
    let effect_id = format!("effects-{round}");
    let effect = bench::seconds_per_step(worker, true, sizes.effect_steps, effect_id).await?;
    let after = allocations();
    Ok(StepRound {
        put,
        step,
        effect,
        step_allocations: (between - before) as f64 / sizes.steps as f64,
        effect_allocations: (after - between) as f64 / sizes.effect_steps as f64,
    })
}

/// The median time to replay a journal of `steps` steps, and how many entries it holds.
async fn replay_ms(
    dir: &std::path::Path,
    steps: u64,
    rounds: usize,
) -> anyhow::Result<(f64, usize)> {
    let journal = bench::long_journal(steps);
    import_workflow(dir, "long", &write_framed(&journal), None).await?;
    let data = DataDir::open(dir)?;
    let replayer = Replayer::new().register(steps_then_wait).register(noop);
    let mut times = Vec::new();
    let mut length = 0;
    for _ in 0..rounds {
        let started = Instant::now();
        let entries = data.journal("long")?;
        length = entries.len();
        let report = replayer.replay_journal(entries)?;
        times.push(started.elapsed().as_secs_f64() * 1e3);
        anyhow::ensure!(
            report.entries == length && !report.ended,
            "replayed {report:?}"
        );
    }
    Ok((median(times), length))
}

/// What `count` workflows waiting for a signal hold, and how long a new worker takes to
/// recover them.
struct Waiting {
    /// Resident bytes per workflow, RocksDB's memtables flushed before and after.
    rss_per_workflow: f64,
    /// Memtable bytes per workflow before that flush: RocksDB's write buffer, which a flush
    /// empties.
    memtable_per_workflow: f64,
    /// A restart on the same code: the parked workflows stay out of memory.
    recovery_ms: f64,
    /// A start on changed code: every parked workflow is rebuilt by replay and leaves memory
    /// again.
    rebuild_ms: f64,
}

/// Starts `count` workflows that wait for a signal and measures what they hold once out of
/// memory, then the time a new worker takes to start with them all parked, and the time one
/// hosting changed code takes to have every one of them replayed and out of memory again.
async fn wait_and_recover(dir: &std::path::Path, count: usize) -> anyhow::Result<Waiting> {
    let store = Arc::new(waymark_runtime::store::RocksStore::open(dir)?);
    let worker = bench::setup(Worker::builder().store(store.clone()))
        .build()
        .await?;
    bench::wait_until_idle(&worker, std::time::Duration::from_secs(10)).await?;
    let rocks = store.engine().inner();
    rocks.checkpoint_at_close()?;
    let before = bench::resident_bytes();
    bench::start_waiting(&worker, count, "waiting").await?;
    let memtable = rocks.memtable_bytes()?;
    rocks.checkpoint_at_close()?;
    let after = bench::resident_bytes();
    worker.shutdown().await;
    drop(store);
    let rss_per_workflow = after.saturating_sub(before) as f64 / count as f64;
    let memtable_per_workflow = memtable as f64 / count as f64;
    let started = Instant::now();
    let worker = bench::worker(dir).await?;
    bench::wait_until_idle(&worker, std::time::Duration::from_secs(600)).await?;
    let recovery_ms = started.elapsed().as_secs_f64() * 1e3;
    worker.shutdown().await;
    let started = Instant::now();
    let worker = bench::redeployed_worker(dir).await?;
    bench::wait_until_idle(&worker, std::time::Duration::from_secs(600)).await?;
    let rebuild_ms = started.elapsed().as_secs_f64() * 1e3;
    worker.shutdown().await;
    Ok(Waiting {
        rss_per_workflow,
        memtable_per_workflow,
        recovery_ms,
        rebuild_ms,
    })
}

/// The PostgreSQL figures, measured in a schema of their own that is dropped after.
async fn postgres_figures(url: &str, sizes: &Sizes) -> anyhow::Result<serde_json::Value> {
    let schema = Schema::new(url);
    let figures = measure_postgres(&schema, sizes).await;
    schema.drop_all().await?;
    figures
}

/// How long the workers' leases last while throughput and steps are measured.
const BENCH_LEASE: Duration = Duration::from_secs(30);
/// How long the killed worker's leases last: the takeover waits that long at least.
const TAKEOVER_LEASE: Duration = Duration::from_secs(2);

async fn measure_postgres(schema: &Schema, sizes: &Sizes) -> anyhow::Result<serde_json::Value> {
    let insert = pg::synced_insert_seconds(schema, WRITE_BYTES, sizes.puts).await?;
    let (worker, _) = pg::worker(schema.options(BENCH_LEASE)).await?;
    let mut step = Vec::new();
    for round in 0..sizes.rounds {
        let id = format!("steps-{round}");
        step.push(bench::seconds_per_step(&worker, false, sizes.steps, id).await?);
    }
    let unlistened =
        bench::unlistened_signal_costs(&worker, UNLISTENED_HISTORY, UNLISTENED_SIGNALS).await?;
    worker.shutdown().await;
    let step = median(step);
    let mut rates = Vec::new();
    for count in [1, 2, 4] {
        let connecting = (0..count).map(|_| pg::worker(schema.options(BENCH_LEASE)));
        let workers: Vec<Worker> = try_join_all(connecting)
            .await?
            .into_iter()
            .map(|(worker, _)| worker)
            .collect();
        rates.push(pg::steps_per_second(&workers, 1024, sizes.steps_per_workflow, 0).await?);
        for worker in workers {
            worker.shutdown().await;
        }
    }
    let (count, spawning) = (sizes.taken_over, schema.options(TAKEOVER_LEASE));
    let spawned = tokio::task::spawn_blocking({
        let (url, name) = (spawning.url.clone(), schema.name().to_owned());
        move || pg::spawn_holding_worker(&url, &name, count, TAKEOVER_LEASE)
    });
    let victim = spawned.await??;
    let (survivor, store) = pg::worker(schema.options(TAKEOVER_LEASE)).await?;
    let takeover = pg::take_over(victim, &survivor, &store, count).await?;
    survivor.shutdown().await;
    Ok(json!({
        "step_vs_synced_insert": step / insert,
        "steps_per_s_1024_workers_1": rates[0],
        "steps_per_s_1024_workers_2": rates[1],
        "steps_per_s_1024_workers_4": rates[2],
        "workers_4_vs_1": rates[2] / rates[0],
        "signal_unlistened_long_vs_short_history": unlistened.long_s / unlistened.short_s,
        "takeover_ms": takeover.total_ms,
        "takeover_after_first_claim_ms": takeover.after_first_claim_ms,
        "measured": {
            "synced_insert_us": insert * 1e6,
            "step_us": step * 1e6,
            "taken_over_workflows": count,
            "takeover_lease_ms": TAKEOVER_LEASE.as_millis() as u64,
            "steps_per_workflow_concurrent": sizes.steps_per_workflow,
            "signal_unlistened_history_steps": UNLISTENED_HISTORY,
            "signal_unlistened_short_history_us": unlistened.short_s * 1e6,
            "signal_unlistened_long_history_us": unlistened.long_s * 1e6,
        },
    }))
}

/// The worker the takeover kills: holds `count` waiting workflows, says so, and waits.
async fn wait_on_postgres(
    url: &str,
    schema: String,
    count: usize,
    lease_ms: u64,
) -> anyhow::Result<()> {
    let mut options = waymark::store::PgOptions::new(url);
    options.schema = Some(schema);
    options.lease = Duration::from_millis(lease_ms);
    let (worker, _store) = pg::worker(options).await?;
    pg::start_waiting(&worker, count).await?;
    println!("waiting");
    std::future::pending::<()>().await;
    Ok(())
}

/// The turns of the agent whose journal is weighed against its messages.
const AGENT_TURNS: usize = 50;

fn print(figures: &serde_json::Value, judged: &[bench::Judged], as_json: bool) {
    if as_json {
        println!("{figures}");
        return;
    }
    let untargeted = [
        "steps_per_s_1",
        "steps_per_s_64",
        "steps_per_s_1024",
        "concurrent_vs_synced_256_byte_puts",
        "replay_10k_ms",
        "recovery_10k_ms",
        "redeploy_rebuild_ms_per_100k",
        "agent_turn_vs_step",
        "agent_50_turns_journal_vs_messages",
    ];
    for name in untargeted {
        let value = figures[name].as_f64().unwrap_or(f64::NAN);
        println!("{name:<36} {value:>14.3}");
    }
    for judged in judged {
        let verdict = if judged.met() { "met" } else { "MISSED" };
        let value = judged.value.unwrap_or(f64::NAN);
        println!(
            "{:<36} {value:>14.3}   target {:<14} {verdict}",
            judged.name,
            judged.bound.to_string()
        );
    }
    if !figures["postgres"].is_null() {
        println!("postgres: {}", figures["postgres"]);
    }
    println!("measured: {}", figures["measured"]);
    println!("machine: {}", figures["machine"]);
}
