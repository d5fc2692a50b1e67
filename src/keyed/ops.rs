//! The operations beside `check` on a [`KeyedLimiter`]: peek, reset, clear,
//! refund, quota changes that keep state, and gauges.
//!
//! Each is one read or one compare-and-swap on the key's cell, so it lands
//! between two whole decisions, exactly as a check does.

use std::borrow::Borrow;
use std::hash::Hash;

use super::KeyedLimiter;
use crate::algorithms::{Algorithm, Gcra};
use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::CostError;
use crate::quota::Quota;
use crate::stats::{Event, Stats};

impl<K, C, A> KeyedLimiter<K, C, A>
where
    K: Hash + Eq + Send + Sync + 'static,
    C: Clock,
    A: Algorithm,
{
    /// The decision a [`check`](KeyedLimiter::check) of `key` would get now,
    /// without taking anything and without inserting the key: a key that is
    /// not tracked reads as a full bucket. A later check is decided exactly
    /// as if this call had not been made.
    ///
    /// A peek reads the bucket only: it does not foresee that a full
    /// limiter would refuse to track a new key ([`OverflowPolicy`]).
    ///
    /// [`OverflowPolicy`]: crate::OverflowPolicy
    ///
    /// ```
    /// use turnstile_rl::{KeyedLimiter, Quota};
    ///
    /// let limiter = KeyedLimiter::<String>::new("5/min".parse()?);
    /// assert_eq!(limiter.peek("alice").remaining(), 4, "a missing key is full");
    /// assert!(limiter.is_empty(), "and peeking did not insert it");
    /// let _ = limiter.check("alice");
    /// // "3 login attempts left" before the expensive password check:
    /// assert_eq!(limiter.peek("alice").remaining(), 3);
    /// assert_eq!(limiter.check("alice").remaining(), 3);
    /// # Ok::<(), turnstile_rl::QuotaError>(())
    /// ```
    pub fn peek<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        // Cost 1 is always valid: every algorithm's limit is at least 1.
        self.peek_as(key, 1, &self.algorithm.load())
    }

    /// [`peek`](KeyedLimiter::peek) for a request of cost `n`: an error, not
    /// a denial, when `n` is 0 or above the burst.
    ///
    /// ```
    /// use turnstile_rl::{CostError, KeyedLimiter};
    ///
    /// let limiter = KeyedLimiter::<u64>::new("10/s".parse()?);
    /// assert!(limiter.peek_n(&7, 10).unwrap().is_allowed());
    /// assert!(matches!(limiter.peek_n(&7, 11), Err(CostError::ExceedsCapacity { .. })));
    /// # Ok::<(), turnstile_rl::QuotaError>(())
    /// ```
    pub fn peek_n<Q>(&self, key: &Q, n: u64) -> Result<Decision, CostError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let algorithm = self.algorithm.load();
        algorithm.check_cost(n)?;
        Ok(self.peek_as(key, n, &algorithm))
    }

    /// Forgets `key`: its bucket is full again, exactly as if it had never
    /// been seen (a successful login clearing the failure counter). Returns
    /// whether the key was tracked.
    ///
    /// The removal is one CAS that claims the key's cell, as eviction does:
    /// a check racing it is decided either before (on the old bucket, then
    /// forgotten) or after (on a fresh bucket), never on a removed one.
    ///
    /// ```
    /// use turnstile_rl::KeyedLimiter;
    ///
    /// let limiter = KeyedLimiter::<String>::new("3/h".parse()?);
    /// for _ in 0..3 {
    ///     let _ = limiter.check("bob");
    /// }
    /// assert!(limiter.check("bob").is_denied());
    /// assert!(limiter.reset("bob"));
    /// assert_eq!(limiter.check("bob").remaining(), 2);
    /// assert!(!limiter.reset("nobody"));
    /// # Ok::<(), turnstile_rl::QuotaError>(())
    /// ```
    pub fn reset<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.map.hash(key);
        let removed = self.map.pin().remove(hash, key);
        if removed {
            self.counters.add(Event::Resets, 1);
        }
        removed
    }

    /// Forgets every key: every bucket is full again. Returns how many keys
    /// were forgotten. Checks that race it land on their key before or after
    /// its removal, as with [`reset`](KeyedLimiter::reset); every key not
    /// checked meanwhile is gone when it returns. It runs as
    /// [`evict_idle`](KeyedLimiter::evict_idle) does (a second table for a
    /// moment).
    ///
    /// ```
    /// use turnstile_rl::KeyedLimiter;
    ///
    /// let limiter = KeyedLimiter::<u64>::new("1/h".parse()?);
    /// for key in 0..10 {
    ///     let _ = limiter.check(&key);
    /// }
    /// assert_eq!(limiter.clear(), 10);
    /// assert!(limiter.is_empty());
    /// assert!(limiter.check(&3).is_allowed());
    /// # Ok::<(), turnstile_rl::QuotaError>(())
    /// ```
    pub fn clear(&self) -> usize {
        let removed = self.map.pin().evict_all(&|_| true);
        self.counters.add(Event::Resets, removed as u64);
        removed
    }

    /// The limiter's gauges and counters: keys held (idle ones included
    /// until swept), capacity, evictions (idle, overflow), overflow
    /// refusals, and the process-wide CAS retries. See [`Stats`].
    ///
    /// ```
    /// use turnstile_rl::{KeyedLimiter, OverflowPolicy};
    ///
    /// let limiter = KeyedLimiter::<u64>::builder("1/h".parse()?)
    ///     .max_keys(1)
    ///     .overflow(OverflowPolicy::Deny)
    ///     .build();
    /// let _ = limiter.check(&1);
    /// assert!(limiter.check(&2).is_denied());
    /// let stats = limiter.stats();
    /// assert_eq!((stats.keys_held, stats.max_keys, stats.overflow_refusals), (1, 1, 1));
    /// # Ok::<(), turnstile_rl::QuotaError>(())
    /// ```
    pub fn stats(&self) -> Stats {
        Stats {
            keys_held: self.len() as u64,
            capacity: self.capacity() as u64,
            max_keys: self.max_keys as u64,
            ..self.counters.snapshot()
        }
    }

    /// The state of `key`'s bucket now, `0` (a full bucket) when absent.
    fn state_of<Q>(&self, key: &Q) -> u64
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.map.hash(key);
        // Absent, or evicted after it was found: a full bucket.
        self.map
            .pin()
            .on_bucket(hash, key, |cell| cell.state())
            .unwrap_or(0)
    }

    fn peek_as<Q, D>(&self, key: &Q, cost: u64, algorithm: &D) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
        D: Algorithm,
    {
        let now = self.clock.now();
        algorithm.decide(self.state_of(key), now, cost).decision
    }
}

impl<K, C> KeyedLimiter<K, C, Gcra>
where
    K: Hash + Eq + Send + Sync + 'static,
    C: Clock,
{
    /// Gives back `n` tokens that a check of `key` took (the request was not
    /// served: the upstream failed, the client went away). Returns whether
    /// anything was given back.
    ///
    /// At its instant `now`, one CAS sets `TAT := max(TAT - n*T, now)`: each
    /// token a check took added exactly `T` to the TAT, so this is exact,
    /// and it never makes the bucket fuller than full. A refund racing
    /// checks lands between two of them, as if applied at its own instant.
    ///
    /// If the bucket refilled in the meantime (it went idle, or was evicted,
    /// which is the same thing), the tokens have already come back by
    /// themselves: the refund is a no-op. A refund always acts on the bucket
    /// as it is at its own instant: after a [`reset`](KeyedLimiter::reset),
    /// or once the bucket refilled and was drawn on again, it gives back
    /// `n` tokens of that bucket, never beyond full.
    ///
    /// An error, not a no-op, when `n` is 0 or above the burst.
    ///
    /// ```
    /// use turnstile_rl::KeyedLimiter;
    ///
    /// let limiter = KeyedLimiter::<String>::new("10/min".parse()?);
    /// assert_eq!(limiter.check_n("carol", 4)?.remaining(), 6);
    /// // The upstream failed: give the tokens back.
    /// assert!(limiter.refund("carol", 4)?);
    /// assert_eq!(limiter.peek("carol").remaining(), 9);
    /// // Never fuller than full:
    /// assert!(!limiter.refund("carol", 10)?);
    /// assert!(!limiter.refund("nobody", 1)?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn refund<Q>(&self, key: &Q, n: u64) -> Result<bool, CostError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let gcra = self.algorithm.load();
        gcra.check_cost(n).map_err(CostError::for_refund)?;
        Ok(self.refund_as(key, n, &gcra))
    }

    /// [`refund`](KeyedLimiter::refund) for a key checked with
    /// [`check_with`](KeyedLimiter::check_with) under `quota`.
    ///
    /// ```
    /// use turnstile_rl::{KeyedLimiter, Quota};
    ///
    /// let gold: Quota = "100/min".parse()?;
    /// let limiter = KeyedLimiter::<u64>::new("10/min".parse()?);
    /// let _ = limiter.check_n_with(&1, &gold, 50)?;
    /// assert!(limiter.refund_with(&1, &gold, 50)?);
    /// assert_eq!(limiter.peek_n_with(&1, &gold, 1)?.remaining(), 99);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn refund_with<Q>(&self, key: &Q, quota: &Quota, n: u64) -> Result<bool, CostError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let gcra = Gcra::new(quota);
        gcra.check_cost(n).map_err(CostError::for_refund)?;
        Ok(self.refund_as(key, n, &gcra))
    }

    /// [`peek_n`](KeyedLimiter::peek_n) for a key checked with
    /// [`check_with`](KeyedLimiter::check_with) under `quota`.
    ///
    /// ```
    /// use turnstile_rl::{KeyedLimiter, Quota};
    ///
    /// let gold: Quota = "100/min".parse()?;
    /// let limiter = KeyedLimiter::<u64>::new("10/min".parse()?);
    /// assert_eq!(limiter.peek_n_with(&1, &gold, 40)?.remaining(), 60);
    /// assert!(limiter.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peek_n_with<Q>(&self, key: &Q, quota: &Quota, n: u64) -> Result<Decision, CostError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let gcra = Gcra::new(quota);
        gcra.check_cost(n)?;
        Ok(self.peek_as(key, n, &gcra))
    }

    /// Changes the quota of every key while the limiter serves, through
    /// `&self`: checks that begin after this returns decide at `quota`,
    /// each reading it once. Every key keeps its bucket, by the one rule
    /// every limiter follows ([`Quota`]'s "Changing a quota"): what each
    /// caller spent stays spent (rebuilding the limiter would hand everyone
    /// a full bucket), and a caller that spent more than the new burst
    /// waits until its debt is back within it. No pass over the keys: the
    /// change is one write of the quota.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use turnstile_rl::{KeyedLimiter, ManualClock};
    ///
    /// let limiter = Arc::new(
    ///     KeyedLimiter::<u64, _>::builder("10/min".parse()?)
    ///         .clock(ManualClock::new())
    ///         .build(),
    /// );
    /// for _ in 0..10 {
    ///     let _ = limiter.check(&1);
    /// }
    /// // Shared, and changed while shared:
    /// limiter.set_quota("20/min".parse()?);
    /// // Spent 10 of the old 10: owes one minute, which is 20 tokens of the
    /// // new quota: no fresh burst.
    /// assert!(limiter.check(&1).is_denied());
    /// assert_eq!(limiter.check(&2).remaining(), 19, "new keys get the new quota");
    /// assert_eq!(limiter.quota(), "20/min".parse()?);
    /// # Ok::<(), turnstile_rl::QuotaError>(())
    /// ```
    pub fn set_quota(&self, quota: Quota) {
        self.algorithm.store(Gcra::new(&quota));
    }

    /// The quota this limiter enforces now: `burst` requests per the time
    /// an empty bucket takes to fill (see [`Gcra::quota`]).
    pub fn quota(&self) -> Quota {
        self.algorithm.load().quota()
    }

    fn refund_as<Q>(&self, key: &Q, n: u64, gcra: &Gcra) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let now = self.clock.now();
        let hash = self.map.hash(key);
        // Absent, or evicted (or reset) after it was found: full, nothing
        // to give back.
        self.map
            .pin()
            .on_bucket(hash, key, |cell| {
                cell.modify(|tat| gcra.refunded(tat, now, n))
            })
            .flatten()
            .is_some()
    }
}
