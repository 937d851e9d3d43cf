//! The replay mode, readable by code: an activity learns whether it runs for the first time,
//! as a retry, after a crash or on an operator's word, and workflow code whether it walks
//! recorded history or runs live.

use std::sync::Mutex;

use waymark::prelude::*;
use waymark::testing::{Boundary, Fault, PlannedFault, TestEnv};
use waymark::WorkerBuilder;
use waymark_tests::with_id;

/// What the code saw, in the order it saw it.
static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn saw(what: String) {
    SEEN.lock().unwrap().push(what);
}

/// Fails its first attempt; says which mode each attempt ran in.
#[activity(max_attempts = 3, initial_backoff_ms = 10)]
async fn flaky(cx: ActivityContext, step: String) -> Result<String, ActivityError> {
    saw(format!(
        "{step} attempt {} {:?}",
        cx.attempt(),
        cx.replay_mode()
    ));
    match cx.attempt() {
        1 => Err(ActivityError::retriable("the index is warming up")),
        _ => Ok(step),
    }
}

/// Says which mode it ran in, after a wait, as a call over a network answers.
#[activity]
async fn load(cx: ActivityContext, step: String) -> Result<String, ActivityError> {
    tokio::task::yield_now().await;
    saw(format!(
        "{step} attempt {} {:?}",
        cx.attempt(),
        cx.replay_mode()
    ));
    Ok(step)
}

#[workflow]
async fn modes(ctx: WorkflowContext, _input: ()) -> Result<String, WorkflowError> {
    saw(format!("workflow at start {:?}", ctx.replay_mode()));
    ctx.activity(flaky, "retried".into()).await?;
    saw(format!("workflow after the retry {:?}", ctx.replay_mode()));
    ctx.activity(load, "resumed".into()).await?;
    saw(format!("workflow at the end {:?}", ctx.replay_mode()));
    Ok("done".into())
}

#[tokio::test]
async fn activities_and_workflow_code_read_why_they_run() {
    // The worker dies right after `load`'s first call, which waited, so it was journaled as
    // scheduled: the next process runs it again.
    let crash = PlannedFault::at("load", 1, Boundary::AfterCall, Fault::Crash);
    let setup = |b: WorkerBuilder| b.register(modes).register(flaky).register(load);
    let mut env = TestEnv::with_faults([crash], setup).await.unwrap();
    let wf = "replay-modes";
    env.worker()
        .start_with(modes, (), with_id(wf))
        .await
        .unwrap();
    let outcome = env.finish(modes, wf, 40).await.expect("the run ends");
    assert_eq!(outcome.unwrap(), "done");
    let seen = SEEN.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            "workflow at start FirstExecution",
            "retried attempt 1 FirstExecution",
            "retried attempt 2 InStageRetry",
            "workflow after the retry FirstExecution",
            "resumed attempt 1 FirstExecution",
            // The crash: the journal is replayed by the new process.
            "workflow at start ResumeFromCheckpoint",
            "workflow after the retry ResumeFromCheckpoint",
            "resumed attempt 1 ResumeFromCheckpoint",
            "workflow at the end FirstExecution",
        ]
    );
}

/// What `at_once` saw, in the order it saw it.
static SEEN_AT_ONCE: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Answers at its first poll; says which mode it ran in.
#[activity]
async fn at_once(cx: ActivityContext, step: String) -> Result<String, ActivityError> {
    let seen = format!("{step} attempt {} {:?}", cx.attempt(), cx.replay_mode());
    SEEN_AT_ONCE.lock().unwrap().push(seen);
    Ok(step)
}

#[workflow]
async fn one_read(ctx: WorkflowContext, _input: ()) -> Result<String, WorkflowError> {
    Ok(ctx.activity(at_once, "read".into()).await?)
}

/// A read's schedule is journaled with its answer when it answers at its first poll: a crash
/// in that poll leaves no trace of it, and the next process runs it as a first execution.
#[tokio::test]
async fn a_read_a_crash_stops_at_its_first_poll_runs_again_as_a_first_execution() {
    let crash = PlannedFault::at("at_once", 1, Boundary::BeforeCall, Fault::Crash);
    let setup = |b: WorkerBuilder| b.register(one_read).register(at_once);
    let mut env = TestEnv::with_faults([crash], setup).await.unwrap();
    let wf = "replay-modes-at-once";
    env.worker()
        .start_with(one_read, (), with_id(wf))
        .await
        .unwrap();
    let outcome = env.finish(one_read, wf, 40).await.expect("the run ends");
    assert_eq!(outcome.unwrap(), "read");
    assert_eq!(env.faults().fired().len(), 1);
    let seen = SEEN_AT_ONCE.lock().unwrap().clone();
    assert_eq!(seen, ["read attempt 1 FirstExecution"]);
}

/// What `waits` saw, in the order it saw it.
static SEEN_WAITING: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Says which mode it runs in, then waits, as a call over a network does.
#[activity]
async fn waits(cx: ActivityContext, step: String) -> Result<String, ActivityError> {
    let seen = format!("{step} attempt {} {:?}", cx.attempt(), cx.replay_mode());
    SEEN_WAITING.lock().unwrap().push(seen);
    tokio::task::yield_now().await;
    Ok(step)
}

#[activity]
async fn answers_at_once(step: String) -> Result<String, ActivityError> {
    Ok(step)
}

#[workflow]
async fn joined_reads(ctx: WorkflowContext, _input: ()) -> Result<String, WorkflowError> {
    let (first, second) = futures::join!(
        ctx.activity(answers_at_once, "first".into()),
        ctx.activity(waits, "second".into())
    );
    Ok(first? + &second?)
}

/// A read that waits is journaled as scheduled before the run goes on, whatever its flush's
/// other reads answered at once: a crash one of them brings leaves it in flight, and the next
/// process resumes it.
#[tokio::test]
async fn a_read_that_waits_is_journaled_as_scheduled_before_the_run_goes_on() {
    let crash = PlannedFault::at("answers_at_once", 1, Boundary::AfterCall, Fault::Crash);
    let setup = |b: WorkerBuilder| {
        b.register(joined_reads)
            .register(answers_at_once)
            .register(waits)
    };
    let mut env = TestEnv::with_faults([crash], setup).await.unwrap();
    let wf = "replay-modes-joined";
    env.worker()
        .start_with(joined_reads, (), with_id(wf))
        .await
        .unwrap();
    let outcome = env
        .finish(joined_reads, wf, 40)
        .await
        .expect("the run ends");
    assert_eq!(outcome.unwrap(), "firstsecond");
    assert_eq!(env.faults().fired().len(), 1);
    let seen = SEEN_WAITING.lock().unwrap().clone();
    let resumed = "second attempt 1 ResumeFromCheckpoint";
    assert_eq!(seen, ["second attempt 1 FirstExecution", resumed]);
}
