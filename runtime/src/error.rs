//! Errors, by audience: what activity and workflow authors return ([`ActivityError`],
//! [`WorkflowError`]), and what callers of the worker see ([`RunError`], [`StartError`], and
//! the refusals of the commands they send: [`SignalError`], [`ApprovalError`],
//! [`ResolveError`], [`CancelError`], which share [`Unreachable`] for what every command can
//! meet). Each refusal says its [`Refusal`] class, the one thing the HTTP API needs to answer.
//! Divergence and storage failures never reach workflow code as ordinary values: they stop the
//! run and surface here.

use std::time::Duration;

use crate::journal::{Failure, FailureKind, PayloadError};
use crate::replay::Divergence;
use crate::store::StoreError;

/// What an activity attempt reports, which decides what a retry may do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ActivityError {
    /// A retry may help (a 503, a timeout talking to a dependency).
    #[error("retriable: {message}")]
    Retriable {
        /// Cause.
        message: String,
        /// Wait at least this long before the next attempt (a `Retry-After`).
        retry_after: Option<Duration>,
    },
    /// A retry will not help (bad request, not found, not allowed).
    #[error("terminal: {message}")]
    Terminal {
        /// Cause.
        message: String,
    },
    /// The effect may or may not have happened (the request went out, no answer came back).
    #[error("uncertain: {message}")]
    Uncertain {
        /// Cause.
        message: String,
    },
    /// A precondition refused the call before it was made (an approval that does not match,
    /// a state check that failed); nothing happened downstream.
    #[error("precondition failed: {message}")]
    PreconditionFailed {
        /// Which precondition.
        message: String,
    },
    /// The effect's idempotency key was used before with other arguments: the effect was not
    /// called, and the earlier call's result is not this call's answer.
    #[error("idempotency key conflict: {message}")]
    KeyConflict {
        /// Both calls' argument digests, and where the first was made.
        message: String,
    },
    /// The effect ran under an approval that does not authorise its intent (another intent,
    /// one already used, an expired approval): it was not called. Ask for a new approval.
    #[error("not approved: {message}")]
    NotApproved {
        /// Which check refused it, with the digests compared.
        message: String,
    },
}

impl ActivityError {
    /// A failure a retry may fix.
    pub fn retriable(message: impl Into<String>) -> Self {
        ActivityError::Retriable {
            message: message.into(),
            retry_after: None,
        }
    }

    /// A failure a retry will not fix.
    pub fn terminal(message: impl Into<String>) -> Self {
        ActivityError::Terminal {
            message: message.into(),
        }
    }

    /// A failure after which the effect's outcome is unknown.
    pub fn uncertain(message: impl Into<String>) -> Self {
        ActivityError::Uncertain {
            message: message.into(),
        }
    }

    /// The failure as journaled.
    pub fn to_failure(&self) -> Failure {
        match self {
            ActivityError::Retriable {
                message,
                retry_after,
            } => Failure {
                kind: FailureKind::Retriable,
                message: message.clone(),
                retry_after_ms: retry_after.map(|d| d.as_millis().try_into().unwrap_or(u64::MAX)),
            },
            ActivityError::Terminal { message } => Failure::new(FailureKind::Terminal, message),
            ActivityError::Uncertain { message } => Failure::new(FailureKind::Uncertain, message),
            ActivityError::PreconditionFailed { message } => {
                Failure::new(FailureKind::PreconditionFailed, message)
            }
            ActivityError::KeyConflict { message } => {
                Failure::new(FailureKind::KeyConflict, message)
            }
            ActivityError::NotApproved { message } => {
                Failure::new(FailureKind::NotApproved, message)
            }
        }
    }

    /// The error a workflow sees for a journaled final failure.
    pub fn from_failure(failure: &Failure) -> Self {
        let message = failure.message.clone();
        match failure.kind {
            FailureKind::Retriable | FailureKind::Timeout => ActivityError::Retriable {
                message,
                retry_after: failure.retry_after_ms.map(Duration::from_millis),
            },
            FailureKind::Uncertain => ActivityError::Uncertain { message },
            FailureKind::Terminal
            | FailureKind::Panicked
            | FailureKind::Workflow
            | FailureKind::Cancelled => ActivityError::Terminal { message },
            FailureKind::PreconditionFailed => ActivityError::PreconditionFailed { message },
            FailureKind::KeyConflict => ActivityError::KeyConflict { message },
            FailureKind::NotApproved => ActivityError::NotApproved { message },
        }
    }
}

/// What a workflow body returns on failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkflowError {
    /// An activity failed for good and the workflow gave up.
    #[error("activity failed: {0}")]
    Activity(#[from] ActivityError),
    /// The workflow decided to fail.
    #[error("{0}")]
    Failed(String),
    /// The run ends and the workflow starts afresh under the same id, with the input given to
    /// `ctx.continue_as_new`, which returns this.
    #[error("the workflow continues as a new run")]
    ContinueAsNew,
}

impl WorkflowError {
    /// A workflow failure with `message`.
    pub fn new(message: impl Into<String>) -> Self {
        WorkflowError::Failed(message.into())
    }
}

/// Why a workflow run did not produce its result.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RunError {
    /// The workflow returned `Err` (journaled).
    #[error("workflow failed: {}", .0.message)]
    Failed(Failure),
    /// The code no longer matches its journal; the run is stopped, nothing is written, and it
    /// resumes when code that matches is deployed.
    #[error("{0}")]
    NonDeterminism(Box<Divergence>),
    /// A value does not convert: a recorded one no longer decodes into the type the code
    /// expects, or an input cannot be serialized.
    #[error("value {} does not fit the workflow code: {source}", seq.map_or("in the workflow".to_owned(), |s| format!("at seq {s}")))]
    PayloadMismatch {
        /// The command, when known.
        seq: Option<u32>,
        /// The conversion error.
        source: PayloadError,
    },
    /// The journal resolves a command with an outcome of the wrong kind (a hand-edited journal).
    #[error("journal is inconsistent at seq {seq}: {message}")]
    InconsistentJournal {
        /// The command.
        seq: u32,
        /// What is wrong.
        message: String,
    },
    /// An effect's `#[key]` arguments could not be serialized into its idempotency key.
    #[error("cannot derive the idempotency key of effect `{activity}`: {message}")]
    IdempotencyKey {
        /// The effect.
        activity: String,
        /// The serialization error.
        message: String,
    },
    /// The workflow called an activity this worker does not host.
    #[error("activity `{0}` is not registered on this worker")]
    UnknownActivity(String),
    /// The code used the API in a way that cannot be made safe; fix the code.
    #[error("misuse at seq {seq}: {message}")]
    Misuse {
        /// The command concerned.
        seq: u32,
        /// What was done, and what to do instead.
        message: String,
    },
    /// The journal names a workflow this worker does not host.
    #[error("workflow `{0}` is not registered on this worker")]
    UnknownWorkflow(String),
    /// The workflow body panicked while being polled.
    #[error("workflow code panicked: {0}")]
    Panicked(String),
    /// Reading or writing the store failed (including a corrupt record).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The worker stopped before the workflow ended; it resumes on the next start.
    #[error("the worker shut down before the workflow ended")]
    ShutDown,
    /// A test's fault plan crashed the worker here.
    #[error("injected crash: {0}")]
    Crashed(String),
    /// The executor broke one of its own rules, or panicked: a bug in Waymark, not in the
    /// workflow. The run stops without writing more and is stuck until a fixed build runs it.
    #[error("[WM0002] internal error in the executor (a Waymark bug; please report it): {0}")]
    Internal(String),
    /// The run has not ended: it is stuck (see [`StuckRun`]). It resumes when code that
    /// matches its journal is deployed.
    #[error("{0}")]
    Stuck(Box<StuckRun>),
}

/// A run that has not ended and cannot go on by itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StuckRun {
    /// The workflow.
    pub workflow_id: String,
    /// Why, as recorded.
    pub stop: crate::store::RunStop,
}

impl std::fmt::Display for StuckRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "workflow `{}` has not ended: it is stuck ({}): {}. It resumes when code that \
             matches its journal is deployed; cancel it to end it",
            self.workflow_id, self.stop.code, self.stop.message
        )
    }
}

impl RunError {
    /// Why a run that stopped with this error is stuck, or `None` if the stop is not the
    /// run's fault (a shutdown, an injected crash, a store that failed or conflicted) and the
    /// run simply resumes on the next start.
    pub fn stop_code(&self) -> Option<crate::store::StopCode> {
        use crate::store::StopCode;
        let code = match self {
            RunError::NonDeterminism(_) => StopCode::NonDeterminism,
            RunError::PayloadMismatch { .. } => StopCode::PayloadMismatch,
            RunError::InconsistentJournal { .. } => StopCode::InconsistentJournal,
            RunError::IdempotencyKey { .. } => StopCode::IdempotencyKey,
            RunError::UnknownActivity(_) => StopCode::UnknownActivity,
            RunError::UnknownWorkflow(_) => StopCode::UnknownWorkflow,
            RunError::Panicked(_) => StopCode::Panicked,
            RunError::Internal(_) => StopCode::Internal,
            RunError::Misuse { .. } => StopCode::Misuse,
            RunError::Store(StoreError::Corrupt { .. }) => StopCode::CorruptRecord,
            RunError::Failed(_)
            | RunError::Store(_)
            | RunError::ShutDown
            | RunError::Crashed(_)
            | RunError::Stuck(_) => return None,
        };
        Some(code)
    }

    /// The command a stop concerns, when it names one.
    pub fn stop_seq(&self) -> Option<u32> {
        match self {
            RunError::NonDeterminism(divergence) => Some(divergence.seq),
            RunError::PayloadMismatch { seq, .. } => *seq,
            RunError::InconsistentJournal { seq, .. } => Some(*seq),
            RunError::Misuse { seq, .. } => Some(*seq),
            _ => None,
        }
    }
}

impl From<crate::replay::ReplayFault> for RunError {
    fn from(fault: crate::replay::ReplayFault) -> Self {
        match fault {
            crate::replay::ReplayFault::Diverged(divergence) => {
                RunError::NonDeterminism(divergence)
            }
            crate::replay::ReplayFault::Inconsistent { seq, message } => {
                RunError::InconsistentJournal { seq, message }
            }
        }
    }
}

/// Why a workflow could not be started.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StartError {
    /// No workflow by that name is registered.
    #[error("workflow `{0}` is not registered on this worker")]
    UnknownWorkflow(String),
    /// The input does not decode into the workflow's input type.
    #[error("invalid input for workflow `{workflow}`: {message}")]
    InvalidInput {
        /// The workflow.
        workflow: String,
        /// What is wrong.
        message: String,
    },
    /// The request id is already used by a workflow with a different name or input.
    #[error("request id `{request_id}` already started workflow `{workflow_id}` with a different {what}")]
    RequestConflict {
        /// The request id.
        request_id: String,
        /// The workflow that holds it.
        workflow_id: String,
        /// `name` or `input`.
        what: &'static str,
    },
    /// The workflow id is taken by another workflow.
    #[error("workflow id `{0}` is already in use")]
    IdInUse(String),
    /// An id is empty or longer than the limit.
    #[error("{what} must be 1..={max} bytes, got {len}")]
    BadId {
        /// Which id.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A payload is larger than the worker journals.
    #[error("{0}")]
    PayloadTooLarge(String),
    /// The id ends in `#run-N`, which names a run a reset or a continue-as-new kept.
    #[error(
        "workflow id `{0}` ends in `#run-` and a number, which names a kept run: choose another"
    )]
    ReservedId(String),
    /// The namespace or an id cannot be used.
    #[error(transparent)]
    Namespace(#[from] crate::namespace::NamespaceError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The worker is shutting down.
    #[error("the worker is shutting down")]
    ShutDown,
}

/// What kind of refusal an error is, whatever the command: the HTTP API answers with the
/// status of its class, so a new error case is classified once, here, not in every handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// What the command names does not exist.
    NotFound,
    /// The command is malformed.
    BadRequest,
    /// The command does not fit the current state: read it again and decide anew.
    Conflict,
    /// The worker, its store or the run failed: not the caller's doing.
    Internal,
    /// The worker is stopping: another worker, or this one once restarted, can take it.
    Unavailable,
}

/// An error that refuses a caller's command.
pub trait Refused: std::error::Error {
    /// Its class.
    fn refusal(&self) -> Refusal;
}

/// Why a command did not reach a running workflow: what every command to one can meet.
///
/// The command refusals serialize, so that a workflow's owner can answer a command another
/// worker relayed to it; a store error travels as its message.
#[derive(Debug, Clone, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum Unreachable {
    /// No workflow has this id.
    #[error("no workflow with id `{0}`")]
    UnknownWorkflow(String),
    /// The workflow's run stopped (or the worker is stopping) before the command applied.
    #[error("workflow `{workflow_id}` is not running: {reason}")]
    NotRunning {
        /// The workflow.
        workflow_id: String,
        /// Why.
        reason: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(
        #[from]
        #[serde(with = "relayed_store_error")]
        StoreError,
    ),
    /// The command may have reached the worker that runs the workflow (it was taken, or
    /// the answer to sending it was lost), and no answer came back: it may or may not have
    /// applied.
    #[error("what became of the command to workflow `{workflow_id}` is unknown: {reason}; read the workflow to see whether it applied")]
    OutcomeUnknown {
        /// The workflow.
        workflow_id: String,
        /// Why no answer came.
        reason: String,
    },
}

/// A store error as a relayed answer carries it: its message.
mod relayed_store_error {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::store::StoreError;

    pub(super) fn serialize<S: Serializer>(error: &StoreError, out: S) -> Result<S::Ok, S::Error> {
        out.collect_str(error)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(input: D) -> Result<StoreError, D::Error> {
        let message = String::deserialize(input)?;
        let message = message.strip_prefix("storage error: ").unwrap_or(&message);
        Ok(StoreError::Backend(format!(
            "on the workflow's owner: {message}"
        )))
    }
}

/// An operation status's name, as a relayed answer carries it.
fn relayed_status_name<'de, D: serde::Deserializer<'de>>(
    input: D,
) -> Result<crate::operations::StatusName, D::Error> {
    let name = <String as serde::Deserialize>::deserialize(input)?;
    let mut known = crate::operations::OperationStatus::NAMES.into_iter();
    Ok(known.find(|n| *n == name).unwrap_or("in an unknown state"))
}

impl Unreachable {
    /// The workflow `workflow_id` is not running, because of `reason`.
    pub fn not_running(workflow_id: &str, reason: impl std::fmt::Display) -> Self {
        Unreachable::NotRunning {
            workflow_id: workflow_id.to_owned(),
            reason: reason.to_string(),
        }
    }

    /// The command to `workflow_id` may or may not have applied, because of `reason`.
    pub fn outcome_unknown(workflow_id: &str, reason: impl std::fmt::Display) -> Self {
        Unreachable::OutcomeUnknown {
            workflow_id: workflow_id.to_owned(),
            reason: reason.to_string(),
        }
    }
}

impl Refused for Unreachable {
    fn refusal(&self) -> Refusal {
        match self {
            Unreachable::UnknownWorkflow(_) => Refusal::NotFound,
            Unreachable::NotRunning { .. }
            | Unreachable::Store(_)
            | Unreachable::OutcomeUnknown { .. } => Refusal::Internal,
        }
    }
}

impl Refused for StartError {
    fn refusal(&self) -> Refusal {
        match self {
            StartError::UnknownWorkflow(_) => Refusal::NotFound,
            StartError::InvalidInput { .. }
            | StartError::BadId { .. }
            | StartError::ReservedId(_)
            | StartError::PayloadTooLarge(_)
            | StartError::Namespace(_) => Refusal::BadRequest,
            StartError::RequestConflict { .. } | StartError::IdInUse(_) => Refusal::Conflict,
            StartError::ShutDown => Refusal::Unavailable,
            StartError::Store(_) => Refusal::Internal,
        }
    }
}

impl Refused for StoreError {
    fn refusal(&self) -> Refusal {
        Refusal::Internal
    }
}

/// A command's error that can also be [`Unreachable`]: a store error converts into it, so
/// `?` works on reads.
macro_rules! reached_through {
    ($error:ident) => {
        impl From<StoreError> for $error {
            fn from(error: StoreError) -> Self {
                $error::Unreachable(Unreachable::Store(error))
            }
        }
    };
}

/// Why a signal was not taken.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SignalError {
    /// The workflow cannot be reached.
    #[error(transparent)]
    Unreachable(#[from] Unreachable),
    /// The workflow ended; nothing will wait for the signal.
    #[error("workflow `{workflow_id}` has ended ({status}); the signal was not kept")]
    Ended {
        /// The workflow.
        workflow_id: String,
        /// How it ended.
        status: String,
    },
    /// The signal id is empty: duplicates could not be told apart.
    #[error("a signal needs a non-empty id, so that a repeated delivery can be dropped")]
    MissingId,
    /// The payload does not serialize.
    #[error("the signal's payload does not encode: {0}")]
    Payload(String),
}

reached_through!(SignalError);

impl Refused for SignalError {
    fn refusal(&self) -> Refusal {
        match self {
            SignalError::Unreachable(reason) => reason.refusal(),
            SignalError::Ended { .. } => Refusal::Conflict,
            SignalError::MissingId | SignalError::Payload(_) => Refusal::BadRequest,
        }
    }
}

/// Why an approval decision was refused.
#[derive(Debug, Clone, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum ApprovalError {
    /// The workflow cannot be reached.
    #[error(transparent)]
    Unreachable(#[from] Unreachable),
    /// The workflow waits for no approval.
    #[error("workflow `{0}` is not waiting for an approval")]
    NotPending(String),
    /// The decision names another artifact than the one waiting for approval.
    #[error(
        "the decision is for artifact {given}, but the approval pending in workflow \
         `{workflow_id}` is for artifact {pending}; read the pending artifact and decide on it"
    )]
    HashMismatch {
        /// The workflow.
        workflow_id: String,
        /// The hash the decision named.
        given: String,
        /// The hash waiting for approval.
        pending: String,
    },
    /// The decision names another request than the one pending for that artifact.
    #[error("approval request {given} of workflow `{workflow_id}` is not pending (the pending one for this artifact is {pending})")]
    StaleRequest {
        /// The workflow.
        workflow_id: String,
        /// The request the decision named.
        given: u32,
        /// The pending request for the hash.
        pending: u32,
    },
    /// The run that asked for the approval continued as new before the decision reached it.
    /// The next run's requests are new ones, even for the same plan at the same number.
    #[error(
        "the run of workflow `{0}` that asked for this approval continued as new before the \
         decision reached it; the next run asks again"
    )]
    RunContinued(String),
    /// The request expired before the decision arrived; it resolved as expired.
    #[error("the approval request expired at {expired_at_ms} ms, before this decision")]
    Expired {
        /// When it expired.
        expired_at_ms: u64,
    },
    /// The hash is not a hash.
    #[error("`{0}` is not an artifact hash (expected `sha256:` and 64 hex digits)")]
    MalformedHash(String),
}

reached_through!(ApprovalError);

impl Refused for ApprovalError {
    fn refusal(&self) -> Refusal {
        match self {
            ApprovalError::Unreachable(reason) => reason.refusal(),
            ApprovalError::MalformedHash(_) => Refusal::BadRequest,
            ApprovalError::NotPending(_)
            | ApprovalError::HashMismatch { .. }
            | ApprovalError::StaleRequest { .. }
            | ApprovalError::RunContinued(_)
            | ApprovalError::Expired { .. } => Refusal::Conflict,
        }
    }
}

/// Why an operator's resolution was refused.
#[derive(Debug, Clone, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum ResolveError {
    /// The operation's workflow cannot be reached.
    #[error(transparent)]
    Unreachable(#[from] Unreachable),
    /// No operation has this key.
    #[error("no operation with idempotency key `{0}`")]
    UnknownOperation(String),
    /// The operation is not waiting for anyone.
    #[error("operation `{key}` is {status}, not awaiting an operator")]
    NotAwaitingOperator {
        /// The key.
        key: String,
        /// Its status.
        #[serde(deserialize_with = "relayed_status_name")]
        status: crate::operations::StatusName,
    },
    /// The decision is for an attempt the workflow has moved past (another decision, or the
    /// reconciler, settled it first).
    #[error("operation `{key}` is at attempt {current}, not attempt {decided}; read it again")]
    StaleAttempt {
        /// The key.
        key: String,
        /// The attempt the decision was made for.
        decided: u32,
        /// The attempt the workflow is at.
        current: u32,
    },
    /// The decision was made on the record as it was before a transition since: the same
    /// attempt number may belong to a later call of the key now.
    #[error("operation `{key}` changed since it was read (revision {decided}, now {current}); read it again")]
    StaleRevision {
        /// The key.
        key: String,
        /// The revision the decision was made on.
        decided: u32,
        /// The record's revision now.
        current: u32,
    },
    /// A "committed" decision's result is not the effect's output type.
    #[error("the result given for operation `{key}` is not a `{operation}` output: {message}")]
    ResultMismatch {
        /// The key.
        key: String,
        /// The effect.
        operation: String,
        /// Why it does not decode.
        message: String,
    },
}

reached_through!(ResolveError);

/// `found`, the record of `key`, if it waits for a decision (one made `on` it as it is now);
/// else why a decision is refused. A `prepared` record waits for one too when
/// `no_call_in_flight`: no run will settle it, because its workflow has ended (a run's end
/// cuts its calls off with it) or an earlier run of the workflow left it.
pub(crate) fn awaiting_decision(
    key: &str,
    found: Option<crate::operations::OperationRecord>,
    on: crate::operations::DecidedOn,
    no_call_in_flight: bool,
) -> Result<crate::operations::OperationRecord, ResolveError> {
    let record = found.filter(|record| record.is_filed_under(key));
    let record = record.ok_or_else(|| ResolveError::UnknownOperation(key.to_owned()))?;
    if !record.status.takes_decision(no_call_in_flight) {
        return Err(ResolveError::NotAwaitingOperator {
            key: key.to_owned(),
            status: record.status.name(),
        });
    }
    if let Some(decided) = on.attempt.filter(|a| *a != record.attempt) {
        return Err(ResolveError::StaleAttempt {
            key: key.to_owned(),
            decided,
            current: record.attempt,
        });
    }
    stale_revision(key, &record, on).map_or(Ok(record), Err)
}

/// Why a decision made `on` an earlier revision of `record` is refused, if it was.
pub(crate) fn stale_revision(
    key: &str,
    record: &crate::operations::OperationRecord,
    on: crate::operations::DecidedOn,
) -> Option<ResolveError> {
    let current = record.revision();
    let decided = on.revision.filter(|decided| *decided != current)?;
    Some(ResolveError::StaleRevision {
        key: key.to_owned(),
        decided,
        current,
    })
}

impl Refused for ResolveError {
    fn refusal(&self) -> Refusal {
        match self {
            ResolveError::Unreachable(reason) => reason.refusal(),
            ResolveError::UnknownOperation(_) => Refusal::NotFound,
            ResolveError::ResultMismatch { .. } => Refusal::BadRequest,
            ResolveError::NotAwaitingOperator { .. }
            | ResolveError::StaleAttempt { .. }
            | ResolveError::StaleRevision { .. } => Refusal::Conflict,
        }
    }
}

/// Why a reader's acknowledgement of a stream was refused.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AckError {
    /// The workflow cannot be reached.
    #[error(transparent)]
    Unreachable(#[from] Unreachable),
    /// The channel is not a name a reader may use.
    #[error("bad channel `{0}`: 1 to 64 characters of letters, digits, `-`, `_` and `.`")]
    BadChannel(String),
    /// The event acknowledged was never generated.
    #[error("{0}")]
    NotGenerated(String),
}

reached_through!(AckError);

impl Refused for AckError {
    fn refusal(&self) -> Refusal {
        match self {
            AckError::Unreachable(reason) => reason.refusal(),
            AckError::BadChannel(_) => Refusal::BadRequest,
            AckError::NotGenerated(_) => Refusal::Conflict,
        }
    }
}

/// Why a deletion did not apply: nothing was deleted.
#[derive(Debug, Clone, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum DeleteError {
    /// The workflow cannot be reached.
    #[error(transparent)]
    Unreachable(#[from] Unreachable),
    /// It has not ended: only an ended workflow is deleted.
    #[error(
        "workflow `{workflow_id}` has not ended (it is {status}): cancel it, or wait for its end"
    )]
    NotEnded {
        /// The workflow.
        workflow_id: String,
        /// Its status's name.
        status: String,
    },
    /// It holds operations whose outcome nobody has settled: they are kept, with the workflow,
    /// until someone decides each one.
    #[error("{}", crate::store::unsettled_text(workflow_id, keys))]
    Unsettled {
        /// The workflow.
        workflow_id: String,
        /// The idempotency keys of the unsettled operations, in key order.
        keys: Vec<String>,
    },
}

reached_through!(DeleteError);

impl Refused for DeleteError {
    fn refusal(&self) -> Refusal {
        match self {
            DeleteError::Unreachable(reason) => reason.refusal(),
            DeleteError::NotEnded { .. } | DeleteError::Unsettled { .. } => Refusal::Conflict,
        }
    }
}

/// Why a fork (or a reset) was refused: nothing was written.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ForkError {
    /// The source workflow cannot be reached.
    #[error(transparent)]
    Unreachable(#[from] Unreachable),
    /// The new workflow cannot be started (its id, its input, its name).
    #[error(transparent)]
    Start(#[from] StartError),
    /// The point to fork at is not one of the source's entries a run can go on from.
    #[error("cannot fork workflow `{workflow_id}` at entry {at}: {reason}")]
    BadPoint {
        /// The source.
        workflow_id: String,
        /// The point asked for.
        at: u64,
        /// Why not.
        reason: String,
    },
    /// An effect the source issued may have happened, and no one knows yet: the fork would
    /// not know whether to call it again. Settle it first, or name it to fire again.
    #[error(
        "operation `{key}` of workflow `{workflow_id}` is {status}: whether it took effect is \
         not known yet (its run reconciles it, or an operator resolves it); fork once it is \
         settled, or name `{operation}` to fire again in the fork"
    )]
    Unsettled {
        /// The source.
        workflow_id: String,
        /// The operation's key.
        key: String,
        /// Its activity name.
        operation: String,
        /// Its status's name.
        status: String,
    },
    /// Only a stuck run is reset: one that runs could be writing its journal.
    #[error("workflow `{workflow_id}` is {status}: only a stuck run is reset (fork it instead)")]
    NotStuck {
        /// The workflow.
        workflow_id: String,
        /// Its status's name.
        status: String,
    },
    /// An effect named to fire again is authorised by an approval the fork keeps: its scope
    /// names the effect's keys, which firing again would change.
    #[error(
        "`{operation}` is authorised by approval scope {scope}, which the fork keeps: fork \
         before that approval was requested to fire it again"
    )]
    RefireApproved {
        /// The effect.
        operation: String,
        /// The scope's hash.
        scope: String,
    },
    /// An operation named to fire again is not an effect this worker hosts.
    #[error("`{0}` is not an effect registered on this worker: only effects fire again")]
    NotAnEffect(String),
}

reached_through!(ForkError);

impl Refused for ForkError {
    fn refusal(&self) -> Refusal {
        match self {
            ForkError::Unreachable(reason) => reason.refusal(),
            ForkError::Start(error) => error.refusal(),
            ForkError::BadPoint { .. }
            | ForkError::NotAnEffect(_)
            | ForkError::RefireApproved { .. } => Refusal::BadRequest,
            ForkError::Unsettled { .. } | ForkError::NotStuck { .. } => Refusal::Conflict,
        }
    }
}

/// Why a cancellation did not apply.
#[derive(Debug, Clone, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum CancelError {
    /// The workflow cannot be reached.
    #[error(transparent)]
    Unreachable(#[from] Unreachable),
    /// It ended already.
    #[error("workflow `{0}` has already ended")]
    Ended(String),
}

reached_through!(CancelError);

impl Refused for CancelError {
    fn refusal(&self) -> Refusal {
        match self {
            CancelError::Unreachable(reason) => reason.refusal(),
            CancelError::Ended(_) => Refusal::Conflict,
        }
    }
}
