//! Ownership of workflows in a store that many workers share.
//!
//! A workflow is owned by one worker at a time. Its owner alone writes its journal: every
//! change is fenced by the lease's epoch in the transaction that writes it
//! ([`super::Reads::fence`]), so a worker that lost a lease (paused, partitioned, presumed dead)
//! has its next write refused instead of interleaving with the new owner's. A worker's leases
//! last as long as its registration, renewed by [`Leases::heartbeat`]; once it lapses, another
//! worker's [`Leases::claim`] takes them, each under a new epoch.

use std::time::Duration;

use super::StoreError;

/// The leases of a shared store, as one worker sees them. Every method blocks on the database:
/// call them off the async threads.
pub trait Leases: Send + Sync + 'static {
    /// This worker's id, as owners are named.
    fn worker_id(&self) -> &str;
    /// How long a registration lasts without a heartbeat.
    fn lease(&self) -> Duration;
    /// Renews this worker's registration. [`StoreError::Fenced`] once it has lapsed: from then
    /// on other workers may hold its workflows, and it must stop every run.
    fn heartbeat(&self) -> Result<(), StoreError>;
    /// Takes up to `limit` workflows that nobody holds (their owner lapsed or let them go),
    /// each under a new epoch, and returns their ids.
    fn claim(&self, limit: usize) -> Result<Vec<String>, StoreError>;
    /// Whether this worker holds `workflow_id`'s lease, as far as it knows (a write may still
    /// find it lost).
    fn holds(&self, workflow_id: &str) -> bool;
    /// The workflows whose leases this worker holds.
    fn held(&self) -> Vec<String>;
    /// Forgets the lease of a run this worker stopped, without writing (the write that found it
    /// lost is what told).
    fn forget(&self, workflow_id: &str);
    /// The worker that holds `workflow_id`, if any.
    fn owner(&self, workflow_id: &str) -> Result<Option<String>, StoreError>;
    /// Tells `workflow_id`'s owner, wherever it runs, that the workflow has something new (a
    /// signal in its inbox).
    fn wake(&self, workflow_id: &str) -> Result<(), StoreError>;
    /// The wake-ups for workflows this worker holds, as [`Leases::wake`] sent them; an empty id
    /// means some may have been missed (the listener reconnected): look at every one. Only the
    /// first call gets them.
    fn wakeups(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<String>>;
    /// Lets go of `workflow_id`'s lease, so that the next claim (by any worker, this one
    /// included) resumes it by replay: for a run stopped by a write that failed. If that fails
    /// too, this worker cannot tell what it holds, and its next heartbeat lapses it.
    fn release(&self, workflow_id: &str) -> Result<(), StoreError>;
    /// Lets go of every lease this worker holds and of its registration, so that other workers
    /// claim its workflows at once (a graceful shutdown).
    fn release_all(&self) -> Result<(), StoreError>;
}

impl std::fmt::Debug for dyn Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leases")
            .field("worker_id", &self.worker_id())
            .finish()
    }
}
