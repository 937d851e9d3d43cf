//! Locking shared by the runtime's modules.

use std::sync::{Mutex, MutexGuard};

/// Locks `mutex`, ignoring poisoning. Every mutex in the runtime guards a single insert, remove
/// or swap, so a panic elsewhere cannot leave its data half-updated; refusing the lock forever
/// would turn one panic into a dead worker.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
