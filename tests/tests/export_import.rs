//! Moving a workflow between stores with `export` and `import`: the export carries the
//! journal, the operation log rows and the artifacts, so the imported workflow answers an
//! effect committed where it came from instead of calling the downstream again, under its own
//! id or another; a cut or mixed export is refused and writes nothing.

use std::time::Duration;

use waymark::approvals::ArtifactMeta;
use waymark::inspect::{
    import_workflow, DataDir, Entry, Export, OperationStatus, Payload, IMPORTED_BY,
};
use waymark::prelude::*;
use waymark::store::{Failure, FailureKind};
use waymark::testing::TestEnv;
use waymark_tests::{count, eventually, executions, with_id};

/// Books a seat: counted per workflow, so a second call anywhere shows.
#[activity(effect)]
async fn book(cx: ActivityContext, #[key] order: String) -> Result<String, ActivityError> {
    count(cx.workflow_id(), "book");
    Ok(format!("booked {order}"))
}

/// Books, commits the plan it booked by, waits for a go, then books the same order again:
/// the same intent, which the operation log answers.
#[workflow]
async fn book_twice(ctx: WorkflowContext, order: String) -> Result<String, WorkflowError> {
    let first = ctx.effect(book, order.clone()).await?;
    ctx.artifact_with(format!("plan for {order}"), ArtifactMeta::new("plan"))?;
    let go: String = ctx.signal("go").await?;
    let again = ctx.effect(book, order).await?;
    Ok(format!("{first}; {go}; {again}"))
}

fn setup(b: waymark::WorkerBuilder) -> waymark::WorkerBuilder {
    b.register(book_twice).register(book)
}

async fn waiting_for_go(env: &TestEnv, id: &str) -> bool {
    eventually(400, || {
        let status = env.worker().workflow_status(id).unwrap();
        status == Some(waymark::inspect::WorkflowStatus::AwaitingSignal)
    })
    .await
}

/// A workflow waiting for its signal on store A, exported from A.
async fn exported_from_a(id: &str) -> Option<(TestEnv, Vec<u8>)> {
    let mut a = TestEnv::start(setup).await.unwrap();
    if waymark_tests::beneath_rocksdb_only(&a) {
        return None;
    }
    a.worker()
        .start_with(book_twice, "seat-4".into(), with_id(id))
        .await
        .unwrap();
    assert!(waiting_for_go(&a, id).await, "A books and waits");
    a.stop().await;
    let export = DataDir::open(a.data_dir()).unwrap().export(id).unwrap();
    assert_eq!(export.operations.len(), 1, "{export:?}");
    assert_eq!(export.artifacts.len(), 1, "{export:?}");
    Some((a, export.write(None).unwrap()))
}

/// Imports `bytes` into a fresh store B as `as_id`, and finishes the workflow there.
async fn finished_in_b(bytes: &[u8], as_id: &str) -> (TestEnv, String) {
    let mut b = TestEnv::start(setup).await.unwrap();
    b.stop().await;
    let imported = import_workflow(b.data_dir(), as_id, bytes, None)
        .await
        .unwrap();
    assert_eq!((imported.operations, imported.artifacts), (1, 1));
    b.boot().await.unwrap();
    let worker = b.worker();
    worker.signal(as_id, "go", "go-1", &"go").await.unwrap();
    let run = worker.handle(book_twice, as_id);
    let output = tokio::time::timeout(Duration::from_secs(10), run.result()).await;
    (b, output.expect("B finishes the workflow").unwrap())
}

#[tokio::test]
async fn an_imported_workflow_answers_its_committed_effects_from_the_imported_log() {
    const ID: &str = "moved-booking";
    let Some((_a, bytes)) = exported_from_a(ID).await else {
        return;
    };
    let (b, output) = finished_in_b(&bytes, ID).await;
    assert_eq!(output, "booked seat-4; go; booked seat-4");
    assert_eq!(executions(ID, "book"), 1, "booked once, in A, in all");

    let operations = b.worker().operations(ID).unwrap();
    let (_, booked) = &operations[0];
    let last = booked.history.last().unwrap();
    assert_eq!(last.by.as_deref(), Some("imported:moved-booking"));
    assert!(last.by.as_deref().unwrap().starts_with(IMPORTED_BY));
    let moved = b.worker().export(ID).unwrap();
    let original = Export::read(&bytes, None).unwrap();
    assert_eq!(moved.artifacts, original.artifacts, "the plan came along");
    let prefix = &moved.entries[..original.entries.len()];
    assert_eq!(prefix, original.entries.as_slice());
}

/// Under another id, the rows are rebased to the keys the code derives there.
#[tokio::test]
async fn an_import_under_another_id_finds_its_rows_under_its_own_keys() {
    const ID: &str = "booking-source";
    let Some((_a, bytes)) = exported_from_a(ID).await else {
        return;
    };
    let copy = "booking-copy";
    let (b, output) = finished_in_b(&bytes, copy).await;
    assert_eq!(output, "booked seat-4; go; booked seat-4");
    assert_eq!(executions(copy, "book"), 0, "the copy booked nothing");
    let (key, _) = &b.worker().operations(copy).unwrap()[0];
    assert!(key.starts_with(copy), "{key}");
    let journal = b.worker().journal(copy).unwrap();
    let keys: Vec<&String> = journal
        .iter()
        .filter_map(|entry| match entry {
            Entry::ActivityScheduledAt {
                idempotency_key, ..
            } => idempotency_key.as_ref(),
            _ => None,
        })
        .collect();
    assert!(!keys.is_empty());
    assert!(keys.iter().all(|k| k.starts_with(copy)), "{keys:?}");
}

/// Imports `export` into a fresh store as `as_id`: the refusal's text, and that nothing was
/// written.
async fn refused(export: &Export, as_id: &str) -> String {
    let mut b = TestEnv::start(setup).await.unwrap();
    b.stop().await;
    let bytes = export.write(None).unwrap();
    let refused = import_workflow(b.data_dir(), as_id, &bytes, None).await;
    let refused = refused.unwrap_err().to_string();
    let data = DataDir::open(b.data_dir()).unwrap();
    assert!(
        data.workflow(as_id).unwrap().is_none(),
        "nothing was written"
    );
    assert!(
        data.all_operations().unwrap().is_empty(),
        "no row was written"
    );
    refused
}

/// What an import is given is checked before anything is written: a row of another
/// workflow, an artifact the journal did not commit or whose content is not its hash's, and,
/// under a new id, an effect whose outcome is unknown (the downstream knows its old key).
#[tokio::test]
async fn an_export_holding_what_is_not_its_own_is_refused() {
    const ID: &str = "booking-checked";
    let Some((_a, bytes)) = exported_from_a(ID).await else {
        return;
    };
    let export = Export::read(&bytes, None).unwrap();

    let mut foreign = export.clone();
    foreign.operations[0].0 = "victim|book|[\"seat-4\"]|v1".to_owned();
    let refusal = refused(&foreign, ID).await;
    assert!(refusal.contains("not a row of"), "{refusal}");

    let mut forged = export.clone();
    forged.artifacts[0].1.content = Payload::encode(&"another plan").unwrap();
    let refusal = refused(&forged, ID).await;
    assert!(refusal.contains("content of another hash"), "{refusal}");

    let mut unnamed = export.clone();
    unnamed.artifacts[0].0 = Payload::encode(&"x").unwrap().digest();
    let refusal = refused(&unnamed, ID).await;
    assert!(
        refusal.contains("not one the journal committed"),
        "{refusal}"
    );

    let mut unknown = export.clone();
    let failure = Failure {
        kind: FailureKind::Uncertain,
        message: "no answer".into(),
        retry_after_ms: None,
    };
    unknown.operations[0].1.status = OperationStatus::UnknownOutcome { failure };
    let refusal = refused(&unknown, "booking-elsewhere").await;
    assert!(refusal.contains("is unknown_outcome"), "{refusal}");
    // Under its own id it keeps its key: the reconciler asks about the one the downstream saw.
    let mut b = TestEnv::start(setup).await.unwrap();
    b.stop().await;
    let bytes = unknown.write(None).unwrap();
    import_workflow(b.data_dir(), ID, &bytes, None)
        .await
        .unwrap();
}

/// Keys of any length round-trip in a plain export, those whose length prefix is the byte
/// that once marked a sealed frame (197 ≡ 69 mod 128) among them.
#[tokio::test]
async fn long_keys_round_trip_in_a_plain_export() {
    const ID: &str = "booking-long-keys";
    let Some((_a, bytes)) = exported_from_a(ID).await else {
        return;
    };
    let mut export = Export::read(&bytes, None).unwrap();
    let prefix = export.operations[0].0.split('|').next().unwrap().to_owned();
    for len in [69, 128, 197, 325, 453] {
        let filler = "k".repeat(len - prefix.len() - 1);
        export.operations[0].0 = format!("{prefix}|{filler}");
        assert_eq!(export.operations[0].0.len(), len);
        let written = export.write(None).unwrap();
        assert_eq!(
            Export::read(&written, None).unwrap(),
            export,
            "a key of {len} bytes"
        );
    }
}
/// A cut export (even at a frame's edge) and a sealed one without keys are refused, and
/// nothing is written.
#[tokio::test]
async fn a_cut_export_is_refused_and_writes_nothing() {
    const ID: &str = "booking-cut";
    let Some((_a, bytes)) = exported_from_a(ID).await else {
        return;
    };
    let last_frame = {
        let export = Export::read(&bytes, None).unwrap();
        let mut shorter = export.clone();
        shorter.artifacts.clear();
        export.write(None).unwrap().len() - shorter.write(None).unwrap().len()
    };
    let cut = &bytes[..bytes.len() - last_frame];
    let mut b = TestEnv::start(setup).await.unwrap();
    b.stop().await;
    let refused = import_workflow(b.data_dir(), ID, cut, None).await;
    let refused = refused.unwrap_err().to_string();
    assert!(
        refused.contains("ends before the frames its header counts"),
        "{refused}"
    );
    let data = DataDir::open(b.data_dir()).unwrap();
    assert!(data.workflow(ID).unwrap().is_none(), "nothing was written");
}
