//! Signals: a durable wait for an external event. Signals sent early wait in the inbox; each
//! delivery is journaled; a repeated id is dropped; a waiting workflow holds no memory.

use waymark::prelude::*;
use waymark::signals::SignalOutcome;
use waymark::testing::TestEnv;
use waymark::WorkerBuilder;
use waymark::{SignalError, Unreachable};
use waymark_tests::{close_gate, eventually, open_gate, pass_gate, with_id};

#[workflow]
async fn await_go(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    ctx.activity(prepare, order_id.clone()).await?;
    let go: String = ctx.signal("go").await?;
    Ok(format!("{order_id}: {go}"))
}

/// A step before the wait that a test can hold, to send the signal before anyone waits.
#[activity]
async fn prepare(cx: ActivityContext, order_id: String) -> Result<String, ActivityError> {
    pass_gate(cx.workflow_id(), "prepare").await;
    Ok(order_id)
}

#[workflow]
async fn count_votes(ctx: WorkflowContext, voters: u32) -> Result<Vec<u32>, WorkflowError> {
    let mut votes = Vec::new();
    for _ in 0..voters {
        votes.push(ctx.signal::<u32>("vote").await?);
    }
    Ok(votes)
}

/// Waits for `go` with a deadline; after the deadline, waits again without one.
#[workflow]
async fn go_or_remind(ctx: WorkflowContext, _input: ()) -> Result<String, WorkflowError> {
    // The block drops the loser of the select!, which abandons a losing signal wait.
    let early = {
        let mut go = ctx.signal::<String>("go");
        let mut reminder = ctx.sleep(std::time::Duration::from_secs(60));
        waymark::select! {
            go = go => Some(go?),
            () = reminder => None,
        }
    };
    match early {
        Some(go) => Ok(format!("early: {go}")),
        None => Ok(format!(
            "after reminder: {}",
            ctx.signal::<String>("go").await?
        )),
    }
}

async fn two_votes(env: &TestEnv, wf: &str) -> waymark::RunHandle<Vec<u32>> {
    let worker = env.worker();
    worker
        .start_with(count_votes, 2, with_id(wf))
        .await
        .unwrap()
}

async fn env() -> TestEnv {
    let setup = |b: WorkerBuilder| {
        b.register(await_go)
            .register(prepare)
            .register(count_votes)
            .register(go_or_remind)
    };
    TestEnv::start(setup).await.unwrap()
}

#[tokio::test]
async fn a_signal_sent_before_the_wait_is_kept_in_the_inbox() {
    let env = env().await;
    let wf = "signal-early";
    close_gate(wf, "prepare");
    let run = env
        .worker()
        .start_with(await_go, "ORD-30".into(), with_id(wf))
        .await
        .unwrap();
    let sent = env.worker().signal(wf, "go", "sig-1", &"approved").await;
    assert_eq!(sent.unwrap(), SignalOutcome::Accepted);
    assert_eq!(env.worker().inbox(wf).unwrap().len(), 1);
    open_gate(wf, "prepare");
    assert_eq!(run.result().await.unwrap(), "ORD-30: approved");
    assert!(env.worker().inbox(wf).unwrap().is_empty(), "taken once");
    insta::assert_snapshot!(env.worker().render_journal(wf).unwrap());
}

#[tokio::test]
async fn a_repeated_signal_id_is_dropped() {
    let env = env().await;
    let wf = "signal-votes";
    let run = two_votes(&env, wf).await;
    let worker = env.worker();
    assert_eq!(
        worker.signal(wf, "vote", "alice", &1_u32).await.unwrap(),
        SignalOutcome::Accepted
    );
    let again = worker.signal(wf, "vote", "alice", &7_u32).await.unwrap();
    assert_eq!(again, SignalOutcome::Duplicate);
    worker.signal(wf, "vote", "bob", &2_u32).await.unwrap();
    assert_eq!(run.result().await.unwrap(), vec![1, 2]);
    let late = worker
        .signal(wf, "vote", "carol", &3_u32)
        .await
        .unwrap_err();
    assert!(matches!(late, SignalError::Ended { .. }), "{late}");
    let unknown = worker.signal("nobody", "vote", "x", &3_u32).await;
    assert!(matches!(
        unknown,
        Err(SignalError::Unreachable(Unreachable::UnknownWorkflow(_)))
    ));
    insta::assert_snapshot!(worker.render_journal(wf).unwrap());
}

/// Senders racing with one signal id: the store keeps one, and exactly one sender hears
/// "accepted" (the others were told the truth, not a second "accepted").
#[tokio::test(flavor = "multi_thread")]
async fn senders_racing_with_one_signal_id_hear_accepted_once() {
    let env = env().await;
    let wf = "signal-race";
    let run = two_votes(&env, wf).await;
    let worker = env.worker();
    let votes: Vec<u32> = (0..8).collect();
    let sends = votes
        .iter()
        .map(|vote| worker.signal(wf, "vote", "alice", vote));
    let outcomes = futures::future::join_all(sends).await;
    let accepted = outcomes
        .iter()
        .filter(|outcome| matches!(outcome, Ok(SignalOutcome::Accepted)))
        .count();
    let duplicates = outcomes
        .iter()
        .filter(|outcome| matches!(outcome, Ok(SignalOutcome::Duplicate)))
        .count();
    assert_eq!((accepted, duplicates), (1, 7), "{outcomes:?}");
    worker.signal(wf, "vote", "bob", &100_u32).await.unwrap();
    let votes = run.result().await.unwrap();
    assert_eq!(votes.len(), 2);
    assert_eq!(votes[1], 100, "alice's vote counted once: {votes:?}");
}

#[tokio::test]
async fn a_waiting_workflow_leaves_memory_and_is_rebuilt_when_its_signal_arrives() {
    let mut env = env().await;
    let wf = "signal-evicted";
    env.worker()
        .start_with(await_go, "ORD-31".into(), with_id(wf))
        .await
        .unwrap();
    let listening = |env: &TestEnv| env.worker().journal(wf).unwrap_or_default().len() >= 4;
    assert!(eventually(400, || listening(&env)).await);
    assert!(eventually(400, || env.worker().resident_workflows() == 0).await);
    // Across a restart too: the wait is in the journal, not in memory.
    env.crash_and_restart().await.unwrap();
    assert!(eventually(400, || env.worker().resident_workflows() == 0).await);
    env.worker()
        .signal(wf, "go", "sig-1", &"ship it")
        .await
        .unwrap();
    let run = env.worker().handle(await_go, wf);
    assert_eq!(run.result().await.unwrap(), "ORD-31: ship it");
}

#[tokio::test]
async fn a_payload_of_the_wrong_shape_is_an_error_the_workflow_sees() {
    let env = env().await;
    let wf = "signal-wrong-shape";
    let run = env
        .worker()
        .start_with(count_votes, 1, with_id(wf))
        .await
        .unwrap();
    let sent = env.worker().signal(wf, "vote", "v1", &"yes").await.unwrap();
    assert_eq!(sent, SignalOutcome::Accepted);
    let error = run.result().await.unwrap_err().to_string();
    assert!(
        error.contains("signal `vote` carries a payload of the wrong shape"),
        "{error}"
    );
}

#[tokio::test]
async fn a_wait_that_lost_a_select_does_not_swallow_the_next_signal() {
    let mut env = env().await;
    let wf = "signal-select";
    env.worker()
        .start_with(go_or_remind, (), with_id(wf))
        .await
        .unwrap();
    assert!(
        env.wait_for_timer(wf, std::time::Duration::from_secs(5))
            .await
    );
    env.advance(std::time::Duration::from_secs(61)).await;
    let second_wait = |env: &TestEnv| {
        let journal = env.worker().render_journal(wf).unwrap_or_default();
        journal.matches("signal_awaited").count() == 2
    };
    assert!(eventually(400, || second_wait(&env)).await);
    // Across a restart too: the abandoned wait is abandoned again on replay.
    env.crash_and_restart().await.unwrap();
    env.worker().signal(wf, "go", "go-1", &"now").await.unwrap();
    let run = env.worker().handle(go_or_remind, wf);
    assert_eq!(run.result().await.unwrap(), "after reminder: now");
    insta::assert_snapshot!(env.worker().render_journal(wf).unwrap());
}

/// A cancellation written straight to the store (the workflow waits, out of memory) answers
/// every caller waiting for the result, whenever they started waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_waiting_caller_hears_the_cancellation_of_an_evicted_workflow() {
    let env = env().await;
    for round in 0..10 {
        let wf = format!("signal-cancelled-{round}");
        env.worker()
            .start_with(await_go, "ORD-40".into(), with_id(&wf))
            .await
            .unwrap();
        let evicted = || {
            let journal = env.worker().journal(&wf).unwrap_or_default();
            journal.len() >= 4 && env.worker().resident_workflows() == 0
        };
        assert!(eventually(400, evicted).await);
        let waiters = (0..16).map(|_| {
            let run = env.worker().handle(await_go, &wf);
            tokio::spawn(async move { run.result().await })
        });
        let waiters: Vec<_> = waiters.collect();
        env.worker().cancel(&wf, "customer withdrew").await.unwrap();
        for waiter in waiters {
            let answered = tokio::time::timeout(std::time::Duration::from_secs(10), waiter).await;
            let outcome = answered.expect("answered").unwrap();
            assert!(
                matches!(&outcome, Err(waymark::RunError::Failed(f)) if f.message == "customer withdrew"),
                "{outcome:?}"
            );
        }
    }
}

/// A signal the workflow never waited for is not kept once the workflow ended: it can never be
/// delivered.
#[tokio::test]
async fn signals_left_undelivered_are_removed_when_the_workflow_ends() {
    let env = env().await;
    let wf = "signal-left-over";
    close_gate(wf, "prepare");
    let run = env
        .worker()
        .start_with(await_go, "ORD-32".into(), with_id(wf))
        .await
        .unwrap();
    let worker = env.worker();
    worker.signal(wf, "note", "n-1", &"fyi").await.unwrap();
    worker.signal(wf, "go", "g-1", &"ship").await.unwrap();
    open_gate(wf, "prepare");
    assert_eq!(run.result().await.unwrap(), "ORD-32: ship");
    assert!(
        eventually(400, || env.worker().inbox(wf).unwrap().is_empty()).await,
        "{:?}",
        env.worker().inbox(wf).unwrap()
    );
}
