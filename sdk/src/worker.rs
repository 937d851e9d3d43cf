//! The typed worker: build it, register workflows and activities, start runs, await results.

use crate::codec::{Codec, Keyring};
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use waymark_runtime::redact::Redaction;

use serde::de::DeserializeOwned;
use waymark_runtime::approvals::ApprovalScope;
use waymark_runtime::artifacts::{ApprovalVerdict, ArtifactRecord};
use waymark_runtime::clock::{Clock, SystemClock};
use waymark_runtime::entropy::{Entropy, OsEntropy, SeededEntropy};
use waymark_runtime::faults::FaultPlan;
use waymark_runtime::inbox::{InboxMessage, SignalOutcome};
use waymark_runtime::journal::{DecodeError, Entry, Payload};
use waymark_runtime::keys::TimerKey;
use waymark_runtime::operations::{
    render_operations, DecidedOn, OperationRecord, OperationStatus, OperatorDecision,
};
use waymark_runtime::render::render_journal;
use waymark_runtime::store::{Store, WorkflowRecord, WorkflowStatus};
use waymark_runtime::streams::StreamEvent;
use waymark_runtime::telemetry::Telemetry;
use waymark_runtime::worker::{self as rt, WeakWorker, WorkerConfig};

use crate::llm::{LlmConfig, LlmProvider, PriceTable, LLM_ACTIVITY};
use crate::{
    AckError, ActivityOptions, ApprovalError, CancelError, DeleteError, ForkError, Register,
    Registry, ResolveError, RunError, SignalError, StartError, StoreError, Workflow,
};

pub use waymark_runtime::worker::{ForkOptions, RunFootprint, StartOptions, INHERITED_BY};

/// Configures a [`Worker`].
pub struct WorkerBuilder {
    data_dir: PathBuf,
    clock: Arc<dyn Clock>,
    entropy: Arc<dyn Entropy>,
    eviction_threshold: Duration,
    sweep_interval: Duration,
    retention: Option<Duration>,
    registry: Registry,
    llm: Option<LlmConfig>,
    faults: Option<Arc<FaultPlan>>,
    telemetry: Option<Telemetry>,
    store: Option<Arc<dyn Store>>,
    codec: Option<Arc<dyn Codec>>,
    redaction: Redaction,
    max_payload_bytes: usize,
    #[cfg(feature = "mcp")]
    mcp: Vec<crate::mcp::McpTools>,
}

impl WorkerBuilder {
    /// Runs on `store` instead of the embedded RocksDB store in [`WorkerBuilder::data_dir`].
    pub fn store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = Some(store);
        self
    }

    /// Encrypts at rest: every value the embedded store writes (inputs, outputs, prompts,
    /// answers, signals, artifacts, streams) is sealed under the ring's first key and each
    /// names its key, so older keys listed after it still open what they sealed. Journal
    /// exports are sealed too.
    pub fn encryption(self, keys: Keyring) -> Self {
        self.codec(Arc::new(keys))
    }

    /// Seals stored values and exports with `codec`, a codec of your own (one that calls a
    /// key service, say); [`WorkerBuilder::encryption`] is the built-in one.
    pub fn codec(mut self, codec: Arc<dyn Codec>) -> Self {
        self.codec = Some(codec);
        self
    }

    /// Journals the JSON fields named here, at any depth of the input of an activity, effect
    /// or model call, as `redacted:sha256:…` only; the attempt itself gets the whole input.
    /// Workflow inputs, outputs and signals come back to the code on replay, and an effect's
    /// arguments in the operation log go to its reconciler: those are kept whole, and
    /// [`WorkerBuilder::encryption`] protects them.
    pub fn redact_fields<S: Into<String>>(mut self, fields: impl IntoIterator<Item = S>) -> Self {
        self.redaction = Redaction::fields(fields);
        self
    }

    /// The largest payload the worker journals, in bytes (16 MiB unless set): a workflow's
    /// input (a start over it is refused) and output (the workflow fails, saying so), a step's
    /// input (the step fails terminally without being called or journaled whole) and result
    /// (the step fails terminally; an effect's operation is recorded as committed all the
    /// same, since it happened). Each error names the step and both sizes.
    pub fn max_payload_bytes(mut self, bytes: usize) -> Self {
        self.max_payload_bytes = bytes;
        self
    }

    /// The model provider behind `ctx.llm` (an [`crate::llm::OpenAiCompatible`] server, or a
    /// [`crate::llm::ScriptedProvider`] in tests).
    pub fn llm(mut self, provider: impl LlmProvider) -> Self {
        self.llm = Some(LlmConfig::new(Arc::new(provider)));
        self
    }

    /// Hosts the tools of a connected MCP server, each as the activity `mcp.{server}.{tool}`,
    /// for agents that offer them ([`crate::agent::Agent::mcp`]).
    #[cfg(feature = "mcp")]
    pub fn mcp(mut self, tools: crate::mcp::McpTools) -> Self {
        self.mcp.push(tools);
        self
    }

    #[cfg(feature = "mcp")]
    fn register_mcp(&mut self) {
        if self.mcp.is_empty() {
            return;
        }
        for (name, activity) in self.mcp.iter().flat_map(|server| server.registrations()) {
            self.registry.add_builtin(&name, activity);
        }
        let tools = crate::mcp::tools_registration(&self.mcp);
        self.registry
            .add_builtin(crate::mcp::MCP_TOOLS_ACTIVITY, tools);
    }

    /// Prices per model, for the cost recorded with every model call. Call after `llm`.
    pub fn llm_prices(mut self, prices: PriceTable) -> Self {
        if let Some(config) = self.llm.as_mut() {
            config.prices = prices;
        }
        self
    }

    /// Retry policy and timeout of model calls (default: 4 attempts, backoff from 1 s). Call
    /// after `llm`.
    pub fn llm_options(mut self, options: ActivityOptions) -> Self {
        if let Some(config) = self.llm.as_mut() {
            config.options = options;
        }
        self
    }

    /// Where the embedded store lives (created if missing). Default `./waymark-data`.
    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.data_dir = dir.into();
        self
    }

    /// Adds a workflow or an activity.
    pub fn register(mut self, item: impl Register) -> Self {
        item.register_into(&mut self.registry);
        self
    }

    /// Injects the faults of `plan` (tests only: see [`crate::testing::TestEnv::with_faults`]).
    pub fn faults(mut self, plan: Arc<FaultPlan>) -> Self {
        self.faults = Some(plan);
        self
    }

    /// Counts the replay-safety metrics into `telemetry` instead of a fresh one: handed to a
    /// restarted worker, the figures go on across the restart.
    pub fn telemetry(mut self, telemetry: Telemetry) -> Self {
        self.telemetry = Some(telemetry);
        self
    }

    /// Replaces the system clock (tests use a [`crate::ManualClock`]).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Draws the new values of `ctx.random` and `ctx.uuid` from `seed` instead of the operating
    /// system: each value is derived from the seed, the workflow id and the command's seq, so a
    /// test or a simulation gets the same values on every run. Recorded values replay either way.
    pub fn seeded_random(mut self, seed: u64) -> Self {
        self.entropy = Arc::new(SeededEntropy::new(seed));
        self
    }

    /// A workflow whose only open commands are timers due later than this is evicted from
    /// memory and rebuilt by replay when one fires. Default 60 s.
    pub fn evict_after(mut self, threshold: Duration) -> Self {
        self.eviction_threshold = threshold;
        self
    }

    /// How often the reconciler of each operation awaiting a decision (parked by its run, or
    /// left by a run that ended, continued as new or was reset) is asked again: the first pause,
    /// doubled by each sweep that cannot tell (up to 64 times). An answer settles the operation,
    /// and a workflow waiting for it goes on. Default 60 s.
    pub fn sweep_every(mut self, interval: Duration) -> Self {
        self.sweep_interval = interval;
        self
    }

    /// Deletes every workflow that ended longer ago than `period`, with all its rows (see
    /// [`Worker::delete`]), sweeping every tenth of the period (between a second and a minute).
    /// On a store many workers share, any of them may delete it. Default: kept until deleted.
    pub fn retention(mut self, period: Duration) -> Self {
        self.retention = Some(period);
        self
    }

    /// Opens the store and recovers every in-flight workflow.
    pub async fn build(mut self) -> Result<Worker, StoreError> {
        if let Some(llm) = self.llm.take() {
            self.registry
                .add_builtin(LLM_ACTIVITY, llm.into_registration());
        }
        #[cfg(feature = "mcp")]
        self.register_mcp();
        let mut config = WorkerConfig::new(self.data_dir, self.registry.into_runtime());
        config.clock = self.clock;
        config.entropy = self.entropy;
        config.eviction_threshold = self.eviction_threshold;
        config.sweep_interval = self.sweep_interval;
        config.retention = self.retention;
        config.faults = self.faults;
        config.store = self.store;
        config.codec = self.codec;
        config.redaction = self.redaction;
        config.max_payload_bytes = self.max_payload_bytes;
        if let Some(telemetry) = self.telemetry {
            config.telemetry = telemetry;
        }
        let inner = rt::Worker::start(config).await?;
        Ok(Worker { inner })
    }
}

/// A worker: hosts workflows and activities on an embedded store.
///
/// A workflow run to its end on a store in memory (the embedded RocksDB one is
/// `Worker::builder().data_dir(..)`; `build` recovers whatever it holds):
///
/// ```
/// use std::sync::Arc;
/// use waymark::prelude::*;
/// use waymark::store::{MemoryEngine, MemoryStore};
///
/// #[activity]
/// async fn double(n: u64) -> Result<u64, ActivityError> {
///     Ok(n * 2)
/// }
///
/// #[workflow]
/// async fn quadruple(ctx: WorkflowContext, n: u64) -> Result<u64, WorkflowError> {
///     let twice = ctx.activity(double, n).await?;
///     Ok(ctx.activity(double, twice).await?)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = Arc::new(MemoryStore::on(MemoryEngine::new())?);
/// let worker = Worker::builder()
///     .store(store)
///     .register(quadruple)
///     .register(double)
///     .build()
///     .await?;
/// let run = worker.start(quadruple, 5).await?;
/// assert_eq!(run.result().await?, 20);
/// // Each step is in the journal, which a restart would replay instead of running again.
/// assert_eq!(worker.journal(run.id())?.len(), 6);
/// worker.shutdown().await;
/// # Ok(())
/// # }
/// ```
pub struct Worker {
    inner: rt::Worker,
}

impl Worker {
    /// The runtime worker under this one (the HTTP API works at the payload level).
    #[cfg(feature = "http")]
    pub(crate) fn runtime(&self) -> &rt::Worker {
        &self.inner
    }

    /// Resolves once this worker's leases in a shared store (PostgreSQL) lapsed: every run has
    /// stopped, other workers go on with them, and the process should exit. Never resolves
    /// on a store this process owns.
    pub async fn lapsed(&self) {
        self.inner.lapsed().await
    }

    /// [`Worker::lapsed`] as a future of its own, for a server that takes the worker.
    pub fn on_lapse(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.inner.on_lapse()
    }

    /// The id this worker is known by in a shared store (`None`: the store is its own).
    pub fn worker_id(&self) -> Option<String> {
        self.inner.worker_id()
    }

    /// What seals stored values and exports, if anything does.
    pub fn codec(&self) -> Option<&Arc<dyn Codec>> {
        self.inner.codec()
    }

    /// Deletes an ended workflow with every row of its own (journal, stream, inbox and the
    /// signal ids it saw, operations, its request id) and each artifact no other workflow
    /// committed. A later start with its request id starts a new workflow. Refused, deleting
    /// nothing, if the workflow is unknown, has not ended, or holds an operation that may have
    /// taken effect and that nobody has settled ([`DeleteError::Unsettled`]).
    pub async fn delete(&self, workflow_id: &str) -> Result<(), DeleteError> {
        self.inner.delete(workflow_id).await
    }

    /// Forks `workflow_id` at entry `options.at` into a new workflow, which replays the
    /// source's first `at` entries and runs on from there (with another input, or other models
    /// for the model calls it runs anew, when `options` says so). An effect the source
    /// committed is never fired again: the fork answers it from an inherited copy of the
    /// source's operation record, unless `options.refire` names it, in which case it fires
    /// under a key of the fork's own. Refused, writing nothing, if the source is unknown, `at`
    /// is not a point a run can go on from, or one of the source's effects has an unknown
    /// outcome.
    pub async fn fork(&self, workflow_id: &str, options: ForkOptions) -> Result<String, ForkError> {
        let started = self.inner.fork(workflow_id, options).await?;
        Ok(started.workflow_id)
    }

    /// Resets the stuck run `workflow_id` in place to its first `at` entries, on the code
    /// deployed now: the run it leaves is kept, ended, as the workflow `ID#run-N` (the id
    /// returned). Effects keep their keys and operation records, so one the old run committed
    /// is answered from the log, not called again. `by` is journaled as who reset it. Refused,
    /// writing nothing, unless the run is stuck and `at` is a point it can go on from.
    pub async fn reset(
        &self,
        workflow_id: &str,
        at: u64,
        by: Option<String>,
    ) -> Result<String, ForkError> {
        self.inner.reset(workflow_id, at, by).await
    }

    /// Cancels a running workflow: it ends as failed (`Cancelled`, with `reason`).
    pub async fn cancel(&self, workflow_id: &str, reason: &str) -> Result<(), CancelError> {
        self.inner.cancel(workflow_id, reason).await
    }

    /// A builder with the defaults.
    pub fn builder() -> WorkerBuilder {
        WorkerBuilder {
            data_dir: PathBuf::from("./waymark-data"),
            clock: Arc::new(SystemClock),
            entropy: Arc::new(OsEntropy),
            eviction_threshold: Duration::from_secs(60),
            sweep_interval: Duration::from_secs(60),
            retention: None,
            faults: None,
            telemetry: None,
            registry: Registry::default(),
            llm: None,
            store: None,
            codec: None,
            redaction: Redaction::default(),
            max_payload_bytes: rt::DEFAULT_MAX_PAYLOAD_BYTES,
            #[cfg(feature = "mcp")]
            mcp: Vec::new(),
        }
    }

    /// Starts `workflow` with a generated id.
    pub async fn start<W: Workflow>(
        &self,
        workflow: W,
        input: W::Input,
    ) -> Result<RunHandle<W::Output>, StartError> {
        self.start_with(workflow, input, StartOptions::default())
            .await
    }

    /// Starts `workflow`; with a request id, a second start returns the first run (or a
    /// conflict if its input differs).
    pub async fn start_with<W: Workflow>(
        &self,
        _workflow: W,
        input: W::Input,
        options: StartOptions,
    ) -> Result<RunHandle<W::Output>, StartError> {
        let input = Payload::encode(&input).map_err(|e| StartError::InvalidInput {
            workflow: W::NAME.to_owned(),
            message: e.to_string(),
        })?;
        let started = self.inner.start_workflow(W::NAME, input, options).await?;
        Ok(RunHandle {
            workflow_id: started.workflow_id,
            existed: started.existed,
            worker: self.inner.downgrade(),
            _output: PhantomData,
        })
    }

    /// A handle on an existing run.
    pub fn handle<W: Workflow>(&self, _workflow: W, workflow_id: &str) -> RunHandle<W::Output> {
        RunHandle {
            workflow_id: workflow_id.to_owned(),
            existed: true,
            worker: self.inner.downgrade(),
            _output: PhantomData,
        }
    }

    /// The run's journal entries.
    pub fn journal(&self, workflow_id: &str) -> Result<Vec<Entry>, StoreError> {
        self.inner.journal(workflow_id)
    }

    /// The run's journal, rendered for snapshot tests (times and generated values redacted).
    pub fn render_journal(&self, workflow_id: &str) -> Result<String, StoreError> {
        self.journal(workflow_id)
            .map(|entries| render_journal(&entries))
    }

    /// The run's status, `None` for an unknown workflow.
    pub fn workflow_status(&self, workflow_id: &str) -> Result<Option<WorkflowStatus>, StoreError> {
        Ok(self
            .inner
            .workflow(workflow_id)?
            .map(|record| record.status))
    }

    /// The run's record: status, and why it is stuck when it is.
    pub fn workflow(&self, workflow_id: &str) -> Result<Option<WorkflowRecord>, StoreError> {
        self.inner.workflow(workflow_id)
    }

    /// The durable timers the run still has: sleeps and approval expiries it waits for.
    pub fn pending_timers(&self, workflow_id: &str) -> Result<Vec<TimerKey>, StoreError> {
        self.inner.pending_timers(workflow_id)
    }

    /// One operation, by idempotency key.
    pub fn operation(&self, key: &str) -> Result<Option<OperationRecord>, StoreError> {
        self.inner.operation(key)
    }

    /// The run's operation log (one record per effect), by idempotency key.
    pub fn operations(
        &self,
        workflow_id: &str,
    ) -> Result<Vec<(String, OperationRecord)>, StoreError> {
        self.inner
            .operations(workflow_id)?
            .into_iter()
            .map(|(key, record)| record.map(|record| (key, record)))
            .collect()
    }

    /// The workflow as `waymark export` writes it (`Export::write`): its journal, its
    /// operation log rows and the artifacts its journal committed, for `waymark import` into
    /// another store.
    pub fn export(&self, workflow_id: &str) -> Result<waymark_runtime::export::Export, StoreError> {
        self.inner.export(workflow_id)
    }

    /// The run's operation log, rendered for snapshot tests.
    pub fn render_operations(&self, workflow_id: &str) -> Result<String, StoreError> {
        self.operations(workflow_id)
            .map(|operations| render_operations(&operations))
    }

    /// Sends signal `name` to a workflow, with the sender's id for it: kept in the workflow's
    /// inbox (synced) until `ctx.signal(name)` takes it. Sending the same id again is dropped
    /// and answered `SignalOutcome::Duplicate`.
    pub async fn signal<T: serde::Serialize>(
        &self,
        workflow_id: &str,
        name: &str,
        signal_id: &str,
        payload: &T,
    ) -> Result<SignalOutcome, SignalError> {
        let payload = Payload::encode(payload).map_err(|e| SignalError::Payload(e.to_string()))?;
        self.inner
            .signal(workflow_id, name, signal_id, payload)
            .await
    }

    /// Approves or rejects the approval pending in `workflow_id`, as `approver`. The decision
    /// names the artifact hash it was made for (`sha256:…`); one for any other artifact than
    /// the pending one is refused with [`ApprovalError::HashMismatch`].
    pub async fn decide_approval(
        &self,
        workflow_id: &str,
        artifact_hash: &str,
        approver: &str,
        verdict: ApprovalVerdict,
    ) -> Result<(), ApprovalError> {
        self.inner
            .decide_approval(workflow_id, None, artifact_hash, approver, verdict)
            .await
    }

    /// [`Worker::decide_approval`] for request `request` (its `PendingRequest::request`):
    /// refused with [`ApprovalError::StaleRequest`] unless that very request is pending.
    pub async fn decide_approval_request(
        &self,
        workflow_id: &str,
        request: u32,
        artifact_hash: &str,
        approver: &str,
        verdict: ApprovalVerdict,
    ) -> Result<(), ApprovalError> {
        let request = Some(request);
        self.inner
            .decide_approval(workflow_id, request, artifact_hash, approver, verdict)
            .await
    }

    /// The approval requests of `workflow_id` still waiting for a decision, oldest first.
    pub fn pending_approvals(&self, workflow_id: &str) -> Result<Vec<PendingRequest>, StoreError> {
        let journal = self.inner.journal(workflow_id)?;
        let mut pending = std::collections::BTreeMap::new();
        for entry in journal {
            match entry {
                Entry::ApprovalRequested {
                    seq,
                    artifact_hash,
                    risk,
                    expires_at_ms,
                    ..
                }
                | Entry::ApprovalRequestedAt {
                    seq,
                    artifact_hash,
                    risk,
                    expires_at_ms,
                    ..
                } => {
                    let risk = risk.decode().map_err(|error| StoreError::Corrupt {
                        table: waymark_runtime::store::Table::Journal,
                        key: format!("{workflow_id}: approval request {seq}"),
                        source: DecodeError::Malformed(format!("its risk: {error}")),
                    })?;
                    let request = PendingRequest {
                        request: seq,
                        artifact_hash: artifact_hash.hex(),
                        scope: None,
                        risk,
                        expires_at_ms,
                    };
                    pending.insert(seq, request);
                }
                // Decided, or dropped by the code (it lost a `select!`): no longer asked.
                Entry::ApprovalDecided { seq, .. } | Entry::WaitDropped { seq } => {
                    pending.remove(&seq);
                }
                _ => {}
            }
        }
        // Read only for the requests still pending: a decided one's scope is not shown.
        let mut requests: Vec<PendingRequest> = pending.into_values().collect();
        for request in &mut requests {
            let hash = waymark_runtime::journal::Digest::parse_hex(&request.artifact_hash);
            if let Some(hash) = hash {
                request.scope = self.scope(workflow_id, request.request, &hash)?;
            }
        }
        Ok(requests)
    }

    /// What the approval request `seq` asks about, when it asks about a scope (requests made
    /// before scopes named the shown artifact itself).
    fn scope(
        &self,
        workflow_id: &str,
        seq: u32,
        hash: &waymark_runtime::journal::Digest,
    ) -> Result<Option<ApprovalScope>, StoreError> {
        let (namespace, _) = waymark_runtime::namespace::split(workflow_id);
        let Some(record) = self.inner.artifact(namespace, hash)? else {
            return Ok(None);
        };
        if record.kind != waymark_runtime::approvals::SCOPE_KIND {
            return Ok(None);
        }
        let scope = record
            .content
            .decode()
            .map_err(|error| StoreError::Corrupt {
                table: waymark_runtime::store::Table::Artifacts,
                key: format!("{workflow_id}: the scope of approval request {seq}"),
                source: DecodeError::Malformed(error.to_string()),
            })?;
        Ok(Some(scope))
    }

    /// The artifact named `hash` (`sha256:…`) in the default namespace, if stored.
    pub fn artifact(&self, hash: &str) -> Result<Option<ArtifactRecord>, StoreError> {
        self.artifact_in(waymark_runtime::namespace::DEFAULT, hash)
    }

    /// The artifact named `hash` (`sha256:…`) in `namespace`, if stored.
    pub fn artifact_in(
        &self,
        namespace: &str,
        hash: &str,
    ) -> Result<Option<ArtifactRecord>, StoreError> {
        match waymark_runtime::journal::Digest::parse_hex(hash) {
            Some(digest) => self.inner.artifact(namespace, &digest),
            None => Ok(None),
        }
    }

    /// Safety events counted since the worker started.
    pub fn telemetry(&self) -> &Telemetry {
        self.inner.telemetry()
    }

    /// The workflow's signals not delivered yet, oldest first.
    pub fn inbox(&self, workflow_id: &str) -> Result<Vec<InboxMessage>, StoreError> {
        self.inner.inbox(workflow_id)
    }

    /// The workflow's stream (streamed model tokens and their commit markers) after event
    /// number `after`: 0 for all of it; a reader that reconnects passes the last number it saw.
    /// Keep what [`crate::streams::visible_text`] keeps to show only committed (or still live)
    /// generations.
    pub fn stream(&self, workflow_id: &str, after: u64) -> Result<Vec<StreamEvent>, StoreError> {
        self.inner.stream(workflow_id, after)
    }

    /// Records, durably, that a reader on `channel` holds `workflow_id`'s stream up to event
    /// `event`; returns what the channel is now known to have received. Never moves back; an
    /// event never generated is refused.
    pub async fn acknowledge_stream(
        &self,
        workflow_id: &str,
        channel: &str,
        event: u64,
    ) -> Result<u64, AckError> {
        self.inner
            .acknowledge_stream(workflow_id, channel, event)
            .await
    }

    /// Per reader channel, the last of `workflow_id`'s stream events a reader acknowledged.
    pub fn stream_acks(&self, workflow_id: &str) -> Result<Vec<(String, u64)>, StoreError> {
        self.inner.stream_acks(workflow_id)
    }

    /// The whole stream, rendered for snapshot tests.
    pub fn render_stream(&self, workflow_id: &str) -> Result<String, StoreError> {
        let events = self.stream(workflow_id, 0)?;
        Ok(crate::streams::render_stream(&events))
    }

    /// Every operation of `namespace` (of every namespace for `None`) an operator's decision
    /// is taken about now, whatever its workflow's status, by idempotency key: those waiting
    /// for a decision, and the unsettled ones no run will make or settle any more (their
    /// workflow ended, or a reset discarded the command that made the call). Never a call in
    /// flight, nor an operation of a stuck workflow, which [`Worker::resolve_operation`]
    /// refuses until the run is fixed, reset or cancelled.
    pub fn operations_awaiting_decision(
        &self,
        namespace: Option<&str>,
    ) -> Result<Vec<(String, OperationRecord)>, StoreError> {
        self.inner.operations_awaiting_decision(namespace)
    }

    /// The operations whose workflows wait for an operator, by idempotency key.
    pub fn awaiting_operator(
        &self,
        workflow_id: &str,
    ) -> Result<Vec<(String, OperationRecord)>, StoreError> {
        let mut operations = self.operations(workflow_id)?;
        operations.retain(|(_, record)| {
            matches!(record.status, OperationStatus::AwaitingOperator { .. })
        });
        Ok(operations)
    }

    /// Settles an effect whose outcome is unknown, as operator `operator`. The decision is
    /// journaled with the operator's name; the workflow goes on. About an effect an earlier run
    /// of the workflow left (it continued as new, or was reset), or one of a workflow that has
    /// ended, it settles the operation's record alone.
    pub async fn resolve_operation(
        &self,
        key: &str,
        decision: OperatorDecision,
        operator: &str,
    ) -> Result<(), ResolveError> {
        self.inner
            .resolve_operation(key, DecidedOn::ANY, decision, operator)
            .await
    }

    /// The downstream reports the outcome of the effect under `key` (its webhook), as
    /// `source`: applied like an operator's decision while the outcome is unknown, journaled
    /// as settled by the downstream. A repeated delivery of the same committed result is
    /// [`Settlement::Duplicate`](crate::operations::Settlement) and changes nothing.
    ///
    /// With `attempt` (the attempt the downstream was called with), a report about an earlier
    /// attempt is refused rather than applied to a later one.
    pub async fn settle_operation(
        &self,
        key: &str,
        attempt: Option<u32>,
        decision: OperatorDecision,
        source: &str,
    ) -> Result<waymark_runtime::operations::Settlement, ResolveError> {
        self.inner
            .settle_operation(key, attempt, decision, source)
            .await
    }

    /// [`Worker::resolve_operation`], refused with [`ResolveError::StaleAttempt`] unless the
    /// operation is still at `attempt`: the one the operator checked downstream. A decision about
    /// an earlier attempt says nothing about a later one.
    pub async fn resolve_operation_at(
        &self,
        key: &str,
        attempt: u32,
        decision: OperatorDecision,
        operator: &str,
    ) -> Result<(), ResolveError> {
        let on = DecidedOn::attempt(Some(attempt));
        self.inner
            .resolve_operation(key, on, decision, operator)
            .await
    }

    /// [`Worker::resolve_operation`] about the call `record` shows, as read from
    /// [`Worker::operation`] or [`Worker::operations_awaiting_decision`]: refused with
    /// [`ResolveError::StaleRevision`] once the record went through any transition since. An
    /// intent issued again after its key was freed starts its attempts over at 1, so only this
    /// keeps a decision about the earlier call from settling the later one.
    pub async fn resolve_operation_as_read(
        &self,
        key: &str,
        record: &OperationRecord,
        decision: OperatorDecision,
        operator: &str,
    ) -> Result<(), ResolveError> {
        self.inner
            .resolve_operation(key, record.as_read(), decision, operator)
            .await
    }

    /// Workflows that could not be recovered on start, with why: records that do not decode
    /// (left as they are on disk), and runs recovery found stuck, listed once their replay
    /// found it. The others run.
    pub fn recovery_errors(&self) -> Vec<(String, RunError)> {
        self.inner.recovery_errors()
    }

    /// How many workflows are in memory (evicted ones wait on disk; on a shared store, one
    /// still letting go of its lease counts until it has).
    pub fn resident_workflows(&self) -> usize {
        self.inner.resident_workflows()
    }

    /// What a resident run holds in memory (open commands, kept facts and inputs, queued
    /// outcomes and signals); `None` when it is not in memory.
    pub async fn footprint(&self, workflow_id: &str) -> Option<RunFootprint> {
        self.inner.footprint(workflow_id).await
    }

    /// Stops the worker and closes its store. Every step is already durable, so nothing is
    /// lost: the next worker on the same data dir resumes each run by replay.
    pub async fn shutdown(self) {
        self.inner.shutdown().await;
    }
}

/// A started run. Holds no reference that keeps the worker alive.
pub struct RunHandle<T> {
    workflow_id: String,
    existed: bool,
    worker: WeakWorker,
    _output: PhantomData<fn() -> T>,
}

impl<T> Clone for RunHandle<T> {
    fn clone(&self) -> Self {
        Self {
            workflow_id: self.workflow_id.clone(),
            existed: self.existed,
            worker: self.worker.clone(),
            _output: PhantomData,
        }
    }
}

impl<T: DeserializeOwned> RunHandle<T> {
    /// The workflow id.
    pub fn id(&self) -> &str {
        &self.workflow_id
    }

    /// Whether the start found an existing run for its request id.
    pub fn existed(&self) -> bool {
        self.existed
    }

    /// Waits for the run to end.
    pub async fn result(&self) -> Result<T, RunError> {
        let payload = self.worker.result(&self.workflow_id).await?;
        payload
            .decode()
            .map_err(|source| RunError::PayloadMismatch { seq: None, source })
    }
}

/// An approval request waiting for a person.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingRequest {
    /// The request's seq: name it in a decision to be sure it settles this request.
    pub request: u32,
    /// The artifact to decide on, `sha256:…`: the request's scope.
    pub artifact_hash: String,
    /// What the scope holds: the artifact shown, the intents it authorises with their
    /// arguments, and the evidence it rests on.
    pub scope: Option<ApprovalScope>,
    /// What the workflow says about the risk.
    pub risk: serde_json::Value,
    /// When it expires, in worker-clock milliseconds.
    pub expires_at_ms: Option<u64>,
}
