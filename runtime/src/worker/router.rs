//! Routing events to resident workflows: one mailbox per resident run, rebuilt by replay when
//! an event finds the run evicted.

use super::*;

impl WorkerState {
    /// `fresh`: what the workflow's start wrote, if this worker has just started it.
    pub(super) fn spawn_executor(
        &self,
        workflow_id: &str,
        wake: Wake,
        fresh: Option<Loaded>,
    ) -> mpsc::UnboundedSender<Mail> {
        let (events, mailbox) = mpsc::unbounded_channel();
        if let Some(shared) = self.myself.upgrade() {
            let id = workflow_id.to_owned();
            // Boxed: the run's state is large, and a task's cell holds its future inline, so
            // unboxed it would be copied into the cell and over again when the task ends.
            let run = run_workflow(shared, id, wake, fresh, mailbox, events.clone());
            let run = Box::pin(run);
            self.spawn(run);
        }
        events
    }
}

/// How a run leaves memory ([`Router::leave`]).
enum Leaving {
    /// Out of memory, its lease kept: `listening` as in [`Router::try_evict`].
    Evicted { listening: Option<Vec<String>> },
    /// Letting go of its lease ([`Router::begin_parking`]).
    Parking,
}

/// Resident workflows' mailboxes. Sending and evicting both happen under the lock, so an event
/// never lands in the mailbox of an executor that has just decided to leave.
#[derive(Default)]
pub(crate) struct Router {
    live: Mutex<Residents>,
}

#[derive(Default)]
struct Residents {
    running: HashMap<String, mpsc::UnboundedSender<Mail>>,
    /// Workflows that left memory and are letting go of their lease to wait for a timer (see
    /// [`WorkerState::park`]), with the events that came meanwhile: they are held back until
    /// the lease's new state is known, then delivered as to any workflow.
    parking: HashMap<String, Vec<Mail>>,
    /// On a store many workers share: workflows held here that left memory to wait for
    /// signals, approvals or commands, with the signal names their waits listen for (see
    /// [`WorkerState::sleeps_through_shared`]). An entry goes as soon as anything reaches the
    /// run (its next executor starts), and when the run is found to have lost its lease or the
    /// registration lapses; one left by a lease let go otherwise is never read, since only a
    /// workflow this worker holds is looked up.
    asleep: HashMap<String, Vec<String>>,
}

impl Router {
    /// The mailbox of `workflow_id` if it is resident.
    pub(super) fn mailbox(&self, workflow_id: &str) -> Option<mpsc::UnboundedSender<Mail>> {
        lock(&self.live).running.get(workflow_id).cloned()
    }

    pub(crate) fn is_resident(&self, workflow_id: &str) -> bool {
        lock(&self.live).running.contains_key(workflow_id)
    }

    /// Whether the workflow is in memory or letting go of its lease (see
    /// [`Router::begin_parking`]): an event for it reaches its run, or waits for the parking
    /// to end. Both are looked at under one lock.
    pub(super) fn holds(&self, workflow_id: &str) -> bool {
        let live = lock(&self.live);
        live.running.contains_key(workflow_id) || live.parking.contains_key(workflow_id)
    }

    /// Delivers `event`, rebuilding the workflow by replay if it is not resident. An event
    /// for a stuck run inside its pause is refused, not replayed: durable state (a timer row,
    /// an inbox message) waits for the rebuild that comes after the pause or a restart.
    pub(super) fn deliver(&self, shared: &WorkerState, workflow_id: &str, event: Mail) {
        let wake = Wake::Event {
            since: Instant::now(),
        };
        let mut live = lock(&self.live);
        if let Some(held_back) = live.parking.get_mut(workflow_id) {
            return held_back.push(event);
        }
        if !shared.owns(workflow_id) {
            drop(live);
            return shared.forward(workflow_id, event);
        }
        if !live.running.contains_key(workflow_id) && !shared.may_rebuild(workflow_id) {
            drop(live);
            event.refuse(
                workflow_id,
                "it is stuck, and resumes when code that matches its journal is deployed",
            );
            return;
        }
        live.asleep.remove(workflow_id);
        let sender = live
            .running
            .entry(workflow_id.to_owned())
            .or_insert_with(|| shared.spawn_executor(workflow_id, wake, None));
        if let Err(mpsc::error::SendError(event)) = sender.send(event) {
            // The executor ended between its last event and now; start a fresh one.
            let sender = shared.spawn_executor(workflow_id, wake, None);
            let _ = sender.send(event);
            live.running.insert(workflow_id.to_owned(), sender);
        }
    }

    /// Starts the workflow's executor if it is held here, neither resident nor parking (a
    /// workflow claimed while it parks is started when the parking ends) and not being reset.
    pub(super) fn ensure_running(&self, shared: &WorkerState, workflow_id: &str, wake: Wake) {
        self.ensure_running_from(shared, workflow_id, wake, None);
    }

    /// [`Router::ensure_running`] for a workflow this worker has just started: its executor
    /// takes `fresh`, what the start wrote, and reads nothing. An executor already running
    /// (rebuilt by a signal sent in between) read the start itself.
    pub(super) fn ensure_running_from(
        &self,
        shared: &WorkerState,
        workflow_id: &str,
        wake: Wake,
        fresh: Option<Loaded>,
    ) {
        if !shared.owns(workflow_id) || shared.is_resetting(workflow_id) {
            return;
        }
        let mut live = lock(&self.live);
        if !live.running.contains_key(workflow_id) && !live.parking.contains_key(workflow_id) {
            live.asleep.remove(workflow_id);
            let events = shared.spawn_executor(workflow_id, wake, fresh);
            live.running.insert(workflow_id.to_owned(), events);
        }
    }

    /// Removes the executor if its mailbox is empty; `false` means an event arrived, stay.
    /// `listening`: on a store many workers share, the signal names the run's waits listen
    /// for, kept while it is out of memory.
    pub(crate) fn try_evict(
        &self,
        workflow_id: &str,
        mailbox: &mpsc::UnboundedReceiver<Mail>,
        listening: Option<Vec<String>>,
    ) -> bool {
        self.leave(workflow_id, mailbox, Leaving::Evicted { listening })
    }

    /// Like [`Router::try_evict`], and the workflow's events are held back until
    /// [`Router::end_parking`].
    pub(crate) fn begin_parking(
        &self,
        workflow_id: &str,
        mailbox: &mpsc::UnboundedReceiver<Mail>,
    ) -> bool {
        self.leave(workflow_id, mailbox, Leaving::Parking)
    }

    /// Checked and done under the lock deliveries take, so that no event lands in between.
    fn leave(
        &self,
        workflow_id: &str,
        mailbox: &mpsc::UnboundedReceiver<Mail>,
        leaving: Leaving,
    ) -> bool {
        let mut live = lock(&self.live);
        if !mailbox.is_empty() {
            return false;
        }
        live.running.remove(workflow_id);
        match leaving {
            Leaving::Parking => {
                live.parking.insert(workflow_id.to_owned(), Vec::new());
            }
            Leaving::Evicted {
                listening: Some(listening),
            } => {
                live.asleep.insert(workflow_id.to_owned(), listening);
            }
            Leaving::Evicted { listening: None } => {}
        }
        true
    }

    /// Whether [`Router::asleep`] has names for `workflow_id`.
    pub(super) fn is_asleep(&self, workflow_id: &str) -> bool {
        lock(&self.live).asleep.contains_key(workflow_id)
    }

    /// The signal names the waits of `workflow_id`'s run listen for, if it left memory here
    /// and nothing reached it since (whether this worker still holds it is the caller's to
    /// ask).
    pub(super) fn asleep(&self, workflow_id: &str) -> Option<Vec<String>> {
        lock(&self.live).asleep.get(workflow_id).cloned()
    }

    /// The run's lease went: what it listened for is no longer this worker's to know.
    pub(super) fn forget_asleep(&self, workflow_id: &str) {
        lock(&self.live).asleep.remove(workflow_id);
    }

    /// Every lease went (the registration lapsed).
    pub(super) fn forget_every_asleep(&self) {
        lock(&self.live).asleep.clear();
    }

    /// The events held back while the workflow parked.
    pub(super) fn end_parking(&self, workflow_id: &str) -> Vec<Mail> {
        lock(&self.live)
            .parking
            .remove(workflow_id)
            .unwrap_or_default()
    }

    /// Removes the executor whose mailbox `events` feeds. An executor started for the same
    /// workflow since (an event came after this one stopped reading) stays: removing it would
    /// let a third start beside it.
    pub(crate) fn remove(&self, workflow_id: &str, events: &mpsc::UnboundedSender<Mail>) {
        let mut live = lock(&self.live);
        if live
            .running
            .get(workflow_id)
            .is_some_and(|s| s.same_channel(events))
        {
            live.running.remove(workflow_id);
        }
    }

    /// Workflows in memory, and those still letting go of their lease on the way out (whose
    /// events wait here): a worker with none is settled.
    pub(super) fn len(&self) -> usize {
        let live = lock(&self.live);
        live.running.len() + live.parking.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(listening: &[&str]) -> Option<Vec<String>> {
        Some(listening.iter().map(|name| (*name).to_owned()).collect())
    }

    #[test]
    fn a_run_out_of_memory_keeps_the_names_it_last_left_with_until_forgotten() {
        let router = Router::default();
        let (_events, mailbox) = mpsc::unbounded_channel::<Mail>();
        assert!(router.try_evict("wf", &mailbox, names(&["go"])));
        assert_eq!(router.asleep("wf").unwrap(), ["go"]);
        assert!(router.try_evict("wf", &mailbox, names(&["later"])));
        assert_eq!(router.asleep("wf").unwrap(), ["later"]);
        router.forget_asleep("wf");
        assert!(router.asleep("wf").is_none());
    }

    #[test]
    fn a_run_evicted_on_a_store_one_process_owns_keeps_no_names() {
        let router = Router::default();
        let (_events, mailbox) = mpsc::unbounded_channel::<Mail>();
        assert!(router.try_evict("wf", &mailbox, None));
        assert!(router.asleep("wf").is_none());
    }

    #[test]
    fn an_event_in_the_mailbox_keeps_the_run_in_memory() {
        let router = Router::default();
        let (events, mailbox) = mpsc::unbounded_channel::<Mail>();
        events.send(Mail::SignalArrived).unwrap();
        assert!(!router.try_evict("wf", &mailbox, names(&["go"])));
        assert!(router.asleep("wf").is_none());
    }
}
