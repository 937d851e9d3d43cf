//! The worker: owns the store, recovers in-flight workflows on start, routes events to resident
//! workflows (rebuilding evicted ones by replay), fires durable timers, and answers callers.
//!
//! This file holds the worker's state, its public API and its life (start, shutdown); each
//! responsibility has its file: `start` (recovery, starts with request-id dedupe), `router`
//! (mailboxes of resident runs, rebuilds), `timers` (the timer service), `publication` (who
//! waits for which outcome, ends held back until counted), `commands` (signals, approval
//! decisions, operators' resolutions, cancellation), `stuck` (runs held from rebuilds), `host`
//! (the worker as the executors' `Host`).

use crate::codec::Codec;
use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio_util::task::TaskTracker;
use tracing::{error, info, warn};

use crate::clock::{Clock, SystemClock};
use crate::entropy::{Entropy, OsEntropy};
use crate::error::StuckRun;
use crate::error::{
    AckError, ApprovalError, CancelError, DeleteError, ResolveError, RunError, SignalError,
    StartError, Unreachable,
};
pub use crate::executor::RunFootprint;
use crate::executor::{run_workflow, Loaded, Mail};
pub use fork::{ForkOptions, INHERITED_BY};

mod commands;
pub use commands::operations_awaiting_decision;
mod fork;
mod host;
mod ownership;
mod publication;
mod relay;
mod reset;
mod retention;
mod router;
mod start;
mod stuck;
mod sweeper;
mod timers;

use crate::inbox::{InboxMessage, SignalOutcome};
use crate::journal::{Entry, Failure, FailureKind, Payload, ReconciledBy, WorkflowStarted};
use crate::keys::{TimerKey, MAX_ID_LEN};
use crate::machines::Commands;
use crate::operations::{
    key_prefix, DecidedOn, OperationRecord, OperationStatus, OperatorDecision, Settlement,
};
use crate::registry::Registry;
use crate::store::{
    off_async_thread, OperationListing, RunStop, Store, StoreError, Transition, WorkflowRecord,
    WorkflowStatus,
};
use crate::sync::lock;
use crate::telemetry::{names, Telemetry, Wake};
pub(crate) use publication::EndingGuard;
use publication::{wait_outcome, Outcomes};
pub(crate) use router::Router;
use stuck::StuckBackoff;
use timers::run_timers;
pub(crate) use timers::TimerHandle;

/// How a run ended, as published to waiting callers.
pub type Outcome = Result<Payload, RunError>;

/// Whether a published outcome is also in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Durability {
    /// In the journal: later callers read it there.
    Journaled,
    /// Only in memory (a run stopped without writing): kept for later callers.
    InMemory,
}

/// Worker settings.
pub struct WorkerConfig {
    /// Where the RocksDB store lives.
    pub data_dir: PathBuf,
    /// Time source (the system clock unless a test injects a manual one).
    pub clock: Arc<dyn Clock>,
    /// Where `ctx.random` and `ctx.uuid` draw new values (the operating system unless a test or
    /// a simulation seeds it).
    pub entropy: Arc<dyn Entropy>,
    /// A workflow whose only open commands are timers due further away than this is evicted
    /// from memory and rebuilt by replay when one fires.
    pub eviction_threshold: Duration,
    /// What the worker hosts.
    pub registry: Registry,
    /// Faults to inject (tests only).
    pub faults: Option<Arc<crate::faults::FaultPlan>>,
    /// Where spans' companions, the replay-safety metrics, are counted. Hand the same one to
    /// a restarted worker to keep counting across the restart.
    pub telemetry: Telemetry,
    /// A store other than the embedded RocksDB one in `data_dir` (then `data_dir` is unused).
    pub store: Option<Arc<dyn Store>>,
    /// Seals every value the embedded store writes, and journal exports (none: values are
    /// stored as they are). A store given in `store` seals as it was opened; exports still use
    /// this.
    pub codec: Option<Arc<dyn Codec>>,
    /// Fields of activity, effect and model-call inputs journaled as their digest only.
    pub redaction: crate::redact::Redaction,
    /// How often operations awaiting a decision are asked again of their reconciler (the first
    /// pause; each sweep that cannot tell doubles it, up to 64 times).
    pub sweep_interval: Duration,
    /// How long an ended workflow is kept before it is deleted with every row of its own
    /// (`None`: kept until deleted by hand).
    pub retention: Option<Duration>,
    /// The largest payload journaled, in bytes: a workflow's input and output, a step's input
    /// and result. One over it is refused with an error naming the step.
    pub max_payload_bytes: usize,
}

/// [`WorkerConfig::max_payload_bytes`] unless set: 16 MiB.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 16 << 20;

impl WorkerConfig {
    /// Defaults: system clock, evict after 60 s of timer-only waiting.
    pub fn new(data_dir: impl Into<PathBuf>, registry: Registry) -> Self {
        Self {
            data_dir: data_dir.into(),
            clock: Arc::new(SystemClock),
            entropy: Arc::new(OsEntropy),
            eviction_threshold: Duration::from_secs(60),
            registry,
            faults: None,
            telemetry: Telemetry::new(),
            store: None,
            codec: None,
            redaction: crate::redact::Redaction::default(),
            sweep_interval: Duration::from_secs(60),
            retention: None,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
        }
    }
}

/// Caller options for starting a workflow.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StartOptions {
    /// The workflow id; defaults to the request id, else a generated one.
    pub workflow_id: Option<String>,
    /// Deduplication key: starting again with it returns the existing workflow.
    pub request_id: Option<String>,
    /// Who starts it (a caller's identity, as the HTTP API knows it from the token), journaled
    /// right after the start.
    pub started_by: Option<String>,
    /// The namespace it belongs to (`None`: [`crate::namespace::DEFAULT`]). Its ids, the request
    /// id's too, are qualified with it: the id returned is the stored one.
    pub namespace: Option<String>,
}

/// A started (or found) workflow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    /// Its id.
    pub workflow_id: String,
    /// Whether the request id named a workflow that already existed.
    pub existed: bool,
}

/// What a workflow's record and journal say about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkflowSummary {
    /// Its id.
    pub workflow_id: String,
    /// The record.
    pub record: WorkflowRecord,
}

pub(crate) struct WorkerState {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) registry: Arc<Registry>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) entropy: Arc<dyn Entropy>,
    pub(crate) eviction_threshold_ms: u64,
    pub(crate) router: Router,
    pub(crate) timers: TimerHandle,
    pub(crate) telemetry: Telemetry,
    /// When this worker started: recovery latency counts from here.
    pub(crate) started_at: Instant,
    pub(crate) faults: Option<Arc<crate::faults::FaultPlan>>,
    codec: Option<Arc<dyn Codec>>,
    pub(crate) redaction: crate::redact::Redaction,
    pub(crate) max_payload_bytes: usize,
    outcomes: Mutex<Outcomes>,
    /// Runs found stuck, and when an event may rebuild each again.
    stuck: Mutex<HashMap<String, StuckBackoff>>,
    /// Runs being reset: nothing rebuilds them until the reset is done.
    resetting: Mutex<BTreeSet<String>>,
    /// Workflows recovery could not resume: unreadable records, and runs recovery found stuck.
    recovery_errors: Mutex<Vec<(String, RunError)>>,
    /// Executors and the worker's services; `None` once stopping, so nothing starts after.
    tasks: Mutex<Option<JoinSet<()>>>,
    /// Attempts, reconcilers and retry timers that executors started: shutdown waits for them
    /// too, so that the store is closed (its lock released) when it returns.
    pub(crate) in_flight: TaskTracker,
    /// Where executors ask for what they replay, and the worker reads workflows' outcomes
    /// (grouped, see `executor/reads.rs`).
    pub(crate) reads: crate::executor::Reads,
    /// The store's leases, when many workers share it: this worker runs only what it holds.
    leases: Option<Arc<dyn crate::store::Leases>>,
    /// Becomes `true` once this worker's leases lapsed and every run stopped.
    lapsed: watch::Sender<bool>,
    myself: Weak<WorkerState>,
}

/// A running worker. Dropping it without [`Worker::shutdown`] aborts its tasks too, but
/// cannot wait for them: the store closes once the last of them is gone.
pub struct Worker {
    shared: Arc<WorkerState>,
}

impl Worker {
    /// Opens the store, recovers every in-flight workflow and starts the timer service.
    pub async fn start(config: WorkerConfig) -> Result<Self, StoreError> {
        let store: Arc<dyn Store> = match config.store {
            Some(store) => store,
            None => open_store(&config.data_dir, config.codec.clone()).await?,
        };
        let leases = store.leases();
        let recovery = store.clone();
        // On a shared store, recovery is claiming: a workflow is resumed by whoever claims it.
        let shared_store = leases.is_some();
        let read = move || {
            off_async_thread(|| {
                if shared_store {
                    return Ok((Vec::new(), Vec::new(), HashMap::new()));
                }
                let parked = recovery.parked().unwrap_or_else(|error| {
                    warn!(%error, "cannot read the parked marks: every workflow is rebuilt");
                    HashMap::new()
                });
                Ok::<_, StoreError>((recovery.workflow_summaries()?, recovery.timers()?, parked))
            })
        };
        let (listing, pending_timers, parked) = tokio::task::spawn_blocking(read)
            .await
            .map_err(|e| StoreError::Backend(format!("recovery read failed to run: {e}")))??;
        let (timer_tx, timer_rx) = mpsc::unbounded_channel();
        let in_flight = TaskTracker::new();
        let (reads, read_requests) = crate::executor::reads(store.clone(), in_flight.clone());
        let threshold_ms = u64::try_from(config.eviction_threshold.as_millis()).unwrap_or(u64::MAX);
        let shared = Arc::new_cyclic(|myself| WorkerState {
            store,
            registry: Arc::new(config.registry),
            clock: config.clock,
            entropy: config.entropy,
            eviction_threshold_ms: threshold_ms,
            router: Router::default(),
            telemetry: config.telemetry,
            started_at: Instant::now(),
            faults: config.faults.clone(),
            codec: config.codec,
            redaction: config.redaction,
            max_payload_bytes: config.max_payload_bytes,
            timers: TimerHandle(timer_tx),
            outcomes: Mutex::new(Outcomes::default()),
            stuck: Mutex::default(),
            resetting: Mutex::default(),
            recovery_errors: Mutex::default(),
            tasks: Mutex::new(Some(JoinSet::new())),
            in_flight,
            reads,
            leases: leases.clone(),
            lapsed: watch::Sender::new(false),
            myself: myself.clone(),
        });
        // Recovery first: an overdue timer firing before it would start its workflow as woken
        // by an event, not as recovered. Timers scheduled meanwhile wait in the channel.
        // This worker knows of no stuck run yet; recovery finds them again.
        shared.telemetry.workflows_stuck(0);
        shared.spawn(crate::executor::run_reads(read_requests));
        shared.recover(listing, &parked);
        let timer_service = run_timers(Arc::downgrade(&shared), timer_rx, pending_timers);
        shared.spawn(timer_service);
        let sweep_ms = u64::try_from(config.sweep_interval.as_millis()).unwrap_or(u64::MAX);
        let started_ms = shared.clock.now_ms();
        let sweeper = sweeper::run_sweeper(Arc::downgrade(&shared), started_ms, sweep_ms.max(1));
        shared.spawn(sweeper);
        if let Some(retention) = config.retention {
            shared.spawn(retention::run_retention(Arc::downgrade(&shared), retention));
        }
        if let Some(leases) = leases {
            if let Some(wakeups) = leases.wakeups() {
                shared.spawn(ownership::deliver_wakeups(Arc::downgrade(&shared), wakeups));
            }
            // As a worker owning its store recovers before it returns, one sharing it first
            // takes what nobody holds (what a worker that stopped let go, or one that lapsed).
            shared.renew_and_claim(&leases).await;
            shared.spawn(ownership::keep_leases(Arc::downgrade(&shared), leases));
        }
        Ok(Self { shared })
    }

    /// Starts workflow `name`, or returns the one its request id already started.
    pub async fn start_workflow(
        &self,
        name: &str,
        input: Payload,
        options: StartOptions,
    ) -> Result<Started, StartError> {
        self.shared.start_workflow(name, input, options).await
    }

    /// Waits for the workflow's end and returns its output.
    pub async fn result(&self, workflow_id: &str) -> Outcome {
        self.shared.result(workflow_id).await
    }

    /// A weak handle, for callers that must not keep the worker (and its store) alive.
    pub fn downgrade(&self) -> WeakWorker {
        WeakWorker(Arc::downgrade(&self.shared))
    }

    /// The workflow's journal.
    pub fn journal(&self, workflow_id: &str) -> Result<Vec<Entry>, StoreError> {
        self.shared.store.journal(workflow_id)
    }

    /// Up to `limit` entries of the workflow's journal from index `from` on.
    pub fn journal_page(
        &self,
        workflow_id: &str,
        from: u64,
        limit: usize,
    ) -> Result<Vec<Entry>, StoreError> {
        self.shared.store.journal_page(workflow_id, from, limit)
    }

    /// The workflow's record.
    pub fn workflow(&self, workflow_id: &str) -> Result<Option<WorkflowRecord>, StoreError> {
        self.shared.store.workflow(workflow_id)
    }

    /// Every workflow with its record (or why its record does not decode).
    pub fn workflows(&self) -> Result<crate::store::WorkflowListing, StoreError> {
        self.shared.store.workflows()
    }

    /// Every workflow with its name and status (or why its record does not decode), reading
    /// no journal: see [`crate::store::Store::workflow_summaries`].
    pub fn workflow_summaries(&self) -> Result<crate::store::SummaryListing, StoreError> {
        self.shared.store.workflow_summaries()
    }

    /// The whole record of each workflow of `listed` (a page of [`Worker::workflow_summaries`],
    /// say), its journal length included; one deleted since it was listed is left out.
    pub fn records_of(
        &self,
        listed: crate::store::SummaryListing,
    ) -> crate::store::WorkflowListing {
        let read = |(id, summary): (String, Result<_, StoreError>)| match summary {
            Ok(_) => match self.shared.store.workflow(&id) {
                Ok(Some(record)) => Some((id, Ok(record))),
                Ok(None) => None,
                Err(error) => Some((id, Err(error))),
            },
            Err(error) => Some((id, Err(error))),
        };
        listed.into_iter().filter_map(read).collect()
    }

    /// Store write statistics (synced batches, transitions).
    pub fn write_stats(&self) -> Option<crate::store::WriteStats> {
        self.shared.store.write_stats()
    }

    /// Counts into the telemetry what this worker's leases came to since they were last
    /// counted (after its last heartbeat), on a store many workers share.
    pub fn observe_leases(&self) {
        if let Some(leases) = self.shared.store.leases() {
            self.shared.observe_leases(&leases);
        }
    }

    /// `workflow_id` as `waymark export` writes it: journal, operation log rows, artifacts.
    pub fn export(&self, workflow_id: &str) -> Result<crate::export::Export, StoreError> {
        crate::export::Export::collect(self.shared.store.as_ref(), workflow_id)
    }

    /// The operation log of `workflow_id`, by idempotency key.
    pub fn operations(&self, workflow_id: &str) -> Result<OperationListing, StoreError> {
        self.shared.store.operations(&key_prefix(workflow_id))
    }

    /// Every operation of `namespace` (of every namespace for `None`) an operator's decision
    /// is taken about now, whatever its workflow's status ([`operations_awaiting_decision`]).
    pub fn operations_awaiting_decision(
        &self,
        namespace: Option<&str>,
    ) -> Result<Vec<(String, OperationRecord)>, StoreError> {
        operations_awaiting_decision(self.shared.store.as_ref(), namespace)
    }

    /// One operation, by idempotency key.
    pub fn operation(&self, key: &str) -> Result<Option<OperationRecord>, StoreError> {
        self.shared.store.operation(key)
    }

    /// Sends signal `name` with id `signal_id` to a workflow: kept in its inbox (synced) until a
    /// `ctx.signal(name)` takes it. A repeated id is dropped (`SignalOutcome::Duplicate`).
    pub async fn signal(
        &self,
        workflow_id: &str,
        name: &str,
        signal_id: &str,
        payload: Payload,
    ) -> Result<SignalOutcome, SignalError> {
        self.shared
            .signal(workflow_id, name, signal_id, payload, None)
            .await
    }

    /// [`Worker::signal`] from `sender` (a caller's identity, as the HTTP API knows it from
    /// the token): the journal's delivery names it.
    pub async fn signal_from(
        &self,
        workflow_id: &str,
        name: &str,
        signal_id: &str,
        payload: Payload,
        sender: &str,
    ) -> Result<SignalOutcome, SignalError> {
        let sender = Some(sender);
        self.shared
            .signal(workflow_id, name, signal_id, payload, sender)
            .await
    }

    /// A workflow's signals not delivered yet, oldest first.
    pub fn inbox(&self, workflow_id: &str) -> Result<Vec<InboxMessage>, StoreError> {
        let inbox = self.shared.store.inbox(workflow_id, 0)?;
        Ok(inbox.into_iter().map(|(_, message)| message).collect())
    }

    /// Deletes an ended workflow with every row of its own (journal, stream, inbox and the
    /// signal ids it saw, operations, its request id: a later start with that request id
    /// starts a new workflow) and each artifact no other workflow committed. Refused, deleting
    /// nothing, if it is unknown, has not ended, or holds an operation that may have taken
    /// effect and that nobody has settled ([`DeleteError::Unsettled`]).
    pub async fn delete(&self, workflow_id: &str) -> Result<(), DeleteError> {
        self.shared.delete(workflow_id).await
    }

    /// Forks `workflow_id` at entry `options.at`: a new workflow whose journal is the source's
    /// first `at` entries, replayed, then run live on this worker. An effect the source
    /// committed is not fired again: the fork answers it from a copy of the source's record,
    /// marked inherited (`OperationEvent::by` starts with [`INHERITED_BY`]), unless
    /// `options.refire` names it. Refused, writing nothing, if the source is unknown, `at` is
    /// not a point a run can go on from, or an operation of the source has an unknown outcome.
    pub async fn fork(
        &self,
        workflow_id: &str,
        options: ForkOptions,
    ) -> Result<Started, crate::error::ForkError> {
        self.shared.fork(workflow_id, options).await
    }

    /// Resets the stuck run `workflow_id` in place to its first `at` entries: the run it
    /// leaves is kept, ended, as the workflow `ID#run-N` (the id returned), and the workflow
    /// goes on as a new run of the code deployed now, replaying those entries. Its effects keep
    /// their keys and records, so one the old run committed is answered, not called again.
    /// Refused, writing nothing, unless the run is stuck and `at` is a point it can go on from.
    pub async fn reset(
        &self,
        workflow_id: &str,
        at: u64,
        by: Option<String>,
    ) -> Result<String, crate::error::ForkError> {
        self.shared.reset(workflow_id, at, by).await
    }

    /// Cancels a running workflow: it ends as failed (`Cancelled`, with `reason`) wherever it
    /// is. Attempts in flight are dropped; effects they left unsettled keep their operation
    /// records for inspection.
    pub async fn cancel(&self, workflow_id: &str, reason: &str) -> Result<(), CancelError> {
        self.shared.cancel(workflow_id, reason).await
    }

    /// Records, durably, that a reader on `channel` holds `workflow_id`'s stream up to event
    /// `event` (a reconnection with `Last-Event-ID`, or an explicit acknowledgement), and
    /// returns what the channel is now known to have received. It never moves back: an older
    /// event leaves the recorded one. An event above the newest generated is refused.
    pub async fn acknowledge_stream(
        &self,
        workflow_id: &str,
        channel: &str,
        event: u64,
    ) -> Result<u64, AckError> {
        self.shared
            .acknowledge_stream(workflow_id, channel, event)
            .await
    }

    /// Per reader channel, the last of `workflow_id`'s stream events a reader acknowledged.
    pub fn stream_acks(&self, workflow_id: &str) -> Result<Vec<(String, u64)>, StoreError> {
        self.shared.store.stream_acks(workflow_id)
    }

    /// What seals the store's values and journal exports, if anything does.
    pub fn codec(&self) -> Option<&Arc<dyn Codec>> {
        self.shared.codec.as_ref()
    }

    /// The replay-safety metrics this worker counts.
    pub fn telemetry(&self) -> &Telemetry {
        &self.shared.telemetry
    }

    /// The artifact with this hash in `namespace`.
    pub fn artifact(
        &self,
        namespace: &str,
        hash: &crate::journal::Digest,
    ) -> Result<Option<crate::artifacts::ArtifactRecord>, StoreError> {
        self.shared.store.artifact(namespace, hash)
    }

    /// Decides the approval pending in `workflow_id`, which must be for artifact `hash`
    /// (`sha256:…`), as `approver`. A decision for another artifact is refused.
    ///
    /// With `request` (the seq of the `approval_requested` entry, shown in
    /// `approval_required`), the decision is refused unless that very request is pending: a
    /// decision made for an earlier request of the same artifact does not settle a new one.
    pub async fn decide_approval(
        &self,
        workflow_id: &str,
        request: Option<u32>,
        hash: &str,
        approver: &str,
        verdict: crate::artifacts::ApprovalVerdict,
    ) -> Result<(), ApprovalError> {
        self.shared
            .decide_approval(workflow_id, request, hash, approver, verdict)
            .await
    }

    /// The workflow's stream events numbered above `after` (0 for all of them).
    pub fn stream(
        &self,
        workflow_id: &str,
        after: u64,
    ) -> Result<Vec<crate::streams::StreamEvent>, StoreError> {
        self.shared.store.stream(workflow_id, after)
    }

    /// At most `limit` of the workflow's stream events numbered above `after`.
    pub fn stream_page(
        &self,
        workflow_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<crate::streams::StreamEvent>, StoreError> {
        self.shared.store.stream_page(workflow_id, after, limit)
    }

    /// The number of the workflow's newest stream event (0 for none).
    pub fn stream_last(&self, workflow_id: &str) -> Result<u64, StoreError> {
        self.shared.store.stream_last(workflow_id)
    }

    /// Changes after every later write of stream events or of the end of `workflow_id`;
    /// subscribe before reading the stream, and nothing written after the read is missed.
    /// `None` when the store cannot tell (then poll).
    pub fn watch_stream(&self, workflow_id: &str) -> Option<watch::Receiver<()>> {
        self.shared.store.watch_stream(workflow_id)
    }

    /// Settles an effect whose outcome is unknown (`awaiting_operator`, or still being
    /// reconciled): the decision is journaled with the operator's name and the workflow goes on.
    /// About an effect an earlier run of the workflow left (it continued as new, or was reset),
    /// it reaches the command of the current run that took the record over, if one did, and
    /// otherwise settles the operation's record alone, a `prepared` one a reset discarded
    /// included. Of a workflow that has ended, the store settles the record, a `prepared` one
    /// included. A `prepared` record of the current run is refused: its call is in flight, or
    /// the run resumes it through its reconciler.
    ///
    /// The decision is refused once the record has moved on from what it was made `on`: to
    /// another attempt, or, with a revision, through any transition at all.
    pub async fn resolve_operation(
        &self,
        key: &str,
        on: DecidedOn,
        decision: OperatorDecision,
        operator: &str,
    ) -> Result<(), ResolveError> {
        let by = ReconciledBy::Operator(operator.to_owned());
        self.shared.resolve_operation(key, on, decision, by).await
    }

    /// The downstream reports the outcome of the effect under `key` (a webhook), as `source`:
    /// applied like an operator's decision while the outcome is unknown, journaled as settled
    /// by the downstream. A repeated delivery of the same committed result is
    /// [`Settlement::Duplicate`] and changes nothing; any other report about a settled
    /// operation is refused.
    ///
    /// With `attempt` (the one the downstream was called with, `ActivityContext::attempt`), a
    /// report about an earlier attempt is refused rather than applied to a later one.
    pub async fn settle_operation(
        &self,
        key: &str,
        attempt: Option<u32>,
        decision: OperatorDecision,
        source: &str,
    ) -> Result<Settlement, ResolveError> {
        self.shared
            .settle_operation(key, attempt, decision, source)
            .await
    }

    /// Workflows that could not be recovered on start, with why: records that do not decode
    /// (left untouched on disk), and runs recovery found stuck (unknown workflow names,
    /// corrupt journals, code that no longer matches), listed once their replay found it.
    pub fn recovery_errors(&self) -> Vec<(String, RunError)> {
        lock(&self.shared.recovery_errors).clone()
    }

    /// The durable timers `workflow_id` has in the store: sleeps and approval expiries it
    /// still waits for.
    pub fn pending_timers(&self, workflow_id: &str) -> Result<Vec<TimerKey>, StoreError> {
        let timers = self.shared.store.timers()?;
        Ok(timers
            .into_iter()
            .filter(|t| t.workflow_id == workflow_id)
            .collect())
    }

    /// Resolves once this worker's leases in a shared store lapsed (a pause or a partition
    /// longer than the lease): every run has stopped, other workers go on with them, and the
    /// process should exit. Never resolves on a store one process owns.
    pub async fn lapsed(&self) {
        self.on_lapse().await
    }

    /// [`Worker::lapsed`] as a future of its own, for a server that takes the worker.
    pub fn on_lapse(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut lapsed = self.shared.lapsed.subscribe();
        async move {
            if lapsed.wait_for(|gone| *gone).await.is_err() {
                std::future::pending::<()>().await
            }
        }
    }

    /// The id this worker is known by in a shared store (`None`: the store is its own).
    pub fn worker_id(&self) -> Option<String> {
        let leases = self.shared.leases.as_ref();
        leases.map(|leases| leases.worker_id().to_owned())
    }

    /// How many workflows are in memory now, counting those still parking on the way out
    /// (evicted and parked ones are not).
    pub fn resident_workflows(&self) -> usize {
        self.shared.router.len()
    }

    /// What a resident workflow holds in memory; `None` if it is not resident (evicted or
    /// ended), since then it holds nothing.
    pub async fn footprint(&self, workflow_id: &str) -> Option<RunFootprint> {
        let sender = self.shared.router.mailbox(workflow_id)?;
        let (reply, answer) = oneshot::channel();
        sender.send(Mail::Footprint { reply }).ok()?;
        answer.await.ok()
    }

    /// The worker's clock.
    pub fn clock(&self) -> Arc<dyn Clock> {
        self.shared.clock.clone()
    }

    /// Stops every task and closes the store. Every step a workflow took is already durable, so
    /// stopping anywhere loses nothing: the next start resumes each workflow by replay.
    pub async fn shutdown(self) {
        self.shared.stop_tasks().await;
        // The store closes with its last handle: the writer is joined and the memtables are
        // flushed (its checkpoint at close), disk work kept off the async threads.
        let closing = tokio::task::spawn_blocking(move || drop(self));
        let _ = closing.await;
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Taken, so that nothing starts after; dropping the set aborts every task in it.
        let tasks = lock(&self.shared.tasks).take();
        drop(tasks);
    }
}

/// A handle that does not keep the worker alive.
#[derive(Clone)]
pub struct WeakWorker(Weak<WorkerState>);

impl WeakWorker {
    /// Waits for the workflow's end; `ShutDown` if the worker is gone.
    pub async fn result(&self, workflow_id: &str) -> Outcome {
        let Some(shared) = self.0.upgrade() else {
            return Err(RunError::ShutDown);
        };
        let waiting = shared.subscribe(workflow_id).await;
        drop(shared);
        wait_outcome(waiting).await
    }
}

#[cfg(feature = "rocksdb")]
async fn open_store(
    dir: &Path,
    codec: Option<Arc<dyn Codec>>,
) -> Result<Arc<dyn Store>, StoreError> {
    let dir = dir.to_owned();
    // Opening replays RocksDB's WAL, which can take a while: keep it off the async threads.
    let open =
        tokio::task::spawn_blocking(move || crate::store::RocksStore::open_with_codec(&dir, codec));
    let store = open
        .await
        .map_err(|e| StoreError::Backend(format!("store open task failed: {e}")))??;
    Ok(Arc::new(store))
}

#[cfg(not(feature = "rocksdb"))]
async fn open_store(dir: &Path, _: Option<Arc<dyn Codec>>) -> Result<Arc<dyn Store>, StoreError> {
    Err(StoreError::Backend(format!(
        "this build has no embedded store (the `rocksdb` feature is off), so the data dir \
         `{}` cannot be opened: give the worker a store",
        dir.display()
    )))
}

impl WorkerState {
    /// Runs a read of the store on the blocking pool: the store's reads block on disk, and no
    /// tokio worker thread may wait on it.
    pub(crate) async fn blocking<T, F>(&self, read: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&dyn Store) -> T + Send + 'static,
    {
        crate::executor::read_on_blocking_pool(self.store.clone(), &self.in_flight, read)
            .await
            .map_err(|e| StoreError::Backend(format!("a store read failed to run: {e}")))
    }

    /// [`WorkerState::blocking`] for a read that can fail.
    pub(crate) async fn read<T, F>(&self, read: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&dyn Store) -> Result<T, StoreError> + Send + 'static,
    {
        self.blocking(read).await?
    }

    /// Whether this worker has begun stopping: it starts nothing from then on.
    fn is_stopping(&self) -> bool {
        lock(&self.tasks).is_none()
    }

    fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        if let Some(tasks) = lock(&self.tasks).as_mut() {
            // The set keeps a finished task until it is joined: reap them, or every run ever
            // spawned stays in memory.
            while tasks.try_join_next().is_some() {}
            tasks.spawn(task);
        }
    }

    async fn stop_tasks(&self) {
        let Some(mut tasks) = lock(&self.tasks).take() else {
            return;
        };
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        // The executors are gone, so no attempt starts any more; the ones they started were
        // asked to abort when their executor dropped them.
        self.in_flight.close();
        self.in_flight.wait().await;
        self.release_leases().await;
    }
}
