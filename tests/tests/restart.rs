//! A workflow survives its worker: the worker is stopped (its tasks aborted wherever they are,
//! its store closed) and a new one is started on the same data dir.

use std::time::Duration;

use waymark::prelude::*;
use waymark::testing::TestEnv;
use waymark_tests::{close_gate, count, eventually, executions, open_gate, pass_gate, with_id};

/// Counts its executions per workflow, then waits at its gate.
#[activity]
async fn counted_step(cx: ActivityContext, i: u64) -> Result<u64, ActivityError> {
    count(cx.workflow_id(), &format!("step-{i}"));
    pass_gate(cx.workflow_id(), &format!("step-{i}")).await;
    Ok(i * 10)
}

#[workflow]
async fn pipeline(ctx: WorkflowContext, steps: u64) -> Result<u64, WorkflowError> {
    let mut total = 0;
    for i in 0..steps {
        total += ctx.activity(counted_step, i).await?;
    }
    Ok(total)
}

async fn env() -> TestEnv {
    TestEnv::start(|b| b.register(pipeline).register(counted_step))
        .await
        .expect("worker starts")
}

#[tokio::test]
async fn steps_before_the_crash_are_not_executed_again() {
    const ID: &str = "restart-after-step-3";
    const STEPS: u64 = 6;
    let mut env = env().await;
    close_gate(ID, "step-3");
    let run = env
        .worker()
        .start_with(pipeline, STEPS, with_id(ID))
        .await
        .unwrap();
    assert!(eventually(400, || executions(ID, "step-3") == 1).await);

    env.crash_and_restart().await.unwrap();
    open_gate(ID, "step-3");
    let run = env.worker().handle(pipeline, run.id());
    let total = tokio::time::timeout(Duration::from_secs(20), run.result())
        .await
        .expect("completes after restart")
        .unwrap();

    assert_eq!(total, (0..STEPS).map(|i| i * 10).sum::<u64>());
    for i in 0..3 {
        assert_eq!(
            executions(ID, &format!("step-{i}")),
            1,
            "step {i} ran again"
        );
    }
    assert_eq!(executions(ID, "step-3"), 2, "the in-flight step runs again");
    for i in 4..STEPS {
        assert_eq!(executions(ID, &format!("step-{i}")), 1);
    }
}

#[tokio::test]
async fn repeated_restarts_at_every_step_never_repeat_a_journaled_step() {
    const ID: &str = "restart-at-every-step";
    const STEPS: u64 = 5;
    let mut env = env().await;
    for i in 0..STEPS {
        close_gate(ID, &format!("step-{i}"));
    }
    env.worker()
        .start_with(pipeline, STEPS, with_id(ID))
        .await
        .unwrap();
    for i in 0..STEPS {
        let gate = format!("step-{i}");
        assert!(eventually(400, || executions(ID, &gate) >= 1).await);
        env.crash_and_restart().await.unwrap();
        open_gate(ID, &gate);
    }
    let run = env.worker().handle(pipeline, ID);
    let total = tokio::time::timeout(Duration::from_secs(20), run.result())
        .await
        .expect("completes")
        .unwrap();
    assert_eq!(total, 100);
    for i in 0..STEPS {
        // Each step was in flight at exactly one crash, so it ran exactly twice.
        assert_eq!(executions(ID, &format!("step-{i}")), 2, "step {i}");
    }
}

#[tokio::test]
async fn a_completed_workflow_is_answered_from_the_journal_after_restart() {
    const ID: &str = "restart-completed";
    let mut env = env().await;
    let run = env
        .worker()
        .start_with(pipeline, 2, with_id(ID))
        .await
        .unwrap();
    assert_eq!(run.result().await.unwrap(), 10);
    env.crash_and_restart().await.unwrap();
    let run = env.worker().handle(pipeline, ID);
    assert_eq!(run.result().await.unwrap(), 10);
    assert_eq!(executions(ID, "step-1"), 1);
}

/// A stop must release the store even while steps are in flight on other threads: the next
/// worker on the same directory opens it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stop_in_the_middle_of_a_step_releases_the_store() {
    let mut env = env().await;
    for round in 0..20 {
        let id = format!("restart-mid-step-{round}");
        close_gate(&id, "step-0");
        env.worker()
            .start_with(pipeline, 1, with_id(&id))
            .await
            .unwrap();
        assert!(eventually(400, || executions(&id, "step-0") == 1).await);
        let restarted = env.crash_and_restart().await;
        assert!(restarted.is_ok(), "round {round}: {restarted:?}");
        open_gate(&id, "step-0");
    }
}
