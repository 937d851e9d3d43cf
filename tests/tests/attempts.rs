//! Where an attempt runs. One that finishes at its first poll finishes on its workflow's own
//! task: no task is spawned for it and no thread is woken to run it. One that has to wait goes
//! on a task of its own, so that the workflow handles its other events meanwhile.

use std::sync::Mutex;

use waymark::prelude::*;
use waymark::testing::TestEnv;
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

#[workflow]
async fn two_steps(ctx: WorkflowContext, _input: ()) -> Result<String, WorkflowError> {
    ran("workflow");
    let first = ctx.activity(at_once, "a".into()).await?;
    let second = ctx.activity(after_a_wait, "b".into()).await?;
    Ok(first + &second)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_that_finishes_at_once_runs_on_its_workflows_task() {
    let env = TestEnv::start(|b| {
        b.register(two_steps)
            .register(at_once)
            .register(after_a_wait)
    })
    .await
    .unwrap();
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
