//! The worker's reads of the store block on disk, so none of them runs on an async thread:
//! loading a workflow for replay, the operation log, the inbox, a finished run's outcome,
//! recovery, the HTTP API's reads.

use std::time::Duration;

use waymark::inspect::Entry;
use waymark::prelude::*;
use waymark::{ManualClock, Worker};
use waymark_tests::signalled::go_then_notes;
use waymark_tests::store::WatchedStore;
use waymark_tests::with_id;

#[activity(effect)]
async fn book(cx: ActivityContext, #[key] order_id: String) -> Result<String, ActivityError> {
    Ok(waymark_tests::apply_under_key(&cx, &order_id))
}

#[activity]
async fn load(order_id: String) -> Result<String, ActivityError> {
    Ok(order_id)
}

/// Every kind of read the worker makes: the operation log (an effect), the inbox (a signal
/// sent before the wait, one after), a rebuild of an evicted workflow, its recorded outcome.
#[workflow]
async fn booking(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    let order = ctx.activity(load, order_id).await?;
    let early: String = ctx.signal("early").await?;
    let reference = ctx.effect(book, order.clone()).await?;
    ctx.sleep(Duration::from_secs(3600)).await;
    let go: String = ctx.signal("go").await?;
    Ok(format!("{order} {early} {reference} {go}"))
}

/// Like [`booking`] without the wait for a signal before its effect. A run waiting only for a
/// signal leaves memory at once, and the signal rebuilds it: were the signal sent after the
/// start, whether the run read its journal back would hang on which came first.
#[workflow]
async fn booking_then_timer(
    ctx: WorkflowContext,
    order_id: String,
) -> Result<String, WorkflowError> {
    let order = ctx.activity(load, order_id).await?;
    let reference = ctx.effect(book, order.clone()).await?;
    ctx.sleep(Duration::from_secs(3600)).await;
    let go: String = ctx.signal("go").await?;
    Ok(format!("{order} {reference} {go}"))
}

/// Waits for two signals named `go`, whatever else its inbox holds.
#[workflow]
async fn two_goes(ctx: WorkflowContext, _input: ()) -> Result<Vec<String>, WorkflowError> {
    let first: String = ctx.signal("go").await?;
    let second: String = ctx.signal("go").await?;
    Ok(vec![first, second])
}

/// Naps an hour, then waits for `go`.
#[workflow]
async fn nap_then_go(ctx: WorkflowContext, _input: ()) -> Result<String, WorkflowError> {
    ctx.sleep(Duration::from_secs(3600)).await;
    ctx.signal("go").await
}

async fn watched_worker(store: std::sync::Arc<WatchedStore>, clock: ManualClock) -> Worker {
    Worker::builder()
        .store(store)
        .clock(clock)
        .evict_after(Duration::from_secs(1))
        .register(booking)
        .register(booking_then_timer)
        .register(two_goes)
        .register(go_then_notes)
        .register(nap_then_go)
        .register(book)
        .register(load)
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_reads_the_store_only_off_the_async_threads() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::default();
    let store = WatchedStore::open(dir.path()).unwrap();
    let worker = watched_worker(store.clone(), clock.clone()).await;
    let wf = "reads-off-thread";
    let run = worker
        .start_with(booking, "ORD-1".into(), with_id(wf))
        .await
        .unwrap();
    worker.signal(wf, "early", "e-1", &"soon").await.unwrap();
    // Waiting on the hour-long timer, the workflow is evicted; the timer rebuilds it.
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        clock.advance(Duration::from_secs(60));
    }
    worker.signal(wf, "go", "g-1", &"now").await.unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(20), run.result()).await;
    assert_eq!(outcome.unwrap().unwrap(), "ORD-1 soon ref-1 now");
    // The outcome of an ended run is read from the store.
    let again = worker.handle(booking, wf).result().await.unwrap();
    assert_eq!(again, "ORD-1 soon ref-1 now");
    worker.shutdown().await;
    let running = store.take_reads_on_async_threads();
    drop(store);
    // Recovery reads the store too.
    let store = WatchedStore::open(dir.path()).unwrap();
    watched_worker(store.clone(), clock).await.shutdown().await;
    let recovering = store.take_reads_on_async_threads();
    assert_eq!((running, recovering), (vec![], vec![]));
}

/// A run waiting for a signal leaves memory, and each signal rebuilds it. The rebuild reads the
/// signals of the name the run waits for, not the whole inbox: fifty unread signals of another
/// name are never read again, however often the run is rebuilt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuilt_run_reads_only_the_signals_of_the_names_it_waits_for() {
    const PILE: usize = 50;
    let dir = tempfile::tempdir().unwrap();
    let store = WatchedStore::open(dir.path()).unwrap();
    let worker = watched_worker(store.clone(), ManualClock::default()).await;
    let wf = "reads-inbox-by-name";
    let run = worker.start_with(two_goes, (), with_id(wf)).await.unwrap();
    for i in 0..PILE {
        let id = format!("note-{i}");
        worker.signal(wf, "note", &id, &"fyi").await.unwrap();
    }
    let evicted = || worker.resident_workflows() == 0;
    assert!(waymark_tests::eventually(400, evicted).await);
    store.take_inbox_rows();
    worker.signal(wf, "go", "g-1", &"first").await.unwrap();
    let delivered = || worker.journal(wf).unwrap_or_default().len() >= 3;
    assert!(waymark_tests::eventually(400, delivered).await);
    assert!(waymark_tests::eventually(400, evicted).await);
    worker.signal(wf, "go", "g-2", &"second").await.unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(20), run.result()).await;
    assert_eq!(outcome.unwrap().unwrap(), ["first", "second"]);
    let rows = store.take_inbox_rows();
    assert!(!rows.is_empty(), "the rebuilds read the inbox");
    assert!(rows.iter().all(|&read| read < PILE), "{rows:?}");
    worker.shutdown().await;
}

/// A parked run is not rebuilt for a signal that none of its waits listens for: the signal
/// waits in the inbox, the mark stays (a restart leaves the run out of memory too), and the
/// run reads it once a wait listens for its name. The worker reads the mark the writer just
/// read from the store's memory, with no round trip to the blocking pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_no_wait_listens_for_leaves_a_parked_run_out_of_memory() {
    const NOTES: u32 = 5;
    let dir = tempfile::tempdir().unwrap();
    let wf = "reads-unlistened-signal";
    let store = WatchedStore::open(dir.path()).unwrap();
    let worker = watched_worker(store.clone(), ManualClock::default()).await;
    worker
        .start_with(go_then_notes, NOTES, with_id(wf))
        .await
        .unwrap();
    let evicted = || worker.resident_workflows() == 0;
    assert!(waymark_tests::eventually(400, evicted).await);
    for i in 0..NOTES {
        let id = format!("note-{i}");
        worker.signal(wf, "note", &id, &id).await.unwrap();
    }
    assert_eq!(worker.resident_workflows(), 0);
    assert_eq!(store.mark_reads(), 0, "the mark was read from memory");
    worker.shutdown().await;
    assert_eq!(store.journal_reads(), 0, "no note rebuilt the run");
    drop(store);

    let store = WatchedStore::open(dir.path()).unwrap();
    let worker = watched_worker(store.clone(), ManualClock::default()).await;
    assert_eq!(store.journal_reads(), 0, "the mark outlived the notes");
    worker.signal(wf, "go", "g-1", &"go").await.unwrap();
    let run = worker.handle(go_then_notes, wf);
    let outcome = tokio::time::timeout(Duration::from_secs(20), run.result()).await;
    let mut expected = vec!["go".to_owned()];
    expected.extend((0..NOTES).map(|i| format!("note-{i}")));
    assert_eq!(outcome.unwrap().unwrap(), expected);
    assert_eq!(store.journal_reads(), 1, "one rebuild, for `go`");
    worker.shutdown().await;
}

/// A signal that comes while a parked run waits only for a timer is kept for later: the run is
/// not rebuilt for it, and once the timer has rebuilt the run, its wait for the name takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_kept_while_a_run_naps_is_taken_once_it_waits_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::default();
    let store = WatchedStore::open(dir.path()).unwrap();
    let worker = watched_worker(store.clone(), clock.clone()).await;
    let wf = "reads-signal-before-its-wait";
    let run = worker
        .start_with(nap_then_go, (), with_id(wf))
        .await
        .unwrap();
    let napping = || {
        let journal = worker.journal(wf).unwrap_or_default();
        journal
            .iter()
            .any(|e| matches!(e, Entry::TimerStarted { .. }))
    };
    assert!(waymark_tests::eventually(400, napping).await);
    let evicted = || worker.resident_workflows() == 0;
    assert!(waymark_tests::eventually(400, evicted).await);
    // The test's own looks at the journal read it too.
    let before = store.journal_reads();
    let rebuilds = || store.journal_reads() - before;
    worker.signal(wf, "go", "g-1", &"early").await.unwrap();
    assert_eq!(worker.resident_workflows(), 0, "no wait takes `go` yet");
    assert_eq!(rebuilds(), 0);
    let outcome = run.result();
    tokio::pin!(outcome);
    for _ in 0..400 {
        clock.advance(Duration::from_secs(60));
        let tick = tokio::time::sleep(Duration::from_millis(10));
        tokio::select! {
            answer = &mut outcome => {
                assert_eq!(answer.unwrap(), "early");
                assert_eq!(rebuilds(), 1, "one rebuild, by the timer");
                return worker.shutdown().await;
            }
            () = tick => {}
        }
    }
    panic!("the run never took the signal");
}

/// A new effect's look-up of its key in the operation log is answered from the store's memory
/// (the key is new, and the table's blocks are cached): no round trip to the blocking pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_effect_finds_its_key_absent_without_a_blocking_read() {
    let dir = tempfile::tempdir().unwrap();
    let store = WatchedStore::open(dir.path()).unwrap();
    let worker = watched_worker(store.clone(), ManualClock::default()).await;
    let wf = "reads-new-effect";
    worker
        .start_with(booking_then_timer, "ORD-3".into(), with_id(wf))
        .await
        .unwrap();
    // The sleep after the effect: the effect has committed.
    let sleeping = || {
        let journal = worker.journal(wf).unwrap_or_default();
        journal
            .iter()
            .any(|e| matches!(e, Entry::TimerStarted { .. }))
    };
    assert!(waymark_tests::eventually(400, sleeping).await);
    assert_eq!(store.operation_reads(), 0);
    worker.shutdown().await;
}

/// A workflow started here runs from what its start wrote: its executor reads no journal
/// back, so its first step waits for no read on the blocking pool. Rebuilt after it left
/// memory, it reads its journal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_started_workflow_reads_its_journal_only_when_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::default();
    let store = WatchedStore::open(dir.path()).unwrap();
    let worker = watched_worker(store.clone(), clock.clone()).await;
    let wf = "reads-fresh-start";
    let run = worker
        .start_with(booking_then_timer, "ORD-4".into(), with_id(wf))
        .await
        .unwrap();
    let sleeping = || {
        // A page, which the count of whole-journal reads leaves out.
        let journal = waymark::store::Store::journal_page(&*store, wf, 0, 64).unwrap_or_default();
        journal
            .iter()
            .any(|e| matches!(e, Entry::TimerStarted { .. }))
    };
    assert!(waymark_tests::eventually(400, sleeping).await);
    assert_eq!(
        store.journal_reads(),
        0,
        "a run started here read its journal"
    );
    // Waiting on the hour-long timer, the workflow is evicted; the timer rebuilds it.
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        clock.advance(Duration::from_secs(60));
    }
    worker.signal(wf, "go", "g-1", &"now").await.unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(20), run.result()).await;
    assert_eq!(outcome.unwrap().unwrap(), "ORD-4 ref-1 now");
    assert!(store.journal_reads() >= 1, "the rebuild read no journal");
    worker.shutdown().await;
}

#[workflow]
async fn two_answers(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    let ask = |what: &str| {
        Llm::new("writer")
            .prompt("customer_eta", "v2")
            .user(format!("{what} {order_id}"))
            .streamed()
    };
    let first = ctx.llm(ask("Explain")).await?.text;
    ctx.sleep(Duration::from_secs(3600)).await;
    let second = ctx.llm(ask("Apologise for")).await?.text;
    Ok(format!("{first} / {second}"))
}

/// A rebuilt run checks its next streamed step against what was written since it was loaded,
/// not against the whole stream of its history: the check's cost does not grow with the run.
#[tokio::test]
async fn a_rebuilt_run_reads_only_the_stream_written_since_its_load() {
    use waymark::llm::ScriptedProvider;
    use waymark::telemetry::names;
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::default();
    let store = WatchedStore::open(dir.path()).unwrap();
    let provider = ScriptedProvider::default()
        .reply("It left the depot late.")
        .reply("We are sorry for the wait.");
    let worker = Worker::builder()
        .store(store.clone())
        .clock(clock.clone())
        .evict_after(Duration::from_secs(1))
        .llm(std::sync::Arc::new(provider))
        .register(two_answers)
        .build()
        .await
        .unwrap();
    let wf = "reads-stream-after-load";
    let run = worker
        .start_with(two_answers, "ORD-7".into(), with_id(wf))
        .await
        .unwrap();
    let evicted = || worker.resident_workflows() == 0;
    assert!(waymark_tests::eventually(400, evicted).await);
    let written = worker.stream(wf, 0).unwrap().last().map(|e| e.seq).unwrap();
    store.take_stream_reads();
    clock.advance(Duration::from_secs(3601));
    let outcome = tokio::time::timeout(Duration::from_secs(20), run.result()).await;
    let expected = "It left the depot late. / We are sorry for the wait.";
    assert_eq!(outcome.unwrap().unwrap(), expected);
    let reads = store.take_stream_reads();
    assert!(!reads.is_empty(), "the streamed step was checked");
    assert!(
        reads.iter().all(|after| *after >= written),
        "{reads:?} read history before {written}"
    );
    let diverged = worker
        .telemetry()
        .snapshot()
        .value(names::STREAM_DIVERGENCE, &[]);
    assert_eq!(diverged, 0.0, "stream == committed");
}

/// A shutdown returns once every read the worker started is done: a read still running on the
/// blocking pool holds the store, and the next worker on the same directory must find it
/// closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_waits_for_the_reads_it_started() {
    let dir = tempfile::tempdir().unwrap();
    let store = WatchedStore::open(dir.path()).unwrap();
    let worker = watched_worker(store.clone(), ManualClock::default()).await;
    let wf = "reads-at-shutdown";
    worker
        .start_with(booking, "ORD-9".into(), with_id(wf))
        .await
        .unwrap();
    let evicted = || worker.resident_workflows() == 0;
    assert!(waymark_tests::eventually(400, evicted).await);
    store.delay_reads(Duration::from_millis(500));
    // Rebuilds the workflow: its load is a slow read.
    worker.signal(wf, "early", "e-1", &"soon").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    worker.shutdown().await;
    assert_eq!(
        std::sync::Arc::strong_count(&store),
        1,
        "a read still holds the store"
    );
}

/// An agent that calls `load` once, then answers.
#[workflow]
async fn agent_reads(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    let agent = Agent::new("planner").tool(load);
    let answer = ctx.agent(&agent, vec![Message::user(order_id)]).await?;
    Ok(answer.text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_call_reads_its_transcript_off_the_async_threads() {
    let dir = tempfile::tempdir().unwrap();
    let store = WatchedStore::open(dir.path()).unwrap();
    let scripted = waymark::llm::ScriptedProvider::default()
        .tool_calls(&[("load", r#"{"order_id":"ORD-1"}"#)])
        .reply("loaded");
    let worker = Worker::builder()
        .store(store.clone())
        .register(agent_reads)
        .register(load)
        .llm(scripted)
        .build()
        .await
        .unwrap();
    let run = worker
        .start_with(agent_reads, "ORD-1".into(), with_id("agent-reads"))
        .await
        .unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(20), run.result()).await;
    assert_eq!(outcome.unwrap().unwrap(), "loaded");
    worker.shutdown().await;
    assert_eq!(store.take_reads_on_async_threads(), Vec::<&str>::new());
}

#[workflow]
async fn waits_for_go(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    let go: String = ctx.signal("go").await?;
    Ok(format!("{order_id} {go}"))
}

/// A worker on `store` with `count` runs of `waits_for_go` started and waiting for their
/// signal. No sweep of the operation log reads the store meanwhile.
async fn runs_waiting_for_go(
    store: &std::sync::Arc<WatchedStore>,
    prefix: &str,
    count: usize,
) -> (Worker, Vec<waymark::RunHandle<String>>) {
    let worker = Worker::builder()
        .store(store.clone())
        .sweep_every(Duration::from_secs(3600))
        .register(waits_for_go)
        .build()
        .await
        .unwrap();
    let mut runs = Vec::new();
    for n in 0..count {
        let id = format!("{prefix}-{n}");
        let run = worker.start_with(waits_for_go, format!("ORD-{n}"), with_id(&id));
        runs.push(run.await.unwrap());
    }
    let all_waiting = || {
        runs.iter().all(|run| {
            let record = worker.workflow(run.id()).ok().flatten();
            record.is_some_and(|r| r.status == waymark::store::WorkflowStatus::AwaitingSignal)
        })
    };
    assert!(waymark_tests::eventually(400, all_waiting).await);
    (worker, runs)
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get)
}

/// Callers asking at once for the outcomes of as many runs read their records in groups, at
/// most one group a core at a time: a thousand callers must not have the blocking pool start a
/// thread for each of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_waiting_at_once_read_in_groups() {
    // Many more callers than cores, so that reads made apart from one another would overlap
    // beyond the cores on any machine.
    let callers = 4 * cores() + 16;
    let dir = tempfile::tempdir().unwrap();
    let store = WatchedStore::open(dir.path()).unwrap();
    let (worker, runs) = runs_waiting_for_go(&store, "reads-grouped", callers).await;
    // Slow reads: reads made apart from one another would now overlap.
    store.delay_reads(Duration::from_millis(10));
    store.take_most_reads_at_once();
    let asked = store.record_reads();
    let mut waiting = Vec::new();
    for run in &runs {
        let run = run.clone();
        waiting.push(tokio::spawn(async move { run.result().await }));
    }
    let all_read = || store.record_reads() >= asked + callers;
    assert!(waymark_tests::eventually(2_000, all_read).await);
    let most = store.take_most_reads_at_once();
    assert!(most <= cores(), "{most} reads at once on {} cores", cores());
    store.delay_reads(Duration::ZERO);
    for run in &runs {
        worker.signal(run.id(), "go", "go-1", &"now").await.unwrap();
    }
    for (n, answer) in waiting.into_iter().enumerate() {
        let outcome = tokio::time::timeout(Duration::from_secs(20), answer).await;
        assert_eq!(outcome.unwrap().unwrap().unwrap(), format!("ORD-{n} now"));
    }
    worker.shutdown().await;
}

/// A caller whose outcome read still waited for its group when the worker shut down hears the
/// shutdown, as the callers whose reads were made do, not that the store is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_whose_read_waited_for_a_group_at_shutdown_hears_the_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let store = WatchedStore::open(dir.path()).unwrap();
    let (worker, runs) = runs_waiting_for_go(&store, "reads-at-shutdown", cores() + 1).await;
    // One slow group a core, each of one caller's read; the last caller's read waits.
    store.delay_reads(Duration::from_millis(300));
    let mut waiting = Vec::new();
    for run in &runs {
        let run = run.clone();
        waiting.push(tokio::spawn(async move { run.result().await }));
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    worker.shutdown().await;
    for answer in waiting {
        let outcome = tokio::time::timeout(Duration::from_secs(20), answer).await;
        let error = outcome.unwrap().unwrap().unwrap_err();
        assert!(matches!(error, RunError::ShutDown), "{error}");
    }
}
