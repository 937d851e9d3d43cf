//! Outcome publication: who waits for which workflow's end, the ends being committed (held
//! back from readers of the store until their telemetry is counted), and the outcome read
//! back for a run that ended before anyone asked.

use super::stuck::stuck_error;
use super::*;

/// How often a caller waiting for the outcome of a workflow that may run on another worker
/// looks at the store.
const SHARED_RESULT_POLL: Duration = Duration::from_millis(250);

impl WorkerState {
    pub(super) async fn result(&self, workflow_id: &str) -> Outcome {
        let waiting = self.subscribe(workflow_id).await;
        if self.leases.is_none() {
            return wait_outcome(waiting).await;
        }
        // Another worker may run it: its end reaches this one only through the store, read
        // again by each subscription.
        let mut waiting = waiting;
        loop {
            let polled = tokio::time::timeout(SHARED_RESULT_POLL, wait_outcome(waiting)).await;
            match polled {
                Ok(outcome) => return outcome,
                Err(_) => waiting = self.subscribe(workflow_id).await,
            }
        }
    }

    /// Subscribes to the workflow's outcome; if it already ended, the outcome is read from the
    /// journal. Subscribing before reading the store means an end in between is not missed.
    pub(super) async fn subscribe(&self, workflow_id: &str) -> watch::Receiver<Option<Outcome>> {
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
    pub(super) fn publish_recorded(&self, workflow_id: &str, outcome: Outcome) {
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
    /// stuck. `None` while it runs (or while a run that may resume it is replaying), and when
    /// the worker stopped its tasks while the read waited for its group (`StoreError::Closed`,
    /// which no read of a store answers): its callers hear the stop when the worker goes, or,
    /// on a shared store, read again at their next poll.
    pub(super) async fn recorded_outcome(&self, workflow_id: &str) -> Option<Outcome> {
        // Every caller waiting for an outcome reads the record, and a thousand can ask at once:
        // their reads go in groups.
        let id = workflow_id.to_owned();
        let record = match self.reads.small(move |store| store.workflow(&id)).await {
            Ok(Some(record)) => record,
            Ok(None) => return Some(Err(RunError::UnknownWorkflow(workflow_id.to_owned()))),
            Err(StoreError::Closed) => return None,
            Err(e) => return Some(Err(e.into())),
        };
        if let Some(stop) = record
            .stop
            .clone()
            .filter(|_| !self.router.is_resident(workflow_id))
        {
            return Some(Err(stuck_error(workflow_id, stop)));
        }
        self.outcome_of_ended(workflow_id, &record).await
    }

    /// The journaled outcome if `record` says the workflow ended.
    pub(super) async fn outcome_of_ended(
        &self,
        workflow_id: &str,
        record: &WorkflowRecord,
    ) -> Option<Outcome> {
        if !record.status.is_terminal() {
            return None;
        }
        // The record counts the journal's entries: only the last, the end, is read, not the
        // whole history (every caller of a run that ended before it asked reads it).
        let id = workflow_id.to_owned();
        let last = record.journal_len.saturating_sub(1);
        let end = match self
            .reads
            .small(move |store| store.journal_page(&id, last, 1))
            .await
        {
            Ok(end) => end,
            Err(StoreError::Closed) => return None,
            Err(e) => return Some(Err(e.into())),
        };
        match end.into_iter().next() {
            Some(Entry::WorkflowCompleted { output }) => Some(Ok(output)),
            Some(Entry::WorkflowFailed { failure }) => Some(Err(RunError::Failed(failure))),
            // Not the workflow's failure: the store contradicts itself.
            _ => Some(Err(RunError::Store(StoreError::Corrupt {
                table: crate::store::Table::Journal,
                key: format!("{workflow_id}#{last}"),
                source: crate::journal::DecodeError::Malformed(
                    "the record says the workflow ended, and the journal has no end entry".into(),
                ),
            }))),
        }
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
}

pub(super) async fn wait_outcome(mut receiver: watch::Receiver<Option<Outcome>>) -> Outcome {
    match receiver.wait_for(Option::is_some).await {
        Ok(outcome) => outcome.clone().unwrap_or(Err(RunError::ShutDown)),
        Err(_) => Err(RunError::ShutDown),
    }
}

/// Who waits for which workflow's outcome, and which ends are still being committed.
#[derive(Default)]
pub(super) struct Outcomes {
    senders: HashMap<String, watch::Sender<Option<Outcome>>>,
    /// Ends being committed and counted, with how many are under way: a cancel that lost to
    /// the executor's own end must not clear the executor's mark.
    ending: HashMap<String, usize>,
}

impl Outcomes {
    pub(super) fn sender(&mut self, workflow_id: &str) -> &watch::Sender<Option<Outcome>> {
        self.senders
            .entry(workflow_id.to_owned())
            .or_insert_with(|| watch::Sender::new(None))
    }

    /// Answers the current waiters with a journaled outcome. The sender goes: later callers
    /// read the outcome from the store, current waiters keep it through their receivers. Only
    /// in-memory outcomes (a stopped run) must stay.
    pub(super) fn settle(&mut self, workflow_id: &str, outcome: Outcome) {
        self.sender(workflow_id).send_replace(Some(outcome));
        self.senders.remove(workflow_id);
    }

    pub(super) fn is_ending(&self, workflow_id: &str) -> bool {
        self.ending.contains_key(workflow_id)
    }

    pub(super) fn unmark(&mut self, workflow_id: &str) {
        if let Some(count) = self.ending.get_mut(workflow_id) {
            *count -= 1;
            if *count == 0 {
                self.ending.remove(workflow_id);
            }
        }
    }

    /// A stopped run was released: the outcome held in memory for it goes, and waiters hear the
    /// run's real end later.
    pub(super) fn forget(&mut self, workflow_id: &str) {
        self.senders.remove(workflow_id);
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
