//! Durable timers (`ctx.sleep`): a timer row fires at a clock time, the command settles as
//! fired, and a sleep the code dropped is cancelled with its row.

use super::CommandState;
use crate::journal::{CommandIdentity, CommandKind, Payload};

/// An open sleep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timer {
    fire_at_ms: u64,
}

/// What a timer row that came due settles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// A sleep: it fires (journal `TimerFired`, delete the row).
    Fire {
        /// The row's time.
        fire_at_ms: u64,
    },
    /// An approval request's expiry: the request expires.
    Expire {
        /// The expiry.
        at_ms: u64,
    },
}

impl Timer {
    pub(super) fn new(fire_at_ms: u64) -> Self {
        Self { fire_at_ms }
    }

    pub(super) fn state(&self) -> CommandState {
        CommandState::Waiting {
            fire_at_ms: self.fire_at_ms,
        }
    }

    pub(super) fn fire_at_ms(&self) -> u64 {
        self.fire_at_ms
    }
}

/// Identity of a timer command.
pub fn timer_identity(duration_ms: u64) -> CommandIdentity {
    CommandIdentity::new(CommandKind::Timer, "sleep", &Payload::from_u64(duration_ms))
}
