//! The workflow side of the executor: what ctx calls reach, synchronously.
//!
//! Every ctx call locks the core, takes its seq from the replay cursor at the moment it is
//! called, and either gets a recorded answer or queues a new command for the executor to journal
//! and execute after the current poll. Futures wait on per-seq slots that only the executor
//! fills, one completion at a time, in journal order.
//!
//! A run that must stop (divergence, a recorded value that no longer decodes, an unknown
//! activity) sets a sticky `stop`; from then on ctx calls queue nothing and futures never
//! resolve, and the executor abandons the run after the poll without writing anything.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use crate::approvals::{Approved, Authorisation, Grant, Intent, NotApproved};
use crate::artifacts::{artifact_hash, ArtifactRecord};
use crate::clock::Clock;
use crate::compensations::{Compensations, Registration, UndoInput};
use crate::entropy::Entropy;
use crate::error::RunError;
use crate::journal::Digest;
use crate::journal::{CommandIdentity, CommandKind, Payload, Seq, SeqMap};
use crate::lineage::Lineage;
use crate::llm::LLM_ACTIVITY;
use crate::machines::approval::approval_identity;
use crate::machines::signal::signal_identity;
use crate::machines::timer::timer_identity;
use crate::machines::value::{artifact_identity, value_identity};
use crate::machines::{Commands, Resolution};
use crate::operations::idempotency_key;
use crate::options::ActivityOptions;
use crate::replay::{Issued, ReplayCursor, ReplayEvent, ReplayFault};
use crate::telemetry::{ReplayMode, Telemetry};
use futures::future::BoxFuture;

/// A command issued by the code that the journal does not have yet.
#[derive(Debug, Clone)]
pub(crate) enum NewCommand {
    Activity {
        seq: Seq,
        identity: CommandIdentity,
        input: Payload,
        scheduled_at_ms: u64,
        idempotency_key: Option<String>,
    },
    Timer {
        seq: Seq,
        identity: CommandIdentity,
        duration_ms: u64,
        fire_at_ms: u64,
    },
    Value {
        seq: Seq,
        identity: CommandIdentity,
        value: Payload,
    },
    Signal {
        seq: Seq,
        identity: CommandIdentity,
    },
    Artifact {
        seq: Seq,
        identity: CommandIdentity,
        record: ArtifactRecord,
    },
    Approval {
        seq: Seq,
        identity: CommandIdentity,
        artifact_hash: Digest,
        risk: Payload,
        expires_at_ms: Option<u64>,
    },
}

/// What a workflow's core holds, for tests and benchmarks that check it does not grow with
/// history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footprint {
    /// Commands not settled (and waits dropped before they opened).
    pub open_commands: usize,
    /// Recorded identities, metadata, result slots and registered undos kept.
    pub kept_facts: usize,
    /// Activity inputs kept for (re)running them, and cached stages' results.
    pub kept_inputs: usize,
}

/// A check run right before an effect's call; `false` fails the effect terminally.
pub type PreconditionCheck = Arc<dyn Fn() -> BoxFuture<'static, bool> + Send + Sync>;

/// A named precondition of an effect call.
#[derive(Clone)]
pub struct Precondition {
    /// Shown in the operation log and in the failure.
    pub name: String,
    /// The check.
    pub check: PreconditionCheck,
}

/// What the executor needs to (re)run an activity command.
#[derive(Clone)]
pub(crate) struct ActivitySpec {
    pub(crate) name: String,
    pub(crate) input: Payload,
    pub(crate) options: ActivityOptions,
    pub(crate) preconditions: Vec<Precondition>,
    /// A retrieval: its result is kept as a snapshot artifact.
    pub(crate) snapshot: bool,
    /// The approval the effect runs under, checked right before each call.
    pub(crate) authorisation: Option<Authorisation>,
    /// A streamed model call whose answer validators judge: its stream version is committed
    /// with the verdict that accepts it, not with its result.
    pub(crate) awaits_validation: bool,
    /// The workflow was polled since the command was issued: it may have been journaled and
    /// started, so it is too late to put it under an approval.
    pub(crate) polled_since_issue: bool,
}

/// A validator's verdict on the answer a streamed step generated: what its stream version
/// becomes, in the write that journals the verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamVerdict {
    /// The model call whose answer was judged.
    pub step: Seq,
    /// `None`: accepted, the version is committed; `Some(why)`: rejected, it is superseded.
    pub rejected: Option<String>,
}

enum Slot {
    Waiting(Option<Waker>),
    Ready(Resolution),
}

pub(crate) struct CoreState {
    pub(crate) cursor: ReplayCursor,
    /// The open commands, each in its kind's machine.
    pub(crate) commands: Commands,
    slots: SeqMap<Slot>,
    new_commands: Vec<NewCommand>,
    /// Shared: an attempt, a retry and each decision about an effect read the spec, and a
    /// copy of it is a copy of its name, its options and its checks.
    specs: SeqMap<Arc<ActivitySpec>>,
    stop: Option<RunError>,
    /// Telemetry of new values, counted once the values are written (a value computed but lost
    /// to a crash is computed again on replay, and must not count twice).
    notes: Vec<TelemetryNote>,
    /// The command an outcome was delivered to since the workflow was last polled: a second
    /// delivery before the next poll breaks the rule that makes `select!` replay the same.
    delivered_unpolled: Option<Seq>,
    /// Which command ran each intent a granted approval (by its request's seq) authorises:
    /// one per intent, so an approval is used once. Rebuilt by every replay, as the code
    /// claims them again in order.
    approval_claims: HashMap<(Seq, Digest), Seq>,
    /// Verdicts on streamed answers recorded since the last flush, written with them.
    stream_verdicts: Vec<StreamVerdict>,
    /// The undos registered for effects, rebuilt by every replay as the code registers them.
    pub(crate) compensations: Compensations,
    /// A compensating loop waiting for an effect's outcome.
    compensation_waker: Option<Waker>,
    /// The results of cached stages delivered so far, by (activity, input digest): rebuilt by
    /// every replay from the same deliveries, so a hit live is a hit on replay.
    stage_cache: HashMap<(String, Digest), Payload>,
    /// The input the code asked the workflow to continue with as a new run.
    continuation: Option<Payload>,
    /// That input, once the code returned to continue with it.
    continuing: Option<Payload>,
}

/// What issuing a command needs to know about the activities the worker hosts. The registry
/// answers it; the core sees this view only, so it does not depend on the registry (which
/// depends on the core).
pub trait ActivityCatalog: Send + Sync + 'static {
    /// Activity `name`'s default options; `None` if the worker does not host it.
    fn options(&self, name: &str) -> Option<ActivityOptions>;
    /// For an effect: its semantics version and the `#[key]` arguments of `input`, or why they
    /// do not serialize. `None` for a read, and for an activity the worker does not host.
    fn key_arguments(&self, name: &str, input: &Payload) -> Option<(u32, Result<Payload, String>)>;
    /// Whether activity `name` is a cached stage (`#[activity(cache)]`).
    fn is_cached(&self, name: &str) -> bool;
}

/// What a new recorded value is drawn from: the worker's clock and its entropy.
pub struct Fresh<'a> {
    shared: &'a CoreShared,
    seq: Seq,
}

impl Fresh<'_> {
    /// The worker's time, in milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> u64 {
        self.shared.clock.now_ms()
    }

    /// Random draw number `index` for this value (a value needing 128 bits draws twice).
    pub fn random(&self, index: u32) -> u64 {
        let shared = self.shared;
        shared.entropy.draw(&shared.workflow_id, self.seq, index)
    }
}

/// An open activity without its spec: the executor broke its own rule, and says so rather than
/// guess (default options, no preconditions, no operation record).
fn missing_spec(seq: Seq) -> RunError {
    RunError::Internal(format!("command {seq} has no activity spec"))
}

/// What a new value tells telemetry, once it is written.
pub type TelemetryNote = Box<dyn FnOnce(&Telemetry) + Send>;

struct CoreShared {
    workflow_id: String,
    lineage: Lineage,
    clock: Arc<dyn Clock>,
    entropy: Arc<dyn Entropy>,
    catalog: Arc<dyn ActivityCatalog>,
    telemetry: Telemetry,
    state: Mutex<CoreState>,
}

/// The handle a workflow's context holds. Cheap to clone; `Send + Sync` so workflow futures are.
#[derive(Clone)]
pub struct WorkflowCore {
    shared: Arc<CoreShared>,
}

impl WorkflowCore {
    pub(crate) fn new(
        workflow_id: &str,
        lineage: Lineage,
        cursor: ReplayCursor,
        clock: Arc<dyn Clock>,
        entropy: Arc<dyn Entropy>,
        catalog: Arc<dyn ActivityCatalog>,
        telemetry: Telemetry,
    ) -> Self {
        let state = CoreState {
            cursor,
            commands: Commands::default(),
            slots: SeqMap::default(),
            new_commands: Vec::new(),
            specs: SeqMap::default(),
            stop: None,
            notes: Vec::new(),
            delivered_unpolled: None,
            approval_claims: HashMap::new(),
            stream_verdicts: Vec::new(),
            compensations: Compensations::default(),
            compensation_waker: None,
            stage_cache: HashMap::new(),
            continuation: None,
            continuing: None,
        };
        let shared = CoreShared {
            workflow_id: workflow_id.to_owned(),
            lineage,
            clock,
            entropy,
            catalog,
            telemetry,
            state: Mutex::new(state),
        };
        Self {
            shared: Arc::new(shared),
        }
    }

    /// The running workflow's id.
    pub fn workflow_id(&self) -> &str {
        &self.shared.workflow_id
    }

    /// The code ends this run and asks for a new one with `input`, under the same workflow id
    /// (it returns [`crate::error::WorkflowError::ContinueAsNew`] next).
    pub fn continue_as_new(&self, input: Payload) {
        self.lock().continuation = Some(input);
    }

    /// The code returned to continue as a new run: `false` if it never said with what input
    /// ([`WorkflowCore::continue_as_new`]).
    pub fn confirm_continuation(&self) -> bool {
        let mut state = self.lock();
        state.continuing = state.continuation.take();
        state.continuing.is_some()
    }

    /// The input of the run the code returned to continue with, if it did.
    pub(crate) fn take_continuation(&self) -> Option<Payload> {
        self.lock().continuing.take()
    }

    /// What this workflow's fork, if it is one, decides.
    pub(crate) fn lineage(&self) -> &Lineage {
        &self.shared.lineage
    }

    /// The workflow whose id the keys of `operation` derive from in an approval's intents:
    /// this one's, or for a fork its source's (see [`Lineage`]).
    pub fn key_root(&self, operation: &str) -> &str {
        self.shared.lineage.key_root(self.workflow_id(), operation)
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, CoreState> {
        // Workflow code never runs while this lock is held, so a panic cannot leave it torn.
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `ctx.activity`: issues the command and returns its seq, or `None` if the run is stopping.
    /// `options` are the activity's defaults unless the caller overrides them.
    pub fn schedule_activity(
        &self,
        name: &str,
        input: Payload,
        options: Option<ActivityOptions>,
    ) -> Option<Seq> {
        self.schedule(CommandKind::Activity, name, input, options)
    }

    /// `ctx.retrieve`: an activity whose result is stored as a snapshot artifact, journaled by
    /// hash and delivered from the snapshot on replay.
    pub fn schedule_retrieval(&self, name: &str, input: Payload) -> Option<Seq> {
        self.schedule(CommandKind::Retrieval, name, input, None)
    }

    fn schedule(
        &self,
        kind: CommandKind,
        name: &str,
        input: Payload,
        options: Option<ActivityOptions>,
    ) -> Option<Seq> {
        let catalog = self.shared.catalog.as_ref();
        let Some(defaults) = catalog.options(name) else {
            self.stop(RunError::UnknownActivity(name.to_owned()));
            return None;
        };
        let options = options.unwrap_or(defaults);
        let idempotency_key = match catalog.key_arguments(name, &input) {
            Some((version, arguments)) => Some(self.idempotency_key(name, version, arguments)?),
            None => None,
        };
        let identity = CommandIdentity::new(kind, name, &input);
        let scheduled_at_ms = self.shared.clock.now_ms();
        let mut state = self.lock();
        let (seq, recorded) =
            state.issue_keeping(identity, |seq, identity| NewCommand::Activity {
                seq,
                identity,
                input: input.clone(),
                scheduled_at_ms,
                idempotency_key,
            })?;
        let spec = ActivitySpec {
            name: recorded.map_or_else(|| name.to_owned(), |identity| identity.name),
            input,
            options,
            preconditions: Vec::new(),
            snapshot: kind == CommandKind::Retrieval,
            authorisation: None,
            awaits_validation: false,
            polled_since_issue: false,
        };
        state.specs.insert(seq, Arc::new(spec));
        Some(seq)
    }

    fn idempotency_key(
        &self,
        name: &str,
        version: u32,
        arguments: Result<Payload, String>,
    ) -> Option<String> {
        match arguments {
            Ok(arguments) => Some(idempotency_key(
                self.workflow_id(),
                name,
                &arguments,
                version,
            )),
            Err(message) => {
                self.stop(RunError::IdempotencyKey {
                    activity: name.to_owned(),
                    message,
                });
                None
            }
        }
    }

    /// Adds a precondition to the effect issued at `seq`, checked right before each call.
    pub fn add_precondition(&self, seq: Seq, precondition: Precondition) {
        let mut state = self.lock();
        match state.specs.get_mut(&seq) {
            Some(spec) => Arc::make_mut(spec).preconditions.push(precondition),
            // Dropping the check would let the effect run unchecked (an approval's, say).
            None => {
                let message = format!(
                    "precondition `{}` for command {seq}, which has no activity spec",
                    precondition.name
                );
                state.stop_with(RunError::Internal(message));
            }
        }
    }

    /// The intent of effect `name` called with `input`, as the runtime computes it; `Err`
    /// says why there is none (not a registered effect, a key that cannot be derived).
    pub fn intent(&self, name: &str, input: &Payload) -> Result<Intent, String> {
        let catalog = self.shared.catalog.as_ref();
        if catalog.options(name).is_none() {
            // As for a call of it: the run waits, stuck, for a worker that hosts it.
            self.stop(RunError::UnknownActivity(name.to_owned()));
            return Err(format!("no activity `{name}` is registered"));
        }
        let Some((version, key_arguments)) = catalog.key_arguments(name, input) else {
            return Err(format!(
                "`{name}` is not an effect: only an effect's intent can be approved"
            ));
        };
        let key_arguments = key_arguments.map_err(|message| {
            let activity = name.to_owned();
            let error = RunError::IdempotencyKey {
                activity,
                message: message.clone(),
            };
            self.stop(error);
            format!("the idempotency key of `{name}` cannot be derived: {message}")
        })?;
        let arguments = input
            .decode::<serde_json::Value>()
            .map_err(|error| format!("the input of `{name}` is not JSON: {error}"))?;
        Ok(Intent {
            operation: name.to_owned(),
            version,
            idempotency_key: idempotency_key(self.key_root(name), name, &key_arguments, version),
            arguments,
        })
    }

    /// Runs the effect issued at `effect` under `approved`. Its intent is computed here, from
    /// the command's own name and input; it is admitted when `approved` lists it and no other
    /// command ran it under the same approval (its own retries are the same command). The
    /// verdict, and the expiry, are checked right before each call.
    pub fn run_under(&self, effect: Seq, approved: &Approved) {
        let spec = self.lock().specs.get(&effect).cloned();
        let late = spec.as_ref().is_none_or(|spec| spec.polled_since_issue);
        let Some(spec) = spec.filter(|_| !late) else {
            // Its attempt may already be running: no check could come before the call any more.
            let message = "`.under(approval)` must follow the effect call before anything is \
                           awaited: `ctx.effect(e, input).under(&approval).await`"
                .to_owned();
            return self.stop(RunError::Misuse {
                seq: effect,
                message,
            });
        };
        let intent = self.intent(&spec.name, &spec.input);
        let mut state = self.lock();
        let (digest, admitted) = match intent {
            Ok(intent) => {
                let digest = intent.digest();
                (digest, state.admit(effect, &spec.name, digest, approved))
            }
            // Not an effect: never recorded in the operation log, which holds effects only.
            Err(_) => (
                spec.input.digest(),
                Err(NotApproved::NotAnEffect {
                    operation: spec.name.clone(),
                }),
            ),
        };
        let grant = Grant {
            granted: approved.granted.clone(),
            intent: digest,
        };
        let authorisation = Authorisation { grant, admitted };
        // Let go first: a spec held twice would be copied to be changed.
        drop(spec);
        if let Some(spec) = state.specs.get_mut(&effect) {
            Arc::make_mut(spec).authorisation = Some(authorisation);
        }
    }

    /// `ctx.sleep`: issues a durable timer.
    pub fn schedule_timer(&self, duration_ms: u64) -> Option<Seq> {
        let identity = timer_identity(duration_ms);
        let fire_at_ms = self.shared.clock.now_ms().saturating_add(duration_ms);
        self.lock()
            .issue(identity, |seq, identity| NewCommand::Timer {
                seq,
                identity,
                duration_ms,
                fire_at_ms,
            })
    }

    /// `ctx.artifact`: commits `content` as an immutable artifact and returns its hash. On
    /// replay the recorded commit is matched by hash: different content is a divergence.
    pub fn commit_artifact(
        &self,
        kind: &str,
        version: &str,
        metadata: Vec<(String, String)>,
        content: Payload,
    ) -> Digest {
        let hash = artifact_hash(&content);
        let identity = artifact_identity(kind, hash);
        let record = ArtifactRecord {
            kind: kind.to_owned(),
            version: version.to_owned(),
            content,
            metadata,
            workflow_id: self.shared.workflow_id.clone(),
            created_at_ms: self.shared.clock.now_ms(),
        };
        let command = |seq, identity| NewCommand::Artifact {
            seq,
            identity,
            record,
        };
        self.lock().issue(identity, command);
        hash
    }

    /// `ctx.approval`: waits for a person's decision on artifact `hash`.
    pub fn request_approval(
        &self,
        hash: Digest,
        risk: Payload,
        expires_in_ms: Option<u64>,
    ) -> Option<Seq> {
        let identity = approval_identity(hash);
        let now = self.shared.clock.now_ms();
        let expires_at_ms = expires_in_ms.map(|ms| now.saturating_add(ms));
        let command = |seq, identity| NewCommand::Approval {
            seq,
            identity,
            artifact_hash: hash,
            risk,
            expires_at_ms,
        };
        self.lock().issue(identity, command)
    }

    /// Why the workflow code runs at this point: `ResumeFromCheckpoint` while it walks
    /// recorded history (its results come from the journal), `FirstExecution` once it is past
    /// the journal's end and its commands execute live.
    pub fn replay_mode(&self) -> ReplayMode {
        match self.lock().cursor.is_replaying() {
            true => ReplayMode::ResumeFromCheckpoint,
            false => ReplayMode::FirstExecution,
        }
    }

    /// The worker's clock, for checks that run outside the workflow (an approval's expiry,
    /// right before an effect's call).
    pub fn clock(&self) -> Arc<dyn Clock> {
        self.shared.clock.clone()
    }

    /// The worker's replay-safety metrics.
    pub fn telemetry(&self) -> Telemetry {
        self.shared.telemetry.clone()
    }

    /// `ctx.signal(name)`: a durable wait for the next signal named `name`.
    pub fn schedule_signal(&self, name: &str) -> Option<Seq> {
        let identity = signal_identity(name);
        self.lock()
            .issue(identity, |seq, identity| NewCommand::Signal {
                seq,
                identity,
            })
    }

    /// `ctx.now`, `ctx.random`, `ctx.uuid`: the recorded value on replay, `fresh()` recorded on
    /// first execution. `None` if the run is stopping.
    pub fn record_value(
        &self,
        kind: CommandKind,
        fresh: impl FnOnce(&Fresh<'_>) -> Payload,
    ) -> Option<Payload> {
        self.record_named_value(kind, &kind.to_string(), fresh)
    }

    /// Like [`WorkflowCore::record_value`], under `name` (a validator's verdict).
    pub fn record_named_value(
        &self,
        kind: CommandKind,
        name: &str,
        fresh: impl FnOnce(&Fresh<'_>) -> Payload,
    ) -> Option<Payload> {
        self.record_noted_value(kind, name, fresh, None)
    }

    /// [`WorkflowCore::record_named_value`] whose new value also tells telemetry something:
    /// `note` runs after the value is written, and never for a recorded one.
    pub fn record_noted_value(
        &self,
        kind: CommandKind,
        name: &str,
        fresh: impl FnOnce(&Fresh<'_>) -> Payload,
        note: Option<TelemetryNote>,
    ) -> Option<Payload> {
        self.record_verdict_value(kind, name, fresh, note, None)
    }

    /// [`WorkflowCore::record_noted_value`] for a verdict on a streamed answer: when the value
    /// is new, `stream` says what the judged step's stream version becomes, in the same write.
    pub fn record_verdict_value(
        &self,
        kind: CommandKind,
        name: &str,
        fresh: impl FnOnce(&Fresh<'_>) -> Payload,
        note: Option<TelemetryNote>,
        stream: Option<StreamVerdict>,
    ) -> Option<Payload> {
        let identity = value_identity(kind, name);
        let mut state = self.lock();
        if state.stop.is_some() {
            return None;
        }
        match state.cursor.issue(&identity) {
            Ok(Issued::Recorded {
                value: Some(value), ..
            }) => Some(value),
            // The identity of a value on an entry that carries none: the code would go on with
            // a placeholder (the epoch, 0, a nil uuid) as if the run were stopping.
            Ok(Issued::Recorded { seq, value: None }) => {
                let message = "the journal records this value command without its value".into();
                state.stop_with(RunError::InconsistentJournal { seq, message });
                None
            }
            Ok(Issued::New { seq }) => {
                let value = fresh(&Fresh {
                    shared: &self.shared,
                    seq,
                });
                state.push_value(seq, identity, value.clone());
                state.notes.extend(note);
                state.stream_verdicts.extend(stream);
                Some(value)
            }
            Err(divergence) => {
                state.stop_with(RunError::NonDeterminism(divergence));
                None
            }
        }
    }

    /// `ctx.patched(id)`.
    pub fn patched(&self, patch_id: &str) -> bool {
        let identity = value_identity(CommandKind::Patch, patch_id);
        let mut state = self.lock();
        if state.stop.is_some() {
            return false;
        }
        match state.cursor.patched(&identity) {
            Ok(None) => false,
            Ok(Some(Issued::Recorded { .. })) => true,
            Ok(Some(Issued::New { seq })) => {
                state.push_value(seq, identity, Payload::unit());
                true
            }
            Err(divergence) => {
                state.stop_with(RunError::NonDeterminism(divergence));
                false
            }
        }
    }

    /// Polls the slot of `seq`: its resolution once the executor delivered it. The slot goes
    /// with the resolution (the futures are fused: they do not ask again).
    pub fn poll_resolution(&self, seq: Seq, cx: &mut Context<'_>) -> Poll<Resolution> {
        let mut state = self.lock();
        if state.stop.is_some() {
            return Poll::Pending;
        }
        match state.slots.remove(&seq) {
            Some(Slot::Ready(resolution)) => Poll::Ready(resolution),
            Some(Slot::Waiting(_)) | None => {
                let waiting = Slot::Waiting(Some(cx.waker().clone()));
                state.slots.insert(seq, waiting);
                Poll::Pending
            }
        }
    }

    /// The workflow dropped its wait at `seq` before it resolved (a signal, an approval or a
    /// timer that lost a `select!`): nothing is delivered to it any more, and a timer of its
    /// is cancelled. Dropping happens at the same point of every replay, so this is as
    /// deterministic as the code.
    pub fn abandon_wait(&self, seq: Seq) {
        let mut state = self.lock();
        let slot = state.slots.remove(&seq);
        if matches!(slot, Some(Slot::Ready(_))) {
            // Settled and delivered, just not seen: nothing of it is left to drop.
            return;
        }
        // Nothing is delivered to it, so what a delivery would name is not needed either.
        state.cursor.forget(seq);
        state.commands.forget(seq);
        let issued = seq < state.cursor.issued();
        state.commands.abandon(seq, issued);
    }

    /// Stops the run (sticky; the first reason wins).
    pub fn stop(&self, reason: RunError) {
        self.lock().stop_with(reason);
    }

    /// Hands `seq` its outcome. Exactly one outcome is delivered per poll, live as on replay:
    /// delivering a second before the workflow was polled is refused, since the workflow could
    /// then see two outcomes at once live and one at a time on replay, and a `select!` would
    /// take another branch. What the workflow no longer needs to know about `seq` goes.
    pub(crate) fn deliver(&self, seq: Seq, resolution: Resolution) -> Result<(), RunError> {
        let mut state = self.lock();
        if let Some(earlier) = state.delivered_unpolled {
            return Err(RunError::Internal(format!(
                "the outcome of seq {seq} was delivered before the workflow was polled after \
                 the outcome of seq {earlier}"
            )));
        }
        state.delivered_unpolled = Some(seq);
        let compensating = match state.compensations.delivered(seq, &resolution) {
            true => state.compensation_waker.take(),
            false => None,
        };
        let spec = state.specs.remove(&seq);
        if let (Some(spec), Resolution::Completed(output)) = (spec, &resolution) {
            if self.shared.catalog.is_cached(&spec.name) && !spec.snapshot {
                let stage = (spec.name.clone(), spec.input.digest());
                state.stage_cache.insert(stage, output.clone());
            }
        }
        state.cursor.forget(seq);
        state.commands.forget(seq);
        // Settled after the code dropped its wait: no future will ever take it.
        let previous = match state.commands.take_abandoned(seq) {
            true => None,
            false => state.slots.insert(seq, Slot::Ready(resolution)),
        };
        drop(state);
        // Woken outside the lock: a waker may poll, and polling locks the core.
        if let Some(Slot::Waiting(Some(waker))) = previous {
            waker.wake();
        }
        if let Some(waker) = compensating {
            waker.wake();
        }
        Ok(())
    }

    /// Whether the activity `name` is registered as a cached stage. Asked of the catalog
    /// alone, before [`WorkflowCore::stage_cache_answer`] takes the lock: most are not.
    pub(crate) fn is_cached_stage(&self, name: &str) -> bool {
        self.shared.catalog.is_cached(name)
    }

    /// The recorded result that answers the new command at `seq`, if it is a cached stage
    /// called before in this run with the same input.
    pub(crate) fn stage_cache_answer(&self, seq: Seq) -> Option<Payload> {
        let state = self.lock();
        let spec = state.specs.get(&seq)?;
        if spec.snapshot || !self.shared.catalog.is_cached(&spec.name) {
            return None;
        }
        let stage = (spec.name.clone(), spec.input.digest());
        state.stage_cache.get(&stage).cloned()
    }

    /// The code registered `undo` for the effect it just issued (`.compensate_with`). Only
    /// before anything is awaited: the effect's outcome may be delivered from then on, and an
    /// undo registered after it would wait for it for ever.
    pub fn register_compensation(
        &self,
        effect: Seq,
        undo: &str,
        options: ActivityOptions,
        input: UndoInput,
    ) {
        let mut state = self.lock();
        let spec = state.specs.get(&effect).filter(|s| !s.polled_since_issue);
        let Some(spec) = spec else {
            let message = "`.compensate_with(undo, input)` must follow the effect call before \
                           anything is awaited: `ctx.effect(e, input).compensate_with(..).await`"
                .to_owned();
            return state.stop_with(RunError::Misuse {
                seq: effect,
                message,
            });
        };
        let registration = Registration {
            effect_seq: effect,
            effect: spec.name.clone(),
            undo: undo.to_owned(),
            options,
            input: Some(input),
        };
        state.compensations.register(registration);
    }

    /// Runs the registered undos, newest first, each as an effect; settles with the undos that
    /// failed. What it undid is not undone again by a later call.
    pub fn compensate(&self) -> compensate::Compensate {
        compensate::Compensate::new(self.clone())
    }

    /// Whether an effect the code registered an undo for may still need undoing.
    pub(crate) fn has_pending_compensations(&self) -> bool {
        self.lock().compensations.pending()
    }

    /// The workflow is about to be polled: the outcome delivered last is the one it sees.
    pub(crate) fn begin_poll(&self) {
        let mut state = self.lock();
        state.delivered_unpolled = None;
        for spec in state.specs.values_mut() {
            if !spec.polled_since_issue {
                Arc::make_mut(spec).polled_since_issue = true;
            }
        }
    }

    /// What the core holds: open commands, facts kept about commands, and commands whose
    /// input is kept for (re)running them. None of it grows with the length of the history.
    pub fn footprint(&self) -> Footprint {
        let state = self.lock();
        let (open, kept) = state.commands.footprint();
        let kept = kept + state.cursor.footprint();
        Footprint {
            open_commands: open,
            kept_facts: kept + state.slots.len() + state.compensations.footprint(),
            kept_inputs: state.specs.len() + state.stage_cache.len(),
        }
    }

    /// What the next flush journals, taken under one lock: the commands the last poll issued,
    /// what they count, and the validators' verdicts. `None` when it journals nothing (no new
    /// command, no dropped wait); the verdicts then wait for the next one.
    pub(crate) fn take_flush(&self) -> Option<NewWork> {
        let mut state = self.lock();
        let commands = std::mem::take(&mut state.new_commands);
        let notes = std::mem::take(&mut state.notes);
        if commands.is_empty() && !state.commands.has_dropped_waits() {
            return None;
        }
        let verdicts = std::mem::take(&mut state.stream_verdicts);
        Some(NewWork {
            commands,
            notes,
            verdicts,
        })
    }

    /// The streamed model call at `seq` is judged by validators: its stream version waits for
    /// their verdict ([`WorkflowCore::record_verdict_value`]) to be committed.
    pub fn await_validation(&self, seq: Seq) {
        if let Some(spec) = self.lock().specs.get_mut(&seq) {
            Arc::make_mut(spec).awaits_validation = true;
        }
    }

    pub(crate) fn take_stop(&self) -> Option<RunError> {
        self.lock().stop.clone()
    }

    /// The spec of the open activity at `seq`. Every open activity has one (issuing it keeps
    /// it until its outcome is delivered), so a missing one is the executor's bug, said so.
    pub(crate) fn activity_spec(&self, seq: Seq) -> Result<Arc<ActivitySpec>, RunError> {
        let spec = self.lock().specs.get(&seq).cloned();
        spec.ok_or_else(|| missing_spec(seq))
    }

    /// [`WorkflowCore::activity_spec`] with the operation-log key the command carries (`None`
    /// for a plain activity), under one lock: an attempt asks for both.
    pub(crate) fn activity_spec_and_key(
        &self,
        seq: Seq,
    ) -> Result<(Arc<ActivitySpec>, Option<String>), RunError> {
        let state = self.lock();
        let spec = state
            .specs
            .get(&seq)
            .cloned()
            .ok_or_else(|| missing_spec(seq))?;
        Ok((spec, state.commands.effect_key(seq).map(str::to_owned)))
    }

    /// The activity's name at `seq`, without copying the rest of its spec.
    pub(crate) fn activity_name(&self, seq: Seq) -> Option<String> {
        self.lock().specs.get(&seq).map(|spec| spec.name.clone())
    }

    /// The retriever's name if the open activity at `seq` is a retrieval; `None` for any other
    /// activity. (A completion reads it with the rest of what it needs: `completed_call`.)
    pub(crate) fn retriever(&self, seq: Seq) -> Result<Option<String>, RunError> {
        let state = self.lock();
        let Some(spec) = state.specs.get(&seq) else {
            return Err(missing_spec(seq));
        };
        Ok(spec.snapshot.then(|| spec.name.clone()))
    }

    /// What a completion of the open activity at `seq` journals besides its result, read under
    /// one lock: asked fact by fact, every step took the lock once for each.
    pub(crate) fn completed_call(&self, seq: Seq) -> Result<CompletedCall, RunError> {
        let state = self.lock();
        let spec = state.specs.get(&seq).ok_or_else(|| missing_spec(seq))?;
        Ok(CompletedCall {
            retriever: spec.snapshot.then(|| spec.name.clone()),
            awaits_validation: spec.awaits_validation,
            model_call: spec.name == LLM_ACTIVITY,
            effect: state.commands.effect_key(seq).is_some(),
        })
    }
}

/// What the poll since the last flush issued ([`WorkflowCore::take_flush`]).
pub(crate) struct NewWork {
    pub(crate) commands: Vec<NewCommand>,
    pub(crate) notes: Vec<TelemetryNote>,
    pub(crate) verdicts: Vec<StreamVerdict>,
}

/// What a completion of an open activity journals besides its result
/// ([`WorkflowCore::completed_call`]).
#[derive(Debug)]
pub(crate) struct CompletedCall {
    /// The retriever's name when it is a retrieval, whose result is kept as a snapshot.
    pub(crate) retriever: Option<String>,
    /// A streamed model call whose answer validators judge: its stream version is committed
    /// with the verdict that accepts it.
    pub(crate) awaits_validation: bool,
    /// A model call: what it spent is counted.
    pub(crate) model_call: bool,
    /// An effect: its operation is committed in the same write.
    pub(crate) effect: bool,
}

impl CoreState {
    /// Whether `approved` admits intent `digest` of the effect `operation` issued at `effect`,
    /// claiming it for that command.
    fn admit(
        &mut self,
        effect: Seq,
        operation: &str,
        digest: Digest,
        approved: &Approved,
    ) -> Result<(), NotApproved> {
        let request = approved.granted.request;
        if !approved.intents.contains(&digest) {
            let listed: Vec<String> = approved.intents.iter().map(Digest::hex).collect();
            return Err(NotApproved::NotAuthorised {
                operation: operation.to_owned(),
                intent: digest.hex(),
                request,
                scope: approved.granted.scope.hex(),
                authorised: match listed.is_empty() {
                    true => "none".to_owned(),
                    false => listed.join(", "),
                },
            });
        }
        match *self
            .approval_claims
            .entry((request, digest))
            .or_insert(effect)
        {
            claimant if claimant == effect => Ok(()),
            by => Err(NotApproved::AlreadyUsed {
                request,
                intent: digest.hex(),
                by,
            }),
        }
    }

    /// Walks recorded history to the next outcome to deliver, through the commands' machines.
    pub(crate) fn next_replay_event(&mut self) -> Result<Option<ReplayEvent>, ReplayFault> {
        self.cursor.next_replay_event(&mut self.commands)
    }

    /// Issues `identity`; a new command is made by `command` from its seq and the identity.
    fn issue(
        &mut self,
        identity: CommandIdentity,
        command: impl FnOnce(Seq, CommandIdentity) -> NewCommand,
    ) -> Option<Seq> {
        self.issue_keeping(identity, command).map(|(seq, _)| seq)
    }

    /// [`CoreState::issue`], handing back the identity of a recorded command, which no new
    /// command took: a caller that needs its name then copies nothing.
    fn issue_keeping(
        &mut self,
        identity: CommandIdentity,
        command: impl FnOnce(Seq, CommandIdentity) -> NewCommand,
    ) -> Option<(Seq, Option<CommandIdentity>)> {
        if self.stop.is_some() {
            return None;
        }
        match self.cursor.issue(&identity) {
            Ok(Issued::Recorded { seq, .. }) => Some((seq, Some(identity))),
            Ok(Issued::New { seq }) => {
                self.new_commands.push(command(seq, identity));
                Some((seq, None))
            }
            Err(divergence) => {
                self.stop_with(RunError::NonDeterminism(divergence));
                None
            }
        }
    }

    fn push_value(&mut self, seq: Seq, identity: CommandIdentity, value: Payload) {
        self.new_commands.push(NewCommand::Value {
            seq,
            identity,
            value,
        });
    }

    fn stop_with(&mut self, reason: RunError) {
        if self.stop.is_none() {
            self.stop = Some(reason);
        }
    }
}

pub mod compensate;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn core() -> WorkflowCore {
        core_over(Vec::new())
    }

    fn core_over(entries: Vec<crate::journal::Entry>) -> WorkflowCore {
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::default());
        let registry = Arc::new(crate::registry::Registry::default());
        let entropy = Arc::new(crate::entropy::OsEntropy);
        let cursor = ReplayCursor::new(entries);
        let lineage = Lineage::default();
        let telemetry = Telemetry::new();
        WorkflowCore::new("wf", lineage, cursor, clock, entropy, registry, telemetry)
    }

    /// The rule that makes `select!` replay the same: a second outcome before the workflow saw
    /// the first is refused, whoever delivers it.
    #[test]
    fn a_second_outcome_before_the_next_poll_is_refused() {
        let core = core();
        let first = core.schedule_timer(1_000).unwrap();
        let second = core.schedule_timer(2_000).unwrap();
        core.begin_poll();
        core.deliver(first, Resolution::Fired).unwrap();
        let refused = core.deliver(second, Resolution::Fired).unwrap_err();
        assert!(matches!(refused, RunError::Internal(_)), "{refused}");
        core.begin_poll();
        core.deliver(second, Resolution::Fired).unwrap();
    }

    /// A precondition (an approval's check, say) for a command without a spec is never dropped
    /// in silence, which would let the effect run unchecked: the run stops and says why.
    #[test]
    fn a_precondition_for_a_command_without_a_spec_stops_the_run() {
        let core = core();
        let timer = core.schedule_timer(1_000).unwrap();
        let check: PreconditionCheck = Arc::new(|| Box::pin(async { true }));
        let name = "approved sha256:00".to_owned();
        core.add_precondition(timer, Precondition { name, check });
        let stop = core.take_stop().expect("the run stopped");
        assert!(matches!(stop, RunError::Internal(_)), "{stop}");
        assert!(matches!(
            core.activity_spec(timer),
            Err(RunError::Internal(_))
        ));
        assert!(matches!(core.retriever(timer), Err(RunError::Internal(_))));
    }

    /// A journal whose entry at a value's seq carries no value (hand-edited, say) stops the run
    /// as inconsistent, instead of handing the code a placeholder while the run goes on.
    #[test]
    fn a_recorded_value_without_its_value_stops_the_run() {
        let identity = value_identity(CommandKind::Random, &CommandKind::Random.to_string());
        let entries = vec![crate::journal::Entry::SignalAwaited { seq: 0, identity }];
        let core = core_over(entries);
        let value = core.record_value(CommandKind::Random, |_| Payload::from_u64(7));
        assert_eq!(value, None);
        let stop = core.take_stop().expect("the run stopped");
        assert!(
            matches!(stop, RunError::InconsistentJournal { seq: 0, .. }),
            "{stop}"
        );
    }

    /// A delivered outcome leaves nothing behind once the future took it.
    #[test]
    fn a_taken_outcome_keeps_no_slot() {
        let core = core();
        let seq = core.schedule_timer(1_000).unwrap();
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(core.poll_resolution(seq, &mut cx).is_pending());
        core.deliver(seq, Resolution::Fired).unwrap();
        assert!(core.poll_resolution(seq, &mut cx).is_ready());
        assert_eq!(core.footprint().kept_facts, 0);
    }

    fn held(core: &WorkflowCore) -> (usize, usize) {
        let footprint = core.footprint();
        (footprint.open_commands, footprint.kept_facts)
    }

    /// A wait dropped after its outcome was delivered (and before it was seen) leaves nothing:
    /// it is settled, not a wait to remember as dropped.
    #[test]
    fn a_wait_dropped_after_its_outcome_keeps_nothing() {
        let core = core();
        let seq = core.schedule_timer(1_000).unwrap();
        core.deliver(seq, Resolution::Fired).unwrap();
        core.abandon_wait(seq);
        assert_eq!(held(&core), (0, 0));
    }

    /// An outcome that arrives for a wait the code dropped goes nowhere and leaves nothing.
    #[test]
    fn an_outcome_for_a_dropped_wait_keeps_nothing() {
        let core = core();
        let seq = core.schedule_timer(1_000).unwrap();
        core.abandon_wait(seq);
        core.deliver(seq, Resolution::Fired).unwrap();
        assert_eq!(held(&core), (0, 0));
    }
}
