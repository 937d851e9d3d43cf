//! Loads for replay, grouped: the executors that start at once (a recovery, a burst of due
//! timers) share one task on the blocking pool per group, instead of paying a hand-off to it
//! and back each, which is what a load costs once the data is cached.
//!
//! One task takes the requests. While every group slot is taken, requests pile up, and the next
//! group takes up to [`MAX_GROUP`] of them; a lone request is a group of one at once.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio_util::task::TaskTracker;

use super::{read_for_replay, Loaded};
use crate::error::RunError;
use crate::store::{off_async_thread, ReplayReads, Store, StoreReads};

/// Most loads in one group.
const MAX_GROUP: usize = 256;

type Answer = Result<Option<Loaded>, RunError>;

struct Request {
    workflow_id: String,
    reply: oneshot::Sender<Answer>,
}

/// Where executors ask for what they replay.
pub(crate) struct Loads(mpsc::UnboundedSender<Request>);

/// The receiving end, for [`run_loads`].
pub(crate) struct LoadRequests(mpsc::UnboundedReceiver<Request>);

/// A pair: the executors' end and the loader's.
pub(crate) fn loads() -> (Loads, LoadRequests) {
    let (requests, receiver) = mpsc::unbounded_channel();
    (Loads(requests), LoadRequests(receiver))
}

impl Loads {
    /// Reads what replaying `workflow_id` needs; `None` if it ended.
    pub(crate) async fn load(&self, workflow_id: &str) -> Answer {
        let (reply, answer) = oneshot::channel();
        let request = Request {
            workflow_id: workflow_id.to_owned(),
            reply,
        };
        self.0.send(request).map_err(|_| RunError::ShutDown)?;
        answer.await.unwrap_or(Err(RunError::ShutDown))
    }
}

/// Takes load requests until every [`Loads`] is gone. The blocking tasks are tracked by
/// `in_flight`: they hold the store, which a shutdown waits to see closed.
pub(crate) async fn run_loads(
    store: Arc<dyn Store>,
    LoadRequests(mut requests): LoadRequests,
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

/// Answers each request as soon as its load is read, so its executor replays while the rest of
/// the group is read. The group's reads are one burst, which reads the store as it was when the
/// burst began: after every request of the group, so each load is one a read of its own could
/// have made, at a moment after its request. A write that lands after that moment is one the
/// executor must learn of anyway (as mail, or as a conflict on its first commit).
fn answer_group(store: &dyn Store, mut group: Vec<Request>) {
    let mut answer = |reads: &dyn ReplayReads| {
        for request in group.drain(..) {
            if request.reply.is_closed() {
                // Its executor is gone (a shutdown): nothing waits for this read.
                continue;
            }
            let loaded = read_for_replay(reads, &request.workflow_id);
            let _ = request.reply.send(loaded);
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
