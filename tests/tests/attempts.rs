//! Where an attempt runs. One that finishes at its first poll finishes on its workflow's own
//! task: no task is spawned for it and no thread is woken to run it. One that has to wait goes
//! on a task of its own, so that the workflow handles its other events meanwhile.

use std::sync::Mutex;

use waymark::inspect::Entry;
use waymark::prelude::*;
use waymark::store::Store;
use waymark::testing::TestEnv;
use waymark::{Worker, WorkerBuilder};
use waymark_tests::store::WatchedStore;
use waymark_tests::with_id;

/// The task each labelled piece of code ran on, in the order they ran.
static RAN_ON: Mutex<Vec<(&'static str, Option<tokio::task::Id>)>> = Mutex::new(Vec::new());

fn ran(label: &'static str) {
    RAN_ON.lock().unwrap().push((label, tokio::task::try_id()));
}

fn task_of(label: &str) -> Vec<Option<tokio::task::Id>> {
    let ran_on = RAN_ON.lock().unwrap();
    let of_label = ran_on.iter().filter(|(l, _)| *l == label);
    of_label.map(|(_, task)| *task).collect()
}

#[activity]
async fn at_once(label: String) -> Result<String, ActivityError> {
    ran("at_once");
    Ok(label)
}

#[activity]
async fn after_a_wait(label: String) -> Result<String, ActivityError> {
    tokio::task::yield_now().await;
    ran("after_a_wait");
    Ok(label)
}

/// Set once the attempt waits for [`GO`].
static WAITING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static GO: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// Waits for the test to say go: woken only through the waker of its latest poll.
#[activity]
async fn until_go(label: String) -> Result<String, ActivityError> {
    let go = GO.notified();
    WAITING.store(true, std::sync::atomic::Ordering::SeqCst);
    go.await;
    Ok(label)
}

#[activity]
async fn fanned_out(label: String) -> Result<String, ActivityError> {
    ran(if label == "first" {
        "fanned_first"
    } else {
        "fanned_last"
    });
    Ok(label)
}

/// Two attempts started by one flush: both answer at their first poll, on the workflow's task,
/// in call order.
#[workflow]
async fn fan_out(ctx: WorkflowContext, _input: ()) -> Result<String, WorkflowError> {
    ran("fan_out");
    let first = ctx.activity(fanned_out, "first".into());
    let last = ctx.activity(fanned_out, "last".into());
    let (first, last) = futures::join!(first, last);
    Ok(first? + &last?)
}

/// Set once the attempt that never answers waits.
static STUCK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Holds a value whose destructor panics: dropping the attempt when it times out panics in
/// the runtime's code, not in a poll of the application's.
struct PanicsWhenDropped;

impl Drop for PanicsWhenDropped {
    fn drop(&mut self) {
        panic!("a connection pool refused to be dropped mid-request");
    }
}

#[activity]
async fn never_answers(_label: String) -> Result<String, ActivityError> {
    let _held = PanicsWhenDropped;
    STUCK.store(true, std::sync::atomic::Ordering::SeqCst);
    std::future::pending().await
}

#[workflow]
async fn times_out_once(ctx: WorkflowContext, _input: ()) -> Result<String, WorkflowError> {
    let options = ActivityOptions::default()
        .max_attempts(1)
        .start_to_close_timeout(std::time::Duration::from_secs(5));
    Ok(ctx
        .activity_with(options, never_answers, "stuck".into())
        .await?)
}

#[workflow]
async fn waits_for_go(ctx: WorkflowContext, _input: ()) -> Result<String, WorkflowError> {
    Ok(ctx.activity(until_go, "went".into()).await?)
}

#[workflow]
async fn two_steps(ctx: WorkflowContext, _input: ()) -> Result<String, WorkflowError> {
    ran("workflow");
    let first = ctx.activity(at_once, "a".into()).await?;
    let second = ctx.activity(after_a_wait, "b".into()).await?;
    Ok(first + &second)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_that_finishes_at_once_runs_on_its_workflows_task() {
    let env = TestEnv::start(register).await.unwrap();
    let run = env
        .worker()
        .start_with(two_steps, (), with_id("attempt-tasks"))
        .await
        .unwrap();
    assert_eq!(run.result().await.unwrap(), "ab");
    let workflow = task_of("workflow");
    assert_eq!(workflow.len(), 1, "one run, never replayed");
    assert!(workflow[0].is_some(), "the workflow runs on a task");
    assert_eq!(task_of("at_once"), workflow, "no task of its own");
    let waited = task_of("after_a_wait");
    assert_eq!(waited.len(), 1);
    assert!(waited[0].is_some() && waited != workflow, "{waited:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_started_together_take_their_first_polls_in_call_order() {
    let env = TestEnv::start(register).await.unwrap();
    let run = env
        .worker()
        .start_with(fan_out, (), with_id("attempt-fan-out"))
        .await
        .unwrap();
    assert_eq!(run.result().await.unwrap(), "firstlast");
    let workflow = task_of("fan_out");
    assert_eq!(workflow.len(), 1);
    assert_eq!(task_of("fanned_first"), workflow);
    assert_eq!(task_of("fanned_last"), workflow);
    let ran_on = RAN_ON.lock().unwrap();
    let order: Vec<&str> = ran_on.iter().map(|(label, _)| *label).collect();
    let at = |label| order.iter().position(|l| *l == label);
    assert!(at("fanned_first") < at("fanned_last"), "{order:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_first_polled_by_its_workflow_is_woken_on_its_own_task() {
    let env = TestEnv::start(register).await.unwrap();
    let run = env
        .worker()
        .start_with(waits_for_go, (), with_id("attempt-go"))
        .await
        .unwrap();
    let waiting = || WAITING.load(std::sync::atomic::Ordering::SeqCst);
    assert!(waymark_tests::eventually(400, waiting).await);
    // Its own task has polled it again by now: a waker left from the first poll wakes nothing.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    GO.notify_waiters();
    let answer = tokio::time::timeout(std::time::Duration::from_secs(10), run.result()).await;
    assert_eq!(answer.expect("woken").unwrap(), "went");
}

/// Without an answer for a panic outside the application's polls, the attempt's task would
/// end and its command wait for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_whose_cancellation_panics_still_answers() {
    let env = TestEnv::start(register).await.unwrap();
    let run = env
        .worker()
        .start_with(times_out_once, (), with_id("attempt-drop-panics"))
        .await
        .unwrap();
    let stuck = || STUCK.load(std::sync::atomic::Ordering::SeqCst);
    assert!(waymark_tests::eventually(400, stuck).await);
    env.advance(std::time::Duration::from_secs(6)).await;
    let answer = tokio::time::timeout(std::time::Duration::from_secs(10), run.result()).await;
    let error = answer.expect("an answer").unwrap_err().to_string();
    let expected = "the attempt panicked after its call: a connection pool refused to be dropped";
    assert!(error.contains(expected), "{error}");
}

#[activity]
async fn instant_read(step: u32) -> Result<u32, ActivityError> {
    Ok(step)
}

#[activity]
async fn waiting_read(step: u32) -> Result<u32, ActivityError> {
    tokio::task::yield_now().await;
    Ok(step)
}

#[workflow]
async fn instant_reads(ctx: WorkflowContext, steps: u32) -> Result<u32, WorkflowError> {
    for step in 0..steps {
        ctx.activity(instant_read, step).await?;
    }
    Ok(steps)
}

#[workflow]
async fn waiting_reads(ctx: WorkflowContext, steps: u32) -> Result<u32, WorkflowError> {
    for step in 0..steps {
        ctx.activity(waiting_read, step).await?;
    }
    Ok(steps)
}

/// The kind of each entry of `workflow_id`'s journal.
fn entry_kinds(worker: &Worker, workflow_id: &str) -> Vec<String> {
    let journal = worker.journal(workflow_id).unwrap();
    let kind = |entry: &Entry| {
        format!("{entry:?}")
            .split([' ', '(', '{'])
            .next()
            .map(str::to_owned)
    };
    journal.iter().filter_map(kind).collect()
}

/// A read that answers at its first poll is journaled with its schedule in one write; one
/// that waits is journaled as scheduled before it answers, in two. The journals are alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_answers_at_once_is_journaled_with_its_schedule_in_one_write() {
    let dir = tempfile::tempdir().unwrap();
    let store = WatchedStore::open(dir.path()).unwrap();
    let builder = Worker::builder().store(store.clone());
    let builder = builder.register(instant_reads).register(instant_read);
    let builder = builder.register(waiting_reads).register(waiting_read);
    let worker = builder.build().await.unwrap();
    let transitions = || store.write_stats().unwrap().transitions;

    let before = transitions();
    let run = worker.start_with(instant_reads, 5, with_id("one-write-a-read"));
    assert_eq!(run.await.unwrap().result().await.unwrap(), 5);
    let answered = transitions() - before;
    let before = transitions();
    let run = worker.start_with(waiting_reads, 5, with_id("two-writes-a-read"));
    assert_eq!(run.await.unwrap().result().await.unwrap(), 5);
    let waited = transitions() - before;

    assert_eq!(waited - answered, 5, "{waited} writes against {answered}");
    let kinds = entry_kinds(&worker, "one-write-a-read");
    assert_eq!(kinds, entry_kinds(&worker, "two-writes-a-read"));
    assert_eq!(kinds.len(), 2 + 2 * 5, "{kinds:?}");
    worker.shutdown().await;
}

static HELD_OPEN: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// Waits until the test lets it go.
#[activity]
async fn held_open(_step: u32) -> Result<u32, ActivityError> {
    HELD_OPEN.notified().await;
    Ok(0)
}

/// Reads the clock between two answers while a read is still out.
#[workflow]
async fn clock_while_out(ctx: WorkflowContext, _input: ()) -> Result<u32, WorkflowError> {
    let then_clock = async {
        let step = ctx.activity(instant_read, 1).await?;
        let _ = ctx.now();
        Ok::<u32, ActivityError>(step)
    };
    let (out, step) = futures::join!(ctx.activity(held_open, 0), then_clock);
    Ok(out? + step?)
}

/// What a run holds back (here the clock read, whose flush starts nothing) is written before
/// the run waits for what comes next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_held_back_while_the_run_waits() {
    let dir = tempfile::tempdir().unwrap();
    let store = WatchedStore::open(dir.path()).unwrap();
    let builder = Worker::builder()
        .store(store.clone())
        .register(clock_while_out);
    let builder = builder.register(held_open).register(instant_read);
    let worker = builder.build().await.unwrap();
    let wf = "held-back-clock";
    let run = worker
        .start_with(clock_while_out, (), with_id(wf))
        .await
        .unwrap();
    let recorded = || {
        entry_kinds(&worker, wf)
            .iter()
            .any(|kind| kind == "ValueRecorded")
    };
    assert!(
        waymark_tests::eventually(400, recorded).await,
        "{:?}",
        entry_kinds(&worker, wf)
    );
    HELD_OPEN.notify_waiters();
    assert_eq!(run.result().await.unwrap(), 1);
    worker.shutdown().await;
}

fn register(b: WorkerBuilder) -> WorkerBuilder {
    b.register(times_out_once)
        .register(never_answers)
        .register(two_steps)
        .register(fan_out)
        .register(waits_for_go)
        .register(at_once)
        .register(after_a_wait)
        .register(fanned_out)
        .register(until_go)
}
