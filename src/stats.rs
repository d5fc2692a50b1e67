//! Gauges and counters of a limiter, as a plain struct: no metrics crate is
//! needed to read them, and with the `metrics` feature they are exported
//! through the `metrics` facade by [`Stats::record`].
//!
//! Every counter is written only on a cold path (a housekeeping step, an
//! overflow, a failed CAS), never on an allowed check, so reading the gauges
//! costs the hot path nothing.

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicU64, Ordering};

/// A snapshot of a limiter's gauges and counters.
///
/// ```
/// use turnstile_rl::{KeyedLimiter, Quota};
///
/// let limiter = KeyedLimiter::<u64>::new("10/s".parse()?);
/// let _ = limiter.check(&1);
/// let stats = limiter.stats();
/// assert_eq!(stats.keys_held, 1);
/// assert!(stats.capacity >= 1);
/// assert_eq!(stats.overflow_refusals, 0);
/// # Ok::<(), turnstile_rl::QuotaError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Keys the map holds now: the keys in use and the idle ones that
    /// housekeeping has not swept yet (an idle key is a full bucket, the
    /// same as none, but it holds its slot until it is evicted). Not a
    /// count of active callers.
    pub keys_held: u64,
    /// Slots in the map's current table.
    pub capacity: u64,
    /// The most keys tracked at once (`max_keys`).
    pub max_keys: u64,
    /// Idle keys forgotten so far (losslessly: by housekeeping,
    /// `evict_idle` and migrations).
    pub idle_evictions: u64,
    /// Keys forgotten to make room at `max_keys` (the one lossy path).
    pub overflow_evictions: u64,
    /// Requests refused because the limiter was full and would not track a
    /// new key ([`OverflowPolicy::Deny`](crate::OverflowPolicy::Deny), or
    /// no room found).
    pub overflow_refusals: u64,
    /// Requests admitted without tracking their key
    /// ([`OverflowPolicy::AllowUntracked`](crate::OverflowPolicy::AllowUntracked)).
    pub overflow_untracked: u64,
    /// Keys removed by `reset` and `clear`.
    pub resets: u64,
    /// Compare-and-swap retries taken by **every limiter of this process**
    /// together, not by this one: every limiter's snapshot reads the same
    /// figure, so never add it up over limiters. A measure of contention on
    /// hot keys; process-wide, since counting per limiter would add a
    /// shared write to every contended check. A direct limiter's add that
    /// did not admit and was taken back counts as one.
    pub process_cas_retries: u64,
}

impl Stats {
    /// Exports this snapshot through the `metrics` facade, labelled
    /// `limiter = name`: gauges `turnstile_keys_held`,
    /// `turnstile_keys_capacity`, `turnstile_keys_max`, and counters
    /// `turnstile_evictions_total{reason="idle"|"overflow"|"reset"}`,
    /// `turnstile_overflow_total{outcome="refused"|"untracked"}`. Also the
    /// process-wide counter `turnstile_process_cas_retries_total`
    /// ([`process_cas_retries`](Self::process_cas_retries)), with no
    /// `limiter` label since it is no one limiter's: every limiter's call
    /// sets the same series. Call it from a periodic task.
    #[cfg(feature = "metrics")]
    pub fn record(&self, name: &str) {
        let name = name.to_owned();
        metrics::gauge!("turnstile_keys_held", "limiter" => name.clone())
            .set(self.keys_held as f64);
        metrics::gauge!("turnstile_keys_capacity", "limiter" => name.clone())
            .set(self.capacity as f64);
        metrics::gauge!("turnstile_keys_max", "limiter" => name.clone()).set(self.max_keys as f64);
        for (reason, value) in [
            ("idle", self.idle_evictions),
            ("overflow", self.overflow_evictions),
            ("reset", self.resets),
        ] {
            metrics::counter!("turnstile_evictions_total", "limiter" => name.clone(), "reason" => reason)
                .absolute(value);
        }
        for (outcome, value) in [
            ("refused", self.overflow_refusals),
            ("untracked", self.overflow_untracked),
        ] {
            metrics::counter!("turnstile_overflow_total", "limiter" => name.clone(), "outcome" => outcome)
                .absolute(value);
        }
        metrics::counter!("turnstile_process_cas_retries_total").absolute(self.process_cas_retries);
    }
}

/// A limiter's own counters. Padded: they are written on cold paths only,
/// and must not share a cache line with what every check reads.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    inner: CachePadded<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    idle_evictions: AtomicU64,
    overflow_evictions: AtomicU64,
    overflow_refusals: AtomicU64,
    overflow_untracked: AtomicU64,
    resets: AtomicU64,
}

/// Which counter to bump.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Event {
    IdleEvictions,
    OverflowEviction,
    OverflowRefusal,
    OverflowUntracked,
    Resets,
}

impl Counters {
    /// Adds `n` to one counter. Relaxed: a counter orders nothing.
    #[inline]
    pub(crate) fn add(&self, event: Event, n: u64) {
        if n == 0 {
            return;
        }
        let counter = match event {
            Event::IdleEvictions => &self.inner.idle_evictions,
            Event::OverflowEviction => &self.inner.overflow_evictions,
            Event::OverflowRefusal => &self.inner.overflow_refusals,
            Event::OverflowUntracked => &self.inner.overflow_untracked,
            Event::Resets => &self.inner.resets,
        };
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// The counters into a snapshot whose gauges the caller fills in.
    pub(crate) fn snapshot(&self) -> Stats {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Stats {
            idle_evictions: load(&self.inner.idle_evictions),
            overflow_evictions: load(&self.inner.overflow_evictions),
            overflow_refusals: load(&self.inner.overflow_refusals),
            overflow_untracked: load(&self.inner.overflow_untracked),
            resets: load(&self.inner.resets),
            process_cas_retries: crate::cell::cas_retries(),
            ..Stats::default()
        }
    }
}
