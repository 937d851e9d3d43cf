//! Routing events to resident workflows: one mailbox per resident run, rebuilt by replay when
//! an event finds the run evicted.

use super::*;

impl WorkerState {
    pub(super) fn spawn_executor(
        &self,
        workflow_id: &str,
        wake: Wake,
    ) -> mpsc::UnboundedSender<Mail> {
        let (events, mailbox) = mpsc::unbounded_channel();
        if let Some(shared) = self.myself.upgrade() {
            let id = workflow_id.to_owned();
            let run = run_workflow(shared, id, wake, mailbox, events.clone());
            self.spawn(run);
        }
        events
    }
}

/// Resident workflows' mailboxes. Sending and evicting both happen under the lock, so an event
/// never lands in the mailbox of an executor that has just decided to leave.
#[derive(Default)]
pub(crate) struct Router {
    live: Mutex<HashMap<String, mpsc::UnboundedSender<Mail>>>,
}

impl Router {
    /// The mailbox of `workflow_id` if it is resident.
    pub(super) fn mailbox(&self, workflow_id: &str) -> Option<mpsc::UnboundedSender<Mail>> {
        lock(&self.live).get(workflow_id).cloned()
    }

    pub(crate) fn is_resident(&self, workflow_id: &str) -> bool {
        lock(&self.live).contains_key(workflow_id)
    }

    /// Delivers `event`, rebuilding the workflow by replay if it is not resident. An event
    /// for a stuck run inside its pause is refused, not replayed: durable state (a timer row,
    /// an inbox message) waits for the rebuild that comes after the pause or a restart.
    pub(super) fn deliver(&self, shared: &WorkerState, workflow_id: &str, event: Mail) {
        let wake = Wake::Event {
            since: Instant::now(),
        };
        if !shared.owns(workflow_id) {
            return shared.forward(workflow_id, event);
        }
        let mut live = lock(&self.live);
        if !live.contains_key(workflow_id) && !shared.may_rebuild(workflow_id) {
            drop(live);
            event.refuse(
                workflow_id,
                "it is stuck, and resumes when code that matches its journal is deployed",
            );
            return;
        }
        let sender = live
            .entry(workflow_id.to_owned())
            .or_insert_with(|| shared.spawn_executor(workflow_id, wake));
        if let Err(mpsc::error::SendError(event)) = sender.send(event) {
            // The executor ended between its last event and now; start a fresh one.
            let sender = shared.spawn_executor(workflow_id, wake);
            let _ = sender.send(event);
            live.insert(workflow_id.to_owned(), sender);
        }
    }

    pub(super) fn ensure_running(&self, shared: &WorkerState, workflow_id: &str, wake: Wake) {
        if !shared.owns(workflow_id) {
            return;
        }
        let mut live = lock(&self.live);
        if !live.contains_key(workflow_id) {
            live.insert(
                workflow_id.to_owned(),
                shared.spawn_executor(workflow_id, wake),
            );
        }
    }

    /// Removes the executor if its mailbox is empty; `false` means an event arrived, stay.
    pub(crate) fn try_evict(
        &self,
        workflow_id: &str,
        mailbox: &mpsc::UnboundedReceiver<Mail>,
    ) -> bool {
        let mut live = lock(&self.live);
        if !mailbox.is_empty() {
            return false;
        }
        live.remove(workflow_id);
        true
    }

    /// Removes the executor whose mailbox `events` feeds. An executor started for the same
    /// workflow since (an event came after this one stopped reading) stays: removing it would
    /// let a third start beside it.
    pub(crate) fn remove(&self, workflow_id: &str, events: &mpsc::UnboundedSender<Mail>) {
        let mut live = lock(&self.live);
        if live
            .get(workflow_id)
            .is_some_and(|s| s.same_channel(events))
        {
            live.remove(workflow_id);
        }
    }

    pub(super) fn len(&self) -> usize {
        lock(&self.live).len()
    }
}
