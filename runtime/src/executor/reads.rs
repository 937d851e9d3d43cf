//! Reads grouped on the blocking pool: the loads of executors that start at once (a recovery, a
//! burst of due timers), and the small reads of callers asking at once after workflows (a
//! thousand callers waiting for as many outcomes each read a record). A group shares one task on
//! the blocking pool instead of paying a hand-off to it and back each, which is what a read
//! costs once the data is cached; and a burst of callers no longer has the pool start a thread
//! for most of them.
//!
//! One task takes the requests. While every group slot is taken, requests pile up, and the next
//! group takes up to [`MAX_GROUP`] of them; a lone request is a group of one at once.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio_util::task::TaskTracker;

use super::{read_for_replay, Loaded};
use crate::error::RunError;
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

/// Where executors ask for what they replay, and the worker for its small reads.
pub(crate) struct Reads(mpsc::UnboundedSender<Request>);

/// The receiving end, for [`run_reads`].
pub(crate) struct ReadRequests(mpsc::UnboundedReceiver<Request>);

/// A pair: the askers' end and the reader's.
pub(crate) fn reads() -> (Reads, ReadRequests) {
    let (requests, receiver) = mpsc::unbounded_channel();
    (Reads(requests), ReadRequests(receiver))
}

impl Reads {
    /// Reads what replaying `workflow_id` needs; `None` if it ended.
    pub(crate) async fn load(&self, workflow_id: &str) -> LoadAnswer {
        let (reply, answer) = oneshot::channel();
        let request = Request::Load {
            workflow_id: workflow_id.to_owned(),
            reply,
        };
        self.0.send(request).map_err(|_| RunError::ShutDown)?;
        answer.await.unwrap_or(Err(RunError::ShutDown))
    }

    /// Runs `read`, a read of a row or two, in a group; `StoreError::Closed` once the worker
    /// stopped reading. The request goes through the task that forms the groups: a caller that
    /// blocks its runtime's only thread meanwhile is never answered.
    pub(crate) async fn small<T, F>(&self, read: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&dyn Store) -> Result<T, StoreError> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let request = Request::Small(Box::new(move |store: &dyn Store| {
            if !reply.is_closed() {
                let _ = reply.send(read(store));
            }
        }));
        self.0.send(request).map_err(|_| StoreError::Closed)?;
        answer.await.unwrap_or(Err(StoreError::Closed))
    }
}

/// Takes read requests until every [`Reads`] is gone. The blocking tasks are tracked by
/// `in_flight`: they hold the store, which a shutdown waits to see closed.
pub(crate) async fn run_reads(
    store: Arc<dyn Store>,
    ReadRequests(mut requests): ReadRequests,
    in_flight: TaskTracker,
) {
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
        let store = store.clone();
        let token = in_flight.token();
        tokio::task::spawn_blocking(move || {
            off_async_thread(|| answer_group(store.as_ref(), group));
            // The store goes before the token: a shutdown that sees the token gone must find
            // the store let go too (a captured value would be dropped after the token).
            drop((store, slot, token));
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
