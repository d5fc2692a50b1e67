//! The exact sliding log, behind a lock: see [`SlidingLog`].

use std::collections::VecDeque;
use std::fmt;
use std::num::NonZeroU64;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use crate::clock::{Clock, DefaultClock};
use crate::decision::Decision;
use crate::error::CostError;
use crate::quota::Quota;

/// The exact sliding log: at most `limit` requests in any period-long
/// stretch of time. Memory grows with the limit, and checks take a lock:
/// see the notes below.
///
/// ```
/// use turnstile_rl::SlidingLog;
/// use turnstile_rl::{ManualClock, Quota};
/// use std::time::Duration;
///
/// let clock = ManualClock::starting_at(Duration::from_millis(59_900));
/// let log = SlidingLog::builder(Quota::per_minute(100)?).clock(clock.clone()).build();
/// assert!(log.check_n(100).unwrap().is_allowed());
/// clock.set(Duration::from_millis(60_100));
/// let denied = log.check();
/// assert!(denied.is_denied());
/// // The 100 leave the log one minute after they came: at 119.9 s.
/// assert_eq!(denied.retry_after(), Some(Duration::from_millis(59_800)));
/// # Ok::<(), turnstile_rl::QuotaError>(())
/// ```
///
/// A request of cost `n` at `now` passes iff the requests logged in
/// `(now - period, now]` plus `n` are at most `limit`. No estimate and no
/// boundary: no period-long stretch of time ever holds more than `limit`
/// admitted requests. The figures are exact: `remaining` is `limit` less
/// the requests in the window, `reset_after` the time until the newest entry
/// leaves it, and a denial's `retry_after` the time until the entry that
/// frees the last slot the request needs leaves it. (The seed's Python keeps the closed interval
/// `[now - period, now]`; the half-open one matches GCRA and the fixed
/// window, where a request exactly one period after another counts afresh.)
///
/// # Memory, and why this one takes a lock
///
/// The log cannot be packed into one word: it holds one entry per distinct
/// request time still inside the period, so its memory grows with the limit.
/// An entry is a time and a count (16 bytes): a request of cost `n` is one
/// entry, not `n`, and requests at the same nanosecond share one, so a huge
/// cost can never exhaust memory. In the worst case (every request at its
/// own nanosecond) a limit of 100,000 a minute holds 100,000 entries, 1.6 MB,
/// per key; a plain log of one `u64` per request would be 800 KB, but `n`
/// entries for a cost of `n`. The buffer keeps its largest capacity.
///
/// Updating a variable-length log atomically needs a lock, and this one
/// uses a `Mutex`: the sliding log is here for comparison and for exactness
/// where its memory is affordable, not for the lock-free hot path. For that,
/// use GCRA (which also never admits more than its burst in a moment) or the
/// [`SlidingWindow`](crate::algorithms::SlidingWindow) counter.
///
/// # A clock that steps backwards
///
/// A reading before the newest entry is taken as the newest entry's time:
/// real time is at least there, and moving later only lets entries expire,
/// so this never grants what a correct reading would refuse. An admitted
/// request is logged at that time too, which keeps the log sorted and makes
/// its entry expire no earlier than it would have.
pub struct SlidingLog<C: Clock = DefaultClock> {
    limit: u64,
    window: u64,
    log: Mutex<Log>,
    clock: C,
}

/// The admitted requests still inside the window.
#[derive(Debug, Default)]
struct Log {
    // Invariant: times strictly increase from front to back, every count is
    // at least 1, and `total` is the sum of the counts (at most the limit).
    entries: VecDeque<(u64, u64)>,
    total: u64,
}

impl SlidingLog {
    /// A sliding log of `quota.count()` requests per `quota.period()` (the
    /// burst does not apply), on the default clock.
    pub fn new(quota: Quota) -> Self {
        Self::builder(quota).build()
    }

    /// A builder to choose the clock, as the other limiters' builders do.
    pub fn builder(quota: Quota) -> SlidingLogBuilder {
        SlidingLogBuilder {
            quota,
            clock: DefaultClock::new(),
        }
    }
}

/// Builds a [`SlidingLog`]: `SlidingLog::builder(quota)`.
#[derive(Debug)]
pub struct SlidingLogBuilder<C = DefaultClock> {
    quota: Quota,
    clock: C,
}

impl<C: Clock> SlidingLogBuilder<C> {
    /// Reads time from `clock` (a [`ManualClock`](crate::ManualClock) in tests).
    pub fn clock<C2: Clock>(self, clock: C2) -> SlidingLogBuilder<C2> {
        SlidingLogBuilder {
            quota: self.quota,
            clock,
        }
    }

    /// The log, empty: `quota.count()` requests per `quota.period()` (the
    /// burst does not apply).
    pub fn build(self) -> SlidingLog<C> {
        SlidingLog {
            limit: self.quota.count(),
            window: self.quota.period_nanos(),
            log: Mutex::new(Log::default()),
            clock: self.clock,
        }
    }
}

impl<C: Clock> SlidingLog<C> {
    /// Decides one request of cost 1.
    pub fn check(&self) -> Decision {
        // Cost 1 is always valid: the limit is at least 1.
        self.decide(1)
    }

    /// Decides one request of cost `n`: `n` requests pass together or not
    /// at all. An error, not a denial, when `n` is 0 or above the limit.
    pub fn check_n(&self, n: u64) -> Result<Decision, CostError> {
        CostError::check(n, self.limit)?;
        Ok(self.decide(n))
    }

    /// The most requests admitted in any one period.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The length of the sliding window (the quota's period).
    pub fn window(&self) -> Duration {
        Duration::from_nanos(self.window)
    }

    /// The clock this log reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    fn decide(&self, cost: u64) -> Decision {
        let mut log = self.lock();
        // Read the time under the lock, so times arrive in lock order and
        // the backwards-clock rule only ever corrects a real clock's skew.
        let now = self.clock.now();
        log.decide(now, cost, self.limit, self.window)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Log> {
        // Nothing panics while the lock is held, and every update leaves
        // the log consistent, so a poisoned lock still guards a good log.
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Log {
    /// The decision for `cost` (at most `limit`) at `now`, logging it if
    /// admitted.
    fn decide(&mut self, now: u64, cost: u64, limit: u64, window: u64) -> Decision {
        let one = NonZeroU64::MIN;
        let now_logged = self
            .entries
            .back()
            .map_or(now, |&(newest, _)| newest.max(now));
        // Forget what left the window (now - window, now]; while
        // now < window, nothing has.
        if let Some(cutoff) = now_logged.checked_sub(window) {
            while let Some(&(time, count)) = self.entries.front() {
                if time > cutoff {
                    break;
                }
                self.total -= count;
                self.entries.pop_front();
            }
        }
        // An entry at `time` counts until `time + window`.
        let until_gone = |time: u64| time.checked_add(window).map_or(u64::MAX, |end| end - now);
        match self.total.checked_add(cost) {
            Some(total) if total <= limit => {
                match self.entries.back_mut() {
                    Some((time, count)) if *time == now_logged => *count += cost,
                    _ => self.entries.push_back((now_logged, cost)),
                }
                self.total = total;
                Decision::allowed(limit, limit - total, one, until_gone(now_logged))
            }
            _ => {
                // The request passes once enough of the oldest entries have
                // left that `cost` fits: exactly when the entry that frees the
                // last slot it needs expires.
                let reset = self
                    .entries
                    .back()
                    .map_or(0, |&(newest, _)| until_gone(newest));
                let mut retry = u64::MAX;
                if cost <= limit {
                    let needed = u128::from(self.total) + u128::from(cost) - u128::from(limit);
                    let mut freed = 0u128;
                    for &(time, count) in &self.entries {
                        freed += u128::from(count);
                        if freed >= needed {
                            retry = until_gone(time);
                            break;
                        }
                    }
                }
                Decision::denied(limit, limit.saturating_sub(self.total), one, reset, retry)
            }
        }
    }
}

impl<C: Clock> fmt::Debug for SlidingLog<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let log = self.lock();
        f.debug_struct("SlidingLog")
            .field("limit", &self.limit)
            .field("window", &self.window())
            .field("entries", &log.entries.len())
            .field("logged", &log.total)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use std::sync::Arc;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000_000_000;

    fn sliding_log(text: &str) -> (SlidingLog<ManualClock>, ManualClock) {
        let clock = ManualClock::new();
        (
            SlidingLog::builder(text.parse().unwrap())
                .clock(clock.clone())
                .build(),
            clock,
        )
    }

    fn admitted(log: &SlidingLog<ManualClock>, count: usize) -> usize {
        (0..count).filter(|_| log.check().is_allowed()).count()
    }

    #[test]
    fn seed_scenario_admits_100_of_100_per_minute() {
        let (log, clock) = sliding_log("100/min");
        clock.set_nanos(59_900 * MS);
        assert_eq!(admitted(&log, 150), 100);
        clock.set_nanos(60_100 * MS);
        assert_eq!(admitted(&log, 150), 0);
        let d = log.check();
        assert_eq!(d.retry_after(), Some(Duration::from_millis(59_800)));
        assert_eq!(d.reset_after(), Duration::from_millis(59_800));
        // All 100 leave together, exactly one minute after they came.
        clock.set_nanos(119_900 * MS - 1);
        assert_eq!(admitted(&log, 1), 0);
        clock.set_nanos(119_900 * MS);
        assert_eq!(admitted(&log, 150), 100);
        // One entry per distinct time, however many requests.
        assert_eq!(log.lock().entries.len(), 1);
    }

    #[test]
    fn the_window_is_half_open() {
        let (log, clock) = sliding_log("1/s");
        assert!(log.check().is_allowed());
        clock.set_nanos(S - 1);
        let d = log.check();
        assert_eq!(d.retry_after(), Some(Duration::from_nanos(1)));
        clock.set_nanos(S);
        assert!(log.check().is_allowed());
    }

    #[test]
    fn decision_figures_are_exact() {
        let (log, clock) = sliding_log("5/s");
        let d = log.check_n(2).unwrap();
        assert!(d.is_allowed());
        assert_eq!((d.limit(), d.remaining()), (5, 3));
        assert_eq!(d.reset_after(), Duration::from_secs(1));
        assert_eq!(d.retry_after(), None);

        clock.set_nanos(300 * MS);
        let d = log.check_n(3).unwrap();
        assert_eq!(d.remaining(), 0);
        assert_eq!(d.reset_after(), Duration::from_secs(1));

        clock.set_nanos(500 * MS);
        // One slot frees when the 2 at 0 ms leave; three need the 3 at 300 ms.
        let d = log.check().decision_denied();
        assert_eq!(d.retry_after(), Some(Duration::from_millis(500)));
        assert_eq!(d.reset_after(), Duration::from_millis(800));
        let d = log.check_n(3).unwrap().decision_denied();
        assert_eq!(d.retry_after(), Some(Duration::from_millis(800)));

        clock.set_nanos(S);
        let d = log.check_n(2).unwrap();
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 0);
        assert!(log.check().is_denied());
    }

    trait Denied {
        fn decision_denied(self) -> Decision;
    }

    impl Denied for Decision {
        fn decision_denied(self) -> Decision {
            assert!(self.is_denied(), "{self:?}");
            self
        }
    }

    #[test]
    fn cost_errors_change_nothing() {
        let (log, _) = sliding_log("3/s burst 1");
        assert_eq!(log.limit(), 3);
        assert_eq!(log.check_n(0), Err(CostError::Zero));
        assert_eq!(
            log.check_n(4),
            Err(CostError::ExceedsCapacity {
                cost: 4,
                capacity: 3
            })
        );
        assert_eq!(
            log.check_n(u64::MAX),
            Err(CostError::ExceedsCapacity {
                cost: u64::MAX,
                capacity: 3
            })
        );
        assert!(log.check_n(3).unwrap().is_allowed());
    }

    #[test]
    fn backwards_clock_grants_nothing() {
        let (log, clock) = sliding_log("2/s");
        clock.set_nanos(10 * S);
        assert!(log.check().is_allowed());
        // A reading 1 s back still sees the entry at 10 s, and is logged at
        // 10 s itself.
        clock.set_nanos(9 * S);
        assert!(log.check().is_allowed());
        let d = log.check().decision_denied();
        assert_eq!(d.retry_after(), Some(Duration::from_secs(2)));
        clock.set_nanos(11 * S - 1);
        assert!(log.check().is_denied());
        clock.set_nanos(11 * S);
        assert_eq!(admitted(&log, 3), 2);
        // Far back, before the window would even start.
        clock.set_nanos(0);
        assert!(log.check().is_denied());
    }

    #[test]
    fn extreme_inputs_never_panic() {
        let clock = ManualClock::new();
        let huge = Quota::new(u64::MAX, Duration::from_nanos(u64::MAX)).unwrap();
        let log = SlidingLog::builder(huge).clock(clock.clone()).build();
        // A huge cost is one entry, not u64::MAX of them.
        assert!(log.check_n(u64::MAX).unwrap().is_allowed());
        let d = log.check().decision_denied();
        assert_eq!(d.retry_after(), Some(Duration::from_nanos(u64::MAX)));
        clock.set_nanos(u64::MAX);
        assert!(log.check_n(u64::MAX).unwrap().is_allowed());
        // Logged at the last nanosecond: it never leaves.
        let d = log.check().decision_denied();
        assert_eq!(d.retry_after(), Some(Duration::from_nanos(u64::MAX)));
        assert_eq!(d.reset_after(), Duration::from_nanos(u64::MAX));

        let (log, clock) = sliding_log("1/ns");
        clock.set_nanos(u64::MAX);
        assert!(log.check().is_allowed());
        assert!(log.check().is_denied());
    }

    #[test]
    fn many_threads_admit_exactly_the_limit() {
        let (log, clock) = sliding_log("1000/min");
        clock.set_nanos(5 * S);
        let log = Arc::new(log);
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let log = Arc::clone(&log);
                std::thread::spawn(move || admitted(&log, 600))
            })
            .collect();
        let total: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(total, 1000);
    }

    #[test]
    fn debug_shows_the_log_size() {
        let (log, _) = sliding_log("5/s");
        let _ = log.check_n(2);
        let shown = format!("{log:?}");
        assert!(shown.starts_with("SlidingLog"), "{shown}");
        assert!(shown.contains("logged: 2"), "{shown}");
        let default: SlidingLog = SlidingLog::new(Quota::per_second(5).unwrap());
        assert!(default.check().is_allowed());
    }
}
