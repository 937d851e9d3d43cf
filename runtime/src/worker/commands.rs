//! Commands from callers to a workflow: signals, approval decisions, operators' resolutions,
//! cancellation. Each is checked against the stored record first, then routed to the resident
//! run (or written to the store directly, for a run that is not resident).

use super::*;

use crate::error::awaiting_decision;
use crate::machines::effect::{left_by_ended_run, settled_alone, written_by_run};
use crate::operations::{key_prefix, DecidedOn};

/// Every operation of `namespace` (of every namespace for `None`) an operator's decision is
/// taken about now, by idempotency key, whatever its workflow's status. Those that wait for a
/// decision, and the unsettled ones no run will make or settle any more: of a workflow that
/// ended, or `prepared` under a command a reset discarded. A call in flight is not listed, nor
/// an operation of a stuck workflow (a decision waits until the run is fixed, reset or
/// cancelled). This is the status check [`Worker::resolve_operation`] applies.
///
/// A row that does not read (the operation's, its workflow's, or the journal a row is checked
/// against) is left out and logged: one corrupt row must not hide every other operation from
/// the people who settle them, and its error would name it to any caller. So is a row filed
/// under the keys of a workflow its record does not name: nobody's to settle.
pub fn operations_awaiting_decision(
    store: &dyn Store,
    namespace: Option<&str>,
) -> Result<Vec<(String, OperationRecord)>, StoreError> {
    let awaited = decisions_awaited(store, namespace, &|_| true)?;
    Ok(awaited.into_iter().map(|a| (a.key, a.record)).collect())
}

/// An operation a decision is taken about now, as [`operations_awaiting_decision`] finds it.
pub(super) struct DecisionAwaited {
    pub(super) key: String,
    pub(super) record: OperationRecord,
    /// A command of the workflow's run acts on the record: it rechecks an `unknown_outcome`
    /// (a `prepared` one it holds in flight is not listed). Never so once the workflow ended,
    /// nor when an earlier run left the record (a reset discarded its command, or the workflow
    /// continued as new); an `awaiting_operator` one a run only waits on.
    pub(super) run_acts_on_it: bool,
    /// Since when, on the worker's clock, the record has stood still: its last event or, for
    /// one an earlier run left behind, the start of the current run, whichever is later.
    pub(super) still_since_ms: u64,
}

/// [`operations_awaiting_decision`], with what it found out about each call, of the keys
/// `wanted` takes only (nothing else is read about the others). Only unsettled operations are
/// read ([`Store::unsettled_operations`]): a store's settled ones, however many, cost nothing.
pub(super) fn decisions_awaited(
    store: &dyn Store,
    namespace: Option<&str>,
    wanted: &dyn Fn(&str) -> bool,
) -> Result<Vec<DecisionAwaited>, StoreError> {
    let prefix = match namespace {
        Some(namespace) if namespace != crate::namespace::DEFAULT => {
            format!("{namespace}{}", crate::namespace::SEPARATOR)
        }
        _ => String::new(),
    };
    // A key and its workflow's id are in one namespace: a row that says otherwise is nobody's.
    let in_namespace = |key: &str, workflow_id: &str| {
        namespace.is_none_or(|n| {
            crate::namespace::split(key).0 == n && crate::namespace::split(workflow_id).0 == n
        })
    };
    let mut reads = Reads::new(store);
    let mut awaited = Vec::new();
    for (key, record) in store.unsettled_operations(&prefix)? {
        if !wanted(&key) {
            continue;
        }
        let record = match record {
            Ok(record)
                if in_namespace(&key, &record.workflow_id) && record.is_filed_under(&key) =>
            {
                record
            }
            Ok(_) => continue,
            Err(error) => {
                warn!(%key, %error, "an operation row that does not read is not listed");
                continue;
            }
        };
        if !record.status.is_unsettled() {
            continue;
        }
        match reads.decision_awaited(&key, &record) {
            Ok(Some((run_acts_on_it, still_since_ms))) => awaited.push(DecisionAwaited {
                key,
                record,
                run_acts_on_it,
                still_since_ms,
            }),
            Ok(None) => {}
            Err(error) => warn!(%key, %error,
                "an operation whose workflow or journal does not read is not listed"),
        }
    }
    Ok(awaited)
}

/// What [`operations_awaiting_decision`] reads about the workflows of the rows it lists, each
/// once: their status, and the journal of the last one whose `prepared` or `unknown_outcome`
/// row it checked (an operation's rows follow its workflow's id, so one workflow's rows come
/// together).
struct Reads<'s> {
    store: &'s dyn Store,
    statuses: HashMap<String, Option<WorkflowStatus>>,
    journal: Option<(String, Vec<Entry>)>,
}

impl<'s> Reads<'s> {
    fn new(store: &'s dyn Store) -> Self {
        Reads {
            store,
            statuses: HashMap::new(),
            journal: None,
        }
    }

    /// Whether an operator's decision is taken about `record`, an unsettled row of `key`: if
    /// it is, whether a command of the run acts on it, and since when it has stood still
    /// ([`DecisionAwaited`]).
    fn decision_awaited(
        &mut self,
        key: &str,
        record: &OperationRecord,
    ) -> Result<Option<(bool, u64)>, StoreError> {
        let status = self.status(&record.workflow_id)?;
        if status == Some(WorkflowStatus::Stuck) {
            return Ok(None);
        }
        let ended = status.is_some_and(|status| status.is_terminal());
        let last_event_ms = record.history.last().map_or(0, |event| event.at_ms);
        // Only a call in flight or an outcome being rechecked has a run acting on it: an
        // `awaiting_operator` record is listed whoever holds it, and its journal is not read.
        let acted_on = matches!(
            record.status,
            OperationStatus::Prepared | OperationStatus::UnknownOutcome { .. }
        );
        if ended || !acted_on {
            let takes_decision = record.status.takes_decision(ended);
            return Ok(takes_decision.then_some((false, last_event_ms)));
        }
        let journal = self.journal_of(&record.workflow_id)?;
        if written_by_run(journal, key, record) {
            let takes_decision = record.status.takes_decision(false);
            return Ok(takes_decision.then_some((true, last_event_ms)));
        }
        // Left behind by an earlier run: still only since that run ended, when this one began.
        Ok(Some((false, last_event_ms.max(run_began_ms(journal)))))
    }

    fn status(&mut self, workflow_id: &str) -> Result<Option<WorkflowStatus>, StoreError> {
        if let Some(status) = self.statuses.get(workflow_id) {
            return Ok(*status);
        }
        let status = self.store.workflow(workflow_id)?.map(|found| found.status);
        self.statuses.insert(workflow_id.to_owned(), status);
        Ok(status)
    }

    fn journal_of(&mut self, workflow_id: &str) -> Result<&[Entry], StoreError> {
        if self
            .journal
            .as_ref()
            .is_none_or(|(read_for, _)| read_for != workflow_id)
        {
            let journal = self.store.journal(workflow_id)?;
            self.journal = Some((workflow_id.to_owned(), journal));
        }
        Ok(self
            .journal
            .as_ref()
            .map_or(&[], |(_, journal)| journal.as_slice()))
    }
}

/// When the run whose journal is `journal` began, if an earlier one left it behind (a reset or
/// a continue-as-new writes a `Forked` entry); 0 for a workflow's first run.
fn run_began_ms(journal: &[Entry]) -> u64 {
    let forked = journal.iter().rev().find_map(|entry| match entry {
        Entry::Forked(forked) => Some(forked.forked_at_ms),
        _ => None,
    });
    forked.unwrap_or(0)
}

impl WorkerState {
    pub(super) async fn resolve_operation(
        &self,
        key: &str,
        on: DecidedOn,
        decision: OperatorDecision,
        by: ReconciledBy,
    ) -> Result<(), ResolveError> {
        let found = self.operation_record(key).await?;
        let ended = match &found {
            Some(record) => self.has_ended(&record.workflow_id).await?,
            None => false,
        };
        let no_call_in_flight = match &found {
            Some(record) if !ended => self.left_by_earlier_run(key, record).await?,
            _ => ended,
        };
        let record = awaiting_decision(key, found, on, no_call_in_flight)?;
        self.check_decided_result(key, &record, &decision)?;
        // The attempt read here is the one decided about, whichever path takes the decision.
        let decided = DecidedOn {
            attempt: Some(on.attempt.unwrap_or(record.attempt)),
            revision: on.revision,
        };
        let workflow_id = record.workflow_id.as_str();
        if ended {
            let settled = self.settle_ended_runs_operation(key, decided, decision, by);
            return Box::pin(settled).await;
        }
        let answer = if !self.owns(workflow_id) && !self.take_to_run_here(workflow_id).await {
            let command = relay::Command::ResolveOperation {
                key: key.to_owned(),
                attempt: decided.attempt,
                revision: decided.revision,
                decision: decision.clone(),
                by: by.clone(),
            };
            self.relay(workflow_id, command).await
        } else {
            let (reply, answer) = oneshot::channel();
            let event = Mail::ResolveOperation {
                seq: record.seq,
                key: key.to_owned(),
                attempt: record.attempt,
                revision: on.revision,
                decision: decision.clone(),
                by: by.clone(),
                reply,
            };
            self.router.deliver(self, workflow_id, event);
            answer.await.unwrap_or_else(|_| {
                let why = "it stopped before applying the decision";
                Err(Unreachable::not_running(workflow_id, why).into())
            })
        };
        match answer {
            // No run took it, and the workflow has ended meanwhile: none will, so the store
            // settles the record, if it still waits for this decision.
            Err(ResolveError::Unreachable(Unreachable::NotRunning { .. }))
                if self.has_ended(workflow_id).await? =>
            {
                let settled = self.settle_ended_runs_operation(key, decided, decision, by);
                Box::pin(settled).await
            }
            answer => answer,
        }
    }

    /// The operation log's record of `key`.
    async fn operation_record(&self, key: &str) -> Result<Option<OperationRecord>, StoreError> {
        let owned = key.to_owned();
        self.read(move |store| store.operation(&owned)).await
    }

    /// Whether `record`, a `prepared` record of a running workflow, was left by an earlier run
    /// of it (a reset's discarded entries): no run will make or settle that call, so it takes a
    /// decision. One the current run wrote has its call in flight, or a run that stopped
    /// resumes it through its reconciler: refused, whether the run is resident, stuck, or
    /// another worker's.
    async fn left_by_earlier_run(
        &self,
        key: &str,
        record: &OperationRecord,
    ) -> Result<bool, StoreError> {
        if !matches!(record.status, OperationStatus::Prepared) {
            return Ok(false);
        }
        let workflow_id = record.workflow_id.clone();
        let journal = self.read(move |store| store.journal(&workflow_id)).await?;
        Ok(!written_by_run(&journal, key, record))
    }

    /// Whether `workflow_id` has ended (completed or failed): no run of it takes commands.
    async fn has_ended(&self, workflow_id: &str) -> Result<bool, StoreError> {
        let record = self.workflow_record(workflow_id).await?;
        Ok(record.is_some_and(|record| record.status.is_terminal()))
    }

    /// A decision about an operation its workflow left waiting when it ended: no run applies
    /// it, so the store writes the settled record, refused if the record changed since it was
    /// read. The run's end may rewrite it in between (its last write moves what the run left
    /// open), so the decision is checked and made again on the record as it is then, unless it
    /// names the revision it was made on: that one the run's last write moved past.
    async fn settle_ended_runs_operation(
        &self,
        key: &str,
        on: DecidedOn,
        decision: OperatorDecision,
        by: ReconciledBy,
    ) -> Result<(), ResolveError> {
        let mut tries = 0;
        loop {
            // Ended: the store refuses the write otherwise.
            let found = self.operation_record(key).await?;
            let record = awaiting_decision(key, found, on, true)?;
            info!(workflow_id = %record.workflow_id, key, attempt = record.attempt, ?by,
                ?decision, "decision about an operation of an ended workflow; settling its record");
            let now_ms = self.clock.now_ms();
            let settled = settled_alone(record.clone(), decision.clone(), &by, now_ms);
            let written = self.store.settle_ended_operation(key, record, settled);
            tries += 1;
            match written.await {
                Ok(()) => return Ok(()),
                Err(StoreError::Conflict { .. }) if tries < 3 => continue,
                Err(StoreError::NotFound { .. }) => {
                    return Err(ResolveError::UnknownOperation(key.to_owned()))
                }
                Err(error) => return Err(Unreachable::from(error).into()),
            }
        }
    }

    /// The downstream reports the outcome of `key` (a webhook). A delivery that finds the
    /// operation already committed with the same result is a duplicate: it changes nothing
    /// and says so, however many times it arrives and in whichever order it raced the first.
    pub(super) async fn settle_operation(
        &self,
        key: &str,
        attempt: Option<u32>,
        decision: OperatorDecision,
        source: &str,
    ) -> Result<Settlement, ResolveError> {
        let by = ReconciledBy::Downstream(source.to_owned());
        let decided = self
            .resolve_operation(key, DecidedOn::attempt(attempt), decision.clone(), by)
            .await;
        let Err(refused) = decided else {
            return Ok(Settlement::Applied);
        };
        // Refused because it is settled already (the race's loser may even find the run
        // ended): the same committed result is this very report, delivered again.
        let record = self.operation_record(key).await?;
        match (record.map(|r| r.status), decision) {
            (
                Some(OperationStatus::Committed { result, .. }),
                OperatorDecision::Committed(reported),
            ) if result == reported => Ok(Settlement::Duplicate),
            _ => Err(refused),
        }
    }

    pub(super) async fn cancel(&self, workflow_id: &str, reason: &str) -> Result<(), CancelError> {
        // A run that parks between the check that this worker holds it and the write lets go
        // of its lease: the write is fenced, and the cancellation starts over, taking it back.
        let mut parked_meanwhile = false;
        let failure = Failure::new(FailureKind::Cancelled, reason);
        loop {
            let record = self.workflow_record(workflow_id).await?;
            let record = record.ok_or_else(|| unknown_workflow(workflow_id))?;
            if record.status.is_terminal() {
                return Err(CancelError::Ended(workflow_id.to_owned()));
            }
            if !self.owns(workflow_id) && !self.take_to_run_here(workflow_id).await {
                let reason = reason.to_owned();
                return self
                    .relay(workflow_id, relay::Command::Cancel { reason })
                    .await;
            }
            // A parking run's events are held back until its lease's fate is known, then
            // delivered to whichever run holds it.
            if self.router.holds(workflow_id) {
                break;
            }
            // Not in memory (waiting, or stopped by a divergence): end it in the store, so
            // that nothing is replayed or restarted just to be cancelled. A run that started
            // meanwhile makes the append conflict; then it is asked instead, and so is a run
            // whose effects may need undoing: only its code knows which it registered.
            match self
                .cancel_in_store_detached(workflow_id, record, failure.clone())
                .await
            {
                Err(StoreError::Conflict { .. }) | Ok(InStore::NeedsRun) => break,
                Ok(InStore::Ended) => {
                    self.router.forget_asleep(workflow_id);
                    return Ok(());
                }
                // The store forgot the lease at the epoch it refused; one taken again since is
                // kept.
                Err(StoreError::Fenced { .. }) if !parked_meanwhile => parked_meanwhile = true,
                Err(error) => return Err(error.into()),
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
    pub(super) async fn cancel_in_store_detached(
        &self,
        workflow_id: &str,
        record: WorkflowRecord,
        failure: Failure,
    ) -> Result<InStore, StoreError> {
        let shared = self.myself.upgrade().ok_or(StoreError::Closed)?;
        let id = workflow_id.to_owned();
        let task = tokio::spawn(async move { shared.cancel_in_store(&id, &record, failure).await });
        task.await.unwrap_or(Err(StoreError::Closed))
    }

    pub(super) async fn cancel_in_store(
        &self,
        workflow_id: &str,
        record: &WorkflowRecord,
        failure: Failure,
    ) -> Result<InStore, StoreError> {
        let id = workflow_id.to_owned();
        let journal = self.read(move |store| store.journal(&id)).await?;
        // A stuck run cannot replay to its undos: it ends here, and says what it leaves done.
        let mut failure = failure;
        let effects = has_effects(&journal);
        if effects {
            if record.status != WorkflowStatus::Stuck {
                return Ok(InStore::NeedsRun);
            }
            let note = "the run was stuck: no undo of its effects ran";
            failure.message = format!("{}; {note}", failure.message);
        }
        let ending = self.ending(workflow_id);
        let entry = Entry::WorkflowFailed {
            failure: failure.clone(),
        };
        let mut transition = Transition::append(workflow_id, record, vec![entry]);
        transition.record.status = WorkflowStatus::Failed;
        transition.record.stop = None;
        transition.ended_at_ms = self.clock.now_ms();
        let timers = open_timers(workflow_id, &journal);
        transition.remove_timers = timers.clone();
        self.store.commit(transition).await?;
        for timer in timers {
            self.timers.cancel(timer);
        }
        if effects {
            self.hand_calls_in_flight_to_an_operator(workflow_id).await;
        }
        self.forget_stuck(workflow_id);
        let stats = crate::telemetry::journal_stats(&journal);
        let cancelled = crate::telemetry::StepLocation::of_run("cancelled");
        let failed = crate::telemetry::FailedRun::of(&stats, cancelled);
        self.telemetry
            .workflow_ended(workflow_id, stats.calls(), Some(&failed));
        ending.publish(Err(RunError::Failed(failure)));
        Ok(InStore::Ended)
    }

    /// Once a cancelled stuck run has ended: each call it left in flight, or of unknown
    /// outcome, waits for an operator, with the reason ([`left_by_ended_run`]), as a run's
    /// own end leaves it. Moved after the end, each against the record read then: from the end
    /// on no run writes them (the end moved the journal on), so a record changes only by a
    /// decision, which the store's check catches. A crash in between leaves them as they were,
    /// which a decision settles too.
    async fn hand_calls_in_flight_to_an_operator(&self, workflow_id: &str) {
        let prefix = key_prefix(workflow_id);
        let listing = match self.read(move |store| store.operations(&prefix)).await {
            Ok(listing) => listing,
            Err(error) => {
                warn!(workflow_id, %error, "the cancelled run's operations were not read");
                return;
            }
        };
        // Cancelling is the way out of a damaged run: a row that does not decode stays.
        let open = listing.into_iter().filter_map(|(key, record)| {
            let record = record.ok().filter(|r| r.workflow_id == workflow_id)?;
            let status = left_by_ended_run(&record).filter(|s| s.awaits_decision())?;
            Some((key, record, status))
        });
        for (key, record, status) in open {
            let moved = record
                .clone()
                .after(record.attempt, status, self.clock.now_ms(), None);
            match self.store.settle_ended_operation(&key, record, moved).await {
                Ok(()) => warn!(workflow_id, %key, "the cancelled run left the call in flight"),
                // Decided meanwhile: the decision stands.
                Err(StoreError::Conflict { .. }) => {}
                Err(error) => {
                    warn!(workflow_id, %key, %error, "the call in flight stays as it was")
                }
            }
        }
    }

    pub(super) async fn decide_approval(
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
        if !self.owns(workflow_id) && !self.take_to_run_here(workflow_id).await {
            let command = relay::Command::DecideApproval {
                request,
                hash: hash.to_owned(),
                approver: approver.to_owned(),
                verdict,
            };
            return self.relay(workflow_id, command).await;
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

    pub(super) async fn signal(
        &self,
        workflow_id: &str,
        name: &str,
        signal_id: &str,
        payload: Payload,
        sender: Option<&str>,
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
            sender: sender.map(str::to_owned),
        };
        match self.store.send_signal(workflow_id, message).await {
            Ok(()) => {
                if !self.sleeps_through(workflow_id, name).await {
                    self.router.deliver(self, workflow_id, Mail::SignalArrived);
                }
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

    /// Whether the signal named `name`, just kept in the workflow's inbox, leaves it out of
    /// memory: it is parked, and its mark says that no wait of its run listens for the name.
    /// Rebuilding it by replay would only find it waiting again, at a cost that grows with its
    /// history; the signal waits in the inbox until a wait listens for its name.
    ///
    /// Asked after the write, which kept the mark by the same rule, so that a mark read here
    /// is either the one the signal left or one written after it by a run that had read it.
    /// A workflow in memory, or letting go of its lease, always hears of the signal. The mark
    /// the writer just read is most often in the store's memory: then no read waits on the
    /// blocking pool. A store many workers share keeps no marks: its holder knows instead
    /// ([`WorkerState::sleeps_through_shared`]).
    async fn sleeps_through(&self, workflow_id: &str, name: &str) -> bool {
        if self.leases.is_some() {
            return self.sleeps_through_shared(workflow_id).await;
        }
        if self.router.holds(workflow_id) {
            return false;
        }
        let mark = match self.store.parked_mark_in_memory(workflow_id) {
            Some(found) => found,
            None => {
                let id = workflow_id.to_owned();
                self.read(move |store| store.parked_mark(&id)).await
            }
        };
        match mark {
            Ok(mark) => mark.is_some_and(|mark| !mark.wakes_for(name)),
            Err(error) => {
                warn!(workflow_id, %error, "cannot read the parked mark: the signal rebuilds the run");
                false
            }
        }
    }

    /// Records a reader's acknowledgement (see [`crate::worker::Worker::acknowledge_stream`]).
    pub(super) async fn acknowledge_stream(
        &self,
        workflow_id: &str,
        channel: &str,
        event: u64,
    ) -> Result<u64, AckError> {
        if !is_channel_name(channel) {
            return Err(AckError::BadChannel(channel.to_owned()));
        }
        if self.workflow_record(workflow_id).await?.is_none() {
            return Err(unknown_workflow(workflow_id).into());
        }
        // A reconnection that moves nothing costs no synced write (the writer checks again).
        let delivered = self.delivered(workflow_id, channel).await?;
        if event <= delivered {
            return Ok(delivered);
        }
        let written = self
            .store
            .acknowledge_stream(workflow_id, channel, event)
            .await;
        match written {
            Err(StoreError::Conflict { reason, .. }) => return Err(AckError::NotGenerated(reason)),
            written => written.map_err(Unreachable::from)?,
        }
        Ok(self.delivered(workflow_id, channel).await?.max(event))
    }

    /// The last event a reader on `channel` acknowledged (0: none).
    async fn delivered(&self, workflow_id: &str, channel: &str) -> Result<u64, Unreachable> {
        let (id, channel) = (workflow_id.to_owned(), channel.to_owned());
        let acks = self.read(move |store| store.stream_acks(&id)).await?;
        let delivered = acks.into_iter().find(|(name, _)| *name == channel);
        Ok(delivered.map_or(0, |(_, event)| event))
    }

    pub(super) async fn workflow_record(
        &self,
        workflow_id: &str,
    ) -> Result<Option<WorkflowRecord>, StoreError> {
        let id = workflow_id.to_owned();
        self.read(move |store| store.workflow(&id)).await
    }

    /// A "committed" decision must carry a result of the effect's output type: journaled, a
    /// wrong shape would fail every replay of the workflow.
    pub(super) fn check_decided_result(
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
}

/// What a command for a workflow id that names none hears.
pub(super) fn unknown_workflow(workflow_id: &str) -> Unreachable {
    Unreachable::UnknownWorkflow(workflow_id.to_owned())
}

pub(super) fn ended_signal(workflow_id: &str, status: WorkflowStatus) -> SignalError {
    SignalError::Ended {
        workflow_id: workflow_id.to_owned(),
        status: status.name().to_owned(),
    }
}

/// A reader channel's name: short, and plain enough to show and to put in a URL.
fn is_channel_name(channel: &str) -> bool {
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    (1..=64).contains(&channel.len()) && channel.chars().all(plain)
}

/// What cancelling a run that is not in memory did.
pub(super) enum InStore {
    /// It ended in the store.
    Ended,
    /// It has effects whose undos only its code knows: it must run to be cancelled.
    NeedsRun,
}

/// Whether the run issued an effect (a command journaled with an idempotency key).
fn has_effects(journal: &[Entry]) -> bool {
    journal.iter().any(|entry| {
        matches!(
            entry,
            Entry::ActivityScheduledAt {
                idempotency_key: Some(_),
                ..
            }
        )
    })
}

/// Timers a journal still waits for (sleeps not fired, approval expiries not decided), as the
/// commands' machines fold it. A journal that does not add up still gives its rows: the run is
/// being ended, and a row too many is a deletion of nothing, a row too few a wake-up that finds
/// the run ended.
fn open_timers(workflow_id: &str, journal: &[Entry]) -> Vec<TimerKey> {
    let (commands, passed_over) = Commands::fold(journal);
    for conflict in passed_over {
        tracing::warn!(
            workflow_id,
            ?conflict,
            "an entry left out of the cancelled run's timers"
        );
    }
    let timers = commands.timers().into_iter();
    let keys = timers.map(|(seq, fire_at_ms)| TimerKey {
        fire_at_ms,
        workflow_id: workflow_id.to_owned(),
        seq,
    });
    keys.collect()
}
