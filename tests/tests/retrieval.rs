//! Retrieval snapshots: a retrieval runs once; its result is an immutable artifact referenced
//! by hash from the journal; a resumed workflow gets the snapshot, not a new search; a forced
//! re-fetch that finds something else is recorded as drift.

use std::sync::Mutex;
use waymark::telemetry::names;

use waymark::prelude::*;
use waymark::snapshots::{Retrieval, RetrievedDocument};
use waymark::testing::{Boundary, Fault, PlannedFault, TestEnv};
use waymark::WorkerBuilder;
use waymark_tests::{close_gate, count, eventually, executions, open_gate, pass_gate, with_id};

/// The policy corpus: its version changes when a test edits it.
static CORPUS_VERSION: Mutex<&str> = Mutex::new("policy-v7");

#[activity]
async fn search_policies(cx: ActivityContext, query: String) -> Result<Retrieval, ActivityError> {
    count(cx.workflow_id(), "search");
    let version = *CORPUS_VERSION.lock().unwrap();
    let document = RetrievedDocument {
        id: "rebooking-policy".into(),
        version: version.into(),
        score: 0.82,
        text: "Delays over 48 h may be rebooked with any approved carrier.".into(),
    };
    Ok(Retrieval {
        rewritten_query: Some(format!("policy: {query}")),
        query,
        documents: vec![document],
        index_version: format!("index-{version}"),
    })
}

#[activity]
async fn hold(cx: ActivityContext, step: String) -> Result<String, ActivityError> {
    pass_gate(cx.workflow_id(), "hold").await;
    Ok(step)
}

#[workflow]
async fn grounded(ctx: WorkflowContext, question: String) -> Result<String, WorkflowError> {
    let snapshot = ctx.retrieve(search_policies, question.clone()).await?;
    ctx.activity(hold, "after first search".into()).await?;
    let refreshed = ctx
        .retrieve(search_policies, question)
        .refreshing(&snapshot)
        .await?;
    let versions = [&snapshot, &refreshed].map(|s| s.value().documents[0].version.clone());
    Ok(format!("{} then {}", versions[0], versions[1]))
}

async fn env() -> TestEnv {
    let setup = |b: WorkerBuilder| {
        b.register(grounded)
            .register(search_policies)
            .register(hold)
    };
    TestEnv::start(setup).await.unwrap()
}

#[tokio::test]
async fn a_snapshot_is_replayed_not_searched_again_and_a_refresh_records_drift() {
    let mut env = env().await;
    let wf = "retrieval-snapshot";
    close_gate(wf, "hold");
    env.worker()
        .start_with(grounded, "rebook after 3 days?".into(), with_id(wf))
        .await
        .unwrap();
    assert!(eventually(400, || executions(wf, "search") == 1).await);
    let searched = |env: &TestEnv| env.worker().journal(wf).unwrap_or_default().len() >= 4;
    assert!(eventually(400, || searched(&env)).await);

    // Crash, then the corpus changes: the resumed run must not see the new version through
    // the first retrieval, only through the deliberate refresh.
    env.crash_and_restart().await.unwrap();
    *CORPUS_VERSION.lock().unwrap() = "policy-v8";
    open_gate(wf, "hold");
    let run = env.worker().handle(grounded, wf);
    assert_eq!(run.result().await.unwrap(), "policy-v7 then policy-v8");
    assert_eq!(
        executions(wf, "search"),
        2,
        "one search each, none replayed"
    );
    let drift = env.metrics().value(names::SNAPSHOT_DRIFT, &[]);
    assert_eq!(
        drift, 1.0,
        "the refresh drifted once, and replay does not count it again"
    );

    let journal = env.worker().render_journal(wf).unwrap();
    let hash = journal
        .lines()
        .find_map(|line| line.split("artifact=").nth(1))
        .expect("a snapshot_completed line")
        .to_owned();
    let stored = env.worker().artifact(&hash).unwrap().expect("stored");
    assert_eq!(stored.kind, "retrieval");
    let index = ("index_version".to_owned(), "index-policy-v7".to_owned());
    assert!(stored.metadata.contains(&index), "{:?}", stored.metadata);
    assert!(
        !journal.contains("Delays over 48 h"),
        "the journal holds the hash, not the text"
    );
    assert!(env
        .worker()
        .render_stream(wf)
        .unwrap()
        .contains("retrieval_complete"));
    insta::assert_snapshot!(journal);
}

/// Finds a new version of the policy at each call for the same workflow.
#[activity]
async fn search_each_time_anew(
    cx: ActivityContext,
    query: String,
) -> Result<Retrieval, ActivityError> {
    count(cx.workflow_id(), "search anew");
    let version = format!("policy-v{}", executions(cx.workflow_id(), "search anew"));
    let document = RetrievedDocument {
        id: "rebooking-policy".into(),
        version: version.clone(),
        score: 0.82,
        text: "Delays over 48 h may be rebooked with any approved carrier.".into(),
    };
    Ok(Retrieval {
        rewritten_query: None,
        query,
        documents: vec![document],
        index_version: format!("index-{version}"),
    })
}

#[activity]
async fn read_at_once(step: String) -> Result<String, ActivityError> {
    Ok(step)
}

/// Records drift, and in the same poll issues a read that answers at once.
#[workflow]
async fn drifts_then_reads(
    ctx: WorkflowContext,
    question: String,
) -> Result<String, WorkflowError> {
    let snapshot = ctx
        .retrieve(search_each_time_anew, question.clone())
        .await?;
    let refreshing = ctx.retrieve(search_each_time_anew, question);
    refreshing.refreshing(&snapshot).await?;
    Ok(ctx.activity(read_at_once, "read".into()).await?)
}

/// The drift is counted once its verdict is written, even when that write is held back with
/// a read's schedule and a crash at the read's first poll loses both: the next process
/// records the drift again and counts it then.
#[tokio::test]
async fn drift_held_back_with_a_read_is_counted_once_across_a_crash() {
    let crash = PlannedFault::at("read_at_once", 1, Boundary::BeforeCall, Fault::Crash);
    let setup = |b: WorkerBuilder| {
        b.register(drifts_then_reads)
            .register(search_each_time_anew)
            .register(read_at_once)
    };
    let mut env = TestEnv::with_faults([crash], setup).await.unwrap();
    let wf = "retrieval-drift-held-back";
    env.worker()
        .start_with(drifts_then_reads, "rebook?".into(), with_id(wf))
        .await
        .unwrap();
    let outcome = env
        .finish(drifts_then_reads, wf, 40)
        .await
        .expect("it ends");
    assert_eq!(outcome.unwrap(), "read");
    assert_eq!(env.faults().fired().len(), 1);
    assert_eq!(
        executions(wf, "search anew"),
        2,
        "replayed, not searched again"
    );
    let drift = env.metrics().value(names::SNAPSHOT_DRIFT, &[]);
    assert_eq!(drift, 1.0, "counted by the process that wrote it alone");
}
