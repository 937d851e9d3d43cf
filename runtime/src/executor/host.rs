//! What an executor needs from the process that hosts it. The executor defines it and the
//! worker implements it, so the executor never names the worker: what it may ask of its host
//! is this list, and nothing else.

use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;

use super::{Mail, Reads};
use crate::clock::Clock;
use crate::entropy::Entropy;
use crate::error::RunError;
use crate::faults::FaultPlan;
use crate::journal::{Failure, Payload};
use crate::keys::TimerKey;
use crate::registry::Registry;
use crate::store::{Store, StoreError};
use crate::telemetry::{Telemetry, Wake};

/// The host of resident workflows: their store and services, and where their runs report.
pub(crate) trait Host: Send + Sync + Sized + 'static {
    /// Marks a workflow's end as being committed and counted, until dropped: readers meanwhile
    /// wait for its publication instead of reading the end from the store.
    type Ending<'a>: Send
    where
        Self: 'a;

    /// The store.
    fn store(&self) -> &Arc<dyn Store>;
    /// The workflows and activities hosted.
    fn registry(&self) -> &Arc<Registry>;
    /// The time source.
    fn clock(&self) -> &Arc<dyn Clock>;
    /// Where new random values come from.
    fn entropy(&self) -> &Arc<dyn Entropy>;
    /// Where the replay-safety metrics are counted.
    fn telemetry(&self) -> &Telemetry;
    /// Faults a test injects, if any.
    fn faults(&self) -> Option<&Arc<FaultPlan>>;
    /// A run waiting only on timers due further away than this leaves memory.
    fn eviction_threshold_ms(&self) -> u64;
    /// Tracks the attempts, reconcilers and retry timers runs start: a shutdown waits for them.
    fn in_flight(&self) -> &TaskTracker;
    /// Where a run asks for what it replays.
    fn reads(&self) -> &Reads;
    /// The input fields journaled as their digest only.
    fn redaction(&self) -> &crate::redact::Redaction;
    /// The largest payload journaled, in bytes (the worker's `max_payload_bytes`).
    fn max_payload_bytes(&self) -> usize;

    /// Wakes the workflow with `TimerFired` at the timer's time.
    fn schedule_timer(&self, timer: TimerKey);
    /// Forgets a timer the workflow no longer waits for.
    fn cancel_timer(&self, timer: TimerKey);
    /// Runs `read` on the blocking pool, holding the store until it is done.
    fn read<T, F>(&self, read: F) -> BoxFuture<'_, Result<T, StoreError>>
    where
        T: Send + 'static,
        F: FnOnce(&dyn Store) -> Result<T, StoreError> + Send + 'static;

    /// Takes the run out of memory if no event waits in its mailbox; `false`: stay.
    /// `listening`: the signal names its waits listen for.
    fn try_evict(
        &self,
        workflow_id: &str,
        mailbox: &mpsc::UnboundedReceiver<Mail>,
        listening: Vec<String>,
    ) -> bool;
    /// On a store many workers share, takes the run out of memory as [`Host::try_evict`]
    /// does, to let go of its lease until its first timer is due ([`Host::park`]): events
    /// that come meanwhile are held back. `false`: stay (an event waits, or the store is one
    /// process's own).
    fn begin_parking(&self, workflow_id: &str, mailbox: &mpsc::UnboundedReceiver<Mail>) -> bool;
    /// Lets go of the workflow's lease until its first timer, due at `first_timer_ms`:
    /// whichever worker is free then runs it. A signal of a name in `listening` (the names its
    /// waits listen for) found in the inbox once the lease is let go, or an event other than a
    /// signal held back meanwhile, takes it back at once.
    fn park(
        &self,
        workflow_id: &str,
        first_timer_ms: u64,
        listening: Vec<String>,
    ) -> BoxFuture<'_, ()>;
    /// The run replayed its journal without diverging: it is no longer held as stuck.
    fn replayed_cleanly(&self, workflow_id: &str);
    /// Marks the workflow's end as being committed (see [`Host::Ending`]).
    fn ending(&self, workflow_id: &str) -> Self::Ending<'_>;
    /// The run fed by `events` ended with `outcome`, which is journaled.
    fn ended(
        &self,
        workflow_id: &str,
        events: &mpsc::UnboundedSender<Mail>,
        outcome: Result<Payload, Failure>,
    );
    /// The run fed by `events` gave its workflow's journal to a new run (continue-as-new),
    /// which runs next and is handed `commands`, the cancellations and operators' decisions
    /// the run left unread.
    fn continued(
        &self,
        workflow_id: &str,
        events: &mpsc::UnboundedSender<Mail>,
        commands: Vec<Mail>,
    );
    /// The run fed by `events` found its workflow ended before it (a late event).
    fn found_ended(&self, workflow_id: &str, events: &mpsc::UnboundedSender<Mail>);
    /// The run fed by `events` stopped with `error`, without ending its workflow.
    fn stopped(
        &self,
        workflow_id: &str,
        events: &mpsc::UnboundedSender<Mail>,
        wake: Wake,
        error: RunError,
    ) -> BoxFuture<'_, ()>;
}
