//! `DirectLimiter`: one bucket for a whole service or one upstream.

use std::fmt;

use crate::algorithms::Algorithm;
use crate::algorithms::Gcra;
use crate::cell::{Cell, Charge};
use crate::clock::{Clock, DefaultClock};
use crate::decision::Decision;
use crate::error::CostError;
use crate::quota::Quota;
use crate::resets::Resets;

/// One rate-limited bucket, shared by every caller: lock-free, `Send + Sync`,
/// used through `&` or `Arc`.
///
/// GCRA by default; any packed [`Algorithm`] (for example
/// [`FixedWindow`](crate::algorithms::FixedWindow)) through
/// [`from_algorithm`](DirectLimiter::from_algorithm).
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
    algorithm: A,
    clock: C,
}

impl DirectLimiter {
    /// A GCRA limiter for `quota` on the default (quanta) clock.
    pub fn new(quota: Quota) -> Self {
        Self::with_clock(quota, DefaultClock::new())
    }
}

impl<C: Clock> DirectLimiter<C> {
    /// A GCRA limiter for `quota` on `clock`.
    pub fn with_clock(quota: Quota, clock: C) -> Self {
        Self::from_algorithm(Gcra::new(&quota), clock)
    }
}

impl<C: Clock, A: Algorithm> DirectLimiter<C, A> {
    /// A limiter running `algorithm` on `clock`, starting full.
    pub fn from_algorithm(algorithm: A, clock: C) -> Self {
        DirectLimiter {
            cell: Cell::new(0),
            resets: Resets::new(),
            algorithm,
            clock,
        }
    }

    /// Decides one request of cost 1.
    #[inline]
    pub fn check(&self) -> Decision {
        // Cost 1 is always valid: every algorithm's limit is at least 1.
        self.decide(1)
    }

    /// Decides one request of cost `n`: `n` tokens pass together or not at
    /// all. An error, not a denial, when `n` is 0 or above the burst.
    #[inline]
    pub fn check_n(&self, n: u64) -> Result<Decision, CostError> {
        self.algorithm.check_cost(n)?;
        Ok(self.decide(n))
    }

    #[inline]
    fn decide(&self, cost: u64) -> Decision {
        let now = self.clock.now();
        match self.cell.update(&self.algorithm, now, cost) {
            Ok(decision) => decision,
            // A direct limiter has no evictor, so its cell is never claimed.
            Err(_) => unreachable!("a direct limiter's cell is never tombstoned"),
        }
    }

    /// The clock this limiter reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The algorithm this limiter runs.
    pub fn algorithm(&self) -> &A {
        &self.algorithm
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
        self.peek_as(1)
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
        self.algorithm.check_cost(n)?;
        Ok(self.peek_as(n))
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

    fn peek_as(&self, cost: u64) -> Decision {
        let now = self.clock.now();
        // A direct cell is never claimed or frozen: `state` is always `Ok`.
        self.algorithm
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
        self.algorithm.check_cost(n)?;
        let now = self.clock.now();
        let algorithm = &self.algorithm;
        Ok(matches!(
            self.cell.modify(|tat| algorithm.refunded(tat, now, n)),
            Ok(Some(_))
        ))
    }

    /// A check of cost `n` (already checked) that also reports the
    /// admission it made and the generation of the bucket it made it on,
    /// for the multi-limit rollback. An admission that a reset overlapped
    /// is reported as none: it is never rolled back (see `crate::resets`).
    pub(crate) fn charge(&self, n: u64) -> (Decision, Option<(Charge, u64)>) {
        let now = self.clock.now();
        let (charged, generation) = self
            .resets
            .charge(|| self.cell.charge(&self.algorithm, now, n));
        match charged {
            Ok((decision, charge)) => (decision, charge.zip(generation)),
            // A direct limiter has no evictor, so its cell is never claimed.
            Err(_) => unreachable!("a direct limiter's cell is never tombstoned"),
        }
    }

    /// Takes the admission `charge` of cost `n` out again (see
    /// `crate::multi`) if the cell still holds the bucket of `generation`,
    /// the one it was charged to: after a reset, nothing. Returns whether
    /// the state had moved since the charge (another admission or rollback
    /// landed in between, or a reset).
    pub(crate) fn roll_back(&self, charge: &Charge, generation: u64, n: u64) -> bool {
        let algorithm = &self.algorithm;
        let clock = &self.clock;
        let raced = std::cell::Cell::new(true);
        let current = self.resets.roll_back(generation, || {
            let _ = self.cell.modify(|tat| {
                raced.set(tat != charge.after);
                // Read after the state: every admission in `tat` read the
                // clock no later than this.
                algorithm.rolled_back(tat, charge, clock.now(), n)
            });
        });
        #[cfg(turnstile_loom)]
        if !current {
            crate::probe::hit(&crate::probe::ROLLBACK_AFTER_RESET);
        }
        let _ = current;
        raced.get()
    }

    /// Changes the quota, keeping what was spent: the TAT (the time the
    /// bucket is full again) is kept, so no caller gets a fresh burst, and
    /// clamped to an empty bucket of the new quota (`now + tau`), so a debt
    /// beyond the new burst is forgiven rather than waited out.
    ///
    /// Takes `&mut self`: checks pay nothing on their path for a quota that
    /// can change. Hold the limiter in a lock taken for writing only here if
    /// it must change while shared.
    ///
    /// ```
    /// use turnstile_rl::{DirectLimiter, ManualClock};
    ///
    /// let mut limiter = DirectLimiter::with_clock("10/s burst 20".parse()?, ManualClock::new());
    /// let _ = limiter.check_n(10)?; // half the burst spent
    /// limiter.set_quota("10/s burst 40".parse()?);
    /// assert_eq!(limiter.peek().remaining(), 29, "40 - 10 spent - 1");
    /// limiter.set_quota("10/s burst 5".parse()?);
    /// // Spent 10, more than the new burst of 5: empty, not in debt.
    /// assert!(limiter.peek().is_denied());
    /// assert_eq!(limiter.peek().retry_after(), Some(std::time::Duration::from_millis(100)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_quota(&mut self, quota: Quota) {
        let gcra = Gcra::new(&quota);
        let now = self.clock.now();
        // A direct limiter's cell is never tombstoned: the result is Ok.
        let _ = self.cell.modify(|tat| gcra.clamped(tat, now));
        self.algorithm = gcra;
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
