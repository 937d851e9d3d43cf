//! Effects: the operation-log protocol around an activity's attempts.
//!
//! An attempt is called only when the operation log says no earlier call can have taken
//! effect: this file is where "never call twice for one key" is decided. `prepared` is durable
//! before the call; an attempt whose outcome is unknown (`prepared` found on resume, a timeout,
//! a lost acknowledgement, an `Uncertain` error) is reconciled before anything may call again;
//! when the reconciler cannot tell after bounded rechecks, or there is none, an operator must.

use super::{CommandState, Conflict};
use crate::journal::is_oversized_placeholder;
use crate::journal::{Entry, Failure, FailureKind, Payload, ReconciledBy, Reconciliation, Seq};
use crate::operations::{OperationRecord, OperationStatus, OperatorDecision};
use crate::options::RetryPolicy;

/// Reconciler answers that cannot tell, at least, before the workflow waits for an operator.
pub const MIN_RECONCILE_CHECKS: u32 = 3;

/// Whether an attempt of an effect that failed with `failure` may have taken effect, so that it
/// is reconciled rather than retried. An at-most-once effect (one whose downstream may act and
/// still answer with an error, a 5xx after the booking was made) treats every failure of a
/// call that started as unknown, except a definite refusal (`Terminal`, or a precondition, key
/// or approval refusal the activity reported).
pub fn outcome_unknown(failure: &Failure, at_most_once: bool) -> bool {
    failure.leaves_outcome_unknown() || (at_most_once && failure.kind.is_retriable())
}

/// Where `EffectUncertain` leaves the effect: reconciling at once.
pub(super) fn uncertain(attempt: u32) -> CommandState {
    CommandState::Reconciling {
        attempt,
        checks: 0,
        recheck_at_ms: 0,
    }
}

/// Where `EffectReconciled` leaves the effect, and the output if the verdict committed it. A
/// reconciler can only have been unable to tell about an attempt being reconciled.
pub(super) fn reconciled(
    seq: Seq,
    state: CommandState,
    attempt: u32,
    verdict: &Reconciliation,
) -> Result<(CommandState, Option<Payload>), Conflict> {
    let after = match verdict {
        Reconciliation::Committed(output) => (state, Some(output.clone())),
        Reconciliation::StillUnknown { recheck_at_ms, .. } => {
            let CommandState::Reconciling { checks, .. } = state else {
                let message = format!("a reconciler's answer while the effect is {state:?}");
                return Err(Conflict::inconsistent(seq, message));
            };
            let reconciling = CommandState::Reconciling {
                attempt,
                checks: checks.saturating_add(1),
                recheck_at_ms: *recheck_at_ms,
            };
            (reconciling, None)
        }
        Reconciliation::AwaitingOperator { .. } => {
            (CommandState::AwaitingOperator { attempt }, None)
        }
        // What follows is told by the next entry (a retry or the final failure).
        Reconciliation::NotFound | Reconciliation::Failed { .. } => (state, None),
    };
    Ok(after)
}

/// What to do before a new effect command's first attempt, given what the operation log holds
/// for its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FirstCall {
    /// Nothing under the key: write `prepared` with the command, then call.
    Prepare,
    /// The log answers for the key (the same intent issued before, with the same arguments):
    /// journal this instead of calling.
    Answered(Entry),
    /// The key was used with other arguments: journal this failure instead of calling, and
    /// never hand over the earlier call's result.
    KeyConflict(Entry),
    /// An earlier run of this workflow (one reset, or continued as new) issued the intent and
    /// left its call unsettled: the command writes the record as its own (`taken`), then does
    /// what the call's next attempt would (`next`: [`NextCall::Reconcile`] or
    /// [`NextCall::AwaitOperator`]).
    TakeOver {
        /// The record, naming this command's seq; its status and attempt as they were.
        taken: Box<OperationRecord>,
        /// What follows once it is written.
        next: NextCall,
    },
}

/// A new effect at `seq` under `key` with `arguments`, given the log's record for the key.
/// `left_by_earlier_run`: no command of this run wrote the record, an earlier run of this
/// workflow did.
pub fn first_call(
    seq: Seq,
    key: &str,
    arguments: &Payload,
    found: Option<&OperationRecord>,
    left_by_earlier_run: bool,
) -> FirstCall {
    let found = found.filter(|r| !matches!(r.status, OperationStatus::NotAttempted { .. }));
    match found {
        None => FirstCall::Prepare,
        Some(record) if record.arguments != *arguments => {
            FirstCall::KeyConflict(key_conflict(seq, key, arguments, record))
        }
        Some(record) if left_by_earlier_run => take_over(seq, key, record),
        Some(record) => FirstCall::Answered(answer_from_log(seq, key, record)),
    }
}

/// Whether the run whose journal is `journal` wrote `record`, the log's record of `key`: a
/// command that writes a record is journaled in the same write, so a record of the run names
/// a command its journal schedules under the key. One it did not write was left by an earlier
/// run of the workflow (reset, or continued as new).
pub fn written_by_run(journal: &[Entry], key: &str, record: &OperationRecord) -> bool {
    journal.iter().any(|entry| {
        matches!(entry, Entry::ActivityScheduledAt { seq, idempotency_key: Some(scheduled), .. }
            if *seq == record.seq && scheduled == key)
    })
}

/// A record an earlier run left: no command of this run waits for it, so the new command is
/// the call's owner now. An outcome the log has answers it; a definite failure leaves the key
/// free for a new call; a call that may have taken effect is reconciled, or waits for the
/// operator it already waited for.
fn take_over(seq: Seq, key: &str, record: &OperationRecord) -> FirstCall {
    let attempt = record.attempt;
    let taken_with = |next| FirstCall::TakeOver {
        taken: Box::new(OperationRecord {
            seq,
            ..record.clone()
        }),
        next,
    };
    match &record.status {
        OperationStatus::FailedRetriable { .. } | OperationStatus::NotAttempted { .. } => {
            FirstCall::Prepare
        }
        OperationStatus::Prepared | OperationStatus::UnknownOutcome { .. } => {
            let failure = Failure::new(
                FailureKind::Uncertain,
                format!(
                    "an earlier run of this workflow left attempt {attempt} of `{}` {}",
                    record.operation,
                    record.status.name()
                ),
            );
            taken_with(NextCall::Reconcile { attempt, failure })
        }
        OperationStatus::AwaitingOperator { reason } => {
            let reason = reason.clone();
            taken_with(NextCall::AwaitOperator { attempt, reason })
        }
        OperationStatus::Committed { .. } | OperationStatus::FailedTerminal { .. } => {
            FirstCall::Answered(answer_from_log(seq, key, record))
        }
    }
}

/// The final failure of a call under `key` with `arguments` that the log's `record` holds with
/// others, naming both digests.
fn key_conflict(seq: Seq, key: &str, arguments: &Payload, record: &OperationRecord) -> Entry {
    let message = format!(
        "idempotency key `{key}` was used by seq {} of workflow `{}` with arguments {}, and this \
         call has arguments {}: the #[key] arguments say the same intent, the others say another \
         call; give the calls different keys, or the same arguments",
        record.seq,
        record.workflow_id,
        record.arguments.digest().hex(),
        arguments.digest().hex()
    );
    failed_from_log(seq, Failure::new(FailureKind::KeyConflict, message))
}

/// What to do before `attempt` of an effect already journaled (a retry, or the attempt in
/// flight when the previous process stopped), given the log's record for its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextCall {
    /// No call can have taken effect: write `prepared`, then call.
    Prepare {
        /// The status the log held (for telemetry: a retry after a definite failure).
        previous: Option<OperationStatus>,
    },
    /// A call of `attempt` may have taken effect: journal that its outcome is unknown.
    Reconcile {
        /// The attempt the log says may have taken effect.
        attempt: u32,
        /// Why.
        failure: Failure,
    },
    /// The key waits for an operator already: journal that this effect does too.
    AwaitOperator {
        /// The attempt the log's record is about.
        attempt: u32,
        /// What the operator is told.
        reason: String,
    },
    /// The log has the key's outcome: journal it instead of calling.
    Answered(Entry),
}

/// The log's record for `key` decides whether the effect at `seq` may call again.
pub fn next_call(seq: Seq, key: &str, found: Option<&OperationRecord>) -> NextCall {
    let Some(record) = found else {
        return NextCall::Prepare { previous: None };
    };
    match &record.status {
        OperationStatus::FailedRetriable { .. } | OperationStatus::NotAttempted { .. } => {
            let previous = Some(record.status.clone());
            NextCall::Prepare { previous }
        }
        OperationStatus::Prepared | OperationStatus::UnknownOutcome { .. } => NextCall::Reconcile {
            attempt: record.attempt,
            failure: Failure::new(
                FailureKind::Uncertain,
                "the worker stopped while the call was in flight",
            ),
        },
        OperationStatus::AwaitingOperator { reason } => NextCall::AwaitOperator {
            attempt: record.attempt,
            reason: reason.clone(),
        },
        OperationStatus::Committed { .. } | OperationStatus::FailedTerminal { .. } => {
            NextCall::Answered(answer_from_log(seq, key, record))
        }
    }
}

/// Where a run that ends (or continues as new) leaves the record of an effect it still holds
/// open: a call the code stopped waiting for. Nothing will call or reconcile it again, so it is
/// left where someone can settle it. A call that may be in flight, or whose outcome is unknown,
/// waits for an operator; one whose last attempt failed and is not retried leaves its key free
/// for the intent. `None`: the record stays as it is (settled, or waiting for an operator).
pub fn left_by_ended_run(record: &OperationRecord) -> Option<OperationStatus> {
    let attempt = record.attempt;
    match &record.status {
        OperationStatus::Prepared | OperationStatus::UnknownOutcome { .. } => {
            Some(OperationStatus::AwaitingOperator {
                reason: format!(
                    "the run ended while attempt {attempt} of `{}` was in flight, and nothing \
                     reconciles it now: did it take effect?",
                    record.operation
                ),
            })
        }
        OperationStatus::FailedRetriable { failure } => Some(OperationStatus::NotAttempted {
            failure: Failure::new(
                failure.kind,
                format!(
                    "the run ended before retrying `{}`; attempt {attempt} had failed \
                     definitely: {}",
                    record.operation, failure.message
                ),
            ),
        }),
        OperationStatus::AwaitingOperator { .. }
        | OperationStatus::Committed { .. }
        | OperationStatus::FailedTerminal { .. }
        | OperationStatus::NotAttempted { .. } => None,
    }
}

/// `record` after a decision `by` someone about its attempt, made at `now_ms`, when no command
/// waits for it: an earlier run left it, or its workflow has ended.
pub fn settled_alone(
    record: OperationRecord,
    decision: OperatorDecision,
    by: &ReconciledBy,
    now_ms: u64,
) -> OperationRecord {
    let attempt = record.attempt;
    let status = decided_status(attempt, by, decision);
    let by = Some(crate::render::reconciled_by_text(by));
    record.after(attempt, status, now_ms, by)
}

/// The status a decision about `attempt` leaves a record in when no command waits for it.
fn decided_status(attempt: u32, by: &ReconciledBy, decision: OperatorDecision) -> OperationStatus {
    match decision {
        OperatorDecision::Committed(result) => OperationStatus::Committed {
            result,
            external_ref: None,
        },
        // The downstream never acted on the key: the same intent may be issued again.
        OperatorDecision::NotFound => OperationStatus::NotAttempted {
            failure: Failure::new(
                FailureKind::Retriable,
                format!(
                    "{} found that attempt {attempt} did not take effect",
                    who(by)
                ),
            ),
        },
        OperatorDecision::Failed(message) => OperationStatus::FailedTerminal {
            failure: Failure::new(
                FailureKind::Terminal,
                format!("{} failed the effect: {message}", who(by)),
            ),
        },
    }
}

/// Who settled an effect, as a failure message names them.
pub fn who(by: &ReconciledBy) -> String {
    match by {
        ReconciledBy::Operator(name) => format!("operator `{name}`"),
        ReconciledBy::Downstream(name) => format!("the downstream (`{name}`)"),
        ReconciledBy::Reconciler => "the reconciler".to_owned(),
        ReconciledBy::OperationLog | ReconciledBy::NoReconciler => "the runtime".to_owned(),
    }
}

/// The journal entry for an effect whose key the operation log already settled (or still
/// holds in flight for another command).
fn answer_from_log(seq: Seq, key: &str, existing: &OperationRecord) -> Entry {
    match &existing.status {
        // It happened, but its result was too large to keep: the call fails as it did first.
        OperationStatus::Committed { result, .. } if is_oversized_placeholder(result) => {
            let message = format!(
                "`{}` took effect under key `{key}`, but its result was too large to journal \
                 ({})",
                existing.operation,
                String::from_utf8_lossy(result.as_bytes())
            );
            failed_from_log(seq, Failure::new(FailureKind::Terminal, message))
        }
        OperationStatus::Committed { result, .. } => Entry::EffectReconciled {
            seq,
            attempt: 0,
            by: ReconciledBy::OperationLog,
            verdict: Reconciliation::Committed(result.clone()),
        },
        OperationStatus::FailedTerminal { failure } => failed_from_log(seq, failure.clone()),
        in_flight => {
            let failure = Failure::new(
                FailureKind::Terminal,
                format!(
                    "idempotency key `{key}` is in use by seq {} of this workflow, which is \
                     {}: two calls with the same #[key] arguments are the same intent; await \
                     the first, or give them different keys",
                    existing.seq,
                    in_flight.name()
                ),
            );
            failed_from_log(seq, failure)
        }
    }
}

fn failed_from_log(seq: Seq, failure: Failure) -> Entry {
    Entry::ActivityFailed {
        seq,
        attempt: 0,
        failure,
    }
}

/// What a reconciler said about an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The effect has no reconciler.
    NoReconciler,
    /// The attempt took effect, with this result.
    Committed(Payload),
    /// It did not take effect: a retry under the same key is safe.
    NotFound,
    /// It cannot tell (or it failed, or did not answer in time): why.
    CannotTell(String),
}

/// What follows a reconciler's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterReconcile {
    /// The attempt took effect: the command completes with this result.
    Commit(Payload),
    /// It did not: the failure to retry after (or fail with, if no attempt is left).
    Retry(Failure),
    /// Ask again at `recheck_at_ms`; `checks` answers could not tell so far.
    Recheck {
        /// Answers that could not tell, this one included.
        checks: u32,
        /// When to ask again.
        recheck_at_ms: u64,
        /// What the reconciler said.
        message: String,
    },
    /// Nobody can tell automatically: an operator decides; what they are told.
    AwaitOperator {
        /// Who gave up.
        by: ReconciledBy,
        /// What the operator is told.
        reason: String,
    },
}

/// The protocol after `answer` about `attempt`, after `checks` earlier answers that could not
/// tell, under `policy`, at `now_ms`, with the recheck's deterministic `jitter`.
pub struct Reconciled<'a> {
    /// The effect's name, for what an operator is told.
    pub name: &'a str,
    /// The attempt whose outcome is unknown.
    pub attempt: u32,
    /// Earlier answers that could not tell.
    pub checks: u32,
    /// The effect's retry policy: it bounds the rechecks too.
    pub policy: &'a RetryPolicy,
    /// The time.
    pub now_ms: u64,
}

impl Reconciled<'_> {
    /// Decides what follows `answer`; `jitter` spreads the recheck.
    pub fn after(&self, answer: Answer, jitter: impl FnOnce(u32) -> u64) -> AfterReconcile {
        let attempt = self.attempt;
        let message = match answer {
            Answer::NoReconciler => {
                let reason = format!(
                    "effect `{}` attempt {attempt} may or may not have taken effect, and it has \
                     no reconciler (`#[activity(effect, reconcile = ...)]`): check the \
                     downstream for its idempotency key and resolve the operation",
                    self.name
                );
                let by = ReconciledBy::NoReconciler;
                return AfterReconcile::AwaitOperator { by, reason };
            }
            Answer::Committed(output) => return AfterReconcile::Commit(output),
            Answer::NotFound => {
                let failure = Failure::new(
                    FailureKind::Retriable,
                    format!("attempt {attempt} did not take effect downstream"),
                );
                return AfterReconcile::Retry(failure);
            }
            Answer::CannotTell(message) => message,
        };
        let checks = self.checks.saturating_add(1);
        if checks >= self.policy.max_attempts.max(MIN_RECONCILE_CHECKS) {
            let reason = format!(
                "the reconciler could not tell whether attempt {attempt} took effect after \
                 {checks} checks (last: {message}); check the downstream and resolve the \
                 operation"
            );
            let by = ReconciledBy::Reconciler;
            return AfterReconcile::AwaitOperator { by, reason };
        }
        let delay = self.policy.backoff(checks, jitter(checks));
        let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        AfterReconcile::Recheck {
            checks,
            recheck_at_ms: self.now_ms.saturating_add(delay_ms),
            message,
        }
    }
}

/// Why an operator's decision does not apply to the effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OperatorRefusal {
    /// The effect is not waiting for anyone.
    NotAwaiting,
    /// The decision is for another attempt than the one whose outcome is unknown.
    StaleAttempt {
        /// The attempt whose outcome is unknown now.
        current: u32,
    },
}

/// The attempt an operator's decision about `decided` (whichever is current, for `None`)
/// settles, for an effect in `state`.
pub fn operator_attempt(
    state: Option<super::CommandState>,
    decided: Option<u32>,
) -> Result<u32, OperatorRefusal> {
    use super::CommandState::{AwaitingOperator, Reconciling};
    let attempt = match state {
        Some(AwaitingOperator { attempt } | Reconciling { attempt, .. }) => attempt,
        _ => return Err(OperatorRefusal::NotAwaiting),
    };
    match decided {
        Some(decided) if decided != attempt => {
            Err(OperatorRefusal::StaleAttempt { current: attempt })
        }
        _ => Ok(attempt),
    }
}
