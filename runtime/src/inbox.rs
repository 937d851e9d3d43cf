//! A workflow's inbox: signals kept until a `ctx.signal` wait takes them.
//!
//! A signal is written to the inbox (synced) when it is sent, whether or not the workflow waits
//! for it yet, together with a marker of its id so that a second delivery of the same id is
//! dropped. A wait takes the oldest signal of its name: the executor journals `SignalReceived`
//! and deletes the inbox row in one write, so a signal is delivered exactly once.

use serde::{Deserialize, Serialize};

use crate::journal::{decode_exact, DecodeError, Payload};

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
    /// Who sent it, from the caller's identity (an API token's name); `None` for a signal
    /// sent in code without one.
    pub sender: Option<String>,
}

/// Format 1: before the sender was kept.
#[derive(Deserialize)]
struct InboxMessageV1 {
    name: String,
    signal_id: String,
    payload: Payload,
    sent_at_ms: u64,
}

impl crate::journal::Record for InboxMessage {
    const FORMAT: u8 = 2;

    fn decode_older(format: u8, body: &[u8]) -> Result<Self, DecodeError> {
        match format {
            1 => {
                let v1: InboxMessageV1 = decode_exact(body)?;
                Ok(InboxMessage {
                    name: v1.name,
                    signal_id: v1.signal_id,
                    payload: v1.payload,
                    sent_at_ms: v1.sent_at_ms,
                    sender: None,
                })
            }
            other => Err(DecodeError::UnknownVersion(other)),
        }
    }
}

/// What happened to a sent signal.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum SignalOutcome {
    /// Kept in the inbox, or delivered to a waiting workflow.
    Accepted,
    /// A signal with this id was received before; this one is dropped.
    Duplicate,
}
