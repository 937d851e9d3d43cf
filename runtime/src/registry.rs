//! What a worker hosts, type-erased: the typed SDK turns each `#[workflow]` and `#[activity]`
//! into closures over payloads.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::future::BoxFuture;

use crate::attempt_cell::AttemptCell;
use crate::context::{ActivityCatalog, WorkflowCore};
use crate::error::RunError;
use crate::journal::{Failure, Payload, Seq};
use crate::options::ActivityOptions;

/// Starts a workflow body: decodes the input and returns the body's future.
pub type WorkflowFn = Arc<
    dyn Fn(WorkflowCore, Payload) -> Result<BoxFuture<'static, Result<Payload, Failure>>, RunError>
        + Send
        + Sync,
>;

/// Whether a payload decodes as a given type (a start input, an operator-given result); checked
/// before anything is written.
pub type InputCheck = Arc<dyn Fn(&Payload) -> Result<(), String> + Send + Sync>;

/// Runs one activity attempt.
pub type ActivityFn = Arc<
    dyn Fn(ActivityInfo, Payload) -> BoxFuture<'static, Result<Payload, Failure>> + Send + Sync,
>;

/// Runs an effect's reconciler for an attempt whose outcome is unknown; `None` when the effect
/// has none (the operation then waits for an operator).
pub type ReconcileFn = Arc<
    dyn Fn(ActivityInfo, Payload) -> Option<BoxFuture<'static, Result<ReconcileOutcome, Failure>>>
        + Send
        + Sync,
>;

/// Extracts the canonical `#[key]` arguments from an effect's input.
pub type KeyArgumentsFn = Arc<dyn Fn(&Payload) -> Result<Payload, String> + Send + Sync>;

/// What a reconciler found downstream, at the payload level.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReconcileOutcome {
    /// The effect happened; its result.
    Committed(Payload),
    /// It did not happen; a retry with the same key is safe.
    NotFound,
    /// Cannot tell yet.
    StillUnknown(String),
}

/// What makes an activity an effect.
#[derive(Clone)]
pub struct EffectRegistration {
    /// Semantics version, part of the idempotency key.
    pub version: u32,
    /// The `#[key]` arguments of an input.
    pub key_arguments: KeyArgumentsFn,
    /// The reconciler.
    pub reconcile: ReconcileFn,
    /// At most once: every failure of a call that started (but a definite refusal) leaves the
    /// outcome unknown and goes to reconciliation; it is never retried blindly.
    pub at_most_once: bool,
    /// Whether a payload decodes as the effect's output: an operator's "it committed with this
    /// result" is checked before it is journaled, so a wrong shape is refused, not replayed.
    pub check_output: InputCheck,
}

/// Where an attempt can leave the external reference of what it did (a booking number), which
/// the operation log keeps next to the result.
#[derive(Debug, Clone, Default)]
pub struct ExternalRef(Arc<AttemptCell>);

impl ExternalRef {
    /// Records `reference` (the last one set wins).
    pub fn set(&self, reference: String) {
        *crate::sync::lock(&self.0.external_ref) = Some(reference);
    }

    /// What the attempt recorded.
    pub fn get(&self) -> Option<String> {
        crate::sync::lock(&self.0.external_ref).clone()
    }

    pub(crate) fn of(cell: &Arc<AttemptCell>) -> Self {
        Self(cell.clone())
    }
}

/// What an activity attempt knows about itself.
#[derive(Debug, Clone)]
pub struct ActivityInfo {
    /// The workflow that scheduled it (shared with the run, not copied for each attempt).
    pub workflow_id: Arc<str>,
    /// The activity name.
    pub activity_name: String,
    /// The command's position.
    pub seq: Seq,
    /// 1-based attempt.
    pub attempt: u32,
    /// Why this attempt runs: its first execution, a retry in the same run, a resume after
    /// the previous process stopped, or an operator's restart. An activity may choose by it
    /// (load a snapshot rather than query live when resuming, say).
    pub replay_mode: crate::telemetry::ReplayMode,
    /// The effect's idempotency key; `None` for a plain activity.
    pub idempotency_key: Option<String>,
    /// Where an effect attempt records the downstream's reference.
    pub external_ref: ExternalRef,
    /// Where the attempt streams its output (a model's tokens) to the workflow's stream.
    pub stream: crate::streams::StepStream,
    /// Reads committed artifacts (a model call's transcript parts).
    pub artifacts: ArtifactReader,
    /// The worker's figures: what an attempt costs is counted here, journaled or not.
    pub telemetry: crate::telemetry::Telemetry,
    /// Set right before the attempt is dropped at its start-to-close timeout, so that what
    /// the attempt's drop reports can tell a timeout from the worker stopping.
    pub timed_out: TimedOut,
    /// An attempt of this call was in flight when the previous process stopped, and this one
    /// runs it again under the same number (a retry waiting for its backoff is not one).
    pub interrupted: bool,
    /// What the workflow's fork, if it is one, decides: the model a model call runs on.
    pub lineage: crate::lineage::Lineage,
}

/// Whether an attempt was dropped at its timeout (see [`ActivityInfo::timed_out`]).
#[derive(Clone, Default, Debug)]
pub struct TimedOut(Arc<AttemptCell>);

impl TimedOut {
    /// Whether the attempt was dropped at its timeout: its executor marks the cell right
    /// before the drop.
    pub fn is_set(&self) -> bool {
        self.0.timed_out.load(Ordering::SeqCst)
    }

    pub(crate) fn of(cell: &Arc<AttemptCell>) -> Self {
        Self(cell.clone())
    }
}

/// Read access to the store's artifacts, for an attempt that needs what its workflow
/// committed before it was scheduled: those of the workflow's namespace.
#[derive(Clone)]
pub struct ArtifactReader {
    store: Arc<dyn crate::store::Store>,
    /// Its namespace is the one whose artifacts it reads. Kept whole and shared with the
    /// attempt, so that an attempt that reads nothing copies nothing.
    workflow_id: Arc<str>,
}

impl ArtifactReader {
    /// The artifacts that workflow `workflow_id` can read.
    pub(crate) fn new(store: Arc<dyn crate::store::Store>, workflow_id: Arc<str>) -> Self {
        Self { store, workflow_id }
    }

    /// Runs `reads` on the blocking pool, given a function that answers an artifact's kind
    /// and content by hash: the store's reads block on disk, and no tokio worker thread may
    /// wait on them.
    pub async fn blocking<T, F>(&self, reads: F) -> Result<T, String>
    where
        T: Send + 'static,
        F: FnOnce(crate::llm::ArtifactRead<'_>) -> T + Send + 'static,
    {
        let (store, workflow_id) = (self.store.clone(), self.workflow_id.clone());
        let task = tokio::task::spawn_blocking(move || {
            let (namespace, _) = crate::namespace::split(&workflow_id);
            let read = |hash: &crate::journal::Digest| {
                let record = store.artifact(namespace, hash);
                let record = record.map_err(|e| e.to_string())?;
                Ok(record.map(|r| (r.kind, r.content)))
            };
            crate::store::off_async_thread(|| reads(&read))
        });
        task.await
            .map_err(|e| format!("an artifact read failed to run: {e}"))
    }
}

impl std::fmt::Debug for ArtifactReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ArtifactReader")
    }
}

/// A registered workflow.
#[derive(Clone)]
pub struct RegisteredWorkflow {
    /// The body.
    pub run: WorkflowFn,
    /// Input validation.
    pub check_input: InputCheck,
    /// A digest of its code (`Workflow::CODE_DIGEST`): a parked run stays out of memory on
    /// start only while it is the one the run parked with. `None`: rebuilt on every start.
    pub code_digest: Option<u64>,
}

/// A registered activity.
#[derive(Clone)]
pub struct RegisteredActivity {
    /// One attempt.
    pub run: ActivityFn,
    /// Defaults applied when a workflow schedules it.
    pub options: ActivityOptions,
    /// Set for `#[activity(effect)]`.
    pub effect: Option<EffectRegistration>,
    /// `#[activity(cache)]`: a pure stage; a second call with the same input in one run is
    /// answered with the first one's result.
    pub cached: bool,
}

/// Everything a worker hosts, by stable name.
#[derive(Clone, Default)]
pub struct Registry {
    workflows: ByName<RegisteredWorkflow>,
    activities: ByName<RegisteredActivity>,
}

/// A table by name. The names are the application's own, fixed at registration, so the hash
/// need not resist chosen keys: a step looks its activity up five times, and SipHash took
/// 153 instructions to hash such a name where foldhash takes about 26.
type ByName<T> = HashMap<String, T, foldhash::fast::RandomState>;

impl Registry {
    /// Adds (or replaces) a workflow.
    pub fn add_workflow(&mut self, name: &str, workflow: RegisteredWorkflow) {
        self.workflows.insert(name.to_owned(), workflow);
    }

    /// Adds (or replaces) an activity.
    pub fn add_activity(&mut self, name: &str, activity: RegisteredActivity) {
        self.activities.insert(name.to_owned(), activity);
    }

    /// The workflow named `name`.
    pub fn workflow(&self, name: &str) -> Option<&RegisteredWorkflow> {
        self.workflows.get(name)
    }

    /// The activity named `name`.
    pub fn activity(&self, name: &str) -> Option<&RegisteredActivity> {
        self.activities.get(name)
    }

    /// Registered workflow names, sorted.
    pub fn workflow_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.workflows.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }
}

impl ActivityCatalog for Registry {
    fn options(&self, name: &str) -> Option<ActivityOptions> {
        self.activity(name).map(|activity| activity.options.clone())
    }

    fn key_arguments(&self, name: &str, input: &Payload) -> Option<(u32, Result<Payload, String>)> {
        let effect = self.activity(name)?.effect.as_ref()?;
        Some((effect.version, (effect.key_arguments)(input)))
    }

    fn is_cached(&self, name: &str) -> bool {
        self.activity(name).is_some_and(|activity| activity.cached)
    }
}
