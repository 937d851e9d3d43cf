//! What only the RocksDB engine has: read-only opens, the lock of one process per store, and
//! the upgrade of a store written by an older build.

mod common;

use common::{record, start, started};
use waymark_runtime::journal::Payload;
use waymark_runtime::store::{Parking, RocksStore, Store, StoreError, Transition};
use waymark_runtime::streams::ChunkWriter;
use waymark_runtime::streams::StreamItem;

#[tokio::test]
async fn a_read_only_store_reads_and_refuses_writes() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = RocksStore::open(dir.path()).unwrap();
        store.commit(start("wf")).await.unwrap();
    }
    let store = RocksStore::open_read_only(dir.path()).unwrap();
    assert_eq!(store.journal("wf").unwrap(), vec![started()]);
    let refused = store.commit(start("other")).await;
    assert!(matches!(refused, Err(StoreError::Closed)));
}

/// A parked mark reads back whatever its digest: a value in clear that begins with the byte a
/// sealed value begins with (0xC5) is not taken for one.
#[tokio::test]
async fn a_parked_mark_reads_back_whatever_its_digest() {
    let dir = tempfile::tempdir().unwrap();
    let store = RocksStore::open(dir.path()).unwrap();
    let digests = [0, u64::MAX, 0xC5 << 56, 0xC5];
    for (index, code_digest) in digests.into_iter().enumerate() {
        let id = format!("wf-{index}");
        store.commit(start(&id)).await.unwrap();
        let parking = Parking {
            inbox_read_up_to: 0,
            code_digest,
            timers: Vec::new(),
            listening: vec!["go".into()],
        };
        store.mark_parked(&id, parking).await.unwrap();
        assert_eq!(store.parked().unwrap().get(&id), Some(&code_digest));
        let mark = store.parked_mark(&id).unwrap().unwrap();
        assert_eq!(mark.listening, Some(vec!["go".to_owned()]));
    }
}

#[tokio::test]
async fn a_second_process_cannot_open_a_store_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let _owner = RocksStore::open(dir.path()).unwrap();
    let second = RocksStore::open(dir.path());
    assert!(matches!(second, Err(StoreError::Backend(_))));
}

/// The column families of a store written before the layout version existed.
const LAYOUT_1_FAMILIES: [&str; 8] = [
    "workflows",
    "journal",
    "artifacts",
    "operations",
    "streams",
    "timers",
    "requests",
    "inbox",
];

/// Writes `rows` (family, key, value) into a store at `dir` with the given families, the way an
/// older build left it.
fn write_raw(dir: &std::path::Path, families: &[&str], rows: &[(&str, Vec<u8>, Vec<u8>)]) {
    let mut options = rocksdb::Options::default();
    options.create_if_missing(true);
    options.create_missing_column_families(true);
    let db = rocksdb::DB::open_cf(&options, dir, families).unwrap();
    for (family, key, value) in rows {
        db.put_cf(db.cf_handle(family).unwrap(), key, value)
            .unwrap();
    }
}

fn stream_rows(items: Vec<StreamItem>) -> Vec<(&'static str, Vec<u8>, Vec<u8>)> {
    use waymark_runtime::journal::encode_record;
    use waymark_runtime::keys::stream_key;
    let rows = (1..)
        .zip(items)
        .map(|(number, item)| ("streams", stream_key("wf", number), encode_record(&item)));
    rows.collect()
}

fn chunk_of(version: u32, text: &str) -> StreamItem {
    StreamItem::Chunk {
        step: 0,
        response_version: version,
        text: text.into(),
    }
}

/// Appends a chunk to step 0 of `wf` as a new attempt and returns the version it got and the
/// events from number `from` on.
async fn new_attempt_chunk(store: &RocksStore, from: u64) -> (Option<u32>, Vec<StreamItem>) {
    let slot = waymark_runtime::streams::VersionSlot::default();
    store.append_chunk("wf", 0, slot.clone(), "c".into());
    // A barrier: resolves once the chunk before it is written.
    store.append_stream("wf", Vec::new()).await.unwrap();
    let events = store.stream("wf", from).unwrap();
    (slot.get(), events.into_iter().map(|e| e.item).collect())
}

/// A store written before the per-step version index existed gets the index when it is first
/// opened: a new attempt of a step that streamed then still takes a version above the step's
/// newest, after superseding the one a crash left open.
#[tokio::test]
async fn a_store_from_before_the_version_index_is_indexed_when_opened() {
    let dir = tempfile::tempdir().unwrap();
    let superseded = StreamItem::Superseded {
        step: 0,
        response_version: 1,
        reason: "crash".into(),
    };
    let items = vec![chunk_of(1, "a"), superseded, chunk_of(2, "b")];
    write_raw(dir.path(), &LAYOUT_1_FAMILIES, &stream_rows(items));
    let store = RocksStore::open(dir.path()).unwrap();
    let (version, items) = new_attempt_chunk(&store, 3).await;
    assert_eq!(version, Some(3));
    let open_cut = StreamItem::Superseded {
        step: 0,
        response_version: 2,
        reason: "the attempt stopped before its result was journaled".into(),
    };
    assert_eq!(items, [open_cut, chunk_of(3, "c")]);
}

/// An upgrade interrupted after RocksDB created the new families but before the upgrade was
/// written is redone on the next open: the upgrade is recorded by its own row, written with it.
#[tokio::test]
async fn an_interrupted_upgrade_is_redone() {
    let dir = tempfile::tempdir().unwrap();
    let mut families = LAYOUT_1_FAMILIES.to_vec();
    families.push("stream_steps");
    write_raw(dir.path(), &families, &stream_rows(vec![chunk_of(4, "a")]));
    let store = RocksStore::open(dir.path()).unwrap();
    let (version, _) = new_attempt_chunk(&store, 1).await;
    assert_eq!(version, Some(5));
}

/// A stream row the upgrade cannot read is left out of the index instead of keeping the store
/// from opening.
#[tokio::test]
async fn an_unreadable_stream_row_does_not_block_the_upgrade() {
    use waymark_runtime::keys::stream_key;
    let dir = tempfile::tempdir().unwrap();
    let mut rows = stream_rows(vec![chunk_of(2, "a")]);
    rows.push(("streams", stream_key("wf", 2), b"garbage".to_vec()));
    write_raw(dir.path(), &LAYOUT_1_FAMILIES, &rows);
    let store = RocksStore::open(dir.path()).unwrap();
    let (version, _) = new_attempt_chunk(&store, 3).await;
    assert_eq!(version, Some(3));
}

/// An inbox written before the per-workflow counter existed gets one when the store is
/// upgraded, so the numbers of its messages are not given again once they are delivered: a
/// reader that saw arrival 3 asks for what came after 3 and must find the next signal.
#[tokio::test]
async fn a_legacy_inbox_never_gives_an_arrival_number_twice() {
    use waymark_runtime::inbox::InboxMessage;
    use waymark_runtime::journal::encode_record;
    use waymark_runtime::keys::{id_key, inbox_message_key, inbox_seen_key, journal_key};
    let message = |id: &str| InboxMessage {
        name: "go".into(),
        signal_id: id.into(),
        payload: Payload::unit(),
        sent_at_ms: 0,
        sender: None,
    };
    let mut stored = record();
    stored.journal_len = 1;
    let rows = [
        ("workflows", id_key("wf"), encode_record(&stored)),
        ("journal", journal_key("wf", 0), encode_record(&started())),
        (
            "inbox",
            inbox_message_key("wf", 3),
            encode_record(&message("a")),
        ),
        ("inbox", inbox_seen_key("wf", "a"), Vec::new()),
    ];
    let dir = tempfile::tempdir().unwrap();
    write_raw(dir.path(), &LAYOUT_1_FAMILIES, &rows);
    let store = RocksStore::open(dir.path()).unwrap();
    let arrivals = |after| -> Vec<u64> {
        let inbox = store.inbox("wf", after).unwrap();
        inbox.into_iter().map(|(arrival, _)| arrival).collect()
    };
    assert_eq!(arrivals(0), [3]);
    // The upgrade indexed it by name, as a rebuilt run waiting for `go` reads it.
    let named = || -> Vec<u64> {
        let inbox = store.inbox_named("wf", "go").unwrap();
        inbox.into_iter().map(|(arrival, _)| arrival).collect()
    };
    assert_eq!(named(), [3]);
    let mut deliver = Transition::append("wf", &stored, vec![started()]);
    deliver.consume_inbox.push((3, "go".into()));
    store.commit(deliver).await.unwrap();
    assert_eq!(named(), [0u64; 0], "delivered, its index row went with it");
    store.send_signal("wf", message("b")).await.unwrap();
    assert_eq!(arrivals(3), [4]);
    assert_eq!(named(), [4]);
}

/// A store written by a newer build, in a layout this one does not know, is refused, read-only
/// too, instead of being misread.
#[test]
fn a_store_from_a_newer_build_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut families = LAYOUT_1_FAMILIES.to_vec();
    families.extend(["stream_steps", "meta"]);
    let layout = ("meta", b"layout".to_vec(), 11u32.to_be_bytes().to_vec());
    write_raw(dir.path(), &families, &[layout]);
    let expected = "store written by a newer Waymark (layout 11, this build reads up to 10)";
    let error = RocksStore::open(dir.path()).err().unwrap();
    assert_eq!(error.to_string(), expected);
    assert!(!dir.path().join("WAYMARK-LOG-0").exists(), "no log made");
    let left = rocksdb::DB::list_cf(&rocksdb::Options::default(), dir.path()).unwrap();
    assert!(
        families
            .iter()
            .all(|family| left.iter().any(|f| f == family)),
        "the refused store's families were moved: {left:?}"
    );
    let error = RocksStore::open_read_only(dir.path()).err().unwrap();
    assert_eq!(error.to_string(), expected);
}

/// A store from the build that kept the version index but no layout row is upgraded too; an
/// index row it kept is merged with the rebuilt one, never lowered (the streams may have rows
/// the upgrade cannot read).
#[tokio::test]
async fn an_upgrade_never_lowers_a_kept_version_index() {
    use waymark_runtime::journal::encode_record;
    use waymark_runtime::keys::journal_key;
    use waymark_runtime::streams::StepVersions;
    let dir = tempfile::tempdir().unwrap();
    let mut families = LAYOUT_1_FAMILIES.to_vec();
    families.push("stream_steps");
    let kept = StepVersions {
        newest: 7,
        open: Vec::new(),
    };
    let mut rows = stream_rows(vec![chunk_of(2, "a")]);
    rows.push(("stream_steps", journal_key("wf", 0), encode_record(&kept)));
    write_raw(dir.path(), &families, &rows);
    let store = RocksStore::open(dir.path()).unwrap();
    let (version, _) = new_attempt_chunk(&store, 1).await;
    assert_eq!(version, Some(8));
}

/// A layout-2 store learns, on its upgrade, which workflows committed each artifact and which
/// workflows ended: deleting one of two workflows that committed the same artifact keeps it.
#[tokio::test]
async fn an_upgraded_store_keeps_an_artifact_until_the_last_workflow_that_committed_it_goes() {
    use waymark_runtime::artifacts::{artifact_hash, ArtifactRecord};
    use waymark_runtime::journal::{encode_record, Entry};
    use waymark_runtime::keys::{artifact_key, id_key, journal_key};
    use waymark_runtime::store::{committed_artifacts, WorkflowStatus};

    let content = Payload::encode("shared plan").unwrap();
    let hash = artifact_hash(&content);
    let artifact = ArtifactRecord {
        kind: "plan".into(),
        version: "v1".into(),
        content,
        metadata: Vec::new(),
        workflow_id: "a".into(),
        created_at_ms: 0,
    };
    let mut rows = vec![(
        "artifacts",
        artifact_key("default", &hash),
        encode_record(&artifact),
    )];
    for id in ["a", "b"] {
        let snapshot = Entry::SnapshotCompleted {
            seq: 0,
            attempt: 1,
            artifact: hash,
        };
        let done = Entry::WorkflowCompleted {
            output: Payload::unit(),
        };
        let mut ended = record();
        ended.status = WorkflowStatus::Completed;
        ended.journal_len = 3;
        rows.push(("workflows", id_key(id), encode_record(&ended)));
        for (index, entry) in [started(), snapshot, done].iter().enumerate() {
            rows.push((
                "journal",
                journal_key(id, index as u64),
                encode_record(entry),
            ));
        }
    }
    rows.push(("meta", b"layout".to_vec(), 2u32.to_be_bytes().to_vec()));
    let dir = tempfile::tempdir().unwrap();
    let mut families = LAYOUT_1_FAMILIES.to_vec();
    families.extend(["stream_steps", "meta", "stream_acks"]);
    write_raw(dir.path(), &families, &rows);

    let store = RocksStore::open(dir.path()).unwrap();
    let ended: Vec<String> = store
        .ended_before(u64::MAX, None, 10)
        .unwrap()
        .into_iter()
        .map(|(_, id)| id)
        .collect();
    assert_eq!(ended, ["a", "b"]);
    let committed = committed_artifacts(&store.journal("a").unwrap());
    store.delete_workflow("a", committed).await.unwrap();
    assert_eq!(store.artifact("default", &hash).unwrap(), Some(artifact));
    let committed = committed_artifacts(&store.journal("b").unwrap());
    store.delete_workflow("b", committed).await.unwrap();
    assert_eq!(store.artifact("default", &hash).unwrap(), None);
}

/// The bytes of the store's table files.
fn table_bytes(dir: &std::path::Path) -> u64 {
    let files = std::fs::read_dir(dir).unwrap().flatten();
    let tables = files.filter(|f| f.path().extension().is_some_and(|e| e == "sst"));
    tables.map(|f| f.metadata().unwrap().len()).sum()
}

/// Deleting ended workflows gives their space back once the store is compacted.
#[tokio::test]
async fn deleted_workflows_leave_the_files_once_compacted() {
    use waymark_runtime::journal::Entry;
    use waymark_runtime::store::WorkflowStatus;

    let dir = tempfile::tempdir().unwrap();
    let store = RocksStore::open(dir.path()).unwrap();
    for i in 0..100u64 {
        let id = format!("wf-{i}");
        let begin = start(&id);
        let record = begin.record.clone();
        store.commit(begin).await.unwrap();
        let output = Payload::encode(&letters(i, 4_096)).unwrap();
        let mut end = Transition::append(
            id.as_str(),
            &record,
            vec![Entry::WorkflowCompleted { output }],
        );
        end.record.status = WorkflowStatus::Completed;
        store.commit(end).await.unwrap();
    }
    store.engine().inner().compact().unwrap();
    let before = table_bytes(dir.path());

    for i in 0..90u64 {
        store
            .delete_workflow(&format!("wf-{i}"), Vec::new())
            .await
            .unwrap();
    }
    store.engine().inner().compact().unwrap();
    let after = table_bytes(dir.path());

    eprintln!("table files: {before} bytes with 100 workflows, {after} after deleting 90");
    assert!(after * 4 < before, "{after} of {before} bytes left");
    assert_eq!(store.workflows().unwrap().len(), 10);
}

/// Random letters: compression cannot make the sizes say nothing.
fn letters(seed: u64, len: usize) -> String {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'a' + (x % 26) as u8)
        })
        .collect()
}

/// Journals `output` as step `step`'s result in `wf`, whose record is `record`; the record after.
async fn complete_step(
    store: &RocksStore,
    record: &waymark_runtime::store::WorkflowRecord,
    step: u32,
    output: Payload,
) -> waymark_runtime::store::WorkflowRecord {
    // The form the executor journals: with the write's time.
    let entry = waymark_runtime::journal::Entry::ActivityCompleted {
        seq: step,
        attempt: 1,
        output,
    }
    .with_time(u64::from(step));
    let append = Transition::append("wf", record, vec![entry]);
    let after = append.record.clone();
    store.commit(append).await.unwrap();
    after
}

/// 1,000 steps whose journaled inputs share one 100 KiB prompt keep it once, and each entry
/// reads back whole; a 10 MiB payload reads back whole too (the steps in the timed form the
/// executor journals, the payload in the untimed one older journals hold).
#[tokio::test]
async fn a_long_string_many_steps_repeat_is_stored_once() {
    use waymark_runtime::journal::Entry;

    let dir = tempfile::tempdir().unwrap();
    let store = RocksStore::open(dir.path()).unwrap();
    let prompt = letters(7, 100 * 1024);
    let begin = start("wf");
    let mut record = begin.record.clone();
    store.commit(begin).await.unwrap();
    let mut inline_bytes = 0;
    for step in 0..1_000u32 {
        let value = serde_json::json!({"system": prompt, "user": format!("question {step}")});
        let output = Payload::from_value(&value);
        inline_bytes += output.as_bytes().len();
        record = complete_step(&store, &record, step, output).await;
    }
    let document = Payload::encode(&letters(11, 10 << 20)).unwrap();
    let big = Entry::ActivityCompleted {
        seq: 1_000,
        attempt: 1,
        output: document.clone(),
    };
    store
        .commit(Transition::append("wf", &record, vec![big]))
        .await
        .unwrap();
    store.engine().inner().compact().unwrap();
    let stored = table_bytes(dir.path());
    eprintln!(
        "1,000 steps sharing a 100 KiB prompt: {inline_bytes} bytes of payloads, {stored} bytes \
         of table files with a 10 MiB payload besides"
    );
    // Inline, the prompts alone would be about 100 MiB (some 60 MiB compressed).
    assert!(stored < 20 << 20, "{stored} bytes");

    let journal = store.journal("wf").unwrap();
    let Entry::ActivityCompletedAt { output, .. } = &journal[501] else {
        panic!("{:?}", journal[501]);
    };
    let value: serde_json::Value = output.decode().unwrap();
    assert_eq!(value["system"].as_str(), Some(prompt.as_str()));
    assert_eq!(value["user"], "question 500");
    let Some(Entry::ActivityCompleted { output, .. }) = journal.last() else {
        panic!("no last entry");
    };
    assert_eq!(output, &document);
}

/// A rewind (a reset, a continue-as-new) takes the long strings only the rows it replaced
/// named: a loop that continues as new does not keep every run's prompts under its id.
#[tokio::test]
async fn a_rewind_lets_go_of_the_strings_only_the_replaced_rows_named() {
    use waymark_runtime::journal::Entry;

    let dir = tempfile::tempdir().unwrap();
    let store = RocksStore::open(dir.path()).unwrap();
    let begin = start("wf");
    let mut record = begin.record.clone();
    store.commit(begin).await.unwrap();
    for step in 0..20u32 {
        let value = serde_json::json!({"document": letters(u64::from(step) + 100, 100 * 1024)});
        let output = Payload::from_value(&value);
        record = complete_step(&store, &record, step, output).await;
    }
    store.engine().inner().compact().unwrap();
    let before = table_bytes(dir.path());
    let again = Entry::ActivityCompleted {
        seq: 0,
        attempt: 1,
        output: Payload::from_u64(7),
    };
    let rewind = Transition::rewind("wf", &record, 1, vec![again.clone()]);
    store.commit(rewind).await.unwrap();
    store.engine().inner().compact().unwrap();
    let after = table_bytes(dir.path());
    eprintln!("20 steps of 100 KiB: {before} bytes of table files, {after} after a rewind to 1");
    assert!(after * 10 < before, "{after} of {before} bytes left");
    let journal = store.journal("wf").unwrap();
    assert_eq!(journal.len(), 2);
    assert_eq!(journal[1], again);
}

/// Bytes of write-ahead log files in `dir`.
fn log_bytes(dir: &std::path::Path) -> u64 {
    let logs = std::fs::read_dir(dir).unwrap().flatten();
    let logs = logs.filter(|f| f.path().extension().is_some_and(|e| e == "log"));
    logs.map(|f| f.metadata().unwrap().len()).sum()
}

/// A store closed cleanly leaves nothing in its write-ahead log: the next open (a restart)
/// replays nothing and writes no table files before the first step. What it held reads back.
#[tokio::test]
async fn a_clean_close_leaves_no_log_to_recover() {
    let dir = tempfile::tempdir().unwrap();
    let mut record;
    {
        let store = RocksStore::open(dir.path()).unwrap();
        let begin = start("wf");
        record = begin.record.clone();
        store.commit(begin).await.unwrap();
        for step in 0..50u32 {
            record = complete_step(&store, &record, step, Payload::from_u64(step.into())).await;
        }
        assert!(
            log_bytes(dir.path()) > 0,
            "the steps are in the log while open"
        );
    }
    assert_eq!(
        log_bytes(dir.path()),
        0,
        "a clean close leaves the log empty"
    );
    let store = RocksStore::open(dir.path()).unwrap();
    assert_eq!(store.journal("wf").unwrap().len(), 51);
    assert_eq!(store.workflow("wf").unwrap(), Some(record));
}

/// A worker restarted many times keeps a few of RocksDB's own logs, not one per start.
#[test]
fn restarts_keep_a_few_of_rocksdbs_own_logs() {
    let dir = tempfile::tempdir().unwrap();
    for _ in 0..8 {
        drop(RocksStore::open(dir.path()).unwrap());
    }
    let files = std::fs::read_dir(dir.path()).unwrap().flatten();
    let names = files.map(|f| f.file_name().to_string_lossy().into_owned());
    let logs: Vec<String> = names.filter(|name| name.starts_with("LOG")).collect();
    assert!(logs.len() <= 4, "{logs:?}");
}

/// Every table of a family per table, as stores of layout 4 and before keep them.
const LAYOUT_4_FAMILIES: [&str; 14] = [
    "workflows",
    "journal",
    "timers",
    "requests",
    "operations",
    "streams",
    "inbox",
    "artifacts",
    "stream_steps",
    "meta",
    "stream_acks",
    "artifact_refs",
    "ended",
    "blobs",
];

fn families_of(dir: &std::path::Path) -> Vec<String> {
    let mut found = rocksdb::DB::list_cf(&rocksdb::Options::default(), dir).unwrap();
    found.sort();
    found
}

/// The rows of a started workflow `wf` (record and first entry) in a family per table, the
/// layout row saying `layout`: 4 before an upgrade, 5 once one began moving the tables.
fn family_rows(layout: u32) -> Vec<(&'static str, Vec<u8>, Vec<u8>)> {
    use waymark_runtime::journal::encode_record;
    use waymark_runtime::keys::{id_key, journal_key};
    let mut stored = record();
    stored.journal_len = 1;
    vec![
        ("workflows", id_key("wf"), encode_record(&stored)),
        ("journal", journal_key("wf", 0), encode_record(&started())),
        ("meta", b"layout".to_vec(), layout.to_be_bytes().to_vec()),
    ]
}

fn assert_started(store: &RocksStore) {
    assert_eq!(store.journal("wf").unwrap(), vec![started()]);
    assert_eq!(store.workflow("wf").unwrap().unwrap().journal_len, 1);
}

/// A new store keeps every table but the journal in RocksDB's default family, and its layout
/// row in a family of its own, where a build from before the shared family looks for it and
/// finds a layout it must refuse (rather than read its own, empty, families as the store).
#[tokio::test]
async fn the_tables_share_one_family_and_the_layout_stays_where_older_builds_read_it() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = RocksStore::open(dir.path()).unwrap();
        store.commit(start("wf")).await.unwrap();
    }
    assert_eq!(families_of(dir.path()), ["default", "journal", "meta"]);
    let db = rocksdb::DB::open_cf_for_read_only(
        &rocksdb::Options::default(),
        dir.path(),
        ["meta"],
        false,
    )
    .unwrap();
    let layout = db.get_cf(db.cf_handle("meta").unwrap(), b"layout").unwrap();
    assert_eq!(layout, Some(10u32.to_be_bytes().to_vec()));
}

/// A store of a family per table moves into the shared family when a worker opens it; opened
/// read-only before that, it is read where it is, and left there.
#[tokio::test]
async fn a_store_of_a_family_per_table_moves_into_the_shared_family() {
    let dir = tempfile::tempdir().unwrap();
    write_raw(dir.path(), &LAYOUT_4_FAMILIES, &family_rows(4));
    assert_started(&RocksStore::open_read_only(dir.path()).unwrap());
    assert_eq!(families_of(dir.path()).len(), LAYOUT_4_FAMILIES.len() + 1);
    assert_started(&RocksStore::open(dir.path()).unwrap());
    assert_eq!(families_of(dir.path()), ["default", "journal", "meta"]);
    assert_started(&RocksStore::open_read_only(dir.path()).unwrap());
}

/// An upgrade stopped after some tables moved (the layout row says 5, their family dropped,
/// their rows in the shared family) reads each table where it is, read-only, and finishes on
/// the next open.
#[tokio::test]
async fn an_upgrade_stopped_between_tables_reads_each_where_it_is_and_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let mut rows = family_rows(5);
    // The workflows moved: their rows behind their tag (1) in the default family.
    let workflows = rows.remove(0);
    let mut moved = vec![1u8];
    moved.extend_from_slice(&workflows.1);
    rows.push(("default", moved, workflows.2));
    let families: Vec<&str> = LAYOUT_4_FAMILIES
        .into_iter()
        .filter(|family| *family != "workflows")
        .collect();
    write_raw(dir.path(), &families, &rows);
    assert_started(&RocksStore::open_read_only(dir.path()).unwrap());
    assert_started(&RocksStore::open(dir.path()).unwrap());
    assert_eq!(families_of(dir.path()), ["default", "journal", "meta"]);
}

/// A move cut short between a table's copy and the drop of its family leaves the whole table
/// in the family, and some of it in the shared family: the family is read, and copied again
/// over what the shared family holds. (A partial copy holds the family's own values; a stale
/// one here tells which place is read.)
#[tokio::test]
async fn a_family_still_holding_rows_is_read_before_a_partial_copy_and_copied_over_it() {
    use waymark_runtime::journal::encode_record;
    let dir = tempfile::tempdir().unwrap();
    let mut rows = family_rows(5);
    let mut stale = vec![1u8];
    stale.extend_from_slice(&rows[0].1);
    rows.push(("default", stale, encode_record(&record())));
    write_raw(dir.path(), &LAYOUT_4_FAMILIES, &rows);
    assert_started(&RocksStore::open_read_only(dir.path()).unwrap());
    assert_started(&RocksStore::open(dir.path()).unwrap());
    assert_eq!(families_of(dir.path()), ["default", "journal", "meta"]);
    assert_started(&RocksStore::open(dir.path()).unwrap());
}

/// A store refused (its values sealed and no keys given, its layout row unreadable) keeps its
/// families as they were: the tables move only once the layout row says they have.
#[test]
fn a_refused_store_of_a_family_per_table_is_left_as_it_was() {
    let refusals: [(&[u8], &[u8], &str); 2] = [
        (
            b"sealed",
            &[1],
            "the store is encrypted at rest and no keys were given",
        ),
        (b"layout", b"xx", "corrupt record in `meta`"),
    ];
    for (key, value, error) in refusals {
        let dir = tempfile::tempdir().unwrap();
        let mut rows = family_rows(4);
        rows.retain(|(family, key, _)| !(*family == "meta" && key == b"layout"));
        rows.push(("meta", key.to_vec(), value.to_vec()));
        write_raw(dir.path(), &LAYOUT_4_FAMILIES, &rows);
        let refused = RocksStore::open(dir.path()).err().unwrap().to_string();
        assert!(refused.contains(error), "{refused}");
        assert_eq!(families_of(dir.path()).len(), LAYOUT_4_FAMILIES.len() + 1);
    }
}

/// A table larger than one batch of the move moves whole.
#[test]
fn a_table_larger_than_a_batch_moves_whole() {
    let dir = tempfile::tempdir().unwrap();
    let mut rows = family_rows(4);
    let value = vec![7u8; 100_000];
    for number in 0..60u32 {
        let key = format!("artifact-{number:02}").into_bytes();
        rows.push(("artifacts", key, value.clone()));
    }
    write_raw(dir.path(), &LAYOUT_4_FAMILIES, &rows);
    drop(RocksStore::open(dir.path()).unwrap());
    let db = rocksdb::DB::open_cf_for_read_only(
        &rocksdb::Options::default(),
        dir.path(),
        ["default", "meta"],
        false,
    )
    .unwrap();
    // The artifacts' tag in the shared family is 8.
    let moved = db.prefix_iterator(b"\x08").map(Result::unwrap);
    let moved: Vec<_> = moved.take_while(|(key, _)| key[0] == 8).collect();
    assert_eq!(moved.len(), 60);
    assert!(moved.iter().all(|(_, stored)| stored.len() == value.len()));
}

/// A family an older build created, opening a store it then refused as newer, is empty: read
/// as nothing (the table is in the shared family), and dropped by the next worker.
#[tokio::test]
async fn a_family_left_by_an_older_build_is_not_read_and_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = RocksStore::open(dir.path()).unwrap();
        store.commit(start("wf")).await.unwrap();
    }
    write_raw(dir.path(), &LAYOUT_4_FAMILIES, &[]);
    assert_started(&RocksStore::open_read_only(dir.path()).unwrap());
    assert_started(&RocksStore::open(dir.path()).unwrap());
    assert_eq!(families_of(dir.path()), ["default", "journal", "meta"]);
}

/// A store an older build wrote has no index of unsettled operations, and a read-only open
/// (the `waymark` commands on a data dir) leaves it so: its operations awaiting a decision
/// are still listed, read from every operation row. A store of layout 10 is read through its
/// index alone.
#[tokio::test]
async fn a_read_only_store_of_layout_9_lists_its_unsettled_operations() {
    use waymark_runtime::operations::{idempotency_key, OperationRecord, OperationStatus};
    use waymark_runtime::store::{Engine as _, Table, Write};
    let dir = tempfile::tempdir().unwrap();
    let key = idempotency_key("wf", "book", &Payload::unit(), 1);
    {
        let store = RocksStore::open(dir.path()).unwrap();
        let mut begin = start("wf");
        let reason = "did it take effect?".to_owned();
        let awaiting = OperationRecord {
            status: OperationStatus::AwaitingOperator { reason },
            ..common::operation("wf")
        };
        begin.operations.push((key.clone(), awaiting));
        store.commit(begin).await.unwrap();
        let unindexed = vec![Write::Delete(Table::Unsettled, key.as_bytes().to_vec())];
        store.engine().write(unindexed, true).unwrap();
    }
    {
        let store = RocksStore::open_read_only(dir.path()).unwrap();
        let listed = store.unsettled_operations("").unwrap();
        assert!(
            listed.is_empty(),
            "layout 10 is read through its index: {listed:?}"
        );
    }
    {
        let store = RocksStore::open(dir.path()).unwrap();
        let layout_9 = vec![Write::Put(
            Table::Meta,
            b"layout".to_vec(),
            9u32.to_be_bytes().to_vec(),
        )];
        store.engine().write(layout_9, true).unwrap();
    }
    let store = RocksStore::open_read_only(dir.path()).unwrap();
    let listed = store.unsettled_operations("").unwrap();
    let keys: Vec<&String> = listed.iter().map(|(key, _)| key).collect();
    assert_eq!(keys, [&key]);
    let awaited = waymark_runtime::worker::operations_awaiting_decision(&store, None).unwrap();
    assert_eq!(awaited.len(), 1);
}
