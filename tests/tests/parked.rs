//! Parked workflows: a run that left memory waiting for a signal or a timer stays out of memory
//! when a worker restarts on the same code, and is rebuilt when what it waits for comes; every
//! write for it afterwards takes the mark away, so a crash never leaves a run in flight
//! unresumed.

use std::time::Duration;

use waymark::inspect::{Entry, Payload, WorkflowStatus};
use waymark::prelude::*;
use waymark::signals::InboxMessage;
use waymark::telemetry::names;
use waymark::testing::TestEnv;
use waymark::WorkerBuilder;
use waymark_tests::{close_gate, count, eventually, open_gate, pass_gate, with_id};

const NAP: Duration = Duration::from_secs(3_600);

#[workflow]
async fn wait_for_go(ctx: WorkflowContext, _input: ()) -> Result<String, WorkflowError> {
    let go: String = ctx.signal("go").await?;
    Ok(format!("went: {go}"))
}

#[workflow]
async fn nap_then_step(ctx: WorkflowContext, _input: ()) -> Result<String, WorkflowError> {
    ctx.sleep(NAP).await;
    let done = ctx.activity(gated_step, ()).await?;
    Ok(done)
}

/// Counts its executions and waits at the gate `step` of its workflow.
#[activity]
async fn gated_step(cx: ActivityContext) -> Result<String, ActivityError> {
    count(cx.workflow_id(), "step");
    pass_gate(cx.workflow_id(), "step").await;
    Ok("stepped".into())
}

async fn env() -> TestEnv {
    let setup = |b: WorkerBuilder| {
        b.register(wait_for_go)
            .register(nap_then_step)
            .register(gated_step)
    };
    TestEnv::start(setup).await.unwrap()
}

fn recovered_loads(env: &TestEnv) -> f64 {
    let metrics = env.metrics();
    metrics.value(names::WORKFLOW_LOADS, &[("wake", "recovered")])
}

fn journal_has(env: &TestEnv, wf: &str, wanted: impl Fn(&Entry) -> bool) -> bool {
    let journal = env.worker().journal(wf).unwrap_or_default();
    journal.iter().any(wanted)
}

/// Starts `wf` waiting for `go` and waits until no workflow is in memory.
async fn parked_on_signal(env: &TestEnv, wf: &str) {
    env.worker()
        .start_with(wait_for_go, (), with_id(wf))
        .await
        .unwrap();
    let waits = |e: &Entry| matches!(e, Entry::SignalAwaitedAt { .. });
    assert!(eventually(400, || journal_has(env, wf, waits)).await);
    assert!(eventually(400, || env.worker().resident_workflows() == 0).await);
}

/// Starts `wf` napping and waits until no workflow is in memory.
async fn parked_on_timer(env: &TestEnv, wf: &str) {
    env.worker()
        .start_with(nap_then_step, (), with_id(wf))
        .await
        .unwrap();
    assert!(env.wait_for_timer(wf, Duration::from_secs(10)).await);
    assert!(eventually(400, || env.worker().resident_workflows() == 0).await);
}

async fn within_ten_seconds<T>(what: impl std::future::Future<Output = T>) -> Option<T> {
    tokio::time::timeout(Duration::from_secs(10), what)
        .await
        .ok()
}

#[tokio::test]
async fn parked_workflows_stay_out_of_memory_across_a_restart() {
    let mut env = env().await;
    for wf in ["parked-go-1", "parked-go-2"] {
        parked_on_signal(&env, wf).await;
    }
    parked_on_timer(&env, "parked-nap").await;
    let before = recovered_loads(&env);
    env.crash_and_restart().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        recovered_loads(&env),
        before,
        "a parked workflow was rebuilt"
    );
    assert_eq!(env.worker().resident_workflows(), 0);
    // Each is rebuilt by what it waits for, and goes on where it was.
    let worker = env.worker();
    worker
        .signal("parked-go-1", "go", "s-1", &"now")
        .await
        .unwrap();
    let run = worker.handle(wait_for_go, "parked-go-1");
    assert_eq!(run.result().await.unwrap(), "went: now");
    env.advance(NAP + Duration::from_secs(1)).await;
    let run = env.worker().handle(nap_then_step, "parked-nap");
    assert_eq!(run.result().await.unwrap(), "stepped");
    let status = env.worker().workflow_status("parked-go-2").unwrap();
    assert_eq!(status, Some(WorkflowStatus::AwaitingSignal), "still parked");
}

#[tokio::test]
async fn a_signal_kept_while_no_worker_runs_wakes_its_parked_workflow() {
    let mut env = env().await;
    let wf = "parked-signalled-offline";
    parked_on_signal(&env, wf).await;
    env.stop().await;
    if waymark_tests::beneath_rocksdb_only(&env) {
        return;
    }
    {
        use waymark::store::Store;
        // What a crash between keeping a signal and delivering it leaves.
        let store = waymark::store::RocksStore::open(env.data_dir()).unwrap();
        let message = InboxMessage {
            name: "go".into(),
            signal_id: "offline-1".into(),
            payload: Payload::encode(&"offline").unwrap(),
            sent_at_ms: 0,
            sender: None,
        };
        store.send_signal(wf, message).await.unwrap();
    }
    env.boot().await.unwrap();
    let run = env.worker().handle(wait_for_go, wf);
    let result = within_ten_seconds(run.result()).await;
    let result = result.expect("the signal kept while stopped woke the workflow");
    assert_eq!(result.unwrap(), "went: offline");
}

#[tokio::test]
async fn a_run_woken_by_its_timer_is_rebuilt_after_a_crash_in_its_next_step() {
    let mut env = env().await;
    let wf = "parked-woken-then-crashed";
    close_gate(wf, "step");
    parked_on_timer(&env, wf).await;
    env.advance(NAP + Duration::from_secs(1)).await;
    let fired = |e: &Entry| matches!(e, Entry::TimerFired { .. } | Entry::TimerFiredAt { .. });
    assert!(eventually(400, || journal_has(&env, wf, fired)).await);
    assert!(eventually(400, || waymark_tests::executions(wf, "step") == 1).await);
    env.crash_and_restart().await.unwrap();
    open_gate(wf, "step");
    let run = env.worker().handle(nap_then_step, wf);
    let result = within_ten_seconds(run.result()).await;
    let result = result.expect("the run in flight was resumed on start");
    assert_eq!(result.unwrap(), "stepped");
}

#[tokio::test]
async fn a_fork_inside_a_sleep_is_rebuilt_on_start_to_arm_its_timer_again() {
    let mut env = env().await;
    let source = "parked-fork-source";
    parked_on_timer(&env, source).await;
    let at = env.worker().journal(source).unwrap().len() as u64;
    let options = waymark::ForkOptions {
        at,
        workflow_id: Some("parked-fork".into()),
        ..Default::default()
    };
    let fork = env.worker().fork(source, options).await.unwrap();
    // Its sleep is armed in memory by the fork's replay, with no row to fire it after a
    // restart: only a rebuild on start arms it again.
    assert!(env.wait_for_timer(&fork, Duration::from_secs(10)).await);
    assert!(eventually(400, || env.worker().resident_workflows() == 0).await);
    env.crash_and_restart().await.unwrap();
    env.advance(NAP + Duration::from_secs(1)).await;
    let run = env.worker().handle(nap_then_step, &fork);
    let result = within_ten_seconds(run.result()).await;
    let result = result.expect("the fork's timer fired after the restart");
    assert_eq!(result.unwrap(), "stepped");
}
