//! Durable state behind a narrow trait, so a networked backend can replace RocksDB without
//! touching the executor.
//!
//! Every change is a [`Transition`] of one workflow: journal appends, its record, its request id
//! and timers, applied atomically and acknowledged only once synced. Appends are conditional on
//! the journal length the writer expects (a fencing check: a second executor for the same
//! workflow, or a bug, fails instead of interleaving).

mod coded;
mod engine;
mod kv;
mod layout;
mod leases;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "rocksdb")]
mod rocks;
mod watchers;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

pub use coded::{CodecEngine, Rekeyed};
pub use engine::{Engine, Locks, Ownership, Reads, Row, RowVisitor, Stage, Write};
pub use kv::KvStore;
pub use leases::{LeaseStats, Leases, RelayFuture, Relayed, RelayedCommand, SignalTake, Wakeup};
pub use memory::{MemoryEngine, MemoryStore, WriteCounts};
#[cfg(feature = "postgres")]
pub use postgres::{PgEngine, PgOptions, PgStore};
#[cfg(feature = "rocksdb")]
pub use rocks::{RocksEngine, RocksStore};

use crate::artifacts::ArtifactRecord;
use crate::inbox::InboxMessage;
use crate::journal::{decode_exact, DecodeError, Digest, Entry, Record};
use crate::keys::TimerKey;
use crate::operations::OperationRecord;
use crate::streams::{ChunkWriter, StreamEvent, StreamItem};

/// Lifecycle of a workflow as recorded. Append-only (postcard).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum WorkflowStatus {
    /// Started and not finished: recovered on worker start.
    Running,
    /// Returned `Ok`.
    Completed,
    /// Returned `Err`.
    Failed,
    /// Running, but parked: an effect's outcome is unknown and only an operator can settle it.
    /// Recovered on worker start like a running one.
    AwaitingOperator,
    /// Not ended, but unable to go on: its code no longer matches its journal, the worker does
    /// not host it, or its journal does not add up. `WorkflowRecord::stop` says why. Recovered
    /// on worker start like a running one, so that it resumes once matching code is deployed.
    Stuck,
    /// Running, and waiting for a person's decision on an approval request.
    AwaitingApproval,
    /// Running, and waiting for a signal.
    AwaitingSignal,
}

impl WorkflowStatus {
    /// Every status, in the order a person reads them: the live ones, then the ends.
    pub const ALL: [WorkflowStatus; 7] = [
        WorkflowStatus::Running,
        WorkflowStatus::AwaitingApproval,
        WorkflowStatus::AwaitingSignal,
        WorkflowStatus::AwaitingOperator,
        WorkflowStatus::Stuck,
        WorkflowStatus::Failed,
        WorkflowStatus::Completed,
    ];

    /// Whether nothing more will happen to this workflow.
    pub fn is_terminal(self) -> bool {
        matches!(self, WorkflowStatus::Completed | WorkflowStatus::Failed)
    }

    /// Its name in listings, metrics and the API.
    pub fn name(self) -> &'static str {
        match self {
            WorkflowStatus::Running => "running",
            WorkflowStatus::Completed => "completed",
            WorkflowStatus::Failed => "failed",
            WorkflowStatus::AwaitingOperator => "awaiting_operator",
            WorkflowStatus::Stuck => "stuck",
            WorkflowStatus::AwaitingApproval => "awaiting_approval",
            WorkflowStatus::AwaitingSignal => "awaiting_signal",
        }
    }
}

/// The `workflows` record: status and pointers, kept in step with the journal.
///
/// Format 2 (this build) added `stop`; a format 1 record reads as one without it. postcard
/// cannot tell where a struct ends, so a field is never appended in place: a new layout is a
/// new format number, with the old layout kept to read old records (see [`Record`]).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct WorkflowRecord {
    /// Registered workflow name, shared: every transition carries a copy of the record.
    pub workflow_name: Arc<str>,
    /// Lifecycle.
    pub status: WorkflowStatus,
    /// Caller's deduplication key.
    pub request_id: Option<String>,
    /// Digest of the start input: a second start with the same request id must match it.
    pub input_digest: Digest,
    /// Number of journal entries: the index the next append must use.
    pub journal_len: u64,
    /// Why the run is stuck (status `Stuck`); `None` otherwise.
    pub stop: Option<RunStop>,
}

/// The format 1 layout of [`WorkflowRecord`], read and upgraded.
#[derive(Deserialize)]
struct WorkflowRecordV1 {
    workflow_name: String,
    status: WorkflowStatus,
    request_id: Option<String>,
    input_digest: Digest,
    journal_len: u64,
}

impl Record for WorkflowRecord {
    const FORMAT: u8 = 2;

    fn decode_older(format: u8, body: &[u8]) -> Result<Self, DecodeError> {
        match format {
            1 => {
                let v1: WorkflowRecordV1 = decode_exact(body)?;
                Ok(WorkflowRecord {
                    workflow_name: v1.workflow_name.into(),
                    status: v1.status,
                    request_id: v1.request_id,
                    input_digest: v1.input_digest,
                    journal_len: v1.journal_len,
                    stop: None,
                })
            }
            other => Err(DecodeError::UnknownVersion(other)),
        }
    }
}

impl WorkflowRecord {
    /// A new running workflow's record, before its first entry.
    pub fn new(workflow_name: &str, request_id: Option<String>, input_digest: Digest) -> Self {
        Self {
            workflow_name: workflow_name.into(),
            status: WorkflowStatus::Running,
            request_id,
            input_digest,
            journal_len: 0,
            stop: None,
        }
    }

    /// Whether `other` says what this record says but, perhaps, its journal length.
    pub(crate) fn same_but_journal_len(&self, other: &WorkflowRecord) -> bool {
        // Destructured, so that a field added later is compared here or left out on purpose.
        let WorkflowRecord {
            workflow_name,
            status,
            request_id,
            input_digest,
            journal_len: _,
            stop,
        } = self;
        *workflow_name == other.workflow_name
            && *status == other.status
            && *request_id == other.request_id
            && *input_digest == other.input_digest
            && *stop == other.stop
    }
}

/// Why a run is stuck, as recorded: durable, so that listings, the API and a restarted worker
/// show it. Append-only (postcard).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct RunStop {
    /// What kind of stop.
    pub code: StopCode,
    /// The command it concerns, when there is one.
    pub seq: Option<u32>,
    /// The whole error.
    pub message: String,
    /// When the worker found it (worker clock).
    pub at_ms: u64,
}

/// Why a run cannot go on. Append-only (postcard).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum StopCode {
    /// The code issued another command than the journal recorded.
    NonDeterminism,
    /// The worker does not host the workflow.
    UnknownWorkflow,
    /// The workflow called an activity the worker does not host.
    UnknownActivity,
    /// A record of the workflow does not decode.
    CorruptRecord,
    /// The journal does not add up (an outcome of the wrong kind, a number out of range).
    InconsistentJournal,
    /// A recorded value no longer decodes into the type the code expects.
    PayloadMismatch,
    /// An effect's key arguments do not serialize.
    IdempotencyKey,
    /// The workflow code (or the executor) panicked.
    Panicked,
    /// The executor broke one of its own rules (a bug in Waymark).
    Internal,
    /// The workflow code used the API in a way that cannot be made safe (an effect put under
    /// an approval after it may have started).
    Misuse,
}

impl StopCode {
    /// Its name in listings and the API.
    pub fn name(self) -> &'static str {
        match self {
            StopCode::NonDeterminism => "non_determinism",
            StopCode::UnknownWorkflow => "unknown_workflow",
            StopCode::UnknownActivity => "unknown_activity",
            StopCode::CorruptRecord => "corrupt_record",
            StopCode::InconsistentJournal => "inconsistent_journal",
            StopCode::PayloadMismatch => "payload_mismatch",
            StopCode::IdempotencyKey => "idempotency_key",
            StopCode::Misuse => "misuse",
            StopCode::Panicked => "panicked",
            StopCode::Internal => "internal",
        }
    }
}

impl std::fmt::Display for StopCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One atomic, durable change to one workflow.
#[derive(Debug, Clone)]
pub struct Transition {
    /// The workflow changed, shared with its executor: a step copies no id for its write.
    pub workflow_id: Arc<str>,
    /// Journal length this change was computed against; the append fails if it differs.
    pub expected_journal_len: u64,
    /// Entries appended from index `expected_journal_len` on (from `rewind_to`, when set).
    pub append: Vec<Entry>,
    /// A reset: the entries from this index on are deleted, and `append` is written from it
    /// (the run that wrote them is kept elsewhere first).
    pub rewind_to: Option<u64>,
    /// The record after the change (its `journal_len` counts the appended entries).
    pub record: WorkflowRecord,
    /// Claims `request_id → workflow_id`; fails if another workflow holds it.
    pub claim_request: Option<String>,
    /// Timers to add.
    pub add_timers: Vec<TimerKey>,
    /// Timers to delete (fired).
    pub remove_timers: Vec<TimerKey>,
    /// Operation log records to write, by idempotency key.
    pub operations: Vec<(String, OperationRecord)>,
    /// Stream events to append (numbered by the store, after the workflow's earlier ones).
    pub stream: Vec<StreamItem>,
    /// Inbox messages taken, by arrival number and name: deleted, with their rows in the
    /// inbox's index by name, in the write of the entries that deliver them.
    pub consume_inbox: Vec<(u64, String)>,
    /// Signals put back in the inbox, ahead of those waiting there, in this order: the ones the
    /// entries a rewind replaces had delivered (their ids stay seen).
    pub redeliver: Vec<InboxMessage>,
    /// Artifacts committed, by hash (written only if absent: artifacts never change).
    pub artifacts: Vec<(Digest, ArtifactRecord)>,
    /// When the workflow ended (the worker's clock), for a transition whose record is
    /// terminal: retention counts from it.
    pub ended_at_ms: u64,
    /// Acknowledge only once synced. `false` for what may be lost in a crash at no cost (a
    /// read activity's schedule entry: the code issues it again on replay); it becomes durable
    /// with the next synced write, since the write-ahead log keeps order.
    pub durable: bool,
    /// Deletes the workflow's parked mark ([`Table::Parked`]), so that a worker starting on
    /// the store rebuilds it: whatever is written for a workflow may be what it must resume
    /// for. `true` unless the writer knows that no mark is left: the executor, whose run
    /// deletes the mark with its first write.
    pub unpark: bool,
}

impl Transition {
    /// A change appending `entries` to a workflow whose record is `record` before the change.
    pub fn append(
        workflow_id: impl Into<Arc<str>>,
        record: &WorkflowRecord,
        entries: Vec<Entry>,
    ) -> Self {
        let mut next = record.clone();
        next.journal_len += entries.len() as u64;
        Self {
            workflow_id: workflow_id.into(),
            expected_journal_len: record.journal_len,
            append: entries,
            rewind_to: None,
            record: next,
            claim_request: None,
            add_timers: Vec::new(),
            remove_timers: Vec::new(),
            operations: Vec::new(),
            stream: Vec::new(),
            consume_inbox: Vec::new(),
            redeliver: Vec::new(),
            artifacts: Vec::new(),
            ended_at_ms: 0,
            durable: true,
            unpark: true,
        }
    }
}

impl Transition {
    /// This change and then `next`, computed against this one's record, as one write.
    /// `self` may only append entries and change the record (a held-back schedule): `next`'s
    /// other changes then keep their meaning.
    pub(crate) fn followed_by(self, next: Transition) -> Transition {
        debug_assert!(self.appends_only() && next.rewind_to.is_none());
        debug_assert_eq!(next.expected_journal_len, self.record.journal_len);
        let mut append = self.append;
        append.extend(next.append);
        Transition {
            expected_journal_len: self.expected_journal_len,
            append,
            durable: self.durable || next.durable,
            unpark: self.unpark || next.unpark,
            ..next
        }
    }

    /// Whether the change only appends entries and changes the record.
    pub(crate) fn appends_only(&self) -> bool {
        self.rewind_to.is_none()
            && self.claim_request.is_none()
            && self.add_timers.is_empty()
            && self.remove_timers.is_empty()
            && self.operations.is_empty()
            && self.stream.is_empty()
            && self.consume_inbox.is_empty()
            && self.redeliver.is_empty()
            && self.artifacts.is_empty()
            && self.ended_at_ms == 0
    }

    /// A change that replaces the entries of the workflow (whose record is `record`) from
    /// index `to` on with `entries`: a reset of its run to that point.
    pub fn rewind(
        workflow_id: &str,
        record: &WorkflowRecord,
        to: u64,
        entries: Vec<Entry>,
    ) -> Self {
        let mut transition = Self::append(workflow_id, record, entries);
        transition.record.journal_len = to + transition.append.len() as u64;
        transition.rewind_to = Some(to);
        transition
    }

    /// Writes an exported journal as a new workflow `workflow_id` (`waymark import`): the
    /// record is derived from the entries (name, request id and input from `WorkflowStarted`,
    /// the status from the last entry). Refused if the id exists or the request id is taken.
    /// An ended journal counts as ended at `imported_at_ms`, for retention.
    pub fn import(
        workflow_id: &str,
        entries: Vec<Entry>,
        imported_at_ms: u64,
    ) -> Result<Self, StoreError> {
        if workflow_id.is_empty() || workflow_id.len() > crate::keys::MAX_ID_LEN {
            return Err(StoreError::BadId {
                what: "workflow id",
                len: workflow_id.len(),
            });
        }
        let Some(Entry::WorkflowStarted(started)) = entries.first() else {
            return Err(StoreError::Corrupt {
                table: Table::Journal,
                key: format!("{workflow_id}#0"),
                source: DecodeError::Malformed("a journal begins with workflow_started".into()),
            });
        };
        let status = match entries.last() {
            Some(Entry::WorkflowCompleted { .. }) => WorkflowStatus::Completed,
            Some(Entry::WorkflowFailed { .. }) => WorkflowStatus::Failed,
            _ => WorkflowStatus::Running,
        };
        let mut empty = WorkflowRecord::new(
            &started.workflow_name,
            started.request_id.clone(),
            started.input.digest(),
        );
        empty.status = status;
        let claim = started.request_id.clone();
        let mut transition = Transition::append(workflow_id, &empty, entries);
        transition.claim_request = claim;
        transition.ended_at_ms = imported_at_ms;
        Ok(transition)
    }
}

/// What a run leaving memory waits for, as [`Store::mark_parked`] checks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parking {
    /// The last inbox arrival the run read.
    pub inbox_read_up_to: u64,
    /// The digest of the workflow code the run parked under (`Workflow::CODE_DIGEST`).
    pub code_digest: u64,
    /// The timers that wake it: each must have its row.
    pub timers: Vec<TimerKey>,
    /// The signal names its waits listen for: a signal of another name leaves it parked.
    pub listening: Vec<String>,
}

/// A parked workflow's mark ([`Store::mark_parked`]): the code it parked under, and which
/// signals wake it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParkedMark {
    /// The digest of the workflow code the run parked under (`Workflow::CODE_DIGEST`).
    pub code_digest: u64,
    /// The signal names its waits listened for. `None` for a mark of format 1, written before
    /// marks kept them: any signal wakes it.
    pub listening: Option<Vec<String>>,
}

impl ParkedMark {
    /// Whether a signal named `name` wakes the workflow: a signal of a name none of its waits
    /// listens for is kept in its inbox for later, and rebuilding the run would only find it
    /// waiting again.
    pub fn wakes_for(&self, name: &str) -> bool {
        self.listening
            .as_ref()
            .is_none_or(|names| names.iter().any(|listened| listened == name))
    }
}

impl Record for ParkedMark {
    const FORMAT: u8 = 2;

    fn decode_older(format: u8, body: &[u8]) -> Result<Self, DecodeError> {
        match format {
            1 => Ok(ParkedMark {
                code_digest: decode_exact(body)?,
                listening: None,
            }),
            other => Err(DecodeError::UnknownVersion(other)),
        }
    }
}

/// A table of the store: one kind of record, named in errors.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Table {
    /// Status and pointers.
    Workflows,
    /// Journal entries.
    Journal,
    /// Due timers.
    Timers,
    /// Request id → workflow id.
    Requests,
    /// The operation log, by idempotency key.
    Operations,
    /// Workflows' durable streams.
    Streams,
    /// Signals not yet delivered, and the ids seen.
    Inbox,
    /// Immutable artifacts by hash.
    Artifacts,
    /// Per streamed step, its response versions (an index of `Streams`).
    StreamSteps,
    /// The store's own rows: its layout version.
    Meta,
    /// Per workflow and reader channel, the last stream event acknowledged.
    StreamAcks,
    /// Per artifact, the workflows that committed it: an artifact is deleted with the last.
    ArtifactRefs,
    /// Ended workflows by the time they ended, for retention.
    Ended,
    /// Long strings of a workflow's journaled payloads, once each, by their SHA-256.
    Blobs,
    /// Workflows that left memory waiting only for what comes from outside (a signal, a
    /// person's decision, a due timer): a worker starting on the store leaves them out of
    /// memory until it comes. On a store one process owns; see [`Store::mark_parked`].
    Parked,
    /// The operations whose outcome is unsettled ([`OperationStatus::is_unsettled`]), by
    /// idempotency key, each row empty: what the reconciliation sweep and the listing of
    /// decisions awaited read, where they read every operation row before layout 10.
    ///
    /// [`OperationStatus::is_unsettled`]: crate::operations::OperationStatus::is_unsettled
    Unsettled,
}

impl Table {
    /// Every table, in the order of [`Table::index`].
    pub const ALL: [Table; 16] = [
        Table::Workflows,
        Table::Journal,
        Table::Timers,
        Table::Requests,
        Table::Operations,
        Table::Streams,
        Table::Inbox,
        Table::Artifacts,
        Table::StreamSteps,
        Table::Meta,
        Table::StreamAcks,
        Table::ArtifactRefs,
        Table::Ended,
        Table::Blobs,
        Table::Parked,
        Table::Unsettled,
    ];

    /// Its position in [`Table::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// Its name: in errors, in what a sealed value is authenticated with, and as its RocksDB
    /// column family (every table's before layout 5, the journal's and meta's since): on disk,
    /// never changed.
    pub fn name(self) -> &'static str {
        match self {
            Table::Workflows => "workflows",
            Table::Journal => "journal",
            Table::Timers => "timers",
            Table::Requests => "requests",
            Table::Operations => "operations",
            Table::Streams => "streams",
            Table::Inbox => "inbox",
            Table::Artifacts => "artifacts",
            Table::StreamSteps => "stream_steps",
            Table::Meta => "meta",
            Table::StreamAcks => "stream_acks",
            Table::ArtifactRefs => "artifact_refs",
            Table::Ended => "ended",
            Table::Blobs => "blobs",
            Table::Parked => "parked",
            Table::Unsettled => "unsettled",
        }
    }
}

/// A write's answer, to be awaited: known at once when the write was made on the caller's
/// thread, else the writer thread's to come (over the channel the job carries). Awaiting it
/// allocates nothing more: a boxed future for each answer cost every step an allocation and a
/// free.
#[must_use = "the write's answer says whether it was made"]
pub struct PendingWrite(Pending);

enum Pending {
    Known(Option<Result<(), StoreError>>),
    Writer(tokio::sync::oneshot::Receiver<Result<(), StoreError>>),
    Later(BoxFuture<'static, Result<(), StoreError>>),
}

impl PendingWrite {
    /// An answer already known.
    pub fn known(answer: Result<(), StoreError>) -> Self {
        Self(Pending::Known(Some(answer)))
    }

    /// The answer `writer` will send; a writer gone without answering means the store closed.
    pub(crate) fn from_writer(
        writer: tokio::sync::oneshot::Receiver<Result<(), StoreError>>,
    ) -> Self {
        Self(Pending::Writer(writer))
    }

    /// The answer `later` resolves to: for a store that wraps another.
    pub fn later(later: impl Future<Output = Result<(), StoreError>> + Send + 'static) -> Self {
        Self(Pending::Later(Box::pin(later)))
    }
}

impl Future for PendingWrite {
    type Output = Result<(), StoreError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.0 {
            Pending::Known(answer) => {
                Poll::Ready(answer.take().expect("a write's answer is awaited once"))
            }
            Pending::Writer(writer) => Pin::new(writer)
                .poll(cx)
                .map(|answer| answer.unwrap_or(Err(StoreError::Closed))),
            Pending::Later(later) => later.as_mut().poll(cx),
        }
    }
}

/// What can go wrong in the store.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// A record that cannot be decoded; names where it is so an operator can find it.
    #[error("corrupt record in `{}` at key {key}: {source}", table.name())]
    Corrupt {
        /// Where.
        table: Table,
        /// The key, readable.
        key: String,
        /// What is wrong with it.
        source: DecodeError,
    },
    /// A conditional write found a different state (journal length or request id owner).
    #[error("conflicting write to workflow `{workflow_id}`: {reason}")]
    Conflict {
        /// The workflow.
        workflow_id: String,
        /// What differed.
        reason: String,
    },
    /// A value the store's codec could not seal or open (a key not given, a forged value).
    #[error("{} in `{}`{}: {source}", if key.is_some() { "row" } else { "a write" }, table.name(), key.as_ref().map(|k| format!(" at key {k}")).unwrap_or_default())]
    Codec {
        /// Where.
        table: Table,
        /// The key, readable; `None` for a value being written.
        key: Option<String>,
        /// Why.
        source: crate::codec::CodecError,
    },
    /// The store's values are sealed and it was opened without a codec.
    #[error(
        "the store is encrypted at rest and no keys were given: set WAYMARK_ENCRYPTION_KEYS or \
         WAYMARK_ENCRYPTION_KEYS_FILE (in code, WorkerBuilder::encryption)"
    )]
    KeysRequired,
    /// The storage engine (RocksDB, PostgreSQL) reported an error.
    #[error("storage error: {0}")]
    Backend(String),
    /// This worker does not hold the workflow's lease (another worker took it over, or its own
    /// registration lapsed): nothing was written, and the run must stop here.
    #[error("worker `{worker_id}` no longer owns workflow `{workflow_id}`: {reason}")]
    Fenced {
        /// The workflow (empty when the worker's registration as a whole lapsed).
        workflow_id: String,
        /// The worker refused.
        worker_id: String,
        /// What the lease showed.
        reason: String,
    },
    /// An earlier write failed; nothing more is written until the process restarts, because the
    /// state on disk is no longer known.
    #[error("store is poisoned by an earlier failed write: {0}")]
    Poisoned(String),
    /// The store was shut down.
    #[error("store is closed")]
    Closed,
    /// The workflow ended before this write: nothing was written.
    #[error("workflow `{workflow_id}` has ended")]
    Ended {
        /// The workflow.
        workflow_id: String,
    },
    /// The store on disk was written by a newer build, in a layout this one does not know.
    #[error(
        "store written by a newer Waymark (layout {found}, this build reads up to {supported})"
    )]
    NewerLayout {
        /// The store's layout.
        found: u32,
        /// The newest layout this build reads.
        supported: u32,
    },
    /// No workflow has this id.
    #[error("no workflow `{workflow_id}`")]
    NotFound {
        /// The id asked for.
        workflow_id: String,
    },
    /// Only an ended workflow can be deleted.
    #[error("workflow `{workflow_id}` has not ended (it is {status}): only an ended workflow can be deleted")]
    NotEnded {
        /// The workflow.
        workflow_id: String,
        /// Its status's name.
        status: &'static str,
    },
    /// The ended workflow holds operations whose outcome nobody has settled: deleting them
    /// would lose the only record that the call may have taken effect.
    #[error("{}", unsettled_text(workflow_id, keys))]
    Unsettled {
        /// The workflow.
        workflow_id: String,
        /// The idempotency keys of the unsettled operations, in key order.
        keys: Vec<String>,
    },
    /// An id is empty or longer than the limit.
    #[error("{what} must be 1..={} bytes, got {len}", crate::keys::MAX_ID_LEN)]
    BadId {
        /// Which id.
        what: &'static str,
        /// Its length.
        len: usize,
    },
}

/// Why an ended workflow holding the operations `keys`, unsettled, is not deleted.
pub(crate) fn unsettled_text(workflow_id: &str, keys: &[String]) -> String {
    format!(
        "workflow `{workflow_id}` holds operations nobody has settled ({}): decide each one \
         (committed, not found or failed) before deleting the workflow",
        keys.join(", ")
    )
}

impl StoreError {
    /// A key of `table` that does not parse: the store is corrupt there, named by the key's
    /// bytes.
    pub(crate) fn malformed_key(table: Table, key: &[u8], error: &impl std::fmt::Display) -> Self {
        StoreError::Corrupt {
            table,
            key: format!("{key:02x?}"),
            source: DecodeError::Malformed(error.to_string()),
        }
    }
}

thread_local! {
    static OFF_ASYNC_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `read` as a read made off the async threads: the worker runs every store read of its
/// own on the blocking pool, inside this, since the store's reads block on disk.
pub fn off_async_thread<T>(read: impl FnOnce() -> T) -> T {
    let before = OFF_ASYNC_THREAD.with(|flag| flag.replace(true));
    let value = read();
    OFF_ASYNC_THREAD.with(|flag| flag.set(before));
    value
}

/// Whether the calling thread is inside [`off_async_thread`]: what a test's store checks to
/// prove that no read of the worker's blocks an async thread.
#[doc(hidden)]
pub fn is_off_async_thread() -> bool {
    OFF_ASYNC_THREAD.with(std::cell::Cell::get)
}

/// How a store's writer has grouped commits so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WriteStats {
    /// Batches written.
    pub batches: u64,
    /// Transitions they carried (accepted ones).
    pub transitions: u64,
}

/// Every workflow id with its record or the error decoding it.
pub type WorkflowListing = Vec<(String, Result<WorkflowRecord, StoreError>)>;

/// What a workflow's record says but its journal length: what a listing reads without reading
/// every journal (on a store one process owns, a workflow's length is its journal's).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct WorkflowSummary {
    /// Registered workflow name.
    pub workflow_name: String,
    /// Lifecycle.
    pub status: WorkflowStatus,
    /// Caller's deduplication key.
    pub request_id: Option<String>,
    /// Why the run is stuck (status `Stuck`); `None` otherwise.
    pub stop: Option<RunStop>,
}

impl From<WorkflowRecord> for WorkflowSummary {
    fn from(record: WorkflowRecord) -> Self {
        Self {
            workflow_name: record.workflow_name.to_string(),
            status: record.status,
            request_id: record.request_id,
            stop: record.stop,
        }
    }
}

/// Every workflow id with its summary or the error decoding its record.
pub type SummaryListing = Vec<(String, Result<WorkflowSummary, StoreError>)>;

/// Operations by idempotency key, each with its record or the error decoding it.
pub type OperationListing = Vec<(String, Result<OperationRecord, StoreError>)>;

/// What loading a workflow for replay reads: a store's own reads ([`StoreReads`]), or a burst
/// of them ([`Store::read_burst`]). Each method reads as the [`Store`] method of its name.
pub trait ReplayReads {
    /// [`Store::workflow`].
    fn workflow(&self, workflow_id: &str) -> Result<Option<WorkflowRecord>, StoreError>;
    /// [`Store::journal`].
    fn journal(&self, workflow_id: &str) -> Result<Vec<Entry>, StoreError>;
    /// [`Store::artifact`].
    fn artifact(
        &self,
        namespace: &str,
        hash: &Digest,
    ) -> Result<Option<ArtifactRecord>, StoreError>;
    /// [`Store::inbox_last`].
    fn inbox_last(&self, workflow_id: &str) -> Result<u64, StoreError>;
    /// [`Store::stream_last`].
    fn stream_last(&self, workflow_id: &str) -> Result<u64, StoreError>;
}

/// A store's own reads, one at a time.
pub struct StoreReads<'a>(pub &'a dyn Store);

impl ReplayReads for StoreReads<'_> {
    fn workflow(&self, workflow_id: &str) -> Result<Option<WorkflowRecord>, StoreError> {
        self.0.workflow(workflow_id)
    }
    fn journal(&self, workflow_id: &str) -> Result<Vec<Entry>, StoreError> {
        self.0.journal(workflow_id)
    }
    fn artifact(
        &self,
        namespace: &str,
        hash: &Digest,
    ) -> Result<Option<ArtifactRecord>, StoreError> {
        self.0.artifact(namespace, hash)
    }
    fn inbox_last(&self, workflow_id: &str) -> Result<u64, StoreError> {
        self.0.inbox_last(workflow_id)
    }
    fn stream_last(&self, workflow_id: &str) -> Result<u64, StoreError> {
        self.0.stream_last(workflow_id)
    }
}

/// The narrow interface the executor and the worker use. Streamed chunks go through its
/// [`ChunkWriter`] side.
pub trait Store: ChunkWriter + Send + Sync + 'static {
    /// A workflow's record, if it exists.
    fn workflow(&self, workflow_id: &str) -> Result<Option<WorkflowRecord>, StoreError>;
    /// Every workflow id with its record, or the error decoding it (one corrupt record does not
    /// hide the others).
    fn workflows(&self) -> Result<WorkflowListing, StoreError>;
    /// What [`Store::workflows`] lists, but the journal lengths: a listing that reads no
    /// journal, for what needs only names and statuses (recovery, the reconciliation sweep).
    fn workflow_summaries(&self) -> Result<SummaryListing, StoreError> {
        let listed = self.workflows()?.into_iter();
        Ok(listed.map(|(id, r)| (id, r.map(Into::into))).collect())
    }
    /// A workflow's whole journal, in order.
    fn journal(&self, workflow_id: &str) -> Result<Vec<Entry>, StoreError>;
    /// Up to `limit` entries of a workflow's journal from index `from` on, in order: a page of
    /// a long one, read without the rest.
    fn journal_page(
        &self,
        workflow_id: &str,
        from: u64,
        limit: usize,
    ) -> Result<Vec<Entry>, StoreError> {
        let journal = self.journal(workflow_id)?;
        let from = usize::try_from(from)
            .unwrap_or(usize::MAX)
            .min(journal.len());
        Ok(journal.into_iter().skip(from).take(limit).collect())
    }
    /// The workflow that claimed `request_id`.
    fn request(&self, request_id: &str) -> Result<Option<String>, StoreError>;
    /// Every pending timer, in due order.
    fn timers(&self) -> Result<Vec<TimerKey>, StoreError>;
    /// The operation with idempotency key `key`.
    fn operation(&self, key: &str) -> Result<Option<OperationRecord>, StoreError>;
    /// [`Store::operation`], if the store can answer from memory without waiting on a disk or
    /// a network, so that an async thread may ask; `None`: read it off the async threads.
    fn operation_in_memory(
        &self,
        key: &str,
    ) -> Option<Result<Option<OperationRecord>, StoreError>> {
        let _ = key;
        None
    }
    /// Runs `read` over reads made one after the other on this thread that share what the
    /// engine can share between them ([`Engine::burst_reads`]): the loads of the workflows that
    /// start together. Every read sees the store as it was when `read` began. `false`, with
    /// `read` not run, if the store has nothing to share: then read with [`StoreReads`].
    fn read_burst(&self, read: &mut dyn FnMut(&dyn ReplayReads)) -> bool {
        let _ = read;
        false
    }
    /// Operations whose key starts with `prefix` (all of them for `""`), in key order.
    fn operations(&self, prefix: &str) -> Result<OperationListing, StoreError>;
    /// The operations of [`Store::operations`] indexed as unsettled ([`Table::Unsettled`])
    /// whose record still is, or does not decode, in key order: as many rows read as there
    /// are such operations, however many settled ones the store holds. (A store opened to
    /// read only, of a layout before 10, has no index: every row is read and filtered.)
    fn unsettled_operations(&self, prefix: &str) -> Result<OperationListing, StoreError>;
    /// The artifact with this hash in `namespace` (see [`crate::namespace`]).
    fn artifact(
        &self,
        namespace: &str,
        hash: &Digest,
    ) -> Result<Option<ArtifactRecord>, StoreError>;
    /// A workflow's undelivered signals that arrived after arrival number `after` (0: all of
    /// them), with their arrival numbers, oldest first. Arrival numbers never repeat.
    fn inbox(&self, workflow_id: &str, after: u64) -> Result<Vec<(u64, InboxMessage)>, StoreError>;
    /// A workflow's undelivered signals named `name`, with their arrival numbers, oldest
    /// first: what a run waiting for `name` can be handed, read without the signals of other
    /// names. This default reads the whole inbox.
    fn inbox_named(
        &self,
        workflow_id: &str,
        name: &str,
    ) -> Result<Vec<(u64, InboxMessage)>, StoreError> {
        let mut messages = self.inbox(workflow_id, 0)?;
        messages.retain(|(_, message)| message.name == name);
        Ok(messages)
    }
    /// Whether an undelivered signal named one of `names` waits in the workflow's inbox:
    /// whether a run whose waits listen for `names` has one to take. This default reads the
    /// whole inbox.
    fn inbox_holds_named(&self, workflow_id: &str, names: &[String]) -> Result<bool, StoreError> {
        let messages = self.inbox(workflow_id, 0)?;
        Ok(messages
            .iter()
            .any(|(_, message)| names.contains(&message.name)))
    }
    /// The last arrival number given to a signal of the workflow (0: none yet), delivered or
    /// not.
    fn inbox_last(&self, workflow_id: &str) -> Result<u64, StoreError>;
    /// Whether a signal with this id reached the workflow before.
    fn signal_seen(&self, workflow_id: &str, signal_id: &str) -> Result<bool, StoreError>;
    /// Keeps a signal in the inbox (synced), unless its id was seen before: then nothing is
    /// written and the answer is `StoreError::Conflict`, so that of two senders racing with
    /// one id exactly one hears that its signal was kept. A signal kept deletes the
    /// workflow's parked mark ([`Store::mark_parked`]), unless the mark says that no wait of
    /// the run listens for its name ([`ParkedMark::wakes_for`]).
    fn send_signal(&self, workflow_id: &str, message: InboxMessage) -> PendingWrite;
    /// Marks the workflow parked: its run left memory waiting only for what comes from
    /// outside (a signal, a person's decision, a due timer: each wakes it when it comes). A
    /// worker starting on the store with the code the run parked under leaves a parked
    /// workflow out of memory instead of rebuilding it ([`Store::parked`]). Nothing is written
    /// if the workflow ended, if a signal arrived that the run has not read, or if a timer it
    /// waits for has no row (a run forked or reset inside a sleep arms it in memory only):
    /// then only a rebuild on start would wake it. The mark goes with the next write for the
    /// workflow (see [`Transition::unpark`]) and with its next signal of a name it listens
    /// for (see [`Store::send_signal`]). Not synced: a mark a
    /// crash loses costs a rebuild on start. This default keeps no marks: every workflow is
    /// rebuilt on start.
    fn mark_parked(&self, workflow_id: &str, parking: Parking) -> PendingWrite {
        let _ = (workflow_id, parking);
        PendingWrite::known(Ok(()))
    }
    /// The workflows marked parked ([`Store::mark_parked`]), with the code digest each parked
    /// under. A mark that does not read is left out: its workflow is rebuilt on start.
    fn parked(&self) -> Result<std::collections::HashMap<String, u64>, StoreError> {
        Ok(std::collections::HashMap::new())
    }
    /// The workflow's parked mark, if it has one ([`Store::mark_parked`]). This default keeps
    /// no marks.
    fn parked_mark(&self, workflow_id: &str) -> Result<Option<ParkedMark>, StoreError> {
        let _ = workflow_id;
        Ok(None)
    }
    /// [`Store::parked_mark`], if the store can answer from memory without waiting on a disk
    /// or a network, so that an async thread may ask; `None`: read it off the async threads.
    fn parked_mark_in_memory(
        &self,
        workflow_id: &str,
    ) -> Option<Result<Option<ParkedMark>, StoreError>> {
        let _ = workflow_id;
        None
    }
    /// A workflow's stream events numbered above `after`, in order.
    fn stream(&self, workflow_id: &str, after: u64) -> Result<Vec<StreamEvent>, StoreError>;
    /// At most `limit` of a workflow's stream events numbered above `after`, in order: a
    /// reader of a long stream holds a page at a time. (This default reads them all first; the
    /// stores of this crate read only the page.)
    fn stream_page(
        &self,
        workflow_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<StreamEvent>, StoreError> {
        let mut events = self.stream(workflow_id, after)?;
        events.truncate(limit);
        Ok(events)
    }
    /// The number of a workflow's newest stream event (0 for none): where a reader that only
    /// needs what comes next starts.
    fn stream_last(&self, workflow_id: &str) -> Result<u64, StoreError> {
        let events = self.stream(workflow_id, 0)?;
        Ok(events.last().map_or(0, |event| event.seq))
    }
    /// Per reader channel, the last of `workflow_id`'s stream events a reader acknowledged.
    fn stream_acks(&self, workflow_id: &str) -> Result<Vec<(String, u64)>, StoreError>;
    /// Records, synced, that a reader on `channel` holds `workflow_id`'s stream up to event
    /// `event`. An acknowledgement never moves back (one not above the recorded one changes
    /// nothing) and never past what was generated: one above the newest event is refused as
    /// [`StoreError::Conflict`].
    fn acknowledge_stream(&self, workflow_id: &str, channel: &str, event: u64) -> PendingWrite;
    /// Changes once written stream events or an end of `workflow_id` can be read, after every
    /// later such write. `None` when the store cannot tell: readers poll instead.
    fn watch_stream(&self, _workflow_id: &str) -> Option<tokio::sync::watch::Receiver<()>> {
        None
    }
    /// Write statistics, if the store keeps them.
    fn write_stats(&self) -> Option<WriteStats> {
        None
    }
    /// The leases of a store many workers share (`None`: this process owns every workflow).
    fn leases(&self) -> Option<std::sync::Arc<dyn Leases>> {
        None
    }
    /// Applies `transition` atomically; resolves once it is synced to disk.
    fn commit(&self, transition: Transition) -> PendingWrite;
    /// [`Store::commit`] of a transition the caller keeps a handle to, to take back what it
    /// holds once written: a store that lets go of its own handle before it answers spares the
    /// caller a copy of the entries, record and operations.
    fn commit_shared(&self, transition: std::sync::Arc<Transition>) -> PendingWrite {
        self.commit(std::sync::Arc::unwrap_or_clone(transition))
    }
    /// Appends stream events, in submission order with every other write, synced (with the
    /// writes grouped with them) before readers can see them: a reader is never shown an event
    /// a power loss could take. The future only reports the outcome: the events are queued, or
    /// written, when this returns. With no events it is a barrier: it resolves once every write queued
    /// before it is through.
    fn append_stream(&self, workflow_id: &str, items: Vec<StreamItem>) -> PendingWrite;
    /// Up to `limit` workflows that ended at or before `before_ms` (the workers' clock), as
    /// `(ended_at_ms, workflow_id)`, oldest first, from just past `after` (the last of the page
    /// before): what retention deletes next.
    fn ended_before(
        &self,
        before_ms: u64,
        after: Option<&(u64, String)>,
        limit: usize,
    ) -> Result<Vec<(u64, String)>, StoreError>;
    /// Deletes the ended workflow `workflow_id`, synced, with every row that belongs to it
    /// (record, journal, stream, inbox and signal ids seen, operations, request id), and each
    /// artifact it committed that no other workflow committed. `artifacts` are the hashes its
    /// journal committed ([`committed_artifacts`]), read once the record showed it ended (an
    /// ended journal no longer changes). Refused, changing nothing, if there is no
    /// such workflow ([`StoreError::NotFound`]), it has not ended ([`StoreError::NotEnded`]),
    /// or one of its operations may have taken effect unsettled ([`StoreError::Unsettled`]).
    fn delete_workflow(&self, workflow_id: &str, artifacts: Vec<Digest>) -> PendingWrite;

    /// Writes `settled` in place of `decided` under `key`, an operation of an ended workflow
    /// (`decided.workflow_id`) whose outcome nobody has settled
    /// ([`OperationStatus::is_unsettled`](crate::operations::OperationStatus::is_unsettled)):
    /// a decision no run of the workflow can apply, since none runs, or the move of a record a
    /// run left. Synced. Refused, changing nothing, if there is no such workflow
    /// ([`StoreError::NotFound`]), or as a [`StoreError::Conflict`] if it has not ended, the
    /// stored record is not `decided` (another decision came first, or the run's end rewrote
    /// it), or it is settled.
    fn settle_ended_operation(
        &self,
        key: &str,
        decided: crate::operations::OperationRecord,
        settled: crate::operations::OperationRecord,
    ) -> PendingWrite;
}

/// The first write of a new workflow `workflow_id` (of workflow `wf`, with no input), for the
/// stores' tests.
#[cfg(test)]
pub(crate) fn first_transition(workflow_id: &str) -> Transition {
    use crate::journal::{Payload, WorkflowStarted};
    let started = Entry::WorkflowStarted(WorkflowStarted {
        workflow_name: "wf".into(),
        input: Payload::unit(),
        request_id: None,
        started_at_ms: 0,
    });
    let record = WorkflowRecord::new("wf", None, Digest::of(b"null"));
    Transition::append(workflow_id, &record, vec![started])
}

/// The artifacts a journal committed (`ctx.artifact`, retrieval snapshots), each once.
pub fn committed_artifacts(journal: &[Entry]) -> Vec<Digest> {
    let mut hashes: Vec<Digest> = journal
        .iter()
        .filter_map(|entry| match entry {
            Entry::ArtifactCommitted { identity, .. } => Some(identity.input_digest),
            Entry::SnapshotCompleted { artifact, .. }
            | Entry::SnapshotCompletedAt { artifact, .. } => Some(*artifact),
            _ => None,
        })
        .collect();
    hashes.sort_by_key(|hash| hash.0);
    hashes.dedup();
    hashes
}
