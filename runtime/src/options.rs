//! Retry policies and activity options.

use std::time::Duration;

/// How often and how patiently an activity is retried. Every retry is bounded.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, including the first (at least 1).
    pub max_attempts: u32,
    /// Delay before the second attempt.
    pub initial_backoff: Duration,
    /// Growth of the delay per attempt.
    pub backoff_coefficient: f64,
    /// Cap on one delay.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(200),
            backoff_coefficient: 2.0,
            max_backoff: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// Whether another attempt may follow `attempt` (1-based).
    pub fn allows_retry_after(&self, attempt: u32) -> bool {
        attempt < self.max_attempts
    }

    /// Delay before the attempt after `attempt`: exponential, capped, with "equal jitter" (half
    /// fixed, half spread) so many workflows failing together do not retry in lockstep. `jitter`
    /// is a number in `0..=u64::MAX` that the caller derives deterministically.
    pub fn backoff(&self, attempt: u32, jitter: u64) -> Duration {
        let exponent = attempt.saturating_sub(1).min(64) as i32;
        let base = self.initial_backoff.as_secs_f64() * self.backoff_coefficient.powi(exponent);
        let capped = base.min(self.max_backoff.as_secs_f64()).max(0.0);
        let fraction = jitter as f64 / u64::MAX as f64;
        // A cap near `Duration::MAX` rounds above it as an `f64`: fall back to the cap itself
        // rather than panic (the policy can come from configuration).
        Duration::try_from_secs_f64(capped * (0.5 + 0.5 * fraction)).unwrap_or(self.max_backoff)
    }
}

/// Options applied when a workflow schedules an activity.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ActivityOptions {
    /// Retries.
    pub retry: RetryPolicy,
    /// Longest one attempt may run; a late answer is ignored (fenced by attempt number).
    pub start_to_close_timeout: Option<Duration>,
    /// Overall deadline, from when the command was scheduled: no retry starts after it.
    pub deadline: Option<Duration>,
}

impl ActivityOptions {
    /// Sets the number of attempts in all (values below 1 mean 1).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.retry.max_attempts = attempts.max(1);
        self
    }

    /// Sets the delay before the second attempt.
    pub fn initial_backoff(mut self, delay: Duration) -> Self {
        self.retry.initial_backoff = delay;
        self
    }

    /// Sets the cap on one delay.
    pub fn max_backoff(mut self, delay: Duration) -> Self {
        self.retry.max_backoff = delay;
        self
    }

    /// Sets how long one attempt may run.
    pub fn start_to_close_timeout(mut self, timeout: Duration) -> Self {
        self.start_to_close_timeout = Some(timeout);
        self
    }

    /// Sets the overall deadline (schedule to close): no retry starts later than this after
    /// the command was scheduled.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Replaces the retry policy.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_is_capped_and_jittered_within_half() {
        let policy = RetryPolicy {
            max_attempts: 10,
            initial_backoff: Duration::from_millis(100),
            backoff_coefficient: 2.0,
            max_backoff: Duration::from_millis(1_000),
        };
        assert_eq!(policy.backoff(1, u64::MAX), Duration::from_millis(100));
        assert_eq!(policy.backoff(3, u64::MAX), Duration::from_millis(400));
        assert_eq!(policy.backoff(9, u64::MAX), Duration::from_millis(1_000));
        assert_eq!(policy.backoff(3, 0), Duration::from_millis(200));
        assert!(policy.allows_retry_after(9));
        assert!(!policy.allows_retry_after(10));
    }

    /// Policies at the edges of their ranges give a delay, never a panic.
    #[test]
    fn extreme_policies_do_not_overflow() {
        let huge = RetryPolicy {
            max_attempts: u32::MAX,
            initial_backoff: Duration::from_secs(1),
            backoff_coefficient: 1e300,
            max_backoff: Duration::MAX,
        };
        assert!(huge.backoff(u32::MAX, u64::MAX) <= Duration::MAX);
        let nan = RetryPolicy {
            backoff_coefficient: f64::NAN,
            ..huge.clone()
        };
        assert!(nan.backoff(3, 0) <= Duration::MAX);
    }
}
