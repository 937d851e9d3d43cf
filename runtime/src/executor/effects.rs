//! Effects: the executor's side of the operation log.
//!
//! Every effect attempt is bracketed by the operation log: `prepared` is durable before the
//! call (for the first attempt in the same batch as the command itself), and the outcome is
//! written in the same batch as the journal entry that explains it. Whenever the log says an
//! attempt's outcome is unknown (`prepared` found on resume, a timeout, a lost acknowledgement,
//! `ActivityError::Uncertain`), the effect is reconciled before anything else may call it again:
//! the reconciler asks the downstream by key, and without one, or when it cannot tell after
//! bounded rechecks, the workflow parks until an operator decides.

use futures::future::Either;
use tracing::{info, warn};

use super::Host;
use super::{Executor, FailureOutcome, FlushPlan, Mail, Start, Unapplied};
use crate::error::{ResolveError, RunError};
use crate::faults::Boundary;
use crate::journal::{Entry, Failure, FailureKind, ReconciledBy, Reconciliation, Seq};
use crate::operations::{OperationRecord, OperationStatus, OperatorDecision};
use crate::registry::{EffectRegistration, ReconcileOutcome};
use crate::replay::{CommandState, Resolution};
use crate::store::{Transition, WorkflowStatus};

/// Reconciler answers that cannot tell, at least, before the workflow waits for an operator.
const MIN_RECONCILE_CHECKS: u32 = 3;

impl<H: Host> Executor<H> {
    pub(super) fn is_effect(&self, seq: Seq) -> bool {
        self.effect_key(seq).is_some()
    }

    /// The key recorded with the command (not recomputed: code with another version must keep
    /// the key the operation was prepared under).
    pub(super) fn effect_key(&self, seq: Seq) -> Option<String> {
        let state = self.core.lock();
        state.cursor.meta(seq)?.idempotency_key.clone()
    }

    fn effect_registration(&self, name: &str) -> Option<EffectRegistration> {
        self.host.registry().activity(name)?.effect.clone()
    }

    /// The operation record of the effect at `seq`, with `status`; `None` for a plain activity.
    pub(super) fn operation(
        &self,
        seq: Seq,
        attempt: u32,
        status: OperationStatus,
    ) -> Result<Option<(String, OperationRecord)>, RunError> {
        let Some(key) = self.effect_key(seq) else {
            return Ok(None);
        };
        let spec = self.core.activity_spec(seq)?;
        // The version the key was derived under, which code deployed since may have bumped.
        let recorded_version = key.rsplit_once("|v").and_then(|(_, v)| v.parse().ok());
        let version = recorded_version.ok_or_else(|| RunError::InconsistentJournal {
            seq,
            message: format!("idempotency key `{key}` does not end in its version (`|v<n>`)"),
        })?;
        let record = OperationRecord {
            workflow_id: self.id.clone(),
            seq,
            operation: spec.name,
            version,
            arguments: spec.input,
            preconditions: spec.preconditions.iter().map(|p| p.name.clone()).collect(),
            attempt,
            status,
        };
        Ok(Some((key, record)))
    }

    /// A new effect command: `prepared` joins the command's batch, unless the log already
    /// holds this key (the same intent issued before), which then answers without a call.
    pub(super) async fn plan_effect(
        &mut self,
        seq: Seq,
        key: String,
        plan: &mut FlushPlan,
    ) -> Result<Start, RunError> {
        let in_batch = plan.operations.iter().find(|(k, _)| *k == key);
        let existing = match in_batch {
            Some((_, record)) => Some(record.clone()),
            None => self.read_operation(&key).await?,
        };
        let existing =
            existing.filter(|r| !matches!(r.status, OperationStatus::NotAttempted { .. }));
        let Some(existing) = existing else {
            plan.operations
                .extend(self.operation(seq, 1, OperationStatus::Prepared)?);
            return Ok(Start::Attempt { seq });
        };
        info!(workflow_id = %self.id, seq, %key, status = existing.status.name(),
            "effect key already in the operation log; not calling again");
        let (entry, resolution) = answer_from_log(seq, &key, &existing);
        self.core.lock().cursor.set(seq, CommandState::Done);
        plan.entries.push(entry);
        Ok(Start::Resolved { seq, resolution })
    }

    /// Starts `attempt` of `seq`. For an effect, first asks the operation log whether a call is
    /// safe: a `prepared` or `unknown_outcome` record means an earlier call may have taken
    /// effect, so it is reconciled instead. `true` if the log settled the command.
    pub(super) async fn begin_attempt(&mut self, seq: Seq, attempt: u32) -> Result<(), RunError> {
        self.strike(seq, attempt, Boundary::BeforePrepared)?;
        let Some(key) = self.effect_key(seq) else {
            self.spawn_attempt(seq, attempt);
            return Ok(());
        };
        let found = self.read_operation(&key).await?;
        let status = found.as_ref().map(|record| &record.status);
        match status {
            None
            | Some(
                OperationStatus::FailedRetriable { .. } | OperationStatus::NotAttempted { .. },
            ) => {
                let previous = status.cloned();
                let prepared = self.operation(seq, attempt, OperationStatus::Prepared)?;
                let mut transition = Transition::append(&self.id, &self.record, Vec::new());
                transition.operations.extend(prepared);
                self.commit(transition).await?;
                self.observe_effect_attempt(seq, attempt, previous.as_ref());
                self.spawn_attempt(seq, attempt);
                Ok(())
            }
            Some(OperationStatus::Prepared | OperationStatus::UnknownOutcome { .. }) => {
                let earlier = found.map_or(attempt, |record| record.attempt);
                let failure = Failure::new(
                    FailureKind::Uncertain,
                    "the worker stopped while the call was in flight",
                );
                self.mark_uncertain(seq, earlier, failure).await?;
                Ok(())
            }
            Some(OperationStatus::AwaitingOperator { .. }) => {
                let earlier = found.map_or(attempt, |record| record.attempt);
                let parked = CommandState::AwaitingOperator { attempt: earlier };
                self.core.lock().cursor.set(seq, parked);
                Ok(())
            }
            Some(OperationStatus::Committed { .. } | OperationStatus::FailedTerminal { .. }) => {
                let record = found.expect("matched Some");
                let (entry, resolution) = answer_from_log(seq, &key, &record);
                let transition = Transition::append(&self.id, &self.record, vec![entry]);
                self.commit(transition).await?;
                self.resolve(seq, resolution);
                Ok(())
            }
        }
    }

    /// Journals that `attempt`'s outcome is unknown and starts reconciling it.
    pub(super) async fn mark_uncertain(
        &mut self,
        seq: Seq,
        attempt: u32,
        failure: Failure,
    ) -> Result<(), RunError> {
        warn!(workflow_id = %self.id, seq, attempt, cause = %failure,
            "effect outcome unknown; reconciling before any retry");
        let status = OperationStatus::UnknownOutcome {
            failure: failure.clone(),
        };
        let entry = Entry::EffectUncertain {
            seq,
            attempt,
            failure,
        };
        let mut transition = Transition::append(&self.id, &self.record, vec![entry]);
        transition
            .operations
            .extend(self.operation(seq, attempt, status)?);
        self.commit(transition).await?;
        let now = self.host.clock().now_ms();
        self.core.lock().cursor.begin_reconciling(seq, attempt, now);
        self.forget_mode(seq);
        self.observe_reconciling(seq);
        self.spawn_reconcile(seq, attempt);
        Ok(())
    }

    pub(super) fn schedule_reconcile(&mut self, seq: Seq, attempt: u32, checks: u32, at_ms: u64) {
        if at_ms <= self.host.clock().now_ms() {
            self.spawn_reconcile(seq, attempt);
        } else {
            let recheck = Mail::RecheckDue {
                seq,
                attempt,
                checks,
            };
            self.send_at(at_ms, recheck);
        }
    }

    /// Asks the reconciler again, unless something settled the command (or moved it to another
    /// attempt or check) since this recheck was scheduled: one reconciler chain per attempt.
    pub(super) fn on_recheck_due(&mut self, seq: Seq, attempt: u32, checks: u32) {
        let state = self.core.lock().cursor.state(seq);
        let same = matches!(state, Some(CommandState::Reconciling { attempt: a, checks: c, .. })
            if a == attempt && c == checks);
        if same {
            self.spawn_reconcile(seq, attempt);
        }
    }

    /// Runs the effect's reconciler on the task set; its answer comes back as an event.
    fn spawn_reconcile(&mut self, seq: Seq, attempt: u32) {
        let spec = match self.core.activity_spec(seq) {
            Ok(spec) => spec,
            Err(error) => return self.core.stop(error),
        };
        let Some(effect) = self.effect_registration(&spec.name) else {
            self.core.stop(RunError::UnknownActivity(spec.name));
            return;
        };
        let info = self.activity_info(seq, attempt, &spec.name);
        let reconciling = (effect.reconcile)(info, spec.input);
        // A reconciler is bounded like an attempt: one that hangs counts as "cannot tell".
        let timeout = spec.options.start_to_close_timeout.map(|timeout| {
            let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
            let deadline = self.host.clock().now_ms().saturating_add(timeout_ms);
            self.host.clock().sleep_until(deadline)
        });
        let events = self.events.clone();
        self.spawn_task(async move {
            let outcome = match (reconciling, timeout) {
                (Some(reconciling), Some(timeout)) => {
                    match futures::future::select(reconciling, timeout).await {
                        Either::Left((outcome, _)) => Some(outcome),
                        Either::Right(((), _)) => Some(Err(Failure::new(
                            FailureKind::Timeout,
                            "the reconciler did not answer within the start-to-close timeout",
                        ))),
                    }
                }
                (Some(reconciling), None) => Some(reconciling.await),
                (None, _) => None,
            };
            let _ = events.send(Mail::Reconciled {
                seq,
                attempt,
                outcome,
            });
        });
    }

    pub(super) async fn on_reconciled(
        &mut self,
        seq: Seq,
        attempt: u32,
        outcome: Option<Result<ReconcileOutcome, Failure>>,
    ) -> Result<(), RunError> {
        let state = self.core.lock().cursor.state(seq);
        let Some(CommandState::Reconciling {
            attempt: current,
            checks,
            ..
        }) = state
        else {
            return Ok(());
        };
        if current != attempt {
            return Ok(());
        }
        let by = ReconciledBy::Reconciler;
        match outcome {
            None => {
                let reason = self.no_reconciler_reason(seq, attempt);
                let by = ReconciledBy::NoReconciler;
                self.park(seq, attempt, by, reason).await?;
                Ok(())
            }
            Some(Ok(ReconcileOutcome::Committed(output))) => {
                self.commit_reconciled(seq, attempt, by, output).await
            }
            Some(Ok(ReconcileOutcome::NotFound)) => self.not_found(seq, attempt, by).await,
            Some(Ok(ReconcileOutcome::StillUnknown(message))) => {
                self.still_unknown(seq, attempt, checks.saturating_add(1), message)
                    .await?;
                Ok(())
            }
            Some(Err(failure)) => {
                let message = format!("the reconciler failed: {}", failure.message);
                self.still_unknown(seq, attempt, checks.saturating_add(1), message)
                    .await?;
                Ok(())
            }
        }
    }

    fn no_reconciler_reason(&self, seq: Seq, attempt: u32) -> String {
        let name = self.core.activity_name(seq);
        let name = name.unwrap_or_else(|| format!("at seq {seq}"));
        format!(
            "effect `{name}` attempt {attempt} may or may not have taken effect, and it has no \
             reconciler (`#[activity(effect, reconcile = ...)]`): check the downstream for its \
             idempotency key and resolve the operation"
        )
    }

    async fn commit_reconciled(
        &mut self,
        seq: Seq,
        attempt: u32,
        by: ReconciledBy,
        output: crate::journal::Payload,
    ) -> Result<(), RunError> {
        let entry = Entry::EffectReconciled {
            seq,
            attempt,
            by,
            verdict: Reconciliation::Committed(output.clone()),
        };
        let status = OperationStatus::Committed {
            result: output.clone(),
            external_ref: None,
        };
        let mut transition = Transition::append(&self.id, &self.record, vec![entry]);
        transition
            .operations
            .extend(self.operation(seq, attempt, status)?);
        transition.stream.extend(self.action_executed(seq, &output));
        transition.record.status = self.status_without(seq);
        self.commit(transition).await?;
        self.resolve(seq, Resolution::Completed(output));
        Ok(())
    }

    /// The attempt did not take effect: retry with the same key, or fail when none is left.
    async fn not_found(
        &mut self,
        seq: Seq,
        attempt: u32,
        by: ReconciledBy,
    ) -> Result<(), RunError> {
        let verdict = Entry::EffectReconciled {
            seq,
            attempt,
            by,
            verdict: Reconciliation::NotFound,
        };
        let failure = Failure::new(
            FailureKind::Retriable,
            format!("attempt {attempt} did not take effect downstream"),
        );
        let outcome = self.after_failure(seq, attempt, failure, vec![verdict])?;
        self.apply_failure(outcome).await
    }

    async fn still_unknown(
        &mut self,
        seq: Seq,
        attempt: u32,
        checks: u32,
        message: String,
    ) -> Result<(), RunError> {
        let policy = self.core.activity_spec(seq)?.options.retry;
        if checks >= policy.max_attempts.max(MIN_RECONCILE_CHECKS) {
            let reason = format!(
                "the reconciler could not tell whether attempt {attempt} took effect after \
                 {checks} checks (last: {message}); check the downstream and resolve the \
                 operation"
            );
            return self
                .park(seq, attempt, ReconciledBy::Reconciler, reason)
                .await;
        }
        let delay = policy.backoff(checks, super::jitter(&self.id, seq, checks));
        let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        let recheck_at_ms = self.host.clock().now_ms().saturating_add(delay_ms);
        let entry = Entry::EffectReconciled {
            seq,
            attempt,
            by: ReconciledBy::Reconciler,
            verdict: Reconciliation::StillUnknown {
                message,
                recheck_at_ms,
            },
        };
        self.commit(Transition::append(&self.id, &self.record, vec![entry]))
            .await?;
        let state = CommandState::Reconciling {
            attempt,
            checks,
            recheck_at_ms,
        };
        self.core.lock().cursor.set(seq, state);
        let recheck = Mail::RecheckDue {
            seq,
            attempt,
            checks,
        };
        self.send_at(recheck_at_ms, recheck);
        Ok(())
    }

    /// Nobody can tell automatically: the workflow waits for an operator.
    async fn park(
        &mut self,
        seq: Seq,
        attempt: u32,
        by: ReconciledBy,
        reason: String,
    ) -> Result<(), RunError> {
        warn!(workflow_id = %self.id, seq, attempt, %reason, "effect awaits an operator");
        let entry = Entry::EffectReconciled {
            seq,
            attempt,
            by,
            verdict: Reconciliation::AwaitingOperator {
                reason: reason.clone(),
            },
        };
        let status = OperationStatus::AwaitingOperator { reason };
        let mut transition = Transition::append(&self.id, &self.record, vec![entry]);
        transition
            .operations
            .extend(self.operation(seq, attempt, status)?);
        transition.record.status = WorkflowStatus::AwaitingOperator;
        self.commit(transition).await?;
        let parked = CommandState::AwaitingOperator { attempt };
        self.core.lock().cursor.set(seq, parked);
        Ok(())
    }

    /// The workflow status once `seq` no longer waits for an operator.
    pub(super) fn status_without(&self, seq: Seq) -> WorkflowStatus {
        let unresolved = self.core.lock().cursor.unresolved();
        let others_parked = unresolved.iter().any(|(other, state)| {
            *other != seq && matches!(state, CommandState::AwaitingOperator { .. })
        });
        if others_parked {
            WorkflowStatus::AwaitingOperator
        } else {
            WorkflowStatus::Running
        }
    }

    /// A precondition refused the call: the command fails terminally (journaled), while the
    /// operation log says `not_attempted`, since the downstream never saw the key.
    pub(super) async fn on_precondition_failed(
        &mut self,
        seq: Seq,
        attempt: u32,
        name: &str,
    ) -> Result<(), RunError> {
        if !self.core.lock().cursor.is_current_attempt(seq, attempt) {
            return Ok(());
        }
        warn!(workflow_id = %self.id, seq, attempt, precondition = name,
            "precondition refused the effect; not calling it");
        let failure = Failure::new(
            FailureKind::PreconditionFailed,
            format!("precondition `{name}` does not hold; the effect was not called"),
        );
        let status = OperationStatus::NotAttempted {
            failure: failure.clone(),
        };
        self.fail_finally(seq, attempt, failure, Vec::new(), status)
            .await
    }

    /// Applies an operator's decision for an effect whose outcome is unknown. `Ok(())` if it
    /// delivered a result to the workflow.
    pub(super) async fn on_operator_decision(
        &mut self,
        seq: Seq,
        decided: u32,
        decision: OperatorDecision,
        operator: &str,
    ) -> Result<(), Unapplied<ResolveError>> {
        let state = self.core.lock().cursor.state(seq);
        let key = self.effect_key(seq).unwrap_or_default();
        let attempt = match state {
            Some(
                CommandState::AwaitingOperator { attempt }
                | CommandState::Reconciling { attempt, .. },
            ) => attempt,
            _ => {
                let status = self.operation_status_name(&key).await?;
                return Err(Unapplied::Refused(ResolveError::NotAwaitingOperator {
                    key,
                    status,
                }));
            }
        };
        if attempt != decided {
            let current = attempt;
            let stale = ResolveError::StaleAttempt {
                key,
                decided,
                current,
            };
            return Err(Unapplied::Refused(stale));
        }
        info!(workflow_id = %self.id, seq, attempt, operator, ?decision, "operator decision");
        let by = ReconciledBy::Operator(operator.to_owned());
        match decision {
            OperatorDecision::Committed(output) => {
                Ok(self.commit_reconciled(seq, attempt, by, output).await?)
            }
            OperatorDecision::NotFound => Ok(self.operator_retry(seq, attempt, by).await?),
            OperatorDecision::Failed(message) => {
                Ok(self.operator_fail(seq, attempt, by, message).await?)
            }
        }
    }

    async fn operation_status_name(&mut self, key: &str) -> Result<&'static str, RunError> {
        let record = self.read_operation(key).await?;
        Ok(record.map_or("unknown", |record| record.status.name()))
    }

    /// The operation log's record for `key`, read off the async threads.
    async fn read_operation(&mut self, key: &str) -> Result<Option<OperationRecord>, RunError> {
        let key = key.to_owned();
        let read = self.host.read(move |store| store.operation(&key));
        Ok(read.await?)
    }

    /// The operator says the attempt did not happen: the next attempt runs now, even past the
    /// retry policy's limit, because a person decided it.
    async fn operator_retry(
        &mut self,
        seq: Seq,
        attempt: u32,
        by: ReconciledBy,
    ) -> Result<(), RunError> {
        let verdict = Entry::EffectReconciled {
            seq,
            attempt,
            by,
            verdict: Reconciliation::NotFound,
        };
        let outcome = FailureOutcome::Retry {
            seq,
            attempt,
            failure: Failure::new(
                FailureKind::Retriable,
                format!("an operator found that attempt {attempt} did not take effect"),
            ),
            retry_at_ms: self.host.clock().now_ms(),
            prefix: vec![verdict],
        };
        self.record.status = self.status_without(seq);
        self.observe_operator_restart(seq);
        self.apply_failure(outcome).await
    }

    async fn operator_fail(
        &mut self,
        seq: Seq,
        attempt: u32,
        by: ReconciledBy,
        message: String,
    ) -> Result<(), RunError> {
        let ReconciledBy::Operator(operator) = &by else {
            return Ok(());
        };
        let failure = Failure::new(
            FailureKind::Terminal,
            format!("operator `{operator}` failed the effect: {message}"),
        );
        let verdict = Entry::EffectReconciled {
            seq,
            attempt,
            by: by.clone(),
            verdict: Reconciliation::Failed { message },
        };
        let outcome = FailureOutcome::Final {
            seq,
            attempt,
            failure,
            prefix: vec![verdict],
        };
        self.record.status = self.status_without(seq);
        self.apply_failure(outcome).await
    }
}

/// The journal entry and resolution for an effect whose key the operation log already settled
/// (or still holds in flight for another command).
fn answer_from_log(seq: Seq, key: &str, existing: &OperationRecord) -> (Entry, Resolution) {
    match &existing.status {
        OperationStatus::Committed { result, .. } => {
            let entry = Entry::EffectReconciled {
                seq,
                attempt: 0,
                by: ReconciledBy::OperationLog,
                verdict: Reconciliation::Committed(result.clone()),
            };
            (entry, Resolution::Completed(result.clone()))
        }
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

fn failed_from_log(seq: Seq, failure: Failure) -> (Entry, Resolution) {
    let entry = Entry::ActivityFailed {
        seq,
        attempt: 0,
        failure: failure.clone(),
    };
    (entry, Resolution::Failed(failure))
}
