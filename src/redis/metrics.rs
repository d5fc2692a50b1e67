//! Counters and the Redis call's latency, read as one snapshot.
//!
//! Counters are relaxed atomics (each is a statistic on its own, ordered
//! with nothing else). Latency goes into an HDR histogram (1 µs to 60 s,
//! 3 significant digits) behind a mutex taken once per Redis round trip:
//! nanoseconds next to the round trip it measures.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use hdrhistogram::Histogram;

use super::breaker::Transition;
use super::error::RedisCallError;

/// What a limiter has done since it was built.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MetricsSnapshot {
    /// Checks allowed (by Redis, by a lease, or by the failure policy;
    /// each key of a batch is a check, and so is a multi-limit check; a
    /// peek, refund or reset is not).
    pub allowed: u64,
    /// Checks denied (likewise).
    pub denied: u64,
    /// Script calls sent to Redis: one per check, multi-limit check, peek,
    /// refund or reset that was not decided by a lease or held back by the
    /// breaker, one per batch (one per hash slot of the batch on a
    /// Cluster).
    pub redis_calls: u64,
    /// Checks decided by spending locally leased tokens, with no call.
    pub lease_hits: u64,
    /// Calls that failed with an error (connection refused or dropped, a
    /// server error, a reply that was not the script's).
    pub redis_errors: u64,
    /// Calls that got no reply within the timeout.
    pub timeouts: u64,
    /// Times the breaker opened.
    pub breaker_opened: u64,
    /// Times the breaker went half-open (a probe was let through).
    pub breaker_half_opened: u64,
    /// Times the breaker closed again after a successful probe.
    pub breaker_closed: u64,
    /// Checks decided by the failure policy (an error, a timeout, or an
    /// open breaker).
    pub fallback_decisions: u64,
    /// Calls not sent because the breaker was open: the check or batch was
    /// decided by the failure policy at once, the peek, refund or reset
    /// answered [`RedisCallError::BreakerOpen`] at once.
    pub breaker_rejections: u64,
    /// Latency of successful Redis calls (a batch's call counts once).
    pub latency: LatencySnapshot,
}

/// Percentiles of the successful Redis calls' latency (zero before any).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LatencySnapshot {
    /// Calls measured.
    pub count: u64,
    /// Median.
    pub p50: Duration,
    /// 95th percentile.
    pub p95: Duration,
    /// 99th percentile.
    pub p99: Duration,
    /// Slowest.
    pub max: Duration,
}

/// The live counters of one limiter.
#[derive(Debug)]
pub(crate) struct Metrics {
    allowed: AtomicU64,
    denied: AtomicU64,
    redis_calls: AtomicU64,
    lease_hits: AtomicU64,
    redis_errors: AtomicU64,
    timeouts: AtomicU64,
    breaker_opened: AtomicU64,
    breaker_half_opened: AtomicU64,
    breaker_closed: AtomicU64,
    fallback_decisions: AtomicU64,
    breaker_rejections: AtomicU64,
    /// Microseconds; `None` if the histogram could not be created.
    latency: Mutex<Option<Histogram<u64>>>,
    /// The last failed call's error, for operators.
    last_error: Mutex<Option<RedisCallError>>,
}

/// Longest latency recorded exactly, in µs (longer ones are clamped).
const MAX_LATENCY_MICROS: u64 = 60_000_000;

fn bump(counter: &AtomicU64) {
    // Relaxed: a counter orders nothing else.
    counter.fetch_add(1, Ordering::Relaxed);
}

fn read(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

impl Metrics {
    pub(crate) fn new() -> Self {
        Metrics {
            allowed: AtomicU64::new(0),
            denied: AtomicU64::new(0),
            redis_calls: AtomicU64::new(0),
            lease_hits: AtomicU64::new(0),
            redis_errors: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            breaker_opened: AtomicU64::new(0),
            breaker_half_opened: AtomicU64::new(0),
            breaker_closed: AtomicU64::new(0),
            fallback_decisions: AtomicU64::new(0),
            breaker_rejections: AtomicU64::new(0),
            latency: Mutex::new(Histogram::new_with_bounds(1, MAX_LATENCY_MICROS, 3).ok()),
            last_error: Mutex::new(None),
        }
    }

    pub(crate) fn decision(&self, allowed: bool) {
        bump(if allowed { &self.allowed } else { &self.denied });
    }

    pub(crate) fn call(&self) {
        bump(&self.redis_calls);
    }

    pub(crate) fn lease_hit(&self) {
        bump(&self.lease_hits);
    }

    /// A failed call: counted as a timeout or an error, and kept as the
    /// last error.
    pub(crate) fn failure(&self, error: &RedisCallError) {
        match error {
            RedisCallError::Timeout => bump(&self.timeouts),
            RedisCallError::ConnectionRefused(_)
            | RedisCallError::Redis(_)
            | RedisCallError::BadReply(_) => bump(&self.redis_errors),
            // Not a call: counted by `breaker_rejection`, and not Redis's error.
            RedisCallError::BreakerOpen { .. } => return,
        }
        *self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(error.clone());
    }

    pub(crate) fn last_error(&self) -> Option<RedisCallError> {
        self.last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn fallback(&self) {
        bump(&self.fallback_decisions);
    }

    pub(crate) fn breaker_rejection(&self) {
        bump(&self.breaker_rejections);
    }

    pub(crate) fn transition(&self, transition: Option<Transition>) {
        match transition {
            Some(Transition::Opened) => bump(&self.breaker_opened),
            Some(Transition::HalfOpened) => bump(&self.breaker_half_opened),
            Some(Transition::Closed) => bump(&self.breaker_closed),
            None => {}
        }
    }

    pub(crate) fn latency(&self, elapsed: Duration) {
        let micros = u64::try_from(elapsed.as_micros())
            .unwrap_or(u64::MAX)
            .clamp(1, MAX_LATENCY_MICROS);
        let mut histogram = self.latency.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(h) = histogram.as_mut() {
            h.saturating_record(micros);
        }
    }

    pub(crate) fn snapshot(&self) -> MetricsSnapshot {
        let latency = {
            let histogram = self.latency.lock().unwrap_or_else(PoisonError::into_inner);
            match histogram.as_ref() {
                Some(h) if !h.is_empty() => {
                    let at = |q: f64| Duration::from_micros(h.value_at_quantile(q));
                    LatencySnapshot {
                        count: h.len(),
                        p50: at(0.50),
                        p95: at(0.95),
                        p99: at(0.99),
                        max: Duration::from_micros(h.max()),
                    }
                }
                _ => LatencySnapshot::default(),
            }
        };
        MetricsSnapshot {
            allowed: read(&self.allowed),
            denied: read(&self.denied),
            redis_calls: read(&self.redis_calls),
            lease_hits: read(&self.lease_hits),
            redis_errors: read(&self.redis_errors),
            timeouts: read(&self.timeouts),
            breaker_opened: read(&self.breaker_opened),
            breaker_half_opened: read(&self.breaker_half_opened),
            breaker_closed: read(&self.breaker_closed),
            fallback_decisions: read(&self.fallback_decisions),
            breaker_rejections: read(&self.breaker_rejections),
            latency,
        }
    }
}
