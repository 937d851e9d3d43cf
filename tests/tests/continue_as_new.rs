//! Continue-as-new: a workflow ends its run and starts afresh with a new input under the same
//! id. The run it leaves is kept as `ID#run-N`; the new run's journal starts empty; effects
//! keep their keys. A crash in a later run resumes that run, not the first.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use waymark::inspect::{Entry, WorkflowStatus};
use waymark::prelude::*;
use waymark::testing::TestEnv;
use waymark_tests::{close_gate, count, eventually, executions, open_gate, pass_gate, with_id};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Tally {
    round: u32,
    total: u32,
}

/// Counts its executions, then waits at its gate.
#[activity]
async fn measure(cx: ActivityContext, round: u32) -> Result<u32, ActivityError> {
    count(cx.workflow_id(), &format!("measure-{round}"));
    pass_gate(cx.workflow_id(), &format!("measure-{round}")).await;
    Ok(round * 10)
}

#[activity(effect)]
async fn publish(cx: ActivityContext, #[key] round: u32) -> Result<String, ActivityError> {
    count(cx.workflow_id(), &format!("publish-{round}"));
    Ok(format!("published {round}"))
}

const ROUNDS: u32 = 4;

#[workflow]
async fn tally(ctx: WorkflowContext, state: Tally) -> Result<u32, WorkflowError> {
    let measured = ctx.activity(measure, state.round).await?;
    ctx.effect(publish, state.round).await?;
    let total = state.total + measured;
    if state.round + 1 < ROUNDS {
        let next = Tally {
            round: state.round + 1,
            total,
        };
        return Err(ctx.continue_as_new(&next));
    }
    Ok(total)
}

async fn env() -> TestEnv {
    TestEnv::start(|b| b.register(tally).register(measure).register(publish))
        .await
        .expect("worker starts")
}

#[tokio::test]
async fn each_run_is_kept_and_the_last_one_holds_only_its_own_history() {
    const ID: &str = "tally-runs";
    let env = env().await;
    let run = env
        .worker()
        .start_with(tally, Tally::default(), with_id(ID))
        .await
        .unwrap();
    let total = tokio::time::timeout(Duration::from_secs(20), run.result()).await;
    assert_eq!(total.unwrap().unwrap(), 10 + 20 + 30);

    let journal = env.worker().journal(ID).unwrap();
    let Some(Entry::WorkflowStarted(started)) = journal.first() else {
        panic!("{journal:?}");
    };
    assert_eq!(started.input.as_bytes(), br#"{"round":3,"total":30}"#);
    let scheduled = journal.iter().filter(|e| e.command().is_some()).count();
    assert_eq!(scheduled, 2, "the last run holds its own two steps only");
    assert!(
        matches!(&journal[1], Entry::Forked(f) if f.source == format!("{ID}#run-3") && f.at == 0)
    );
    for run in 1..ROUNDS {
        let kept = format!("{ID}#run-{run}");
        let status = env.worker().workflow_status(&kept).unwrap();
        assert_eq!(status, Some(WorkflowStatus::Completed), "{kept}");
        let history = env.worker().journal(&kept).unwrap();
        let Some(Entry::WorkflowCompleted { output }) = history.last() else {
            panic!("{kept}: {history:?}");
        };
        let output: serde_json::Value = output.decode().unwrap();
        assert_eq!(output["continued_as_new"]["round"], run);
    }
    assert_eq!(
        env.worker()
            .workflow_status(&format!("{ID}#run-{ROUNDS}"))
            .unwrap(),
        None
    );
    for round in 0..ROUNDS {
        assert_eq!(executions(ID, &format!("measure-{round}")), 1);
        assert_eq!(executions(ID, &format!("publish-{round}")), 1);
    }
}

#[tokio::test]
async fn a_crash_in_a_later_run_resumes_that_run() {
    const ID: &str = "tally-crash";
    let mut env = env().await;
    close_gate(ID, "measure-2");
    env.worker()
        .start_with(tally, Tally::default(), with_id(ID))
        .await
        .unwrap();
    assert!(eventually(400, || executions(ID, "measure-2") == 1).await);

    env.crash_and_restart().await.unwrap();
    open_gate(ID, "measure-2");
    let run = env.worker().handle(tally, ID);
    let total = tokio::time::timeout(Duration::from_secs(20), run.result()).await;
    assert_eq!(total.unwrap().unwrap(), 60);

    // Runs 0 and 1 were kept before the crash and are not run again; run 2's step, in flight
    // at the crash, runs again (once), its effect once.
    assert_eq!(executions(ID, "measure-0"), 1);
    assert_eq!(executions(ID, "measure-1"), 1);
    assert_eq!(executions(ID, "measure-2"), 2);
    for round in 0..ROUNDS {
        assert_eq!(
            executions(ID, &format!("publish-{round}")),
            1,
            "round {round}"
        );
    }
    let kept = (1..=ROUNDS).filter(|run| {
        let id = format!("{ID}#run-{run}");
        env.worker().workflow_status(&id).unwrap().is_some()
    });
    assert_eq!(kept.count(), 3, "each run kept once");
}
