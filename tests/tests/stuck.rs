//! Runs that cannot go on (code that no longer matches the journal, a workflow this worker does
//! not host, a journal that does not add up) are stuck, visibly and durably: a status with a
//! code, a seq and a message, a gauge, and a `result()` that says the run has not ended. They
//! resume when matching code is deployed; other workflows are not affected.

use std::time::Duration;

use waymark::inspect::{Entry, StopCode, WorkflowStatus};
use waymark::operations::{OperationStatus, OperatorDecision};
use waymark::prelude::*;
use waymark::signals::SignalOutcome;
use waymark::telemetry::names;
use waymark::testing::TestEnv;
use waymark::{DeleteError, ResolveError, RunError, WorkerBuilder};
use waymark_tests::unanswered::{notice, unanswered};
use waymark_tests::{advance_to_next_sweep, awaiting_decision, eventually, status_once, with_id};

#[activity]
async fn step(label: String) -> Result<String, ActivityError> {
    Ok(label)
}

#[workflow(name = "evolving")]
async fn evolving_v1(ctx: WorkflowContext, _input: ()) -> Result<String, WorkflowError> {
    let first = ctx.activity(step, "one".into()).await?;
    let go: String = ctx.signal("go").await?;
    Ok(format!("{first} {go}"))
}

/// The same workflow with its first step changed, without a patch.
#[workflow(name = "evolving")]
async fn evolving_v2(ctx: WorkflowContext, _input: ()) -> Result<String, WorkflowError> {
    let first = ctx.activity(step, "uno".into()).await?;
    let go: String = ctx.signal("go").await?;
    Ok(format!("{first} {go}"))
}

fn v1(b: WorkerBuilder) -> WorkerBuilder {
    b.register(evolving_v1).register(step)
}

fn v2(b: WorkerBuilder) -> WorkerBuilder {
    b.register(evolving_v2).register(step)
}

async fn waiting_for_go(env: &TestEnv, wf: &str) {
    env.worker()
        .start_with(evolving_v1, (), with_id(wf))
        .await
        .unwrap();
    let waits = |e: &Entry| matches!(e, Entry::SignalAwaitedAt { .. });
    assert!(eventually(400, || journal_has(env, wf, waits)).await);
}

fn journal_has(env: &TestEnv, wf: &str, wanted: impl Fn(&Entry) -> bool) -> bool {
    let journal = env.worker().journal(wf).unwrap_or_default();
    journal.iter().any(wanted)
}

fn is_stuck(env: &TestEnv, wf: &str) -> bool {
    let status = env.worker().workflow_status(wf).unwrap();
    status == Some(WorkflowStatus::Stuck)
}

#[tokio::test]
async fn a_diverged_run_is_stuck_until_matching_code_is_deployed() {
    let wf = "stuck-divergence";
    let mut env = TestEnv::start(v1).await.unwrap();
    waiting_for_go(&env, wf).await;
    env.boot_with(v2).await.unwrap();
    assert!(eventually(400, || is_stuck(&env, wf)).await);
    let record = env.worker().workflow(wf).unwrap().unwrap();
    let stop = record.stop.expect("the record says why");
    assert_eq!(stop.code, StopCode::NonDeterminism);
    assert_eq!(stop.seq, Some(0));
    assert!(
        stop.message.contains("non-determinism at seq 0"),
        "{stop:?}"
    );
    // The gauge follows the record (the worker counts the run once the record is written).
    let counted = || env.metrics().value(names::WORKFLOWS_STUCK, &[]) == 1.0;
    assert!(eventually(400, counted).await);

    // The caller hears that the run has not ended, not an outcome.
    let run = env.worker().handle(evolving_v2, wf);
    let answer = tokio::time::timeout(Duration::from_secs(10), run.result()).await;
    let error = answer.expect("answered").unwrap_err();
    let RunError::Stuck(detail) = &error else {
        panic!("expected Stuck, got {error:?}");
    };
    assert_eq!(detail.stop.code, StopCode::NonDeterminism);
    assert!(error.to_string().contains("has not ended"), "{error}");

    // Events do not replay it again and again: the next attempt waits for its backoff.
    let loads = || {
        env.metrics()
            .value(names::WORKFLOW_LOADS, &[("wake", "event")])
    };
    let before = loads();
    for i in 0..5 {
        let id = format!("early-{i}");
        env.worker().signal(wf, "noise", &id, &i).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(loads() - before <= 1.0, "{} rebuilds", loads() - before);

    // Matching code: the run resumes from where it was.
    env.boot_with(v1).await.unwrap();
    assert!(eventually(400, || !is_stuck(&env, wf)).await);
    let record = env.worker().workflow(wf).unwrap().unwrap();
    assert_eq!(record.stop, None);
    env.worker().signal(wf, "go", "go-1", &"now").await.unwrap();
    let run = env.worker().handle(evolving_v1, wf);
    assert_eq!(run.result().await.unwrap(), "one now");
    assert_eq!(env.metrics().value(names::WORKFLOWS_STUCK, &[]), 0.0);
}

#[tokio::test]
async fn a_workflow_this_worker_does_not_host_is_stuck_and_listed() {
    let wf = "stuck-unknown-name";
    let mut env = TestEnv::start(v1).await.unwrap();
    waiting_for_go(&env, wf).await;
    env.boot_with(|b| b.register(step)).await.unwrap();
    assert!(eventually(400, || is_stuck(&env, wf)).await);
    // Listed once the stop is recorded, like the gauge.
    let listed = || {
        env.worker()
            .recovery_errors()
            .into_iter()
            .find(|(id, _)| id == wf)
    };
    assert!(
        eventually(400, || listed().is_some()).await,
        "recovery lists it"
    );
    let (_, error) = listed().unwrap();
    assert!(
        error.to_string().contains("`evolving` is not registered"),
        "{error}"
    );
    let stop = env.worker().workflow(wf).unwrap().unwrap().stop.unwrap();
    assert_eq!(stop.code, StopCode::UnknownWorkflow);
}

#[activity(max_attempts = 5, initial_backoff_ms = 3_600_000)]
async fn flaky(label: String) -> Result<String, ActivityError> {
    let _ = label;
    Err(ActivityError::retriable("503"))
}

#[workflow]
async fn echo(ctx: WorkflowContext, label: String) -> Result<String, WorkflowError> {
    Ok(ctx.activity(step, label).await?)
}

#[workflow]
async fn retrying(ctx: WorkflowContext, label: String) -> Result<String, WorkflowError> {
    Ok(ctx.activity(flaky, label).await?)
}

/// A stored attempt number at the top of its range: the journal cannot go on, which is an error
/// for that workflow, never a panic that takes other workflows (or the store's writer) along.
#[tokio::test]
async fn an_imported_journal_at_the_attempt_limit_is_stuck_and_others_run_on() {
    let mut env = TestEnv::start(|b| {
        b.register(retrying)
            .register(flaky)
            .register(step)
            .register(echo)
    })
    .await
    .unwrap();
    let wf = "stuck-source";
    env.worker()
        .start_with(retrying, "x".into(), with_id(wf))
        .await
        .unwrap();
    let failed = |e: &Entry| matches!(e, Entry::ActivityAttemptFailed { .. });
    assert!(eventually(400, || journal_has(&env, wf, failed)).await);
    env.stop().await;
    if waymark_tests::beneath_rocksdb_only(&env) {
        return;
    }
    let mut journal = waymark::inspect::DataDir::open(env.data_dir())
        .unwrap()
        .journal(wf)
        .unwrap();
    for entry in &mut journal {
        if let Entry::ActivityAttemptFailed { attempt, .. } = entry {
            *attempt = u32::MAX;
        }
    }
    let export = waymark::inspect::write_framed(&journal);
    let too_long = "x".repeat(600);
    let refused = waymark::inspect::import_workflow(env.data_dir(), &too_long, &export, None).await;
    let refused = refused.unwrap_err().to_string();
    assert_eq!(refused, "workflow id must be 1..=512 bytes, got 600");
    let imported = "stuck-at-u32-max";
    waymark::inspect::import_workflow(env.data_dir(), imported, &export, None)
        .await
        .unwrap();
    env.boot().await.unwrap();

    assert!(eventually(400, || is_stuck(&env, imported)).await);
    let stop = env
        .worker()
        .workflow(imported)
        .unwrap()
        .unwrap()
        .stop
        .unwrap();
    assert_eq!(stop.code, StopCode::InconsistentJournal);
    assert!(stop.message.contains("attempt"), "{stop:?}");
    // Everything else goes on: a new workflow runs to its end on the same worker.
    let other = env
        .worker()
        .start_with(echo, "y".into(), with_id("after-the-stuck-one"))
        .await
        .unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), other.result()).await;
    assert_eq!(answer.expect("the other workflow runs").unwrap(), "y");
    // The one way out of a journal that does not add up: cancelling it.
    env.worker()
        .cancel(imported, "journal damaged")
        .await
        .unwrap();
    let status = env.worker().workflow(imported).unwrap().unwrap().status;
    assert_eq!(status, WorkflowStatus::Failed);
}

/// Whether `napper` panics when polled: a condition of the environment that passes.
static NAPPER_PANICS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

#[workflow]
async fn napper(ctx: WorkflowContext, label: String) -> Result<String, WorkflowError> {
    assert!(
        !NAPPER_PANICS.load(std::sync::atomic::Ordering::SeqCst),
        "the environment is not ready"
    );
    let label = ctx.activity(step, label).await?;
    ctx.sleep(Duration::from_secs(3600)).await;
    Ok(label)
}

/// A stop that does not repeat ends by itself: the held run is rebuilt when its pause ends, and
/// that rebuild sees the timer that fell due while it was stuck (the timer's own event came
/// while the run could not take it, and nothing else would bring the run back before a restart).
#[tokio::test]
async fn a_run_stuck_on_a_passing_condition_resumes_and_takes_its_due_timer() {
    use std::sync::atomic::Ordering;
    let env = TestEnv::start(|b| b.register(napper).register(step))
        .await
        .unwrap();
    let wf = "stuck-napper";
    env.worker()
        .start_with(napper, "z".into(), with_id(wf))
        .await
        .unwrap();
    assert!(env.wait_for_timer(wf, Duration::from_secs(10)).await);
    assert!(eventually(400, || env.worker().resident_workflows() == 0).await);
    NAPPER_PANICS.store(true, Ordering::SeqCst);
    env.advance(Duration::from_secs(3601)).await;
    assert!(eventually(400, || is_stuck(&env, wf)).await);
    let counted = || env.metrics().value(names::WORKFLOWS_STUCK, &[]) == 1.0;
    assert!(eventually(400, counted).await);
    NAPPER_PANICS.store(false, Ordering::SeqCst);

    let completed = || env.worker().workflow_status(wf).unwrap() == Some(WorkflowStatus::Completed);
    assert!(
        eventually(1_000, completed).await,
        "the held run never resumed"
    );
    let answer = env.worker().handle(napper, wf).result().await;
    assert_eq!(answer.unwrap(), "z");
    assert_eq!(env.metrics().value(names::WORKFLOWS_STUCK, &[]), 0.0);
}

/// Whether `fragile` panics when polled.
static FRAGILE_PANICS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

#[workflow]
async fn fragile(ctx: WorkflowContext, label: String) -> Result<String, WorkflowError> {
    assert!(
        !FRAGILE_PANICS.load(std::sync::atomic::Ordering::SeqCst),
        "the environment is not ready"
    );
    let label = ctx.activity(step, label).await?;
    let _poke: String = ctx.signal("poke").await?;
    Ok(label)
}

/// A cancellation written while the worker records a run as stuck wins: the stuck write
/// conflicts, and the caller hears the cancellation, not that the run is stuck.
#[tokio::test]
async fn a_cancel_while_the_stop_is_recorded_ends_the_run() {
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().unwrap();
    let store = waymark_tests::store::WatchedStore::open(dir.path()).unwrap();
    let worker = waymark::Worker::builder()
        .store(store.clone())
        .clock(waymark::ManualClock::default())
        .evict_after(Duration::from_secs(1))
        .register(fragile)
        .register(step)
        .build()
        .await
        .unwrap();
    let wf = "stuck-then-cancelled";
    let run = worker
        .start_with(fragile, "c".into(), with_id(wf))
        .await
        .unwrap();
    let waits = |w: &waymark::Worker| {
        let journal = w.journal(wf).unwrap_or_default();
        journal.iter().any(|e| {
            matches!(
                e,
                Entry::SignalAwaited { .. } | Entry::SignalAwaitedAt { .. }
            )
        })
    };
    assert!(eventually(400, || waits(&worker)).await);
    assert!(eventually(400, || worker.resident_workflows() == 0).await);
    FRAGILE_PANICS.store(true, Ordering::SeqCst);
    let held = store.hold_next_stuck_write();
    worker.signal(wf, "poke", "p-1", &"rebuild").await.unwrap();
    held.reached().await;
    worker.cancel(wf, "no longer wanted").await.unwrap();
    held.release();
    FRAGILE_PANICS.store(false, Ordering::SeqCst);

    let status = || worker.workflow_status(wf).unwrap();
    assert_eq!(status(), Some(WorkflowStatus::Failed));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let error = run.result().await.unwrap_err();
    assert!(
        matches!(error, RunError::Failed(ref f) if f.message == "no longer wanted"),
        "{error:?}"
    );
    let stuck = || {
        let metrics = worker.telemetry().snapshot();
        metrics.value(names::WORKFLOWS_STUCK, &[])
    };
    assert!(
        eventually(400, || stuck() == 0.0).await,
        "{} stuck",
        stuck()
    );
    assert_eq!(status(), Some(WorkflowStatus::Failed));
}

/// A record counting more journal entries than its journal holds (rows lost) is a corrupt
/// record: the run is not replayed from the wrong point.
#[tokio::test]
async fn a_record_counting_entries_its_journal_lacks_is_corrupt() {
    let mut env = TestEnv::start(v1).await.unwrap();
    let wf = "stuck-record-length";
    waiting_for_go(&env, wf).await;
    env.stop().await;
    if waymark_tests::beneath_rocksdb_only(&env) {
        return;
    }
    {
        use waymark::store::Store;
        let store = waymark::store::RocksStore::open(env.data_dir()).unwrap();
        let mut record = store.workflow(wf).unwrap().unwrap();
        record.journal_len += 5;
        let bytes = waymark::store::encode_record(&record);
        let key = waymark::store::keys::id_key(wf);
        store
            .overwrite_raw(waymark::store::Table::Workflows, &key, &bytes)
            .unwrap();
    }
    env.boot().await.unwrap();
    // The record, counting entries the journal does not hold, reads as corrupt: the signal that
    // would rebuild the run is refused, and nothing is replayed from the wrong point.
    let refused = env
        .worker()
        .signal(wf, "go", "go-1", &"now")
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("the record counts"),
        "{refused}"
    );
    let unreadable = env.worker().workflow(wf).unwrap_err();
    assert!(
        unreadable.to_string().contains("the record counts"),
        "{unreadable}"
    );
    assert_eq!(env.worker().journal(wf).unwrap().len(), 4);
}

/// A journal with a row missing before its last (one lost, or one written past the end by
/// something else) stops the run as stuck on a corrupt record, instead of replaying it from
/// the wrong point.
#[tokio::test]
async fn a_journal_with_a_gap_is_stuck_as_corrupt() {
    let mut env = TestEnv::start(v1).await.unwrap();
    let wf = "stuck-journal-gap";
    waiting_for_go(&env, wf).await;
    env.stop().await;
    if waymark_tests::beneath_rocksdb_only(&env) {
        return;
    }
    {
        use waymark::store::Store;
        let store = waymark::store::RocksStore::open(env.data_dir()).unwrap();
        let len = store.workflow(wf).unwrap().unwrap().journal_len;
        let last = store.journal(wf).unwrap().pop().unwrap();
        let bytes = waymark::store::encode_record(&last);
        store.overwrite_journal_record(wf, len + 1, &bytes).unwrap();
    }
    env.boot().await.unwrap();
    // Parked under the code deployed, the run stays out of memory until its signal comes; the
    // rebuild that brings finds the gap.
    env.worker().signal(wf, "go", "go-1", &"now").await.unwrap();
    assert!(eventually(400, || is_stuck(&env, wf)).await);
    let stop = env.worker().workflow(wf).unwrap().unwrap().stop.unwrap();
    assert_eq!(stop.code, StopCode::CorruptRecord);
    assert!(stop.message.contains("missing entry"), "{stop:?}");
}

#[activity(effect)]
async fn gated_book(cx: ActivityContext, #[key] order_id: String) -> Result<String, ActivityError> {
    waymark_tests::pass_gate(cx.workflow_id(), "book").await;
    Ok(order_id)
}

#[workflow]
async fn booking(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    Ok(ctx.effect(gated_book, order_id).await?)
}

/// A worker hosting `booking`, with the booking of `wf` started and its call held in flight
/// (`prepared`); the call's idempotency key.
async fn booking_held_in_flight(wf: &str, order_id: &str) -> (TestEnv, String) {
    let env = TestEnv::start(|b| b.register(booking).register(gated_book))
        .await
        .unwrap();
    waymark_tests::close_gate(wf, "book");
    env.worker()
        .start_with(booking, order_id.to_owned(), with_id(wf))
        .await
        .unwrap();
    let first = || env.worker().operations(wf).unwrap().into_iter().next();
    assert!(eventually(400, || first().is_some()).await, "prepared");
    let (key, record) = first().unwrap();
    assert_eq!(record.status.name(), "prepared");
    (env, key)
}

/// The ended workflow `wf` is kept while `key` is unsettled; `decision` settles it as
/// `settled`, and then the workflow is deleted.
async fn kept_until_decided(
    env: &TestEnv,
    wf: &str,
    key: &str,
    decision: OperatorDecision,
    settled: &str,
) {
    let kept = env.worker().delete(wf).await.unwrap_err();
    assert!(matches!(kept, DeleteError::Unsettled { .. }), "{kept}");
    env.worker()
        .resolve_operation(key, decision, "ops@example")
        .await
        .unwrap();
    let record = env.worker().operation(key).unwrap().unwrap();
    assert_eq!(record.status.name(), settled);
    env.worker().delete(wf).await.unwrap();
    waymark_tests::open_gate(wf, "book");
}

/// A stop that comes back after every clean replay (an operation record that does not decode,
/// read when the in-flight effect is restarted) is held for a pause that keeps growing: the run
/// is not replayed every second.
#[tokio::test]
async fn a_stop_after_a_clean_replay_waits_longer_each_time() {
    let wf = "stuck-after-replay";
    let (mut env, key) = booking_held_in_flight(wf, "ORD-3").await;
    env.stop().await;
    if waymark_tests::beneath_rocksdb_only(&env) {
        return;
    }
    {
        let store = waymark::store::RocksStore::open(env.data_dir()).unwrap();
        let table = waymark::store::Table::Operations;
        store
            .overwrite_raw(table, key.as_bytes(), b"\x07garbage")
            .unwrap();
    }
    let loads = |env: &TestEnv| {
        env.metrics()
            .value(names::WORKFLOW_LOADS, &[("wake", "event")])
    };
    let before = loads(&env);
    env.boot().await.unwrap();
    assert!(eventually(400, || is_stuck(&env, wf)).await);
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    let rebuilds = loads(&env) - before;
    // Pauses of 1 s, then 2 s, then 4 s: two rebuilds in 4.5 s, not one a second.
    assert!(
        (1.0..=2.0).contains(&rebuilds),
        "{rebuilds} rebuilds in 4.5 s"
    );
    let stop = env.worker().workflow(wf).unwrap().unwrap().stop.unwrap();
    assert_eq!(stop.code, StopCode::CorruptRecord, "{stop:?}");
    waymark_tests::open_gate(wf, "book");
}

/// A step added before the booking, without a patch: the old journal does not replay.
#[workflow(name = "booking")]
async fn booking_audited(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    let audit = ctx.activity(step, "audited".into()).await?;
    let booked = ctx.effect(gated_book, order_id).await?;
    Ok(format!("{audit}, {booked}"))
}

/// [`booking_held_in_flight`], then the worker booted again on code that adds a step before
/// the booking: the run is stuck with its call `prepared`.
async fn stuck_with_booking_in_flight(wf: &str, order_id: &str) -> (TestEnv, String) {
    let (mut env, key) = booking_held_in_flight(wf, order_id).await;
    let diverged = |b: WorkerBuilder| {
        b.register(booking_audited)
            .register(gated_book)
            .register(step)
    };
    env.boot_with(diverged).await.unwrap();
    assert!(eventually(400, || is_stuck(&env, wf)).await);
    (env, key)
}

/// A stuck run cancelled with a call in flight leaves its record where an operator can settle
/// it, not `prepared` for good: nothing calls or reconciles it once the workflow has ended.
#[tokio::test]
async fn a_cancelled_stuck_run_leaves_its_call_in_flight_to_an_operator() {
    let wf = "stuck-call-cancelled";
    let (env, key) = stuck_with_booking_in_flight(wf, "ORD-5").await;
    env.worker().cancel(wf, "no longer wanted").await.unwrap();
    let status = env.worker().workflow_status(wf).unwrap();
    assert_eq!(status, Some(WorkflowStatus::Failed));
    let record = env.worker().operation(&key).unwrap().unwrap();
    let OperationStatus::AwaitingOperator { reason } = &record.status else {
        panic!("left {}", record.status.name());
    };
    assert!(
        reason.contains("the run ended while attempt 1 of `gated_book` was in flight"),
        "{reason}"
    );
    let decision = OperatorDecision::Failed("never booked".into());
    kept_until_decided(&env, wf, &key, decision, "failed_terminal").await;
}

/// A workflow ended without its call in flight moved to an operator, as a build before the
/// move did (or a worker stopped between a cancellation's end and the move): the `prepared`
/// record accepts a decision, since no run of the workflow will settle it, and the workflow is
/// kept until then.
#[tokio::test]
async fn a_call_an_ended_workflow_left_prepared_is_settled_by_a_decision() {
    let wf = "ended-with-call-prepared";
    let (mut env, key) = booking_held_in_flight(wf, "ORD-6").await;
    env.stop().await;
    if waymark_tests::beneath_rocksdb_only(&env) {
        return;
    }
    {
        use waymark::store::{Failure, FailureKind, RocksStore, Store, Transition};
        let store = RocksStore::open(env.data_dir()).unwrap();
        let record = store.workflow(wf).unwrap().unwrap();
        let failure = Failure::new(FailureKind::Cancelled, "cancelled");
        let mut end = Transition::append(wf, &record, vec![Entry::WorkflowFailed { failure }]);
        end.record.status = WorkflowStatus::Failed;
        end.ended_at_ms = 1;
        store.commit(end).await.unwrap();
    }
    env.boot().await.unwrap();
    let record = env.worker().operation(&key).unwrap().unwrap();
    assert_eq!(record.status.name(), "prepared");
    assert_eq!(
        awaiting_decision(&env, &key),
        Some("prepared"),
        "listed: no run of the ended workflow will make or settle the call"
    );
    kept_until_decided(&env, wf, &key, OperatorDecision::NotFound, "not_attempted").await;
}

/// An operation row that does not decode is left out of the operations awaiting a decision,
/// and hides no other: the people who settle them still see the rest. So is one filed under
/// the keys of a workflow its record does not name, which the sweep must not settle either.
#[tokio::test]
async fn an_operation_row_that_does_not_read_hides_no_other_awaiting_a_decision() {
    let mut env = TestEnv::start(|b| b.register(notice).register(unanswered))
        .await
        .unwrap();
    let awaits = WorkflowStatus::AwaitingOperator;
    for wf in ["row-unreadable", "row-readable"] {
        let started = env.worker().start_with(notice, "ORD-1".into(), with_id(wf));
        started.await.unwrap();
        assert_eq!(status_once(&env, wf, awaits).await, Some(awaits));
    }
    let key = |wf: &str| format!(r#"{wf}|unanswered|["ORD-1"]|v1"#);
    let readable = env.worker().operation(&key("row-readable")).unwrap();
    env.stop().await;
    if waymark_tests::beneath_rocksdb_only(&env) {
        return;
    }
    {
        let store = waymark::store::RocksStore::open(env.data_dir()).unwrap();
        let table = waymark::store::Table::Operations;
        let unreadable = key("row-unreadable");
        store
            .overwrite_raw(table, unreadable.as_bytes(), b"\x07garbage")
            .unwrap();
        // A row that reads, filed under the keys of a workflow it does not name: nobody's. It
        // is indexed as unsettled, as its record says, so that the listing reads it.
        let stray = waymark::store::encode_record(&readable.unwrap());
        store
            .overwrite_raw(table, key("row-stray").as_bytes(), &stray)
            .unwrap();
        let index = waymark::store::Table::Unsettled;
        store
            .overwrite_raw(index, key("row-stray").as_bytes(), b"")
            .unwrap();
    }
    let data = waymark::inspect::DataDir::open(env.data_dir()).unwrap();
    let listed = data.operations_awaiting_decision(None).unwrap();
    let keys: Vec<&str> = listed.iter().map(|(key, _)| key.as_str()).collect();
    assert_eq!(keys, [key("row-readable")]);
    drop(data);
    env.boot().await.unwrap();
    let stray = key("row-stray");
    let decided = env
        .worker()
        .resolve_operation(&stray, OperatorDecision::NotFound, "ops@example");
    let refused = decided.await.unwrap_err();
    assert!(
        matches!(refused, ResolveError::UnknownOperation(_)),
        "{refused}"
    );
}

/// An operation of a stuck workflow is not listed for a decision, which its run refuses until
/// it is fixed, reset or cancelled; once matching code is deployed, it is listed again.
#[tokio::test]
async fn an_operation_of_a_stuck_workflow_is_listed_once_its_run_takes_decisions() {
    let wf = "stuck-awaiting-operator";
    let hosted = |b: WorkerBuilder| b.register(notice).register(unanswered);
    let mut env = TestEnv::start(hosted).await.unwrap();
    let started = env.worker().start_with(notice, "ORD-4".into(), with_id(wf));
    started.await.unwrap();
    let awaits = WorkflowStatus::AwaitingOperator;
    assert_eq!(status_once(&env, wf, awaits).await, Some(awaits));
    let key = format!(r#"{wf}|unanswered|["ORD-4"]|v1"#);
    assert_eq!(awaiting_decision(&env, &key), Some("awaiting_operator"));

    env.boot_with(|b| b.register(step)).await.unwrap();
    assert!(eventually(400, || is_stuck(&env, wf)).await);
    assert_eq!(awaiting_decision(&env, &key), None, "stuck");
    let decided = env
        .worker()
        .resolve_operation(&key, OperatorDecision::NotFound, "ops@example");
    assert!(decided.await.is_err(), "a stuck run takes no decision");

    env.boot_with(hosted).await.unwrap();
    let listed = || awaiting_decision(&env, &key) == Some("awaiting_operator");
    assert!(eventually(400, listed).await, "listed again");
}

/// A reset run that issues again the intent of a call its stuck run left in flight takes the
/// call's record over: it does not call, it waits for the decision the call needs (the booking
/// has no reconciler), and the decision completes it.
#[tokio::test]
async fn a_reset_run_takes_over_the_call_its_stuck_run_left_in_flight() {
    let wf = "reset-call-in-flight";
    let (env, key) = stuck_with_booking_in_flight(wf, "ORD-7").await;
    let left = env.worker().operation(&key).unwrap().unwrap();
    assert_eq!(left.status.name(), "prepared");

    env.worker().reset(wf, 1, None).await.unwrap();
    let awaits = WorkflowStatus::AwaitingOperator;
    assert_eq!(status_once(&env, wf, awaits).await, Some(awaits));
    let taken = env.worker().operation(&key).unwrap().unwrap();
    let OperationStatus::AwaitingOperator { reason } = &taken.status else {
        panic!("taken over as {}", taken.status.name());
    };
    assert!(reason.contains("it has no reconciler"), "{reason}");
    assert_ne!(
        taken.seq, left.seq,
        "the record names the new run's command"
    );
    let uncertain = |e: &Entry| {
        matches!(e, Entry::EffectUncertain { seq, failure, .. } if *seq == taken.seq
            && failure.message == "an earlier run of this workflow left attempt 1 of `gated_book` prepared")
    };
    assert!(journal_has(&env, wf, uncertain));
    let awaiting = env.worker().awaiting_operator(wf).unwrap();
    assert_eq!(awaiting.len(), 1, "{awaiting:?}");

    let decision = waymark::operations::committed(&"ORD-7 booked").unwrap();
    env.worker()
        .resolve_operation(&key, decision, "ops@example")
        .await
        .unwrap();
    let run = env.worker().handle(booking_audited, wf);
    let output = tokio::time::timeout(Duration::from_secs(10), run.result()).await;
    assert_eq!(output.unwrap().unwrap(), "audited, ORD-7 booked");
    let record = env.worker().operation(&key).unwrap().unwrap();
    let prepared = record.history.iter().filter(|e| e.status == "prepared");
    assert_eq!(prepared.count(), 1, "called once: {:?}", record.history);
    waymark_tests::open_gate(wf, "book");
}

/// A decision about a call its run has in flight is refused, and changes nothing: only the
/// call's answer, a reconciler or a decision once it waits for one settles it.
#[tokio::test]
async fn a_decision_about_a_call_in_flight_is_refused() {
    let wf = "decision-call-in-flight";
    let (env, key) = booking_held_in_flight(wf, "ORD-9").await;
    let refused = env
        .worker()
        .resolve_operation(&key, OperatorDecision::NotFound, "ops@example")
        .await
        .unwrap_err();
    let expected = ResolveError::NotAwaitingOperator {
        key: key.clone(),
        status: "prepared",
    };
    assert_eq!(refused.to_string(), expected.to_string());
    let record = env.worker().operation(&key).unwrap().unwrap();
    assert_eq!(record.status.name(), "prepared");
    assert_eq!(awaiting_decision(&env, &key), None, "in flight");
    waymark_tests::open_gate(wf, "book");
    let run = env.worker().handle(booking, wf);
    let output = tokio::time::timeout(Duration::from_secs(10), run.result()).await;
    assert_eq!(output.unwrap().unwrap(), "ORD-9");
}

/// The booking's fix that no longer books: a step, then a wait for `go`.
#[workflow(name = "booking")]
async fn booking_withdrawn(
    ctx: WorkflowContext,
    _order_id: String,
) -> Result<String, WorkflowError> {
    let audit = ctx.activity(step, "audited".into()).await?;
    let go: String = ctx.signal("go").await?;
    Ok(format!("{audit}, no booking, {go}"))
}

/// Resets `wf` to its first entry, once a boot's replay has left it stuck again (the replay
/// diverges and the run leaves memory).
async fn reset_to_first_entry(env: &TestEnv, wf: &str) {
    let mut reset = env.worker().reset(wf, 1, None).await;
    for _ in 0..400 {
        if reset.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        reset = env.worker().reset(wf, 1, None).await;
    }
    reset.unwrap();
}

/// A reset run that never issues the intent its stuck run left in flight does not hold the
/// call's `prepared` record: an operator decides it while the workflow runs on, and the key is
/// free again.
#[tokio::test]
async fn a_call_a_reset_discarded_is_decided_while_the_workflow_runs_on() {
    let wf = "reset-call-discarded";
    let (mut env, key) = stuck_with_booking_in_flight(wf, "ORD-8").await;
    // Stuck, the run still holds the call, which it reconciles once it runs again: refused,
    // unchanged.
    let stuck = env
        .worker()
        .resolve_operation(&key, OperatorDecision::NotFound, "ops@example");
    let refused = stuck.await.unwrap_err();
    assert!(
        matches!(
            refused,
            ResolveError::NotAwaitingOperator {
                status: "prepared",
                ..
            }
        ),
        "{refused}"
    );
    let left = env.worker().operation(&key).unwrap().unwrap();
    assert_eq!(left.status.name(), "prepared");
    assert_eq!(
        awaiting_decision(&env, &key),
        None,
        "its run holds the call"
    );

    env.boot_with(|b| {
        b.register(booking_withdrawn)
            .register(gated_book)
            .register(step)
    })
    .await
    .unwrap();
    reset_to_first_entry(&env, wf).await;
    let waits = WorkflowStatus::AwaitingSignal;
    assert_eq!(status_once(&env, wf, waits).await, Some(waits));
    assert_eq!(
        awaiting_decision(&env, &key),
        Some("prepared"),
        "listed for the operators once no run holds the call"
    );
    env.worker()
        .resolve_operation(&key, OperatorDecision::NotFound, "ops@example")
        .await
        .unwrap();
    let record = env.worker().operation(&key).unwrap().unwrap();
    assert_eq!(record.status.name(), "not_attempted");
    assert_eq!(awaiting_decision(&env, &key), None, "decided");
    assert_eq!(record.seq, left.seq, "settled alone");

    env.worker().signal(wf, "go", "go-1", &"now").await.unwrap();
    let run = env.worker().handle(booking_withdrawn, wf);
    let output = tokio::time::timeout(Duration::from_secs(10), run.result()).await;
    assert_eq!(output.unwrap().unwrap(), "audited, no booking, now");
    waymark_tests::open_gate(wf, "book");
}

static UNSURE_RECONCILES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Never hears back from the carrier. Its reconciler cannot tell at first, and finds the
/// booking made once asked again; the run's own recheck is five to ten minutes away.
#[activity(effect, reconcile = find_unsure_booking, initial_backoff_ms = 600_000, max_backoff_ms = 600_000)]
async fn unsure_book(
    _cx: ActivityContext,
    #[key] order_id: String,
) -> Result<String, ActivityError> {
    Err(ActivityError::uncertain(format!(
        "no answer about {order_id}"
    )))
}

async fn find_unsure_booking(
    _cx: ActivityContext,
    _order_id: String,
) -> Result<Reconciled<String>, ActivityError> {
    let ordinal = UNSURE_RECONCILES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    Ok(match ordinal {
        0 => Reconciled::StillUnknown("the carrier's API answered 503".into()),
        _ => Reconciled::Committed("booked".into()),
    })
}

/// [`booking`], with an effect that never hears back.
#[workflow(name = "booking")]
async fn unsure_booking(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    Ok(ctx.effect(unsure_book, order_id).await?)
}

/// An unknown outcome a reset discarded is no run's to recheck any more: the reconciliation
/// sweep asks its reconciler, once the reset run has stood a sweep interval (the record's own
/// last change may be long past), and the record is settled alone while the workflow runs on.
#[tokio::test]
async fn the_sweep_settles_an_unknown_outcome_a_reset_discarded() {
    let wf = "reset-unknown-discarded";
    let mut env = TestEnv::start(|b| b.register(unsure_booking).register(unsure_book))
        .await
        .unwrap();
    env.worker()
        .start_with(unsure_booking, "ORD-9".to_owned(), with_id(wf))
        .await
        .unwrap();
    let reconciles = || UNSURE_RECONCILES.load(std::sync::atomic::Ordering::SeqCst);
    let first = || env.worker().operations(wf).unwrap().into_iter().next();
    let unknown = || first().is_some_and(|(_, r)| r.status.name() == "unknown_outcome");
    assert!(eventually(400, || unknown() && reconciles() == 1).await);
    let (key, left) = first().unwrap();

    let diverged = |b: WorkerBuilder| {
        let b = b.register(booking_audited).register(gated_book);
        b.register(unsure_book).register(step)
    };
    env.boot_with(diverged).await.unwrap();
    assert!(eventually(400, || is_stuck(&env, wf)).await);
    // Stuck for ten minutes: its record's last change is older than any sweep interval.
    env.advance(Duration::from_secs(600)).await;
    let fixed = |b: WorkerBuilder| {
        let b = b.register(booking_withdrawn).register(gated_book);
        b.register(unsure_book).register(step)
    };
    env.boot_with(fixed).await.unwrap();
    // Reset 30 s after the boot, whose first sweep comes 60 s after it.
    env.advance(Duration::from_secs(30)).await;
    reset_to_first_entry(&env, wf).await;
    let waits = WorkflowStatus::AwaitingSignal;
    assert_eq!(status_once(&env, wf, waits).await, Some(waits));
    assert!(advance_to_next_sweep(&env).await);
    assert_eq!(
        reconciles(),
        1,
        "the reset run began 30 s before that sweep"
    );

    let committed = || env.worker().operation(&key).unwrap().unwrap().status.name() == "committed";
    for _ in 0..30 {
        if committed() {
            break;
        }
        env.advance(Duration::from_secs(10)).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let record = env.worker().operation(&key).unwrap().unwrap();
    assert_eq!(record.status.name(), "committed", "swept");
    assert_eq!(
        record.history.last().unwrap().by.as_deref(),
        Some("reconciler")
    );
    assert_eq!(
        (record.seq, reconciles()),
        (left.seq, 2),
        "settled alone, asked once more"
    );
    env.worker().signal(wf, "go", "go-1", &"now").await.unwrap();
    let run = env.worker().handle(booking_withdrawn, wf);
    let output = tokio::time::timeout(Duration::from_secs(10), run.result()).await;
    assert_eq!(output.unwrap().unwrap(), "audited, no booking, now");
}

static CHARGES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

#[activity(effect)]
async fn charge(#[key] order_id: String) -> Result<String, ActivityError> {
    CHARGES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    Ok(format!("charged {order_id}"))
}

#[workflow(name = "billing")]
async fn billing_v1(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    let charged = ctx.effect(charge, order_id).await?;
    let go: String = ctx.signal("go").await?;
    Ok(format!("{charged} {go}"))
}

/// A step added before the charge, without a patch: the old journal does not replay.
#[workflow(name = "billing")]
async fn billing_v2(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    let audit = ctx.activity(step, "audited".into()).await?;
    let charged = ctx.effect(charge, order_id).await?;
    let go: String = ctx.signal("go").await?;
    Ok(format!("{audit}, {charged} {go}"))
}

#[tokio::test]
async fn a_stuck_run_reset_goes_on_as_a_new_run_on_the_fixed_code_without_charging_again() {
    let wf = "billing-reset";
    let mut env = TestEnv::start(|b| b.register(billing_v1).register(charge).register(step))
        .await
        .unwrap();
    let worker = env.worker();
    worker
        .start_with(billing_v1, "o-1".into(), with_id(wf))
        .await
        .unwrap();
    let waits = |e: &Entry| matches!(e, Entry::SignalAwaitedAt { .. });
    assert!(eventually(400, || journal_has(&env, wf, waits)).await);
    let old_journal = env.worker().journal(wf).unwrap();
    // Only a stuck run is reset: this one runs.
    let running = env.worker().reset(wf, 1, None).await.unwrap_err();
    assert!(
        matches!(running, waymark::ForkError::NotStuck { .. }),
        "{running}"
    );

    env.boot_with(|b| b.register(billing_v2).register(charge).register(step))
        .await
        .unwrap();
    assert!(eventually(400, || is_stuck(&env, wf)).await);
    let charged_before = CHARGES.load(std::sync::atomic::Ordering::SeqCst);

    let by = Some("dana@ops".to_owned());
    let kept = env.worker().reset(wf, 1, by).await.unwrap();
    assert_eq!(kept, format!("{wf}#run-1"));
    env.worker().signal(wf, "go", "go-1", &"now").await.unwrap();
    let run = env.worker().handle(billing_v2, wf);
    let output = tokio::time::timeout(Duration::from_secs(10), run.result()).await;
    assert_eq!(output.unwrap().unwrap(), "audited, charged o-1 now");
    assert_eq!(
        CHARGES.load(std::sync::atomic::Ordering::SeqCst),
        charged_before,
        "the charge the old run committed is answered from the log"
    );

    // The new run: the start, where it came from, then the fixed code's steps.
    let journal = env.worker().journal(wf).unwrap();
    let Entry::Forked(forked) = &journal[1] else {
        panic!("entry 1 is {:?}", journal[1]);
    };
    assert_eq!((forked.source.as_str(), forked.at), (kept.as_str(), 1));
    assert_eq!(forked.by.as_deref(), Some("dana@ops"));
    // The old run, kept whole and ended.
    let history = env.worker().journal(&kept).unwrap();
    assert_eq!(history[..old_journal.len()], old_journal[..]);
    assert!(
        matches!(history.last(), Some(Entry::WorkflowFailed { failure }) if failure.message.contains("reset by dana@ops"))
    );
    let status = env.worker().workflow_status(&kept).unwrap();
    assert_eq!(status, Some(WorkflowStatus::Failed));
    // Once it ended, it is no longer stuck, and cannot be reset again.
    let ended = env.worker().reset(wf, 1, None).await.unwrap_err();
    assert!(
        matches!(ended, waymark::ForkError::NotStuck { .. }),
        "{ended}"
    );

    // The kept run forks like any workflow: its effects are the workflow's, under the
    // workflow's keys, so the fork inherits the charge instead of charging again.
    let options = waymark::ForkOptions {
        at: 1,
        workflow_id: Some("billing-fork".into()),
        ..Default::default()
    };
    env.worker().fork(&kept, options).await.unwrap();
    let go = env.worker().signal("billing-fork", "go", "go-1", &"later");
    go.await.unwrap();
    let fork = env.worker().handle(billing_v2, "billing-fork");
    let output = tokio::time::timeout(Duration::from_secs(10), fork.result()).await;
    assert_eq!(output.unwrap().unwrap(), "audited, charged o-1 later");
    assert_eq!(
        CHARGES.load(std::sync::atomic::Ordering::SeqCst),
        charged_before,
        "the fork of the kept run inherits the charge"
    );
    // No workflow is started under an id that names a kept run.
    let start = env
        .worker()
        .start_with(billing_v2, "o-2".into(), with_id("billing-reset#run-7"));
    let Err(reserved) = start.await else {
        panic!("started under a kept run's id");
    };
    assert!(
        reserved.to_string().contains("names a kept run"),
        "{reserved}"
    );
}

#[workflow(name = "two_signals")]
async fn two_signals_v1(ctx: WorkflowContext, _input: ()) -> Result<String, WorkflowError> {
    let first: String = ctx.signal("first").await?;
    let second: String = ctx.signal("second").await?;
    Ok(format!("{first} {second}"))
}

/// A step added before the signals, without a patch.
#[workflow(name = "two_signals")]
async fn two_signals_v2(ctx: WorkflowContext, _input: ()) -> Result<String, WorkflowError> {
    let audit = ctx.activity(step, "audited".into()).await?;
    let first: String = ctx.signal("first").await?;
    let second: String = ctx.signal("second").await?;
    Ok(format!("{audit}: {first} {second}"))
}

/// A signal the old run took after the reset point was acknowledged to its sender: the new run
/// gets it again, before the ones that arrived later, and the sender need not send it again.
#[tokio::test]
async fn a_reset_delivers_again_the_signals_the_replaced_entries_took() {
    let wf = "signals-reset";
    let mut env = TestEnv::start(|b| b.register(two_signals_v1).register(step))
        .await
        .unwrap();
    env.worker()
        .start_with(two_signals_v1, (), with_id(wf))
        .await
        .unwrap();
    env.worker()
        .signal(wf, "first", "f-1", &"one")
        .await
        .unwrap();
    let took_first = |e: &Entry| matches!(e, Entry::SignalAwaitedAt { seq: 1, .. });
    assert!(eventually(400, || journal_has(&env, wf, took_first)).await);

    env.boot_with(|b| b.register(two_signals_v2).register(step))
        .await
        .unwrap();
    assert!(eventually(400, || is_stuck(&env, wf)).await);
    // Sent while it is stuck: they wait in the inbox, behind the one delivered again (a
    // second `first` too, which the new run must not take in its place).
    env.worker()
        .signal(wf, "first", "f-2", &"later")
        .await
        .unwrap();
    env.worker()
        .signal(wf, "second", "s-1", &"two")
        .await
        .unwrap();
    env.worker().reset(wf, 1, None).await.unwrap();
    // Its id stays seen: sending it again is a duplicate, not a second delivery.
    let again = env
        .worker()
        .signal(wf, "first", "f-1", &"one")
        .await
        .unwrap();
    assert_eq!(again, SignalOutcome::Duplicate);

    let run = env.worker().handle(two_signals_v2, wf);
    let output = tokio::time::timeout(Duration::from_secs(10), run.result()).await;
    assert_eq!(output.unwrap().unwrap(), "audited: one two");
}
