//! Replay is deterministic: changed code is caught, concurrent ctx futures resolve in the same
//! order after a restart, and recorded values come back unchanged.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use waymark::prelude::*;
use waymark::testing::TestEnv;
use waymark_tests::{close_gate, count, eventually, executions, open_gate, pass_gate, with_id};

/// Counts its executions, waits at its gate, returns its name.
#[activity]
async fn named(cx: ActivityContext, name: String) -> Result<String, ActivityError> {
    count(cx.workflow_id(), &name);
    pass_gate(cx.workflow_id(), &name).await;
    Ok(name)
}

/// Another activity, for the changed version of a workflow.
#[activity]
async fn other(name: String) -> Result<String, ActivityError> {
    Ok(format!("other:{name}"))
}

#[workflow(name = "versioned")]
async fn versioned_v1(ctx: WorkflowContext) -> Result<String, WorkflowError> {
    for step in ["a", "b", "c", "d"] {
        ctx.activity(named, step.to_owned()).await?;
    }
    Ok("v1".into())
}

/// The same workflow after an incompatible change: a different activity at seq 3.
#[workflow(name = "versioned")]
async fn versioned_v2(ctx: WorkflowContext) -> Result<String, WorkflowError> {
    for step in ["a", "b", "c"] {
        ctx.activity(named, step.to_owned()).await?;
    }
    ctx.activity(other, "d".to_owned()).await?;
    Ok("v2".into())
}

#[tokio::test]
async fn a_changed_activity_at_seq_3_is_reported_as_non_determinism() {
    const ID: &str = "divergence-at-3";
    let mut env = TestEnv::start(|b| b.register(versioned_v1).register(named))
        .await
        .unwrap();
    close_gate(ID, "d");
    env.worker()
        .start_with(versioned_v1, (), with_id(ID))
        .await
        .unwrap();
    assert!(eventually(400, || executions(ID, "d") == 1).await);
    // A read that waits at its first poll is journaled as scheduled just after that poll, so
    // `d` may be running before its schedule is written. Once it is, `d` is held at its gate
    // and the journal stays as it is until the worker stops.
    let scheduled = || journaled_seqs(&env, ID, Kind::Scheduled);
    assert!(eventually(400, || scheduled().contains(&3)).await);
    let recorded = env.worker().journal(ID).unwrap();
    env.stop().await;

    // Deploy v2 over the same store.
    let mut env2 = env;
    env2.boot_with(|b| b.register(versioned_v2).register(named).register(other))
        .await
        .unwrap();
    let run = env2.worker().handle(versioned_v2, ID);
    let error = tokio::time::timeout(Duration::from_secs(10), run.result())
        .await
        .expect("the run stops")
        .unwrap_err();
    let RunError::Stuck(stuck) = &error else {
        panic!("expected a stuck run, got {error:?}");
    };
    assert_eq!(stuck.stop.code, waymark::inspect::StopCode::NonDeterminism);
    assert_eq!(stuck.stop.seq, Some(3));
    let message = error.to_string();
    assert!(message.contains("has not ended"), "{message}");
    assert!(message.contains("non-determinism at seq 3"), "{message}");
    assert!(message.contains("activity `named`"), "{message}");
    assert!(message.contains("activity `other`"), "{message}");
    // Nothing was re-executed or journaled: the journal is exactly as v1 left it (the record
    // says the run is stuck).
    assert_eq!(env2.worker().journal(ID).unwrap(), recorded);
    assert_eq!(executions(ID, "d"), 1);
}

/// Races `slow` against `fast`, then awaits `slow` too, alongside a final gated step.
#[workflow]
async fn race(ctx: WorkflowContext) -> Result<(String, String), WorkflowError> {
    let mut slow = ctx.activity(named, "slow".to_owned());
    let mut fast = ctx.activity(named, "fast".to_owned());
    let winner = waymark::select! {
        s = slow => s?,
        f = fast => f?,
    };
    let (slow, last) = waymark::join!(&mut slow, ctx.activity(named, "final".to_owned()));
    Ok((winner, format!("{}+{}", slow?, last?)))
}

#[tokio::test]
async fn select_over_two_activities_replays_the_same_winner() {
    const ID: &str = "select-activities";
    let mut env = TestEnv::start(|b| b.register(race).register(named))
        .await
        .unwrap();
    close_gate(ID, "slow");
    close_gate(ID, "final");
    env.worker()
        .start_with(race, (), with_id(ID))
        .await
        .unwrap();
    // `fast` wins live; then `slow` finishes too, so both completions are journaled, `fast`'s
    // first even though `slow` has the lower seq.
    assert!(eventually(400, || executions(ID, "final") == 1).await);
    open_gate(ID, "slow");
    let completed = |env: &TestEnv| journaled_seqs(env, ID, Kind::Completed);
    assert!(eventually(400, || completed(&env).contains(&0)).await);
    assert_eq!(completed(&env)[..2], [1, 0]);

    env.crash_and_restart().await.unwrap();
    open_gate(ID, "final");
    let run = env.worker().handle(race, ID);
    let (winner, rest) = run.result().await.unwrap();
    assert_eq!(
        winner, "fast",
        "replay delivered completions in journal order"
    );
    assert_eq!(rest, "slow+final");
    assert_eq!(executions(ID, "slow"), 1);
    assert_eq!(executions(ID, "fast"), 1);
}

/// Which activity entries `journaled_seqs` picks.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Scheduled,
    Completed,
}

/// The seqs of `id`'s activity entries of `kind`, in journal order.
fn journaled_seqs(env: &TestEnv, id: &str, kind: Kind) -> Vec<u32> {
    use waymark::inspect::Entry;
    let journal = env.worker().journal(id).unwrap_or_default();
    journal
        .iter()
        .filter_map(|entry| match entry {
            Entry::ActivityScheduledAt { seq, .. } if kind == Kind::Scheduled => Some(*seq),
            Entry::ActivityCompletedAt { seq, .. } if kind == Kind::Completed => Some(*seq),
            _ => None,
        })
        .collect()
}

/// A timer against an activity.
#[workflow]
async fn deadline(ctx: WorkflowContext) -> Result<String, WorkflowError> {
    let mut timer = ctx.sleep(Duration::from_secs(5));
    let mut work = ctx.activity(named, "work".to_owned());
    let winner = waymark::select! {
        () = timer => "timer".to_owned(),
        w = work => w?,
    };
    let last = ctx.activity(named, "last".to_owned()).await?;
    Ok(format!("{winner}+{last}"))
}

#[tokio::test]
async fn select_of_a_timer_against_an_activity_replays_the_same_winner() {
    const ID: &str = "select-timer";
    let mut env = TestEnv::start(|b| b.register(deadline).register(named))
        .await
        .unwrap();
    close_gate(ID, "work");
    close_gate(ID, "last");
    env.worker()
        .start_with(deadline, (), with_id(ID))
        .await
        .unwrap();
    assert!(eventually(400, || executions(ID, "work") == 1).await);
    env.advance(Duration::from_secs(5)).await;
    assert!(eventually(400, || executions(ID, "last") == 1).await);

    env.crash_and_restart().await.unwrap();
    // After the restart the activity finishes at once; the timer still won, as journaled.
    open_gate(ID, "work");
    open_gate(ID, "last");
    let run = env.worker().handle(deadline, ID);
    assert_eq!(run.result().await.unwrap(), "timer+last");
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Values {
    now_ms: u128,
    random: u64,
    uuid: String,
}

#[activity]
async fn observe(cx: ActivityContext, values: Values) -> Result<Values, ActivityError> {
    count(cx.workflow_id(), "observe");
    pass_gate(cx.workflow_id(), "observe").await;
    Ok(values)
}

#[workflow]
async fn generated(ctx: WorkflowContext) -> Result<(Values, Values), WorkflowError> {
    let values = Values {
        now_ms: ctx
            .now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis(),
        random: ctx.random(),
        uuid: ctx.uuid().to_string(),
    };
    let observed = ctx.activity(observe, values.clone()).await?;
    Ok((values, observed))
}

#[tokio::test]
async fn now_random_and_uuid_replay_their_recorded_values() {
    const ID: &str = "generated-values";
    let mut env = TestEnv::start(|b| b.register(generated).register(observe))
        .await
        .unwrap();
    close_gate(ID, "observe");
    env.worker()
        .start_with(generated, (), with_id(ID))
        .await
        .unwrap();
    assert!(eventually(400, || executions(ID, "observe") == 1).await);
    env.advance(Duration::from_secs(3600)).await;
    env.crash_and_restart().await.unwrap();
    open_gate(ID, "observe");
    let (replayed, observed) = env.worker().handle(generated, ID).result().await.unwrap();
    // `observed` was computed before the crash (its activity input is journaled); the values the
    // workflow produced on replay are the same, though the clock moved an hour.
    assert_eq!(replayed, observed);
    assert_eq!(executions(ID, "observe"), 2, "in flight at the crash");
}

#[workflow(name = "patching")]
async fn before_patch(ctx: WorkflowContext) -> Result<String, WorkflowError> {
    ctx.activity(named, "first".to_owned()).await?;
    Ok(ctx.activity(named, "second".to_owned()).await?)
}

#[workflow(name = "patching")]
async fn after_patch(ctx: WorkflowContext) -> Result<String, WorkflowError> {
    let first = if ctx.patched("use-other") {
        ctx.activity(other, "first".to_owned()).await?
    } else {
        ctx.activity(named, "first".to_owned()).await?
    };
    let second = ctx.activity(named, "second".to_owned()).await?;
    Ok(format!("{first}/{second}"))
}

#[tokio::test]
async fn patched_keeps_old_journals_on_the_old_path_and_new_runs_on_the_new() {
    const OLD: &str = "patch-old";
    const NEW: &str = "patch-new";
    let mut env = TestEnv::start(|b| b.register(before_patch).register(named))
        .await
        .unwrap();
    close_gate(OLD, "second");
    env.worker()
        .start_with(before_patch, (), with_id(OLD))
        .await
        .unwrap();
    assert!(eventually(400, || executions(OLD, "second") == 1).await);
    env.stop().await;
    open_gate(OLD, "second");
    env.boot_with(|b| b.register(after_patch).register(named).register(other))
        .await
        .unwrap();
    let old = env
        .worker()
        .handle(after_patch, OLD)
        .result()
        .await
        .unwrap();
    assert_eq!(old, "first/second", "the old run keeps the old path");
    let new = env
        .worker()
        .start_with(after_patch, (), with_id(NEW))
        .await
        .unwrap();
    assert_eq!(new.result().await.unwrap(), "other:first/second");
    assert_eq!(executions(NEW, "first"), 0, "the new path calls `other`");
}

/// Refuses for good after its gate.
#[activity]
async fn refuse(cx: ActivityContext, name: String) -> Result<String, ActivityError> {
    pass_gate(cx.workflow_id(), &name).await;
    Err(ActivityError::terminal(format!("{name} refused")))
}

#[workflow]
async fn timed_steps(ctx: WorkflowContext) -> Result<String, WorkflowError> {
    let done = ctx.activity(named, "slow".to_owned()).await?;
    let refused = ctx.activity(refuse, "refusing".to_owned()).await;
    let go: String = ctx.signal("go").await?;
    Ok(format!("{done}+{}+{go}", refused.is_err()))
}

/// When each step was issued and when it ended, as the worker's clock read them.
fn step_times(journal: &[waymark::inspect::Entry]) -> Vec<(u32, u64, Option<u64>)> {
    use waymark::inspect::Entry;
    let mut times: Vec<(u32, u64, Option<u64>)> = Vec::new();
    for entry in journal {
        let issued = match entry {
            Entry::ActivityScheduledAt {
                seq,
                scheduled_at_ms,
                ..
            } => Some((*seq, *scheduled_at_ms)),
            Entry::SignalAwaitedAt {
                seq, awaited_at_ms, ..
            } => Some((*seq, *awaited_at_ms)),
            _ => None,
        };
        if let Some((seq, at)) = issued {
            times.push((seq, at, None));
        }
        let ended = match entry {
            Entry::ActivityCompletedAt { seq, .. }
            | Entry::ActivityFailedAt { seq, .. }
            | Entry::SignalReceivedAt { seq, .. } => seq,
            _ => continue,
        };
        let step = times.iter_mut().find(|(s, _, _)| s == ended).unwrap();
        step.2 = entry.journaled_at();
    }
    times
}

/// Each step's start and end are journaled with the time they were written, so that how long a
/// step took (a plain activity's as much as an effect's, a wait's) is read from the journal,
/// after a restart too.
#[tokio::test]
async fn each_step_is_journaled_with_when_it_was_issued_and_ended() {
    const ID: &str = "timed-steps";
    let mut env = TestEnv::start(|b| b.register(timed_steps).register(named).register(refuse))
        .await
        .unwrap();
    close_gate(ID, "slow");
    close_gate(ID, "refusing");
    env.worker()
        .start_with(timed_steps, (), with_id(ID))
        .await
        .unwrap();
    assert!(eventually(400, || executions(ID, "slow") == 1).await);
    env.clock().advance(Duration::from_millis(750));
    open_gate(ID, "slow");
    let issued = |steps: usize| {
        let env = &env;
        move || step_times(&env.worker().journal(ID).unwrap()).len() == steps
    };
    assert!(eventually(400, issued(2)).await);
    env.clock().advance(Duration::from_millis(1_250));
    open_gate(ID, "refusing");
    assert!(eventually(400, issued(3)).await);
    env.clock().advance(Duration::from_millis(300));
    env.worker().signal(ID, "go", "go-1", &"go").await.unwrap();
    let run = env.worker().handle(timed_steps, ID);
    assert_eq!(run.result().await.unwrap(), "slow+true+go");

    env.crash_and_restart().await.unwrap();
    let journal = env.worker().journal(ID).unwrap();
    let took: Vec<(u32, Option<u64>)> = step_times(&journal)
        .into_iter()
        .map(|(seq, issued, ended)| (seq, ended.map(|ended| ended - issued)))
        .collect();
    assert_eq!(took, [(0, Some(750)), (1, Some(1_250)), (2, Some(300))]);
    // The rendering is the one journals without times have: snapshots do not change.
    let rendered = env.journal(ID).unwrap();
    assert!(rendered.contains("activity_completed  seq=0 attempt=1 output=\"slow\""));
    assert!(rendered.contains("activity_failed     seq=1 attempt=1"));
    assert!(rendered.contains("signal_awaited      seq=2 go"));
    assert!(rendered.contains("signal_received     seq=2 id=go-1 payload=\"go\""));
}
