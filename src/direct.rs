//! `DirectLimiter`: one bucket for a whole service or one upstream.

use std::fmt;

use crate::algorithm::Algorithm;
use crate::cell::Cell;
use crate::clock::{Clock, DefaultClock};
use crate::error::CostError;
use crate::{Decision, Gcra, Quota};

/// One rate-limited bucket, shared by every caller: lock-free, `Send + Sync`,
/// used through `&` or `Arc`.
///
/// GCRA by default; any packed [`Algorithm`] (for example
/// [`FixedWindow`](crate::algorithms::FixedWindow)) through
/// [`from_algorithm`](DirectLimiter::from_algorithm).
///
/// ```
/// use turnstile::{DirectLimiter, Quota};
///
/// let limiter = DirectLimiter::new(Quota::per_second(50)?);
/// let decision = limiter.check();
/// assert!(decision.is_allowed());
/// assert_eq!(decision.remaining(), 49);
/// # Ok::<(), turnstile::QuotaError>(())
/// ```
pub struct DirectLimiter<C: Clock = DefaultClock, A: Algorithm = Gcra> {
    cell: Cell,
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

impl<C: Clock, A: Algorithm + fmt::Debug> fmt::Debug for DirectLimiter<C, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DirectLimiter")
            .field("algorithm", &self.algorithm)
            .field("state", &self.cell.load())
            .finish_non_exhaustive()
    }
}
