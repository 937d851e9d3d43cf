//! The worker: owns the store, recovers in-flight workflows on start, routes events to resident
//! workflows (rebuilding evicted ones by replay), fires durable timers, and answers callers.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio_util::task::TaskTracker;
use tracing::{error, info};

use crate::clock::{Clock, SystemClock};
use crate::entropy::{Entropy, OsEntropy};
use crate::error::StuckRun;
use crate::error::{
    ApprovalError, CancelError, ResolveError, RunError, SignalError, StartError, Unreachable,
};
pub use crate::executor::RunFootprint;
use crate::executor::{run_workflow, Mail};

mod host;
use crate::inbox::{InboxMessage, SignalOutcome};
use crate::journal::{Entry, Failure, FailureKind, Payload, WorkflowStarted};
use crate::keys::{TimerKey, MAX_ID_LEN};
use crate::machines::{Commands, Conflict};
use crate::operations::{key_prefix, OperationRecord, OperationStatus, OperatorDecision};
use crate::registry::Registry;
use crate::store::{
    off_async_thread, OperationListing, RunStop, Store, StoreError, Transition, WorkflowRecord,
    WorkflowStatus,
};
use crate::sync::lock;
use crate::telemetry::{Telemetry, Wake};

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
}

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
    outcomes: Mutex<Outcomes>,
    /// Runs found stuck, and when an event may rebuild each again.
    stuck: Mutex<HashMap<String, StuckBackoff>>,
    /// Workflows recovery could not resume: unreadable records, and runs recovery found stuck.
    recovery_errors: Mutex<Vec<(String, RunError)>>,
    /// Executors and the worker's services; `None` once stopping, so nothing starts after.
    tasks: Mutex<Option<JoinSet<()>>>,
    /// Attempts, reconcilers and retry timers that executors started: shutdown waits for them
    /// too, so that the store is closed (its lock released) when it returns.
    pub(crate) in_flight: TaskTracker,
    /// Where executors ask for what they replay (grouped reads, see `executor/loads.rs`).
    pub(crate) loads: crate::executor::Loads,
    myself: Weak<WorkerState>,
}

/// A running worker. Dropping it without [`Worker::shutdown`] aborts its tasks too, but
/// cannot wait for them: the store closes once the last of them is gone.
pub struct Worker {
    shared: Arc<WorkerState>,
}

/// When a stuck run may be rebuilt again: its code cannot change within a process, so an event
/// replays it only after a growing pause (and every worker start tries it at once).
#[derive(Debug, Clone, Copy)]
struct StuckBackoff {
    /// When the hold ends; `None` once the run replayed cleanly and was released. The pause it
    /// reached is kept until the run ends, so a stop that comes back after a clean replay (an
    /// activity this worker does not host, found when it is restarted) waits longer each time
    /// instead of replaying every second.
    retry_at: Option<Instant>,
    pause: Duration,
}

/// How many runs are held as stuck now.
fn held_count(stuck: &HashMap<String, StuckBackoff>) -> usize {
    stuck
        .values()
        .filter(|held| held.retry_at.is_some())
        .count()
}

/// The first pause after a run was found stuck, and the longest.
const STUCK_PAUSE_FIRST: Duration = Duration::from_secs(1);
const STUCK_PAUSE_MAX: Duration = Duration::from_secs(300);

impl Worker {
    /// Opens the store, recovers every in-flight workflow and starts the timer service.
    pub async fn start(config: WorkerConfig) -> Result<Self, StoreError> {
        let store: Arc<dyn Store> = match config.store {
            Some(store) => store,
            None => open_store(&config.data_dir).await?,
        };
        let recovery = store.clone();
        let read = move || {
            off_async_thread(|| Ok::<_, StoreError>((recovery.workflows()?, recovery.timers()?)))
        };
        let (listing, pending_timers) = tokio::task::spawn_blocking(read)
            .await
            .map_err(|e| StoreError::Backend(format!("recovery read failed to run: {e}")))??;
        let (timer_tx, timer_rx) = mpsc::unbounded_channel();
        let (loads, load_requests) = crate::executor::loads();
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
            timers: TimerHandle(timer_tx),
            outcomes: Mutex::new(Outcomes::default()),
            stuck: Mutex::default(),
            recovery_errors: Mutex::default(),
            tasks: Mutex::new(Some(JoinSet::new())),
            in_flight: TaskTracker::new(),
            loads,
            myself: myself.clone(),
        });
        // Recovery first: an overdue timer firing before it would start its workflow as woken
        // by an event, not as recovered. Timers scheduled meanwhile wait in the channel.
        // This worker knows of no stuck run yet; recovery finds them again.
        shared.telemetry.workflows_stuck(0);
        let store = shared.store.clone();
        shared.spawn(crate::executor::run_loads(
            store,
            load_requests,
            shared.in_flight.clone(),
        ));
        shared.recover(listing);
        let timer_service = run_timers(Arc::downgrade(&shared), timer_rx, pending_timers);
        shared.spawn(timer_service);
        shared.spawn(upkeep(shared.telemetry.clone()));
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

    /// The workflow's record.
    pub fn workflow(&self, workflow_id: &str) -> Result<Option<WorkflowRecord>, StoreError> {
        self.shared.store.workflow(workflow_id)
    }

    /// Every workflow with its record (or why its record does not decode).
    pub fn workflows(&self) -> Result<crate::store::WorkflowListing, StoreError> {
        self.shared.store.workflows()
    }

    /// Store write statistics (synced batches, transitions).
    pub fn write_stats(&self) -> Option<crate::store::WriteStats> {
        self.shared.store.write_stats()
    }

    /// The operation log of `workflow_id`, by idempotency key.
    pub fn operations(&self, workflow_id: &str) -> Result<OperationListing, StoreError> {
        self.shared.store.operations(&key_prefix(workflow_id))
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
            .signal(workflow_id, name, signal_id, payload)
            .await
    }

    /// A workflow's signals not delivered yet, oldest first.
    pub fn inbox(&self, workflow_id: &str) -> Result<Vec<InboxMessage>, StoreError> {
        let inbox = self.shared.store.inbox(workflow_id, 0)?;
        Ok(inbox.into_iter().map(|(_, message)| message).collect())
    }

    /// Cancels a running workflow: it ends as failed (`Cancelled`, with `reason`) wherever it
    /// is. Attempts in flight are dropped; effects they left unsettled keep their operation
    /// records for inspection.
    pub async fn cancel(&self, workflow_id: &str, reason: &str) -> Result<(), CancelError> {
        self.shared.cancel(workflow_id, reason).await
    }

    /// The replay-safety metrics this worker counts.
    pub fn telemetry(&self) -> &Telemetry {
        &self.shared.telemetry
    }

    /// The artifact with this hash.
    pub fn artifact(
        &self,
        hash: &crate::journal::Digest,
    ) -> Result<Option<crate::artifacts::ArtifactRecord>, StoreError> {
        self.shared.store.artifact(hash)
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

    /// Changes after every later write of stream events or of the end of `workflow_id`;
    /// subscribe before reading the stream, and nothing written after the read is missed.
    /// `None` when the store cannot tell (then poll).
    pub fn watch_stream(&self, workflow_id: &str) -> Option<watch::Receiver<()>> {
        self.shared.store.watch_stream(workflow_id)
    }

    /// Settles an effect whose outcome is unknown (`awaiting_operator`, or still being
    /// reconciled): the decision is journaled with the operator's name and the workflow goes on.
    ///
    /// With `attempt`, the decision is refused unless the operation is still at that attempt.
    pub async fn resolve_operation(
        &self,
        key: &str,
        attempt: Option<u32>,
        decision: OperatorDecision,
        operator: &str,
    ) -> Result<(), ResolveError> {
        self.shared
            .resolve_operation(key, attempt, decision, operator)
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

    /// How many workflows are in memory now (evicted ones are not).
    pub fn resident_workflows(&self) -> usize {
        self.shared.router.len()
    }

    /// What a resident workflow holds in memory; `None` if it is not resident (evicted or
    /// ended), since then it holds nothing.
    pub async fn footprint(&self, workflow_id: &str) -> Option<RunFootprint> {
        let sender = lock(&self.shared.router.live).get(workflow_id).cloned()?;
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

/// Keeps the worker's histograms drained whether or not anyone scrapes them.
async fn upkeep(telemetry: Telemetry) {
    let mut every = tokio::time::interval(Duration::from_secs(10));
    loop {
        every.tick().await;
        telemetry.upkeep();
    }
}

#[cfg(feature = "rocksdb")]
async fn open_store(dir: &Path) -> Result<Arc<dyn Store>, StoreError> {
    let dir = dir.to_owned();
    // Opening replays RocksDB's WAL, which can take a while: keep it off the async threads.
    let open = tokio::task::spawn_blocking(move || crate::store::RocksStore::open(&dir));
    let store = open
        .await
        .map_err(|e| StoreError::Backend(format!("store open task failed: {e}")))??;
    Ok(Arc::new(store))
}

#[cfg(not(feature = "rocksdb"))]
async fn open_store(dir: &Path) -> Result<Arc<dyn Store>, StoreError> {
    Err(StoreError::Backend(format!(
        "this build has no embedded store (the `rocksdb` feature is off), so the data dir \
         `{}` cannot be opened: give the worker a store",
        dir.display()
    )))
}

impl WorkerState {
    fn recover(&self, listing: crate::store::WorkflowListing) {
        let mut errors = Vec::new();
        let mut resumed = 0;
        for (id, record) in listing {
            match record {
                Ok(record) if !record.status.is_terminal() => {
                    let wake = Wake::Recovered {
                        since: self.started_at,
                    };
                    self.router.ensure_running(self, &id, wake);
                    resumed += 1;
                }
                Ok(_) => {}
                Err(e) => {
                    error!(workflow_id = %id, error = %e, "cannot recover workflow");
                    errors.push((id, RunError::Store(e)));
                }
            }
        }
        info!(resumed, failed = errors.len(), "recovery scheduled");
        lock(&self.recovery_errors).extend(errors);
    }

    /// Runs a read of the store on the blocking pool: the store's reads block on disk, and no
    /// tokio worker thread may wait on it.
    pub(crate) async fn blocking<T, F>(&self, read: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&dyn Store) -> T + Send + 'static,
    {
        let store = self.store.clone();
        // The read holds the store: a shutdown waits for it, so that the store is closed when
        // the shutdown returns, even if the read's caller is gone.
        let token = self.in_flight.token();
        let task = tokio::task::spawn_blocking(move || {
            let value = off_async_thread(|| read(store.as_ref()));
            drop((store, token));
            value
        });
        task.await
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

    async fn start_workflow(
        &self,
        name: &str,
        input: Payload,
        options: StartOptions,
    ) -> Result<Started, StartError> {
        let workflow = self
            .registry
            .workflow(name)
            .ok_or_else(|| StartError::UnknownWorkflow(name.to_owned()))?;
        (workflow.check_input)(&input).map_err(|message| StartError::InvalidInput {
            workflow: name.to_owned(),
            message,
        })?;
        if let Some(request_id) = &options.request_id {
            check_id("request id", request_id)?;
            if let Some(found) = self.existing_for_request(request_id, name, &input).await? {
                return Ok(found);
            }
        }
        let workflow_id = match options.workflow_id.clone().or(options.request_id.clone()) {
            Some(id) => id,
            None => format!("{name}-{:016x}", rand::random::<u64>()),
        };
        check_id("workflow id", &workflow_id)?;
        let transition = self.start_transition(name, &workflow_id, input.clone(), &options);
        match self.store.commit(transition).await {
            Ok(()) => {}
            Err(StoreError::Conflict { .. }) => {
                return self
                    .resolve_start_race(name, &workflow_id, &input, &options)
                    .await;
            }
            Err(e) => return Err(e.into()),
        }
        self.telemetry.workflow_started(&workflow_id);
        self.router
            .ensure_running(self, &workflow_id, Wake::Started);
        Ok(Started {
            workflow_id,
            existed: false,
        })
    }

    /// Two starts raced for the same request or workflow id; the loser reports the winner.
    async fn resolve_start_race(
        &self,
        name: &str,
        workflow_id: &str,
        input: &Payload,
        options: &StartOptions,
    ) -> Result<Started, StartError> {
        if let Some(request_id) = &options.request_id {
            if let Some(found) = self.existing_for_request(request_id, name, input).await? {
                return Ok(found);
            }
        }
        Err(StartError::IdInUse(workflow_id.to_owned()))
    }

    async fn existing_for_request(
        &self,
        request_id: &str,
        name: &str,
        input: &Payload,
    ) -> Result<Option<Started>, StartError> {
        let request = request_id.to_owned();
        let owner = self
            .read(move |store| {
                let Some(workflow_id) = store.request(&request)? else {
                    return Ok(None);
                };
                let record = store.workflow(&workflow_id)?;
                Ok(Some((workflow_id, record)))
            })
            .await?;
        let Some((workflow_id, record)) = owner else {
            return Ok(None);
        };
        let record = record.ok_or_else(|| {
            StartError::Store(StoreError::Backend(format!(
                "request `{request_id}` points at missing workflow `{workflow_id}`"
            )))
        })?;
        let conflict = |what| StartError::RequestConflict {
            request_id: request_id.to_owned(),
            workflow_id: workflow_id.clone(),
            what,
        };
        if record.workflow_name != name {
            return Err(conflict("name"));
        }
        if record.input_digest != input.digest() {
            return Err(conflict("input"));
        }
        Ok(Some(Started {
            workflow_id,
            existed: true,
        }))
    }

    fn start_transition(
        &self,
        name: &str,
        workflow_id: &str,
        input: Payload,
        options: &StartOptions,
    ) -> Transition {
        let record = WorkflowRecord::new(name, options.request_id.clone(), input.digest());
        let started = Entry::WorkflowStarted(WorkflowStarted {
            workflow_name: name.to_owned(),
            input,
            request_id: options.request_id.clone(),
            started_at_ms: self.clock.now_ms(),
        });
        let mut transition = Transition::append(workflow_id, &record, vec![started]);
        transition.claim_request = options.request_id.clone();
        transition
    }

    async fn result(&self, workflow_id: &str) -> Outcome {
        wait_outcome(self.subscribe(workflow_id).await).await
    }

    async fn resolve_operation(
        &self,
        key: &str,
        expected_attempt: Option<u32>,
        decision: OperatorDecision,
        operator: &str,
    ) -> Result<(), ResolveError> {
        let owned = key.to_owned();
        let record = self
            .read(move |store| store.operation(&owned))
            .await?
            .ok_or_else(|| ResolveError::UnknownOperation(key.to_owned()))?;
        let settleable = matches!(
            record.status,
            OperationStatus::AwaitingOperator { .. } | OperationStatus::UnknownOutcome { .. }
        );
        if !settleable {
            return Err(ResolveError::NotAwaitingOperator {
                key: key.to_owned(),
                status: record.status.name(),
            });
        }
        if let Some(decided) = expected_attempt.filter(|a| *a != record.attempt) {
            return Err(ResolveError::StaleAttempt {
                key: key.to_owned(),
                decided,
                current: record.attempt,
            });
        }
        self.check_decided_result(key, &record, &decision)?;
        let (reply, answer) = oneshot::channel();
        let event = Mail::ResolveOperation {
            seq: record.seq,
            attempt: record.attempt,
            decision,
            operator: operator.to_owned(),
            reply,
        };
        self.router.deliver(self, &record.workflow_id, event);
        answer.await.unwrap_or_else(|_| {
            let why = "it stopped before applying the decision";
            Err(Unreachable::not_running(&record.workflow_id, why).into())
        })
    }

    async fn cancel(&self, workflow_id: &str, reason: &str) -> Result<(), CancelError> {
        let record = self.workflow_record(workflow_id).await?;
        let record = record.ok_or_else(|| unknown_workflow(workflow_id))?;
        if record.status.is_terminal() {
            return Err(CancelError::Ended(workflow_id.to_owned()));
        }
        let failure = Failure::new(FailureKind::Cancelled, reason);
        if !self.router.is_resident(workflow_id) {
            // Not in memory (waiting, or stopped by a divergence): end it in the store, so that
            // nothing is replayed or restarted just to be cancelled. A run that started
            // meanwhile makes the append conflict; then it is asked instead.
            match self
                .cancel_in_store_detached(workflow_id, record, failure.clone())
                .await
            {
                Err(StoreError::Conflict { .. }) => {}
                ended => return Ok(ended?),
            }
        }
        let (reply, done) = oneshot::channel();
        let event = Mail::Cancel { failure, reply };
        self.router.deliver(self, workflow_id, event);
        let answer = done.await;
        answer.unwrap_or_else(|_| {
            let why = "it stopped before the cancellation was applied";
            Err(Unreachable::not_running(workflow_id, why).into())
        })
    }

    /// [`WorkerState::cancel_in_store`] on a task of its own: a caller that goes away (an HTTP
    /// client disconnecting) cannot stop it between the write and the publication.
    async fn cancel_in_store_detached(
        &self,
        workflow_id: &str,
        record: WorkflowRecord,
        failure: Failure,
    ) -> Result<(), StoreError> {
        let shared = self.myself.upgrade().ok_or(StoreError::Closed)?;
        let id = workflow_id.to_owned();
        let task = tokio::spawn(async move { shared.cancel_in_store(&id, &record, failure).await });
        task.await.unwrap_or(Err(StoreError::Closed))
    }

    async fn cancel_in_store(
        &self,
        workflow_id: &str,
        record: &WorkflowRecord,
        failure: Failure,
    ) -> Result<(), StoreError> {
        let id = workflow_id.to_owned();
        let journal = self.read(move |store| store.journal(&id)).await?;
        let ending = self.ending(workflow_id);
        let entry = Entry::WorkflowFailed {
            failure: failure.clone(),
        };
        let mut transition = Transition::append(workflow_id, record, vec![entry]);
        transition.record.status = WorkflowStatus::Failed;
        transition.record.stop = None;
        let timers = open_timers(workflow_id, &journal)?;
        transition.remove_timers = timers.clone();
        self.store.commit(transition).await?;
        for timer in timers {
            self.timers.cancel(timer);
        }
        self.forget_stuck(workflow_id);
        let stats = crate::telemetry::journal_stats(&journal);
        let cancelled = Some(FailureKind::Cancelled.name());
        self.telemetry
            .workflow_ended(workflow_id, &stats, cancelled);
        ending.publish(Err(RunError::Failed(failure)));
        Ok(())
    }

    async fn decide_approval(
        &self,
        workflow_id: &str,
        request: Option<u32>,
        hash: &str,
        approver: &str,
        verdict: crate::artifacts::ApprovalVerdict,
    ) -> Result<(), ApprovalError> {
        let digest = crate::journal::Digest::parse_hex(hash)
            .ok_or_else(|| ApprovalError::MalformedHash(hash.to_owned()))?;
        let record = self.workflow_record(workflow_id).await?;
        let record = record.ok_or_else(|| unknown_workflow(workflow_id))?;
        if record.status.is_terminal() {
            return Err(ApprovalError::NotPending(workflow_id.to_owned()));
        }
        let (reply, answer) = oneshot::channel();
        let event = Mail::DecideApproval {
            hash: digest,
            request,
            approver: approver.to_owned(),
            verdict,
            reply,
        };
        self.router.deliver(self, workflow_id, event);
        if let Ok(answer) = answer.await {
            return answer;
        }
        // No answer: the run ended (its end won the race) or stopped before the decision.
        let record = self.workflow_record(workflow_id).await?;
        if record.is_some_and(|r| r.status.is_terminal()) {
            return Err(ApprovalError::NotPending(workflow_id.to_owned()));
        }
        let why = "it stopped before applying the decision";
        Err(Unreachable::not_running(workflow_id, why).into())
    }

    async fn signal(
        &self,
        workflow_id: &str,
        name: &str,
        signal_id: &str,
        payload: Payload,
    ) -> Result<SignalOutcome, SignalError> {
        if signal_id.is_empty() {
            return Err(SignalError::MissingId);
        }
        let (id, signal) = (workflow_id.to_owned(), signal_id.to_owned());
        let (record, seen) = self
            .read(move |store| Ok((store.workflow(&id)?, store.signal_seen(&id, &signal)?)))
            .await?;
        let record = record.ok_or_else(|| unknown_workflow(workflow_id))?;
        if record.status.is_terminal() {
            return Err(ended_signal(workflow_id, record.status));
        }
        if seen {
            return Ok(SignalOutcome::Duplicate);
        }
        let message = InboxMessage {
            name: name.to_owned(),
            signal_id: signal_id.to_owned(),
            payload,
            sent_at_ms: self.clock.now_ms(),
        };
        match self.store.send_signal(workflow_id, message).await {
            Ok(()) => {
                self.router.deliver(self, workflow_id, Mail::SignalArrived);
                Ok(SignalOutcome::Accepted)
            }
            Err(StoreError::Conflict { .. }) => Ok(SignalOutcome::Duplicate),
            // The workflow ended between the check above and the write.
            Err(StoreError::Ended { .. }) => {
                let record = self.workflow_record(workflow_id).await?;
                let status = record.map_or(WorkflowStatus::Completed, |r| r.status);
                Err(ended_signal(workflow_id, status))
            }
            Err(error) => Err(error.into()),
        }
    }

    async fn workflow_record(
        &self,
        workflow_id: &str,
    ) -> Result<Option<WorkflowRecord>, StoreError> {
        let id = workflow_id.to_owned();
        self.read(move |store| store.workflow(&id)).await
    }

    /// A "committed" decision must carry a result of the effect's output type: journaled, a
    /// wrong shape would fail every replay of the workflow.
    fn check_decided_result(
        &self,
        key: &str,
        record: &OperationRecord,
        decision: &OperatorDecision,
    ) -> Result<(), ResolveError> {
        let OperatorDecision::Committed(result) = decision else {
            return Ok(());
        };
        let effect = self
            .registry
            .activity(&record.operation)
            .and_then(|a| a.effect.as_ref());
        let Some(effect) = effect else {
            let why = format!("effect `{}` is not registered here", record.operation);
            return Err(Unreachable::not_running(&record.workflow_id, why).into());
        };
        (effect.check_output)(result).map_err(|message| ResolveError::ResultMismatch {
            key: key.to_owned(),
            operation: record.operation.clone(),
            message,
        })
    }

    /// Subscribes to the workflow's outcome; if it already ended, the outcome is read from the
    /// journal. Subscribing before reading the store means an end in between is not missed.
    async fn subscribe(&self, workflow_id: &str) -> watch::Receiver<Option<Outcome>> {
        let (receiver, settled) = {
            let mut outcomes = lock(&self.outcomes);
            let receiver = outcomes.sender(workflow_id).subscribe();
            let settled = receiver.borrow().is_some() || outcomes.is_ending(workflow_id);
            (receiver, settled)
        };
        if !settled {
            if let Some(outcome) = self.recorded_outcome(workflow_id).await {
                self.publish_recorded(workflow_id, outcome);
            }
        }
        receiver
    }

    /// Publishes an outcome read from the store, unless the end that wrote it is still being
    /// counted: then its own publication follows, after the telemetry.
    fn publish_recorded(&self, workflow_id: &str, outcome: Outcome) {
        let mut outcomes = lock(&self.outcomes);
        if !outcomes.is_ending(workflow_id) {
            outcomes.settle(workflow_id, outcome);
        }
    }

    /// Marks the workflow's end as being committed and counted until the guard drops. Readers
    /// meanwhile wait for the publication instead of reading the end from the store, so that
    /// whoever sees a workflow's outcome also sees its end-of-run telemetry.
    pub(crate) fn ending(&self, workflow_id: &str) -> EndingGuard<'_> {
        let mut outcomes = lock(&self.outcomes);
        *outcomes.ending.entry(workflow_id.to_owned()).or_default() += 1;
        EndingGuard {
            shared: self,
            workflow_id: workflow_id.to_owned(),
            marked: true,
        }
    }

    /// What the store says of a workflow that is not running here: its end, or that it is
    /// stuck. `None` while it runs (or while a run that may resume it is replaying).
    async fn recorded_outcome(&self, workflow_id: &str) -> Option<Outcome> {
        let record = match self.workflow_record(workflow_id).await {
            Ok(Some(record)) => record,
            Ok(None) => return Some(Err(RunError::UnknownWorkflow(workflow_id.to_owned()))),
            Err(e) => return Some(Err(e.into())),
        };
        if let Some(stop) = record
            .stop
            .clone()
            .filter(|_| !self.router.is_resident(workflow_id))
        {
            return Some(Err(stuck(workflow_id, stop)));
        }
        self.outcome_of_ended(workflow_id, &record).await
    }

    /// The journaled outcome if `record` says the workflow ended.
    async fn outcome_of_ended(
        &self,
        workflow_id: &str,
        record: &WorkflowRecord,
    ) -> Option<Outcome> {
        if !record.status.is_terminal() {
            return None;
        }
        let id = workflow_id.to_owned();
        let journal = match self.read(move |store| store.journal(&id)).await {
            Ok(journal) => journal,
            Err(e) => return Some(Err(e.into())),
        };
        match journal.into_iter().last() {
            Some(Entry::WorkflowCompleted { output }) => Some(Ok(output)),
            Some(Entry::WorkflowFailed { failure }) => Some(Err(RunError::Failed(failure))),
            _ => Some(Err(RunError::Failed(Failure::new(
                crate::journal::FailureKind::Terminal,
                "record says ended but the journal has no end entry",
            )))),
        }
    }

    /// A run stopped with `error`. A stop that is the run's own (its code, its journal, the
    /// worker not hosting it) makes it stuck, durably; any other (a shutdown, an injected
    /// crash, a failed store) leaves it to resume on the next start. Should the workflow have
    /// ended meanwhile (a cancellation written while the run was loading makes its next write
    /// conflict), the recorded end is the answer, not the run's error.
    pub(crate) async fn run_stopped(&self, workflow_id: &str, wake: Wake, error: RunError) {
        let Some(record) = self.unless_ended(workflow_id).await else {
            return;
        };
        // Stuck is a state of a workflow that exists; without a record there is nothing to hold.
        let (Some(code), Some(record)) = (error.stop_code(), record) else {
            self.publish(workflow_id, Err(error), Durability::InMemory);
            return;
        };
        let stop = RunStop {
            code,
            seq: error.stop_seq(),
            message: error.to_string(),
            at_ms: self.clock.now_ms(),
        };
        if let Err(error) = self.record_stuck(workflow_id, record, &stop).await {
            error!(workflow_id, %error, "cannot record that the workflow is stuck");
        }
        if !self.still_stopped(workflow_id).await {
            return;
        }
        self.hold_stuck(workflow_id);
        if matches!(wake, Wake::Recovered { .. }) {
            lock(&self.recovery_errors).push((workflow_id.to_owned(), error));
        }
        let outcome = Err(stuck(workflow_id, stop));
        self.publish(workflow_id, outcome, Durability::InMemory);
    }

    /// Writes that the run is stuck, unless its record says so already.
    async fn record_stuck(
        &self,
        workflow_id: &str,
        record: WorkflowRecord,
        stop: &RunStop,
    ) -> Result<(), StoreError> {
        let same = |old: &RunStop| {
            (old.code, old.seq, &old.message) == (stop.code, stop.seq, &stop.message)
        };
        if record.status == WorkflowStatus::Stuck && record.stop.as_ref().is_some_and(same) {
            return Ok(());
        }
        let mut transition = Transition::append(workflow_id, &record, Vec::new());
        transition.record.status = WorkflowStatus::Stuck;
        transition.record.stop = Some(stop.clone());
        self.store.commit(transition).await
    }

    /// The workflow's record, read again; `None` if it ended (its recorded end is published
    /// then). A record that cannot be read counts as not ended, with no record.
    async fn unless_ended(&self, workflow_id: &str) -> Option<Option<WorkflowRecord>> {
        let record = self.workflow_record(workflow_id).await.ok().flatten();
        if let Some(ended) = &record {
            if let Some(outcome) = self.outcome_of_ended(workflow_id, ended).await {
                self.publish_recorded(workflow_id, outcome);
                return None;
            }
        }
        Some(record)
    }

    /// Whether the run is still to be held as stopped once its stop was recorded (or could not
    /// be). Not if the workflow ended meanwhile (a cancellation: its end is published), nor if
    /// an event rebuilt it meanwhile: that run answers for the workflow now (and is held,
    /// should it stop the same way), and is asked to clear a stuck record it loaded too early
    /// to see.
    async fn still_stopped(&self, workflow_id: &str) -> bool {
        if self.unless_ended(workflow_id).await.is_none() {
            return false;
        }
        if self.router.is_resident(workflow_id) {
            self.router.deliver(self, workflow_id, Mail::Resume);
            return false;
        }
        true
    }

    /// Holds a stuck run back from rebuilds for a growing pause, counts it, and rebuilds it
    /// when the pause ends.
    fn hold_stuck(&self, workflow_id: &str) {
        let mut stuck = lock(&self.stuck);
        let pause = stuck.get(workflow_id).map_or(STUCK_PAUSE_FIRST, |held| {
            (held.pause * 2).min(STUCK_PAUSE_MAX)
        });
        let retry_at = Instant::now() + pause;
        let backoff = StuckBackoff {
            retry_at: Some(retry_at),
            pause,
        };
        stuck.insert(workflow_id.to_owned(), backoff);
        self.telemetry.workflows_stuck(held_count(&stuck));
        drop(stuck);
        self.retry_stuck_at(workflow_id, retry_at);
    }

    /// Rebuilds a stuck run at `retry_at`, as a failed workflow task is retried: a stop that
    /// does not repeat (a panic on a passing condition) ends by itself, and the rebuild sees
    /// what came while the run was held (a timer that fell due, a signal), which the events
    /// refused during the pause do not bring back. Nothing happens if the run was released or
    /// held again meanwhile: the later hold has its own retry.
    fn retry_stuck_at(&self, workflow_id: &str, retry_at: Instant) {
        let shared = self.myself.clone();
        let id = workflow_id.to_owned();
        self.spawn(async move {
            tokio::time::sleep_until(retry_at.into()).await;
            let Some(shared) = shared.upgrade() else {
                return;
            };
            let held = lock(&shared.stuck).get(&id).and_then(|held| held.retry_at);
            if held == Some(retry_at) {
                shared.router.deliver(&shared, &id, Mail::Resume);
            }
        });
    }

    /// The run replayed cleanly: it is no longer held or counted as stuck (the pause it reached
    /// is kept, see [`StuckBackoff`]).
    pub(crate) fn unstuck(&self, workflow_id: &str) {
        let mut stuck = lock(&self.stuck);
        let Some(held) = stuck.get_mut(workflow_id) else {
            return;
        };
        if held.retry_at.take().is_some() {
            self.telemetry.workflows_stuck(held_count(&stuck));
            lock(&self.outcomes).senders.remove(workflow_id);
        }
    }

    /// The workflow ended: nothing of its stops is kept.
    pub(crate) fn forget_stuck(&self, workflow_id: &str) {
        self.unstuck(workflow_id);
        lock(&self.stuck).remove(workflow_id);
    }

    /// Whether an event may rebuild `workflow_id` now: not while a stuck run's pause lasts.
    fn may_rebuild(&self, workflow_id: &str) -> bool {
        let stuck = lock(&self.stuck);
        let retry_at = stuck.get(workflow_id).and_then(|held| held.retry_at);
        retry_at.is_none_or(|at| Instant::now() >= at)
    }

    pub(crate) fn publish(&self, workflow_id: &str, outcome: Outcome, durability: Durability) {
        let mut outcomes = lock(&self.outcomes);
        match durability {
            Durability::Journaled => outcomes.settle(workflow_id, outcome),
            // An end being written wins: its writer publishes the journaled outcome.
            Durability::InMemory if outcomes.is_ending(workflow_id) => {}
            Durability::InMemory => {
                outcomes.sender(workflow_id).send_replace(Some(outcome));
            }
        }
    }

    fn spawn_executor(&self, workflow_id: &str, wake: Wake) -> mpsc::UnboundedSender<Mail> {
        let (events, mailbox) = mpsc::unbounded_channel();
        if let Some(shared) = self.myself.upgrade() {
            let id = workflow_id.to_owned();
            let run = run_workflow(shared, id, wake, mailbox, events.clone());
            self.spawn(run);
        }
        events
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
    }
}

async fn wait_outcome(mut receiver: watch::Receiver<Option<Outcome>>) -> Outcome {
    match receiver.wait_for(Option::is_some).await {
        Ok(outcome) => outcome.clone().unwrap_or(Err(RunError::ShutDown)),
        Err(_) => Err(RunError::ShutDown),
    }
}

fn stuck(workflow_id: &str, stop: RunStop) -> RunError {
    let workflow_id = workflow_id.to_owned();
    RunError::Stuck(Box::new(StuckRun { workflow_id, stop }))
}

/// What a command for a workflow id that names none hears.
fn unknown_workflow(workflow_id: &str) -> Unreachable {
    Unreachable::UnknownWorkflow(workflow_id.to_owned())
}

fn ended_signal(workflow_id: &str, status: WorkflowStatus) -> SignalError {
    SignalError::Ended {
        workflow_id: workflow_id.to_owned(),
        status: status.name().to_owned(),
    }
}

fn check_id(what: &'static str, id: &str) -> Result<(), StartError> {
    if id.is_empty() || id.len() > MAX_ID_LEN {
        return Err(StartError::BadId {
            what,
            len: id.len(),
            max: MAX_ID_LEN,
        });
    }
    Ok(())
}

/// Resident workflows' mailboxes. Sending and evicting both happen under the lock, so an event
/// never lands in the mailbox of an executor that has just decided to leave.
#[derive(Default)]
pub(crate) struct Router {
    live: Mutex<HashMap<String, mpsc::UnboundedSender<Mail>>>,
}

/// Who waits for which workflow's outcome, and which ends are still being committed.
#[derive(Default)]
struct Outcomes {
    senders: HashMap<String, watch::Sender<Option<Outcome>>>,
    /// Ends being committed and counted, with how many are under way: a cancel that lost to
    /// the executor's own end must not clear the executor's mark.
    ending: HashMap<String, usize>,
}

impl Outcomes {
    fn sender(&mut self, workflow_id: &str) -> &watch::Sender<Option<Outcome>> {
        self.senders
            .entry(workflow_id.to_owned())
            .or_insert_with(|| watch::Sender::new(None))
    }

    /// Answers the current waiters with a journaled outcome. The sender goes: later callers
    /// read the outcome from the store, current waiters keep it through their receivers. Only
    /// in-memory outcomes (a stopped run) must stay.
    fn settle(&mut self, workflow_id: &str, outcome: Outcome) {
        self.sender(workflow_id).send_replace(Some(outcome));
        self.senders.remove(workflow_id);
    }

    fn is_ending(&self, workflow_id: &str) -> bool {
        self.ending.contains_key(workflow_id)
    }

    fn unmark(&mut self, workflow_id: &str) {
        if let Some(count) = self.ending.get_mut(workflow_id) {
            *count -= 1;
            if *count == 0 {
                self.ending.remove(workflow_id);
            }
        }
    }
}

/// Holds a workflow's end back from readers of the store; see [`WorkerState::ending`].
pub(crate) struct EndingGuard<'a> {
    shared: &'a WorkerState,
    workflow_id: String,
    marked: bool,
}

impl EndingGuard<'_> {
    /// Publishes the journaled outcome and lifts the mark in one step, so that no reader can
    /// find the mark still set after the publication and wait for another.
    pub(crate) fn publish(mut self, outcome: Outcome) {
        let mut outcomes = lock(&self.shared.outcomes);
        outcomes.settle(&self.workflow_id, outcome);
        outcomes.unmark(&self.workflow_id);
        self.marked = false;
    }
}

impl Drop for EndingGuard<'_> {
    fn drop(&mut self) {
        if self.marked {
            lock(&self.shared.outcomes).unmark(&self.workflow_id);
        }
    }
}

/// Timers a journal still waits for (sleeps not fired, approval expiries not decided), as the
/// commands' machines fold it.
fn open_timers(workflow_id: &str, journal: &[Entry]) -> Result<Vec<TimerKey>, StoreError> {
    let commands = Commands::fold(journal).map_err(|conflict| {
        let (seq, message) = match conflict {
            Conflict::WaitKept { seq } => (seq, "a wait journaled as dropped".to_owned()),
            Conflict::Inconsistent { seq, message } => (seq, message),
        };
        StoreError::Corrupt {
            table: crate::store::Table::Journal,
            key: format!("{workflow_id}#{seq}"),
            source: crate::journal::DecodeError::Malformed(message),
        }
    })?;
    let timers = commands.timers().into_iter();
    let keys = timers.map(|(seq, fire_at_ms)| TimerKey {
        fire_at_ms,
        workflow_id: workflow_id.to_owned(),
        seq,
    });
    Ok(keys.collect())
}

impl Router {
    pub(crate) fn is_resident(&self, workflow_id: &str) -> bool {
        lock(&self.live).contains_key(workflow_id)
    }

    /// Delivers `event`, rebuilding the workflow by replay if it is not resident. An event
    /// for a stuck run inside its pause is refused, not replayed: durable state (a timer row,
    /// an inbox message) waits for the rebuild that comes after the pause or a restart.
    fn deliver(&self, shared: &WorkerState, workflow_id: &str, event: Mail) {
        let wake = Wake::Event {
            since: Instant::now(),
        };
        let mut live = lock(&self.live);
        if !live.contains_key(workflow_id) && !shared.may_rebuild(workflow_id) {
            drop(live);
            event.refuse(
                workflow_id,
                "it is stuck, and resumes when code that matches its journal is deployed",
            );
            return;
        }
        let sender = live
            .entry(workflow_id.to_owned())
            .or_insert_with(|| shared.spawn_executor(workflow_id, wake));
        if let Err(mpsc::error::SendError(event)) = sender.send(event) {
            // The executor ended between its last event and now; start a fresh one.
            let sender = shared.spawn_executor(workflow_id, wake);
            let _ = sender.send(event);
            live.insert(workflow_id.to_owned(), sender);
        }
    }

    fn ensure_running(&self, shared: &WorkerState, workflow_id: &str, wake: Wake) {
        let mut live = lock(&self.live);
        if !live.contains_key(workflow_id) {
            live.insert(
                workflow_id.to_owned(),
                shared.spawn_executor(workflow_id, wake),
            );
        }
    }

    /// Removes the executor if its mailbox is empty; `false` means an event arrived, stay.
    pub(crate) fn try_evict(
        &self,
        workflow_id: &str,
        mailbox: &mpsc::UnboundedReceiver<Mail>,
    ) -> bool {
        let mut live = lock(&self.live);
        if !mailbox.is_empty() {
            return false;
        }
        live.remove(workflow_id);
        true
    }

    /// Removes the executor whose mailbox `events` feeds. An executor started for the same
    /// workflow since (an event came after this one stopped reading) stays: removing it would
    /// let a third start beside it.
    pub(crate) fn remove(&self, workflow_id: &str, events: &mpsc::UnboundedSender<Mail>) {
        let mut live = lock(&self.live);
        if live
            .get(workflow_id)
            .is_some_and(|s| s.same_channel(events))
        {
            live.remove(workflow_id);
        }
    }

    fn len(&self) -> usize {
        lock(&self.live).len()
    }
}

/// What the timer service is asked to do.
enum TimerOp {
    Schedule(TimerKey),
    Cancel(TimerKey),
}

/// Schedules and cancels durable timers with the worker's timer service.
pub(crate) struct TimerHandle(mpsc::UnboundedSender<TimerOp>);

impl TimerHandle {
    pub(crate) fn schedule(&self, timer: TimerKey) {
        let _ = self.0.send(TimerOp::Schedule(timer));
    }

    /// The timer's row is gone (it was cancelled, or its workflow ended): it must not fire.
    pub(crate) fn cancel(&self, timer: TimerKey) {
        let _ = self.0.send(TimerOp::Cancel(timer));
    }
}

/// Fires timers in due order, whether or not their workflow is resident. The set is loaded from
/// the `timers` table on start, so timers survive restarts; a timer fired twice is harmless
/// because the executor only fires a timer that is still waiting.
async fn run_timers(
    shared: Weak<WorkerState>,
    mut schedule: mpsc::UnboundedReceiver<TimerOp>,
    initial: Vec<TimerKey>,
) {
    let mut due: BTreeSet<TimerKey> = initial.into_iter().collect();
    loop {
        let Some(clock) = shared.upgrade().map(|s| s.clock.clone()) else {
            return;
        };
        let next = due.first().map(|t| t.fire_at_ms);
        let sleep = clock.sleep_until(next.unwrap_or(u64::MAX));
        tokio::select! {
            op = schedule.recv() => match op {
                Some(TimerOp::Schedule(timer)) => { due.insert(timer); }
                Some(TimerOp::Cancel(timer)) => { due.remove(&timer); }
                None => return,
            },
            () = sleep, if next.is_some() => {
                let Some(shared) = shared.upgrade() else { return };
                fire_due(&shared, &mut due);
            }
        }
    }
}

fn fire_due(shared: &WorkerState, due: &mut BTreeSet<TimerKey>) {
    let now = shared.clock.now_ms();
    while due.first().is_some_and(|t| t.fire_at_ms <= now) {
        if let Some(timer) = due.pop_first() {
            let event = Mail::TimerDue { seq: timer.seq };
            shared.router.deliver(shared, &timer.workflow_id, event);
        }
    }
}
