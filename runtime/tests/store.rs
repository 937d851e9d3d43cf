//! The store's contract, the same on every engine: atomic conditional transitions, group
//! commit, stream numbering that survives a reopen, corrupt records reported by key. Each case
//! runs on RocksDB (with the `rocksdb` feature) and on the in-memory engine the simulations use,
//! so a simulation's store behaves as the one on disk.

use futures::future::join_all;
use std::sync::Arc;
mod common;

use common::{operation, record, start, started};
use waymark_runtime::artifacts::ArtifactRecord;
use waymark_runtime::inbox::InboxMessage;
use waymark_runtime::journal::{
    CommandIdentity, CommandKind, Digest, Entry, Failure, FailureKind, Payload,
};
use waymark_runtime::keys;
use waymark_runtime::operations::{OperationRecord, OperationStatus};

use waymark_runtime::store::{
    Engine, KvStore, MemoryEngine, MemoryStore, ParkedMark, Parking, Reads, ReplayReads, Store,
    StoreError, StoreReads, Table, Transition, WorkflowRecord, WorkflowStatus, Write,
};
use waymark_runtime::streams::StreamItem;

/// The workflows' clock, for a shared store's claims.
#[cfg(feature = "postgres")]
const NOW_MS: u64 = 1_000_000;

/// Where a store lives: opened again, it holds what the last store there wrote.
trait Disk {
    type Engine: Engine;
    /// Whether the engine holds what it was just written in memory, to answer a read without
    /// waiting: a one-process engine does, a database server over the network does not.
    const ANSWERS_FROM_MEMORY: bool = true;
    /// Whether the engine shares cursors between the reads of a burst (RocksDB does).
    const SHARES_BURST_READS: bool = false;
    fn open(&self) -> KvStore<Self::Engine>;
}

struct InMemory(Arc<MemoryEngine>);

impl Disk for InMemory {
    type Engine = MemoryEngine;
    fn open(&self) -> MemoryStore {
        MemoryStore::on(self.0.clone()).unwrap()
    }
}

#[cfg(feature = "rocksdb")]
struct OnRocks(tempfile::TempDir);

#[cfg(feature = "rocksdb")]
impl Disk for OnRocks {
    type Engine = waymark_runtime::store::CodecEngine<waymark_runtime::store::RocksEngine>;
    const SHARES_BURST_READS: bool = true;
    fn open(&self) -> waymark_runtime::store::RocksStore {
        waymark_runtime::store::RocksStore::open(self.0.path()).unwrap()
    }
}

/// RocksDB with every value sealed under a key of its own.
#[cfg(feature = "rocksdb")]
struct OnSealedRocks(tempfile::TempDir, Arc<waymark_runtime::codec::Keyring>);

#[cfg(feature = "rocksdb")]
impl OnSealedRocks {
    fn new() -> Self {
        let key = waymark_runtime::codec::EncryptionKey::generate("test").unwrap();
        let ring = waymark_runtime::codec::Keyring::new(vec![key]).unwrap();
        Self(tempfile::tempdir().unwrap(), Arc::new(ring))
    }
}

#[cfg(feature = "rocksdb")]
impl Disk for OnSealedRocks {
    type Engine = waymark_runtime::store::CodecEngine<waymark_runtime::store::RocksEngine>;
    const SHARES_BURST_READS: bool = true;
    fn open(&self) -> waymark_runtime::store::RocksStore {
        let codec: Arc<dyn waymark_runtime::codec::Codec> = self.1.clone();
        waymark_runtime::store::RocksStore::open_with_codec(self.0.path(), Some(codec)).unwrap()
    }
}

/// A schema of its own in the test database, claiming on every open what an earlier open
/// (a restart) let go.
#[cfg(feature = "postgres")]
struct OnPostgres(waymark_runtime::store::PgOptions);

#[cfg(feature = "postgres")]
impl OnPostgres {
    fn new() -> Option<Self> {
        let mut options = waymark_runtime::store::PgOptions::new(common::database_url()?);
        options.schema = Some(common::fresh_schema());
        Some(Self(options))
    }
}

#[cfg(feature = "postgres")]
impl Disk for OnPostgres {
    type Engine = waymark_runtime::store::CodecEngine<waymark_runtime::store::PgEngine>;
    const ANSWERS_FROM_MEMORY: bool = false;
    fn open(&self) -> waymark_runtime::store::PgStore {
        let store = waymark_runtime::store::PgStore::connect(&self.0, None).unwrap();
        let leases = Store::leases(&store).unwrap();
        while !leases.claim(512, NOW_MS).unwrap().is_empty() {}
        store
    }
}

/// Each case once per engine: `in_memory::case` and `on_rocksdb::case`.
macro_rules! on_every_engine {
    ($($case:ident),* $(,)?) => {
        mod in_memory {
            $(
                #[tokio::test]
                async fn $case() {
                    super::$case(super::InMemory(super::MemoryEngine::new())).await
                }
            )*
        }

        #[cfg(feature = "rocksdb")]
        mod on_rocksdb {
            $(
                #[tokio::test]
                async fn $case() {
                    super::$case(super::OnRocks(tempfile::tempdir().unwrap())).await
                }
            )*
        }

        #[cfg(feature = "postgres")]
        mod on_postgres {
            $(
                #[tokio::test(flavor = "multi_thread")]
                async fn $case() {
                    let Some(disk) = super::OnPostgres::new() else { return };
                    super::$case(disk).await
                }
            )*
        }

        #[cfg(feature = "rocksdb")]
        mod on_sealed_rocksdb {
            $(
                #[tokio::test]
                async fn $case() {
                    super::$case(super::OnSealedRocks::new()).await
                }
            )*
        }
    };
}

on_every_engine!(
    concurrent_commits_share_synced_batches,
    an_append_against_a_stale_journal_length_is_refused_and_changes_nothing,
    a_request_id_belongs_to_one_workflow,
    a_corrupt_record_is_an_error_naming_its_key,
    a_commit_after_a_raw_overwrite_reads_the_stored_record,
    a_commit_after_a_raw_overwrite_reads_the_stored_length,
    a_commit_after_a_write_around_the_store_reads_the_stored_length,
    a_gap_in_a_journal_is_an_error_naming_the_missing_entry,
    stream_events_are_numbered_in_write_order_across_reopens,
    a_stream_watch_changes_on_new_events_and_on_the_end_only,
    a_rejected_transition_writes_nothing,
    a_signal_after_the_end_is_refused,
    the_inbox_by_name_lists_what_the_inbox_holds,
    an_index_row_without_its_message_is_a_corrupt_record,
    a_read_of_many_keys_answers_in_the_order_asked,
    a_parked_mark_keeps_the_names_its_waits_listen_for,
    an_inbox_of_layout_8_is_indexed_by_name_when_opened,
    stream_acknowledgements_never_move_back_nor_past_the_stream_and_survive_a_reopen,
    deleting_an_ended_workflow_takes_every_row_of_its_own_and_nothing_else,
    a_deletion_refused_changes_nothing,
    an_ended_workflow_is_kept_while_an_operation_is_unsettled,
    a_journal_page_is_read_from_its_first_index,
    an_operation_read_from_memory_is_the_stored_one,
    a_burst_reads_what_the_store_reads,
    operations_awaiting_a_decision_are_read_one_namespace_at_a_time,
    only_unsettled_operations_are_read_through_their_index,
    the_unsettled_operations_of_layout_9_are_indexed_when_opened,
    the_unsettled_operations_listed_follow_every_write,
);

async fn concurrent_commits_share_synced_batches<D: Disk>(disk: D) {
    let store = disk.open();
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

async fn an_append_against_a_stale_journal_length_is_refused_and_changes_nothing<D: Disk>(disk: D) {
    let store = disk.open();
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

async fn a_request_id_belongs_to_one_workflow<D: Disk>(disk: D) {
    let store = disk.open();
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

async fn a_corrupt_record_is_an_error_naming_its_key<D: Disk>(disk: D) {
    {
        let store = disk.open();
        store.commit(start("good")).await.unwrap();
        store.commit(start("bad")).await.unwrap();
        store
            .overwrite_journal_record("bad", 0, b"\x01garbage")
            .unwrap();
    }
    let store = disk.open();
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

/// The writer may remember the records it wrote; a row written behind its back (as only these
/// tests do) makes it read the stored record again, and a corrupt one refuses the commit.
async fn a_commit_after_a_raw_overwrite_reads_the_stored_record<D: Disk>(disk: D) {
    let store = disk.open();
    store.commit(start("wf")).await.unwrap();
    let key = keys::id_key("wf");
    store
        .overwrite_raw(Table::Workflows, &key, b"\x01garbage")
        .unwrap();
    let mut after = record();
    after.journal_len = 1;
    let append = Transition::append("wf", &after, vec![started()]);
    let error = store.commit(append).await.unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("corrupt record in `workflows` at key wf: "),
        "{error}"
    );
}

/// The writer may remember the journal lengths it wrote; a row written behind its back (as
/// only these tests do) makes it read the journal's length again.
async fn a_commit_after_a_raw_overwrite_reads_the_stored_length<D: Disk>(disk: D) {
    let store = disk.open();
    store.commit(start("wf")).await.unwrap();
    // An entry and the record counting it, as a transition made elsewhere writes them: the
    // length is the journal's on an engine one process owns, the record's on a shared one.
    let row = waymark_runtime::journal::encode_record(&started());
    store.overwrite_journal_record("wf", 1, &row).unwrap();
    let mut counted = record();
    counted.journal_len = 2;
    let counted = waymark_runtime::journal::encode_record(&counted);
    let key = keys::id_key("wf");
    store
        .overwrite_raw(Table::Workflows, &key, &counted)
        .unwrap();
    refuses_an_append_after_one_entry(&store, 2).await;
}

/// A write to the engine that did not go through the store (another store on it, a test
/// writing rows) makes the writer read the journal length it may have remembered.
async fn a_commit_after_a_write_around_the_store_reads_the_stored_length<D: Disk>(disk: D) {
    let store = disk.open();
    store.commit(start("wf")).await.unwrap();
    let row = waymark_runtime::journal::encode_record(&started());
    let put = |index| Write::Put(Table::Journal, keys::journal_key("wf", index), row.clone());
    let mut appended_elsewhere = record();
    appended_elsewhere.journal_len = 3;
    let counted = waymark_runtime::journal::encode_record(&appended_elsewhere);
    let record_row = Write::Put(Table::Workflows, keys::id_key("wf"), counted);
    store
        .engine()
        .write(vec![put(1), put(2), record_row], true)
        .unwrap();
    refuses_an_append_after_one_entry(&store, 3).await;
}

/// An append computed against a journal of one entry is refused: `wf`'s journal holds `held`.
async fn refuses_an_append_after_one_entry<E: Engine>(store: &KvStore<E>, held: u64) {
    let mut seen = record();
    seen.journal_len = 1;
    let stale = Transition::append("wf", &seen, vec![started()]);
    let error = store.commit(stale).await.unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "conflicting write to workflow `wf`: journal has {held} entries, the writer expected 1"
        )
    );
}

/// A row past a missing one (lost, or written by something else) is not read as the next
/// entry: the journal is corrupt at the missing index.
async fn a_gap_in_a_journal_is_an_error_naming_the_missing_entry<D: Disk>(disk: D) {
    {
        let store = disk.open();
        store.commit(start("gap")).await.unwrap();
        let record = waymark_runtime::journal::encode_record(&started());
        store.overwrite_journal_record("gap", 2, &record).unwrap();
    }
    let store = disk.open();
    let error = store.journal("gap").unwrap_err();
    assert_eq!(
        error.to_string(),
        "corrupt record in `journal` at key gap#1: malformed record: missing entry"
    );
    let error = store.journal_page("gap", 1, 10).unwrap_err();
    assert!(error.to_string().contains("at key gap#1"), "{error}");
}

fn chunk(text: &str) -> StreamItem {
    StreamItem::Chunk {
        step: 0,
        response_version: 1,
        text: text.into(),
    }
}

async fn stream_events_are_numbered_in_write_order_across_reopens<D: Disk>(disk: D) {
    {
        let store = disk.open();
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
    let store = disk.open();
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

async fn a_stream_watch_changes_on_new_events_and_on_the_end_only<D: Disk>(disk: D) {
    let store = disk.open();
    store.commit(start("wf")).await.unwrap();
    // Other workers write a shared store too: a watch there would miss their events, so
    // readers must poll.
    let Some(mut watch) = store.watch_stream("wf") else {
        assert!(store.leases().is_some(), "only a shared store cannot tell");
        return;
    };
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
async fn a_rejected_transition_writes_nothing<D: Disk>(disk: D) {
    let store = disk.open();
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
async fn a_signal_after_the_end_is_refused<D: Disk>(disk: D) {
    let store = disk.open();
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
        sender: None,
    };
    let (ended, sent) = futures::join!(store.commit(end), store.send_signal("wf", message));
    ended.unwrap();
    let error = sent.unwrap_err();
    assert!(matches!(error, StoreError::Ended { .. }), "{error:?}");
    assert!(store.inbox("wf", 0).unwrap().is_empty());
}

/// A parked mark holds the signal names the run's waits listen for: a signal of another name
/// leaves it where it is, across a reopen; a signal of one of those names deletes it. A shared
/// store keeps no marks.
async fn a_parked_mark_keeps_the_names_its_waits_listen_for<D: Disk>(disk: D) {
    let signal = |name: &str, signal_id: &str| InboxMessage {
        name: name.into(),
        signal_id: signal_id.into(),
        payload: Payload::unit(),
        sent_at_ms: 0,
        sender: None,
    };
    let store = disk.open();
    store.commit(start("wf")).await.unwrap();
    let parking = Parking {
        inbox_read_up_to: 0,
        code_digest: 7,
        timers: Vec::new(),
        listening: vec!["go".into(), "stop".into()],
    };
    store.mark_parked("wf", parking).await.unwrap();
    if store.leases().is_some() {
        assert_eq!(store.parked_mark("wf").unwrap(), None);
        let in_memory = store.parked_mark_in_memory("wf").map(Result::unwrap);
        assert_eq!(in_memory, Some(None));
        return;
    }
    let mark = ParkedMark {
        code_digest: 7,
        listening: Some(vec!["go".into(), "stop".into()]),
    };
    assert_eq!(store.parked_mark("wf").unwrap(), Some(mark.clone()));
    let in_memory = store.parked_mark_in_memory("wf").map(Result::unwrap);
    assert!(in_memory.is_none_or(|found| found == Some(mark.clone())));
    store
        .send_signal("wf", signal("note", "n-1"))
        .await
        .unwrap();
    drop(store);
    let store = disk.open();
    assert_eq!(
        store.parked_mark("wf").unwrap(),
        Some(mark),
        "no wait takes `note`"
    );
    assert_eq!(store.parked().unwrap().get("wf"), Some(&7));
    store
        .send_signal("wf", signal("stop", "s-1"))
        .await
        .unwrap();
    assert_eq!(
        store.parked_mark("wf").unwrap(),
        None,
        "a wait takes `stop`"
    );
    let in_memory = store.parked_mark_in_memory("wf").map(Result::unwrap);
    assert!(in_memory.is_none_or(|found| found.is_none()));
}

/// The inbox's index by name lists each name's undelivered signals, oldest first, as the inbox
/// holds them (a name is not taken for a longer one that begins alike), and tells whether any
/// of some names has one: a delivery takes its row, and the workflow's end takes every row
/// left.
async fn the_inbox_by_name_lists_what_the_inbox_holds<D: Disk>(disk: D) {
    let store = disk.open();
    store.commit(start("wf")).await.unwrap();
    for (signal_id, name) in [("a", "go"), ("b", "note"), ("c", "go"), ("d", "gone")] {
        let message = InboxMessage {
            name: name.into(),
            signal_id: signal_id.into(),
            payload: Payload::unit(),
            sent_at_ms: 0,
            sender: None,
        };
        store.send_signal("wf", message).await.unwrap();
    }
    let named = |name: &str| -> Vec<(u64, String)> {
        let messages = store.inbox_named("wf", name).unwrap();
        messages
            .into_iter()
            .map(|(n, m)| (n, m.signal_id))
            .collect()
    };
    let listed = |pairs: &[(u64, &str)]| -> Vec<(u64, String)> {
        pairs.iter().map(|(n, id)| (*n, (*id).to_owned())).collect()
    };
    assert_eq!(named("go"), listed(&[(1, "a"), (3, "c")]));
    assert_eq!(named("note"), listed(&[(2, "b")]));
    assert_eq!(named("gone"), listed(&[(4, "d")]));
    assert_eq!(named("g"), listed(&[]));
    let holds = |names: &[&str]| {
        let names: Vec<String> = names.iter().map(|name| (*name).to_owned()).collect();
        store.inbox_holds_named("wf", &names).unwrap()
    };
    assert!(holds(&["note"]));
    assert!(holds(&["g", "gone"]));
    assert!(!holds(&["g", "goes"]));
    assert!(!holds(&[]));
    let mut current = record();
    current.journal_len = 1;
    let mut deliver = Transition::append("wf", &current, vec![started()]);
    deliver.consume_inbox.push((1, "go".into()));
    store.commit(deliver).await.unwrap();
    assert_eq!(named("go"), listed(&[(3, "c")]));
    assert!(holds(&["go"]));
    current.journal_len = 2;
    let mut end = Transition::append("wf", &current, vec![started()]);
    end.record.status = WorkflowStatus::Completed;
    store.commit(end).await.unwrap();
    for name in ["go", "note", "gone"] {
        assert_eq!(named(name), listed(&[]), "{name}");
    }
    assert!(!holds(&["go", "note", "gone"]));
}

/// The index by name names a message the inbox does not hold: a damaged store, said as a
/// corrupt record of the inbox, not as a failure of the engine.
async fn an_index_row_without_its_message_is_a_corrupt_record<D: Disk>(disk: D) {
    let store = disk.open();
    store.commit(start("wf")).await.unwrap();
    for signal_id in ["a", "b"] {
        let message = InboxMessage {
            name: "go".into(),
            signal_id: signal_id.into(),
            payload: Payload::unit(),
            sent_at_ms: 0,
            sender: None,
        };
        store.send_signal("wf", message).await.unwrap();
    }
    let lost = vec![Write::Delete(
        Table::Inbox,
        keys::inbox_message_key("wf", 2),
    )];
    store.engine().write(lost, true).unwrap();
    match store.inbox_named("wf", "go") {
        Err(StoreError::Corrupt { table, key, .. }) => {
            assert_eq!((table, key.as_str()), (Table::Inbox, "wf#2"));
        }
        other => panic!("expected a corrupt record, got {other:?}"),
    }
}

/// Keys read together come back in the order asked, a missing one as `None`, a key asked
/// twice twice.
async fn a_read_of_many_keys_answers_in_the_order_asked<D: Disk>(disk: D) {
    let store = disk.open();
    let rows = vec![
        Write::Put(Table::Inbox, b"k-1".to_vec(), b"one".to_vec()),
        Write::Put(Table::Inbox, b"k-2".to_vec(), b"two".to_vec()),
    ];
    store.engine().write(rows, true).unwrap();
    let keys = [&b"k-2"[..], b"k-0", b"k-1", b"k-2"].map(<[u8]>::to_vec);
    let values = store.engine().get_many(Table::Inbox, &keys).unwrap();
    let expected = [Some(&b"two"[..]), None, Some(b"one"), Some(b"two")];
    assert_eq!(values, expected.map(|value| value.map(<[u8]>::to_vec)));
}

/// A store a build of layout 8 left, whose inbox has no index by name, is upgraded when it is
/// opened: the messages waiting there are indexed, as a run rebuilt to take them reads them.
async fn an_inbox_of_layout_8_is_indexed_by_name_when_opened<D: Disk>(disk: D) {
    let arrivals = |store: &KvStore<D::Engine>| -> Vec<u64> {
        let messages = store.inbox_named("wf", "go").unwrap();
        messages.into_iter().map(|(arrival, _)| arrival).collect()
    };
    {
        let store = disk.open();
        store.commit(start("wf")).await.unwrap();
        let message = InboxMessage {
            name: "go".into(),
            signal_id: "a".into(),
            payload: Payload::unit(),
            sent_at_ms: 0,
            sender: None,
        };
        store.send_signal("wf", message).await.unwrap();
        assert_eq!(arrivals(&store), [1]);
        let layout_8 = vec![
            Write::Delete(Table::Inbox, keys::inbox_named_key("wf", "go", 1)),
            Write::Put(Table::Meta, b"layout".to_vec(), 8u32.to_be_bytes().to_vec()),
        ];
        store.engine().write(layout_8, true).unwrap();
        assert_eq!(arrivals(&store), [0u64; 0], "as layout 8 left it");
    }
    let store = disk.open();
    assert_eq!(arrivals(&store), [1]);
}

/// A write the engine failed leaves the store unsure of what the engine holds: every later
/// write is refused as poisoned, a transition or a stream's, even once the engine writes again.
#[tokio::test]
async fn a_failed_write_poisons_every_later_write() {
    let engine = MemoryEngine::new();
    let store = MemoryStore::on(engine.clone()).unwrap();
    store.commit(start("wf")).await.unwrap();
    engine.fail_writes_after(0);
    let mut current = record();
    current.journal_len = 1;
    let next = || Transition::append("wf", &current, vec![started()]);
    let failed = store.commit(next()).await.unwrap_err();
    assert!(matches!(failed, StoreError::Poisoned(_)), "{failed}");
    engine.heal();
    let refused = store.commit(next()).await.unwrap_err();
    assert!(matches!(refused, StoreError::Poisoned(_)), "{refused}");
    let streamed = store.append_stream("wf", vec![chunk("late")]).await;
    let refused = streamed.unwrap_err();
    assert!(matches!(refused, StoreError::Poisoned(_)), "{refused}");
    assert_eq!(
        store.journal("wf").unwrap(),
        vec![started()],
        "nothing was written"
    );
}

/// A workflow row whose key does not decode is listed as corrupt under its bytes, beside the
/// others: recovery reports it and resumes the rest.
#[tokio::test]
async fn a_workflow_key_that_does_not_decode_is_listed_as_corrupt() {
    let engine = MemoryEngine::new();
    let store = MemoryStore::on(engine.clone()).unwrap();
    store.commit(start("good")).await.unwrap();
    // A record that decodes, under a key that does not: listing it under a made-up id as a
    // workflow would have recovery resume a workflow nobody can address.
    let record = engine.get(Table::Workflows, &keys::id_key("good")).unwrap();
    let bad_key = b"\xff\xff".to_vec();
    let copied = Write::Put(Table::Workflows, bad_key, record.unwrap());
    engine.write(vec![copied], true).unwrap();
    let listing = store.workflows().unwrap();
    let good = listing.iter().find(|(id, _)| id == "good");
    assert!(matches!(good, Some((_, Ok(_)))), "{listing:?}");
    let bad = listing.iter().find(|(id, _)| id != "good");
    let Some((shown, Err(error))) = bad else {
        panic!("the bad row is listed as an error: {listing:?}");
    };
    assert!(
        error.to_string().contains("the key does not decode"),
        "{error}"
    );
    assert!(shown.contains("ff"), "listed under its bytes: {shown}");
}

async fn stream_acknowledgements_never_move_back_nor_past_the_stream_and_survive_a_reopen<
    D: Disk,
>(
    disk: D,
) {
    {
        let store = disk.open();
        let events = (0..3).map(|i| chunk(&format!("part {i}"))).collect();
        store.append_stream("a", events).await.unwrap();
        // Queued together, so they meet in one group: each is checked against the one before.
        let acks = ["web", "web", "web", "mobile"]
            .into_iter()
            .zip([2, 1, 3, 1]);
        let written = acks.map(|(channel, event)| store.acknowledge_stream("a", channel, event));
        for written in join_all(written.collect::<Vec<_>>()).await {
            written.unwrap();
        }
        let past = store.acknowledge_stream("a", "web", 4).await;
        assert!(matches!(past, Err(StoreError::Conflict { .. })), "{past:?}");
        let unwritten = store.acknowledge_stream("ab", "web", 1).await;
        assert!(
            matches!(unwritten, Err(StoreError::Conflict { .. })),
            "ab has no stream yet"
        );
        // A workflow whose id extends another's keeps its own rows.
        store.append_stream("ab", vec![chunk("x")]).await.unwrap();
        store.acknowledge_stream("ab", "b", 1).await.unwrap();
    }
    let store = disk.open();
    let mut acks = store.stream_acks("a").unwrap();
    acks.sort();
    assert_eq!(acks, [("mobile".to_owned(), 1), ("web".to_owned(), 3)]);
    assert_eq!(store.stream_acks("ab").unwrap(), [("b".to_owned(), 1)]);
}

/// The data dir holds every payload as written: a new one is its owner's alone.
#[cfg(all(unix, feature = "rocksdb"))]
#[test]
fn a_new_data_dir_is_readable_by_its_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("nested").join("data");
    drop(waymark_runtime::store::RocksStore::open(&dir).unwrap());
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "{mode:o}");
}

/// An artifact with `text` as its content, committed by `workflow_id`.
fn artifact(text: &str, workflow_id: &str) -> (Digest, ArtifactRecord) {
    let content = Payload::encode(text).unwrap();
    let record = ArtifactRecord {
        kind: "plan".into(),
        version: "v1".into(),
        content: content.clone(),
        metadata: Vec::new(),
        workflow_id: workflow_id.into(),
        created_at_ms: 0,
    };
    (waymark_runtime::artifacts::artifact_hash(&content), record)
}

/// Starts `id` (with request id `req-{id}`), committing `artifacts` as snapshots, an
/// operation, a stream event and a signal; then ends it at `ended_at_ms` unless `None`.
async fn workflow_with_every_row<S: Store>(
    store: &S,
    id: &str,
    artifacts: &[(Digest, ArtifactRecord)],
    ended_at_ms: Option<u64>,
) {
    let mut begin = start(id);
    begin.claim_request = Some(format!("req-{id}"));
    begin.record.request_id = Some(format!("req-{id}"));
    for (seq, (hash, _)) in artifacts.iter().enumerate() {
        begin.append.push(Entry::SnapshotCompleted {
            seq: seq as u32,
            attempt: 1,
            artifact: *hash,
        });
    }
    begin.record.journal_len = begin.append.len() as u64;
    begin.artifacts = artifacts.to_vec();
    let key = waymark_runtime::operations::idempotency_key(id, "book", &Payload::unit(), 1);
    begin.operations.push((key, operation(id)));
    begin.stream.push(chunk("hello"));
    let record = begin.record.clone();
    store.commit(begin).await.unwrap();
    let message = InboxMessage {
        name: "go".into(),
        signal_id: format!("sig-{id}"),
        payload: Payload::unit(),
        sent_at_ms: 0,
        sender: None,
    };
    store.send_signal(id, message).await.unwrap();
    store.acknowledge_stream(id, "reader", 1).await.unwrap();
    let Some(at) = ended_at_ms else { return };
    end_leaving(store, id, &record, at, committed()).await;
}

/// Ends workflow `id`, stored as `record`, leaving its operation `book` with `status`.
async fn end_leaving<S: Store>(
    store: &S,
    id: &str,
    record: &WorkflowRecord,
    at: u64,
    status: OperationStatus,
) -> (String, OperationRecord) {
    let mut end = completing(id, record);
    end.ended_at_ms = at;
    let key = waymark_runtime::operations::idempotency_key(id, "book", &Payload::unit(), 1);
    let left = OperationRecord {
        status,
        ..operation(id)
    };
    end.operations.push((key.clone(), left.clone()));
    store.commit(end).await.unwrap();
    (key, left)
}

/// The transition that completes workflow `id`, stored as `record`.
fn completing(id: &str, record: &WorkflowRecord) -> Transition {
    let done = Entry::WorkflowCompleted {
        output: Payload::unit(),
    };
    let mut end = Transition::append(id, record, vec![done]);
    end.record.status = WorkflowStatus::Completed;
    end
}

/// A call that took effect, answered with nothing.
fn committed() -> OperationStatus {
    OperationStatus::Committed {
        result: Payload::unit(),
        external_ref: None,
    }
}

/// A call nobody can tell took effect, left to an operator.
fn awaiting_operator() -> OperationStatus {
    let reason = "did it take effect?".to_owned();
    OperationStatus::AwaitingOperator { reason }
}

/// An operator's decision that the call of `key`, stored as `decided` by a workflow that has
/// ended, failed for good.
async fn fail_ended_operation<S: Store>(store: &S, key: &str, decided: OperationRecord) {
    let failure = Failure::new(FailureKind::Terminal, "never booked");
    let failed = OperationRecord {
        status: OperationStatus::FailedTerminal { failure },
        ..decided.clone()
    };
    store
        .settle_ended_operation(key, decided, failed)
        .await
        .unwrap();
}

/// An ended workflow whose operation may have taken effect unsettled is kept, whole, with the
/// operation: its record is the only trace of the call. Settled, it is deleted.
async fn an_ended_workflow_is_kept_while_an_operation_is_unsettled<D: Disk>(disk: D) {
    let store = disk.open();
    let begin = start("left");
    let record = begin.record.clone();
    store.commit(begin).await.unwrap();
    let (key, left) = end_leaving(&store, "left", &record, 5_000, awaiting_operator()).await;

    let refused = store.delete_workflow("left", Vec::new()).await.unwrap_err();
    assert_eq!(
        refused.to_string(),
        format!(
            "workflow `left` holds operations nobody has settled ({key}): decide each one \
             (committed, not found or failed) before deleting the workflow"
        )
    );
    assert!(store.workflow("left").unwrap().is_some());
    assert_eq!(store.operation(&key).unwrap().as_ref(), Some(&left));
    assert_eq!(store.ended_before(6_000, None, 10).unwrap().len(), 1);

    fail_ended_operation(&store, &key, left).await;
    store.delete_workflow("left", Vec::new()).await.unwrap();
    assert!(store.workflow("left").unwrap().is_none());
    assert!(store.operation(&key).unwrap().is_none());
}

/// The operations awaiting a decision are read one namespace at a time: a namespace's are
/// those under its prefix, the default namespace's are those under none, even an id that
/// starts with another namespace's name.
async fn operations_awaiting_a_decision_are_read_one_namespace_at_a_time<D: Disk>(disk: D) {
    let store = disk.open();
    let in_billing = "billing\u{1f}left";
    for id in [in_billing, "left", "billing-left"] {
        let begin = start(id);
        let record = begin.record.clone();
        store.commit(begin).await.unwrap();
        end_leaving(&store, id, &record, 5_000, awaiting_operator()).await;
    }
    let keys = |namespace: Option<&str>| -> Vec<String> {
        let listed = waymark_runtime::worker::operations_awaiting_decision(&store, namespace);
        listed.unwrap().into_iter().map(|(key, _)| key).collect()
    };
    let key =
        |id: &str| waymark_runtime::operations::idempotency_key(id, "book", &Payload::unit(), 1);
    assert_eq!(keys(Some("billing")), [key(in_billing)]);
    assert_eq!(keys(Some("default")), [key("billing-left"), key("left")]);
    assert_eq!(keys(Some("support")), Vec::<String>::new());
    assert_eq!(keys(None).len(), 3);
}

/// The key of `workflow_id`'s operation `book` called with nothing, as the helpers above
/// write it.
fn booking_key_unit(workflow_id: &str) -> String {
    waymark_runtime::operations::idempotency_key(workflow_id, "book", &Payload::unit(), 1)
}

/// The key of `workflow_id`'s operation `book` called with `n`.
fn booking_key(workflow_id: &str, n: u64) -> String {
    let arguments = Payload::encode(&n).unwrap();
    waymark_runtime::operations::idempotency_key(workflow_id, "book", &arguments, 1)
}

fn unsettled_keys<S: Store>(store: &S, prefix: &str) -> Vec<String> {
    let listed = store.unsettled_operations(prefix).unwrap();
    listed.into_iter().map(|(key, _)| key).collect()
}

/// An operation is read through the index of unsettled ones while it may have taken effect
/// unsettled (`prepared`, an unknown outcome, awaiting an operator), and no longer once
/// settled, by its run or by a decision after its workflow ended.
async fn only_unsettled_operations_are_read_through_their_index<D: Disk>(disk: D) {
    let store = disk.open();
    let (committed, waiting, left_prepared) = (
        booking_key("wf", 1),
        booking_key("wf", 2),
        booking_key("wf", 3),
    );
    let mut begin = start("wf");
    for key in [&committed, &waiting, &left_prepared] {
        begin.operations.push((key.clone(), operation("wf")));
    }
    let record = begin.record.clone();
    store.commit(begin).await.unwrap();
    let mut all = vec![committed.clone(), waiting.clone(), left_prepared.clone()];
    all.sort();
    assert_eq!(unsettled_keys(&store, ""), all);

    let mut end = completing("wf", &record);
    let awaiting = OperationRecord {
        status: awaiting_operator(),
        ..operation("wf")
    };
    let settled = OperationRecord {
        status: self::committed(),
        ..operation("wf")
    };
    end.operations.push((committed.clone(), settled));
    end.operations.push((waiting.clone(), awaiting.clone()));
    store.commit(end).await.unwrap();
    let mut open = vec![waiting.clone(), left_prepared.clone()];
    open.sort();
    assert_eq!(unsettled_keys(&store, ""), open);
    let listed = store.unsettled_operations(&waiting).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].1.as_ref().unwrap(), &awaiting);

    fail_ended_operation(&store, &waiting, awaiting).await;
    assert_eq!(unsettled_keys(&store, ""), [left_prepared]);
    // A settled operation's index row is gone, not only passed over: the index stays as
    // small as what is unsettled.
    for key in [&committed, &waiting] {
        let row = store
            .engine()
            .get(Table::Unsettled, key.as_bytes())
            .unwrap();
        assert_eq!(row, None, "{key}");
    }
    let prefix = waymark_runtime::operations::key_prefix("wf");
    assert_eq!(
        store.operations(&prefix).unwrap().len(),
        3,
        "every record stays"
    );
}

/// What the listing reads follows every write once a listing has read the index: the store's
/// own writes (a store one process owns keeps the keys as it writes them) and a write made
/// around the store (the keys are read again).
async fn the_unsettled_operations_listed_follow_every_write<D: Disk>(disk: D) {
    let store = disk.open();
    let (first, second, around) = (
        booking_key("wf", 1),
        booking_key("wf", 2),
        booking_key("wf", 3),
    );
    let mut begin = start("wf");
    begin.operations.push((first.clone(), operation("wf")));
    let record = begin.record.clone();
    store.commit(begin).await.unwrap();
    assert_eq!(unsettled_keys(&store, ""), std::slice::from_ref(&first));

    let mut end = completing("wf", &record);
    let settled = OperationRecord {
        status: committed(),
        ..operation("wf")
    };
    let awaiting = OperationRecord {
        status: awaiting_operator(),
        ..operation("wf")
    };
    end.operations.push((first.clone(), settled));
    end.operations.push((second.clone(), awaiting.clone()));
    store.commit(end).await.unwrap();
    assert_eq!(unsettled_keys(&store, ""), std::slice::from_ref(&second));

    let prepared = waymark_runtime::journal::encode_record(&operation("wf"));
    let written_around = vec![
        Write::Put(Table::Operations, around.as_bytes().to_vec(), prepared),
        Write::Put(Table::Unsettled, around.as_bytes().to_vec(), Vec::new()),
    ];
    store.engine().write(written_around, true).unwrap();
    let mut both = [second.clone(), around.clone()];
    both.sort();
    assert_eq!(unsettled_keys(&store, ""), both);

    fail_ended_operation(&store, &second, awaiting).await;
    assert_eq!(unsettled_keys(&store, ""), [around]);
}

/// A store written before layout 10 has no index of unsettled operations: the first open
/// builds it from the operations, a row that does not decode among them (it may be the only
/// trace of a call that took effect), a settled one left out.
async fn the_unsettled_operations_of_layout_9_are_indexed_when_opened<D: Disk>(disk: D) {
    let (settled, prepared, garbled) = (
        booking_key("wf", 1),
        booking_key("wf", 2),
        booking_key("wf", 3),
    );
    {
        let store = disk.open();
        let mut begin = start("wf");
        let committed = OperationRecord {
            status: committed(),
            ..operation("wf")
        };
        begin.operations.push((settled.clone(), committed));
        begin.operations.push((prepared.clone(), operation("wf")));
        store.commit(begin).await.unwrap();
        let layout_9 = vec![
            Write::Delete(Table::Unsettled, prepared.as_bytes().to_vec()),
            Write::Put(
                Table::Operations,
                garbled.as_bytes().to_vec(),
                vec![9, 9, 9],
            ),
            Write::Put(Table::Meta, b"layout".to_vec(), 9u32.to_be_bytes().to_vec()),
        ];
        store.engine().write(layout_9, true).unwrap();
        assert_eq!(
            unsettled_keys(&store, ""),
            Vec::<String>::new(),
            "as layout 9 left it"
        );
    }
    let store = disk.open();
    let listed = store.unsettled_operations("").unwrap();
    let mut expected = [prepared.clone(), garbled.clone()];
    expected.sort();
    let keys: Vec<&String> = listed.iter().map(|(key, _)| key).collect();
    assert_eq!(keys, expected.iter().collect::<Vec<_>>());
    for (key, record) in &listed {
        match key == &garbled {
            true => assert!(record.is_err(), "{key}: {record:?}"),
            false => assert_eq!(record.as_ref().unwrap(), &operation("wf")),
        }
    }
}

/// A burst of reads answers as the store's own reads do, in whatever order the workflows are
/// read (its cursors move back and forth between them), ids that start alike included.
async fn a_burst_reads_what_the_store_reads<D: Disk>(disk: D) {
    let store = disk.open();
    let ids = ["burst", "burst-2", "burs"];
    let mut hashes = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let artifacts = [artifact(&format!("text {i}"), id)];
        hashes.push(artifacts[0].0);
        workflow_with_every_row(&store, id, &artifacts, None).await;
    }
    let read_all = |reads: &dyn ReplayReads| {
        // Absent ids: one past every row, and one whose seek lands on the next workflow's row.
        // Keys order ids by length first: "burs", "burst", "burst-2" is the tables' order, in
        // which a cursor stands where each next workflow's rows begin, and "burst-2", "burst",
        // "burs" the reverse; "missing" sorts after them all, "bur" before.
        let order = ids.iter().rev().chain(&ids).chain(&["missing", "bur"]);
        let order = order.chain(&["bur", "burs", "burst", "burst-2", "missing"]);
        let mut seen = Vec::new();
        for (id, hash) in order.zip(hashes.iter().rev().chain(&hashes).cycle()) {
            let namespace = waymark_runtime::namespace::split(id).0;
            seen.push(format!("{:?}", reads.workflow(id)));
            seen.push(format!("{:?}", reads.journal(id)));
            seen.push(format!("{:?}", reads.artifact(namespace, hash)));
            seen.push(format!("{:?}", reads.inbox_last(id)));
            seen.push(format!("{:?}", reads.stream_last(id)));
        }
        seen
    };
    let own = read_all(&StoreReads(&store));
    assert!(
        own.iter().filter(|read| read.contains("Err")).count() == 0,
        "{own:?}"
    );
    let mut burst = None;
    let shared = store.read_burst(&mut |reads| burst = Some(read_all(reads)));
    assert_eq!(shared, D::SHARES_BURST_READS);
    assert_eq!(burst.is_some(), shared);
    if let Some(burst) = burst {
        assert_eq!(burst, own);
    }
}

/// An operation read from memory is the stored one, or no answer (then it is read off the async
/// threads): never another record, nor an error for a record that reads.
async fn an_operation_read_from_memory_is_the_stored_one<D: Disk>(disk: D) {
    let store = disk.open();
    let key = waymark_runtime::operations::idempotency_key("op", "book", &Payload::unit(), 1);
    let before = store.operation_in_memory(&key);
    assert!(matches!(before, None | Some(Ok(None))), "{before:?}");
    let mut begin = start("op");
    begin.operations.push((key.clone(), operation("op")));
    store.commit(begin).await.unwrap();
    let stored = store.operation(&key).unwrap();
    assert_eq!(stored, Some(operation("op")));
    match store.operation_in_memory(&key) {
        Some(found) => assert_eq!(found.unwrap(), stored),
        None => assert!(!D::ANSWERS_FROM_MEMORY, "a one-process engine answers"),
    }
}

async fn deleting_an_ended_workflow_takes_every_row_of_its_own_and_nothing_else<D: Disk>(disk: D) {
    let store = disk.open();
    let (own, shared) = (
        artifact("own plan", "done"),
        artifact("shared plan", "done"),
    );
    let both = [own.clone(), shared.clone()];
    workflow_with_every_row(&store, "done", &both, Some(5_000)).await;
    workflow_with_every_row(&store, "other", std::slice::from_ref(&shared), Some(9_000)).await;
    workflow_with_every_row(&store, "running", &[], None).await;
    let ended = store.ended_before(6_000, None, 10).unwrap();
    assert_eq!(ended, [(5_000, "done".to_owned())]);

    // An index row left behind by its settled operation (none is, by the store's writes) goes
    // with the workflow.
    let left = booking_key_unit("done").into_bytes();
    let stale = vec![Write::Put(Table::Unsettled, left.clone(), Vec::new())];
    store.engine().write(stale, true).unwrap();
    // Listed once before the deletion: a store that keeps the index's keys then holds these.
    assert_eq!(unsettled_keys(&store, ""), [booking_key_unit("running")]);
    let journal = store.journal("done").unwrap();
    let committed = waymark_runtime::store::committed_artifacts(&journal);
    store.delete_workflow("done", committed).await.unwrap();
    assert_eq!(store.engine().get(Table::Unsettled, &left).unwrap(), None);

    assert_eq!(store.workflow("done").unwrap(), None);
    assert!(store.journal("done").unwrap().is_empty());
    assert_eq!(store.request("req-done").unwrap(), None);
    assert!(store.stream("done", 0).unwrap().is_empty());
    assert!(store.stream_acks("done").unwrap().is_empty());
    assert!(!store.signal_seen("done", "sig-done").unwrap());
    let prefix = waymark_runtime::operations::key_prefix("done");
    assert!(store.operations(&prefix).unwrap().is_empty());
    assert!(store.artifact("default", &own.0).unwrap().is_none());
    assert!(store
        .ended_before(u64::MAX, None, 10)
        .unwrap()
        .iter()
        .all(|(_, id)| id != "done"));
    // What another workflow committed too, and every row of the others, stay.
    assert_eq!(
        store.artifact("default", &shared.0).unwrap(),
        Some(shared.1.clone())
    );
    for other in ["other", "running"] {
        assert!(store.workflow(other).unwrap().is_some());
        assert_eq!(
            store.request(&format!("req-{other}")).unwrap().as_deref(),
            Some(other)
        );
        assert!(store.signal_seen(other, &format!("sig-{other}")).unwrap());
        assert_eq!(store.stream(other, 0).unwrap().len(), 1);
        let prefix = waymark_runtime::operations::key_prefix(other);
        assert_eq!(store.operations(&prefix).unwrap().len(), 1);
    }
    // The running workflow's operation is still `prepared`; the ended ones' were committed.
    assert_eq!(unsettled_keys(&store, ""), [booking_key_unit("running")]);

    // The last workflow that committed the shared artifact takes it with it.
    let journal = store.journal("other").unwrap();
    let committed = waymark_runtime::store::committed_artifacts(&journal);
    store.delete_workflow("other", committed).await.unwrap();
    assert!(store.artifact("default", &shared.0).unwrap().is_none());
    // And a deleted workflow's request id starts a new one.
    let mut again = start("done-again");
    again.claim_request = Some("req-done".into());
    store.commit(again).await.unwrap();
    assert_eq!(
        store.request("req-done").unwrap().as_deref(),
        Some("done-again")
    );
}

async fn a_deletion_refused_changes_nothing<D: Disk>(disk: D) {
    let store = disk.open();
    let shared = artifact("shared plan", "running");
    workflow_with_every_row(&store, "running", std::slice::from_ref(&shared), None).await;
    let refused = store
        .delete_workflow("running", vec![shared.0])
        .await
        .unwrap_err();
    assert!(
        matches!(refused, StoreError::NotEnded { .. }),
        "{refused:?}"
    );
    assert_eq!(
        refused.to_string(),
        "workflow `running` has not ended (it is running): only an ended workflow can be deleted"
    );
    let unknown = store
        .delete_workflow("nobody", Vec::new())
        .await
        .unwrap_err();
    assert_eq!(unknown.to_string(), "no workflow `nobody`");
    assert!(store.workflow("running").unwrap().is_some());
    assert_eq!(store.journal("running").unwrap().len(), 2);
    assert_eq!(
        store.artifact("default", &shared.0).unwrap(),
        Some(shared.1)
    );
    assert!(store.signal_seen("running", "sig-running").unwrap());
}

async fn a_journal_page_is_read_from_its_first_index<D: Disk>(disk: D) {
    let store = disk.open();
    let mut begin = start("long");
    for seq in 0..9 {
        begin.append.push(Entry::ValueRecorded {
            seq,
            identity: CommandIdentity::new(CommandKind::Random, "random", &Payload::unit()),
            value: Payload::encode(&seq).unwrap(),
        });
    }
    begin.record.journal_len = begin.append.len() as u64;
    store.commit(begin).await.unwrap();
    let whole = store.journal("long").unwrap();
    assert_eq!(whole.len(), 10);
    assert_eq!(store.journal_page("long", 3, 4).unwrap(), whole[3..7]);
    assert_eq!(store.journal_page("long", 8, 100).unwrap(), whole[8..]);
    assert!(store.journal_page("long", 10, 5).unwrap().is_empty());
    assert!(store.journal_page("nobody", 0, 5).unwrap().is_empty());
}

/// On a store many workers share, a transaction holds what its batch is checked against from
/// before its first read to its commit: another worker's transaction naming the same workflow
/// waits, then stages on the first one's write instead of beside it.
#[cfg(feature = "postgres")]
#[test]
fn a_transaction_on_postgres_holds_its_locks_until_it_commits() {
    let Some(disk) = OnPostgres::new() else {
        return;
    };
    assert_eq!(second_transaction_reads(&disk.0), Some(b"first".to_vec()));
}

/// The same, on a database whose sessions default to repeatable read: there the lock
/// statement, the transaction's first, would fix its snapshot before the wait, and the second
/// transaction would stage on what it read before the first one committed.
#[cfg(feature = "postgres")]
#[test]
fn a_transaction_on_postgres_reads_after_its_locks_whatever_the_default_isolation() {
    let Some(disk) = OnPostgres::new() else {
        return;
    };
    let mut options = disk.0.clone();
    let joint = if options.url.contains('?') { '&' } else { '?' };
    let repeatable = "options=-c%20default_transaction_isolation%3Drepeatable%5C%20read";
    options.url = format!("{}{joint}{repeatable}", options.url);
    assert_eq!(second_transaction_reads(&options), Some(b"first".to_vec()));
}

/// Two engines on one schema: the first transaction locks `wf` and holds it open while the
/// second, locking `wf` too, starts; what the second reads of the row the first writes.
#[cfg(feature = "postgres")]
fn second_transaction_reads(options: &waymark_runtime::store::PgOptions) -> Option<Vec<u8>> {
    use std::time::Duration;
    use waymark_runtime::store::PgEngine;
    let first = PgEngine::connect(options).unwrap();
    let second = PgEngine::connect(options).unwrap();
    let locks = |visit: &mut dyn FnMut(&str)| visit("wf");
    let (entered, staging) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut stage = |_: &dyn Reads| {
                entered.send(()).unwrap();
                // Holds the transaction open while the second one starts.
                std::thread::sleep(Duration::from_millis(300));
                let probe = Write::Put(Table::Meta, b"probe".to_vec(), b"first".to_vec());
                Ok(vec![probe])
            };
            first.transact(&locks, true, &mut stage).unwrap();
        });
        staging.recv().unwrap();
        let mut seen = None;
        let mut stage = |reads: &dyn Reads| {
            seen = reads.get(Table::Meta, b"probe")?;
            Ok(Vec::new())
        };
        second.transact(&locks, true, &mut stage).unwrap();
        seen
    })
}
