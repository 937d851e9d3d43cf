//! One delivered outcome per poll, live exactly as on replay: `select!` takes the same branch
//! after a rebuild, a wait dropped before anything reached it takes nothing, and a timer that
//! lost a `select!` is cancelled instead of firing later.

use std::time::Duration;

use waymark::prelude::*;
use waymark::telemetry::names;
use waymark::testing::TestEnv;
use waymark::WorkerBuilder;
use waymark_tests::{eventually, with_id};

const SECOND: Duration = Duration::from_secs(1);
const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(24 * 3600);

/// Journals what the workflow decided, so a replay that decides otherwise diverges.
#[activity]
async fn record(decision: String) -> Result<String, ActivityError> {
    Ok(decision)
}

/// Waits out a first timer, then takes whichever of two signals comes first, records it, naps
/// an hour (long enough to be evicted) and then receives the losing signal.
#[workflow]
async fn approve_or_cancel(ctx: WorkflowContext, _input: ()) -> Result<String, WorkflowError> {
    ctx.sleep(10 * SECOND).await;
    // The block drops the losing wait, which abandons it: its signal stays in the inbox.
    let winner = {
        let mut cancel = ctx.signal::<String>("cancel");
        let mut approve = ctx.signal::<String>("approve");
        waymark::select! {
            by = approve => format!("approve:{}", by?),
            by = cancel => format!("cancel:{}", by?),
        }
    };
    ctx.activity(record, winner.clone()).await?;
    ctx.sleep(HOUR).await;
    let loser = if winner.starts_with("approve") {
        "cancel"
    } else {
        "approve"
    };
    let late: String = ctx.signal(loser).await?;
    Ok(format!("{winner}, then {loser}:{late}"))
}

/// Waits for a deadline that is created before a nap; the signal wait set up beside it in the
/// same poll loses at once (the deadline is already due), and a second wait must get the
/// signal.
#[workflow]
async fn deadline_then_wait(ctx: WorkflowContext, _input: ()) -> Result<String, WorkflowError> {
    let mut deadline = ctx.sleep(5 * SECOND);
    ctx.sleep(10 * SECOND).await;
    let early = {
        let mut go = ctx.signal::<String>("go");
        waymark::select! {
            () = deadline => None,
            go = go => Some(go?),
        }
    };
    let late: String = ctx.signal("go").await?;
    Ok(format!("early {early:?}, late {late}"))
}

/// Rounds of "a message, or a day without one": prompt messages win every round. Then it
/// waits (evicted) for `look`, and for `done`.
#[workflow]
async fn message_or_timeout(ctx: WorkflowContext, rounds: u32) -> Result<u32, WorkflowError> {
    let mut messages = 0;
    for _ in 0..rounds {
        let mut message = ctx.signal::<u32>("msg");
        let mut quiet = ctx.sleep(DAY);
        waymark::select! {
            m = message => { m?; messages += 1; },
            () = quiet => {},
        }
    }
    ctx.signal::<()>("look").await?;
    ctx.signal::<()>("done").await?;
    Ok(messages)
}

#[activity(effect)]
async fn book(cx: ActivityContext, #[key] order_id: String) -> Result<String, ActivityError> {
    Ok(waymark_tests::apply_under_key(&cx, &order_id))
}

/// Books two orders, then issues both intents again: the operation log answers both in one
/// flush, and the `select!` polls the one issued second first.
#[workflow]
async fn rebook_from_the_log(ctx: WorkflowContext, _input: ()) -> Result<String, WorkflowError> {
    ctx.effect(book, "A".to_owned()).await?;
    ctx.effect(book, "B".to_owned()).await?;
    let winner = {
        let mut b = ctx.effect(book, "B".to_owned());
        let mut a = ctx.effect(book, "A".to_owned());
        waymark::select! {
            a = a => format!("A {}", a?),
            b = b => format!("B {}", b?),
        }
    };
    ctx.activity(record, winner.clone()).await?;
    ctx.sleep(HOUR).await;
    Ok(winner)
}

/// A signal beats a long timer (dropped, and journaled so), then the run waits, out of
/// memory, for `done`.
#[workflow]
async fn go_then_done(ctx: WorkflowContext, _input: ()) -> Result<String, WorkflowError> {
    let go = {
        let mut go = ctx.signal::<String>("go");
        let mut later = ctx.sleep(HOUR);
        waymark::select! {
            go = go => go?,
            () = later => "late".to_owned(),
        }
    };
    let done: String = ctx.signal("done").await?;
    Ok(format!("{go}, then {done}"))
}

async fn env() -> TestEnv {
    let setup = |b: WorkerBuilder| {
        b.register(approve_or_cancel)
            .register(go_then_done)
            .register(deadline_then_wait)
            .register(message_or_timeout)
            .register(rebook_from_the_log)
            .register(record)
            .register(book)
    };
    TestEnv::start(setup).await.unwrap()
}

/// Advances the clock until the workflow's next timer is due, waiting for it first.
async fn advance_past_timer(env: &TestEnv, wf: &str, by: Duration) {
    assert!(env.wait_for_timer(wf, 10 * SECOND).await, "{wf} waits");
    env.advance(by).await;
}

#[tokio::test]
async fn select_over_two_signals_takes_the_same_branch_on_replay_and_keeps_the_loser() {
    let env = env().await;
    let wf = "outcomes-select-signals";
    let run = env
        .worker()
        .start_with(approve_or_cancel, (), with_id(wf))
        .await
        .unwrap();
    assert!(env.wait_for_timer(wf, 10 * SECOND).await);
    let worker = env.worker();
    worker.signal(wf, "cancel", "c-1", &"ops").await.unwrap();
    worker.signal(wf, "approve", "a-1", &"dana").await.unwrap();
    env.advance(11 * SECOND).await;
    let recorded = || env.worker().render_journal(wf).unwrap_or_default();
    assert!(eventually(400, || recorded().contains("activity_completed")).await);
    // The hour-long nap evicts the workflow; its timer rebuilds it by replay.
    assert!(eventually(400, || env.worker().resident_workflows() == 0).await);
    advance_past_timer(&env, wf, HOUR + SECOND).await;
    let outcome = tokio::time::timeout(10 * SECOND, run.result()).await;
    let outcome = outcome.expect("the run ends").unwrap();
    assert_eq!(outcome, "cancel:ops, then approve:dana");
    insta::assert_snapshot!(env.worker().render_journal(wf).unwrap());
}

#[tokio::test]
async fn a_signal_wait_dropped_in_the_poll_that_issued_it_takes_no_signal() {
    let env = env().await;
    let wf = "outcomes-dropped-wait";
    let run = env
        .worker()
        .start_with(deadline_then_wait, (), with_id(wf))
        .await
        .unwrap();
    advance_past_timer(&env, wf, 15 * SECOND).await;
    let waits = || {
        let journal = env.worker().render_journal(wf).unwrap_or_default();
        journal.matches("signal_awaited").count()
    };
    assert!(eventually(400, || waits() == 2).await);
    env.worker().signal(wf, "go", "go-1", &"now").await.unwrap();
    let outcome = tokio::time::timeout(10 * SECOND, run.result()).await;
    assert_eq!(
        outcome.expect("the second wait gets the signal").unwrap(),
        "early None, late now"
    );
}

#[tokio::test]
async fn timers_that_lose_a_select_are_cancelled_and_never_fire() {
    const ROUNDS: u32 = 1_000;
    let env = env().await;
    let wf = "outcomes-cancelled-timers";
    let run = env
        .worker()
        .start_with(message_or_timeout, ROUNDS, with_id(wf))
        .await
        .unwrap();
    for round in 0..ROUNDS {
        let id = format!("m-{round}");
        env.worker().signal(wf, "msg", &id, &round).await.unwrap();
    }
    let received = || {
        let journal = env.worker().render_journal(wf).unwrap_or_default();
        journal.matches("signal_awaited").count() == ROUNDS as usize + 1
    };
    assert!(eventually(4_000, received).await, "every round ends");
    assert!(eventually(400, || env.worker().resident_workflows() == 0).await);
    let timers = env.worker().pending_timers(wf).unwrap();
    assert!(timers.is_empty(), "{} timer rows left", timers.len());
    let rebuilds = || {
        env.metrics()
            .value(names::WORKFLOW_LOADS, &[("wake", "event")])
    };
    let before = rebuilds();
    env.advance(DAY + SECOND).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(rebuilds(), before, "a cancelled timer rebuilt the workflow");
    let journal = env.worker().render_journal(wf).unwrap();
    assert!(!journal.contains("timer_fired"), "a losing timer fired");
    // Rebuilt by replay, the run holds its one open wait, not the 2,000 commands before it.
    env.worker().signal(wf, "look", "l", &()).await.unwrap();
    assert!(eventually(400, || env.worker().resident_workflows() == 1).await);
    let footprint = env.worker().footprint(wf).await.expect("resident");
    let core = footprint.core;
    assert!(
        core.open_commands <= 2 && core.kept_facts <= 4,
        "{footprint:?}"
    );
    env.worker().signal(wf, "done", "d", &()).await.unwrap();
    let outcome = tokio::time::timeout(10 * SECOND, run.result()).await;
    assert_eq!(outcome.expect("it ends").unwrap(), ROUNDS);
}

#[tokio::test]
async fn effects_answered_from_the_log_in_one_flush_are_delivered_one_per_poll() {
    let env = env().await;
    let wf = "outcomes-log-answers";
    let run = env
        .worker()
        .start_with(rebook_from_the_log, (), with_id(wf))
        .await
        .unwrap();
    let recorded = || env.worker().render_journal(wf).unwrap_or_default();
    assert!(eventually(400, || recorded().contains("timer_started")).await);
    assert!(eventually(400, || env.worker().resident_workflows() == 0).await);
    advance_past_timer(&env, wf, HOUR + SECOND).await;
    let outcome = tokio::time::timeout(10 * SECOND, run.result()).await;
    // Journal order delivers B (the lower seq) first; the poll right after it takes B.
    assert_eq!(outcome.expect("the run ends").unwrap(), "B ref-1");
}

/// Takes all three answers.
#[workflow(name = "three_answers")]
async fn all_three(ctx: WorkflowContext, _input: ()) -> Result<String, WorkflowError> {
    let (a, b, c) = futures::join!(
        ctx.activity(record, "a".to_owned()),
        ctx.activity(record, "b".to_owned()),
        ctx.activity(record, "c".to_owned()),
    );
    Ok(format!("{}{}{}", a?, b?, c?))
}

/// The same commands, but the code returns with the first answer.
#[workflow(name = "three_answers")]
async fn first_of_three(ctx: WorkflowContext, _input: ()) -> Result<String, WorkflowError> {
    let mut a = ctx.activity(record, "a".to_owned());
    let mut b = ctx.activity(record, "b".to_owned());
    let mut c = ctx.activity(record, "c".to_owned());
    waymark::select! {
        a = a => Ok(a?),
        b = b => Ok(b?),
        c = c => Ok(c?),
    }
}

/// A journal whose outcomes go on after the code returned (its end was not written: a crash)
/// replays to the end: the outcomes after the return go nowhere, one per poll like the rest,
/// and the run ends with what the code returned.
#[tokio::test]
async fn outcomes_journaled_after_the_code_returned_replay_to_its_end() {
    let mut env = TestEnv::start(|b| b.register(all_three).register(record))
        .await
        .unwrap();
    let run = env
        .worker()
        .start_with(all_three, (), with_id("three-source"))
        .await
        .unwrap();
    assert_eq!(run.result().await.unwrap(), "abc");
    env.stop().await;
    if waymark_tests::beneath_rocksdb_only(&env) {
        return;
    }
    let data = waymark::inspect::DataDir::open(env.data_dir()).unwrap();
    let mut journal = data.journal("three-source").unwrap();
    drop(data);
    let end = journal.pop();
    assert!(matches!(
        end,
        Some(waymark::inspect::Entry::WorkflowCompleted { .. })
    ));
    let export = waymark::inspect::write_framed(&journal);
    let wf = "three-cut-before-its-end";
    waymark::inspect::import_workflow(env.data_dir(), wf, &export, None)
        .await
        .unwrap();

    let replayer = waymark::testing::Replayer::new()
        .register(first_of_three)
        .register(record);
    let report = replayer.replay_bytes(&export).unwrap();
    assert!(!report.ended);

    env.boot_with(|b| b.register(first_of_three).register(record))
        .await
        .unwrap();
    let handle = env.worker().handle(first_of_three, wf);
    let answer = tokio::time::timeout(10 * SECOND, handle.result()).await;
    assert_eq!(answer.expect("the run ends").unwrap(), "a");
}

/// Cancelling a run that is not in memory reads its timer rows from its journal, where the
/// timer it dropped is journaled as dropped: the cancel goes through and leaves no row.
#[tokio::test]
async fn a_run_out_of_memory_with_a_dropped_timer_can_be_cancelled() {
    let env = env().await;
    let wf = "outcomes-cancel-after-a-dropped-timer";
    let run = env.worker().start_with(go_then_done, (), with_id(wf)).await;
    let run = run.unwrap();
    env.worker().signal(wf, "go", "go-1", &"now").await.unwrap();
    let dropped = || {
        let journal = env.worker().render_journal(wf).unwrap_or_default();
        journal.contains("wait_dropped") && env.worker().resident_workflows() == 0
    };
    assert!(
        eventually(400, dropped).await,
        "the timer is dropped, the run evicted"
    );
    env.worker().cancel(wf, "no longer needed").await.unwrap();
    let error = run.result().await.unwrap_err();
    assert!(error.to_string().contains("no longer needed"), "{error}");
    assert!(env.worker().pending_timers(wf).unwrap().is_empty());
}
