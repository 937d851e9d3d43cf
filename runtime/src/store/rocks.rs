//! The embedded default: RocksDB with one column family per record type and a group-commit
//! writer thread.
//!
//! One thread owns every write. It takes the first pending transition, drains whatever else is
//! waiting, validates each against the store plus the batch built so far, writes them as one
//! `WriteBatch` with `sync = true`, and only then acknowledges each waiter. Concurrent workflows
//! thereby share one fsync instead of paying one each, and no tokio worker ever blocks on disk.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

use futures::future::BoxFuture;
use futures::FutureExt;
use rocksdb::{
    ColumnFamilyDescriptor, DBCompressionType, Direction, IteratorMode, Options, WriteBatch,
    WriteOptions, DB,
};
use tokio::sync::oneshot;

use crate::sync::lock;

use super::watchers::StreamWatchers;

use super::{
    OperationListing, Store, StoreError, Table, Transition, WorkflowListing, WorkflowRecord,
};
use crate::artifacts::ArtifactRecord;
use crate::inbox::InboxMessage;
use crate::journal::{decode_record, encode_record, Digest, Entry};
use crate::keys::{
    id_key, inbox_message_key, inbox_messages_prefix, inbox_seen_key, journal_key, parse_id_key,
    parse_inbox_arrival, parse_journal_key, stream_key, TimerKey,
};
use crate::operations::OperationRecord;
use crate::streams::{StreamEvent, StreamItem};

/// Every column family, created on open. Some are reserved for record types that later features
/// write (artifacts, operations, streams, inbox), so that adding them needs no migration.
const COLUMN_FAMILIES: &[&str] = &[
    "workflows",
    "journal",
    "artifacts",
    "operations",
    "streams",
    "timers",
    "requests",
    "inbox",
];

/// A raw key and value.
type Row = (Box<[u8]>, Box<[u8]>);

/// Most transitions folded into one synced write.
const MAX_GROUP: usize = 256;

struct Job {
    work: Work,
    ack: Ack,
}

enum Work {
    /// Synced with its group.
    Transition(Box<Transition>),
    /// Stream events alone: need no sync of their own.
    Stream {
        workflow_id: String,
        items: Vec<StreamItem>,
    },
    /// A signal for the inbox: synced; refused as a conflict if its id was seen.
    Signal {
        workflow_id: String,
        message: InboxMessage,
    },
}

/// RocksDB-backed [`Store`].
pub struct RocksStore {
    db: Arc<DB>,
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    poison: Arc<Mutex<Option<String>>>,
    stats: Arc<WriteCounters>,
    watchers: Arc<StreamWatchers>,
}

/// How the writer has grouped commits so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WriteStats {
    /// Synced `WriteBatch`es written.
    pub batches: u64,
    /// Transitions they carried (accepted ones).
    pub transitions: u64,
}

#[derive(Default)]
struct WriteCounters {
    batches: AtomicU64,
    transitions: AtomicU64,
}

impl RocksStore {
    /// Opens (creating if needed) the store in `dir` for reading and writing. One process at a
    /// time: RocksDB's lock file refuses a second opener.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        let db = DB::open_cf_descriptors(&db_options(), dir, descriptors()).map_err(backend)?;
        let db = Arc::new(db);
        let poison = Arc::new(Mutex::new(None));
        let stats = Arc::new(WriteCounters::default());
        let watchers = Arc::new(StreamWatchers::default());
        let (jobs, receiver) = mpsc::channel();
        let writer = std::thread::Builder::new()
            .name("waymark-store-writer".into())
            .spawn({
                let writer = Writer {
                    db: db.clone(),
                    poison: poison.clone(),
                    stats: stats.clone(),
                    watchers: watchers.clone(),
                };
                move || writer.run(&receiver)
            })
            .map_err(|e| StoreError::Backend(format!("cannot start writer thread: {e}")))?;
        Ok(Self {
            db,
            jobs: Mutex::new(Some(jobs)),
            writer: Mutex::new(Some(writer)),
            poison,
            stats,
            watchers,
        })
    }

    /// Opens a store read-only, for inspecting a stopped worker's data (or a running one's, as
    /// of its last flush). Commits fail with [`StoreError::Closed`].
    pub fn open_read_only(dir: &Path) -> Result<Self, StoreError> {
        let db = DB::open_cf_for_read_only(&db_options(), dir, COLUMN_FAMILIES, false)
            .map_err(backend)?;
        Ok(Self {
            db: Arc::new(db),
            jobs: Mutex::new(None),
            writer: Mutex::new(None),
            poison: Arc::new(Mutex::new(None)),
            stats: Arc::default(),
            watchers: Arc::default(),
        })
    }

    /// How commits were grouped into synced writes since the store opened.
    pub fn write_stats(&self) -> WriteStats {
        WriteStats {
            batches: self.stats.batches.load(Ordering::Relaxed),
            transitions: self.stats.transitions.load(Ordering::Relaxed),
        }
    }

    /// Overwrites one raw journal record, bypassing every check. Only for tests that prove a
    /// corrupt record is reported and contained.
    #[doc(hidden)]
    pub fn overwrite_journal_record(
        &self,
        workflow_id: &str,
        index: u64,
        bytes: &[u8],
    ) -> Result<(), StoreError> {
        let cf = cf(&self.db, Table::Journal)?;
        let mut options = WriteOptions::default();
        options.set_sync(true);
        let key = journal_key(workflow_id, index);
        self.db
            .put_cf_opt(cf, key, bytes, &options)
            .map_err(backend)
    }

    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.db.get_cf(cf(&self.db, table)?, key).map_err(backend)
    }

    fn scan(&self, table: Table, prefix: &[u8]) -> Result<Vec<Row>, StoreError> {
        let mode = IteratorMode::From(prefix, Direction::Forward);
        let mut rows = Vec::new();
        for row in self.db.iterator_cf(cf(&self.db, table)?, mode) {
            let (key, value) = row.map_err(backend)?;
            if !key.starts_with(prefix) {
                break;
            }
            rows.push((key, value));
        }
        Ok(rows)
    }
}

impl Drop for RocksStore {
    fn drop(&mut self) {
        // Closing the channel lets the writer finish what is queued and exit; joining it means
        // the database is closed (its lock released) when the store is gone.
        lock(&self.jobs).take();
        if let Some(writer) = lock(&self.writer).take() {
            let _ = writer.join();
        }
    }
}

impl Store for RocksStore {
    fn workflow(&self, workflow_id: &str) -> Result<Option<WorkflowRecord>, StoreError> {
        let key = id_key(workflow_id);
        self.get(Table::Workflows, &key)?
            .map(|bytes| decode_at(Table::Workflows, workflow_id, &bytes))
            .transpose()
    }

    fn workflows(&self) -> Result<WorkflowListing, StoreError> {
        let rows = self.scan(Table::Workflows, &[])?;
        let decoded = rows.into_iter().map(|(key, value)| {
            let id = parse_id_key(&key).unwrap_or_else(|e| e.to_string());
            let record = decode_at(Table::Workflows, &id, &value);
            (id, record)
        });
        Ok(decoded.collect())
    }

    fn journal(&self, workflow_id: &str) -> Result<Vec<Entry>, StoreError> {
        let rows = self.scan(Table::Journal, &id_key(workflow_id))?;
        let mut entries = Vec::with_capacity(rows.len());
        for (index, (key, value)) in rows.into_iter().enumerate() {
            // A gap means a lost or foreign record: as bad as an undecodable one.
            if key.as_ref() != journal_key(workflow_id, index as u64).as_slice() {
                return Err(StoreError::Corrupt {
                    table: Table::Journal,
                    key: format!("{workflow_id}#{index}"),
                    source: crate::journal::DecodeError::Malformed("missing entry".into()),
                });
            }
            entries.push(decode_at(
                Table::Journal,
                &format!("{workflow_id}#{index}"),
                &value,
            )?);
        }
        Ok(entries)
    }

    fn request(&self, request_id: &str) -> Result<Option<String>, StoreError> {
        let Some(bytes) = self.get(Table::Requests, &id_key(request_id))? else {
            return Ok(None);
        };
        decode_at(Table::Requests, request_id, &bytes).map(Some)
    }

    fn timers(&self) -> Result<Vec<TimerKey>, StoreError> {
        let rows = self.scan(Table::Timers, &[])?;
        let keys = rows.iter().map(|(key, _)| {
            TimerKey::decode(key).map_err(|e| StoreError::Corrupt {
                table: Table::Timers,
                key: format!("{key:02x?}"),
                source: crate::journal::DecodeError::Malformed(e.to_string()),
            })
        });
        keys.collect()
    }

    fn operation(&self, key: &str) -> Result<Option<OperationRecord>, StoreError> {
        self.get(Table::Operations, key.as_bytes())?
            .map(|bytes| decode_at(Table::Operations, key, &bytes))
            .transpose()
    }

    fn operations(&self, prefix: &str) -> Result<OperationListing, StoreError> {
        let rows = self.scan(Table::Operations, prefix.as_bytes())?;
        let decoded = rows.into_iter().map(|(key, value)| {
            let key = String::from_utf8_lossy(&key).into_owned();
            let record = decode_at(Table::Operations, &key, &value);
            (key, record)
        });
        Ok(decoded.collect())
    }

    fn stream(&self, workflow_id: &str, after: u64) -> Result<Vec<StreamEvent>, StoreError> {
        let prefix = id_key(workflow_id);
        let start = stream_key(workflow_id, after.saturating_add(1));
        let mode = IteratorMode::From(&start, Direction::Forward);
        let mut events = Vec::new();
        for row in self.db.iterator_cf(cf(&self.db, Table::Streams)?, mode) {
            let (key, value) = row.map_err(backend)?;
            if !key.starts_with(&prefix) {
                break;
            }
            let (_, seq) = parse_journal_key(&key).map_err(|e| StoreError::Corrupt {
                table: Table::Streams,
                key: format!("{key:02x?}"),
                source: crate::journal::DecodeError::Malformed(e.to_string()),
            })?;
            let item = decode_at(Table::Streams, &format!("{workflow_id}#{seq}"), &value)?;
            events.push(StreamEvent { seq, item });
        }
        Ok(events)
    }

    fn artifact(&self, hash: &Digest) -> Result<Option<ArtifactRecord>, StoreError> {
        self.get(Table::Artifacts, &hash.0)?
            .map(|bytes| decode_at(Table::Artifacts, &hash.hex(), &bytes))
            .transpose()
    }

    fn inbox(&self, workflow_id: &str) -> Result<Vec<(u64, InboxMessage)>, StoreError> {
        let prefix = inbox_messages_prefix(workflow_id);
        let rows = self.scan(Table::Inbox, &prefix)?;
        let decoded = rows.into_iter().map(|(key, value)| {
            let arrival = parse_inbox_arrival(&prefix, &key).map_err(|e| StoreError::Corrupt {
                table: Table::Inbox,
                key: format!("{key:02x?}"),
                source: crate::journal::DecodeError::Malformed(e.to_string()),
            })?;
            let at = format!("{workflow_id}#{arrival}");
            Ok((arrival, decode_at(Table::Inbox, &at, &value)?))
        });
        decoded.collect()
    }

    fn signal_seen(&self, workflow_id: &str, signal_id: &str) -> Result<bool, StoreError> {
        let key = inbox_seen_key(workflow_id, signal_id);
        Ok(self.get(Table::Inbox, &key)?.is_some())
    }

    fn send_signal(
        &self,
        workflow_id: &str,
        message: InboxMessage,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        let workflow_id = workflow_id.to_owned();
        self.submit(Work::Signal {
            workflow_id,
            message,
        })
    }

    fn write_stats(&self) -> Option<WriteStats> {
        Some(RocksStore::write_stats(self))
    }

    fn watch_stream(&self, workflow_id: &str) -> Option<tokio::sync::watch::Receiver<()>> {
        Some(self.watchers.subscribe(workflow_id))
    }

    fn commit(&self, transition: Transition) -> BoxFuture<'static, Result<(), StoreError>> {
        self.submit(Work::Transition(Box::new(transition)))
    }

    fn append_stream(
        &self,
        workflow_id: &str,
        items: Vec<StreamItem>,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        let workflow_id = workflow_id.to_owned();
        self.submit(Work::Stream { workflow_id, items })
    }
}

impl RocksStore {
    fn submit(&self, work: Work) -> BoxFuture<'static, Result<(), StoreError>> {
        if let Some(reason) = lock(&self.poison).clone() {
            return futures::future::ready(Err(StoreError::Poisoned(reason))).boxed();
        }
        let (ack, done) = oneshot::channel();
        let sent = match lock(&self.jobs).as_ref() {
            Some(jobs) => jobs.send(Job { work, ack }).is_ok(),
            None => false,
        };
        async move {
            if !sent {
                return Err(StoreError::Closed);
            }
            done.await.unwrap_or(Err(StoreError::Closed))
        }
        .boxed()
    }
}

fn db_options() -> Options {
    let mut options = Options::default();
    options.create_if_missing(true);
    options.create_missing_column_families(true);
    options.set_compression_type(DBCompressionType::Lz4);
    options
}

fn descriptors() -> Vec<ColumnFamilyDescriptor> {
    let cf = |name: &&str| ColumnFamilyDescriptor::new(*name, db_options());
    COLUMN_FAMILIES.iter().map(cf).collect()
}

fn cf(db: &DB, table: Table) -> Result<&rocksdb::ColumnFamily, StoreError> {
    db.cf_handle(table.name())
        .ok_or_else(|| StoreError::Backend(format!("column family `{}` missing", table.name())))
}

fn backend(error: rocksdb::Error) -> StoreError {
    StoreError::Backend(error.into_string())
}

fn decode_at<T: serde::de::DeserializeOwned>(
    table: Table,
    key: &str,
    bytes: &[u8],
) -> Result<T, StoreError> {
    decode_record(bytes).map_err(|source| StoreError::Corrupt {
        table,
        key: key.to_owned(),
        source,
    })
}

/// The writer thread's state.
struct Writer {
    db: Arc<DB>,
    poison: Arc<Mutex<Option<String>>>,
    stats: Arc<WriteCounters>,
    watchers: Arc<StreamWatchers>,
}

impl Writer {
    fn run(&self, jobs: &mpsc::Receiver<Job>) {
        while let Ok(first) = jobs.recv() {
            let mut group = vec![first];
            while group.len() < MAX_GROUP {
                match jobs.try_recv() {
                    Ok(job) => group.push(job),
                    Err(_) => break,
                }
            }
            self.write_group(group);
        }
    }

    fn write_group(&self, group: Vec<Job>) {
        if let Some(reason) = lock(&self.poison).clone() {
            for job in group {
                let _ = job.ack.send(Err(StoreError::Poisoned(reason.clone())));
            }
            return;
        }
        let sync = group.iter().any(|job| match &job.work {
            Work::Transition(transition) => transition.durable,
            Work::Signal { .. } => true,
            Work::Stream { .. } => false,
        });
        let staged = Staged::from_group(&self.db, group);
        let mut options = WriteOptions::default();
        options.set_sync(sync);
        let written = self.db.write_opt(staged.batch, &options);
        let outcome = match written {
            Ok(()) => {
                self.stats.batches.fetch_add(1, Ordering::Relaxed);
                let count = staged.accepted.len() as u64;
                self.stats.transitions.fetch_add(count, Ordering::Relaxed);
                let changed = staged.stream_changed.iter().map(String::as_str);
                self.watchers.notify(changed);
                Ok(())
            }
            Err(e) => Err(self.poison(e.into_string())),
        };
        // Rejections are answered only after the batch is written: a transition that lost to
        // one in the same batch must be able to read the winner's state when it hears why. If
        // the batch failed, there is no winner: they hear the failure instead.
        for (ack, rejection) in staged.rejected {
            let _ = ack.send(outcome.clone().and(Err(rejection)));
        }
        for ack in staged.accepted {
            let _ = ack.send(outcome.clone());
        }
    }

    fn poison(&self, reason: String) -> StoreError {
        tracing::error!(%reason, "store write failed; poisoning the store");
        *lock(&self.poison) = Some(reason.clone());
        StoreError::Poisoned(reason)
    }
}

type Ack = oneshot::Sender<Result<(), StoreError>>;

/// A group validated into one batch.
struct Staged {
    batch: WriteBatch,
    accepted: Vec<Ack>,
    rejected: Vec<(Ack, StoreError)>,
    /// Workflows whose stream readers should look again once the batch is written.
    stream_changed: Vec<String>,
}

impl Staged {
    fn from_group(db: &DB, group: Vec<Job>) -> Self {
        let mut staged = Staged {
            batch: WriteBatch::default(),
            accepted: Vec::with_capacity(group.len()),
            rejected: Vec::new(),
            stream_changed: Vec::new(),
        };
        let mut overlay = Overlay::default();
        for job in group {
            let staged_work = match &job.work {
                Work::Transition(t) => stage(db, t, &mut overlay, &mut staged.batch),
                Work::Stream { workflow_id, items } => {
                    stage_stream(db, workflow_id, items, &mut overlay, &mut staged.batch)
                }
                Work::Signal {
                    workflow_id,
                    message,
                } => stage_signal(db, workflow_id, message, &mut overlay, &mut staged.batch),
            };
            match staged_work {
                Ok(()) => {
                    staged.stream_changed.extend(stream_change(&job.work));
                    staged.accepted.push(job.ack);
                }
                Err(e) => staged.rejected.push((job.ack, e)),
            }
        }
        staged
    }
}

/// The workflow whose stream readers `work` concerns: new events, or an end (readers finish).
fn stream_change(work: &Work) -> Option<String> {
    match work {
        Work::Transition(t) if !t.stream.is_empty() || t.record.status.is_terminal() => {
            Some(t.workflow_id.clone())
        }
        Work::Stream { workflow_id, .. } => Some(workflow_id.clone()),
        Work::Transition(_) | Work::Signal { .. } => None,
    }
}

/// What this group has already claimed, so two transitions in one batch are checked against
/// each other as well as against the store.
#[derive(Default)]
struct Overlay {
    journal_len: HashMap<String, u64>,
    requests: HashMap<String, String>,
    /// The last stream event number written or staged, per workflow.
    stream_last: HashMap<String, u64>,
    /// The last inbox arrival number written or staged, per workflow.
    inbox_last: HashMap<String, u64>,
    /// Signal ids staged in this group, per workflow.
    signals_seen: std::collections::HashSet<(String, String)>,
}

fn stage(
    db: &DB,
    t: &Transition,
    overlay: &mut Overlay,
    batch: &mut WriteBatch,
) -> Result<(), StoreError> {
    check_journal_len(db, t, overlay)?;
    if let Some(request_id) = &t.claim_request {
        check_request_free(db, t, request_id, overlay)?;
    }
    let (workflows, journal) = (cf(db, Table::Workflows)?, cf(db, Table::Journal)?);
    let (timers, requests) = (cf(db, Table::Timers)?, cf(db, Table::Requests)?);
    for (offset, entry) in t.append.iter().enumerate() {
        let index = t.expected_journal_len + offset as u64;
        batch.put_cf(
            journal,
            journal_key(&t.workflow_id, index),
            encode_record(entry),
        );
    }
    batch.put_cf(workflows, id_key(&t.workflow_id), encode_record(&t.record));
    if let Some(request_id) = &t.claim_request {
        batch.put_cf(requests, id_key(request_id), encode_record(&t.workflow_id));
        overlay
            .requests
            .insert(request_id.clone(), t.workflow_id.clone());
    }
    for timer in &t.add_timers {
        batch.put_cf(timers, timer.encode(), []);
    }
    for timer in &t.remove_timers {
        batch.delete_cf(timers, timer.encode());
    }
    let operations = cf(db, Table::Operations)?;
    for (key, record) in &t.operations {
        batch.put_cf(operations, key.as_bytes(), encode_record(record));
    }
    stage_stream(db, &t.workflow_id, &t.stream, overlay, batch)?;
    let artifacts = cf(db, Table::Artifacts)?;
    for (hash, record) in &t.artifacts {
        if db.get_cf(artifacts, hash.0).map_err(backend)?.is_none() {
            batch.put_cf(artifacts, hash.0, encode_record(record));
        }
    }
    let inbox = cf(db, Table::Inbox)?;
    for arrival in &t.consume_inbox {
        batch.delete_cf(inbox, inbox_message_key(&t.workflow_id, *arrival));
    }
    overlay
        .journal_len
        .insert(t.workflow_id.clone(), t.record.journal_len);
    Ok(())
}

/// Numbers stream events after the workflow's last one. Numbering happens here, on the single
/// writer thread, so numbers follow write order and readers never see a gap fill in later.
fn stage_stream(
    db: &DB,
    workflow_id: &str,
    items: &[StreamItem],
    overlay: &mut Overlay,
    batch: &mut WriteBatch,
) -> Result<(), StoreError> {
    if items.is_empty() {
        return Ok(());
    }
    let mut last = match overlay.stream_last.get(workflow_id) {
        Some(last) => *last,
        None => stored_stream_last(db, workflow_id)?,
    };
    let streams = cf(db, Table::Streams)?;
    for item in items {
        last += 1;
        batch.put_cf(streams, stream_key(workflow_id, last), encode_record(item));
    }
    overlay.stream_last.insert(workflow_id.to_owned(), last);
    Ok(())
}

/// Numbers a signal after the workflow's last arrival and marks its id seen; a seen id (in the
/// store or earlier in this group) writes nothing.
fn stage_signal(
    db: &DB,
    workflow_id: &str,
    message: &InboxMessage,
    overlay: &mut Overlay,
    batch: &mut WriteBatch,
) -> Result<(), StoreError> {
    let inbox = cf(db, Table::Inbox)?;
    let seen_key = inbox_seen_key(workflow_id, &message.signal_id);
    let id = (workflow_id.to_owned(), message.signal_id.clone());
    if overlay.signals_seen.contains(&id) || db.get_cf(inbox, &seen_key).map_err(backend)?.is_some()
    {
        return Err(StoreError::Conflict {
            workflow_id: workflow_id.to_owned(),
            reason: format!("signal id `{}` was seen before", message.signal_id),
        });
    }
    let last = match overlay.inbox_last.get(workflow_id) {
        Some(last) => *last,
        None => stored_inbox_last(db, workflow_id)?,
    };
    let arrival = last + 1;
    batch.put_cf(
        inbox,
        inbox_message_key(workflow_id, arrival),
        encode_record(message),
    );
    batch.put_cf(inbox, seen_key, []);
    overlay.inbox_last.insert(workflow_id.to_owned(), arrival);
    overlay.signals_seen.insert(id);
    Ok(())
}

/// The newest arrival number of a workflow's inbox; consumed messages are deleted, so the
/// numbering restarts only when the inbox is empty, which keeps order all the same.
fn stored_inbox_last(db: &DB, workflow_id: &str) -> Result<u64, StoreError> {
    let prefix = inbox_messages_prefix(workflow_id);
    let end = inbox_message_key(workflow_id, u64::MAX);
    let mode = IteratorMode::From(&end, Direction::Reverse);
    let newest = db.iterator_cf(cf(db, Table::Inbox)?, mode).next();
    let Some(row) = newest else {
        return Ok(0);
    };
    let (key, _) = row.map_err(backend)?;
    if !key.starts_with(&prefix) {
        return Ok(0);
    }
    parse_inbox_arrival(&prefix, &key).map_err(|e| StoreError::Corrupt {
        table: Table::Inbox,
        key: format!("{key:02x?}"),
        source: crate::journal::DecodeError::Malformed(e.to_string()),
    })
}

fn stored_stream_last(db: &DB, workflow_id: &str) -> Result<u64, StoreError> {
    let prefix = id_key(workflow_id);
    let end = stream_key(workflow_id, u64::MAX);
    let mode = IteratorMode::From(&end, Direction::Reverse);
    let newest = db.iterator_cf(cf(db, Table::Streams)?, mode).next();
    let Some(row) = newest else {
        return Ok(0);
    };
    let (key, _) = row.map_err(backend)?;
    if !key.starts_with(&prefix) {
        return Ok(0);
    }
    let parsed = parse_journal_key(&key).map(|(_, seq)| seq);
    parsed.map_err(|e| StoreError::Corrupt {
        table: Table::Streams,
        key: format!("{key:02x?}"),
        source: crate::journal::DecodeError::Malformed(e.to_string()),
    })
}

fn check_journal_len(db: &DB, t: &Transition, overlay: &Overlay) -> Result<(), StoreError> {
    let current = match overlay.journal_len.get(&t.workflow_id) {
        Some(len) => *len,
        None => stored_journal_len(db, &t.workflow_id)?,
    };
    if current == t.expected_journal_len {
        return Ok(());
    }
    Err(StoreError::Conflict {
        workflow_id: t.workflow_id.clone(),
        reason: format!(
            "journal has {current} entries, the writer expected {}",
            t.expected_journal_len
        ),
    })
}

fn stored_journal_len(db: &DB, workflow_id: &str) -> Result<u64, StoreError> {
    let bytes = db
        .get_cf(cf(db, Table::Workflows)?, id_key(workflow_id))
        .map_err(backend)?;
    let record: Option<WorkflowRecord> = bytes
        .map(|b| decode_at(Table::Workflows, workflow_id, &b))
        .transpose()?;
    Ok(record.map_or(0, |r| r.journal_len))
}

fn check_request_free(
    db: &DB,
    t: &Transition,
    request_id: &str,
    overlay: &Overlay,
) -> Result<(), StoreError> {
    let owner = match overlay.requests.get(request_id) {
        Some(owner) => Some(owner.clone()),
        None => {
            let bytes = db
                .get_cf(cf(db, Table::Requests)?, id_key(request_id))
                .map_err(backend)?;
            bytes
                .map(|b| decode_at::<String>(Table::Requests, request_id, &b))
                .transpose()?
        }
    };
    match owner {
        Some(owner) if owner != t.workflow_id => Err(StoreError::Conflict {
            workflow_id: t.workflow_id.clone(),
            reason: format!("request id `{request_id}` belongs to workflow `{owner}`"),
        }),
        _ => Ok(()),
    }
}
