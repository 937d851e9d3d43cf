//! The embedded default: RocksDB with one column family per record type and a group-commit
//! writer thread.
//!
//! One thread owns every write. It takes the first pending transition, drains whatever else is
//! waiting, validates each against the store plus the batch built so far, writes them as one
//! `WriteBatch` with `sync = true`, and only then acknowledges each waiter. Concurrent workflows
//! thereby share one fsync instead of paying one each, and no tokio worker ever blocks on disk.

use std::collections::{HashMap, HashSet};
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

mod layout;

use super::watchers::StreamWatchers;

use super::{
    OperationListing, Store, StoreError, Table, Transition, WorkflowListing, WorkflowRecord,
};
use crate::artifacts::ArtifactRecord;
use crate::inbox::InboxMessage;
use crate::journal::{decode_record, encode_record, DecodeError, Digest, Entry, Record, Seq};
use crate::keys::{
    id_key, inbox_counter_key, inbox_message_key, inbox_messages_prefix, inbox_seen_key,
    journal_key, parse_id_key, parse_inbox_arrival, parse_journal_key, stream_key, TimerKey,
};
use crate::operations::OperationRecord;
use crate::streams::{StepVersions, StreamEvent, StreamItem, VersionSlot};

/// Every column family, created on open.
const COLUMN_FAMILIES: &[&str] = &[
    "workflows",
    "journal",
    "artifacts",
    "operations",
    "streams",
    "timers",
    "requests",
    "inbox",
    "stream_steps",
    "meta",
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
    /// One chunk of an attempt's generation; the first fixes the attempt's response version.
    Chunk {
        workflow_id: String,
        step: Seq,
        version: VersionSlot,
        text: String,
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
        let created = existing_families(dir).is_none();
        let db = DB::open_cf_descriptors(&db_options(), dir, descriptors()).map_err(backend)?;
        layout::prepare(&db, created)?;
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
        // A store written by an older build may lack families added since; read what it has.
        let families = existing_families(dir).unwrap_or_default();
        let known = COLUMN_FAMILIES
            .iter()
            .filter(|name| families.iter().any(|f| f == *name));
        let db = DB::open_cf_for_read_only(&db_options(), dir, known, false).map_err(backend)?;
        layout::check_readable(&db)?;
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

    /// Overwrites one raw row of any family, bypassing every check. Only for tests that prove
    /// a corrupt row is reported and contained.
    #[doc(hidden)]
    pub fn overwrite_raw(&self, table: Table, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        let mut options = WriteOptions::default();
        options.set_sync(true);
        let family = cf(&self.db, table)?;
        self.db
            .put_cf_opt(family, key, value, &options)
            .map_err(backend)
    }

    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.db.get_cf(cf(&self.db, table)?, key).map_err(backend)
    }

    fn scan(&self, table: Table, prefix: &[u8]) -> Result<Vec<Row>, StoreError> {
        self.scan_from(table, prefix, prefix)
    }

    /// The rows under `prefix` from key `from` on.
    fn scan_from(&self, table: Table, prefix: &[u8], from: &[u8]) -> Result<Vec<Row>, StoreError> {
        let mode = IteratorMode::From(from, Direction::Forward);
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

    fn stream_last(&self, workflow_id: &str) -> Result<u64, StoreError> {
        stored_stream_last(&self.db, workflow_id)
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

    fn inbox(&self, workflow_id: &str, after: u64) -> Result<Vec<(u64, InboxMessage)>, StoreError> {
        let prefix = inbox_messages_prefix(workflow_id);
        let from = inbox_message_key(workflow_id, after.saturating_add(1));
        let rows = self.scan_from(Table::Inbox, &prefix, &from)?;
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

    fn append_chunk(
        &self,
        workflow_id: &str,
        step: Seq,
        version: VersionSlot,
        text: String,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        let workflow_id = workflow_id.to_owned();
        self.submit(Work::Chunk {
            workflow_id,
            step,
            version,
            text,
        })
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

/// The column families a store on disk has; `None` if there is no store there yet.
fn existing_families(dir: &Path) -> Option<Vec<String>> {
    DB::list_cf(&Options::default(), dir).ok()
}

fn decode_at<T: Record>(table: Table, key: &str, bytes: &[u8]) -> Result<T, StoreError> {
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
        let sync = group.iter().any(|job| job.work.needs_sync());
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

impl Work {
    /// Whether the job is acknowledged only once synced.
    fn needs_sync(&self) -> bool {
        match self {
            Work::Transition(transition) => transition.durable,
            Work::Signal { .. } => true,
            Work::Stream { .. } | Work::Chunk { .. } => false,
        }
    }

    /// The workflow whose stream readers this job concerns: new events, or an end (readers
    /// finish).
    fn stream_change(&self) -> Option<String> {
        match self {
            Work::Transition(t) if !t.stream.is_empty() || t.record.status.is_terminal() => {
                Some(t.workflow_id.clone())
            }
            Work::Stream { workflow_id, items } if !items.is_empty() => Some(workflow_id.clone()),
            Work::Chunk { workflow_id, .. } => Some(workflow_id.clone()),
            Work::Stream { .. } => None,
            Work::Transition(_) | Work::Signal { .. } => None,
        }
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
        let mut seen = Overlay::default();
        for job in group {
            // Each job is staged on its own: a job refused halfway (a key that does not parse,
            // a number that would overflow) must leave nothing of itself in the batch.
            let mut view = View::new(db, &seen);
            let staged_work = match &job.work {
                Work::Transition(t) => stage(&mut view, t),
                Work::Stream { workflow_id, items } => stage_stream(&mut view, workflow_id, items),
                Work::Chunk {
                    workflow_id,
                    step,
                    version,
                    text,
                } => stage_chunk(&mut view, workflow_id, *step, version, text),
                Work::Signal {
                    workflow_id,
                    message,
                } => stage_signal(&mut view, workflow_id, message),
            };
            let result = staged_work.and_then(|()| view.writes.apply(db, &mut staged.batch));
            match result {
                Ok(()) => {
                    let JobView {
                        changes, claims, ..
                    } = view.finish();
                    seen.merge(changes);
                    for (slot, version) in claims {
                        slot.claim(version);
                    }
                    staged.stream_changed.extend(job.work.stream_change());
                    staged.accepted.push(job.ack);
                }
                Err(e) => staged.rejected.push((job.ack, e)),
            }
        }
        staged
    }
}

/// One write of a job, applied to the group's batch only once the whole job validated.
enum Write {
    Put(Table, Vec<u8>, Vec<u8>),
    Delete(Table, Vec<u8>),
    /// Every key in `[from, to)`.
    DeleteRange(Table, Vec<u8>, Vec<u8>),
}

#[derive(Default)]
struct Writes(Vec<Write>);

impl Writes {
    fn put(&mut self, table: Table, key: Vec<u8>, value: Vec<u8>) {
        self.0.push(Write::Put(table, key, value));
    }

    fn delete(&mut self, table: Table, key: Vec<u8>) {
        self.0.push(Write::Delete(table, key));
    }

    fn apply(&mut self, db: &DB, batch: &mut WriteBatch) -> Result<(), StoreError> {
        // Column families are looked up before anything is added, so a missing one refuses
        // the job whole.
        let writes = std::mem::take(&mut self.0);
        let mut resolved = Vec::with_capacity(writes.len());
        for write in writes {
            let table = match &write {
                Write::Put(table, ..) | Write::Delete(table, _) | Write::DeleteRange(table, ..) => {
                    *table
                }
            };
            resolved.push((cf(db, table)?, write));
        }
        for (family, write) in resolved {
            match write {
                Write::Put(_, key, value) => batch.put_cf(family, key, value),
                Write::Delete(_, key) => batch.delete_cf(family, key),
                Write::DeleteRange(_, from, to) => batch.delete_range_cf(family, from, to),
            }
        }
        Ok(())
    }
}

/// What the group has claimed so far, so two jobs in one batch are checked against each other
/// as well as against the store.
#[derive(Default)]
struct Overlay {
    journal_len: HashMap<String, u64>,
    requests: HashMap<String, String>,
    /// The last stream event number written or staged, per workflow.
    stream_last: HashMap<String, u64>,
    /// The last inbox arrival number written or staged, per workflow.
    inbox_last: HashMap<String, u64>,
    /// Signal ids staged in this group, per workflow.
    signals_seen: HashSet<(String, String)>,
    /// Workflows whose end is staged in this group.
    ended: HashSet<String>,
    /// Response versions of streamed steps, as staged.
    step_versions: HashMap<(String, Seq), StepVersions>,
}

impl Overlay {
    fn merge(&mut self, job: Overlay) {
        self.journal_len.extend(job.journal_len);
        self.requests.extend(job.requests);
        self.stream_last.extend(job.stream_last);
        self.inbox_last.extend(job.inbox_last);
        self.signals_seen.extend(job.signals_seen);
        self.ended.extend(job.ended);
        self.step_versions.extend(job.step_versions);
    }
}

/// One job's view while it is staged: the store, what the group staged before it, and its own
/// writes and changes, which join the group only if the job is accepted.
struct View<'a> {
    db: &'a DB,
    group: &'a Overlay,
    job: Overlay,
    writes: Writes,
    /// Response versions this job fixes, set once it is accepted.
    claims: Vec<(VersionSlot, u32)>,
}

/// What an accepted job leaves behind.
struct JobView {
    changes: Overlay,
    claims: Vec<(VersionSlot, u32)>,
}

impl<'a> View<'a> {
    fn new(db: &'a DB, group: &'a Overlay) -> Self {
        Self {
            db,
            group,
            job: Overlay::default(),
            writes: Writes::default(),
            claims: Vec::new(),
        }
    }

    fn finish(self) -> JobView {
        JobView {
            changes: self.job,
            claims: self.claims,
        }
    }

    fn journal_len(&self, workflow_id: &str) -> Result<u64, StoreError> {
        let staged = self.job.journal_len.get(workflow_id);
        match staged.or_else(|| self.group.journal_len.get(workflow_id)) {
            Some(len) => Ok(*len),
            None => Ok(stored_record(self.db, workflow_id)?.map_or(0, |r| r.journal_len)),
        }
    }

    fn has_ended(&self, workflow_id: &str) -> Result<bool, StoreError> {
        if self.job.ended.contains(workflow_id) || self.group.ended.contains(workflow_id) {
            return Ok(true);
        }
        let record = stored_record(self.db, workflow_id)?;
        Ok(record.is_some_and(|r| r.status.is_terminal()))
    }

    fn request_owner(&self, request_id: &str) -> Result<Option<String>, StoreError> {
        let staged = self.job.requests.get(request_id);
        if let Some(owner) = staged.or_else(|| self.group.requests.get(request_id)) {
            return Ok(Some(owner.clone()));
        }
        let bytes = self
            .db
            .get_cf(cf(self.db, Table::Requests)?, id_key(request_id))
            .map_err(backend)?;
        bytes
            .map(|b| decode_at::<String>(Table::Requests, request_id, &b))
            .transpose()
    }

    fn stream_last(&self, workflow_id: &str) -> Result<u64, StoreError> {
        let staged = self.job.stream_last.get(workflow_id);
        match staged.or_else(|| self.group.stream_last.get(workflow_id)) {
            Some(last) => Ok(*last),
            None => stored_stream_last(self.db, workflow_id),
        }
    }

    fn inbox_last(&self, workflow_id: &str) -> Result<u64, StoreError> {
        let staged = self.job.inbox_last.get(workflow_id);
        match staged.or_else(|| self.group.inbox_last.get(workflow_id)) {
            Some(last) => Ok(*last),
            None => stored_inbox_last(self.db, workflow_id),
        }
    }

    /// Whether the workflow may have undelivered signals: one staged in this group, or one
    /// stored.
    fn may_have_messages(&self, workflow_id: &str) -> Result<bool, StoreError> {
        if self.job.inbox_last.contains_key(workflow_id)
            || self.group.inbox_last.contains_key(workflow_id)
        {
            return Ok(true);
        }
        let prefix = inbox_messages_prefix(workflow_id);
        let mode = IteratorMode::From(&prefix, Direction::Forward);
        let first = self.db.iterator_cf(cf(self.db, Table::Inbox)?, mode).next();
        match first {
            Some(row) => Ok(row.map_err(backend)?.0.starts_with(&prefix)),
            None => Ok(false),
        }
    }

    fn signal_seen(&self, workflow_id: &str, signal_id: &str) -> Result<bool, StoreError> {
        let id = (workflow_id.to_owned(), signal_id.to_owned());
        if self.job.signals_seen.contains(&id) || self.group.signals_seen.contains(&id) {
            return Ok(true);
        }
        let key = inbox_seen_key(workflow_id, signal_id);
        let found = self.db.get_cf(cf(self.db, Table::Inbox)?, key);
        Ok(found.map_err(backend)?.is_some())
    }

    fn step_versions(&self, workflow_id: &str, step: Seq) -> Result<StepVersions, StoreError> {
        let id = (workflow_id.to_owned(), step);
        let staged = self.job.step_versions.get(&id);
        if let Some(versions) = staged.or_else(|| self.group.step_versions.get(&id)) {
            return Ok(versions.clone());
        }
        stored_step_versions(self.db, workflow_id, step)
    }
}

fn stage(view: &mut View<'_>, t: &Transition) -> Result<(), StoreError> {
    check_journal_len(view, t)?;
    if let Some(request_id) = &t.claim_request {
        check_request_free(view, t, request_id)?;
    }
    for (offset, entry) in t.append.iter().enumerate() {
        let index = t.expected_journal_len + offset as u64;
        let key = journal_key(&t.workflow_id, index);
        view.writes.put(Table::Journal, key, encode_record(entry));
    }
    let record = encode_record(&t.record);
    view.writes
        .put(Table::Workflows, id_key(&t.workflow_id), record);
    if let Some(request_id) = &t.claim_request {
        let owner = encode_record(&t.workflow_id);
        view.writes.put(Table::Requests, id_key(request_id), owner);
        let claim = (request_id.clone(), t.workflow_id.clone());
        view.job.requests.insert(claim.0, claim.1);
    }
    for timer in &t.add_timers {
        view.writes.put(Table::Timers, timer.encode(), Vec::new());
    }
    for timer in &t.remove_timers {
        view.writes.delete(Table::Timers, timer.encode());
    }
    for (key, record) in &t.operations {
        let key = key.as_bytes().to_vec();
        view.writes
            .put(Table::Operations, key, encode_record(record));
    }
    stage_stream(view, &t.workflow_id, &t.stream)?;
    stage_artifacts(view, &t.artifacts)?;
    for arrival in &t.consume_inbox {
        let key = inbox_message_key(&t.workflow_id, *arrival);
        view.writes.delete(Table::Inbox, key);
    }
    if t.record.status.is_terminal() {
        stage_end(view, &t.workflow_id)?;
    }
    view.job
        .journal_len
        .insert(t.workflow_id.clone(), t.record.journal_len);
    Ok(())
}

/// Artifacts are immutable: one that exists is not written again.
fn stage_artifacts(
    view: &mut View<'_>,
    artifacts: &[(Digest, ArtifactRecord)],
) -> Result<(), StoreError> {
    let family = cf(view.db, Table::Artifacts)?;
    for (hash, record) in artifacts {
        if view.db.get_cf(family, hash.0).map_err(backend)?.is_none() {
            view.writes
                .put(Table::Artifacts, hash.0.to_vec(), encode_record(record));
        }
    }
    Ok(())
}

/// The workflow ends: signals it never took can never be delivered, so they go with the end
/// (the ids seen stay, so a repeated send is still told it was a duplicate), and later ones
/// are refused.
fn stage_end(view: &mut View<'_>, workflow_id: &str) -> Result<(), StoreError> {
    // Most runs end with an empty inbox: a range tombstone each would slow every later read.
    if view.may_have_messages(workflow_id)? {
        let messages = inbox_messages_prefix(workflow_id);
        let mut after = messages.clone();
        if let Some(last) = after.last_mut() {
            *last += 1;
        }
        view.writes
            .0
            .push(Write::DeleteRange(Table::Inbox, messages, after));
    }
    view.job.ended.insert(workflow_id.to_owned());
    Ok(())
}

/// Numbers stream events after the workflow's last one. Numbering happens here, on the single
/// writer thread, so numbers follow write order and readers never see a gap fill in later.
fn stage_stream(
    view: &mut View<'_>,
    workflow_id: &str,
    items: &[StreamItem],
) -> Result<(), StoreError> {
    if items.is_empty() {
        return Ok(());
    }
    let mut last = view.stream_last(workflow_id)?;
    for item in items {
        last = last
            .checked_add(1)
            .ok_or_else(|| exhausted(Table::Streams, workflow_id))?;
        let key = stream_key(workflow_id, last);
        view.writes.put(Table::Streams, key, encode_record(item));
        track_versions(view, workflow_id, item)?;
    }
    view.job.stream_last.insert(workflow_id.to_owned(), last);
    Ok(())
}

/// Keeps the per-step index of response versions in step with a generation event, so that a
/// new attempt's version is one lookup away however long the stream is.
fn track_versions(
    view: &mut View<'_>,
    workflow_id: &str,
    item: &StreamItem,
) -> Result<(), StoreError> {
    if !item.is_generation() {
        return Ok(());
    }
    let step = item.step();
    let mut versions = view.step_versions(workflow_id, step)?;
    if !versions.track(item) {
        return Ok(());
    }
    let key = journal_key(workflow_id, u64::from(step));
    view.writes
        .put(Table::StreamSteps, key, encode_record(&versions));
    view.job
        .step_versions
        .insert((workflow_id.to_owned(), step), versions);
    Ok(())
}

/// A chunk of one attempt's generation. Its first chunk fixes the attempt's response version,
/// one above any the step had, and supersedes the step's versions still open (a crash cut
/// them off): decided here, in write order, so no reader or attempt ever reads the stream.
fn stage_chunk(
    view: &mut View<'_>,
    workflow_id: &str,
    step: Seq,
    slot: &VersionSlot,
    text: &str,
) -> Result<(), StoreError> {
    let mut items = Vec::new();
    let version = match slot.get() {
        Some(version) => version,
        None => {
            let versions = view.step_versions(workflow_id, step)?;
            for response_version in versions.open.iter().copied() {
                items.push(StreamItem::Superseded {
                    step,
                    response_version,
                    reason: "the attempt stopped before its result was journaled".into(),
                });
            }
            let version = versions
                .newest
                .checked_add(1)
                .ok_or_else(|| exhausted(Table::StreamSteps, workflow_id))?;
            view.claims.push((slot.clone(), version));
            version
        }
    };
    items.push(StreamItem::Chunk {
        step,
        response_version: version,
        text: text.to_owned(),
    });
    stage_stream(view, workflow_id, &items)
}

/// Numbers a signal after the workflow's last arrival and marks its id seen; a seen id (in the
/// store or earlier in this group) writes nothing, and neither does a workflow that ended.
fn stage_signal(
    view: &mut View<'_>,
    workflow_id: &str,
    message: &InboxMessage,
) -> Result<(), StoreError> {
    if view.has_ended(workflow_id)? {
        return Err(StoreError::Ended {
            workflow_id: workflow_id.to_owned(),
        });
    }
    if view.signal_seen(workflow_id, &message.signal_id)? {
        return Err(StoreError::Conflict {
            workflow_id: workflow_id.to_owned(),
            reason: format!("signal id `{}` was seen before", message.signal_id),
        });
    }
    let last = view.inbox_last(workflow_id)?;
    let arrival = last
        .checked_add(1)
        .ok_or_else(|| exhausted(Table::Inbox, workflow_id))?;
    let key = inbox_message_key(workflow_id, arrival);
    view.writes.put(Table::Inbox, key, encode_record(message));
    let seen = inbox_seen_key(workflow_id, &message.signal_id);
    view.writes.put(Table::Inbox, seen, Vec::new());
    let counter = inbox_counter_key(workflow_id);
    view.writes
        .put(Table::Inbox, counter, encode_record(&arrival));
    view.job.inbox_last.insert(workflow_id.to_owned(), arrival);
    let id = (workflow_id.to_owned(), message.signal_id.clone());
    view.job.signals_seen.insert(id);
    Ok(())
}

/// A per-workflow number at the end of its range: only a corrupt store (or an imported one
/// crafted so) gets here, and the job is refused instead of the writer panicking.
fn exhausted(table: Table, workflow_id: &str) -> StoreError {
    StoreError::Corrupt {
        table,
        key: workflow_id.to_owned(),
        source: DecodeError::Malformed("the per-workflow counter is at its maximum".into()),
    }
}

fn stored_record(db: &DB, workflow_id: &str) -> Result<Option<WorkflowRecord>, StoreError> {
    let bytes = db
        .get_cf(cf(db, Table::Workflows)?, id_key(workflow_id))
        .map_err(backend)?;
    bytes
        .map(|b| decode_at(Table::Workflows, workflow_id, &b))
        .transpose()
}

/// The newest arrival number of a workflow's inbox (0 before its first signal). Every inbox
/// with messages has its counter (see `layout`), so arrival numbers never repeat and a reader
/// can ask for the messages after the last one it saw.
fn stored_inbox_last(db: &DB, workflow_id: &str) -> Result<u64, StoreError> {
    let counter = inbox_counter_key(workflow_id);
    let bytes = db
        .get_cf(cf(db, Table::Inbox)?, &counter)
        .map_err(backend)?;
    let at = || format!("{workflow_id}#counter");
    bytes.map_or(Ok(0), |b| decode_at(Table::Inbox, &at(), &b))
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
        source: DecodeError::Malformed(e.to_string()),
    })
}

fn stored_step_versions(db: &DB, workflow_id: &str, step: Seq) -> Result<StepVersions, StoreError> {
    let key = journal_key(workflow_id, u64::from(step));
    let bytes = db
        .get_cf(cf(db, Table::StreamSteps)?, key)
        .map_err(backend)?;
    let at = || format!("{workflow_id}#{step}");
    bytes.map_or(Ok(StepVersions::default()), |b| {
        decode_at(Table::StreamSteps, &at(), &b)
    })
}

fn check_journal_len(view: &View<'_>, t: &Transition) -> Result<(), StoreError> {
    let current = view.journal_len(&t.workflow_id)?;
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

fn check_request_free(view: &View<'_>, t: &Transition, request_id: &str) -> Result<(), StoreError> {
    match view.request_owner(request_id)? {
        Some(owner) if owner != t.workflow_id => Err(StoreError::Conflict {
            workflow_id: t.workflow_id.clone(),
            reason: format!("request id `{request_id}` belongs to workflow `{owner}`"),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{Payload, WorkflowStarted};
    use crate::store::WorkflowStatus;

    fn inbox_memtable_entries(store: &RocksStore) -> u64 {
        let family = cf(&store.db, Table::Inbox).unwrap();
        let property = "rocksdb.num-entries-active-mem-table";
        store
            .db
            .property_int_value_cf(family, property)
            .unwrap()
            .unwrap()
    }

    /// An end with an empty inbox writes nothing there: a range tombstone per ended run would
    /// slow every later inbox read.
    #[tokio::test]
    async fn an_end_with_an_empty_inbox_leaves_no_tombstone() {
        let dir = tempfile::tempdir().unwrap();
        let store = RocksStore::open(dir.path()).unwrap();
        let started = Entry::WorkflowStarted(WorkflowStarted {
            workflow_name: "wf".into(),
            input: Payload::unit(),
            request_id: None,
            started_at_ms: 0,
        });
        let record = WorkflowRecord::new("wf", None, Digest::of(b"null"));
        store
            .commit(Transition::append("wf", &record, vec![started]))
            .await
            .unwrap();
        let mut current = record;
        current.journal_len = 1;
        let completed = Entry::WorkflowCompleted {
            output: Payload::unit(),
        };
        let mut end = Transition::append("wf", &current, vec![completed]);
        end.record.status = WorkflowStatus::Completed;
        store.commit(end).await.unwrap();
        assert_eq!(inbox_memtable_entries(&store), 0);
    }
}
