//! Activities (reads, model calls, retrievals, and effects, whose extra states are in
//! [`super::effect`]): attempts, fencing, retries with backoff, the overall deadline.

use super::{CommandState, Conflict, Decision};
use crate::journal::{Digest, Failure, Reconciliation, Seq};
use crate::options::ActivityOptions;

/// An open activity command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Activity {
    /// When it was issued (unknown for journals written before this was recorded).
    scheduled_at_ms: Option<u64>,
    /// `Some` for an effect: the key its operations are logged under.
    idempotency_key: Option<String>,
    /// One of the attempt states: `Running`, `Backoff`, and for an effect `Reconciling` and
    /// `AwaitingOperator` ([`super::effect`]).
    state: CommandState,
}

/// What follows a definite failure of an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterFailure {
    /// Another attempt, at `retry_at_ms`.
    Retry {
        /// When it may start.
        retry_at_ms: u64,
        /// The attempt's failure, journaled with the retry.
        failure: Failure,
    },
    /// The command fails with `failure`, which the workflow receives.
    Fail {
        /// The final failure (it says so when the deadline, not the policy, ended the retries).
        failure: Failure,
    },
}

impl Activity {
    /// Issued, its first attempt about to run.
    pub(super) fn scheduled(scheduled_at_ms: Option<u64>, idempotency_key: Option<String>) -> Self {
        Self {
            scheduled_at_ms,
            idempotency_key,
            state: CommandState::Running { attempt: 1 },
        }
    }

    pub(super) fn state(&self) -> CommandState {
        self.state
    }

    pub(super) fn decision(&self, seq: Seq) -> Option<Decision> {
        match self.state {
            CommandState::Running { attempt } => Some(Decision::Attempt { seq, attempt }),
            CommandState::Backoff { retry_at_ms, .. } => Some(Decision::RetryAt {
                seq,
                at_ms: retry_at_ms,
            }),
            CommandState::Reconciling {
                attempt,
                checks,
                recheck_at_ms,
            } => Some(Decision::Reconcile {
                seq,
                attempt,
                checks,
                at_ms: recheck_at_ms,
            }),
            // An operator decides; the other states are not an activity's.
            CommandState::AwaitingOperator { .. }
            | CommandState::Waiting { .. }
            | CommandState::Listening
            | CommandState::AwaitingApproval { .. } => None,
        }
    }

    /// The effect's idempotency key; `None` for a plain activity.
    pub fn idempotency_key(&self) -> Option<&str> {
        self.idempotency_key.as_deref()
    }

    /// Whether this is an effect.
    pub fn is_effect(&self) -> bool {
        self.idempotency_key.is_some()
    }

    /// When the command was issued, if the journal says.
    pub fn scheduled_at_ms(&self) -> Option<u64> {
        self.scheduled_at_ms
    }

    /// Fencing: whether an answer of `attempt` is the current one. A late answer from an
    /// attempt that timed out, or one for an attempt being reconciled, is not.
    pub fn is_current_attempt(&self, attempt: u32) -> bool {
        self.state == CommandState::Running { attempt }
    }

    /// A result of `attempt` is journaled: it must be the attempt in flight, the one running or
    /// (on replay, where a retry's start is not an entry) the one its backoff waits for. Only
    /// the current attempt's answer is ever journaled, so any other is a journal that does not
    /// add up.
    pub(super) fn completes(&self, seq: Seq, attempt: u32) -> Result<(), Conflict> {
        let in_flight = match self.state {
            CommandState::Running { attempt } => Some(attempt),
            CommandState::Backoff { next_attempt, .. } => Some(next_attempt),
            _ => None,
        };
        if in_flight == Some(attempt) {
            return Ok(());
        }
        // Attempt 0: answered without a call (a cached stage's earlier result), in the write
        // that journals the command, before any attempt could start.
        if attempt == 0 && self.state == (CommandState::Running { attempt: 1 }) {
            return Ok(());
        }
        let state = self.state;
        let message = format!("attempt {attempt} completed while the activity is {state:?}");
        Err(Conflict::inconsistent(seq, message))
    }

    /// The backoff ended: the attempt to run now. `None` if it is not backing off (a duplicate
    /// or stale retry signal).
    pub fn retry_due(&self) -> Option<u32> {
        match self.state {
            CommandState::Backoff { next_attempt, .. } => Some(next_attempt),
            _ => None,
        }
    }

    /// `attempt` failed definitely: retry under `options` (at the time `now_ms`, with the
    /// command's deterministic `jitter`), or fail the command.
    pub fn after_failure(
        &self,
        options: &ActivityOptions,
        attempt: u32,
        failure: Failure,
        now_ms: u64,
        jitter: u64,
    ) -> AfterFailure {
        let policy = &options.retry;
        let delay = policy.backoff(attempt, jitter);
        let hinted = failure.retry_after_ms.unwrap_or(0);
        let delay_ms = u64::try_from(delay.as_millis())
            .unwrap_or(u64::MAX)
            .max(hinted);
        let retry_at_ms = now_ms.saturating_add(delay_ms);
        let may_retry = failure.kind.is_retriable() && policy.allows_retry_after(attempt);
        if !may_retry {
            return AfterFailure::Fail { failure };
        }
        if self.past_deadline(options, retry_at_ms) {
            let failure = deadline_failure(failure, options);
            return AfterFailure::Fail { failure };
        }
        AfterFailure::Retry {
            retry_at_ms,
            failure,
        }
    }

    fn past_deadline(&self, options: &ActivityOptions, retry_at_ms: u64) -> bool {
        let (Some(deadline), Some(scheduled_at)) = (options.deadline, self.scheduled_at_ms) else {
            return false;
        };
        let deadline_ms = u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX);
        retry_at_ms > scheduled_at.saturating_add(deadline_ms)
    }

    /// `ActivityAttemptFailed`: the next attempt waits for `retry_at_ms`.
    pub(super) fn attempt_failed(
        &mut self,
        seq: Seq,
        attempt: u32,
        retry_at_ms: u64,
    ) -> Result<(), Conflict> {
        let Some(next_attempt) = attempt.checked_add(1) else {
            let message = format!("attempt {attempt} failed, and no attempt number follows it");
            return Err(Conflict::inconsistent(seq, message));
        };
        self.state = CommandState::Backoff {
            next_attempt,
            retry_at_ms,
        };
        Ok(())
    }

    /// The retry's backoff ended: the attempt it waited for runs. The one transition that no
    /// entry drives: time does, and on replay the same journaled backoff ends the same way.
    pub(super) fn start_retry(&mut self) -> Option<u32> {
        let attempt = self.retry_due()?;
        self.state = CommandState::Running { attempt };
        Some(attempt)
    }

    /// `EffectUncertain`.
    pub(super) fn uncertain(&mut self, seq: Seq, attempt: u32) -> Result<(), Conflict> {
        self.require_effect(seq)?;
        self.state = super::effect::uncertain(attempt);
        Ok(())
    }

    /// `EffectReconciled`: `Some(output)` if the verdict settles the command with a result.
    pub(super) fn reconciled(
        &mut self,
        seq: Seq,
        attempt: u32,
        verdict: &Reconciliation,
    ) -> Result<Option<crate::journal::Payload>, Conflict> {
        self.require_effect(seq)?;
        let (state, output) = super::effect::reconciled(seq, self.state, attempt, verdict)?;
        self.state = state;
        Ok(output)
    }

    fn require_effect(&self, seq: Seq) -> Result<(), Conflict> {
        match self.is_effect() {
            true => Ok(()),
            // Schedule entries from before effects carried no key, and no reconciliation.
            false => Err(Conflict::inconsistent(
                seq,
                "a reconciliation of a plain activity",
            )),
        }
    }
}

/// The failure of a command whose retry would start after its overall deadline.
fn deadline_failure(failure: Failure, options: &ActivityOptions) -> Failure {
    let deadline_ms = options.deadline.map_or(0, |d| d.as_millis());
    Failure {
        message: format!(
            "{} (no retry: the overall deadline of {deadline_ms} ms would pass first)",
            failure.message
        ),
        ..failure
    }
}

/// Deterministic jitter for a retry: the same workflow, command and attempt always wait the
/// same, so a journaled `retry_at_ms` is reproducible and tests are stable.
pub fn jitter(workflow_id: &str, seq: Seq, attempt: u32) -> u64 {
    let digest = Digest::of(format!("{workflow_id}|{seq}|{attempt}").as_bytes());
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest.0[..8]);
    u64::from_be_bytes(bytes)
}
