//! Rate limits and reader caps: what one token, or the callers of one workflow, may make the
//! worker do in a minute. In memory, per process (nothing here is journaled: a restart
//! forgives).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::StatusCode;

use super::error::ApiError;

/// Beyond this many keys, full buckets are forgotten (they would allow as much as a new one).
const PRUNE_ABOVE: usize = 10_000;

/// A token bucket per key: `per_minute` requests, refilled evenly over the minute.
pub(crate) struct PerMinute {
    per_minute: u32,
    buckets: Mutex<HashMap<String, Bucket>>,
}

#[derive(Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl PerMinute {
    pub(crate) fn new(per_minute: u32) -> Self {
        Self {
            per_minute,
            buckets: Mutex::default(),
        }
    }

    /// Takes one request for `key`, or says when to try again. `what` names the limit.
    pub(crate) fn take(&self, key: &str, what: &str) -> Result<(), ApiError> {
        let (capacity, per_second) = self.rate();
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if buckets.len() > PRUNE_ABOVE {
            buckets.retain(|_, bucket| refilled(*bucket, now, per_second, capacity) < capacity);
        }
        let full = Bucket {
            tokens: capacity,
            at: now,
        };
        let bucket = buckets.entry(key.to_owned()).or_insert(full);
        let tokens = refilled(*bucket, now, per_second, capacity);
        if tokens < 1.0 {
            let wait = Duration::from_secs_f64((1.0 - tokens) / per_second);
            let message = format!(
                "{what}: {} a minute; retry in {} s",
                self.per_minute,
                wait.as_secs().max(1)
            );
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                message,
            ));
        }
        *bucket = Bucket {
            tokens: tokens - 1.0,
            at: now,
        };
        Ok(())
    }
}

impl PerMinute {
    /// Whether `key` has nothing left this minute (nothing is taken).
    pub(crate) fn is_exhausted(&self, key: &str) -> bool {
        let (capacity, per_second) = self.rate();
        let buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        buckets
            .get(key)
            .is_some_and(|bucket| refilled(*bucket, Instant::now(), per_second, capacity) < 1.0)
    }

    /// A full bucket's requests, and how many come back each second.
    fn rate(&self) -> (f64, f64) {
        let capacity = f64::from(self.per_minute.max(1));
        (capacity, capacity / 60.0)
    }
}

fn refilled(bucket: Bucket, now: Instant, per_second: f64, capacity: f64) -> f64 {
    let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
    (bucket.tokens + elapsed * per_second).min(capacity)
}

/// How many event-stream readers each workflow has open.
#[derive(Default)]
pub(crate) struct Readers {
    open: Arc<Mutex<HashMap<String, usize>>>,
}

/// One open reader; dropping it frees its place.
pub(crate) struct ReaderSlot {
    open: Arc<Mutex<HashMap<String, usize>>>,
    workflow_id: String,
}

impl Readers {
    /// A place for one more reader of `workflow_id`, unless `cap` are open.
    pub(crate) fn open(&self, workflow_id: &str, cap: usize) -> Result<ReaderSlot, ApiError> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(workflow_id.to_owned()).or_default();
        if *count >= cap {
            let message = format!("workflow `{workflow_id}` has {cap} stream readers open already");
            let status = StatusCode::TOO_MANY_REQUESTS;
            return Err(ApiError::new(status, "too_many_readers", message));
        }
        *count += 1;
        Ok(ReaderSlot {
            open: self.open.clone(),
            workflow_id: workflow_id.to_owned(),
        })
    }
}

impl Drop for ReaderSlot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.workflow_id) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.workflow_id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_allows_its_minute_then_refuses() {
        let limit = PerMinute::new(2);
        assert!(limit.take("dana", "requests").is_ok());
        assert!(limit.take("dana", "requests").is_ok());
        let refused = limit.take("dana", "requests").unwrap_err();
        assert_eq!(refused.code, "rate_limited");
        assert!(limit.take("ops", "requests").is_ok(), "per key");
    }

    #[test]
    fn a_reader_slot_is_freed_when_dropped() {
        let readers = Readers::default();
        let first = readers.open("wf", 1).unwrap();
        assert!(readers.open("wf", 1).is_err());
        drop(first);
        assert!(readers.open("wf", 1).is_ok());
    }
}
