//! Stuck runs: recorded as stuck with why, held from rebuilds for a growing pause, released
//! when a replay goes through cleanly.

use super::*;

impl WorkerState {
    /// A run stopped with `error`. A stop that is the run's own (its code, its journal, the
    /// worker not hosting it) makes it stuck, durably; any other (a shutdown, an injected
    /// crash, a failed store) leaves it to resume on the next start. Should the workflow have
    /// ended meanwhile (a cancellation written while the run was loading makes its next write
    /// conflict), the recorded end is the answer, not the run's error.
    pub(crate) async fn run_stopped(&self, workflow_id: &str, wake: Wake, error: RunError) {
        if let RunError::Store(fenced @ StoreError::Fenced { .. }) = &error {
            return self.lost_lease(workflow_id, fenced);
        }
        if let RunError::Store(failed @ StoreError::Backend(_)) = &error {
            if self.let_go_after_failed_write(workflow_id, failed).await {
                return;
            }
        }
        let Some(record) = self.unless_ended(workflow_id).await else {
            return;
        };
        // Stuck is a state of a workflow that exists; without a record there is nothing to hold.
        let (Some(code), Some(record)) = (error.stop_code(), record) else {
            self.publish(workflow_id, Err(error), Durability::InMemory);
            return;
        };
        let stop = RunStop {
            code,
            seq: error.stop_seq(),
            message: error.to_string(),
            at_ms: self.clock.now_ms(),
        };
        if let Err(error) = self.record_stuck(workflow_id, record, &stop).await {
            error!(workflow_id, %error, "cannot record that the workflow is stuck");
        }
        if !self.still_stopped(workflow_id).await {
            return;
        }
        self.hold_stuck(workflow_id);
        if matches!(wake, Wake::Recovered { .. }) {
            lock(&self.recovery_errors).push((workflow_id.to_owned(), error));
        }
        let outcome = Err(stuck_error(workflow_id, stop));
        self.publish(workflow_id, outcome, Durability::InMemory);
    }

    /// Writes that the run is stuck, unless its record says so already.
    pub(super) async fn record_stuck(
        &self,
        workflow_id: &str,
        record: WorkflowRecord,
        stop: &RunStop,
    ) -> Result<(), StoreError> {
        let same = |old: &RunStop| {
            (old.code, old.seq, &old.message) == (stop.code, stop.seq, &stop.message)
        };
        if record.status == WorkflowStatus::Stuck && record.stop.as_ref().is_some_and(same) {
            return Ok(());
        }
        let mut transition = Transition::append(workflow_id, &record, Vec::new());
        transition.record.status = WorkflowStatus::Stuck;
        transition.record.stop = Some(stop.clone());
        self.store.commit(transition).await
    }

    /// The workflow's record, read again; `None` if it ended (its recorded end is published
    /// then). A record that cannot be read counts as not ended, with no record.
    pub(super) async fn unless_ended(&self, workflow_id: &str) -> Option<Option<WorkflowRecord>> {
        let record = self.workflow_record(workflow_id).await.ok().flatten();
        if let Some(ended) = &record {
            if let Some(outcome) = self.outcome_of_ended(workflow_id, ended).await {
                self.publish_recorded(workflow_id, outcome);
                return None;
            }
        }
        Some(record)
    }

    /// Whether the run is still to be held as stopped once its stop was recorded (or could not
    /// be). Not if the workflow ended meanwhile (a cancellation: its end is published), nor if
    /// an event rebuilt it meanwhile: that run answers for the workflow now (and is held,
    /// should it stop the same way), and is asked to clear a stuck record it loaded too early
    /// to see.
    pub(super) async fn still_stopped(&self, workflow_id: &str) -> bool {
        if self.unless_ended(workflow_id).await.is_none() {
            return false;
        }
        if self.router.is_resident(workflow_id) {
            self.router.deliver(self, workflow_id, Mail::Resume);
            return false;
        }
        true
    }

    /// Holds a stuck run back from rebuilds for a growing pause, counts it, and rebuilds it
    /// when the pause ends.
    pub(super) fn hold_stuck(&self, workflow_id: &str) {
        let mut stuck = lock(&self.stuck);
        let pause = stuck.get(workflow_id).map_or(STUCK_PAUSE_FIRST, |held| {
            (held.pause * 2).min(STUCK_PAUSE_MAX)
        });
        let retry_at = Instant::now() + pause;
        let backoff = StuckBackoff {
            retry_at: Some(retry_at),
            pause,
        };
        stuck.insert(workflow_id.to_owned(), backoff);
        self.telemetry.workflows_stuck(held_count(&stuck));
        drop(stuck);
        self.retry_stuck_at(workflow_id, retry_at);
    }

    /// Rebuilds a stuck run at `retry_at`, as a failed workflow task is retried: a stop that
    /// does not repeat (a panic on a passing condition) ends by itself, and the rebuild sees
    /// what came while the run was held (a timer that fell due, a signal), which the events
    /// refused during the pause do not bring back. Nothing happens if the run was released or
    /// held again meanwhile: the later hold has its own retry.
    pub(super) fn retry_stuck_at(&self, workflow_id: &str, retry_at: Instant) {
        let shared = self.myself.clone();
        let id = workflow_id.to_owned();
        self.spawn(async move {
            tokio::time::sleep_until(retry_at.into()).await;
            let Some(shared) = shared.upgrade() else {
                return;
            };
            let held = lock(&shared.stuck).get(&id).and_then(|held| held.retry_at);
            if held == Some(retry_at) {
                shared.router.deliver(&shared, &id, Mail::Resume);
            }
        });
    }

    /// The run replayed cleanly: it is no longer held or counted as stuck (the pause it reached
    /// is kept, see [`StuckBackoff`]).
    pub(crate) fn unstuck(&self, workflow_id: &str) {
        let mut stuck = lock(&self.stuck);
        let Some(held) = stuck.get_mut(workflow_id) else {
            return;
        };
        if held.retry_at.take().is_some() {
            self.telemetry.workflows_stuck(held_count(&stuck));
            lock(&self.outcomes).forget(workflow_id);
        }
    }

    /// The workflow ended: nothing of its stops is kept.
    pub(crate) fn forget_stuck(&self, workflow_id: &str) {
        self.unstuck(workflow_id);
        lock(&self.stuck).remove(workflow_id);
    }

    /// Whether an event may rebuild `workflow_id` now: not while a stuck run's pause lasts,
    /// nor while it is being reset.
    pub(super) fn may_rebuild(&self, workflow_id: &str) -> bool {
        if lock(&self.resetting).contains(workflow_id) {
            return false;
        }
        let stuck = lock(&self.stuck);
        let retry_at = stuck.get(workflow_id).and_then(|held| held.retry_at);
        retry_at.is_none_or(|at| Instant::now() >= at)
    }
}

/// When a stuck run may be rebuilt again: its code cannot change within a process, so an event
/// replays it only after a growing pause (and every worker start tries it at once).
#[derive(Debug, Clone, Copy)]
pub(super) struct StuckBackoff {
    /// When the hold ends; `None` once the run replayed cleanly and was released. The pause it
    /// reached is kept until the run ends, so a stop that comes back after a clean replay (an
    /// activity this worker does not host, found when it is restarted) waits longer each time
    /// instead of replaying every second.
    retry_at: Option<Instant>,
    pause: Duration,
}

/// How many runs are held as stuck now.
pub(super) fn held_count(stuck: &HashMap<String, StuckBackoff>) -> usize {
    stuck
        .values()
        .filter(|held| held.retry_at.is_some())
        .count()
}

/// The first pause after a run was found stuck, and the longest.
pub(super) const STUCK_PAUSE_FIRST: Duration = Duration::from_secs(1);
pub(super) const STUCK_PAUSE_MAX: Duration = Duration::from_secs(300);

pub(super) fn stuck_error(workflow_id: &str, stop: RunStop) -> RunError {
    let workflow_id = workflow_id.to_owned();
    RunError::Stuck(Box::new(StuckRun { workflow_id, stop }))
}
