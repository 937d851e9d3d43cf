//! Wakes stream readers when their workflow's stream or status changed, so that they need not
//! poll the store.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::watch;

use crate::sync::lock;

/// One watch channel per workflow that has readers.
#[derive(Default)]
pub(crate) struct StreamWatchers {
    senders: Mutex<HashMap<String, watch::Sender<()>>>,
}

impl StreamWatchers {
    /// A receiver that sees a change after every later write that a reader of `workflow_id`'s
    /// stream should look at. Channels whose readers are all gone are dropped here.
    pub(crate) fn subscribe(&self, workflow_id: &str) -> watch::Receiver<()> {
        let mut senders = lock(&self.senders);
        senders.retain(|_, sender| sender.receiver_count() > 0);
        let sender = senders
            .entry(workflow_id.to_owned())
            .or_insert_with(|| watch::Sender::new(()));
        sender.subscribe()
    }

    /// Called once the writes to `workflow_ids` are on disk (readers read them next).
    pub(crate) fn notify<'a>(&self, workflow_ids: impl IntoIterator<Item = &'a str>) {
        let senders = lock(&self.senders);
        for workflow_id in workflow_ids {
            if let Some(sender) = senders.get(workflow_id) {
                sender.send_replace(());
            }
        }
    }
}
