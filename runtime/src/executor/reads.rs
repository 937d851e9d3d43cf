//! Reads grouped on the blocking pool: the loads of executors that start at once (a recovery, a
//! burst of due timers), and the reads of workflows' outcomes (every caller waiting for one
//! reads the workflow's record, and a thousand callers can ask at once). A group shares one
//! task on the blocking pool instead of paying a hand-off to it and back each, which is what a
//! read costs once the data is cached; and a burst of callers no longer has the pool start a
//! thread for most of them.
//!
//! One task takes the requests. While every group slot is taken, requests pile up, and the next
//! group takes up to [`MAX_GROUP`] of them; a lone request is a group of one at once. A small
//! read that panics answers as failed, and the rest of its group is read as if it had not.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio_util::task::TaskTracker;

use super::{read_for_replay, Loaded};
use crate::error::RunError;
use crate::run::panic_message;
use crate::store::{off_async_thread, ReplayReads, Store, StoreError, StoreReads};

/// Most reads in one group.
const MAX_GROUP: usize = 256;

type LoadAnswer = Result<Option<Loaded>, RunError>;

/// A read of a row or two, answering through the channel it captured.
type SmallRead = Box<dyn FnOnce(&dyn Store) + Send>;

enum Request {
    /// What replaying a workflow needs.
    Load {
        workflow_id: String,
        reply: oneshot::Sender<LoadAnswer>,
    },
    /// Only small reads come this way: a group's reads are made one after another, so a long
    /// one (a listing, a whole journal) would hold up the rest of its group.
    Small(SmallRead),
}

/// Where executors ask for what they replay, and the worker for its outcome reads.
pub(crate) struct Reads {
    requests: mpsc::UnboundedSender<Request>,
    /// For a small read asked once the grouping task is gone (the worker's tasks were stopped
    /// by a shutdown, or by its leases lapsing), which runs on its own.
    store: Arc<dyn Store>,
    in_flight: TaskTracker,
}

/// The receiving end, for [`run_reads`].
pub(crate) struct ReadRequests {
    requests: mpsc::UnboundedReceiver<Request>,
    store: Arc<dyn Store>,
    /// Tracks the blocking tasks: they hold the store, which a shutdown waits to see closed.
    in_flight: TaskTracker,
}

/// A pair: the askers' end and the reader's.
pub(crate) fn reads(store: Arc<dyn Store>, in_flight: TaskTracker) -> (Reads, ReadRequests) {
    let (sender, receiver) = mpsc::unbounded_channel();
    let reads = Reads {
        requests: sender,
        store: store.clone(),
        in_flight: in_flight.clone(),
    };
    let requests = ReadRequests {
        requests: receiver,
        store,
        in_flight,
    };
    (reads, requests)
}

impl Reads {
    /// Reads what replaying `workflow_id` needs; `None` if it ended.
    pub(crate) async fn load(&self, workflow_id: &str) -> LoadAnswer {
        let (reply, answer) = oneshot::channel();
        let request = Request::Load {
            workflow_id: workflow_id.to_owned(),
            reply,
        };
        self.requests
            .send(request)
            .map_err(|_| RunError::ShutDown)?;
        answer.await.unwrap_or(Err(RunError::ShutDown))
    }

    /// Runs `read`, a read of a row or two, in a group. `StoreError::Closed` only if the
    /// grouping task was stopped while the read waited for its group; a read asked after that
    /// runs on its own. The request goes through the grouping task: a caller that blocks its
    /// runtime's only thread meanwhile is never answered.
    pub(crate) async fn small<T, F>(&self, read: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&dyn Store) -> Result<T, StoreError> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let read: SmallRead = Box::new(move |store: &dyn Store| {
            if !reply.is_closed() {
                let _ = reply.send(answer_panicking(|| read(store)));
            }
        });
        if let Err(mpsc::error::SendError(Request::Small(read))) =
            self.requests.send(Request::Small(read))
        {
            self.read_alone(read);
        }
        answer.await.unwrap_or(Err(StoreError::Closed))
    }

    fn read_alone(&self, read: SmallRead) {
        read_on_blocking_pool(self.store.clone(), &self.in_flight, read);
    }
}

/// Runs `read` on the blocking pool, off the async threads. The task holds the store and a
/// token of `in_flight`: a shutdown waits for the token, and finds the store let go with it,
/// even if the read's caller is gone.
pub(crate) fn read_on_blocking_pool<T, F>(
    store: Arc<dyn Store>,
    in_flight: &TaskTracker,
    read: F,
) -> tokio::task::JoinHandle<T>
where
    T: Send + 'static,
    F: FnOnce(&dyn Store) -> T + Send + 'static,
{
    let token = in_flight.token();
    tokio::task::spawn_blocking(move || {
        let value = off_async_thread(|| read(store.as_ref()));
        // The store goes before the token (a captured value would be dropped after it).
        drop((store, token));
        value
    })
}

/// `read`'s answer, or a failure naming its panic.
fn answer_panicking<T>(read: impl FnOnce() -> Result<T, StoreError>) -> Result<T, StoreError> {
    std::panic::catch_unwind(AssertUnwindSafe(read)).unwrap_or_else(|panic| {
        let why = panic_message(&panic);
        Err(StoreError::Backend(format!("a store read panicked: {why}")))
    })
}

/// Takes read requests until every [`Reads`] is gone.
pub(crate) async fn run_reads(requests: ReadRequests) {
    let ReadRequests {
        mut requests,
        store,
        in_flight,
    } = requests;
    let slots = Arc::new(Semaphore::new(group_slots()));
    while let Some(first) = requests.recv().await {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match requests.try_recv() {
                Ok(request) => group.push(request),
                Err(_) => break,
            }
        }
        read_on_blocking_pool(store.clone(), &in_flight, move |store| {
            answer_group(store, group);
            drop(slot);
        });
    }
}

/// Makes the group's small reads, then its loads.
fn answer_group(store: &dyn Store, group: Vec<Request>) {
    let mut loads = Vec::new();
    for request in group {
        match request {
            Request::Small(read) => read(store),
            Request::Load { workflow_id, reply } => loads.push((workflow_id, reply)),
        }
    }
    if !loads.is_empty() {
        answer_loads(store, loads);
    }
}

/// Answers each load as soon as it is read, so its executor replays while the rest of the
/// group is read. The group's loads are one burst, which reads the store as it was when the
/// burst began: after every request of the group, so each load is one a read of its own could
/// have made, at a moment after its request. A write that lands after that moment is one the
/// executor must learn of anyway (as mail, or as a conflict on its first commit).
fn answer_loads(store: &dyn Store, mut loads: Vec<(String, oneshot::Sender<LoadAnswer>)>) {
    let mut answer = |reads: &dyn ReplayReads| {
        for (workflow_id, reply) in loads.drain(..) {
            if reply.is_closed() {
                // Its executor is gone (a shutdown): nothing waits for this read.
                continue;
            }
            let _ = reply.send(read_for_replay(reads, &workflow_id));
        }
    };
    if !store.read_burst(&mut answer) {
        answer(&StoreReads(store));
    }
}

/// Groups read at once: one per core, since a cached read is CPU work.
fn group_slots() -> usize {
    std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{MemoryEngine, MemoryStore};

    fn store() -> Arc<dyn Store> {
        Arc::new(MemoryStore::on(MemoryEngine::new()).unwrap())
    }

    /// A small read that panics answers as failed, and the read grouped after it is made.
    #[tokio::test]
    async fn a_small_read_that_panics_fails_alone() {
        let (reads, requests) = reads(store(), TaskTracker::new());
        // Both are asked before the grouping task first runs: they make one group.
        let panicking = reads.small(|_| -> Result<(), StoreError> { panic!("a store's bug") });
        let after = reads.small(|store| store.workflow("absent"));
        tokio::spawn(run_reads(requests));
        let (panicked, read) = tokio::join!(panicking, after);
        let failure = panicked.unwrap_err().to_string();
        assert!(failure.contains("a store's bug"), "{failure}");
        assert!(read.unwrap().is_none());
    }

    /// Once the grouping task is gone (the worker's tasks stopped), a small read is still
    /// made, on its own.
    #[tokio::test]
    async fn a_small_read_after_the_groups_stopped_is_made_alone() {
        let (reads, requests) = reads(store(), TaskTracker::new());
        drop(requests);
        let read = reads.small(|store| store.workflow("absent")).await;
        assert!(read.unwrap().is_none());
    }
}
