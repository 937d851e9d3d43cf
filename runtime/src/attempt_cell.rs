//! What one activity attempt shares between its own code, its executor and the store's
//! writer: its `registry::ExternalRef`, `registry::TimedOut` and `streams::VersionSlot` are
//! handles on one allocation, made for every attempt, where each of them took one of its own.
//! (This module names neither: they sit above it.)

use std::sync::atomic::AtomicBool;
use std::sync::OnceLock;

/// One attempt's shared state. Each handle reads and writes only its own fields.
#[derive(Debug, Default)]
pub(crate) struct AttemptCell {
    /// The downstream's reference of what the attempt did.
    pub(crate) external_ref: std::sync::Mutex<Option<String>>,
    /// Set right before the attempt is dropped at its start-to-close timeout.
    pub(crate) timed_out: AtomicBool,
    /// Set right before the call: a panic from then on leaves the outcome unknown.
    pub(crate) called: AtomicBool,
    /// The attempt's response version, once the store wrote its first chunk.
    pub(crate) version: OnceLock<u32>,
    /// Whether a chunk was sent (its version comes later, when it is written).
    pub(crate) sent: AtomicBool,
}
