//! Signal waits (`ctx.signal(name)`): the oldest wait for a name takes the oldest signal of
//! that name from the inbox, one per poll.

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

/// The signal to hand over now, as `(arrival, seq)`: the first in `arrivals` (oldest first)
/// that one of `listeners` (oldest first) waits for goes to the oldest wait for its name.
pub fn next_delivery<'a>(
    listeners: &[(Seq, &str)],
    arrivals: impl IntoIterator<Item = (u64, &'a str)>,
) -> Option<(u64, Seq)> {
    arrivals.into_iter().find_map(|(arrival, name)| {
        let (seq, _) = listeners.iter().find(|(_, listens)| *listens == name)?;
        Some((arrival, *seq))
    })
}

/// Identity of a signal wait.
pub fn signal_identity(name: &str) -> CommandIdentity {
    CommandIdentity::new(CommandKind::Signal, name, &Payload::unit())
}
