//! The worker as the executors' [`Host`]: their store and services, and what it does when a run
//! ends, stops or leaves memory.

use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;

use super::ownership::LeaseParking;
use super::{Durability, EndingGuard, WorkerState};
use crate::clock::Clock;
use crate::entropy::Entropy;
use crate::error::RunError;
use crate::executor::{Host, Mail, Reads};
use crate::faults::FaultPlan;
use crate::journal::{Failure, Payload};
use crate::keys::TimerKey;
use crate::registry::Registry;
use crate::store::{Store, StoreError};
use crate::telemetry::{Telemetry, Wake};

impl Host for WorkerState {
    type Ending<'a> = EndingGuard<'a>;

    fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    fn entropy(&self) -> &Arc<dyn Entropy> {
        &self.entropy
    }

    fn telemetry(&self) -> &Telemetry {
        &self.telemetry
    }

    fn faults(&self) -> Option<&Arc<FaultPlan>> {
        self.faults.as_ref()
    }

    fn eviction_threshold_ms(&self) -> u64 {
        self.eviction_threshold_ms
    }

    fn in_flight(&self) -> &TaskTracker {
        &self.in_flight
    }

    fn reads(&self) -> &Reads {
        &self.reads
    }

    fn redaction(&self) -> &crate::redact::Redaction {
        &self.redaction
    }

    fn max_payload_bytes(&self) -> usize {
        self.max_payload_bytes
    }

    fn schedule_timer(&self, timer: TimerKey) {
        self.timers.schedule(timer);
    }

    fn cancel_timer(&self, timer: TimerKey) {
        self.timers.cancel(timer);
    }

    fn read<T, F>(&self, read: F) -> BoxFuture<'_, Result<T, StoreError>>
    where
        T: Send + 'static,
        F: FnOnce(&dyn Store) -> Result<T, StoreError> + Send + 'static,
    {
        Box::pin(WorkerState::read(self, read))
    }

    fn try_evict(
        &self,
        workflow_id: &str,
        mailbox: &mpsc::UnboundedReceiver<Mail>,
        listening: Vec<String>,
    ) -> bool {
        // On a store one process owns the names go into the run's parked mark, when it has
        // one; a run without a mark is rebuilt by any signal.
        let listening = self.leases.is_some().then_some(listening);
        self.router.try_evict(workflow_id, mailbox, listening)
    }

    fn begin_parking(&self, workflow_id: &str, mailbox: &mpsc::UnboundedReceiver<Mail>) -> bool {
        self.leases.is_some() && self.router.begin_parking(workflow_id, mailbox)
    }

    fn park(
        &self,
        workflow_id: &str,
        first_timer_ms: u64,
        listening: Vec<String>,
    ) -> BoxFuture<'_, ()> {
        let workflow_id = workflow_id.to_owned();
        let parking = LeaseParking {
            first_timer_ms,
            listening,
        };
        Box::pin(async move { WorkerState::park(self, &workflow_id, parking).await })
    }

    fn replayed_cleanly(&self, workflow_id: &str) {
        self.unstuck(workflow_id);
    }

    fn ending(&self, workflow_id: &str) -> EndingGuard<'_> {
        WorkerState::ending(self, workflow_id)
    }

    fn ended(
        &self,
        workflow_id: &str,
        events: &mpsc::UnboundedSender<Mail>,
        outcome: Result<Payload, Failure>,
    ) {
        self.router.remove(workflow_id, events);
        self.forget_stuck(workflow_id);
        let outcome = outcome.map_err(RunError::Failed);
        self.publish(workflow_id, outcome, Durability::Journaled);
    }

    fn continued(
        &self,
        workflow_id: &str,
        events: &mpsc::UnboundedSender<Mail>,
        commands: Vec<Mail>,
    ) {
        self.router.remove(workflow_id, events);
        self.router.ensure_running(self, workflow_id, Wake::Started);
        for command in commands {
            self.router.deliver(self, workflow_id, command);
        }
    }

    fn found_ended(&self, workflow_id: &str, events: &mpsc::UnboundedSender<Mail>) {
        self.router.remove(workflow_id, events);
        self.forget_stuck(workflow_id);
    }

    fn stopped(
        &self,
        workflow_id: &str,
        events: &mpsc::UnboundedSender<Mail>,
        wake: Wake,
        error: RunError,
    ) -> BoxFuture<'_, ()> {
        self.router.remove(workflow_id, events);
        let workflow_id = workflow_id.to_owned();
        Box::pin(async move { self.run_stopped(&workflow_id, wake, error).await })
    }
}
