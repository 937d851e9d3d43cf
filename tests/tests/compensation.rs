//! Compensation: an effect registers its undo; when the workflow fails, is cancelled, or calls
//! `ctx.compensate()`, the undos of what committed run newest first, each an effect with its own
//! key, once across crashes. The downstream here is not idempotent, so a duplicate shows.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use waymark::prelude::*;
use waymark::testing::{Boundary, Fault, PlannedFault, TestEnv};
use waymark::WorkerBuilder;
use waymark_tests::{
    applied_effects, apply_under_key, count, executions, reconcile_by_key, with_id,
};

/// What the downstream did for each workflow, in order.
fn calls() -> &'static Mutex<HashMap<String, Vec<String>>> {
    static CALLS: OnceLock<Mutex<HashMap<String, Vec<String>>>> = OnceLock::new();
    CALLS.get_or_init(Default::default)
}

fn call(cx: &ActivityContext, what: &str) -> String {
    let mut calls = calls().lock().unwrap_or_else(|e| e.into_inner());
    let log = calls.entry(cx.workflow_id().to_owned()).or_default();
    log.push(what.to_owned());
    apply_under_key(cx, what)
}

fn called(wf: &str) -> Vec<String> {
    let calls = calls().lock().unwrap_or_else(|e| e.into_inner());
    calls.get(wf).cloned().unwrap_or_default()
}

async fn reconcile_booking(
    cx: ActivityContext,
    _trip: String,
) -> Result<Reconciled<String>, ActivityError> {
    count(cx.workflow_id(), "reconciles");
    Ok(reconcile_by_key(&cx))
}

#[activity(effect, reconcile = reconcile_booking, initial_backoff_ms = 100)]
async fn book_flight(cx: ActivityContext, #[key] trip: String) -> Result<String, ActivityError> {
    Ok(call(&cx, &format!("book flight {trip}")))
}

#[activity(effect, reconcile = reconcile_booking, initial_backoff_ms = 100)]
async fn book_hotel(cx: ActivityContext, #[key] trip: String) -> Result<String, ActivityError> {
    Ok(call(&cx, &format!("book hotel {trip}")))
}

/// Books a flight once the test lets it through.
#[activity(effect, reconcile = reconcile_booking, initial_backoff_ms = 100)]
async fn book_flight_slowly(
    cx: ActivityContext,
    #[key] trip: String,
) -> Result<String, ActivityError> {
    count(cx.workflow_id(), "slow flight");
    waymark_tests::pass_gate(cx.workflow_id(), "flight").await;
    Ok(call(&cx, &format!("book flight {trip}")))
}

/// Never has a car: refused, so there is nothing to undo.
#[activity(effect)]
async fn book_car(cx: ActivityContext, #[key] trip: String) -> Result<String, ActivityError> {
    call(&cx, &format!("no car for {trip}"));
    Err(ActivityError::terminal("no car left"))
}

/// Cancels a flight by its booking reference.
#[activity(effect, reconcile = reconcile_booking, initial_backoff_ms = 100)]
async fn cancel_flight(
    cx: ActivityContext,
    #[key] reference: String,
) -> Result<String, ActivityError> {
    Ok(call(&cx, &format!("cancel flight {reference}")))
}

#[activity(effect, reconcile = reconcile_booking, initial_backoff_ms = 100)]
async fn cancel_hotel(cx: ActivityContext, #[key] trip: String) -> Result<String, ActivityError> {
    Ok(call(&cx, &format!("cancel hotel {trip}")))
}

/// Books a flight and a hotel, each with its undo, then a car, which is refused.
#[workflow]
async fn book_trip(ctx: WorkflowContext, trip: String) -> Result<String, WorkflowError> {
    book_flight_and_hotel(&ctx, &trip).await?;
    ctx.effect(book_car, trip.clone())
        .compensate_with(cancel_hotel, format!("{trip}-car"))
        .await?;
    Ok("booked".into())
}

async fn book_flight_and_hotel(ctx: &WorkflowContext, trip: &str) -> Result<(), WorkflowError> {
    ctx.effect(book_flight, trip.to_owned())
        .compensate_with_output(cancel_flight, |reference: &String| reference.clone())
        .await?;
    ctx.effect(book_hotel, trip.to_owned())
        .compensate_with(cancel_hotel, trip.to_owned())
        .await?;
    Ok(())
}

/// Books a flight and a hotel, then waits to be told to go on.
#[workflow]
async fn trip_waiting(ctx: WorkflowContext, trip: String) -> Result<String, WorkflowError> {
    book_flight_and_hotel(&ctx, &trip).await?;
    let go: Result<String, _> = ctx.signal("go").await;
    Ok(format!("went: {go:?}"))
}

/// Books a flight that takes its time.
#[workflow]
async fn trip_slow(ctx: WorkflowContext, trip: String) -> Result<String, WorkflowError> {
    let reference = ctx
        .effect(book_flight_slowly, trip)
        .compensate_with_output(cancel_flight, |reference: &String| reference.clone())
        .await?;
    Ok(reference)
}

/// Books, then waits on a day-long timer (the run leaves memory meanwhile).
#[workflow]
async fn trip_sleeping(ctx: WorkflowContext, trip: String) -> Result<String, WorkflowError> {
    book_flight_and_hotel(&ctx, &trip).await?;
    ctx.sleep(Duration::from_secs(86_400)).await;
    Ok("slept".into())
}

/// Books, undoes by itself, then fails: nothing is undone twice.
#[workflow]
async fn trip_undone(ctx: WorkflowContext, trip: String) -> Result<String, WorkflowError> {
    book_flight_and_hotel(&ctx, &trip).await?;
    ctx.compensate().await?;
    Err(WorkflowError::new("gave up after undoing"))
}

/// Registers the undo after something else was awaited: too late to be sure it is seen.
#[workflow]
async fn undo_too_late(ctx: WorkflowContext, trip: String) -> Result<String, WorkflowError> {
    let flight = ctx.effect(book_flight, trip.clone());
    ctx.sleep(Duration::from_secs(1)).await;
    let reference = flight.compensate_with(cancel_flight, trip.clone()).await?;
    Ok(reference)
}

fn setup(builder: WorkerBuilder) -> WorkerBuilder {
    builder
        .register(book_trip)
        .register(trip_waiting)
        .register(trip_sleeping)
        .register(trip_undone)
        .register(undo_too_late)
        .register(trip_slow)
        .register(book_flight_slowly)
        .register(book_flight)
        .register(book_hotel)
        .register(book_car)
        .register(cancel_flight)
        .register(cancel_hotel)
}

fn key(wf: &str, effect: &str, argument: &str) -> String {
    format!(r#"{wf}|{effect}|["{argument}"]|v1"#)
}

/// Each effect of the trip, and each undo, happened once downstream.
fn assert_each_once(wf: &str, trip: &str) {
    for (effect, argument) in [
        ("book_flight", trip.to_owned()),
        ("book_hotel", trip.to_owned()),
        ("cancel_hotel", trip.to_owned()),
        ("cancel_flight", "ref-1".to_owned()),
    ] {
        let applied = applied_effects(&key(wf, effect, &argument));
        assert_eq!(applied.len(), 1, "{effect} of {wf}: {applied:?}");
    }
}

fn undone_in_reverse(trip: &str) -> Vec<String> {
    vec![
        format!("book flight {trip}"),
        format!("book hotel {trip}"),
        "cancel hotel ".to_owned() + trip,
        "cancel flight ref-1".to_owned(),
    ]
}

#[tokio::test]
async fn a_failed_workflow_undoes_what_committed_newest_first() {
    let mut env = TestEnv::start(setup).await.unwrap();
    let wf = "compensate-on-failure";
    env.worker()
        .start_with(book_trip, "T1".into(), with_id(wf))
        .await
        .unwrap();
    let error = env.finish(book_trip, wf, 20).await.unwrap().unwrap_err();
    assert!(
        error.to_string().contains("no car left"),
        "the run fails with the effect's error: {error}"
    );
    let mut expected = undone_in_reverse("T1");
    expected.insert(2, "no car for T1".to_owned());
    assert_eq!(called(wf), expected, "the refused car is not undone");
    assert_each_once(wf, "T1");
    insta::assert_snapshot!(env.worker().render_journal(wf).unwrap());
}

/// A crash at each boundary of each undo: after the restart the undos go on where they were,
/// and each effect and each undo happened once.
#[tokio::test]
async fn a_crash_halfway_through_compensating_undoes_each_effect_once() {
    let cases = [
        ("cancel_hotel", Boundary::BeforePrepared),
        ("cancel_hotel", Boundary::AfterCall),
        ("cancel_flight", Boundary::BeforeCall),
        ("cancel_flight", Boundary::AfterCall),
    ];
    for (case, (undo, boundary)) in cases.into_iter().enumerate() {
        let wf = format!("compensate-crash-{case}");
        let crash = PlannedFault::at(undo, 1, boundary, Fault::Crash);
        let mut env = TestEnv::with_faults([crash], setup).await.unwrap();
        env.worker()
            .start_with(book_trip, "T2".into(), with_id(&wf))
            .await
            .unwrap();
        let error = env.finish(book_trip, &wf, 20).await.unwrap().unwrap_err();
        assert!(error.to_string().contains("no car left"), "{wf}: {error}");
        assert_eq!(env.faults().fired().len(), 1, "{wf}: the crash happened");
        let mut expected = undone_in_reverse("T2");
        expected.insert(2, "no car for T2".to_owned());
        assert_eq!(called(&wf), expected, "{wf} ({undo} {boundary:?})");
        assert_each_once(&wf, "T2");
    }
    // The crash after the downstream cancelled was found by asking it, not by calling again.
    assert_eq!(executions("compensate-crash-3", "reconciles"), 1);
}

/// A run waiting for a signal holds no memory: cancelling it replays it to learn its undos
/// (only its code knows them), journals the cancellation, and runs them; a crash in the middle
/// replays the cancellation at the same point and goes on.
#[tokio::test]
async fn a_cancelled_run_undoes_its_effects_across_a_crash() {
    let crash = PlannedFault::at("cancel_flight", 1, Boundary::AfterCall, Fault::Crash);
    let mut env = TestEnv::with_faults([crash], setup).await.unwrap();
    let wf = "compensate-on-cancel";
    env.worker()
        .start_with(trip_waiting, "T3".into(), with_id(wf))
        .await
        .unwrap();
    assert!(waymark_tests::eventually(400, || called(wf).len() == 2).await);
    let waiting = env.finish(trip_waiting, wf, 2).await;
    assert!(waiting.is_none(), "it waits for the signal");
    env.worker()
        .cancel(wf, "the customer called it off")
        .await
        .unwrap();
    let error = env.finish(trip_waiting, wf, 20).await.unwrap().unwrap_err();
    let RunError::Failed(failure) = &error else {
        panic!("expected a cancelled run, got {error}");
    };
    assert_eq!(
        failure.kind,
        waymark::store::FailureKind::Cancelled,
        "{error}"
    );
    assert_eq!(env.faults().fired().len(), 1, "the crash happened");
    assert_eq!(called(wf), undone_in_reverse("T3"));
    assert_each_once(wf, "T3");
    insta::assert_snapshot!(env.worker().render_journal(wf).unwrap());
}

/// A run rebuilt by a restart, waiting on a long timer: cancelling it drops the timer with the
/// code that waited on it, and runs the undos.
#[tokio::test]
async fn a_cancelled_run_drops_its_timer_and_undoes_its_effects() {
    let mut env = TestEnv::start(setup).await.unwrap();
    let wf = "compensate-sleeping";
    env.worker()
        .start_with(trip_sleeping, "T4".into(), with_id(wf))
        .await
        .unwrap();
    assert!(env.wait_for_timer(wf, Duration::from_secs(5)).await);
    env.crash_and_restart().await.unwrap();
    env.worker().cancel(wf, "no longer needed").await.unwrap();
    let error = env
        .finish(trip_sleeping, wf, 20)
        .await
        .unwrap()
        .unwrap_err();
    assert!(error.to_string().contains("no longer needed"), "{error}");
    assert_eq!(called(wf), undone_in_reverse("T4"));
    assert_each_once(wf, "T4");
    // The timer is dropped with the code that waited on it, in the journal too.
    insta::assert_snapshot!(env.worker().render_journal(wf).unwrap());
}

#[tokio::test]
async fn compensate_undoes_once_and_a_later_failure_does_not_undo_again() {
    let mut env = TestEnv::start(setup).await.unwrap();
    let wf = "compensate-explicit";
    env.worker()
        .start_with(trip_undone, "T5".into(), with_id(wf))
        .await
        .unwrap();
    let error = env.finish(trip_undone, wf, 20).await.unwrap().unwrap_err();
    assert!(
        error.to_string().contains("gave up after undoing"),
        "{error}"
    );
    assert_eq!(called(wf), undone_in_reverse("T5"));
    assert_each_once(wf, "T5");
}

#[tokio::test]
async fn an_undo_registered_after_an_await_stops_the_run() {
    let mut env = TestEnv::start(setup).await.unwrap();
    let wf = "compensate-too-late";
    env.worker()
        .start_with(undo_too_late, "T6".into(), with_id(wf))
        .await
        .unwrap();
    let error = env
        .finish(undo_too_late, wf, 20)
        .await
        .unwrap()
        .unwrap_err();
    let RunError::Stuck(stuck) = &error else {
        panic!("expected the run to stop, got {error}");
    };
    assert_eq!(stuck.stop.code, waymark::inspect::StopCode::Misuse);
    assert!(stuck.stop.message.contains("compensate_with"), "{error}");
}

/// Cancelled while the effect is in flight: the undo waits for its outcome, and undoes what
/// committed.
#[tokio::test]
async fn a_cancellation_during_an_effect_undoes_it_once_it_commits() {
    let mut env = TestEnv::start(setup).await.unwrap();
    let wf = "compensate-in-flight";
    waymark_tests::close_gate(wf, "flight");
    env.worker()
        .start_with(trip_slow, "T7".into(), with_id(wf))
        .await
        .unwrap();
    assert!(waymark_tests::eventually(400, || executions(wf, "slow flight") == 1).await);
    env.worker().cancel(wf, "called off").await.unwrap();
    waymark_tests::open_gate(wf, "flight");
    let error = env.finish(trip_slow, wf, 20).await.unwrap().unwrap_err();
    assert!(error.to_string().contains("called off"), "{error}");
    assert_eq!(called(wf), ["book flight T7", "cancel flight ref-1"]);
    let undone = applied_effects(&key(wf, "cancel_flight", "ref-1"));
    assert_eq!(undone.len(), 1, "{undone:?}");
}
