//! Reference models, kept for tests and comparisons, not for production.
//!
//! [`SeedTokenBucket`] is the floating-point token bucket of the
//! rate-limiting write-ups this project started from (its "seed"
//! documents, which are not part of this repository: a book chapter, "A rate
//! limiter, end to end", and two tutorials that build a fixed window, a
//! sliding log and a token bucket in Python and Go), their Python
//! `TokenBucketRateLimiter` ported line by line: the baseline that
//! turnstile's GCRA is tested against (it must make the same decisions, up
//! to floating-point rounding at the boundary) and benchmarked against (it
//! is what a team following those tutorials would ship). Their worked
//! examples (a bucket of 5 refilled at 2/s taking 7 requests at once, then 3
//! more 1.1 s later; 150 requests at 59.9 s and 150 at 60.1 s against
//! 100 a minute) are the "seed scenarios" of the tests and the CLI.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::{Mutex, PoisonError};

use turnstile_rl::{Clock, DefaultClock};

/// A [`SeedTokenBucket`] parameter that the tutorials' constructor refuses.
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SeedBucketError {
    /// The capacity is zero, negative, infinite or NaN.
    #[error("capacity must be positive and finite, got {0}")]
    Capacity(f64),
    /// The refill rate is zero, negative, infinite or NaN.
    #[error("refill rate must be positive and finite, got {0} tokens/s")]
    RefillRate(f64),
}

/// The tutorials' floating-point token bucket, kept as they wrote it: **a
/// reference model for tests and benchmark comparisons, not for production.**
///
/// This is their Python `TokenBucketRateLimiter` (see the
/// [module docs](crate::reference)):
///
/// - one global `Mutex` around a `HashMap<K, (tokens, last_update_secs)>`,
///   so every check, for every key, serializes on one lock;
/// - `f64` tokens and `f64` seconds (`clock.now() as f64 / 1e9`), refilled
///   lazily on each request: `tokens = min(capacity, tokens + elapsed * rate)`;
/// - `elapsed` is clamped at 0 (as in the book chapter's version), and the
///   bucket's time is then set to the (earlier) reading, as the tutorials
///   do: a clock that steps back and forth therefore has its backward gap
///   credited twice, which the tutorials never noticed and GCRA does not do;
/// - the refilled balance is stored even when the request is rejected;
/// - a new key starts full; a request for more than the capacity is `false`
///   without touching any state; so is a request for zero, a negative or a
///   NaN number of tokens (Python raises, Go returns `false`: no panic here);
/// - **its memory never shrinks**: every key ever seen stays in the map
///   forever (the tutorials' own warning: "leaks memory as users accumulate").
///
/// Use [`DirectLimiter`](turnstile_rl::DirectLimiter) or a keyed limiter instead.
///
/// ```
/// use std::time::Duration;
/// use turnstile_test_kit::reference::SeedTokenBucket;
/// use turnstile_rl::ManualClock;
///
/// let clock = ManualClock::new();
/// let seed = SeedTokenBucket::<String, _>::with_clock(5.0, 2.0, clock.clone())?;
/// let allowed = (0..7).filter(|_| seed.allow_request("user_42", 1.0)).count();
/// assert_eq!(allowed, 5);
/// clock.advance(Duration::from_millis(1_100));
/// let allowed = (0..3).filter(|_| seed.allow_request("user_42", 1.0)).count();
/// assert_eq!(allowed, 2);
/// # Ok::<(), turnstile_test_kit::reference::SeedBucketError>(())
/// ```
pub struct SeedTokenBucket<K, C: Clock = DefaultClock> {
    capacity: f64,
    refill_rate: f64,
    clock: C,
    // key -> (current token count, last update in seconds since the clock's origin)
    buckets: Mutex<HashMap<K, (f64, f64)>>,
}

impl<K: Hash + Eq> SeedTokenBucket<K> {
    /// A bucket of `capacity` tokens per key, refilled at `refill_per_sec`
    /// tokens per second, on the default (quanta) clock. Both must be
    /// positive and finite.
    pub fn new(capacity: f64, refill_per_sec: f64) -> Result<Self, SeedBucketError> {
        Self::with_clock(capacity, refill_per_sec, DefaultClock::new())
    }
}

impl<K: Hash + Eq, C: Clock> SeedTokenBucket<K, C> {
    /// A bucket of `capacity` tokens per key, refilled at `refill_per_sec`
    /// tokens per second, reading `clock`. Both must be positive and finite.
    pub fn with_clock(
        capacity: f64,
        refill_per_sec: f64,
        clock: C,
    ) -> Result<Self, SeedBucketError> {
        // Written so that NaN fails too.
        if !(capacity > 0.0 && capacity.is_finite()) {
            return Err(SeedBucketError::Capacity(capacity));
        }
        if !(refill_per_sec > 0.0 && refill_per_sec.is_finite()) {
            return Err(SeedBucketError::RefillRate(refill_per_sec));
        }
        Ok(SeedTokenBucket {
            capacity,
            refill_rate: refill_per_sec,
            clock,
            buckets: Mutex::new(HashMap::new()),
        })
    }

    /// The tutorials' `allow_request`: whether `key` may spend `tokens` tokens
    /// now. Takes the global lock.
    pub fn allow_request<Q>(&self, key: &Q, tokens: f64) -> bool
    where
        K: Borrow<Q>,
        Q: ?Sized + Hash + Eq + ToOwned<Owned = K>,
    {
        // Refuses zero, negatives and NaN (for which every comparison is false).
        let positive = tokens > 0.0;
        if !positive || tokens > self.capacity {
            return false;
        }
        let now = self.clock.now() as f64 / 1e9;
        // A panic never happens under this lock, but a poisoned map is still
        // a valid map: keep going rather than panic in turn.
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        let (current, last_update) = match buckets.get(key) {
            Some(&state) => state,
            None => (self.capacity, now),
        };
        let updated = self.refill(current, last_update, now);
        let (stored, allowed) = if updated >= tokens {
            (updated - tokens, true)
        } else {
            // Store the refilled balance even when the request is rejected.
            (updated, false)
        };
        match buckets.get_mut(key) {
            Some(state) => *state = (stored, now),
            None => {
                buckets.insert(key.to_owned(), (stored, now));
            }
        }
        allowed
    }

    fn refill(&self, current: f64, last_update: f64, now: f64) -> f64 {
        let elapsed = (now - last_update).max(0.0);
        self.capacity.min(current + elapsed * self.refill_rate)
    }

    /// How many keys the map holds: every key ever seen (it never shrinks).
    pub fn len(&self) -> usize {
        self.buckets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether no key was ever seen.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The capacity (burst) of every key's bucket, in tokens.
    pub fn capacity(&self) -> f64 {
        self.capacity
    }

    /// The refill rate, in tokens per second.
    pub fn refill_per_sec(&self) -> f64 {
        self.refill_rate
    }
}

impl<K, C: Clock> fmt::Debug for SeedTokenBucket<K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys = self
            .buckets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        f.debug_struct("SeedTokenBucket")
            .field("capacity", &self.capacity)
            .field("refill_per_sec", &self.refill_rate)
            .field("keys", &keys)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use turnstile_rl::ManualClock;

    fn seed(clock: &ManualClock) -> SeedTokenBucket<String, ManualClock> {
        SeedTokenBucket::with_clock(5.0, 2.0, clock.clone()).unwrap()
    }

    fn count(bucket: &SeedTokenBucket<String, ManualClock>, key: &str, requests: usize) -> usize {
        (0..requests)
            .filter(|_| bucket.allow_request(key, 1.0))
            .count()
    }

    #[test]
    fn capacity_5_refill_2_per_second_burst_of_7() {
        let clock = ManualClock::new();
        let bucket = seed(&clock);
        let decisions: Vec<bool> = (0..7)
            .map(|_| bucket.allow_request("user_42", 1.0))
            .collect();
        assert_eq!(decisions, [true, true, true, true, true, false, false]);
    }

    #[test]
    fn after_1_1_seconds_two_more_pass_and_the_third_is_denied() {
        let clock = ManualClock::new();
        let bucket = seed(&clock);
        assert_eq!(count(&bucket, "user_42", 7), 5);
        clock.advance(Duration::from_millis(1_100));
        let decisions: Vec<bool> = (0..3)
            .map(|_| bucket.allow_request("user_42", 1.0))
            .collect();
        assert_eq!(decisions, [true, true, false]);
    }

    #[test]
    fn after_1_5_seconds_three_pass() {
        let clock = ManualClock::new();
        let bucket = seed(&clock);
        assert_eq!(count(&bucket, "user_908a", 7), 5);
        clock.advance(Duration::from_millis(1_500));
        let decisions: Vec<bool> = (0..4)
            .map(|_| bucket.allow_request("user_908a", 1.0))
            .collect();
        assert_eq!(decisions, [true, true, true, false]);
    }

    #[test]
    fn limit_100_per_minute_across_the_boundary_admits_100() {
        let clock = ManualClock::starting_at(Duration::from_millis(59_900));
        let bucket =
            SeedTokenBucket::<String, _>::with_clock(100.0, 100.0 / 60.0, clock.clone()).unwrap();
        let first = count_generic(&bucket, 150);
        clock.set(Duration::from_millis(60_100));
        let second = count_generic(&bucket, 150);
        // 0.2 s at 100/min is 0.33 tokens: nothing more passes.
        assert_eq!((first, second), (100, 0));
    }

    fn count_generic<C: Clock>(bucket: &SeedTokenBucket<String, C>, requests: usize) -> usize {
        (0..requests)
            .filter(|_| bucket.allow_request("user", 1.0))
            .count()
    }

    #[test]
    fn keys_are_independent_and_never_forgotten() {
        let clock = ManualClock::new();
        let bucket = seed(&clock);
        assert!(bucket.is_empty());
        assert_eq!(count(&bucket, "a", 6), 5);
        assert_eq!(count(&bucket, "b", 6), 5);
        clock.advance(Duration::from_secs(3_600));
        assert_eq!(count(&bucket, "c", 1), 1);
        // Hours idle, full again, and still held: the map never shrinks.
        assert_eq!(bucket.len(), 3);
    }

    #[test]
    fn bad_requests_are_false_and_change_nothing() {
        let clock = ManualClock::new();
        let bucket = seed(&clock);
        for tokens in [0.0, -1.0, f64::NAN, 5.5, f64::INFINITY] {
            assert!(!bucket.allow_request("k", tokens), "{tokens}");
        }
        assert!(bucket.is_empty());
        assert!(bucket.allow_request("k", 5.0));
        assert!(!bucket.allow_request("k", 0.5));
        clock.advance(Duration::from_millis(250));
        assert!(bucket.allow_request("k", 0.5));
    }

    #[test]
    fn rejected_requests_store_the_refilled_balance() {
        let clock = ManualClock::new();
        let bucket = seed(&clock);
        assert!(bucket.allow_request("k", 5.0));
        clock.advance(Duration::from_millis(1_000));
        // 2 tokens: a request for 3 fails but keeps the 2 (time is reset to now).
        assert!(!bucket.allow_request("k", 3.0));
        clock.advance(Duration::from_millis(500));
        assert!(bucket.allow_request("k", 3.0));
    }

    #[test]
    fn a_backwards_clock_is_clamped_then_the_gap_is_credited_again() {
        // The tutorials' behaviour, kept: elapsed is clamped at 0 but the bucket's
        // time moves back, so the next forward reading re-credits the gap.
        let clock = ManualClock::starting_at(Duration::from_secs(10));
        let bucket = seed(&clock);
        assert_eq!(count(&bucket, "k", 5), 5);
        clock.set(Duration::from_secs(9));
        assert_eq!(count(&bucket, "k", 1), 0);
        clock.set(Duration::from_secs(10));
        // No real time passed since the bucket was emptied, yet 2 tokens are back.
        assert_eq!(count(&bucket, "k", 3), 2);
    }

    #[test]
    fn construction_rejects_bad_parameters_without_panicking() {
        type Seed = SeedTokenBucket<u64, ManualClock>;
        let c = ManualClock::new;
        assert_eq!(
            Seed::with_clock(0.0, 1.0, c()).unwrap_err(),
            SeedBucketError::Capacity(0.0)
        );
        assert!(matches!(
            Seed::with_clock(f64::NAN, 1.0, c()),
            Err(SeedBucketError::Capacity(_))
        ));
        assert!(Seed::with_clock(f64::INFINITY, 1.0, c()).is_err());
        assert!(Seed::with_clock(-3.0, 1.0, c()).is_err());
        assert_eq!(
            Seed::with_clock(1.0, 0.0, c()).unwrap_err(),
            SeedBucketError::RefillRate(0.0)
        );
        assert!(Seed::with_clock(1.0, f64::NAN, c()).is_err());
        assert!(Seed::with_clock(1.0, f64::INFINITY, c()).is_err());
        assert!(SeedTokenBucket::<u64>::new(1.0, -1.0).is_err());
        let ok = SeedTokenBucket::<u64>::new(5.0, 2.0).unwrap();
        assert_eq!((ok.capacity(), ok.refill_per_sec()), (5.0, 2.0));
        assert!(ok.allow_request(&7, 1.0));
        let shown = format!("{ok:?}");
        assert!(
            shown.contains("SeedTokenBucket") && shown.contains("keys: 1"),
            "{shown}"
        );
    }
}
