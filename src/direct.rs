//! `DirectLimiter`: one bucket for a whole service or one upstream.

use std::fmt;

use crate::algorithms::{Algorithm, FromQuota, Gcra};
use crate::cell::Cell;
use crate::clock::{Clock, DefaultClock};
use crate::decision::Decision;
use crate::error::{CostError, QuotaError};
use crate::live::Live;
use crate::quota::Quota;
use crate::resets::Resets;

/// One rate-limited bucket, shared by every caller: lock-free, `Send + Sync`,
/// used through `&` or `Arc`.
///
/// GCRA by default; any packed [`Algorithm`] (for example
/// [`FixedWindow`](crate::algorithms::FixedWindow)) through
/// [`builder`](DirectLimiter::builder).
///
/// ```
/// use turnstile_rl::{DirectLimiter, Quota};
///
/// let limiter = DirectLimiter::new(Quota::per_second(50)?);
/// let decision = limiter.check();
/// assert!(decision.is_allowed());
/// assert_eq!(decision.remaining(), 49);
/// # Ok::<(), turnstile_rl::QuotaError>(())
/// ```
pub struct DirectLimiter<C: Clock = DefaultClock, A: Algorithm = Gcra> {
    cell: Cell,
    /// Which bucket the cell holds, for multi-limit rollbacks: a new one
    /// after each reset.
    resets: Resets,
    /// Read whole by every check, changed by `set_quota` (`crate::live`).
    algorithm: Live<A>,
    clock: C,
}

impl DirectLimiter {
    /// A GCRA limiter for `quota` on the default (quanta) clock.
    pub fn new(quota: Quota) -> Self {
        Self::builder(quota).build()
    }

    /// A builder to choose the clock and the algorithm, as
    /// [`KeyedLimiter::builder`](crate::KeyedLimiter::builder) does.
    ///
    /// ```
    /// use turnstile_rl::algorithms::FixedWindow;
    /// use turnstile_rl::{DirectLimiter, ManualClock};
    ///
    /// let limiter = DirectLimiter::builder("3/min".parse()?)
    ///     .clock(ManualClock::new())
    ///     .algorithm_for::<FixedWindow>()?
    ///     .build();
    /// assert_eq!(limiter.check().remaining(), 2);
    /// # Ok::<(), turnstile_rl::QuotaError>(())
    /// ```
    pub fn builder(quota: Quota) -> DirectLimiterBuilder {
        DirectLimiterBuilder {
            quota,
            algorithm: Gcra::new(&quota),
            clock: DefaultClock::new(),
        }
    }
}

impl<C: Clock, A: Algorithm> DirectLimiter<C, A> {
    /// Decides one request of cost 1.
    #[inline]
    pub fn check(&self) -> Decision {
        // Cost 1 is always valid: every algorithm's limit is at least 1.
        self.decide(&self.algorithm.load(), 1)
    }

    /// Decides one request of cost `n`: `n` tokens pass together or not at
    /// all. An error, not a denial, when `n` is 0 or above the burst.
    #[inline]
    pub fn check_n(&self, n: u64) -> Result<Decision, CostError> {
        let algorithm = self.algorithm.load();
        algorithm.check_cost(n)?;
        Ok(self.decide(&algorithm, n))
    }

    /// Decides at the quota `algorithm`, read once for the whole check (or
    /// the last limit's, by a multi-limit check).
    #[inline]
    pub(crate) fn decide(&self, algorithm: &A, cost: u64) -> Decision {
        let now = self.clock.now();
        match self.cell.update(algorithm, now, cost) {
            Ok(decision) => decision,
            // A direct limiter has no evictor, so its cell is never claimed.
            Err(_) => unreachable!("a direct limiter's cell is never tombstoned"),
        }
    }

    /// The clock this limiter reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The bucket and the count of its resets: what a multi-limit check
    /// charges and rolls back (`crate::multi`).
    pub(crate) fn bucket(&self) -> (&Cell, &Resets) {
        (&self.cell, &self.resets)
    }

    /// The algorithm this limiter runs now (a copy: a quota change
    /// replaces it).
    pub fn algorithm(&self) -> A {
        self.algorithm.load()
    }

    /// A number that moves whenever the quota changes (0 until the first
    /// [`set_quota`](DirectLimiter::set_quota)): what the HTTP layer
    /// compares to know its `RateLimit-Policy` is current.
    pub fn quota_version(&self) -> u64 {
        self.algorithm.version()
    }
}

impl<C: Clock, A: Algorithm> DirectLimiter<C, A> {
    /// The decision a [`check`](DirectLimiter::check) would get now, without
    /// taking anything: one load of the cell, no write, so a later check is
    /// decided exactly as if this call had not been made.
    ///
    /// ```
    /// use turnstile_rl::DirectLimiter;
    ///
    /// let limiter = DirectLimiter::new("3/min".parse()?);
    /// assert_eq!(limiter.peek().remaining(), 2);
    /// assert_eq!(limiter.peek().remaining(), 2, "peeking took nothing");
    /// assert_eq!(limiter.check().remaining(), 2);
    /// # Ok::<(), turnstile_rl::QuotaError>(())
    /// ```
    pub fn peek(&self) -> Decision {
        // Cost 1 is always valid: every algorithm's limit is at least 1.
        self.peek_as(&self.algorithm.load(), 1)
    }

    /// [`peek`](DirectLimiter::peek) for a request of cost `n`: an error,
    /// not a denial, when `n` is 0 or above the burst.
    ///
    /// ```
    /// use turnstile_rl::{CostError, DirectLimiter};
    ///
    /// let limiter = DirectLimiter::new("10/s".parse()?);
    /// assert!(limiter.peek_n(10).unwrap().is_allowed());
    /// assert_eq!(limiter.peek_n(0), Err(CostError::Zero));
    /// # Ok::<(), turnstile_rl::QuotaError>(())
    /// ```
    pub fn peek_n(&self, n: u64) -> Result<Decision, CostError> {
        let algorithm = self.algorithm.load();
        algorithm.check_cost(n)?;
        Ok(self.peek_as(&algorithm, n))
    }

    /// Fills the bucket again, as if it had never been used. Returns whether
    /// it was in use. One CAS: a check racing it lands before or after.
    ///
    /// The full bucket is a new one: a multi-limit check that charged the
    /// old one and is then denied takes nothing out of it. So a reset waits
    /// for such rollbacks already under way to land first (each is one
    /// CAS); checks never wait for a reset.
    ///
    /// ```
    /// use turnstile_rl::DirectLimiter;
    ///
    /// let limiter = DirectLimiter::new("1/h".parse()?);
    /// let _ = limiter.check();
    /// assert!(limiter.check().is_denied());
    /// assert!(limiter.reset());
    /// assert!(limiter.check().is_allowed());
    /// # Ok::<(), turnstile_rl::QuotaError>(())
    /// ```
    pub fn reset(&self) -> bool {
        let in_use = std::cell::Cell::new(false);
        self.resets.reset(|| {
            // State 0 is a full bucket for every algorithm. Written even
            // when it is there already: the write is what a charge racing
            // the reset orders itself against (see `crate::resets`).
            let _ = self.cell.modify(|state| {
                in_use.set(state != 0);
                Some(0)
            });
        });
        in_use.get()
    }

    fn peek_as(&self, algorithm: &A, cost: u64) -> Decision {
        let now = self.clock.now();
        // A direct cell is never claimed or frozen: `state` is always `Ok`.
        algorithm
            .decide(self.cell.state().unwrap_or(0), now, cost)
            .decision
    }
}

impl<C: Clock> DirectLimiter<C, Gcra> {
    /// Gives back `n` tokens a check took (the request was not served).
    /// Returns whether anything was given back.
    ///
    /// At its instant `now`, one CAS sets `TAT := max(TAT - n*T, now)`:
    /// exact (each token took exactly `T`), never fuller than full, and a
    /// no-op when the bucket has refilled by itself in the meantime. A
    /// refund racing checks lands between two of them, as if applied at its
    /// own instant. An error, not a no-op, when `n` is 0 or above the burst.
    ///
    /// ```
    /// use turnstile_rl::DirectLimiter;
    ///
    /// let limiter = DirectLimiter::new("10/min".parse()?);
    /// assert_eq!(limiter.check_n(3)?.remaining(), 7);
    /// assert!(limiter.refund(3)?);
    /// assert_eq!(limiter.peek().remaining(), 9);
    /// assert!(!limiter.refund(1)?, "already full");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn refund(&self, n: u64) -> Result<bool, CostError> {
        let algorithm = &self.algorithm.load();
        algorithm.check_cost(n).map_err(CostError::for_refund)?;
        let now = self.clock.now();
        Ok(matches!(
            self.cell.modify(|tat| algorithm.refunded(tat, now, n)),
            Ok(Some(_))
        ))
    }

    /// Changes the quota while the limiter serves, through `&self`: checks
    /// that begin after this returns decide at `quota`. Nothing is
    /// rebuilt and the bucket is kept, by the one rule every limiter
    /// follows ([`Quota`]'s "Changing a quota"): what was spent stays
    /// spent, and a caller that spent more than the new burst waits until
    /// its debt is within it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile_rl::{DirectLimiter, ManualClock};
    ///
    /// let clock = ManualClock::new();
    /// let limiter = DirectLimiter::builder("10/s burst 20".parse()?).clock(clock.clone()).build();
    /// let _ = limiter.check_n(10)?; // half the burst spent
    /// limiter.set_quota("10/s burst 40".parse()?);
    /// assert_eq!(limiter.peek().remaining(), 29, "40 - 10 spent - 1");
    /// limiter.set_quota("10/s burst 5".parse()?);
    /// // Spent 10 (1 s owed), more than the new burst of 5 (0.5 s): the
    /// // first token comes when the debt is back within it, plus one T.
    /// assert_eq!(limiter.peek().retry_after(), Some(Duration::from_millis(600)));
    /// clock.advance(Duration::from_millis(600));
    /// assert!(limiter.check().is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_quota(&self, quota: Quota) {
        self.algorithm.store(Gcra::new(&quota));
    }

    /// The quota this limiter enforces now: `burst` requests per the time
    /// an empty bucket takes to fill (see [`Gcra::quota`]).
    pub fn quota(&self) -> Quota {
        self.algorithm.load().quota()
    }
}

/// Builds a [`DirectLimiter`]: `DirectLimiter::builder(quota)`.
#[derive(Debug)]
pub struct DirectLimiterBuilder<C = DefaultClock, A = Gcra> {
    /// The quota given to `builder`, kept for
    /// [`algorithm_for`](DirectLimiterBuilder::algorithm_for).
    quota: Quota,
    algorithm: A,
    clock: C,
}

impl<C: Clock, A: Algorithm> DirectLimiterBuilder<C, A> {
    /// Reads time from `clock` (a [`ManualClock`](crate::ManualClock) in tests).
    pub fn clock<C2: Clock>(self, clock: C2) -> DirectLimiterBuilder<C2, A> {
        DirectLimiterBuilder {
            quota: self.quota,
            algorithm: self.algorithm,
            clock,
        }
    }

    /// Runs the algorithm `A2` configured by the builder's quota instead of
    /// the quota's GCRA; [`QuotaError::DoesNotFit`] when `A2` cannot hold
    /// the quota (a window's limit or period out of its bounds).
    pub fn algorithm_for<A2: FromQuota>(self) -> Result<DirectLimiterBuilder<C, A2>, QuotaError> {
        let algorithm = A2::from_quota(&self.quota)?;
        Ok(self.algorithm(algorithm))
    }

    /// Runs `algorithm` (for example a
    /// [`FixedWindow`](crate::algorithms::FixedWindow) built for another
    /// quota) instead of the quota's GCRA.
    pub fn algorithm<A2: Algorithm>(self, algorithm: A2) -> DirectLimiterBuilder<C, A2> {
        DirectLimiterBuilder {
            quota: self.quota,
            algorithm,
            clock: self.clock,
        }
    }

    /// The limiter, starting full.
    pub fn build(self) -> DirectLimiter<C, A> {
        DirectLimiter {
            cell: Cell::new(0),
            resets: Resets::new(),
            algorithm: Live::new(self.algorithm),
            clock: self.clock,
        }
    }
}

impl<C: Clock, A: Algorithm + fmt::Debug> fmt::Debug for DirectLimiter<C, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DirectLimiter")
            .field("algorithm", &self.algorithm)
            .field("state", &self.cell.state().unwrap_or(0))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    /// Shared by `&` or `Arc` across threads: a compile-time check.
    #[test]
    fn limiters_are_send_and_sync() {
        fn shareable<T: Send + Sync>() {}
        shareable::<super::DirectLimiter>();
        shareable::<super::DirectLimiter<crate::clock::RecentClock, crate::algorithms::FixedWindow>>(
        );
    }
}
