//! Continue-as-new: a workflow ends its run and starts afresh with a new input under the same
//! id. The run it leaves is kept as `ID#run-N`; the new run's journal starts empty; effects
//! keep their keys. A crash in a later run resumes that run, not the first.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use waymark::approvals::{ApprovalOutcome, ApprovalVerdict};
use waymark::inspect::{Entry, WorkflowStatus};
use waymark::prelude::*;
use waymark::testing::TestEnv;
use waymark::ApprovalError;
use waymark_tests::{
    close_gate, count, eventually, executions, hold_poll_while_held, hold_polls, open_gate,
    pass_gate, release_polls, with_id,
};

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

/// Asks for its plan's approval; a `next` signal that comes first continues it as new, from a
/// poll a test can hold, into a run that asks for the same plan's approval again.
#[workflow]
async fn approve_or_continue(ctx: WorkflowContext, round: u32) -> Result<String, WorkflowError> {
    let plan = ctx.artifact(serde_json::json!({ "plan": "rebook ORD-7" }))?;
    if round > 1 {
        return Ok(match ctx.approval(&plan).await {
            ApprovalOutcome::Approved(_) => "approved".to_owned(),
            ApprovalOutcome::Rejected { reason, .. } => format!("rejected: {reason}"),
            ApprovalOutcome::Expired => "expired".to_owned(),
        });
    }
    let mut approval = std::future::IntoFuture::into_future(ctx.approval(&plan));
    let mut next = ctx.signal::<String>("next");
    let approved = waymark::select! {
        _ = approval => true,
        _ = next => false,
    };
    if approved {
        return Ok("approved in round 1".to_owned());
    }
    hold_poll_while_held(ctx.workflow_id());
    Err(ctx.continue_as_new(&2u32))
}

/// An approval decision that reached a run as it continued as new is refused, not handed to
/// the next run: that run's request for the same plan is a new one, which a decision made on
/// the earlier request must not settle.
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn an_approval_sent_as_its_run_continues_as_new_leaves_the_next_runs_request_pending() {
    let env = TestEnv::start(|b| b.register(approve_or_continue))
        .await
        .unwrap();
    let wf = "approval-meets-continue";
    let run = env
        .worker()
        .start_with(approve_or_continue, 1, with_id(wf))
        .await
        .unwrap();
    let pending = || env.worker().pending_approvals(wf).unwrap();
    assert!(eventually(400, || !pending().is_empty()).await);
    let asked = pending().remove(0);

    // The signal wins; the run is held in the poll that continues as new, and the decision
    // waits in its mailbox meanwhile.
    hold_polls(wf);
    env.worker()
        .signal(wf, "next", "next-1", &"now")
        .await
        .unwrap();
    let verdict = ApprovalVerdict::Approve;
    let decided = env.worker().decide_approval_request(
        wf,
        asked.request,
        &asked.artifact_hash,
        "dana@ops",
        verdict,
    );
    let release = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        release_polls(wf);
    };
    let (decided, ()) = tokio::join!(decided, release);
    let refused = decided.unwrap_err();
    assert!(
        matches!(refused, ApprovalError::RunContinued(_)),
        "{refused}"
    );

    let next_run_asks = || {
        let journal = env.worker().journal(wf).unwrap();
        matches!(journal.get(1), Some(Entry::Forked(_))) && !pending().is_empty()
    };
    assert!(eventually(400, next_run_asks).await);
    let again = pending().remove(0);
    assert_eq!(
        (again.request, &again.artifact_hash),
        (asked.request, &asked.artifact_hash),
        "the same request number, for the same plan"
    );
    let asking = WorkflowStatus::AwaitingApproval;
    let still_asking = || env.worker().workflow_status(wf).unwrap() == Some(asking);
    assert!(eventually(400, still_asking).await, "still asking");
    assert_eq!(pending().len(), 1, "not settled by the refused decision");
    env.worker()
        .decide_approval(
            wf,
            &again.artifact_hash,
            "dana@ops",
            ApprovalVerdict::Approve,
        )
        .await
        .unwrap();
    let run = env.worker().handle(approve_or_continue, run.id());
    let output = tokio::time::timeout(Duration::from_secs(10), run.result()).await;
    assert_eq!(output.unwrap().unwrap(), "approved");
}
