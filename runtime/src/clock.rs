//! Time, injected: the runtime never reads the system clock directly, so tests drive timers,
//! retries and timeouts with a manual clock.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::sync::watch;

/// A source of wall-clock milliseconds and of sleeps measured against it.
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
    /// Resolves once `now_ms() >= deadline_ms`.
    fn sleep_until(&self, deadline_ms: u64) -> BoxFuture<'static, ()>;
}

/// The real clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX)
    }

    fn sleep_until(&self, deadline_ms: u64) -> BoxFuture<'static, ()> {
        let wait = deadline_ms.saturating_sub(self.now_ms());
        tokio::time::sleep(Duration::from_millis(wait)).boxed()
    }
}

/// A clock that moves only when told to; sleeps end when it is advanced past their deadline.
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<watch::Sender<u64>>,
}

impl ManualClock {
    /// A clock reading `start_ms`.
    pub fn new(start_ms: u64) -> Self {
        Self {
            now: Arc::new(watch::Sender::new(start_ms)),
        }
    }

    /// Moves time forward by `by`, waking every sleep that is now due.
    pub fn advance(&self, by: Duration) {
        let by_ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.now.send_modify(|now| *now = now.saturating_add(by_ms));
    }
}

impl Default for ManualClock {
    /// Starts at 2026-01-01T00:00:00Z, so rendered times are plausible.
    fn default() -> Self {
        Self::new(1_767_225_600_000)
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        *self.now.borrow()
    }

    fn sleep_until(&self, deadline_ms: u64) -> BoxFuture<'static, ()> {
        let mut now = self.now.subscribe();
        async move {
            // The sender lives as long as any clone of the clock; if every clone is gone no time
            // can pass any more, so the sleep never ends, like a real one in a stopped process.
            if now.wait_for(|t| *t >= deadline_ms).await.is_err() {
                futures::future::pending::<()>().await;
            }
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn manual_sleeps_end_when_time_passes_their_deadline() {
        let clock = ManualClock::new(1_000);
        let sleep = tokio::spawn(clock.sleep_until(1_500));
        clock.advance(Duration::from_millis(499));
        tokio::task::yield_now().await;
        assert!(!sleep.is_finished());
        clock.advance(Duration::from_millis(1));
        tokio::time::timeout(Duration::from_secs(5), sleep)
            .await
            .expect("sleep ends once due")
            .unwrap();
        assert_eq!(clock.now_ms(), 1_500);
    }
}
