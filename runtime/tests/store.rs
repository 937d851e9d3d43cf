//! The RocksDB store's contract: atomic conditional transitions, group commit, read-only
//! access, and corrupt records reported by key.

use futures::future::join_all;
use waymark_runtime::journal::{Digest, Entry, Payload, WorkflowStarted};
use waymark_runtime::store::{
    RocksStore, Store, StoreError, Table, Transition, WorkflowRecord, WorkflowStatus,
};
use waymark_runtime::streams::StreamItem;

fn record() -> WorkflowRecord {
    WorkflowRecord::new("wf", None, Digest::of(b"null"))
}

fn started() -> Entry {
    Entry::WorkflowStarted(WorkflowStarted {
        workflow_name: "wf".into(),
        input: Payload::unit(),
        request_id: None,
        started_at_ms: 0,
    })
}

fn start(id: &str) -> Transition {
    Transition::append(id, &record(), vec![started()])
}

#[tokio::test]
async fn concurrent_commits_share_synced_batches() {
    let dir = tempfile::tempdir().unwrap();
    let store = RocksStore::open(dir.path()).unwrap();
    let commits = (0..64).map(|i| store.commit(start(&format!("wf-{i}"))));
    for result in join_all(commits).await {
        result.unwrap();
    }
    let stats = store.write_stats();
    eprintln!("64 concurrent commits: {} synced batches", stats.batches);
    assert_eq!(stats.transitions, 64);
    assert!(
        stats.batches < 64,
        "64 concurrent commits took {} fsyncs",
        stats.batches
    );
    assert_eq!(store.workflows().unwrap().len(), 64);
}

#[tokio::test]
async fn an_append_against_a_stale_journal_length_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = RocksStore::open(dir.path()).unwrap();
    store.commit(start("wf")).await.unwrap();
    // A second writer that still believes the journal is empty.
    let stale = Transition::append("wf", &record(), vec![started()]);
    let error = store.commit(stale).await.unwrap_err();
    assert!(matches!(error, StoreError::Conflict { .. }), "{error:?}");
    assert_eq!(
        error.to_string(),
        "conflicting write to workflow `wf`: journal has 1 entries, the writer expected 0"
    );
    assert_eq!(store.journal("wf").unwrap(), vec![started()]);
}

#[tokio::test]
async fn a_request_id_belongs_to_one_workflow() {
    let dir = tempfile::tempdir().unwrap();
    let store = RocksStore::open(dir.path()).unwrap();
    let mut first = start("a");
    first.claim_request = Some("req".into());
    let mut second = start("b");
    second.claim_request = Some("req".into());
    let (first, second) = futures::join!(store.commit(first), store.commit(second));
    first.unwrap();
    assert!(matches!(second, Err(StoreError::Conflict { .. })));
    assert_eq!(store.request("req").unwrap().as_deref(), Some("a"));
    assert_eq!(
        store.workflow("b").unwrap(),
        None,
        "the loser wrote nothing"
    );
}

#[tokio::test]
async fn a_corrupt_record_is_an_error_naming_its_key() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = RocksStore::open(dir.path()).unwrap();
        store.commit(start("good")).await.unwrap();
        store.commit(start("bad")).await.unwrap();
        store
            .overwrite_journal_record("bad", 0, b"\x01garbage")
            .unwrap();
    }
    let store = RocksStore::open(dir.path()).unwrap();
    let error = store.journal("bad").unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("corrupt record in `journal` at key bad#0: "),
        "{error}"
    );
    assert_eq!(store.journal("good").unwrap(), vec![started()]);
    let error = {
        store.overwrite_journal_record("bad", 0, &[]).unwrap();
        store.journal("bad").unwrap_err()
    };
    assert_eq!(
        error.to_string(),
        "corrupt record in `journal` at key bad#0: empty record"
    );
}

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

#[tokio::test]
async fn a_second_process_cannot_open_a_store_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let _owner = RocksStore::open(dir.path()).unwrap();
    let second = RocksStore::open(dir.path());
    assert!(matches!(second, Err(StoreError::Backend(_))));
}

fn chunk(text: &str) -> StreamItem {
    StreamItem::Chunk {
        step: 0,
        response_version: 1,
        text: text.into(),
    }
}

#[tokio::test]
async fn stream_events_are_numbered_in_write_order_across_reopens() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = RocksStore::open(dir.path()).unwrap();
        // Chunks are queued without awaiting, like a streaming attempt does; the commit that
        // follows carries the marker and is numbered after them.
        drop(store.append_stream("a", vec![chunk("one"), chunk("two")]));
        drop(store.append_stream("ab", vec![chunk("other workflow")]));
        let mut commit = start("a");
        commit.stream.push(StreamItem::Committed {
            step: 0,
            response_version: 1,
        });
        store.commit(commit).await.unwrap();
    }
    let store = RocksStore::open(dir.path()).unwrap();
    store
        .append_stream("a", vec![chunk("three")])
        .await
        .unwrap();
    let events = store.stream("a", 0).unwrap();
    let numbers: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(numbers, [1, 2, 3, 4]);
    let items: Vec<StreamItem> = events.iter().map(|e| e.item.clone()).collect();
    let committed = StreamItem::Committed {
        step: 0,
        response_version: 1,
    };
    assert_eq!(
        items,
        [chunk("one"), chunk("two"), committed, chunk("three")]
    );
    assert_eq!(store.stream("a", 2).unwrap(), events[2..]);
    assert_eq!(store.stream("a", 4).unwrap(), []);
    let other = store.stream("ab", 0).unwrap();
    assert_eq!(other.len(), 1, "a prefix id does not share a stream");
    assert_eq!(other[0].seq, 1);
}

#[tokio::test]
async fn a_stream_watch_changes_on_new_events_and_on_the_end_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = RocksStore::open(dir.path()).unwrap();
    store.commit(start("wf")).await.unwrap();
    let mut watch = store.watch_stream("wf").expect("RocksDB can tell");
    assert!(!watch.has_changed().unwrap(), "nothing written since");

    store.append_stream("wf", vec![chunk("one")]).await.unwrap();
    assert!(watch.has_changed().unwrap(), "a chunk wakes the reader");
    watch.mark_unchanged();

    let mut current = record();
    current.journal_len = 1;
    let quiet = Transition::append("wf", &current, vec![started()]);
    store.commit(quiet).await.unwrap();
    store
        .append_stream("other", vec![chunk("x")])
        .await
        .unwrap();
    assert!(
        !watch.has_changed().unwrap(),
        "a commit without events, or another workflow's events, leaves it asleep"
    );

    current.journal_len = 2;
    let mut end = Transition::append("wf", &current, vec![started()]);
    end.record.status = WorkflowStatus::Completed;
    store.commit(end).await.unwrap();
    assert!(watch.has_changed().unwrap(), "the end wakes the reader");
}

/// A transition refused halfway through staging (its stream cannot be numbered) leaves nothing
/// of itself in the batch: the journal and the record are as they were.
#[tokio::test]
async fn a_rejected_transition_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = RocksStore::open(dir.path()).unwrap();
    store.commit(start("wf")).await.unwrap();
    // A key in `wf`'s stream range that is no stream event: numbering after it fails.
    let mut garbage = waymark_runtime::keys::id_key("wf");
    garbage.extend_from_slice(&[0, 0, 0]);
    store.overwrite_raw(Table::Streams, &garbage, b"x").unwrap();
    let mut current = record();
    current.journal_len = 1;
    let mut refused = Transition::append("wf", &current, vec![started()]);
    refused.stream.push(chunk("lost"));
    let error = store.commit(refused).await.unwrap_err();
    assert!(matches!(error, StoreError::Corrupt { .. }), "{error}");
    assert_eq!(store.journal("wf").unwrap(), vec![started()]);
    assert_eq!(store.workflow("wf").unwrap().unwrap().journal_len, 1);
    // The store is not poisoned: the next transition goes through.
    let next = Transition::append("wf", &current, vec![started()]);
    store.commit(next).await.unwrap();
    assert_eq!(store.journal("wf").unwrap().len(), 2);
}

/// The writer refuses a signal for a workflow whose end it wrote first: a sender racing with
/// the end hears that, instead of a signal kept forever that nobody receives.
#[tokio::test]
async fn a_signal_after_the_end_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = RocksStore::open(dir.path()).unwrap();
    store.commit(start("wf")).await.unwrap();
    let mut current = record();
    current.journal_len = 1;
    let mut end = Transition::append("wf", &current, vec![started()]);
    end.record.status = WorkflowStatus::Completed;
    let message = waymark_runtime::inbox::InboxMessage {
        name: "go".into(),
        signal_id: "late".into(),
        payload: Payload::unit(),
        sent_at_ms: 0,
    };
    let (ended, sent) = futures::join!(store.commit(end), store.send_signal("wf", message));
    ended.unwrap();
    let error = sent.unwrap_err();
    assert!(matches!(error, StoreError::Ended { .. }), "{error:?}");
    assert!(store.inbox("wf", 0).unwrap().is_empty());
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
    store
        .append_chunk("wf", 0, slot.clone(), "c".into())
        .await
        .unwrap();
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
    let mut deliver = Transition::append("wf", &stored, vec![started()]);
    deliver.consume_inbox.push(3);
    store.commit(deliver).await.unwrap();
    store.send_signal("wf", message("b")).await.unwrap();
    assert_eq!(arrivals(3), [4]);
}

/// A store written by a newer build, in a layout this one does not know, is refused, read-only
/// too, instead of being misread.
#[test]
fn a_store_from_a_newer_build_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut families = LAYOUT_1_FAMILIES.to_vec();
    families.extend(["stream_steps", "meta"]);
    let layout = ("meta", b"layout".to_vec(), 9u32.to_be_bytes().to_vec());
    write_raw(dir.path(), &families, &[layout]);
    let expected = "store written by a newer Waymark (layout 9, this build reads up to 2)";
    let error = RocksStore::open(dir.path()).err().unwrap();
    assert_eq!(error.to_string(), expected);
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
