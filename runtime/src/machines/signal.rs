//! Signal waits (`ctx.signal(name)`): the oldest wait for a name takes the oldest signal of
//! that name from the inbox, one per poll.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::inbox::InboxMessage;
use crate::journal::{CommandIdentity, CommandKind, Payload, Seq};

/// An open signal wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signal {
    name: String,
}

impl Signal {
    pub(super) fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
        }
    }

    pub(super) fn name(&self) -> &str {
        &self.name
    }
}

/// The signals a run has read from its inbox and not yet taken, by arrival, with each
/// name's arrivals beside them: choosing the next delivery looks only at the names some wait
/// listens for, however many signals of other names wait unread (scanning every unread
/// signal at each event made each signal cost in proportion to the inbox).
#[derive(Debug, Default)]
pub struct Unread {
    messages: BTreeMap<u64, InboxMessage>,
    by_name: HashMap<String, BTreeSet<u64>>,
}

impl Unread {
    /// Holds `message`, arrived as number `arrival` (a number read again replaces its message).
    pub fn insert(&mut self, arrival: u64, message: InboxMessage) {
        if let Some(replaced) = self.messages.remove(&arrival) {
            self.unindex(arrival, &replaced.name);
        }
        match self.by_name.get_mut(message.name.as_str()) {
            Some(arrivals) => {
                arrivals.insert(arrival);
            }
            None => {
                let arrivals = BTreeSet::from([arrival]);
                self.by_name.insert(message.name.clone(), arrivals);
            }
        }
        self.messages.insert(arrival, message);
    }

    /// Takes the signal that arrived as number `arrival`.
    pub fn remove(&mut self, arrival: u64) -> Option<InboxMessage> {
        let message = self.messages.remove(&arrival)?;
        self.unindex(arrival, &message.name);
        Some(message)
    }

    fn unindex(&mut self, arrival: u64, name: &str) {
        if let Some(arrivals) = self.by_name.get_mut(name) {
            arrivals.remove(&arrival);
            if arrivals.is_empty() {
                self.by_name.remove(name);
            }
        }
    }

    /// How many signals are held.
    pub fn len(&self) -> usize {
        self.messages.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    /// The signal to hand over now, as `(arrival, seq)`: the oldest held that one of
    /// `listeners` (oldest first) waits for goes to the oldest wait for its name.
    pub fn next_delivery(&self, listeners: &[(Seq, &str)]) -> Option<(u64, Seq)> {
        let mut next: Option<(u64, Seq)> = None;
        for &(seq, name) in listeners {
            let Some(&oldest) = self.by_name.get(name).and_then(BTreeSet::first) else {
                continue;
            };
            // Strictly older: a later wait for the same name finds the same signal, and the
            // oldest wait keeps it.
            if next.is_none_or(|(arrival, _)| oldest < arrival) {
                next = Some((oldest, seq));
            }
        }
        next
    }
}

impl FromIterator<(u64, InboxMessage)> for Unread {
    fn from_iter<I: IntoIterator<Item = (u64, InboxMessage)>>(messages: I) -> Self {
        let mut unread = Unread::default();
        for (arrival, message) in messages {
            unread.insert(arrival, message);
        }
        unread
    }
}

/// Identity of a signal wait.
pub fn signal_identity(name: &str) -> CommandIdentity {
    CommandIdentity::new(CommandKind::Signal, name, &Payload::unit())
}
