//! Effects: the I/O of the operation-log protocol, whose decisions are
//! [`crate::machines::effect`]'s.
//!
//! Every effect attempt is bracketed by the operation log: `prepared` is durable before the
//! call (for the first attempt in the same batch as the command itself), and the outcome is
//! written in the same batch as the journal entry that explains it. Here the log is read, the
//! reconciler runs, and what the machine decides is journaled.

use futures::future::Either;
use tracing::{info, warn};

use super::{action_executed, attempts, Host};
use super::{Executor, FailureOutcome, FlushPlan, Mail, Unapplied};
use crate::approvals::NotApproved;
use crate::error::{awaiting_decision, stale_revision};
use crate::error::{ResolveError, RunError};
use crate::faults::Boundary;
use crate::journal::{Entry, Failure, FailureKind, ReconciledBy, Reconciliation, Seq};
use crate::machines::activity::jitter;
use crate::machines::effect::{self, settled_alone, who};
use crate::machines::effect::{AfterReconcile, Answer, FirstCall, NextCall, Reconciled};
use crate::machines::CommandState;
use crate::operations::{
    add_operations, DecidedOn, OperationRecord, OperationStatus, OperatorDecision,
};
use crate::registry::{EffectRegistration, ReconcileOutcome};
use crate::store::{Transition, WorkflowStatus};

impl<H: Host> Executor<H> {
    pub(super) fn is_effect(&self, seq: Seq) -> bool {
        self.effect_key(seq).is_some()
    }

    /// The key recorded with the command (not recomputed: code with another version must keep
    /// the key the operation was prepared under).
    pub(super) fn effect_key(&self, seq: Seq) -> Option<String> {
        let state = self.core.lock();
        state.commands.effect_key(seq).map(str::to_owned)
    }

    /// The key an effect named `name` calls its downstream with: its operation-log key
    /// `row_key`, or for a fork the same key of the workflow its keys derive from.
    pub(super) fn business_key(&self, name: &str, row_key: &str) -> String {
        self.core.lineage().business_key(&self.id, name, row_key)
    }

    fn effect_registration(&self, name: &str) -> Option<EffectRegistration> {
        self.host.registry().activity(name)?.effect.clone()
    }

    /// Whether the effect at `seq` is registered as at most once.
    pub(super) fn at_most_once(&self, seq: Seq) -> bool {
        let name = self.core.activity_name(seq).unwrap_or_default();
        let registry = self.host.registry();
        let effect = registry.activity(&name).and_then(|a| a.effect.as_ref());
        effect.is_some_and(|effect| effect.at_most_once)
    }

    /// The operation record of the effect at `seq` after its transition to `status`; `None`
    /// for a plain activity.
    pub(super) async fn operation(
        &mut self,
        seq: Seq,
        attempt: u32,
        status: OperationStatus,
    ) -> Result<Option<(String, OperationRecord)>, RunError> {
        self.operation_settled(seq, attempt, status, None).await
    }

    /// [`Executor::operation`], settled `by` a reconciler or an operator.
    pub(super) async fn operation_settled(
        &mut self,
        seq: Seq,
        attempt: u32,
        status: OperationStatus,
        by: Option<ReconciledBy>,
    ) -> Result<Option<(String, OperationRecord)>, RunError> {
        let Some(key) = self.effect_key(seq) else {
            return Ok(None);
        };
        let last = self.last_operation(seq, &key).await?;
        let by = by.map(|by| crate::render::reconciled_by_text(&by));
        let record = self.transition(&key, seq, last, attempt, status, by)?;
        Ok(Some((key, record)))
    }

    /// The record under `key` after the transition of `seq` to `status`: `last` (the record
    /// the key holds, if any: its history and external reference are kept) with the command's
    /// own arguments, and its preconditions and approval for a call about to be made (or
    /// none); a status that tells of the last call keeps what that call ran under. Remembered
    /// once written
    /// ([`Executor::remember_operations`]).
    fn transition(
        &mut self,
        key: &str,
        seq: Seq,
        last: Option<OperationRecord>,
        attempt: u32,
        status: OperationStatus,
        by: Option<String>,
    ) -> Result<OperationRecord, RunError> {
        let spec = self.core.activity_spec(seq)?;
        // The version the key was derived under, which code deployed since may have bumped.
        let recorded_version = key.rsplit_once("|v").and_then(|(_, v)| v.parse().ok());
        let version = recorded_version.ok_or_else(|| RunError::InconsistentJournal {
            seq,
            message: format!("idempotency key `{key}` does not end in its version (`|v<n>`)"),
        })?;
        // A call about to be made, or none at all, is this command's; any other status tells
        // of the last call, which ran under what its record says (a command that took the
        // record over from an earlier run may run under another approval).
        let tells_of_last_call = !matches!(
            status,
            OperationStatus::Prepared | OperationStatus::NotAttempted { .. }
        );
        let (external_ref, history, last_call) = match last {
            Some(last) => {
                let call = tells_of_last_call.then_some((last.approval, last.preconditions));
                (last.external_ref, last.history, call)
            }
            None => (None, Vec::new(), None),
        };
        let (approval, preconditions) = last_call.unwrap_or_else(|| {
            let approval = spec.authorisation.as_ref().map(|a| a.grant.clone());
            (
                approval,
                spec.preconditions.iter().map(|p| p.name.clone()).collect(),
            )
        });
        let record = OperationRecord {
            workflow_id: String::from(&*self.id),
            seq,
            operation: spec.name.clone(),
            version,
            arguments: spec.input.clone(),
            preconditions,
            attempt,
            status: OperationStatus::Prepared,
            approval,
            external_ref,
            history,
        };
        let now_ms = self.host.clock().now_ms();
        Ok(record.after(attempt, status, now_ms, by))
    }

    /// Keeps each record just written that a later transition of its command builds on, in
    /// place of reading it back: the written record itself, not a copy made before the write.
    pub(super) fn remember_operations(&mut self, written: Vec<(String, OperationRecord)>) {
        for (_, record) in written {
            // Settled for good, or the key left free (refused before the call, or found not to
            // have taken effect): no transition of this command follows.
            let last = record.status.is_final()
                || matches!(record.status, OperationStatus::NotAttempted { .. });
            if !last {
                self.operations.insert(record.seq, record);
            }
        }
    }

    /// The record `seq` last wrote under `key`, taken from memory, or read from the log when
    /// this run has not written one yet (after a restart).
    async fn last_operation(
        &mut self,
        seq: Seq,
        key: &str,
    ) -> Result<Option<OperationRecord>, RunError> {
        match self.operations.remove(&seq) {
            Some(record) => Ok(Some(record)),
            None => self.read_operation(key).await,
        }
    }

    /// Remembers the external reference an attempt that did not succeed learnt, so the
    /// commit that settles it later (a reconciler's, an operator's) keeps it.
    pub(super) async fn learn_external_ref(
        &mut self,
        seq: Seq,
        reference: Option<String>,
    ) -> Result<(), RunError> {
        let (Some(reference), Some(key)) = (reference, self.effect_key(seq)) else {
            return Ok(());
        };
        let last = self.last_operation(seq, &key).await?;
        if let Some(mut record) = last {
            record.external_ref = Some(reference);
            self.operations.insert(seq, record);
        }
        Ok(())
    }

    /// A new effect command: `prepared` joins the command's batch, unless the log already
    /// holds this key (the same intent issued before), which then answers without a call, or
    /// whose record an earlier run left unsettled, which the command takes over. `true` if
    /// the log answered or the record was taken over (neither must be lost to a crash).
    pub(super) async fn plan_effect(
        &mut self,
        seq: Seq,
        key: String,
        plan: &mut FlushPlan,
    ) -> Result<bool, RunError> {
        // The key's last record in this write is the one that holds: an earlier command of
        // the same intent may have been refused (`not_attempted`) before a later one prepared.
        let in_batch = plan.operations.iter().rfind(|(k, _)| *k == key);
        let (found, left_by_earlier_run) = match in_batch {
            // Planned in this flush: another command of this run wrote it.
            Some((_, record)) => (Some(record.clone()), false),
            None => {
                let found = self.read_operation(&key).await?;
                let left = match &found {
                    Some(record) => self.left_by_earlier_run(&key, record).await?,
                    None => false,
                };
                (found, left)
            }
        };
        let spec = self.core.activity_spec(seq)?;
        let first = effect::first_call(seq, &key, &spec.input, found.as_ref(), left_by_earlier_run);
        match first {
            FirstCall::Prepare => {
                if let Some(refused) = self.refused_at_issue(seq)? {
                    // Decided already: refused in this write, with no `prepared` a crash could
                    // leave behind for a call that is never made.
                    let failure = attempts::not_approved_failure(&refused);
                    let status = OperationStatus::NotAttempted {
                        failure: failure.clone(),
                    };
                    let refusal = self.transition(&key, seq, found, 1, status, None)?;
                    add_operations(&mut plan.operations, [(key, refusal)]);
                    plan.entries.push(Entry::ActivityFailed {
                        seq,
                        attempt: 1,
                        failure,
                    });
                    let unlisted = matches!(refused, NotApproved::NotAuthorised { .. });
                    plan.approval_mismatches += u32::from(unlisted);
                    return Ok(true);
                }
                // Under the key given: the command's entry, which names it, is not applied yet.
                let status = OperationStatus::Prepared;
                let prepared = self.transition(&key, seq, found, 1, status, None)?;
                add_operations(&mut plan.operations, [(key, prepared)]);
                Ok(false)
            }
            FirstCall::Answered(entry) => {
                info!(workflow_id = %self.id, seq, %key,
                    "effect key already in the operation log; not calling again");
                plan.entries.push(entry);
                Ok(true)
            }
            FirstCall::KeyConflict(entry) => {
                warn!(workflow_id = %self.id, seq, %key,
                    "effect key already used with other arguments; not calling");
                let operation = self.core.activity_name(seq).unwrap_or_default();
                plan.key_conflicts.push(operation);
                plan.entries.push(entry);
                Ok(true)
            }
            FirstCall::TakeOver { taken, next } => {
                let from_seq = found.map(|record| record.seq);
                warn!(workflow_id = %self.id, seq, %key, ?from_seq,
                    status = taken.status.name(),
                    "an earlier run of this workflow left the effect's call unsettled; \
                     this command takes it over");
                // The command's from now on, in the write that journals the command: a
                // decision about the record reaches this command, and the run's end hands
                // it to an operator if it is still open then.
                add_operations(&mut plan.operations, [(key, *taken)]);
                plan.taken_over.push((seq, next));
                Ok(true)
            }
        }
    }

    /// Whether `record`, which the log holds for the key of a new command, was left by an
    /// earlier run of this workflow (reset, or continued as new) rather than written by a
    /// command of this run ([`effect::written_by_run`]). A record naming another workflow is
    /// never taken over. Only a record a new command could take over is looked into, and such
    /// a record is rare: the journal is read then.
    async fn left_by_earlier_run(
        &mut self,
        key: &str,
        record: &OperationRecord,
    ) -> Result<bool, RunError> {
        let may_be_taken_over = record.status.is_unsettled()
            || matches!(record.status, OperationStatus::FailedRetriable { .. });
        if !may_be_taken_over || record.workflow_id != *self.id {
            return Ok(false);
        }
        let id = String::from(&*self.id);
        let journal = self.host.read(move |store| store.journal(&id)).await?;
        Ok(!effect::written_by_run(&journal, key, record))
    }

    /// Why the approval the effect at `seq` runs under refuses it already, when it does: not
    /// listed, used by another command, or expired by now.
    fn refused_at_issue(&self, seq: Seq) -> Result<Option<NotApproved>, RunError> {
        let spec = self.core.activity_spec(seq)?;
        let now_ms = self.host.clock().now_ms();
        let authorisation = spec.authorisation.as_ref();
        Ok(authorisation.and_then(|a| a.admit(now_ms).err()))
    }

    /// Starts `attempt` of `seq`. For an effect, first asks the operation log whether a call is
    /// safe: a `prepared` or `unknown_outcome` record means an earlier call may have taken
    /// effect, so it is reconciled instead.
    pub(super) async fn begin_attempt(&mut self, seq: Seq, attempt: u32) -> Result<(), RunError> {
        self.strike(seq, attempt, Boundary::BeforePrepared)?;
        let Some(key) = self.effect_key(seq) else {
            self.spawn_attempt(seq, attempt);
            return Ok(());
        };
        let found = self.read_operation(&key).await?;
        let next = effect::next_call(seq, &key, found.as_ref());
        Box::pin(self.perform_next_call(seq, attempt, next)).await
    }

    /// Performs what the operation log decided before `attempt` of the effect at `seq`.
    pub(super) async fn perform_next_call(
        &mut self,
        seq: Seq,
        attempt: u32,
        next: NextCall,
    ) -> Result<(), RunError> {
        match next {
            NextCall::Prepare { previous } => {
                let prepared = self
                    .operation(seq, attempt, OperationStatus::Prepared)
                    .await?;
                let mut transition = Transition::append(self.id.clone(), &self.record, Vec::new());
                add_operations(&mut transition.operations, prepared);
                self.commit(transition).await?;
                self.observe_effect_attempt(seq, attempt, previous.as_ref());
                self.spawn_attempt(seq, attempt);
                Ok(())
            }
            NextCall::Reconcile { attempt, failure } => {
                self.mark_uncertain(seq, attempt, failure).await
            }
            NextCall::AwaitOperator { attempt, reason } => {
                let entry = Entry::EffectReconciled {
                    seq,
                    attempt,
                    by: ReconciledBy::OperationLog,
                    verdict: Reconciliation::AwaitingOperator { reason },
                };
                let mut transition = Transition::append(self.id.clone(), &self.record, vec![entry]);
                transition.record.status = WorkflowStatus::AwaitingOperator;
                self.commit(transition).await
            }
            NextCall::Answered(entry) => {
                let transition = Transition::append(self.id.clone(), &self.record, vec![entry]);
                self.commit(transition).await
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
        let mut transition = Transition::append(self.id.clone(), &self.record, vec![entry]);
        let operation = self.operation(seq, attempt, status).await?;
        add_operations(&mut transition.operations, operation);
        self.commit(transition).await?;
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
        let state = self.core.lock().commands.state(seq);
        let same = matches!(state, Some(CommandState::Reconciling { attempt: a, checks: c, .. })
            if a == attempt && c == checks);
        if same {
            self.spawn_reconcile(seq, attempt);
        }
    }

    /// Runs the effect's reconciler on the task set; its answer comes back as an event.
    fn spawn_reconcile(&mut self, seq: Seq, attempt: u32) {
        let (spec, key) = match self.core.activity_spec_and_key(seq) {
            Ok(found) => found,
            Err(error) => return self.core.stop(error),
        };
        let Some(effect) = self.effect_registration(&spec.name) else {
            self.core.stop(RunError::UnknownActivity(spec.name.clone()));
            return;
        };
        let cell = std::sync::Arc::default();
        let info = self.activity_info(seq, attempt, &spec.name, &cell, key.as_deref());
        let reconciling = (effect.reconcile)(info, spec.input.clone());
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
        let state = self.core.lock().commands.state(seq);
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
        let policy = self.core.activity_spec(seq)?.options.retry.clone();
        let name = self.core.activity_name(seq);
        let name = name.unwrap_or_else(|| format!("at seq {seq}"));
        let reconciled = Reconciled {
            name: &name,
            attempt,
            checks,
            policy: &policy,
            now_ms: self.host.clock().now_ms(),
        };
        let id = self.id.clone();
        let after = reconciled.after(answer(outcome), |checks| jitter(&id, seq, checks));
        let by = ReconciledBy::Reconciler;
        match after {
            AfterReconcile::Commit(output) => {
                self.commit_reconciled(seq, attempt, by, output).await
            }
            AfterReconcile::Retry(failure) => {
                Box::pin(self.not_found(seq, attempt, by, failure)).await
            }
            AfterReconcile::Recheck {
                checks,
                recheck_at_ms,
                message,
            } => {
                let verdict = Reconciliation::StillUnknown {
                    message,
                    recheck_at_ms,
                };
                let entry = Entry::EffectReconciled {
                    seq,
                    attempt,
                    by,
                    verdict,
                };
                self.commit(Transition::append(
                    self.id.clone(),
                    &self.record,
                    vec![entry],
                ))
                .await?;
                let recheck = Mail::RecheckDue {
                    seq,
                    attempt,
                    checks,
                };
                self.send_at(recheck_at_ms, recheck);
                Ok(())
            }
            AfterReconcile::AwaitOperator { by, reason } => {
                self.park(seq, attempt, by, reason).await
            }
        }
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
            by: by.clone(),
            verdict: Reconciliation::Committed(output.clone()),
        };
        // The reference an earlier attempt learnt is kept by the record.
        let status = OperationStatus::Committed {
            result: output.clone(),
            external_ref: None,
        };
        let mut transition = Transition::append(self.id.clone(), &self.record, vec![entry]);
        let record = self
            .operation_settled(seq, attempt, status, Some(by))
            .await?;
        let executed = record.as_ref().map(|op| action_executed(seq, op, &output));
        transition.stream.extend(executed);
        add_operations(&mut transition.operations, record);
        transition.record.status = self.status_without(seq);
        self.commit(transition).await
    }

    /// The attempt did not take effect: retry with the same key, or fail when none is left.
    async fn not_found(
        &mut self,
        seq: Seq,
        attempt: u32,
        by: ReconciledBy,
        failure: Failure,
    ) -> Result<(), RunError> {
        let verdict = not_found_verdict(seq, attempt, by);
        let outcome = self.after_failure(seq, attempt, failure, vec![verdict])?;
        Box::pin(self.apply_failure(outcome)).await
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
            by: by.clone(),
            verdict: Reconciliation::AwaitingOperator {
                reason: reason.clone(),
            },
        };
        let status = OperationStatus::AwaitingOperator { reason };
        let mut transition = Transition::append(self.id.clone(), &self.record, vec![entry]);
        let record = self.operation_settled(seq, attempt, status, Some(by));
        add_operations(&mut transition.operations, record.await?);
        transition.record.status = WorkflowStatus::AwaitingOperator;
        self.commit(transition).await
    }

    /// The workflow status once `seq` no longer waits for an operator.
    pub(super) fn status_without(&self, seq: Seq) -> WorkflowStatus {
        if self.core.lock().commands.others_await_operator(seq) {
            WorkflowStatus::AwaitingOperator
        } else {
            WorkflowStatus::Running
        }
    }

    /// A check right before the call refused it: the command fails terminally (journaled),
    /// while the operation log says `not_attempted`, since the downstream never saw the key.
    pub(super) async fn on_refused(
        &mut self,
        seq: Seq,
        attempt: u32,
        failure: Failure,
    ) -> Result<(), RunError> {
        if !self.core.lock().commands.is_current_attempt(seq, attempt) {
            return Ok(());
        }
        warn!(workflow_id = %self.id, seq, attempt, kind = failure.kind.name(),
            reason = %failure.message, "the effect was refused right before its call; not calling it");
        let status = OperationStatus::NotAttempted {
            failure: failure.clone(),
        };
        self.fail_finally(seq, attempt, failure, Vec::new(), status)
            .await
    }

    /// Applies an operator's decision for an effect whose outcome is unknown, made `on` the
    /// record as its decider read it (an attempt, and a revision when given). `Ok(())` if it
    /// delivered a result to the workflow.
    pub(super) async fn on_operator_decision(
        &mut self,
        seq: Seq,
        key: String,
        on: DecidedOn,
        decision: OperatorDecision,
        by: ReconciledBy,
    ) -> Result<(), Unapplied<ResolveError>> {
        // The caller checked the record before sending the decision; this run may have moved
        // it on since, and nothing else writes it while this run holds it.
        if on.revision.is_some() {
            let found = self.read_operation(&key).await?;
            if let Some(stale) = found.and_then(|record| stale_revision(&key, &record, on)) {
                return Err(Unapplied::Refused(stale));
            }
        }
        // The decision names its key's record, and the record its seq: a run continued as new
        // or reset numbers its commands again, so the seq may hold another command now, or
        // none, and the record waits for the decision alone, unless a command of this run
        // took it over since it was read.
        if self.effect_key(seq).as_deref() != Some(key.as_str()) {
            return Box::pin(self.settle_left_by_earlier_run(key, on, decision, by)).await;
        }
        let state = self.core.lock().commands.state(seq);
        let attempt = match effect::operator_attempt(state, on.attempt) {
            Ok(attempt) => attempt,
            Err(effect::OperatorRefusal::NotAwaiting) => {
                let record = self.read_operation(&key).await?;
                let status = record.as_ref().map_or("unknown", |r| r.status.name());
                let refused = ResolveError::NotAwaitingOperator { key, status };
                return Err(Unapplied::Refused(refused));
            }
            Err(effect::OperatorRefusal::StaleAttempt { current }) => {
                let stale = ResolveError::StaleAttempt {
                    key,
                    // Given: only a decision about a named attempt is stale.
                    decided: on.attempt.unwrap_or(current),
                    current,
                };
                return Err(Unapplied::Refused(stale));
            }
        };
        info!(workflow_id = %self.id, seq, attempt, ?by, ?decision, "operator decision");
        match decision {
            OperatorDecision::Committed(output) => {
                Ok(self.commit_reconciled(seq, attempt, by, output).await?)
            }
            // The reconciler (the sweep) is not a person: its not-found retries under the
            // effect's retry policy, and fails the effect once no attempt is left.
            OperatorDecision::NotFound if by == ReconciledBy::Reconciler => {
                self.record.status = self.status_without(seq);
                let failure = Failure::new(
                    FailureKind::Retriable,
                    format!("the reconciler found that attempt {attempt} did not take effect"),
                );
                Ok(Box::pin(self.not_found(seq, attempt, by, failure)).await?)
            }
            OperatorDecision::NotFound => {
                Ok(Box::pin(self.operator_retry(seq, attempt, by)).await?)
            }
            OperatorDecision::Failed(message) => {
                Ok(Box::pin(self.operator_fail(seq, attempt, by, message)).await?)
            }
        }
    }

    /// A decision about an operation an earlier run of this workflow left waiting (it
    /// continued as new, or was reset, first). A command of this run that took the record over
    /// after the decision read it gets the decision. Otherwise no command of this run waits for
    /// it, and the decision settles the log's record alone: committed, the record answers the
    /// intent if a later command issues it again; found not to have taken effect, it leaves the
    /// key free for one; failed, it answers with the failure.
    async fn settle_left_by_earlier_run(
        &mut self,
        key: String,
        on: DecidedOn,
        decision: OperatorDecision,
        by: ReconciledBy,
    ) -> Result<(), Unapplied<ResolveError>> {
        let found = self.read_operation(&key).await?;
        // Read before a command of this run took the record over: the decision is that
        // command's, which waits for it.
        if let Some(taken) = found.as_ref().map(|record| record.seq) {
            if self.effect_key(taken).as_deref() == Some(key.as_str()) {
                let decide = self.on_operator_decision(taken, key, on, decision, by);
                return Box::pin(decide).await;
            }
        }
        // No command of this run holds it, so no call of it is in flight: a `prepared` record
        // (a reset's discarded tail) is decided like one waiting for an operator.
        let no_call_in_flight = true;
        let record =
            awaiting_decision(&key, found, on, no_call_in_flight).map_err(Unapplied::Refused)?;
        info!(workflow_id = %self.id, seq = record.seq, attempt = on.attempt, %key, ?by, ?decision,
            "decision about an operation an earlier run left; settling its record alone");
        let settled = settled_alone(record, decision, &by, self.host.clock().now_ms());
        let mut transition = Transition::append(self.id.clone(), &self.record, Vec::new());
        transition.operations.push((key, settled));
        Ok(self.commit(transition).await?)
    }

    /// The records of the effects this run still holds open as it ends or continues as new,
    /// each where the run's end leaves it ([`effect::left_by_ended_run`]): the run's tasks
    /// stop with it, so nothing calls or reconciles them after.
    pub(super) async fn left_open_by_ending_run(
        &mut self,
    ) -> Result<Vec<(String, OperationRecord)>, RunError> {
        let open: Vec<(Seq, String)> = {
            let core = self.core.lock();
            let seqs = core
                .commands
                .open_commands()
                .into_iter()
                .map(|(seq, _)| seq);
            let keyed = seqs.filter_map(|seq| Some((seq, core.commands.effect_key(seq)?)));
            keyed.map(|(seq, key)| (seq, key.to_owned())).collect()
        };
        let mut left = Vec::new();
        for (seq, key) in open {
            // A record another command wrote (this one failed as the key in use) is that
            // command's to settle.
            let Some(record) = self.last_operation(seq, &key).await? else {
                continue;
            };
            if record.seq != seq {
                continue;
            }
            if let Some(status) = effect::left_by_ended_run(&record) {
                let now_ms = self.host.clock().now_ms();
                warn!(workflow_id = %self.id, seq, %key, from = record.status.name(),
                    to = status.name(), "the run ends with the effect open");
                let attempt = record.attempt;
                left.push((key, record.after(attempt, status, now_ms, None)));
            }
        }
        Ok(left)
    }

    /// The operation log's record for `key`: from the store's memory when it holds it (a
    /// key just written, or none, as a new effect's usually is), else read off the async
    /// threads, saving a round trip to the blocking pool on every new effect.
    async fn read_operation(&mut self, key: &str) -> Result<Option<OperationRecord>, RunError> {
        if let Some(found) = self.host.store().operation_in_memory(key) {
            return Ok(found?);
        }
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
        let found = format!(
            "{} found that attempt {attempt} did not take effect",
            who(&by)
        );
        let verdict = not_found_verdict(seq, attempt, by);
        let outcome = FailureOutcome::Retry {
            seq,
            attempt,
            failure: Failure::new(FailureKind::Retriable, found),
            retry_at_ms: self.host.clock().now_ms(),
            prefix: vec![verdict],
        };
        self.record.status = self.status_without(seq);
        self.observe_operator_restart(seq);
        Box::pin(self.apply_failure(outcome)).await
    }

    async fn operator_fail(
        &mut self,
        seq: Seq,
        attempt: u32,
        by: ReconciledBy,
        message: String,
    ) -> Result<(), RunError> {
        let failure = Failure::new(
            FailureKind::Terminal,
            format!("{} failed the effect: {message}", who(&by)),
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
        Box::pin(self.apply_failure(outcome)).await
    }
}

/// The verdict that `attempt` did not take effect, found by `by`.
fn not_found_verdict(seq: Seq, attempt: u32, by: ReconciledBy) -> Entry {
    let verdict = Reconciliation::NotFound;
    Entry::EffectReconciled {
        seq,
        attempt,
        by,
        verdict,
    }
}

/// A reconciler's outcome as the effect's machine takes it.
fn answer(outcome: Option<Result<ReconcileOutcome, Failure>>) -> Answer {
    match outcome {
        None => Answer::NoReconciler,
        Some(Ok(ReconcileOutcome::Committed(output))) => Answer::Committed(output),
        Some(Ok(ReconcileOutcome::NotFound)) => Answer::NotFound,
        Some(Ok(ReconcileOutcome::StillUnknown(message))) => Answer::CannotTell(message),
        Some(Err(failure)) => {
            Answer::CannotTell(format!("the reconciler failed: {}", failure.message))
        }
    }
}
