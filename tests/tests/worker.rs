//! The worker's contract: request-id deduplication, containment of corrupt records, eviction of
//! workflows waiting on long timers, bounded retries, and fencing of late attempts.

use std::time::Duration;

use waymark::inspect::Entry;
use waymark::prelude::*;
use waymark::testing::TestEnv;
use waymark::{StartError, StartOptions};
use waymark_tests::{close_gate, count, eventually, executions, open_gate, pass_gate, with_id};

fn with_request(request_id: &str) -> StartOptions {
    StartOptions {
        request_id: Some(request_id.to_owned()),
        ..StartOptions::default()
    }
}

#[activity]
async fn gated(cx: ActivityContext, name: String) -> Result<String, ActivityError> {
    count(cx.workflow_id(), &name);
    pass_gate(cx.workflow_id(), &name).await;
    Ok(name.to_uppercase())
}

#[workflow]
async fn echo(ctx: WorkflowContext, name: String) -> Result<String, WorkflowError> {
    Ok(ctx.activity(gated, name).await?)
}

#[tokio::test]
async fn the_same_request_id_twice_starts_one_workflow() {
    let env = TestEnv::start(|b| b.register(echo).register(gated))
        .await
        .unwrap();
    let worker = env.worker();
    let first = worker
        .start_with(echo, "x".into(), with_request("req-1"))
        .await
        .unwrap();
    let second = worker
        .start_with(echo, "x".into(), with_request("req-1"))
        .await
        .unwrap();
    assert_eq!(first.id(), second.id());
    assert!(!first.existed());
    assert!(second.existed());
    assert_eq!(second.result().await.unwrap(), "X");
    assert_eq!(executions(first.id(), "x"), 1);

    let conflict = worker
        .start_with(echo, "y".into(), with_request("req-1"))
        .await;
    let Err(error) = conflict else {
        panic!("a different input for a known request id must conflict");
    };
    assert!(
        matches!(error, StartError::RequestConflict { what: "input", .. }),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "request id `req-1` already started workflow `req-1` with a different input"
    );
}

#[tokio::test]
async fn concurrent_starts_with_one_request_id_agree_on_one_workflow() {
    let env = TestEnv::start(|b| b.register(echo).register(gated))
        .await
        .unwrap();
    let worker = env.worker();
    let starts = (0..8).map(|_| worker.start_with(echo, "c".into(), with_request("req-c")));
    let handles = futures::future::join_all(starts).await;
    let created = handles
        .iter()
        .filter(|h| !h.as_ref().unwrap().existed())
        .count();
    assert_eq!(created, 1);
    for handle in &handles {
        assert_eq!(handle.as_ref().unwrap().result().await.unwrap(), "C");
    }
    assert_eq!(executions("req-c", "c"), 1);
}

#[tokio::test]
async fn starting_an_unknown_workflow_or_with_a_bad_id_is_a_clear_error() {
    let env = TestEnv::start(|b| b.register(gated)).await.unwrap();
    let error = env.worker().start(echo, "x".into()).await.err().unwrap();
    assert_eq!(
        error.to_string(),
        "workflow `echo` is not registered on this worker"
    );
    let env = TestEnv::start(|b| b.register(echo).register(gated))
        .await
        .unwrap();
    let long = "x".repeat(513);
    let error = env
        .worker()
        .start_with(echo, "x".into(), with_id(&long))
        .await
        .err()
        .unwrap();
    assert_eq!(
        error.to_string(),
        "workflow id must be 1..=512 bytes, got 513"
    );
}

#[tokio::test]
async fn a_corrupt_journal_record_is_reported_and_other_workflows_are_unaffected() {
    let mut env = TestEnv::start(|b| b.register(echo).register(gated))
        .await
        .unwrap();
    for id in ["corrupt-a", "healthy-b"] {
        close_gate(id, id);
        env.worker()
            .start_with(echo, id.to_owned(), with_id(id))
            .await
            .unwrap();
        assert!(eventually(400, || executions(id, id) == 1).await);
    }
    if waymark_tests::beneath_rocksdb_only(&env) {
        return;
    }
    env.stop().await;
    env.overwrite_journal_record("corrupt-a", 1, &[1, 0xff, 0xff, 0xff])
        .unwrap();
    open_gate("corrupt-a", "corrupt-a");
    open_gate("healthy-b", "healthy-b");
    env.boot().await.unwrap();

    let healthy = env.worker().handle(echo, "healthy-b").result().await;
    assert_eq!(healthy.unwrap(), "HEALTHY-B");
    let corrupt = env.worker().handle(echo, "corrupt-a").result().await;
    let error = corrupt.unwrap_err();
    let RunError::Stuck(stuck) = &error else {
        panic!("a stuck run, got {error:?}");
    };
    assert_eq!(stuck.stop.code, waymark::inspect::StopCode::CorruptRecord);
    assert!(
        stuck
            .stop
            .message
            .starts_with("corrupt record in `journal` at key corrupt-a#1"),
        "{error}"
    );
    // Nothing was run or rewritten for the corrupt workflow.
    assert_eq!(executions("corrupt-a", "corrupt-a"), 1);
    assert!(
        env.worker().journal("corrupt-a").is_err(),
        "the record is left as found"
    );
}

#[workflow]
async fn nap(ctx: WorkflowContext, hours: u64) -> Result<String, WorkflowError> {
    ctx.sleep(Duration::from_secs(hours * 3600)).await;
    Ok(ctx.activity(gated, "woke".into()).await?)
}

#[tokio::test]
async fn a_workflow_on_a_long_timer_is_evicted_and_rebuilt_when_it_fires() {
    let mut env = TestEnv::start(|b| {
        b.register(nap)
            .register(gated)
            .evict_after(Duration::from_secs(60))
    })
    .await
    .unwrap();
    let run = env
        .worker()
        .start_with(nap, 2, with_id("napper"))
        .await
        .unwrap();
    assert!(eventually(400, || env.worker().resident_workflows() == 0).await);

    // The timer survives a restart too.
    env.crash_and_restart().await.unwrap();
    assert!(eventually(400, || env.worker().resident_workflows() == 0).await);
    env.advance(Duration::from_secs(2 * 3600)).await;
    let run = env.worker().handle(nap, run.id());
    assert_eq!(run.result().await.unwrap(), "WOKE");
    let fired = env
        .worker()
        .journal("napper")
        .unwrap()
        .into_iter()
        .filter(|e| matches!(e, Entry::TimerFiredAt { .. }))
        .count();
    assert_eq!(fired, 1);
}

/// Fails with a retriable error on its first two attempts.
#[activity(max_attempts = 4, initial_backoff_ms = 1000)]
async fn flaky(cx: ActivityContext) -> Result<u32, ActivityError> {
    count(cx.workflow_id(), "flaky");
    if cx.attempt() < 3 {
        return Err(ActivityError::retriable(format!(
            "503 on attempt {}",
            cx.attempt()
        )));
    }
    Ok(cx.attempt())
}

#[workflow]
async fn with_retries(ctx: WorkflowContext) -> Result<u32, WorkflowError> {
    Ok(ctx.activity(flaky, ()).await?)
}

#[tokio::test]
async fn retriable_failures_are_retried_with_journaled_attempts() {
    let env = TestEnv::start(|b| b.register(with_retries).register(flaky))
        .await
        .unwrap();
    let run = env
        .worker()
        .start_with(with_retries, (), with_id("retries"))
        .await
        .unwrap();
    // Backoff is measured on the injected clock: nothing happens until it moves. Each failure
    // is journaled (its retry time fixed) before the clock moves past it.
    for attempt in 1..=2 {
        assert!(eventually(400, || failed_attempts(&env, "retries") == attempt).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(executions("retries", "flaky"), attempt);
        env.advance(Duration::from_secs(2)).await;
    }
    let result = tokio::time::timeout(Duration::from_secs(20), run.result()).await;
    assert_eq!(result.expect("the third attempt ran").unwrap(), 3);
    insta::assert_snapshot!(env.worker().render_journal("retries").unwrap(), @r#"
      0 workflow_started    with_retries request_id=- input=null
      1 activity_scheduled  seq=0 flaky input=null
      2 attempt_failed      seq=0 attempt=1 Retriable "503 on attempt 1" retry_at=[time]
      3 attempt_failed      seq=0 attempt=2 Retriable "503 on attempt 2" retry_at=[time]
      4 activity_completed  seq=0 attempt=3 output=3
      5 workflow_completed  output=3
    "#);
}

fn failed_attempts(env: &TestEnv, workflow_id: &str) -> u32 {
    let journal = env.worker().journal(workflow_id).unwrap_or_default();
    let failed = journal
        .iter()
        .filter(|entry| matches!(entry, Entry::ActivityAttemptFailed { .. }));
    u32::try_from(failed.count()).unwrap_or(u32::MAX)
}

#[activity(max_attempts = 2, initial_backoff_ms = 10)]
async fn always_terminal() -> Result<u32, ActivityError> {
    Err(ActivityError::terminal("order not found"))
}

#[workflow]
async fn gives_up(ctx: WorkflowContext) -> Result<u32, WorkflowError> {
    Ok(ctx.activity(always_terminal, ()).await?)
}

#[tokio::test]
async fn a_terminal_failure_is_not_retried_and_fails_the_workflow() {
    let env = TestEnv::start(|b| b.register(gives_up).register(always_terminal))
        .await
        .unwrap();
    let run = env
        .worker()
        .start_with(gives_up, (), with_id("gives-up"))
        .await
        .unwrap();
    let error = run.result().await.unwrap_err();
    assert_eq!(
        error.to_string(),
        "workflow failed: activity failed: terminal: order not found"
    );
    insta::assert_snapshot!(env.worker().render_journal("gives-up").unwrap(), @r#"
      0 workflow_started    gives_up request_id=- input=null
      1 activity_scheduled  seq=0 always_terminal input=null
      2 activity_failed     seq=0 attempt=1 Terminal "order not found"
      3 workflow_failed     Workflow "activity failed: terminal: order not found"
    "#);
}

/// Attempt 1 hangs past its timeout and answers late; attempt 2 answers at once.
#[activity(max_attempts = 3, timeout_ms = 5000, initial_backoff_ms = 100)]
async fn slow_first(cx: ActivityContext) -> Result<u32, ActivityError> {
    count(cx.workflow_id(), "slow_first");
    if cx.attempt() == 1 {
        pass_gate(cx.workflow_id(), "late").await;
    }
    Ok(cx.attempt())
}

#[workflow]
async fn fenced(ctx: WorkflowContext) -> Result<u32, WorkflowError> {
    let first = ctx.activity(slow_first, ()).await?;
    // Keep the workflow alive so the late answer arrives while it still runs.
    ctx.activity(gated, "hold".into()).await?;
    Ok(first)
}

#[tokio::test]
async fn a_late_answer_from_a_timed_out_attempt_is_ignored() {
    const ID: &str = "fenced";
    let env = TestEnv::start(|b| b.register(fenced).register(slow_first).register(gated))
        .await
        .unwrap();
    close_gate(ID, "late");
    close_gate(ID, "hold");
    let run = env
        .worker()
        .start_with(fenced, (), with_id(ID))
        .await
        .unwrap();
    assert!(eventually(400, || executions(ID, "slow_first") == 1).await);
    // The clock moves once the run has journaled the attempt (its first poll comes first) and
    // again until the retry, due 100 ms after the timeout is handled, has run: on a store
    // behind a network either may come after a fixed number of moves.
    let is_schedule = |entry: &Entry| matches!(entry, Entry::ActivityScheduledAt { .. });
    let scheduled = || {
        env.worker()
            .journal(ID)
            .is_ok_and(|j| j.iter().any(is_schedule))
    };
    assert!(eventually(400, scheduled).await);
    env.advance(Duration::from_secs(5)).await;
    for _ in 0..100 {
        if executions(ID, "hold") == 1 {
            break;
        }
        env.advance(Duration::from_secs(1)).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        executions(ID, "hold"),
        1,
        "attempt 2 ran and the code went on"
    );
    open_gate(ID, "late");
    tokio::time::sleep(Duration::from_millis(50)).await;
    open_gate(ID, "hold");
    assert_eq!(
        run.result().await.unwrap(),
        2,
        "attempt 2's answer is the result"
    );
    let journal = env.worker().render_journal(ID).unwrap();
    assert!(
        journal.contains("attempt_failed      seq=0 attempt=1 Timeout"),
        "{journal}"
    );
    assert!(
        journal.contains("activity_completed  seq=0 attempt=2 output=2"),
        "{journal}"
    );
    assert_eq!(
        journal.matches("activity_completed  seq=0").count(),
        1,
        "{journal}"
    );
}

/// Waits for a signal that never comes: a run that stays put while its store is tampered with.
#[workflow]
async fn waits_for_go(ctx: WorkflowContext, _input: ()) -> Result<String, WorkflowError> {
    ctx.signal::<String>("go").await
}

async fn worker_on_memory(engine: &std::sync::Arc<waymark::store::MemoryEngine>) -> Worker {
    let store = waymark::store::MemoryStore::on(engine.clone()).unwrap();
    let builder = Worker::builder().store(std::sync::Arc::new(store));
    builder.register(waits_for_go).build().await.unwrap()
}

/// A request id that names a workflow the store does not have is a corrupt store, said so,
/// not a backend failure.
#[tokio::test]
async fn a_request_pointing_at_a_missing_workflow_is_a_corrupt_record() {
    use waymark::store::{keys, Engine, StoreError, Table, Write};
    let engine = waymark::store::MemoryEngine::new();
    let worker = worker_on_memory(&engine).await;
    let options = StartOptions {
        workflow_id: Some("dangling".into()),
        request_id: Some("req-dangling".into()),
        ..StartOptions::default()
    };
    worker
        .start_with(waits_for_go, (), options.clone())
        .await
        .unwrap();
    // Taken once the run waits for its signal, after which it writes its record no more.
    let waiting = || {
        let record = worker.workflow("dangling").ok().flatten();
        record.is_some_and(|r| r.status == waymark::store::WorkflowStatus::AwaitingSignal)
    };
    assert!(eventually(400, waiting).await);
    let gone = Write::Delete(Table::Workflows, keys::id_key("dangling"));
    engine.write(vec![gone], true).unwrap();
    let Err(error) = worker.start_with(waits_for_go, (), options).await else {
        panic!("the second start found a workflow the store does not have");
    };
    let StartError::Store(StoreError::Corrupt { table, .. }) = &error else {
        panic!("expected a corrupt record, got {error}");
    };
    assert_eq!(*table, Table::Requests);
    assert!(
        error.to_string().contains("which the store does not have"),
        "{error}"
    );
    worker.shutdown().await;
}

/// A record that says the run ended, over a journal without its end, is a corrupt store: the
/// caller must not read it as the workflow's own failure.
#[tokio::test]
async fn an_ended_record_without_an_end_entry_is_a_corrupt_record_not_a_failure() {
    use waymark::store::{encode_record, keys, Engine, Store, StoreError, Table};
    use waymark::store::{WorkflowStatus, Write};
    let engine = waymark::store::MemoryEngine::new();
    let worker = worker_on_memory(&engine).await;
    worker
        .start_with(waits_for_go, (), with_id("ended-without-end"))
        .await
        .unwrap();
    worker.shutdown().await;
    let store = waymark::store::MemoryStore::on(engine.clone()).unwrap();
    let mut record = store.workflow("ended-without-end").unwrap().unwrap();
    drop(store);
    record.status = WorkflowStatus::Completed;
    let key = keys::id_key("ended-without-end");
    let tampered = Write::Put(Table::Workflows, key, encode_record(&record));
    engine.write(vec![tampered], true).unwrap();
    let worker = worker_on_memory(&engine).await;
    let error = worker
        .handle(waits_for_go, "ended-without-end")
        .result()
        .await
        .unwrap_err();
    let RunError::Store(StoreError::Corrupt { table, .. }) = &error else {
        panic!("expected a corrupt record, got {error}");
    };
    assert_eq!(*table, waymark::store::Table::Journal);
    worker.shutdown().await;
}
