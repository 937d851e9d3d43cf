//! # Waymark
//!
//! Durable execution for Rust workflows, built for production GenAI pipelines. Write a workflow
//! as an `async fn`; every call that leaves the deterministic world (`ctx.activity`, `ctx.sleep`,
//! `ctx.now`, `ctx.random`, `ctx.uuid`) is journaled to an embedded RocksDB store. After a crash,
//! a timeout or a restart the workflow runs again from the top and the recorded results are
//! replayed instead of executed again, up to the first call with no record; from there it runs
//! for real.
//!
//! ```no_run
//! use waymark::prelude::*;
//!
//! #[activity]
//! async fn fetch_eta(order_id: String) -> Result<u32, ActivityError> {
//!     Ok(order_id.len() as u32) // call a carrier API here
//! }
//!
//! #[workflow]
//! async fn check_delay(ctx: WorkflowContext, order_id: String) -> Result<bool, WorkflowError> {
//!     let eta_days = ctx.activity(fetch_eta, order_id).await?;
//!     ctx.sleep(std::time::Duration::from_secs(3600)).await; // durable: survives restarts
//!     Ok(eta_days > 3)
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let worker = Worker::builder()
//!     .data_dir("./waymark-data")
//!     .register(check_delay)
//!     .register(fetch_eta)
//!     .build()
//!     .await?;
//! let run = worker.start(check_delay, "order-17".to_owned()).await?;
//! let delayed = run.result().await?;
//! # Ok(()) }
//! ```
//!
//! ## Rules for workflow code
//!
//! Workflow code must be deterministic given its journal: it must not read the clock,
//! randomness, the environment or the network directly (use `ctx.now()`, `ctx.random()`,
//! `ctx.uuid()` and activities), and must not use `tokio::spawn`, `tokio::select!` or
//! `tokio::time`. Waymark polls workflow futures on its own executor and delivers completions
//! one at a time in journal order; combine ctx futures with [`join!`] and [`select!`] (the
//! biased, deterministic form of `futures::select!`). Change workflow code that has runs in
//! flight behind [`WorkflowContext::patched`].
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod agent;
mod artifacts;
mod context;
#[cfg(feature = "http")]
pub mod http;
pub mod llm;
#[cfg(feature = "mcp")]
pub mod mcp;
mod registry;
mod retrieval;
pub mod testing;
mod traits;
mod worker;

pub use context::{ActivityCall, ActivityContext, EffectCall, Sleep, WorkflowContext};
pub use registry::Registry;
pub use traits::{
    Activity, Effect, EffectKey, KeyArgument, KeyArguments, Reconciled, Register, Workflow,
};
pub use worker::{
    ForkOptions, RunFootprint, RunHandle, StartOptions, Worker, WorkerBuilder, INHERITED_BY,
};

pub use waymark_runtime::clock::{Clock, ManualClock, SystemClock};
pub use waymark_runtime::error::{
    AckError, ActivityError, ApprovalError, CancelError, DeleteError, ForkError, Refusal, Refused,
    ResolveError, RunError, SignalError, StartError, StuckRun, Unreachable, WorkflowError,
};
pub use waymark_runtime::options::{ActivityOptions, RetryPolicy};
pub use waymark_runtime::store::StoreError;

/// Marks an `async fn` as an activity: a non-deterministic step whose result is journaled and
/// replayed, never executed again once recorded.
///
/// ```ignore
/// #[activity(max_attempts = 3, timeout_ms = 10_000)]
/// async fn load_order(order_id: OrderId) -> Result<Order, ActivityError> { .. }
/// ```
///
/// The function becomes a unit value of the same name that implements [`Activity`]; pass it to
/// `ctx.activity(load_order, input)` and to `Worker::builder().register(load_order)`. Several
/// arguments form a tuple input. An optional first argument `cx: ActivityContext` gives the
/// attempt number and ids. Arguments: `name = "..."` (stable journal name, default the function
/// name), `max_attempts`, `timeout_ms` (start-to-close), `initial_backoff_ms`,
/// `max_backoff_ms`, `deadline_ms` (no retry starts later than this after scheduling).
///
/// `effect` makes it a side effect ([`Effect`]): the arguments that name the business target
/// are marked `#[key]` (at least one is required), `version = N` (default 1) is part of the
/// idempotency key, and `reconcile = path` names an `async fn(cx: ActivityContext, <the same
/// arguments>) -> Result<Reconciled<T>, E>` that asks the downstream whether an attempt with an
/// unknown outcome took effect. Call it with [`WorkflowContext::effect`].
///
/// An attempt's first poll runs on its workflow's task, so an activity that answers at once
/// costs no task of its own; from its first `.await` that waits, it runs on a task of its own
/// and the workflow handles its other events meanwhile. Attempts started together (a `join!`)
/// take their first polls one after another, in call order: fakes that answer at once complete,
/// and are journaled, in call order. Work that holds the thread (heavy computation, a blocking
/// client) belongs in `tokio::task::spawn_blocking`, as anywhere on tokio: before its first
/// wait it would hold its workflow, and the attempts started with it.
pub use waymark_macros::activity;

/// Marks an `async fn` as a workflow: `async fn f(ctx: WorkflowContext, input: I) ->
/// Result<O, WorkflowError>`. It becomes a unit value of the same name that implements
/// [`Workflow`]. Argument: `name = "..."` (stable name, default the function name).
pub use waymark_macros::workflow;

/// Awaits several ctx futures concurrently (`futures::join!`). Completions reach them in
/// journal order, so the interleaving replays identically.
pub use futures::join;

/// Waits for the first of several ctx futures: `futures::select_biased!`, which checks branches
/// in written order, so that when several are ready the choice replays identically.
pub use futures::select_biased as select;

/// Everything a workflow module needs.
pub mod prelude {
    pub use crate::{
        activity,
        agent::{Agent, Budget},
        llm::{Llm, Message},
        workflow, Activity, ActivityContext, ActivityError, ActivityOptions, Effect, Reconciled,
        RetryPolicy, RunError, Worker, Workflow, WorkflowContext, WorkflowError,
    };
}

/// The operation log: what every effect did, and how operators settle unknown outcomes.
pub mod operations {
    pub use waymark_runtime::compensations::{CompensationFailed, UndoFailure};
    pub use waymark_runtime::operations::{
        idempotency_key, render_operations, OperationEvent, OperationRecord, OperationStatus,
        OperatorDecision, Settlement,
    };

    /// An operator decision that the effect happened with `output` (the effect's output type).
    pub fn committed<T: serde::Serialize>(output: &T) -> Result<OperatorDecision, crate::RunError> {
        waymark_runtime::journal::Payload::encode(output)
            .map(OperatorDecision::Committed)
            .map_err(|source| crate::RunError::PayloadMismatch { seq: None, source })
    }
}

/// Artifacts and approvals: immutable, content-addressed values a person can approve, and
/// effects run under an approval.
pub mod approvals {
    pub use crate::artifacts::{
        Approval, ApprovalOutcome, ApprovalRequest, Artifact, ArtifactMeta, PendingApproval,
    };
    pub use crate::worker::PendingRequest;
    pub use waymark_runtime::approvals::{
        ApprovalScope, AuthorisedIntent, Grant, Granted, Intent, NotApproved, SCOPE_KIND,
    };
    pub use waymark_runtime::artifacts::{ApprovalVerdict, ArtifactRecord};
    pub use waymark_runtime::journal::ApprovalDecision;
}

/// Retrieval snapshots: `ctx.retrieve` and what a retriever returns.
pub mod snapshots {
    pub use crate::retrieval::{Retrieval, RetrievalCall, RetrievedDocument};
}

/// Signals: what `Worker::signal` sends and `ctx.signal` waits for.
pub mod signals {
    pub use crate::context::Signal;
    pub use waymark_runtime::inbox::{InboxMessage, SignalOutcome};
}

pub mod telemetry {
    //! Replay-safety telemetry: `waymark.run` and `waymark.step` spans (each step with its
    //! `replay_mode`; replayed steps have `executed = false`) and the metrics listed in
    //! [`names`], counted per worker and rendered as Prometheus text on `/metrics`.
    pub use waymark_runtime::telemetry::{
        journal_stats, names, CallKind, JournalStats, MetricSample, MetricSet, ReplayMode,
        ResumePoint, Telemetry,
    };

    #[cfg(feature = "otel")]
    pub mod otel;
}

/// A workflow's durable stream: numbered events a reader can resume from, streamed model
/// tokens under response versions, and the marker of the committed one.
pub mod streams {
    pub use waymark_runtime::streams::{
        render_stream, summarize_stream, visible_text, StreamEvent, StreamItem,
    };
}

/// The store behind a worker: the embedded RocksDB one, or another behind the same trait
/// (`WorkerBuilder::store`).
pub mod store {
    pub use waymark_runtime::artifacts::ArtifactRecord;
    pub use waymark_runtime::inbox::InboxMessage;
    pub use waymark_runtime::journal::{
        decode_record, encode_record, Digest, Entry, Failure, FailureKind, Record, Seq,
    };
    /// The keys of the store's tables.
    pub use waymark_runtime::keys;
    pub use waymark_runtime::keys::TimerKey;
    pub use waymark_runtime::operations::OperationRecord;
    pub use waymark_runtime::store::{
        committed_artifacts, is_off_async_thread, off_async_thread, Engine, KvStore, LeaseStats,
        Leases, Locks, MemoryEngine, MemoryStore, OperationListing, Ownership, ParkedMark, Parking,
        PendingWrite, Reads, RunStop, Stage, StopCode, Store, StoreError, SummaryListing, Table,
        Transition, WorkflowListing, WorkflowRecord, WorkflowStatus, WorkflowSummary, Write,
        WriteCounts, WriteStats,
    };
    #[cfg(feature = "postgres")]
    pub use waymark_runtime::store::{PgEngine, PgOptions, PgStore};
    #[cfg(feature = "rocksdb")]
    pub use waymark_runtime::store::{RocksEngine, RocksStore};
    pub use waymark_runtime::streams::{ChunkWriter, StreamEvent, StreamItem, VersionSlot};
}

/// Namespaces: the stored form of an id in a namespace, and back.
pub mod namespace {
    pub use waymark_runtime::namespace::{
        check_name, display, qualify, split, NamespaceError, DEFAULT,
    };
}

/// Encryption at rest: the codec hook and the built-in AES-256-GCM keyring.
pub mod codec {
    pub use waymark_runtime::codec::{
        Codec, CodecError, EncryptionKey, KeySpecError, Keyring, KEYS_ENV, KEYS_FILE_ENV,
    };
}

/// Reading a stopped worker's data.
#[cfg(feature = "rocksdb")]
pub mod inspect {
    pub use waymark_runtime::export::{Export, ImportRefusal, IMPORTED_BY};
    pub use waymark_runtime::journal::{
        read_framed, read_framed_with, write_framed, write_framed_sealed, Entry, Payload,
        Reconciliation,
    };
    pub use waymark_runtime::operations::{render_operations, OperationRecord, OperationStatus};
    pub use waymark_runtime::render::render_journal;
    pub use waymark_runtime::store::Rekeyed;
    pub use waymark_runtime::store::{RunStop, StopCode, WorkflowRecord, WorkflowStatus};

    use std::path::Path;
    use std::sync::Arc;
    use waymark_runtime::codec::Codec;
    use waymark_runtime::store::{
        OperationListing, RocksStore, Store, StoreError, WorkflowListing,
    };

    /// A read-only view of a data directory. Safe to open while no worker holds it, and while
    /// one does (it sees the state as of the last flush).
    pub struct DataDir(RocksStore);

    impl DataDir {
        /// Opens `dir` read-only; values sealed at rest do not open.
        pub fn open(dir: impl AsRef<Path>) -> Result<Self, StoreError> {
            Self::open_with_codec(dir, None)
        }

        /// Opens `dir` read-only, opening values `codec` sealed.
        pub fn open_with_codec(
            dir: impl AsRef<Path>,
            codec: Option<Arc<dyn Codec>>,
        ) -> Result<Self, StoreError> {
            RocksStore::open_read_only_with_codec(dir.as_ref(), codec).map(DataDir)
        }

        /// A workflow's journal.
        pub fn journal(&self, workflow_id: &str) -> Result<Vec<Entry>, StoreError> {
            self.0.journal(workflow_id)
        }

        /// A workflow's record.
        pub fn workflow(&self, workflow_id: &str) -> Result<Option<WorkflowRecord>, StoreError> {
            self.0.workflow(workflow_id)
        }

        /// A workflow's stream events numbered above `after`.
        pub fn stream(
            &self,
            workflow_id: &str,
            after: u64,
        ) -> Result<Vec<crate::streams::StreamEvent>, StoreError> {
            self.0.stream(workflow_id, after)
        }

        /// Every workflow with its record (or why it does not decode).
        pub fn workflows(&self) -> Result<WorkflowListing, StoreError> {
            self.0.workflows()
        }

        /// A workflow's operation log, by idempotency key.
        pub fn operations(&self, workflow_id: &str) -> Result<OperationListing, StoreError> {
            self.0
                .operations(&waymark_runtime::operations::key_prefix(workflow_id))
        }

        /// The workflow as `waymark export` writes it: journal, operation log rows, artifacts.
        pub fn export(&self, workflow_id: &str) -> Result<Export, StoreError> {
            Export::collect(&self.0, workflow_id)
        }

        /// Every operation of `namespace` (of every namespace for `None`) an operator's
        /// decision is taken about now, by idempotency key (what
        /// `Worker::operations_awaiting_decision` lists).
        pub fn operations_awaiting_decision(
            &self,
            namespace: Option<&str>,
        ) -> Result<Vec<(String, waymark_runtime::operations::OperationRecord)>, StoreError>
        {
            waymark_runtime::worker::operations_awaiting_decision(&self.0, namespace)
        }

        /// Every operation in the store, by idempotency key.
        pub fn all_operations(&self) -> Result<OperationListing, StoreError> {
            self.0.operations("")
        }

        /// The artifact named `hash` (`sha256:…` or bare hex) in `namespace`; `None` if none is.
        pub fn artifact(
            &self,
            namespace: &str,
            hash: &str,
        ) -> Result<Option<waymark_runtime::artifacts::ArtifactRecord>, StoreError> {
            match waymark_runtime::journal::Digest::parse_hex(hash) {
                Some(digest) => self.0.artifact(namespace, &digest),
                None => Ok(None),
            }
        }
    }

    /// Why an import failed.
    #[derive(Debug, thiserror::Error)]
    pub enum ImportError {
        /// The file is not an exported journal.
        #[error("record {index} of the export does not decode: {source}")]
        Decode {
            /// Which record.
            index: usize,
            /// Why.
            source: waymark_runtime::journal::DecodeError,
        },
        /// The store refused it (the id exists, the request id is taken, a worker holds it).
        #[error(transparent)]
        Store(#[from] StoreError),
        /// The export holds what may not be imported (see [`Export::into_import`]).
        #[error(transparent)]
        Refused(#[from] waymark_runtime::export::ImportRefusal),
    }

    /// What an import wrote.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Imported {
        /// Journal entries.
        pub entries: usize,
        /// Operation log rows.
        pub operations: usize,
        /// Artifacts (those the store already held are counted, not written again).
        pub artifacts: usize,
    }

    /// Writes an export (`waymark export`) into the stopped worker's data dir `dir` as workflow
    /// `workflow_id`: its journal, its operation log rows (rebased to `workflow_id`, each with
    /// an event naming where it came from, [`IMPORTED_BY`]) and its artifacts. An older export
    /// (framed journal records) brings its journal only. `codec` opens a sealed export and
    /// seals what is written (give the worker's own). A running worker holds the store's lock,
    /// so this fails cleanly while one runs. An imported running workflow resumes when the
    /// worker next starts, and an effect the export's rows say committed is answered, not
    /// called again.
    pub async fn import_workflow(
        dir: impl AsRef<Path>,
        workflow_id: &str,
        export: &[u8],
        codec: Option<Arc<dyn Codec>>,
    ) -> Result<Imported, ImportError> {
        let export = Export::read(export, codec.as_deref())
            .map_err(|(index, source)| ImportError::Decode { index, source })?;
        let imported = Imported {
            entries: export.entries.len(),
            operations: export.operations.len(),
            artifacts: export.artifacts.len(),
        };
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        let now_ms = now.map_or(0, |since| since.as_millis() as u64);
        let transition = export.into_import(workflow_id, now_ms)?;
        let store = RocksStore::open_with_codec(dir.as_ref(), codec)?;
        store.commit(transition).await?;
        Ok(imported)
    }

    /// Seals under `codec`'s current key every value of the stopped worker's data dir `dir`
    /// that is plain or sealed under an older key, so that the older key can be dropped.
    pub fn rekey(dir: impl AsRef<Path>, codec: Arc<dyn Codec>) -> Result<Rekeyed, StoreError> {
        let store = RocksStore::open_with_codec(dir.as_ref(), Some(codec))?;
        store.rekey()
    }
}

#[doc(hidden)]
pub mod __private {
    //! What generated code names. Not public API.
    pub use crate::{
        Activity, ActivityContext, ActivityError, ActivityOptions, Effect, EffectKey, KeyArgument,
        KeyArguments, Reconciled, Register, Registry, Workflow, WorkflowContext, WorkflowError,
    };
    pub use futures::future::BoxFuture;

    /// [`Workflow::CODE_DIGEST`] (FNV-1a, at compile time) of a workflow whose function's
    /// tokens are `tokens`, built in a package of version `package_version`, with this
    /// Waymark: a new version of either rebuilds parked runs at start, as a changed function
    /// does.
    pub const fn code_digest(tokens: &str, package_version: &str) -> u64 {
        let hash = fnv1a(0xcbf2_9ce4_8422_2325, tokens.as_bytes());
        let hash = fnv1a(hash, package_version.as_bytes());
        fnv1a(hash, env!("CARGO_PKG_VERSION").as_bytes())
    }

    const fn fnv1a(mut hash: u64, bytes: &[u8]) -> u64 {
        let mut at = 0;
        while at < bytes.len() {
            hash = (hash ^ bytes[at] as u64).wrapping_mul(0x0000_0100_0000_01b3);
            at += 1;
        }
        hash
    }
}
