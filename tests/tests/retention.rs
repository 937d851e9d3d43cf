//! Deleting ended workflows, by hand and by retention: an ended workflow goes with every row of
//! its own; a running one stays, and so does what another workflow still names.

use std::time::Duration;

use waymark::prelude::*;
use waymark::testing::TestEnv;
use waymark::{DeleteError, StartOptions, Unreachable, WorkerBuilder};
use waymark_tests::with_id;

#[workflow]
async fn one_step(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    Ok(ctx.activity(echo, order_id).await?)
}

#[activity]
async fn echo(_cx: ActivityContext, order_id: String) -> Result<String, ActivityError> {
    Ok(order_id)
}

#[workflow]
async fn waits_for_go(ctx: WorkflowContext, _input: ()) -> Result<String, WorkflowError> {
    ctx.signal::<String>("go").await
}

#[activity(effect)]
async fn held_booking(
    cx: ActivityContext,
    #[key] order_id: String,
) -> Result<String, ActivityError> {
    waymark_tests::pass_gate(cx.workflow_id(), "book").await;
    Ok(order_id)
}

/// Gives its booking a minute, then ends without it.
#[workflow]
async fn book_or_give_up(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    let mut call = ctx.effect(held_booking, order_id);
    let mut nap = ctx.sleep(Duration::from_secs(60));
    waymark::select! {
        booked = call => Ok(booked?),
        _ = nap => Ok("gave up".to_owned()),
    }
}

/// The workflows and activities of these tests, registered on `builder`.
fn with_workflows(builder: WorkerBuilder) -> WorkerBuilder {
    builder
        .register(one_step)
        .register(echo)
        .register(waits_for_go)
        .register(book_or_give_up)
        .register(held_booking)
}

fn with_request(workflow_id: &str, request_id: &str) -> StartOptions {
    StartOptions {
        workflow_id: Some(workflow_id.to_owned()),
        request_id: Some(request_id.to_owned()),
        ..StartOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_workflow_is_gone_and_its_request_id_starts_a_new_one() {
    let env = TestEnv::start(with_workflows).await.unwrap();
    let worker = env.worker();
    let done = worker
        .start_with(one_step, "ORD-1".into(), with_request("done", "req-1"))
        .await
        .unwrap();
    assert_eq!(done.result().await.unwrap(), "ORD-1");
    worker
        .start_with(waits_for_go, (), with_id("waiting"))
        .await
        .unwrap();

    let running = worker.delete("waiting").await.unwrap_err();
    assert!(matches!(running, DeleteError::NotEnded { .. }), "{running}");
    let unknown = worker.delete("nobody").await.unwrap_err();
    assert!(
        matches!(
            unknown,
            DeleteError::Unreachable(Unreachable::UnknownWorkflow(_))
        ),
        "{unknown}"
    );
    worker.delete("done").await.unwrap();
    assert_eq!(worker.workflow_status("done").unwrap(), None);
    assert!(worker.journal("done").unwrap().is_empty());
    assert!(worker.workflow_status("waiting").unwrap().is_some());

    // Its request id no longer names it: a start with it is a new workflow, run anew.
    let again = worker
        .start_with(
            one_step,
            "ORD-2".into(),
            with_request("done-again", "req-1"),
        )
        .await
        .unwrap();
    assert_eq!(again.id(), "done-again");
    assert_eq!(again.result().await.unwrap(), "ORD-2");
}

#[tokio::test(flavor = "multi_thread")]
async fn retention_deletes_what_ended_longer_ago_and_nothing_running() {
    let hour = Duration::from_secs(3600);
    let env = TestEnv::start(move |b| with_workflows(b).retention(hour))
        .await
        .unwrap();
    let worker = env.worker();
    let done = worker
        .start_with(one_step, "ORD-1".into(), with_id("done"))
        .await
        .unwrap();
    done.result().await.unwrap();
    worker
        .start_with(waits_for_go, (), with_id("waiting"))
        .await
        .unwrap();

    // Half the period: kept, through a sweep or more.
    env.advance(hour / 2).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(worker.workflow_status("done").unwrap().is_some());

    env.advance(hour).await;
    let gone = || worker.workflow_status("done").unwrap().is_none();
    assert!(swept(&env, hour / 10, gone).await, "retention deletes it");
    assert!(worker.journal("done").unwrap().is_empty());
    assert!(worker.workflow_status("waiting").unwrap().is_some());
    assert!(!worker.journal("waiting").unwrap().is_empty());
}

/// Whether `done` comes true while the clock moves on by `step` every second, for twenty
/// seconds. A sweep still running when the clock jumped sleeps from the new time, so the
/// sweep that sees the jump may be one more step away.
async fn swept(env: &TestEnv, step: Duration, done: impl Fn() -> bool) -> bool {
    for poll in 1..=400 {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        if poll % 20 == 0 {
            env.advance(step).await;
        }
    }
    done()
}

#[tokio::test(flavor = "multi_thread")]
async fn retention_passes_over_a_workflow_it_cannot_delete_and_deletes_the_rest() {
    let hour = Duration::from_secs(3600);
    let mut env = TestEnv::start(move |b| with_workflows(b).retention(hour))
        .await
        .unwrap();
    if !env.on_rocksdb() {
        return eprintln!("skipped: corrupting a record reaches beneath the store (RocksDB only)");
    }
    for id in ["unreadable", "readable"] {
        let run = env
            .worker()
            .start_with(one_step, "ORD".into(), with_id(id))
            .await
            .unwrap();
        run.result().await.unwrap();
        env.advance(Duration::from_secs(1)).await;
    }
    // The first to go, by its end time, has a journal row that no longer decodes.
    env.stop().await;
    env.overwrite_journal_record("unreadable", 1, b"\x01garbage")
        .unwrap();
    env.boot().await.unwrap();

    // The new worker's sweep may not be waiting yet: the clock moves until it has run.
    let worker = env.worker();
    let gone = || worker.workflow_status("readable").unwrap().is_none();
    let mut swept = false;
    for _ in 0..100 {
        env.advance(hour).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        if gone() {
            swept = true;
            break;
        }
    }
    assert!(swept, "the sweep goes on past it");
    assert!(worker.workflow_status("unreadable").unwrap().is_some());
}

/// A workflow that ended with a call that may have taken effect is kept, past the period and
/// through the sweeps that delete what ended after it, until someone decides the call.
#[tokio::test(flavor = "multi_thread")]
async fn retention_keeps_an_ended_workflow_until_its_call_in_flight_is_decided() {
    let hour = Duration::from_secs(3600);
    let env = TestEnv::start(move |b| with_workflows(b).retention(hour))
        .await
        .unwrap();
    let worker = env.worker();
    let left = "left-booking";
    waymark_tests::close_gate(left, "book");
    let run = worker
        .start_with(book_or_give_up, "ORD-9".into(), with_id(left))
        .await
        .unwrap();
    let called = || !worker.operations(left).unwrap().is_empty();
    assert!(waymark_tests::eventually(400, called).await, "prepared");
    env.advance(Duration::from_secs(61)).await;
    let ended = tokio::time::timeout(Duration::from_secs(10), run.result()).await;
    assert_eq!(ended.unwrap().unwrap(), "gave up");
    let (key, record) = worker.operations(left).unwrap().into_iter().next().unwrap();
    assert_eq!(record.status.name(), "awaiting_operator");
    let done = worker
        .start_with(one_step, "ORD-1".into(), with_id("done"))
        .await
        .unwrap();
    done.result().await.unwrap();

    env.advance(hour).await;
    let gone = |id: &'static str| move || worker.workflow_status(id).unwrap().is_none();
    assert!(
        swept(&env, hour / 10, gone("done")).await,
        "retention deletes it"
    );
    assert!(worker.workflow_status(left).unwrap().is_some(), "kept");
    assert_eq!(worker.operation(&key).unwrap(), Some(record));

    let decision = waymark::operations::OperatorDecision::NotFound;
    worker
        .resolve_operation(&key, decision, "ops@example")
        .await
        .unwrap();
    assert!(
        swept(&env, hour / 10, gone(left)).await,
        "deleted once decided"
    );
    assert!(worker.operation(&key).unwrap().is_none());
    waymark_tests::open_gate(left, "book");
}
