//! Ownership in a store that many workers share (see `store::Leases`): which runs this worker
//! may run, the heartbeat that keeps its leases, the claims that take over a lapsed worker's
//! workflows, and the wake-ups that reach a workflow's owner from any worker.
//!
//! A worker runs only the workflows whose lease it holds. Events for the others go to their
//! owner: a signal (already in the store) as a wake-up; a timer not at all (its owner has it
//! too); a command that needs the run's answer (an approval, a cancellation, an operator's
//! resolution) is relayed to the owner, which answers it (see `relay`).

use tracing::warn;

use super::*;
use crate::store::{Leases, SignalTake, Wakeup};

/// Most workflows adopted per claim: a worker taking over a large fleet does so a page per
/// transaction, so that the rows one claim locks stay bounded.
const CLAIM_LIMIT: usize = 512;

impl WorkerState {
    /// Whether this worker runs `workflow_id` (with one process owning the store: always).
    pub(crate) fn owns(&self, workflow_id: &str) -> bool {
        self.leases.as_ref().is_none_or(|l| l.holds(workflow_id))
    }

    /// Whether this worker holds `workflow_id`'s lease in a store many workers share.
    pub(super) fn owns_on_shared_store(&self, workflow_id: &str) -> bool {
        self.leases.as_ref().is_some_and(|l| l.holds(workflow_id))
    }

    /// Takes `workflow_id` if nobody holds it (parked, let go, or its owner lapsed), for an
    /// event that arrived here, and starts its run here: a workflow held with no executor
    /// would wait for nothing (its replay arms its timers and reads its inbox). `false` on a
    /// store one process owns, and when a live worker holds it.
    pub(super) async fn take_to_run_here(&self, workflow_id: &str) -> bool {
        let Some(leases) = self.leases.clone() else {
            return false;
        };
        let id = workflow_id.to_owned();
        let taken = match tokio::task::spawn_blocking(move || leases.take(&id)).await {
            Ok(Ok(taken)) => taken,
            Ok(Err(error)) => {
                warn!(workflow_id, %error, "cannot take the workflow; its owner or the next claim runs it");
                false
            }
            Err(error) => {
                warn!(workflow_id, %error, "take task failed");
                false
            }
        };
        if taken {
            self.run_taken(workflow_id);
        }
        taken
    }

    /// Starts the run of a workflow this worker has just taken.
    fn run_taken(&self, workflow_id: &str) {
        let wake = Wake::Event {
            since: Instant::now(),
        };
        self.router.ensure_running(self, workflow_id, wake);
    }

    /// Lets go of `workflow_id`, which left memory (see [`Router::begin_parking`]) to wait
    /// for its first timer: once due, whichever worker claims it first runs it (this one,
    /// when the timer fires here). A signal of a name its waits listen for in the inbox once
    /// the lease is let go (the run took every such signal before it left, so one there came
    /// since), and the events other than signals held back meanwhile, take it back at once: a
    /// signal's sender that found this worker holding the lease woke this worker, which no
    /// longer listens for the workflow.
    /// A signal held back is passed on as to any parked workflow: it takes it back only if
    /// a message of a name it listens for waits ([`WorkerState::take_for_signal`]).
    pub(super) async fn park(&self, workflow_id: &str, parking: LeaseParking) {
        let parked = self.let_go_until(workflow_id, &parking).await;
        let listening = parking.listening;
        let signalled = parked && !self.no_listened_signal_waits(workflow_id, listening).await;
        let held_back = self.router.end_parking(workflow_id);
        let commanded = held_back
            .iter()
            .any(|event| !matches!(event, Mail::SignalArrived));
        if parked && (signalled || commanded) {
            self.take_to_run_here(workflow_id).await;
        }
        // Taken back, or claimed by this worker while it parked (the claim found it parking
        // and left the start to this). A lease that could not be parked is held still: the
        // workflow stays out of memory, and this worker's timer service wakes it.
        if parked {
            let wake = Wake::Event {
                since: Instant::now(),
            };
            self.router.ensure_running(self, workflow_id, wake);
        }
        for event in held_back {
            self.router.deliver(self, workflow_id, event);
        }
    }

    /// Parks the lease; `false`: it is kept (the store is one process's own, or the write
    /// failed).
    async fn let_go_until(&self, workflow_id: &str, parking: &LeaseParking) -> bool {
        let Some(leases) = self.leases.clone() else {
            return false;
        };
        let (id, due_ms) = (workflow_id.to_owned(), parking.first_timer_ms);
        let listening = parking.listening.clone();
        let parked = move || leases.park(&id, due_ms, &listening);
        match tokio::task::spawn_blocking(parked).await {
            Ok(Ok(())) => {
                self.telemetry.count(names::WORKFLOWS_PARKED);
                true
            }
            Ok(Err(error)) => {
                warn!(workflow_id, %error, "cannot park the workflow; it keeps its lease");
                false
            }
            Err(error) => {
                warn!(workflow_id, %error, "park task failed");
                false
            }
        }
    }

    /// [`WorkerState::take_to_run_here`] for a signal kept in the workflow's inbox, except
    /// that a workflow parked with the signal names its waits listen for is taken only if a
    /// message of one of them waits ([`Leases::take_for_signal`]): rebuilding it would only
    /// find it waiting again. Asked after the signal was kept, as
    /// [`WorkerState::sleeps_through_shared`] is.
    async fn take_for_signal(&self, workflow_id: &str) -> SignalFate {
        let Some(leases) = self.leases.clone() else {
            return SignalFate::WithItsOwner;
        };
        let id = workflow_id.to_owned();
        let took = match tokio::task::spawn_blocking(move || leases.take_for_signal(&id)).await {
            Ok(Ok(took)) => took,
            // A plain take then: a parked workflow's signal left to its owner would wait for
            // its timer.
            Ok(Err(error)) => {
                warn!(workflow_id, %error, "cannot take the workflow for its signal; trying a plain take");
                return self.taken_or_with_its_owner(workflow_id).await;
            }
            Err(error) => {
                warn!(workflow_id, %error, "take task failed; trying a plain take");
                return self.taken_or_with_its_owner(workflow_id).await;
            }
        };
        match took {
            SignalTake::Taken => {
                self.run_taken(workflow_id);
                SignalFate::TakenHere
            }
            SignalTake::Held => SignalFate::WithItsOwner,
            SignalTake::Parked(names) => {
                if self.no_listened_signal_waits(workflow_id, names).await {
                    SignalFate::LeftParked
                } else {
                    self.taken_or_with_its_owner(workflow_id).await
                }
            }
        }
    }

    /// [`WorkerState::take_to_run_here`], as a signal's fate.
    async fn taken_or_with_its_owner(&self, workflow_id: &str) -> SignalFate {
        match self.take_to_run_here(workflow_id).await {
            true => SignalFate::TakenHere,
            false => SignalFate::WithItsOwner,
        }
    }

    /// Whether no message of the names `listening` waits in the workflow's inbox; `false`
    /// when the inbox cannot be read (a rebuild costs a replay, a signal missed is a wait
    /// that never ends).
    async fn no_listened_signal_waits(&self, workflow_id: &str, listening: Vec<String>) -> bool {
        let id = workflow_id.to_owned();
        let looked = self
            .read(move |store| store.inbox_holds_named(&id, &listening))
            .await;
        match looked {
            Ok(listened) => !listened,
            Err(error) => {
                warn!(workflow_id, %error, "cannot look at the inbox: the signal rebuilds the run");
                false
            }
        }
    }

    /// Passes `event` on to `workflow_id`'s owner, another worker; a signal or a timer for a
    /// workflow nobody holds (parked, or its owner gone) takes it, to run here, unless it is a
    /// signal that leaves a parked workflow parked ([`WorkerState::take_for_signal`]).
    pub(super) fn forward(&self, workflow_id: &str, event: Mail) {
        let Some(leases) = self.leases.clone() else {
            return;
        };
        let Some(shared) = self.myself.upgrade() else {
            return;
        };
        let id = workflow_id.to_owned();
        match event {
            // Not on the worker's task set: a signal accepted while the worker stops still
            // wakes its owner.
            Mail::SignalArrived => drop(tokio::spawn(async move {
                match shared.take_for_signal(&id).await {
                    SignalFate::TakenHere => {
                        return shared.router.deliver(&shared, &id, Mail::SignalArrived);
                    }
                    SignalFate::LeftParked => return,
                    SignalFate::WithItsOwner => {}
                }
                let sent = tokio::task::spawn_blocking(move || leases.wake(&id)).await;
                if let Ok(Err(error)) = sent {
                    warn!(%error, "cannot wake the workflow's owner; it sees the signal on its next claim");
                }
            })),
            // A timer of a workflow parked here, or one whose lease moved: only a worker that
            // holds the lease may fire it, and a live owner has the same timer.
            Mail::TimerDue { seq } => self.spawn(async move {
                if shared.take_to_run_here(&id).await {
                    shared.router.deliver(&shared, &id, Mail::TimerDue { seq });
                }
            }),
            // Commands are relayed before they become mail; one here lost the lease between
            // the check and the delivery, and its caller may send it again.
            other => other.refuse(workflow_id, "it moved to another worker meanwhile"),
        }
    }

    /// A write of `workflow_id`'s run was refused: another worker holds the lease now. The run
    /// stopped without writing; nothing is published, since the new owner goes on with it. The
    /// store forgot the lease as it refused the write, at the epoch it refused: one this worker
    /// took again since is its to keep, and to run.
    pub(super) fn lost_lease(&self, workflow_id: &str, error: &StoreError) {
        error!(workflow_id, %error, "workflow run stopped: this worker lost its lease");
        self.telemetry.count(names::RUNS_FENCED);
        self.router.forget_asleep(workflow_id);
        self.forget_stuck(workflow_id);
        // Held again since the refusal, under a later epoch: a take while this run was
        // stopping found its executor still in place and started none.
        if self.owns_on_shared_store(workflow_id) {
            self.run_taken(workflow_id);
        }
    }

    /// A write of `workflow_id`'s run failed on a shared store (the connection was lost, the
    /// server restarted): nothing of it is half-written, so the run is let go, for the next
    /// claim (here or on another worker) to resume by replay. `false` on a store this process
    /// owns, where a failed write poisons the store instead.
    pub(super) async fn let_go_after_failed_write(
        &self,
        workflow_id: &str,
        error: &StoreError,
    ) -> bool {
        let Some(leases) = self.leases.clone() else {
            return false;
        };
        warn!(workflow_id, %error, "workflow run stopped by a failed write; letting it go for the next claim");
        self.telemetry.count(names::RUNS_LET_GO);
        self.forget_stuck(workflow_id);
        let id = workflow_id.to_owned();
        match tokio::task::spawn_blocking(move || leases.release(&id)).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                error!(workflow_id, %error, "cannot let the workflow go; this worker lapses at its next heartbeat")
            }
            Err(error) => error!(workflow_id, %error, "release task failed"),
        }
        true
    }

    /// Takes up to [`CLAIM_LIMIT`] workflows nobody holds and resumes each by replay, which
    /// arms the timers each still waits for: nothing else needs reading.
    async fn claim_and_resume(&self, leases: &Arc<dyn Leases>) -> Result<usize, StoreError> {
        let (claiming, now_ms) = (leases.clone(), self.clock.now_ms());
        let claimed = tokio::task::spawn_blocking(move || claiming.claim(CLAIM_LIMIT, now_ms))
            .await
            .map_err(|e| StoreError::Backend(format!("claim task failed: {e}")))??;
        if claimed.is_empty() {
            return Ok(0);
        }
        let since = Instant::now();
        for workflow_id in &claimed {
            self.router
                .ensure_running(self, workflow_id, Wake::Recovered { since });
        }
        info!(
            claimed = claimed.len(),
            "claimed workflows whose owner lapsed or let go"
        );
        Ok(claimed.len())
    }

    /// One round of keeping leases: the heartbeat first (opening the store and starting the
    /// worker took part of the registration's life already), then claims. `false` once this
    /// worker lapsed.
    pub(super) async fn renew_and_claim(&self, leases: &Arc<dyn Leases>) -> bool {
        let beating = leases.clone();
        match tokio::task::spawn_blocking(move || beating.heartbeat()).await {
            Ok(Ok(())) => {}
            Ok(Err(lapsed @ StoreError::Fenced { .. })) => {
                self.lapse(&lapsed);
                return false;
            }
            // The registration outlasts a heartbeat or two that do not get through.
            Ok(Err(error)) => warn!(%error, "heartbeat failed; trying again"),
            Err(error) => warn!(%error, "heartbeat task failed; trying again"),
        }
        self.claim_everything(leases).await;
        // Also the fallback for a relay's notification missed, and the first look at commands
        // sent to the workflows just claimed.
        self.apply_relayed(leases, None).await;
        self.observe_leases(leases);
        true
    }

    /// Counts into this worker's telemetry what its leases came to since the last look.
    pub(super) fn observe_leases(&self, leases: &Arc<dyn Leases>) {
        self.telemetry
            .observe_leases(leases.worker_id(), leases.stats());
    }

    /// Claims page after page while pages come back full: a full page may leave more.
    async fn claim_everything(&self, leases: &Arc<dyn Leases>) {
        loop {
            match self.claim_and_resume(leases).await {
                Ok(count) if count >= CLAIM_LIMIT => continue,
                Ok(_) => return,
                Err(error) => {
                    warn!(%error, "claiming workflows failed; trying again");
                    return;
                }
            }
        }
    }

    /// Every run stops: this worker's registration lapsed, so other workers may hold its
    /// workflows already.
    fn lapse(&self, error: &StoreError) {
        error!(%error, "this worker's leases lapsed: stopping every run");
        // Taken, so that nothing starts after (a start here would own a workflow under a
        // registration that is gone); dropping the set aborts every task in it.
        let tasks = lock(&self.tasks).take();
        drop(tasks);
        self.router.forget_every_asleep();
        self.lapsed.send_replace(true);
    }

    /// Lets other workers claim at once what this one held (a graceful shutdown).
    pub(super) async fn release_leases(&self) {
        let Some(leases) = self.leases.clone() else {
            return;
        };
        let released = tokio::task::spawn_blocking(move || leases.release_all()).await;
        match released {
            Ok(Ok(())) => info!("released every lease"),
            Ok(Err(error)) => {
                warn!(%error, "cannot release leases; others claim them once they lapse")
            }
            Err(error) => warn!(%error, "lease release task failed"),
        }
    }

    /// A wake-up from another worker.
    async fn woken(&self, wakeup: Wakeup) {
        let Some(leases) = &self.leases else {
            return;
        };
        let workflow_id = match wakeup {
            Wakeup::Signal(workflow_id) => workflow_id,
            Wakeup::Relayed(workflow_id) => {
                return self.apply_relayed(leases, Some(workflow_id)).await;
            }
            Wakeup::Missed => {
                self.apply_relayed(leases, None).await;
                return self.look_at_every_inbox(leases).await;
            }
        };
        if !self.router.is_asleep(&workflow_id) {
            return self.router.deliver(self, &workflow_id, Mail::SignalArrived);
        }
        // Looked at on a task of its own: the wake-ups of every other workflow do not wait
        // for this read of the inbox.
        let Some(shared) = self.myself.upgrade() else {
            return;
        };
        self.spawn(async move {
            if !shared.sleeps_through_shared(&workflow_id).await {
                shared
                    .router
                    .deliver(&shared, &workflow_id, Mail::SignalArrived);
            }
        });
    }

    /// On a store many workers share: whether the signals waiting for `workflow_id`, held here
    /// out of memory, leave it there, because none is named as a wait of its run listens for.
    /// Rebuilding it by replay would only find it waiting again, at a cost that grows with its
    /// history; the signals wait in the inbox until a wait listens for their names.
    ///
    /// Asked after the signal was kept: a run rebuilt after the names are read here reads an
    /// inbox that holds the signal, and a signal kept after the look sends a wake-up of its
    /// own.
    pub(super) async fn sleeps_through_shared(&self, workflow_id: &str) -> bool {
        if !self.owns_on_shared_store(workflow_id) {
            return false;
        }
        let Some(names) = self.router.asleep(workflow_id) else {
            return false;
        };
        self.no_listened_signal_waits(workflow_id, names).await
    }

    /// Wake-ups for signals may have been missed: each held workflow with a message waiting
    /// that it may take is delivered one.
    async fn look_at_every_inbox(&self, leases: &Arc<dyn Leases>) {
        for id in leases.held() {
            if self.sleeps_through_shared(&id).await {
                continue;
            }
            let reading = id.clone();
            let inbox = self.read(move |store| store.inbox(&reading, 0)).await;
            if inbox.is_ok_and(|messages| !messages.is_empty()) {
                self.router.deliver(self, &id, Mail::SignalArrived);
            }
        }
    }
}

/// Where a signal kept for a workflow this worker does not hold leaves it
/// ([`WorkerState::take_for_signal`]).
enum SignalFate {
    /// Taken: it runs here.
    TakenHere,
    /// Parked still: none of its waits listens for a message waiting.
    LeftParked,
    /// Another worker holds it (or it could not be taken): its owner is woken.
    WithItsOwner,
}

/// What a run letting go of its lease until its first timer waits for ([`WorkerState::park`]).
pub(super) struct LeaseParking {
    /// When its first timer is due, in the workflows' clock.
    pub(super) first_timer_ms: u64,
    /// The signal names its waits listen for.
    pub(super) listening: Vec<String>,
}

/// Heartbeats at a third of the lease and claims what nobody holds, until the registration
/// lapses (then every run stops) or the worker goes.
pub(super) async fn keep_leases(shared: Weak<WorkerState>, leases: Arc<dyn Leases>) {
    let period = leases.lease() / 3;
    loop {
        tokio::time::sleep(period).await;
        let Some(worker) = shared.upgrade() else {
            return;
        };
        if !worker.renew_and_claim(&leases).await {
            return;
        }
    }
}

/// Delivers the wake-ups other workers send to workflows this one holds.
pub(super) async fn deliver_wakeups(
    shared: Weak<WorkerState>,
    mut wakeups: mpsc::UnboundedReceiver<Wakeup>,
) {
    while let Some(wakeup) = wakeups.recv().await {
        let Some(worker) = shared.upgrade() else {
            return;
        };
        worker.woken(wakeup).await;
    }
}
