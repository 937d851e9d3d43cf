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
    /// Takes up to `limit` workflows that nobody holds (their owner lapsed, let them go, or
    /// parked them and their timer is due at `now_ms`, in the workflows' clock), each under a
    /// new epoch, and returns their ids. For a while after a lease statement of this worker
    /// failed in a way that may have committed unseen (its answer lost with its connection),
    /// it also takes again and returns the workflows whose leases name this worker though it
    /// did not know it held them: so it may return more than `limit`.
    fn claim(&self, limit: usize, now_ms: u64) -> Result<Vec<String>, StoreError>;
    /// Takes `workflow_id` if nobody holds it (its owner lapsed, let it go or parked it,
    /// whether or not its timer is due): for an event that arrived here. `false`: a live
    /// worker holds it. `true` too when this worker holds it already, known to it or not (a
    /// take whose answer was lost took it).
    fn take(&self, workflow_id: &str) -> Result<bool, StoreError>;
    /// Lets go of `workflow_id`, which left memory to wait for a timer due at `due_at_ms` (in
    /// the workflows' clock, as timers are: a test's virtual clock moves it too): any worker's
    /// claim takes it once the timer is due, and any worker takes it at once for an event
    /// ([`Leases::take`]), but for a signal of a name not in `listening`, the signal names its
    /// waits listen for ([`Leases::take_for_signal`]). This worker no longer holds it when
    /// this returns `Ok`.
    fn park(
        &self,
        workflow_id: &str,
        due_at_ms: u64,
        listening: &[String],
    ) -> Result<(), StoreError>;
    /// [`Leases::take`] for a signal kept in `workflow_id`'s inbox, in one statement, except
    /// that a workflow parked with the signal names its waits listen for is left parked and
    /// the names are returned: the caller takes it only if a message of one of them waits. A
    /// workflow parked by a build that wrote no names is taken; one whose lease names this
    /// worker already, known to it or not, is `Taken` too. On a failure, a plain take finds
    /// out whether the statement took it.
    fn take_for_signal(&self, workflow_id: &str) -> Result<SignalTake, StoreError>;
    /// Whether this worker holds `workflow_id`'s lease, as far as it knows (a write may still
    /// find it lost).
    fn holds(&self, workflow_id: &str) -> bool;
    /// The workflows whose leases this worker holds.
    fn held(&self) -> Vec<String>;
    /// The epoch at which this worker holds `workflow_id`'s lease, as far as it knows.
    fn held_epoch(&self, workflow_id: &str) -> Option<i64>;
    /// Forgets `workflow_id`'s lease, without writing, if this worker still holds it at
    /// `epoch`: one taken again since (a later epoch) is kept. A write refused because the
    /// lease moved on forgets it so, at the epoch it was refused at.
    fn forget_at(&self, workflow_id: &str, epoch: i64);
    /// The worker that holds `workflow_id`, if any.
    fn owner(&self, workflow_id: &str) -> Result<Option<String>, StoreError>;
    /// The ids of the workers whose registration has not lapsed, this one's included while it
    /// is live, in order: for work the workers share out among themselves. By default this
    /// worker alone, which then does all of that work itself.
    fn live_workers(&self) -> Result<Vec<String>, StoreError> {
        Ok(vec![self.worker_id().to_owned()])
    }
    /// Tells `workflow_id`'s owner, wherever it runs, that the workflow has something new (a
    /// signal in its inbox).
    fn wake(&self, workflow_id: &str) -> Result<(), StoreError>;
    /// The wake-ups for workflows this worker holds, as [`Leases::wake`] and
    /// [`Leases::relay`] sent them. Only the first call gets them.
    fn wakeups(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<Wakeup>>;
    /// Lets go of `workflow_id`'s lease, so that the next claim (by any worker, this one
    /// included) resumes it by replay: for a run stopped by a write that failed. If that fails
    /// too, this worker cannot tell what it holds, and its next heartbeat lapses it.
    fn release(&self, workflow_id: &str) -> Result<(), StoreError>;
    /// Lets go of every lease this worker holds and of its registration, so that other workers
    /// claim its workflows at once (a graceful shutdown).
    fn release_all(&self) -> Result<(), StoreError>;
    /// Hands `command` to `workflow_id`'s owner, whichever worker holds the workflow now or
    /// claims it next, and waits for its answer: up to `patience` for a worker to take it
    /// (else it is withdrawn unapplied), as long again for its taker to answer. Unlike the
    /// other methods this one does not block: await it on the async threads.
    fn relay(&self, workflow_id: &str, command: Vec<u8>, patience: Duration) -> RelayFuture;
    /// Takes the relayed commands waiting for workflows this worker holds (`Some`: for that
    /// one only), oldest first. Each taken command is this worker's to answer.
    fn take_relayed(&self, workflow_id: Option<&str>) -> Result<Vec<RelayedCommand>, StoreError>;
    /// Answers a command this worker took; its sender is woken.
    fn answer_relayed(&self, id: i64, answer: &[u8]) -> Result<(), StoreError>;
    /// What this worker's leases came to since the store was opened.
    fn stats(&self) -> LeaseStats;
}

/// Counts of what a worker's leases came to, kept by the store as it goes and read when the
/// worker's metrics are scraped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeaseStats {
    /// Writes refused by their lease's fence.
    pub fenced_writes: u64,
    /// Heartbeats that lapsed this worker's registration (found it gone, or this worker could
    /// no longer tell which leases it held).
    pub lapses: u64,
    /// Leases taken of workflows nobody held: their owner lapsed or let them go, or a worker
    /// (this one included) parked them.
    pub claimed: u64,
    /// Leases found naming this worker though it did not know it held them, and taken up: a
    /// statement of its own took them, and its answer was lost.
    pub adopted: u64,
}

/// What became of a command handed to a workflow's owner ([`Leases::relay`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Relayed {
    /// The owner applied it; this is its answer.
    Answered(Vec<u8>),
    /// The workflow has no lease: it ended (or never started).
    NoLease,
    /// No worker took it within the patience given: it was withdrawn, unapplied.
    NotTaken,
    /// A worker took it and no answer came (its taker lapsed, or did not answer in time, or
    /// the command could not be read): whether it was applied, nobody can tell from here.
    /// This says why.
    OutcomeUnknown(String),
}

/// What [`Leases::relay`] returns.
pub type RelayFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Relayed, StoreError>> + Send>>;

/// A command another worker relayed to a workflow this worker holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayedCommand {
    /// Its id, to answer it by.
    pub id: i64,
    /// The workflow it is for.
    pub workflow_id: String,
    /// What the sender encoded.
    pub command: Vec<u8>,
}

/// What [`Leases::take_for_signal`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignalTake {
    /// This worker holds the workflow now.
    Taken,
    /// The workflow is parked, its waits listening for these signal names: left parked.
    Parked(Vec<String>),
    /// A live worker holds it, or it has no lease: its owner is to be woken.
    Held,
}

/// What a wake-up from another worker says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wakeup {
    /// The workflow has a new signal in its inbox.
    Signal(String),
    /// Commands were relayed to the workflow ([`Leases::take_relayed`]).
    Relayed(String),
    /// Wake-ups may have been missed (the listener reconnected): look at every workflow.
    Missed,
}

impl std::fmt::Debug for dyn Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leases")
            .field("worker_id", &self.worker_id())
            .finish()
    }
}
