//! The timer service: durable timer rows scheduled and cancelled in memory, fired through the
//! router when due.

use super::*;

/// What the timer service is asked to do.
pub(super) enum TimerOp {
    Schedule(TimerKey),
    Cancel(TimerKey),
}

/// Schedules and cancels durable timers with the worker's timer service.
pub(crate) struct TimerHandle(pub(super) mpsc::UnboundedSender<TimerOp>);

impl TimerHandle {
    pub(crate) fn schedule(&self, timer: TimerKey) {
        let _ = self.0.send(TimerOp::Schedule(timer));
    }

    /// The timer's row is gone (it was cancelled, or its workflow ended): it must not fire.
    pub(crate) fn cancel(&self, timer: TimerKey) {
        let _ = self.0.send(TimerOp::Cancel(timer));
    }
}

/// Fires timers in due order, whether or not their workflow is resident. The set is loaded from
/// the `timers` table on start, so timers survive restarts; a timer fired twice is harmless
/// because the executor only fires a timer that is still waiting.
pub(super) async fn run_timers(
    shared: Weak<WorkerState>,
    mut schedule: mpsc::UnboundedReceiver<TimerOp>,
    initial: Vec<TimerKey>,
) {
    let mut due: BTreeSet<TimerKey> = initial.into_iter().collect();
    loop {
        let Some(clock) = shared.upgrade().map(|s| s.clock.clone()) else {
            return;
        };
        let next = due.first().map(|t| t.fire_at_ms);
        let sleep = clock.sleep_until(next.unwrap_or(u64::MAX));
        tokio::select! {
            op = schedule.recv() => match op {
                Some(TimerOp::Schedule(timer)) => { due.insert(timer); }
                Some(TimerOp::Cancel(timer)) => { due.remove(&timer); }
                None => return,
            },
            () = sleep, if next.is_some() => {
                let Some(shared) = shared.upgrade() else { return };
                fire_due(&shared, &mut due);
            }
        }
    }
}

pub(super) fn fire_due(shared: &WorkerState, due: &mut BTreeSet<TimerKey>) {
    let now = shared.clock.now_ms();
    while due.first().is_some_and(|t| t.fire_at_ms <= now) {
        if let Some(timer) = due.pop_first() {
            let event = Mail::TimerDue { seq: timer.seq };
            shared.router.deliver(shared, &timer.workflow_id, event);
        }
    }
}
