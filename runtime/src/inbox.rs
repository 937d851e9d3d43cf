//! A workflow's inbox: signals kept until a `ctx.signal` wait takes them.
//!
//! A signal is written to the inbox (synced) when it is sent, whether or not the workflow waits
//! for it yet, together with a marker of its id so that a second delivery of the same id is
//! dropped. A wait takes the oldest signal of its name: the executor journals `SignalReceived`
//! and deletes the inbox row in one write, so a signal is delivered exactly once.

use serde::{Deserialize, Serialize};

use crate::journal::Payload;

/// A signal waiting in the inbox. Append-only: postcard encodes fields by position.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct InboxMessage {
    /// What `ctx.signal(name)` waits for.
    pub name: String,
    /// The sender's id for this signal; a repeated id is a duplicate.
    pub signal_id: String,
    /// What it carries.
    pub payload: Payload,
    /// When it arrived (worker clock).
    pub sent_at_ms: u64,
}

impl crate::journal::Record for InboxMessage {}

/// What happened to a sent signal.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum SignalOutcome {
    /// Kept in the inbox, or delivered to a waiting workflow.
    Accepted,
    /// A signal with this id was received before; this one is dropped.
    Duplicate,
}
