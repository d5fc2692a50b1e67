//! The operations beside `check` on a [`KeyedLimiter`]: peek, reset, clear,
//! refund, quota changes that keep state, and gauges.
//!
//! Each is one read or one compare-and-swap on the key's cell, so it lands
//! between two whole decisions, exactly as a check does.

use std::borrow::Borrow;
use std::hash::Hash;

use super::{Admitted, KeyedLimiter};
use crate::algorithms::{Algorithm, Gcra};
use crate::cell::{Cell, Charge, Gone};
use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::CostError;
use crate::map::Pinned;
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
        let map = self.map.pin();
        loop {
            let Some(slot) = map.find(hash, key) else {
                return 0;
            };
            match slot.cell.state() {
                Ok(state) => return state,
                // Claimed by an evictor after `find` saw it: absent from then on.
                Err(Gone::Dead) => return 0,
                // Moved to a successor table since `find`: look again.
                Err(Gone::Moved) => {}
            }
        }
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
        gcra.check_cost(n)?;
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
        gcra.check_cost(n)?;
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
        let map = self.map.pin();
        loop {
            let Some(slot) = map.find(hash, key) else {
                // Absent is full: nothing to give back.
                return false;
            };
            match slot.cell.modify(|tat| gcra.refunded(tat, now, n)) {
                Ok(written) => return written.is_some(),
                // Evicted (or reset) since `find`: full from then on.
                Err(Gone::Dead) => return false,
                // Moved to a successor table since `find`: look again.
                Err(Gone::Moved) => {}
            }
        }
    }
}

impl<K, C> KeyedLimiter<K, C, Gcra>
where
    K: Hash + Eq + Send + Sync + 'static,
    C: Clock,
{
    /// This limiter's map, pinned: a multi-limit check holds it from its
    /// first charge to its last rollback, so the slots its charges landed
    /// on are not freed (nor reused for other buckets) in between.
    pub(crate) fn pin(&self) -> Pinned<'_, K> {
        self.map.pin()
    }

    /// A check of cost `n` at the quota `algorithm` (`n` already checked
    /// against it) for `key` that also reports the admission it made and
    /// the cell it made it on, for the multi-limit rollback: `decide` with `Cell::charge` in place of
    /// `Cell::update`, kept apart so the single-limit path is not touched.
    ///
    pub(crate) fn charge<'p, Q>(
        &self,
        map: &'p Pinned<'_, K>,
        algorithm: &Gcra,
        key: &Q,
        n: u64,
    ) -> (Decision, Option<(Charge, &'p Cell)>)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hash = self.map.hash(key);
        let mut found = map.find(hash, key);
        // The clock after the lookup, as `decide` reads it (its comment
        // says why).
        let first = self.clock.now();
        let idle = |state| algorithm.is_idle(state, first);
        self.tick(map, first, &idle);
        // An insert may read the clock again (see `admit`); later steps
        // decide at that reading.
        let mut now = first;
        loop {
            let slot = match found {
                Some(slot) => slot,
                None => match self.admit(map, hash, key, &mut now, n, algorithm, &idle) {
                    Admitted::Inserted(decision, charge, slot) => {
                        return (decision, charge.map(|c| (c, &slot.cell)))
                    }
                    Admitted::Found(slot) => slot,
                    // Untracked or refused: nothing was charged.
                    Admitted::Refused(now) => {
                        return (self.overflow_decision(algorithm, now, n), None)
                    }
                },
            };
            match slot.cell.charge(algorithm, now, n) {
                Ok((decision, charge)) => return (decision, charge.map(|c| (c, &slot.cell))),
                // Evicted or moved under our feet: look again.
                Err(Gone::Dead | Gone::Moved) => found = map.find(hash, key),
            }
        }
    }

    /// Takes the admission `charge` of cost `n`, made at the quota `gcra`,
    /// out of `cell`, the cell it landed on (see `crate::multi`), if that
    /// cell still holds the bucket.
    /// Returns whether the state had moved since the charge (another
    /// admission or rollback landed in between, or the bucket is gone).
    ///
    /// A dead cell's bucket was reset or evicted (as idle, when the charge
    /// had expired by itself, or to make room), and a new bucket for the
    /// key never held this charge: nothing to take out. A frozen cell's
    /// bucket is moving to a successor table; the charge is left in it
    /// rather than taken out of whatever bucket holds the key there, which
    /// may be a new one (see "Which bucket" in `crate::multi`).
    pub(crate) fn roll_back(&self, gcra: &Gcra, cell: &Cell, charge: &Charge, n: u64) -> bool {
        let (algorithm, clock) = (gcra, &self.clock);
        let raced = std::cell::Cell::new(true);
        let rolled = cell.modify(|tat| {
            raced.set(tat != charge.after);
            // Read after the state: every admission in `tat` read the
            // clock no later than this.
            algorithm.rolled_back(tat, charge, clock.now(), n)
        });
        match rolled {
            Err(Gone::Dead) => probe!(ROLLBACK_FOUND_BUCKET_DEAD),
            Err(Gone::Moved) => probe!(ROLLBACK_FOUND_BUCKET_MOVED),
            Ok(_) => {}
        }
        raced.get()
    }
}
