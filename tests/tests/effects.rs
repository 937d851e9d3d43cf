//! Effects under faults: whatever fails or crashes, a side effect happens once per idempotency
//! key, an unknown outcome is reconciled (or waits for an operator) before any retry, and the
//! journal and operation log say why. Each scenario is snapshotted.

use std::time::Duration;

use waymark::inspect::WorkflowStatus;
use waymark::operations::{committed, OperationStatus, OperatorDecision};
use waymark::prelude::*;
use waymark::telemetry::names;
use waymark::testing::TestEnv;
use waymark::WorkerBuilder;
use waymark::{DeleteError, ResolveError};
use waymark_tests::{
    advance_to_next_sweep, applied_effects, awaiting_decision, close_gate, count, eventually,
    executions, hold_poll_while_held, hold_polls, next_fault, open_gate, pass_gate, release_polls,
    script_faults, status_once, sweeps, with_id, Fault,
};

/// Books a carrier: an effect with a reconciler that looks the booking up by key.
#[activity(effect, version = 2, reconcile = find_booking, max_attempts = 3, initial_backoff_ms = 100)]
async fn book(
    cx: ActivityContext,
    #[key] order_id: String,
    carrier: String,
) -> Result<String, ActivityError> {
    call_downstream(&cx, "book", &format!("{order_id} with {carrier}")).await
}

async fn find_booking(
    cx: ActivityContext,
    _order_id: String,
    _carrier: String,
) -> Result<Reconciled<String>, ActivityError> {
    count(cx.workflow_id(), "book.reconciles");
    if next_fault(cx.workflow_id()) == Some(Fault::Unclear) {
        return Ok(Reconciled::StillUnknown("carrier API answered 503".into()));
    }
    Ok(waymark_tests::reconcile_by_key(&cx))
}

/// Books with no retry at all: one attempt, then reconciliation only.
#[activity(effect, reconcile = find_booking, max_attempts = 1)]
async fn book_once(
    cx: ActivityContext,
    #[key] order_id: String,
    carrier: String,
) -> Result<String, ActivityError> {
    call_downstream(&cx, "book", &format!("{order_id} with {carrier}")).await
}

#[workflow]
async fn rebook_once(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    Ok(ctx.effect(book_once, (order_id, "fastship".into())).await?)
}

/// Notifies the warehouse: an effect without a reconciler.
#[activity(effect, max_attempts = 3, initial_backoff_ms = 100)]
async fn notify(
    cx: ActivityContext,
    #[key] order_id: String,
    message: String,
) -> Result<String, ActivityError> {
    call_downstream(&cx, "notify", &format!("{order_id}: {message}")).await
}

/// Retries every 1-2 s, but may not run past 2.5 s after it was scheduled.
#[activity(
    effect,
    max_attempts = 10,
    initial_backoff_ms = 1000,
    deadline_ms = 2500
)]
async fn impatient(cx: ActivityContext, #[key] order_id: String) -> Result<String, ActivityError> {
    call_downstream(&cx, "impatient", &order_id).await
}

/// The fake downstream call shared by the effects: scripted faults first, then gates a test can
/// hold it at (before and after the downstream applied the effect).
async fn call_downstream(
    cx: &ActivityContext,
    name: &str,
    what: &str,
) -> Result<String, ActivityError> {
    let wf = cx.workflow_id();
    let key = cx
        .idempotency_key()
        .expect("an effect has a key")
        .to_owned();
    count(wf, &format!("{name}.calls"));
    match next_fault(wf) {
        Some(Fault::Unavailable) => return Err(ActivityError::retriable("503 from downstream")),
        Some(Fault::Rejected) => return Err(ActivityError::terminal("order is cancelled")),
        Some(Fault::RequestLost) => return Err(ActivityError::uncertain("connection reset")),
        Some(Fault::AckLost) => {
            waymark_tests::apply_effect(&key, what);
            return Err(ActivityError::uncertain(
                "read timed out after the request was sent",
            ));
        }
        Some(Fault::Unclear) | None => {}
    }
    pass_gate(wf, "before-call").await;
    let reference = waymark_tests::apply_effect(&key, what);
    cx.set_external_ref(reference.clone());
    pass_gate(wf, "after-call").await;
    Ok(reference)
}

#[workflow]
async fn rebook(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    Ok(ctx.effect(book, (order_id, "fastship".into())).await?)
}

#[workflow]
async fn rebook_with_timeout(
    ctx: WorkflowContext,
    order_id: String,
) -> Result<String, WorkflowError> {
    let options = ActivityOptions::default()
        .max_attempts(3)
        .start_to_close_timeout(Duration::from_secs(5));
    Ok(ctx
        .activity_with(options, book, (order_id, "fastship".into()))
        .await?)
}

#[workflow]
async fn rebook_twice(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    let first = ctx
        .effect(book, (order_id.clone(), "fastship".into()))
        .await?;
    // The same order again: the same business intent, so the same key.
    let second = ctx.effect(book, (order_id, "fastship".into())).await?;
    Ok(format!("{first} {second}"))
}

/// The same order booked again with another carrier: the key says the same intent, the
/// arguments another call.
#[workflow]
async fn rebook_elsewhere(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    let first = ctx
        .effect(book, (order_id.clone(), "fastship".into()))
        .await?;
    match ctx.effect(book, (order_id, "slowship".into())).await {
        Err(ActivityError::KeyConflict { message }) => Ok(format!("{first}; {message}")),
        other => Ok(format!("{first}; not a conflict: {other:?}")),
    }
}

#[workflow]
async fn rebook_if_delayed(
    ctx: WorkflowContext,
    order_id: String,
) -> Result<String, WorkflowError> {
    let call = ctx.effect(book, (order_id, "fastship".into()));
    Ok(call
        .precondition("order still delayed", || async { false })
        .await?)
}

/// Its precondition's check panics.
#[workflow]
async fn rebook_if_counted(
    ctx: WorkflowContext,
    order_id: String,
) -> Result<String, WorkflowError> {
    let call = ctx.effect(book, (order_id, "fastship".into()));
    let counted = || -> std::future::Ready<bool> { panic!("the count failed") };
    Ok(call.precondition("stock counted", counted).await?)
}

#[workflow]
async fn notify_warehouse(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    Ok(ctx.effect(notify, (order_id, "rebooked".into())).await?)
}

/// Answers `answer` once its gate opens: a plain step that holds its run in memory.
#[activity]
async fn held(cx: ActivityContext, answer: String) -> Result<String, ActivityError> {
    count(cx.workflow_id(), "held.calls");
    pass_gate(cx.workflow_id(), "held").await;
    Ok(answer)
}

/// Round 1 leaves its notification of order C1 waiting for an operator and continues as new
/// into round `then`. At the same seq, round 2 notifies of another order; round 3 runs a plain
/// step instead. Each then notifies of order C1 again: round 1's intent, under its key.
#[workflow]
async fn notify_then_continue(
    ctx: WorkflowContext,
    rounds: (u32, u32),
) -> Result<String, WorkflowError> {
    let (round, then) = rounds;
    let order = |name: &str| (format!("ORD-{name}"), "rebooked".to_owned());
    if round > 1 {
        let first = match round {
            3 => ctx.activity(held, "done".to_owned()).await?,
            _ => ctx.effect(notify, order("C2")).await?,
        };
        let again = ctx.effect(notify, order("C1")).await?;
        return Ok(format!("{first} {again}"));
    }
    let mut call = ctx.effect(notify, order("C1"));
    let mut nap = ctx.sleep(Duration::from_secs(60));
    let answered = waymark::select! {
        done = call => Some(done),
        _ = nap => None,
    };
    match answered {
        Some(done) => Ok(done?),
        None => Err(ctx.continue_as_new(&(then, then))),
    }
}

/// Round 1 gives its notification of order E1 a minute, then continues as new without it.
/// Round 2 waits for `go`, then notifies of the same order: round 1's intent, under its key.
#[workflow]
async fn notify_or_continue(ctx: WorkflowContext, round: u32) -> Result<String, WorkflowError> {
    let order = ("ORD-E1".to_owned(), "rebooked".to_owned());
    if round > 1 {
        let _: String = ctx.signal("go").await?;
        hold_poll_while_held(ctx.workflow_id());
        return Ok(ctx.effect(notify, order).await?);
    }
    // Checked by round 1's call only: a record round 2 takes over keeps it.
    let call = ctx
        .effect(notify, order)
        .precondition("round 1 still current", || async { true });
    call_or_continue(&ctx, call, 2).await
}

/// Gives `call` a minute, then continues as new into round `next` without it.
async fn call_or_continue(
    ctx: &WorkflowContext,
    mut call: waymark::EffectCall<String>,
    next: u32,
) -> Result<String, WorkflowError> {
    let mut nap = ctx.sleep(Duration::from_secs(60));
    let answered = waymark::select! {
        done = call => Some(done),
        _ = nap => None,
    };
    match answered {
        Some(done) => Ok(done?),
        None => Err(ctx.continue_as_new(&next)),
    }
}

/// Round 1 gives its notification of order E9 a minute, then continues as new without it.
/// Round 2 continues as new again at once, from a poll a test can hold. Round 3 waits for `go`,
/// then notifies of the same order: round 1's intent, under its key.
#[workflow]
async fn notify_and_continue_twice(
    ctx: WorkflowContext,
    round: u32,
) -> Result<String, WorkflowError> {
    let order = ("ORD-E9".to_owned(), "rebooked".to_owned());
    match round {
        1 => call_or_continue(&ctx, ctx.effect(notify, order), 2).await,
        2 => {
            hold_poll_while_held(ctx.workflow_id());
            Err(ctx.continue_as_new(&3u32))
        }
        _ => {
            let _: String = ctx.signal("go").await?;
            Ok(ctx.effect(notify, order).await?)
        }
    }
}

/// Retries after ten minutes.
#[activity(effect, initial_backoff_ms = 600_000, max_backoff_ms = 600_000)]
async fn patient(cx: ActivityContext, #[key] order_id: String) -> Result<String, ActivityError> {
    call_downstream(&cx, "patient", &order_id).await
}

/// [`patient`] with a reconciler, which asks the downstream under the attempt's key.
#[activity(effect, reconcile = find_patient, initial_backoff_ms = 600_000, max_backoff_ms = 600_000)]
async fn reconciled_patient(
    cx: ActivityContext,
    #[key] order_id: String,
) -> Result<String, ActivityError> {
    call_downstream(&cx, "patient", &order_id).await
}

async fn find_patient(
    cx: ActivityContext,
    _order_id: String,
) -> Result<Reconciled<String>, ActivityError> {
    count(cx.workflow_id(), "patient.reconciles");
    if next_fault(cx.workflow_id()) == Some(Fault::Unclear) {
        return Ok(Reconciled::StillUnknown(
            "the warehouse API answered 503".into(),
        ));
    }
    Ok(waymark_tests::reconcile_by_key(&cx))
}

#[workflow]
async fn reconciled_patiently(
    ctx: WorkflowContext,
    order_id: String,
) -> Result<String, WorkflowError> {
    Ok(ctx.effect(reconciled_patient, order_id).await?)
}

/// Gives its reconciled effect a minute, then ends without it.
#[workflow]
async fn reconciled_or_give_up(
    ctx: WorkflowContext,
    order_id: String,
) -> Result<String, WorkflowError> {
    let mut call = ctx.effect(reconciled_patient, order_id);
    let mut nap = ctx.sleep(Duration::from_secs(60));
    waymark::select! {
        done = call => Ok(done?),
        _ = nap => Ok("gave up".to_owned()),
    }
}

/// [`patient`] with a reconciler whose first answer comes late ([`find_patient_late`]).
#[activity(effect, reconcile = find_patient_late, initial_backoff_ms = 600_000, max_backoff_ms = 600_000)]
async fn late_reconciled_patient(
    cx: ActivityContext,
    #[key] order_id: String,
) -> Result<String, ActivityError> {
    call_downstream(&cx, "patient", &order_id).await
}

/// Asks the downstream over a slow line: the first answer, about the downstream as it was when
/// asked, arrives once the gate `answer` opens. The downstream cannot tell any later asker.
async fn find_patient_late(
    cx: ActivityContext,
    _order_id: String,
) -> Result<Reconciled<String>, ActivityError> {
    let wf = cx.workflow_id();
    if count(wf, "patient.reconciles") > 1 {
        return Ok(Reconciled::StillUnknown(
            "the warehouse API answered 503".into(),
        ));
    }
    let answer = waymark_tests::reconcile_by_key(&cx);
    pass_gate(wf, "answer").await;
    Ok(answer)
}

/// Round 1 gives its effect a minute, then continues as new without it. Round 2 waits for
/// `go`, then makes the same call: round 1's intent, under its key.
#[workflow]
async fn late_reconciled_or_continue(
    ctx: WorkflowContext,
    round: u32,
) -> Result<String, WorkflowError> {
    let order = "ORD-L1".to_owned();
    if round > 1 {
        let _: String = ctx.signal("go").await?;
        return Ok(ctx.effect(late_reconciled_patient, order).await?);
    }
    let mut call = ctx.effect(late_reconciled_patient, order);
    let mut nap = ctx.sleep(Duration::from_secs(60));
    waymark::select! {
        done = call => Ok(done?),
        _ = nap => Err(ctx.continue_as_new(&2u32)),
    }
}

/// Gives its effect a minute, then ends without it.
#[workflow]
async fn patient_or_give_up(
    ctx: WorkflowContext,
    order_id: String,
) -> Result<String, WorkflowError> {
    let mut call = ctx.effect(patient, order_id);
    let mut nap = ctx.sleep(Duration::from_secs(60));
    waymark::select! {
        done = call => Ok(done?),
        _ = nap => Ok("gave up".to_owned()),
    }
}

#[workflow]
async fn impatient_notify(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    Ok(ctx.effect(impatient, order_id).await?)
}

/// A payment gateway that charges the card and then answers 502 on the first call: the kind of
/// downstream `at_most_once` is for.
async fn charge_then_502(cx: &ActivityContext, order_id: &str) -> Result<String, ActivityError> {
    let charged = waymark_tests::apply_under_key(cx, order_id);
    match count(cx.workflow_id(), "charge.calls") {
        1 => Err(ActivityError::retriable("502 bad gateway")),
        _ => Ok(charged),
    }
}

/// At most once, with a reconciler that asks the gateway by key.
#[activity(effect, at_most_once, reconcile = find_charge, max_attempts = 3, initial_backoff_ms = 100)]
async fn charge_once(
    cx: ActivityContext,
    #[key] order_id: String,
) -> Result<String, ActivityError> {
    charge_then_502(&cx, &order_id).await
}

async fn find_charge(
    cx: ActivityContext,
    _order_id: String,
) -> Result<Reconciled<String>, ActivityError> {
    Ok(waymark_tests::reconcile_by_key(&cx))
}

/// At most once, and nobody can ask the gateway: an operator must settle it.
#[activity(effect, at_most_once, max_attempts = 3, initial_backoff_ms = 100)]
async fn charge_once_unreconciled(
    cx: ActivityContext,
    #[key] order_id: String,
) -> Result<String, ActivityError> {
    charge_then_502(&cx, &order_id).await
}

/// The same gateway behind an ordinary effect: a 502 is retried.
#[activity(effect, max_attempts = 3, initial_backoff_ms = 100)]
async fn charge_retried(
    cx: ActivityContext,
    #[key] order_id: String,
) -> Result<String, ActivityError> {
    charge_then_502(&cx, &order_id).await
}

#[workflow]
async fn pay(ctx: WorkflowContext, how: String) -> Result<String, WorkflowError> {
    let order_id = "ORD-80".to_owned();
    Ok(match how.as_str() {
        "once" => ctx.effect(charge_once, order_id).await?,
        "unreconciled" => ctx.effect(charge_once_unreconciled, order_id).await?,
        _ => ctx.effect(charge_retried, order_id).await?,
    })
}

async fn env() -> TestEnv {
    let setup = |b: WorkerBuilder| {
        b.register(rebook)
            .register(rebook_once)
            .register(book_once)
            .register(pay)
            .register(charge_once)
            .register(charge_once_unreconciled)
            .register(charge_retried)
            .register(rebook_twice)
            .register(rebook_elsewhere)
            .register(rebook_with_timeout)
            .register(rebook_if_delayed)
            .register(rebook_if_counted)
            .register(notify_warehouse)
            .register(impatient_notify)
            .register(notify_then_continue)
            .register(notify_or_continue)
            .register(notify_and_continue_twice)
            .register(patient_or_give_up)
            .register(patient)
            .register(reconciled_or_give_up)
            .register(reconciled_patient)
            .register(reconciled_patiently)
            .register(late_reconciled_or_continue)
            .register(late_reconciled_patient)
            .register(held)
            .register(book)
            .register(notify)
            .register(impatient)
    };
    TestEnv::start(setup).await.unwrap()
}

/// The key `book` uses for `order_id` in workflow `wf`.
fn book_key(wf: &str, order_id: &str) -> String {
    format!(r#"{wf}|book|["{order_id}"]|v2"#)
}

fn notify_key(wf: &str, order_id: &str) -> String {
    format!(r#"{wf}|notify|["{order_id}"]|v1"#)
}

/// Waits for the run while moving the manual clock, so that retries and rechecks fire.
async fn finish<T: serde::de::DeserializeOwned>(
    env: &TestEnv,
    run: &waymark::RunHandle<T>,
) -> Result<T, RunError> {
    for _ in 0..400 {
        let waited = tokio::time::timeout(Duration::from_millis(10), run.result()).await;
        if let Ok(result) = waited {
            return result;
        }
        env.advance(Duration::from_millis(250)).await;
    }
    panic!("workflow {} did not finish", run.id());
}

/// The journal and the operation log of `wf`, for a snapshot.
/// An operator commits the operation under `key`, with `reference` as its result.
async fn commit_as_operator(env: &TestEnv, key: &str, reference: &str) {
    let decision = committed(&reference).unwrap();
    env.worker()
        .resolve_operation(key, decision, "ops@example")
        .await
        .unwrap();
}

/// Asserts that a decision about `key` is refused: the operation is committed already.
async fn refused_as_committed(env: &TestEnv, key: &str) {
    let again = env
        .worker()
        .resolve_operation(key, OperatorDecision::NotFound, "ops@example")
        .await
        .unwrap_err();
    assert_eq!(
        again.to_string(),
        format!("operation `{key}` is committed, not awaiting an operator")
    );
}

/// Moves the clock until `wf` waits for an operator (its reconciler's rechecks are due by
/// then), or gives up after 50 s of its time.
async fn wait_until_parked(env: &TestEnv, wf: &str) {
    let parked = || !env.worker().awaiting_operator(wf).unwrap().is_empty();
    advance_until(env, Duration::from_millis(250), parked).await;
}

/// The status of the operation log's record for `key`.
fn status_of(env: &TestEnv, key: &str) -> &'static str {
    env.worker().operation(key).unwrap().unwrap().status.name()
}

/// Moves the clock by `step` until `done` holds, at most 200 times; whether it holds.
async fn advance_until(env: &TestEnv, step: Duration, done: impl Fn() -> bool) -> bool {
    for _ in 0..200 {
        if done() {
            return true;
        }
        env.advance(step).await;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    done()
}

fn record(env: &TestEnv, wf: &str) -> String {
    let worker = env.worker();
    let journal = worker.render_journal(wf).unwrap();
    let operations = worker.render_operations(wf).unwrap();
    format!("{journal}--- operations\n{operations}")
}

#[tokio::test]
async fn a_lost_acknowledgement_is_reconciled_not_called_again() {
    let env = env().await;
    let wf = "ack-lost";
    script_faults(wf, &[Fault::AckLost]);
    let run = env
        .worker()
        .start_with(rebook, "ORD-1".into(), with_id(wf))
        .await
        .unwrap();
    assert_eq!(finish(&env, &run).await.unwrap(), "ref-1");
    assert_eq!(applied_effects(&book_key(wf, "ORD-1")).len(), 1);
    assert_eq!(executions(wf, "book.calls"), 1);
    assert_eq!(executions(wf, "book.reconciles"), 1);
    insta::assert_snapshot!(record(&env, wf));
}

#[tokio::test]
async fn a_timeout_after_the_work_is_reconciled_not_called_again() {
    let env = env().await;
    let wf = "timeout-after-work";
    close_gate(wf, "after-call");
    let run = env
        .worker()
        .start_with(rebook_with_timeout, "ORD-2".into(), with_id(wf))
        .await
        .unwrap();
    let key = book_key(wf, "ORD-2");
    assert!(eventually(400, || applied_effects(&key).len() == 1).await);
    // The downstream did the work; its answer never comes back before the timeout.
    assert_eq!(finish(&env, &run).await.unwrap(), "ref-1");
    open_gate(wf, "after-call");
    assert_eq!(applied_effects(&key).len(), 1);
    assert_eq!(executions(wf, "book.calls"), 1);
    insta::assert_snapshot!(record(&env, wf));
    // The audit trail: every transition with its time and who settled it, and the reference
    // the timed-out attempt learnt kept through the reconciler's commit.
    let op = env.worker().operation(&key).unwrap().unwrap();
    let trail: Vec<(&str, Option<&str>)> = op
        .history
        .iter()
        .map(|e| (e.status.as_str(), e.by.as_deref()))
        .collect();
    let reconciled = Some("reconciler");
    let expected = [
        ("prepared", None),
        ("unknown_outcome", None),
        ("committed", reconciled),
    ];
    assert_eq!(trail, expected);
    assert!(op.history.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
    assert!(!op.history[1].note.is_empty(), "the cause is noted");
    assert_eq!(op.external_ref.as_deref(), Some("ref-1"));
}

#[tokio::test]
async fn a_timed_out_attempt_is_cancelled_before_it_is_reconciled_and_retried() {
    let env = env().await;
    let wf = "timeout-before-work";
    close_gate(wf, "before-call");
    let run = env
        .worker()
        .start_with(rebook_with_timeout, "ORD-15".into(), with_id(wf))
        .await
        .unwrap();
    assert!(eventually(400, || executions(wf, "book.calls") == 1).await);
    // Attempt 1 hangs before the downstream; it times out and the reconciler finds nothing.
    env.advance(Duration::from_secs(6)).await;
    let retrying = || {
        let journal = env.worker().journal(wf).unwrap_or_default();
        journal
            .iter()
            .any(|entry| matches!(entry, waymark::inspect::Entry::ActivityAttemptFailed { .. }))
    };
    assert!(eventually(400, retrying).await);
    // Were attempt 1 still alive, opening the gate would let it reach the downstream too.
    open_gate(wf, "before-call");
    assert_eq!(finish(&env, &run).await.unwrap(), "ref-1");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let key = book_key(wf, "ORD-15");
    assert_eq!(
        applied_effects(&key).len(),
        1,
        "the timed-out attempt did not run on"
    );
    assert_eq!(executions(wf, "book.calls"), 2);
    insta::assert_snapshot!(record(&env, wf));
}

#[tokio::test]
async fn a_definite_failure_then_success_is_one_effect_under_one_key() {
    let env = env().await;
    let wf = "retry-then-ok";
    script_faults(wf, &[Fault::Unavailable]);
    let run = env
        .worker()
        .start_with(rebook, "ORD-3".into(), with_id(wf))
        .await
        .unwrap();
    assert_eq!(finish(&env, &run).await.unwrap(), "ref-1");
    assert_eq!(applied_effects(&book_key(wf, "ORD-3")).len(), 1);
    assert_eq!(executions(wf, "book.calls"), 2);
    assert_eq!(executions(wf, "book.reconciles"), 0);
    insta::assert_snapshot!(record(&env, wf));
}

#[tokio::test]
async fn a_terminal_failure_fails_the_workflow_with_its_cause() {
    let env = env().await;
    let wf = "terminal";
    script_faults(wf, &[Fault::Rejected]);
    let run = env
        .worker()
        .start_with(rebook, "ORD-4".into(), with_id(wf))
        .await
        .unwrap();
    let error = finish(&env, &run).await.unwrap_err();
    assert_eq!(
        error.to_string(),
        "workflow failed: activity failed: terminal: order is cancelled"
    );
    assert_eq!(executions(wf, "book.calls"), 1);
    assert!(applied_effects(&book_key(wf, "ORD-4")).is_empty());
    insta::assert_snapshot!(record(&env, wf));
}

#[tokio::test]
async fn an_unknown_outcome_without_reconciler_waits_for_an_operator() {
    let mut env = env().await;
    let wf = "operator-commits";
    script_faults(wf, &[Fault::AckLost]);
    let run = env
        .worker()
        .start_with(notify_warehouse, "ORD-5".into(), with_id(wf))
        .await
        .unwrap();
    let key = notify_key(wf, "ORD-5");
    assert!(
        eventually(400, || !env
            .worker()
            .awaiting_operator(wf)
            .unwrap()
            .is_empty())
        .await
    );
    let status = env.worker().workflow_status(wf).unwrap();
    assert_eq!(status, Some(WorkflowStatus::AwaitingOperator));

    // Parked across a restart: nothing is called again while it waits.
    env.crash_and_restart().await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(executions(wf, "notify.calls"), 1);

    // A result of the wrong type is refused before anything is journaled.
    let wrong_type = committed(&7_u8).unwrap();
    let refused = env
        .worker()
        .resolve_operation(&key, wrong_type, "ops@example")
        .await
        .unwrap_err();
    assert!(
        matches!(refused, ResolveError::ResultMismatch { .. }),
        "{refused}"
    );
    // So is a decision about an attempt other than the one that is waiting.
    let stale = env
        .worker()
        .resolve_operation_at(&key, 2, OperatorDecision::NotFound, "ops@example")
        .await
        .unwrap_err();
    assert_eq!(
        stale.to_string(),
        format!("operation `{key}` is at attempt 1, not attempt 2; read it again")
    );

    // The operator checked the warehouse: the notification went out as `ref-1`.
    commit_as_operator(&env, &key, "ref-1").await;
    let run = env.worker().handle(notify_warehouse, run.id());
    assert_eq!(finish(&env, &run).await.unwrap(), "ref-1");
    assert_eq!(applied_effects(&key).len(), 1);
    refused_as_committed(&env, &key).await;
    insta::assert_snapshot!(record(&env, wf));
}

/// A run that continues as new numbers its commands again, and the operation log keeps the
/// earlier run's records: a decision about one of them settles that record alone. Landing on
/// the command that holds its seq now would call that command's effect again.
#[tokio::test]
async fn a_decision_about_an_earlier_runs_operation_settles_its_record_alone() {
    let env = env().await;
    let wf = "operator-earlier-run";
    script_faults(wf, &[Fault::AckLost, Fault::AckLost]);
    let run = env
        .worker()
        .start_with(notify_then_continue, (1, 2), with_id(wf))
        .await
        .unwrap();
    let (earlier, current) = (notify_key(wf, "ORD-C1"), notify_key(wf, "ORD-C2"));
    let both_parked = || {
        let parked = env.worker().awaiting_operator(wf).unwrap();
        let keys: Vec<&str> = parked.iter().map(|(key, _)| key.as_str()).collect();
        keys.contains(&earlier.as_str()) && keys.contains(&current.as_str())
    };
    let parked = advance_until(&env, Duration::from_secs(5), both_parked).await;
    assert!(parked, "both runs' notifications wait for an operator");
    let parked = env.worker().awaiting_operator(wf).unwrap();
    let seq_of = |key: &str| parked.iter().find(|(k, _)| k == key).map(|(_, r)| r.seq);
    assert_eq!(
        seq_of(&earlier),
        seq_of(&current),
        "the same seq in each run"
    );

    commit_as_operator(&env, &earlier, "ref-0").await;
    assert_eq!(status_of(&env, &earlier), "committed");
    let waiting = env.worker().awaiting_operator(wf).unwrap();
    let waiting: Vec<&str> = waiting.iter().map(|(key, _)| key.as_str()).collect();
    assert_eq!(waiting, [current.as_str()]);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(executions(wf, "notify.calls"), 2);
    assert_eq!(applied_effects(&current).len(), 1);
    assert_eq!(status_of(&env, &current), "awaiting_operator");
    refused_as_committed(&env, &earlier).await;

    // The current one's own decision still applies; round 1's intent, issued again, is
    // answered from its record without a call.
    commit_as_operator(&env, &current, "ref-1").await;
    let run = env.worker().handle(notify_then_continue, run.id());
    assert_eq!(finish(&env, &run).await.unwrap(), "ref-1 ref-0");
    assert_eq!(executions(wf, "notify.calls"), 2);
    assert_eq!(applied_effects(&current).len(), 1);
    assert_eq!(applied_effects(&earlier).len(), 1);
}

/// The same when a plain step of the current run holds that seq. Found not to have taken
/// effect (its request was lost), the record says who found it and leaves its key free: the
/// intent, issued again, is called, and takes effect once.
#[tokio::test]
async fn a_decision_about_an_earlier_runs_operation_settles_it_where_a_plain_step_holds_its_seq() {
    let env = env().await;
    let wf = "operator-earlier-run-step";
    script_faults(wf, &[Fault::RequestLost]);
    close_gate(wf, "held");
    let run = env
        .worker()
        .start_with(notify_then_continue, (1, 3), with_id(wf))
        .await
        .unwrap();
    let earlier = notify_key(wf, "ORD-C1");
    let kept = format!("{wf}#run-1");
    let continued = || {
        let parked = env.worker().awaiting_operator(wf).unwrap();
        let waits = parked.iter().any(|(key, _)| *key == earlier);
        let stepping = executions(wf, "held.calls") == 1;
        waits && stepping && env.worker().workflow_status(&kept).unwrap().is_some()
    };
    let continued = advance_until(&env, Duration::from_secs(5), continued).await;
    assert!(
        continued,
        "run 1 parked its notification; run 2 is at its step"
    );
    env.worker()
        .resolve_operation(&earlier, OperatorDecision::NotFound, "ops@example")
        .await
        .unwrap();
    let record = env.worker().operation(&earlier).unwrap().unwrap();
    assert_eq!(record.status.name(), "not_attempted");
    let last = record.history.last().unwrap();
    assert_eq!(last.by.as_deref(), Some("operator:ops@example"));
    assert_eq!(executions(wf, "notify.calls"), 1);
    open_gate(wf, "held");
    let run = env.worker().handle(notify_then_continue, run.id());
    assert_eq!(finish(&env, &run).await.unwrap(), "done ref-1");
    assert_eq!(executions(wf, "notify.calls"), 2);
    assert_eq!(applied_effects(&earlier).len(), 1);
    assert_eq!(status_of(&env, &earlier), "committed");
}

/// `notify_or_continue` started as `wf`, its notification's call held in flight until the
/// run continued as new; the run and the notification's key.
async fn continued_with_notification_in_flight(
    env: &TestEnv,
    wf: &str,
) -> (waymark::RunHandle<String>, String) {
    continued_in_flight(env, wf, notify_or_continue, "ORD-E1").await
}

/// `workflow` started as `wf` at round 1, its notification of `order` held in flight until
/// the run continued as new; the run and the notification's key.
async fn continued_in_flight<W>(
    env: &TestEnv,
    wf: &str,
    workflow: W,
    order: &str,
) -> (waymark::RunHandle<String>, String)
where
    W: waymark::Workflow<Input = u32, Output = String>,
{
    close_gate(wf, "after-call");
    let run = env
        .worker()
        .start_with(workflow, 1, with_id(wf))
        .await
        .unwrap();
    let key = notify_key(wf, order);
    assert!(eventually(400, || executions(wf, "notify.calls") == 1).await);
    // The next run starts in the write that leaves the record.
    let next_run = || {
        let journal = env.worker().journal(wf).unwrap();
        matches!(journal.get(1), Some(waymark::inspect::Entry::Forked(_)))
    };
    let continued = advance_until(env, Duration::from_secs(5), next_run).await;
    assert!(continued, "the nap won, and the run continued as new");
    (run, key)
}

/// A run that continues as new while its effect's call is in flight stops that call with it:
/// the record it leaves waits for an operator, whose decision answers the next run's same
/// intent. Left `prepared`, it would hold the key with nobody able to settle it.
#[tokio::test]
async fn a_run_that_continues_during_its_effects_call_leaves_it_to_an_operator() {
    let env = env().await;
    let wf = "operator-run-left-call";
    let (run, key) = continued_with_notification_in_flight(&env, wf).await;
    let record = env.worker().operation(&key).unwrap().unwrap();
    let OperationStatus::AwaitingOperator { reason } = &record.status else {
        panic!("left {}", record.status.name());
    };
    assert!(reason.contains("the run ended while attempt 1"), "{reason}");

    // Sent while the workflow may still be moving to its next run: that run is handed it.
    let decision = committed(&"ref-1").unwrap();
    env.worker()
        .resolve_operation(&key, decision, "ops@example")
        .await
        .unwrap();
    env.worker().signal(wf, "go", "go-1", &"now").await.unwrap();
    let run = env.worker().handle(notify_or_continue, run.id());
    assert_eq!(finish(&env, &run).await.unwrap(), "ref-1");
    assert_eq!(executions(wf, "notify.calls"), 1);
    assert_eq!(applied_effects(&key).len(), 1);
    open_gate(wf, "after-call");
}

/// The next run issues the intent its earlier run left to an operator before anyone decided:
/// it takes the record over and waits for the decision, which then reaches it. It neither
/// calls again nor fails with the key in use.
#[tokio::test]
async fn a_next_run_that_issues_the_intent_again_waits_for_the_decision_left_to_an_operator() {
    let env = env().await;
    let wf = "operator-next-run-takes-over";
    let (run, key) = continued_with_notification_in_flight(&env, wf).await;
    let left = env.worker().operation(&key).unwrap().unwrap();
    assert_eq!(left.status.name(), "awaiting_operator");
    assert_eq!(
        awaiting_decision(&env, &key),
        Some("awaiting_operator"),
        "listed for the operators while the next run waits for its signal"
    );

    env.worker().signal(wf, "go", "go-1", &"now").await.unwrap();
    let taken = || {
        let record = env.worker().operation(&key).unwrap().unwrap();
        let status = env.worker().workflow_status(wf).unwrap();
        record.seq != left.seq && status == Some(WorkflowStatus::AwaitingOperator)
    };
    assert!(
        eventually(400, taken).await,
        "the next run took the record over"
    );
    let record = env.worker().operation(&key).unwrap().unwrap();
    assert_eq!(
        record.status, left.status,
        "still waiting for the same decision"
    );

    let decision = committed(&"ref-1").unwrap();
    env.worker()
        .resolve_operation(&key, decision, "ops@example")
        .await
        .unwrap();
    let run = env.worker().handle(notify_or_continue, run.id());
    assert_eq!(finish(&env, &run).await.unwrap(), "ref-1");
    assert_eq!(executions(wf, "notify.calls"), 1);
    assert_eq!(applied_effects(&key).len(), 1);
    open_gate(wf, "after-call");
}

/// A decision read while the record still named the earlier run's command, and applied
/// after the next run took the record over, reaches the command that took it over: settled
/// alone, it would leave that command waiting for a decision already made.
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_decision_read_before_the_next_run_took_the_record_over_reaches_it() {
    let env = env().await;
    let wf = "operator-decision-meets-take-over";
    let (run, key) = continued_with_notification_in_flight(&env, wf).await;
    let left = env.worker().operation(&key).unwrap().unwrap();
    // The next run is up (the ending run's mailbox would drop the decision unanswered).
    let next_run_waits = WorkflowStatus::AwaitingSignal;
    assert_eq!(
        status_once(&env, wf, next_run_waits).await,
        Some(next_run_waits)
    );
    hold_polls(wf);
    env.worker().signal(wf, "go", "go-1", &"now").await.unwrap();

    // The run is held in the poll that will take the record over; the decision reads the
    // record as the earlier run left it, and waits in the run's mailbox.
    let decision = committed(&"ref-1").unwrap();
    let decided = env
        .worker()
        .resolve_operation(&key, decision, "ops@example");
    let release = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let record = env.worker().operation(&key).unwrap().unwrap();
        assert_eq!(record.seq, left.seq, "not taken over yet");
        release_polls(wf);
    };
    let (decided, ()) = tokio::join!(decided, release);
    decided.unwrap();
    let run = env.worker().handle(notify_or_continue, run.id());
    assert_eq!(finish(&env, &run).await.unwrap(), "ref-1");
    let record = env.worker().operation(&key).unwrap().unwrap();
    assert_ne!(record.seq, left.seq, "settled as the new command's");
    assert_eq!(record.status.name(), "committed");
    assert_eq!(
        record.preconditions,
        ["round 1 still current"],
        "what the call ran under"
    );
    assert_eq!(executions(wf, "notify.calls"), 1);
    assert_eq!(applied_effects(&key).len(), 1);
    open_gate(wf, "after-call");
}

/// A run that ends while its effect's call is in flight stops that call with it, and leaves its
/// record waiting for an operator. No run of the workflow takes the decision, so the store
/// applies it to the record, once.
#[tokio::test]
async fn a_run_that_ends_during_its_effects_call_leaves_it_to_an_operator() {
    let env = env().await;
    let wf = "operator-ended-run-call";
    close_gate(wf, "after-call");
    let run = env
        .worker()
        .start_with(patient_or_give_up, "ORD-E3".into(), with_id(wf))
        .await
        .unwrap();
    assert!(eventually(400, || executions(wf, "patient.calls") == 1).await);
    assert_eq!(finish(&env, &run).await.unwrap(), "gave up");
    let key = format!(r#"{wf}|patient|["ORD-E3"]|v1"#);
    let waiting = env.worker().awaiting_operator(wf).unwrap();
    let Some((_, record)) = waiting.iter().find(|(k, _)| *k == key) else {
        panic!("{waiting:?}");
    };
    let OperationStatus::AwaitingOperator { reason } = &record.status else {
        panic!("left {}", record.status.name());
    };
    assert!(reason.contains("the run ended while attempt 1"), "{reason}");
    assert_eq!(
        awaiting_decision(&env, &key),
        Some("awaiting_operator"),
        "listed for the operators, though its workflow completed"
    );
    // The record is the only trace of the call: the ended workflow is kept while it waits.
    let kept = env.worker().delete(wf).await.unwrap_err();
    let DeleteError::Unsettled { keys, .. } = &kept else {
        panic!("{kept}");
    };
    assert_eq!(keys, std::slice::from_ref(&key));
    assert_eq!(
        env.worker().workflow_status(wf).unwrap(),
        Some(WorkflowStatus::Completed)
    );

    commit_as_operator(&env, &key, "ref-1").await;
    let record = env.worker().operation(&key).unwrap().unwrap();
    assert_eq!(record.status.name(), "committed");
    let last = record.history.last().unwrap();
    assert_eq!(last.by.as_deref(), Some("operator:ops@example"));
    assert_eq!(awaiting_decision(&env, &key), None, "decided");
    refused_as_committed(&env, &key).await;
    assert_eq!(executions(wf, "patient.calls"), 1);
    env.worker().delete(wf).await.unwrap();
    assert_eq!(env.worker().workflow_status(wf).unwrap(), None);
    open_gate(wf, "after-call");
}

/// The sweep asks the reconciler about a call a run left when it ended, as it asks about one a
/// run waits on, once the record has stood still for a sweep interval (the call may still be
/// on its way): the downstream tells, and the record is settled without an operator though the
/// workflow completed.
#[tokio::test]
async fn the_sweep_settles_a_call_a_run_left_when_it_ended() {
    let env = env().await;
    let wf = "swept-ended-run-call";
    close_gate(wf, "after-call");
    // Sweeps come every 60 s from the start; the call is cut off 40 s after the first.
    env.advance(Duration::from_secs(40)).await;
    let run = env
        .worker()
        .start_with(reconciled_or_give_up, "ORD-E4".into(), with_id(wf))
        .await
        .unwrap();
    assert!(eventually(400, || executions(wf, "patient.calls") == 1).await);
    assert_eq!(finish(&env, &run).await.unwrap(), "gave up");
    let key = format!(r#"{wf}|reconciled_patient|["ORD-E4"]|v1"#);
    assert!(
        eventually(400, || sweeps(&env) >= 1.0).await,
        "while the call ran"
    );
    assert!(advance_to_next_sweep(&env).await);
    assert_eq!(
        (executions(wf, "patient.reconciles"), status_of(&env, &key)),
        (0, "awaiting_operator"),
        "cut off 20 s before that sweep: not asked yet"
    );
    let swept = || status_of(&env, &key) == "committed";
    let settled = advance_until(&env, Duration::from_secs(10), swept).await;
    assert!(settled, "left {}", status_of(&env, &key));
    let record = env.worker().operation(&key).unwrap().unwrap();
    let trail: Vec<(&str, Option<&str>)> = record
        .history
        .iter()
        .map(|event| (event.status.as_str(), event.by.as_deref()))
        .collect();
    assert_eq!(
        trail,
        [
            ("prepared", None),
            ("awaiting_operator", None),
            ("committed", Some("reconciler"))
        ]
    );
    let OperationStatus::Committed { result, .. } = &record.status else {
        unreachable!("committed, as its history says");
    };
    assert_eq!(
        result.decode::<String>().unwrap(),
        "ref-1",
        "what the downstream did"
    );
    assert_eq!(executions(wf, "patient.reconciles"), 1);
    assert_eq!(executions(wf, "patient.calls"), 1, "never called again");
    assert_eq!(awaiting_decision(&env, &key), None, "settled");
    assert_eq!(
        env.worker().workflow_status(wf).unwrap(),
        Some(WorkflowStatus::Completed)
    );
    open_gate(wf, "after-call");
}

/// An unknown outcome its run rechecks on its own schedule is not swept: the run's reconciler
/// alone asks the downstream, and the sweep does not settle the record under it.
#[tokio::test]
async fn the_sweep_leaves_an_unknown_outcome_to_the_run_that_rechecks_it() {
    let env = env().await;
    let wf = "swept-not-while-rechecked";
    script_faults(wf, &[Fault::AckLost, Fault::Unclear]);
    let run = env
        .worker()
        .start_with(reconciled_patiently, "ORD-E5".into(), with_id(wf))
        .await
        .unwrap();
    let key = format!(r#"{wf}|reconciled_patient|["ORD-E5"]|v1"#);
    let rechecked = || executions(wf, "patient.reconciles") == 1;
    assert!(eventually(400, rechecked).await);
    assert_eq!(status_of(&env, &key), "unknown_outcome");
    // Two sweeps, at 60 s and 120 s; the run's recheck is five to ten minutes away.
    assert!(advance_to_next_sweep(&env).await && advance_to_next_sweep(&env).await);
    assert_eq!(executions(wf, "patient.reconciles"), 1, "not swept");
    assert_eq!(status_of(&env, &key), "unknown_outcome");
    let committed = || status_of(&env, &key) == "committed";
    let settled = advance_until(&env, Duration::from_secs(60), committed).await;
    assert!(settled, "the run's recheck");
    assert_eq!(finish(&env, &run).await.unwrap(), "ref-1");
    assert_eq!(executions(wf, "patient.reconciles"), 2);
    assert_eq!(executions(wf, "patient.calls"), 1);
}

/// A decision sent while its workflow continues as new is the workflow's, not the ending
/// run's: the next run is handed it and applies it (here, to the record an earlier run left),
/// where the caller used to hear that no run took it.
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_decision_sent_as_its_workflow_continues_as_new_reaches_the_next_run() {
    let env = env().await;
    let wf = "operator-decision-meets-continue";
    hold_polls(wf);
    let (run, key) = continued_in_flight(&env, wf, notify_and_continue_twice, "ORD-E9").await;
    assert_eq!(
        status_of(&env, &key),
        "awaiting_operator",
        "left by round 1"
    );

    // Round 2 is held in the poll that continues as new again: the decision waits in its
    // mailbox until the run has given way to round 3 (a decision that took over a second to
    // get there would reach round 3 itself, and the test would pass without a hand-over).
    let decision = committed(&"ref-1").unwrap();
    let decided = env
        .worker()
        .resolve_operation(&key, decision, "ops@example");
    let release = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        release_polls(wf);
    };
    let (decided, ()) = tokio::join!(decided, release);
    decided.unwrap();
    assert_eq!(status_of(&env, &key), "committed");
    env.worker().signal(wf, "go", "go-1", &"now").await.unwrap();
    let run = env.worker().handle(notify_and_continue_twice, run.id());
    assert_eq!(finish(&env, &run).await.unwrap(), "ref-1");
    assert_eq!(executions(wf, "notify.calls"), 1);
    assert_eq!(applied_effects(&key).len(), 1);
    open_gate(wf, "after-call");
}

/// A cancellation sent while its workflow continues as new cancels the workflow: the next run
/// is handed it, and ends cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_cancellation_sent_as_its_workflow_continues_as_new_ends_the_next_run() {
    let env = env().await;
    let wf = "cancel-meets-continue";
    hold_polls(wf);
    let (run, _) = continued_in_flight(&env, wf, notify_and_continue_twice, "ORD-E9").await;
    // Round 2 is held in the poll that continues as new again, the cancellation in its mailbox.
    let cancelled = env.worker().cancel(wf, "customer withdrew");
    let release = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        release_polls(wf);
    };
    let (cancelled, ()) = tokio::join!(cancelled, release);
    cancelled.unwrap();
    let run = env.worker().handle(notify_and_continue_twice, run.id());
    let ended = tokio::time::timeout(Duration::from_secs(10), run.result()).await;
    let failure = ended.unwrap().unwrap_err();
    assert!(
        failure.to_string().contains("customer withdrew"),
        "{failure}"
    );
    assert_eq!(
        env.worker().workflow_status(wf).unwrap(),
        Some(WorkflowStatus::Failed)
    );
    assert_eq!(executions(wf, "notify.calls"), 1);
    open_gate(wf, "after-call");
}

/// The sweep's answer is about the call it asked after. One that arrives once the key was
/// settled and its intent issued again, at the same attempt number, is refused: "not found"
/// about the earlier call would have the later one, which took effect, made again.
#[tokio::test]
async fn a_sweeps_late_answer_does_not_settle_a_later_call_of_the_key() {
    let env = env().await;
    let wf = "swept-late-answer";
    close_gate(wf, "before-call");
    close_gate(wf, "answer");
    let run = env
        .worker()
        .start_with(late_reconciled_or_continue, 1, with_id(wf))
        .await
        .unwrap();
    let key = format!(r#"{wf}|late_reconciled_patient|["ORD-L1"]|v1"#);
    assert!(eventually(400, || executions(wf, "patient.calls") == 1).await);
    let next_run_waits = || {
        let status = env.worker().workflow_status(wf).unwrap();
        status == Some(WorkflowStatus::AwaitingSignal)
    };
    assert!(advance_until(&env, Duration::from_secs(5), next_run_waits).await);
    assert_eq!(status_of(&env, &key), "awaiting_operator", "cut off");
    let cut_off = env.worker().operation(&key).unwrap().unwrap();

    // A sweep asks about the cut-off call; the downstream, which never saw it, answers "not
    // found", and the answer is on its way back.
    let asked = || executions(wf, "patient.reconciles") == 1;
    assert!(advance_until(&env, Duration::from_secs(1), asked).await);
    let passes = sweeps(&env);
    env.worker()
        .resolve_operation(&key, OperatorDecision::NotFound, "ops@example")
        .await
        .unwrap();
    assert_eq!(status_of(&env, &key), "not_attempted", "the key is free");
    // The next run issues the intent again: attempt 1 of a new call, which takes effect, but
    // whose answer is lost. The run's reconciler cannot tell.
    script_faults(wf, &[Fault::AckLost]);
    env.worker().signal(wf, "go", "go-1", &"now").await.unwrap();
    let rechecked = || executions(wf, "patient.reconciles") == 2;
    assert!(eventually(400, rechecked).await);
    assert_eq!(status_of(&env, &key), "unknown_outcome");
    let before = env.worker().operation(&key).unwrap().unwrap();
    assert_eq!(before.attempt, cut_off.attempt, "the same attempt number");
    // So is a person's decision made on the record as it was then.
    let stale = env
        .worker()
        .resolve_operation_as_read(&key, &cut_off, OperatorDecision::NotFound, "ops@example")
        .await
        .unwrap_err();
    assert!(
        matches!(stale, ResolveError::StaleRevision { .. }),
        "{stale}"
    );

    open_gate(wf, "answer");
    assert!(eventually(400, || sweeps(&env) > passes).await);
    let record = env.worker().operation(&key).unwrap().unwrap();
    assert_eq!(
        record.history, before.history,
        "the late answer settled nothing"
    );
    assert_eq!(applied_effects(&key).len(), 1);

    let decision = committed(&"ref-1").unwrap();
    env.worker()
        .resolve_operation_as_read(&key, &record, decision, "ops@example")
        .await
        .unwrap();
    let run = env.worker().handle(late_reconciled_or_continue, run.id());
    assert_eq!(finish(&env, &run).await.unwrap(), "ref-1");
    assert_eq!(executions(wf, "patient.calls"), 2, "never called again");
    assert_eq!(applied_effects(&key).len(), 1);
    open_gate(wf, "before-call");
}

/// A run that ends while its effect waits to retry after a failed attempt frees the key: the
/// downstream did not act on it, and nothing will retry it.
#[tokio::test]
async fn a_run_that_ends_before_its_effects_retry_frees_its_key() {
    let env = env().await;
    let wf = "operator-run-left-retry";
    script_faults(wf, &[Fault::Unavailable]);
    let run = env
        .worker()
        .start_with(patient_or_give_up, "ORD-E2".into(), with_id(wf))
        .await
        .unwrap();
    assert_eq!(finish(&env, &run).await.unwrap(), "gave up");
    assert_eq!(executions(wf, "patient.calls"), 1);
    let key = format!(r#"{wf}|patient|["ORD-E2"]|v1"#);
    let record = env.worker().operation(&key).unwrap().unwrap();
    let OperationStatus::NotAttempted { failure } = &record.status else {
        panic!("left {}", record.status.name());
    };
    assert!(
        failure.message.contains("the run ended before retrying"),
        "{failure:?}"
    );
}

#[tokio::test]
async fn an_operator_can_send_a_lost_request_again_under_the_same_key() {
    let env = env().await;
    let wf = "operator-retries";
    script_faults(wf, &[Fault::RequestLost]);
    let run = env
        .worker()
        .start_with(notify_warehouse, "ORD-6".into(), with_id(wf))
        .await
        .unwrap();
    let key = notify_key(wf, "ORD-6");
    assert!(
        eventually(400, || !env
            .worker()
            .awaiting_operator(wf)
            .unwrap()
            .is_empty())
        .await
    );
    env.worker()
        .resolve_operation(&key, OperatorDecision::NotFound, "ops@example")
        .await
        .unwrap();
    assert_eq!(finish(&env, &run).await.unwrap(), "ref-1");
    assert_eq!(applied_effects(&key).len(), 1);
    assert_eq!(executions(wf, "notify.calls"), 2);
    insta::assert_snapshot!(record(&env, wf));
}

#[tokio::test]
async fn a_crash_after_the_downstream_write_is_reconciled_on_resume() {
    let mut env = env().await;
    let wf = "crash-after-write";
    close_gate(wf, "after-call");
    env.worker()
        .start_with(rebook, "ORD-7".into(), with_id(wf))
        .await
        .unwrap();
    let key = book_key(wf, "ORD-7");
    assert!(eventually(400, || applied_effects(&key).len() == 1).await);
    env.crash_and_restart().await.unwrap();
    let run = env.worker().handle(rebook, wf);
    assert_eq!(finish(&env, &run).await.unwrap(), "ref-1");
    assert_eq!(applied_effects(&key).len(), 1);
    assert_eq!(executions(wf, "book.calls"), 1);
    assert_eq!(executions(wf, "book.reconciles"), 1);
    insta::assert_snapshot!(record(&env, wf));
}

#[tokio::test]
async fn a_crash_between_prepared_and_the_call_retries_after_reconciling() {
    let mut env = env().await;
    let wf = "crash-before-call";
    close_gate(wf, "before-call");
    env.worker()
        .start_with(rebook, "ORD-8".into(), with_id(wf))
        .await
        .unwrap();
    assert!(eventually(400, || executions(wf, "book.calls") == 1).await);
    let key = book_key(wf, "ORD-8");
    let prepared = env.worker().operation(&key).unwrap().map(|op| op.status);
    assert_eq!(prepared, Some(OperationStatus::Prepared));
    // The attempt dies at the gate: the downstream never saw it, the log says `prepared`.
    env.crash_and_restart().await.unwrap();
    open_gate(wf, "before-call");
    let run = env.worker().handle(rebook, wf);
    assert_eq!(finish(&env, &run).await.unwrap(), "ref-1");
    assert_eq!(applied_effects(&key).len(), 1);
    assert_eq!(executions(wf, "book.reconciles"), 1);
    assert_eq!(executions(wf, "book.calls"), 2);
    insta::assert_snapshot!(record(&env, wf));
}

#[tokio::test]
async fn the_same_intent_twice_reaches_the_downstream_once() {
    let env = env().await;
    let wf = "same-intent";
    let run = env
        .worker()
        .start_with(rebook_twice, "ORD-9".into(), with_id(wf))
        .await
        .unwrap();
    assert_eq!(finish(&env, &run).await.unwrap(), "ref-1 ref-1");
    assert_eq!(applied_effects(&book_key(wf, "ORD-9")).len(), 1);
    insta::assert_snapshot!(record(&env, wf));
}

/// A key used again with other arguments is a conflict the workflow sees, naming both calls'
/// argument digests; the downstream is called once, and the earlier result is not handed over.
#[tokio::test]
async fn the_same_key_with_other_arguments_is_a_conflict_not_the_earlier_result() {
    let env = env().await;
    let wf = "key-conflict";
    let run = env
        .worker()
        .start_with(rebook_elsewhere, "ORD-11".into(), with_id(wf))
        .await
        .unwrap();
    let output = finish(&env, &run).await.unwrap();
    assert!(output.starts_with("ref-1; idempotency key `"), "{output}");
    assert_eq!(
        output.matches("sha256:").count(),
        2,
        "both digests: {output}"
    );
    assert_eq!(applied_effects(&book_key(wf, "ORD-11")).len(), 1);
    let conflicts = env
        .metrics()
        .value(names::KEY_CONFLICTS, &[("operation", "book")]);
    assert_eq!(conflicts, 1.0);
    let journal = env.worker().render_journal(wf).unwrap();
    assert!(journal.contains("KeyConflict"), "{journal}");
}

#[tokio::test]
async fn a_failed_precondition_is_terminal_and_the_effect_is_not_called() {
    let env = env().await;
    let wf = "precondition";
    let run = env
        .worker()
        .start_with(rebook_if_delayed, "ORD-10".into(), with_id(wf))
        .await
        .unwrap();
    let error = finish(&env, &run).await.unwrap_err();
    assert_eq!(
        error.to_string(),
        "workflow failed: activity failed: precondition failed: precondition `order still delayed` \
         does not hold; the effect was not called"
    );
    assert_eq!(executions(wf, "book.calls"), 0);
    insta::assert_snapshot!(record(&env, wf));
}

/// A check that panics refuses the call like one that does not hold: the run hears why, and
/// the effect is not called.
#[tokio::test]
async fn a_precondition_that_panics_refuses_the_call() {
    let env = env().await;
    let wf = "precondition-panics";
    let run = env
        .worker()
        .start_with(rebook_if_counted, "ORD-12".into(), with_id(wf))
        .await
        .unwrap();
    let error = finish(&env, &run).await.unwrap_err().to_string();
    assert!(
        error.contains(
            "precondition `stock counted` panicked: the count failed; the effect was not called"
        ),
        "{error}"
    );
    assert_eq!(executions(wf, "book.calls"), 0);
}

#[tokio::test]
async fn a_reconciler_that_cannot_tell_is_asked_again_with_backoff() {
    let env = env().await;
    let wf = "still-unknown";
    script_faults(wf, &[Fault::AckLost, Fault::Unclear, Fault::Unclear]);
    let run = env
        .worker()
        .start_with(rebook, "ORD-11".into(), with_id(wf))
        .await
        .unwrap();
    assert_eq!(finish(&env, &run).await.unwrap(), "ref-1");
    assert_eq!(executions(wf, "book.reconciles"), 3);
    assert_eq!(applied_effects(&book_key(wf, "ORD-11")).len(), 1);
    insta::assert_snapshot!(record(&env, wf));
}

#[tokio::test]
async fn a_reconciler_that_never_can_tell_parks_the_workflow() {
    let env = env().await;
    let wf = "never-known";
    let unclear = [
        Fault::AckLost,
        Fault::Unclear,
        Fault::Unclear,
        Fault::Unclear,
    ];
    script_faults(wf, &unclear);
    env.worker()
        .start_with(rebook, "ORD-12".into(), with_id(wf))
        .await
        .unwrap();
    wait_until_parked(&env, wf).await;
    let parked = env.worker().awaiting_operator(wf).unwrap();
    assert_eq!(parked.len(), 1);
    let OperationStatus::AwaitingOperator { reason } = &parked[0].1.status else {
        unreachable!("filtered on awaiting_operator");
    };
    assert!(reason.contains("after 3 checks"), "{reason}");
    assert_eq!(executions(wf, "book.calls"), 1);
    insta::assert_snapshot!(record(&env, wf));
}

#[tokio::test]
async fn retries_stop_at_the_overall_deadline() {
    let env = env().await;
    let wf = "deadline";
    script_faults(wf, &[Fault::Unavailable; 10]);
    let run = env
        .worker()
        .start_with(impatient_notify, "ORD-13".into(), with_id(wf))
        .await
        .unwrap();
    let error = finish_retrying(&env, &run, wf)
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("overall deadline of 2500 ms"), "{error}");
    let calls = executions(wf, "impatient.calls");
    assert!((2..10).contains(&calls), "{calls} calls");
}

/// Waits for the run, moving the clock to each retry's time once the attempt before it is
/// journaled as failed. Never while an attempt's answer is being handled: a retry is due a
/// backoff after the clock's time then, so moving it meanwhile would push the retry later and
/// leave fewer attempts before a deadline, however slowly this machine handles the answer.
async fn finish_retrying<T: serde::de::DeserializeOwned>(
    env: &TestEnv,
    run: &waymark::RunHandle<T>,
    wf: &str,
) -> Result<T, RunError> {
    use waymark::inspect::Entry;
    use waymark::Clock as _;
    let mut retries_reached = 0;
    for _ in 0..2_000 {
        let waited = tokio::time::timeout(Duration::from_millis(10), run.result()).await;
        if let Ok(result) = waited {
            return result;
        }
        let journal = env.worker().journal(wf).unwrap_or_default();
        let retries: Vec<u64> = journal
            .iter()
            .filter_map(|entry| match entry {
                Entry::ActivityAttemptFailed { retry_at_ms, .. } => Some(*retry_at_ms),
                _ => None,
            })
            .collect();
        if let Some(due_ms) = retries.last().filter(|_| retries.len() > retries_reached) {
            let now_ms = env.clock().now_ms();
            env.advance(Duration::from_millis(due_ms.saturating_sub(now_ms)))
                .await;
            retries_reached = retries.len();
        }
    }
    panic!("workflow {} did not finish", run.id());
}

#[tokio::test]
async fn the_key_is_derived_from_intent_and_version() {
    let env = env().await;
    let wf = "key-shape";
    let run = env
        .worker()
        .start_with(rebook, "ORD-14".into(), with_id(wf))
        .await
        .unwrap();
    finish(&env, &run).await.unwrap();
    let operations = env.worker().operations(wf).unwrap();
    let keys: Vec<&str> = operations.iter().map(|(key, _)| key.as_str()).collect();
    assert_eq!(keys, [r#"key-shape|book|["ORD-14"]|v2"#]);
    let (_, record) = &operations[0];
    assert_eq!(record.version, 2);
    assert_eq!(record.operation, "book");
    assert!(matches!(
        &record.status,
        OperationStatus::Committed { external_ref: Some(r), .. } if r == "ref-1"
    ));
}

/// A workflow parked for an operator holds no memory while it waits: the decision rebuilds it.
#[tokio::test]
async fn a_workflow_parked_for_an_operator_leaves_memory_until_the_decision() {
    let env = env().await;
    let wf = "operator-evicted";
    script_faults(wf, &[Fault::AckLost]);
    let run = env
        .worker()
        .start_with(notify_warehouse, "ORD-7".into(), with_id(wf))
        .await
        .unwrap();
    let parked = || !env.worker().awaiting_operator(wf).unwrap().is_empty();
    assert!(eventually(400, parked).await);
    assert!(
        eventually(400, || env.worker().resident_workflows() == 0).await,
        "still resident while parked"
    );
    let key = notify_key(wf, "ORD-7");
    let decision = committed(&"ref-1").unwrap();
    env.worker()
        .resolve_operation(&key, decision, "ops@example")
        .await
        .unwrap();
    assert_eq!(finish(&env, &run).await.unwrap(), "ref-1");
}

/// A 502 after the gateway charged: an ordinary effect calls it again (the gateway sees the key
/// twice), an at-most-once one reconciles instead and never calls again, and without a
/// reconciler it waits for an operator.
#[tokio::test]
async fn an_at_most_once_effect_is_reconciled_after_any_failure_never_retried() {
    let env = env().await;
    let runs = [("retried", "charge_retried", 2), ("once", "charge_once", 1)];
    for (how, operation, calls) in runs {
        let wf = &format!("pay-{how}");
        let run = env
            .worker()
            .start_with(pay, how.to_owned(), with_id(wf))
            .await
            .unwrap();
        finish(&env, &run).await.unwrap();
        assert_eq!(executions(wf, "charge.calls"), calls, "{how}");
        let key = format!(r#"{wf}|{operation}|["ORD-80"]|v1"#);
        let op = env.worker().operation(&key).unwrap().unwrap();
        let trail: Vec<&str> = op.history.iter().map(|e| e.status.as_str()).collect();
        let expected: &[&str] = match how {
            "once" => &["prepared", "unknown_outcome", "committed"],
            _ => &["prepared", "failed_retriable", "prepared", "committed"],
        };
        assert_eq!(trail, expected, "{how}");
    }
    let wf = "pay-unreconciled";
    env.worker()
        .start_with(pay, "unreconciled".to_owned(), with_id(wf))
        .await
        .unwrap();
    let parked = || {
        let status = env.worker().workflow_status(wf).ok().flatten();
        status == Some(WorkflowStatus::AwaitingOperator)
    };
    assert!(eventually(400, parked).await, "waits for an operator");
    assert_eq!(executions(wf, "charge.calls"), 1);
}

/// A parked operation whose effect has a reconciler is asked again by the worker's sweep, with
/// a growing pause, also after a restart; once the downstream can tell, the workflow goes on
/// without an operator.
#[tokio::test]
async fn the_sweep_settles_a_parked_operation_once_the_downstream_can_tell() {
    let mut env = env().await;
    let wf = "swept";
    let unclear = [
        Fault::AckLost,
        Fault::Unclear,
        Fault::Unclear,
        Fault::Unclear,
        // The first sweep still cannot tell.
        Fault::Unclear,
    ];
    script_faults(wf, &unclear);
    env.worker()
        .start_with(rebook, "ORD-16".into(), with_id(wf))
        .await
        .unwrap();
    wait_until_parked(&env, wf).await;
    assert_eq!(env.worker().awaiting_operator(wf).unwrap().len(), 1);
    env.crash_and_restart().await.unwrap();
    assert_eq!(executions(wf, "book.reconciles"), 3);
    let reconciles = || executions(wf, "book.reconciles");
    env.advance(Duration::from_secs(61)).await;
    assert!(
        eventually(400, || reconciles() == 4).await,
        "the first sweep"
    );
    // It could not tell: the next sweep waits twice as long.
    env.advance(Duration::from_secs(61)).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(reconciles(), 4, "backed off");
    env.advance(Duration::from_secs(61)).await;
    let run = env.worker().handle(rebook, wf);
    assert_eq!(finish(&env, &run).await.unwrap(), "ref-1");
    assert_eq!(reconciles(), 5);
    assert_eq!(executions(wf, "book.calls"), 1, "never called again");
    let op = env
        .worker()
        .operation(&book_key(wf, "ORD-16"))
        .unwrap()
        .unwrap();
    let last = op.history.last().unwrap();
    assert_eq!(
        (last.status.as_str(), last.by.as_deref()),
        ("committed", Some("reconciler"))
    );
}

/// The sweep is not a person: a not-found answer retries under the effect's policy, so an
/// effect with no attempt left fails instead of being called again.
#[tokio::test]
async fn a_swept_not_found_follows_the_retry_policy() {
    let env = env().await;
    let wf = "swept-not-found";
    let lost = [
        Fault::RequestLost,
        Fault::Unclear,
        Fault::Unclear,
        Fault::Unclear,
    ];
    script_faults(wf, &lost);
    let run = env
        .worker()
        .start_with(rebook_once, "ORD-17".into(), with_id(wf))
        .await
        .unwrap();
    wait_until_parked(&env, wf).await;
    assert_eq!(env.worker().awaiting_operator(wf).unwrap().len(), 1);
    env.advance(Duration::from_secs(61)).await;
    let error = finish(&env, &run).await.unwrap_err().to_string();
    assert!(
        error.contains("the reconciler found that attempt 1 did not take effect"),
        "{error}"
    );
    assert_eq!(
        executions(wf, "book.calls"),
        1,
        "no attempt beyond the policy"
    );
}
