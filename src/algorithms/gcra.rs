//! GCRA, the generic cell rate algorithm, on integer nanoseconds.
//!
//! The state is one number, the theoretical arrival time `TAT`: the time at
//! which the bucket would be full again. With burst `B`, emission interval
//! `T` and tolerance `tau = B * T`, a request of cost `n` at `now` computes
//! `tat' = max(TAT, now) + n * T` and passes iff `tat' - now <= tau`, in
//! which case `TAT := tat'`. A bucket with `TAT <= now` is full, exactly as
//! if it had never been seen: that is what makes idle eviction lossless.
//!
//! Everything is integer and saturating. `max(TAT, now) >= now`, so no
//! subtraction underflows; `n <= B` so `n * T <= tau` fits; the one sum that
//! can overflow, `max(TAT, now) + n * T`, is checked, and a time too close to
//! `u64::MAX` nanoseconds (584 years after the clock's origin) to record a
//! new `TAT` is denied rather than wrapped into an allow.

use std::num::NonZeroU64;

use crate::algorithms::{sealed, Algorithm, Step};
use crate::cell::Charge;
use crate::cell::STATE_END;
use crate::decision::Decision;
use crate::error::CostError;
use crate::quota::Quota;

/// The GCRA parameters of one quota: the pure decision function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Gcra {
    interval: NonZeroU64,
    tolerance: u64,
    burst: NonZeroU64,
}

impl Gcra {
    /// The GCRA of `quota`.
    pub fn new(quota: &Quota) -> Self {
        Gcra {
            interval: NonZeroU64::new(quota.interval_nanos()).unwrap_or(NonZeroU64::MIN),
            tolerance: quota.tolerance_nanos(),
            burst: NonZeroU64::new(quota.burst_size()).unwrap_or(NonZeroU64::MIN),
        }
    }

    /// The bucket this GCRA runs, as a quota: `burst` requests per the time
    /// a bucket takes to refill from empty (`burst * T`). For
    /// `"100/min"` that is `"100/min"` again; for `"10/s burst 20"` it is
    /// `"20/2s"`, the same bucket.
    ///
    /// ```
    /// use turnstile_rl::{Gcra, Quota};
    ///
    /// let gcra = Gcra::new(&"100/min".parse()?);
    /// assert_eq!(gcra.quota(), "100/min".parse::<Quota>()?);
    /// # Ok::<(), turnstile_rl::QuotaError>(())
    /// ```
    pub fn quota(&self) -> Quota {
        Quota::of_bucket(self.burst, self.interval)
    }

    /// The decision for a request of `cost` tokens at `now` on a bucket whose
    /// theoretical arrival time is `tat`: the whole algorithm as one pure
    /// function, for tests, fuzzing and your own models.
    pub fn check(&self, tat: u64, now: u64, cost: u64) -> Result<Step, CostError> {
        self.check_cost(cost)?;
        Ok(self.decide(tat, now, cost))
    }
}

impl Gcra {
    /// The first theoretical arrival time a bucket cannot store: `2^63 - 4`
    /// nanoseconds, 292 years after its clock's origin (the keyed map keeps
    /// the words above it for itself). A check whose new TAT would reach it
    /// is denied with a wait of `u64::MAX` ns: the end of the clock.
    pub const TAT_END: u64 = STATE_END;
}

impl Gcra {
    /// The state after giving back `cost` tokens at `now` to a bucket whose
    /// theoretical arrival time is `tat`, or `None` when there is nothing to
    /// give back (the bucket is full: `tat <= now`).
    ///
    /// `tat' = max(tat - cost * T, now)`: never fuller than full (a state at
    /// or before `now` is a full bucket), and exact otherwise, since every
    /// token a check took added exactly `T` to the TAT.
    pub(crate) fn refunded(&self, tat: u64, now: u64, cost: u64) -> Option<u64> {
        if tat <= now {
            return None;
        }
        // cost <= burst, so the product is at most tau: it fits.
        let back = cost.min(self.burst.get()) * self.interval.get();
        Some(tat.saturating_sub(back).max(now))
    }

    /// The state after taking the admission `charge` of `cost` tokens out
    /// of a bucket whose state is now `tat`, at `now` (a reading taken
    /// after `tat` was loaded): `min(tat, tat - cost*T + (now - charge.now))`.
    /// `None` when that leaves the state as it is. Why this and not a plain
    /// refund is the proof in `crate::multi`.
    pub(crate) fn rolled_back(
        &self,
        tat: u64,
        charge: &Charge,
        now: u64,
        cost: u64,
    ) -> Option<u64> {
        // cost <= burst, so the product is at most tau: it fits.
        let back = cost.min(self.burst.get()) * self.interval.get();
        let elapsed = now.saturating_sub(charge.now);
        let next = tat.saturating_sub(back).saturating_add(elapsed).min(tat);
        (next != tat).then_some(next)
    }
}

impl Gcra {
    /// Whole tokens a bucket whose theoretical arrival time is `tat` holds
    /// at `now`: what a leased limiter's take can have at most
    /// (`crate::leased`).
    #[inline]
    pub(crate) fn available(&self, tat: u64, now: u64) -> u64 {
        let backlog = tat.max(now) - now;
        self.tolerance.saturating_sub(backlog) / self.interval
    }

    /// The answer to an admission that left the bucket at `tat` (or was
    /// served from a lease taken when it did) with `left` tokens of the
    /// caller's lease unspent. With `left == 0` and `tat` the state the
    /// admission wrote, exactly [`decision`](sealed::Sealed::decision)'s.
    #[inline]
    pub(crate) fn leased_decision(&self, tat: u64, now: u64, left: u64) -> Decision {
        let backlog = tat.max(now) - now;
        let leased = left.min(self.burst.get()) * self.interval.get();
        let headroom = self
            .tolerance
            .saturating_sub(backlog)
            .saturating_add(leased)
            .min(self.tolerance);
        Decision::allowed(self.burst.get(), headroom, self.interval, backlog)
    }
}

impl sealed::Sealed for Gcra {
    #[inline]
    fn to_words(&self) -> [u64; sealed::WORDS] {
        [self.interval.get(), self.tolerance, self.burst.get()]
    }

    #[inline]
    fn from_words([interval, tolerance, burst]: [u64; sealed::WORDS]) -> Self {
        // The words are a Gcra's own (`to_words`): never zero.
        Gcra {
            interval: NonZeroU64::new(interval).unwrap_or(NonZeroU64::MIN),
            tolerance,
            burst: NonZeroU64::new(burst).unwrap_or(NonZeroU64::MIN),
        }
    }

    #[inline]
    fn admit(&self, tat: u64, now: u64, cost: u64) -> Option<u64> {
        // Defensive for costs that skipped check_cost: never above tau.
        let increment = cost.min(self.burst.get()) * self.interval.get();
        // The cell reserves the words from STATE_END on (2^63 - 4 ns,
        // 292 years after the clock's origin).
        match tat.max(now).checked_add(increment) {
            Some(next) if next - now <= self.tolerance && next < STATE_END => Some(next),
            _ => None,
        }
    }

    #[inline]
    fn decision(&self, tat: u64, now: u64, cost: u64, next: Option<u64>) -> Decision {
        let (t, tau, burst) = (self.interval, self.tolerance, self.burst.get());
        if let Some(next) = next {
            return Decision::allowed(burst, tau - (next - now), t, next - now);
        }
        let increment = cost.min(burst) * t.get();
        let backlog = tat.max(now) - now;
        let retry = match tat.max(now).checked_add(increment) {
            // A TAT at or past STATE_END can never be recorded, so
            // waiting would not help either.
            Some(next) if next - now > tau && next < STATE_END => next - now - tau,
            // The new TAT cannot be recorded: the end of the clock.
            _ => u64::MAX,
        };
        Decision::denied(burst, tau.saturating_sub(backlog), t, backlog, retry)
    }

    #[inline]
    fn additive(&self, tat: u64, now: u64, next: u64) -> bool {
        // Under load `max(tat, now) = tat`, so the new TAT is `tat + n*T`.
        // The bounds keep every sum of adds in flight below the cell's
        // reserved words (see `ADD_BELOW`).
        tat >= now && tat < ADD_BELOW && next - tat <= ADD_MOST && self.tolerance < ADD_BELOW
    }

    #[inline]
    fn leaves_room(&self, next: u64, now: u64, tokens: u64) -> bool {
        // `next >= now`: an additive admission writes past its reading.
        (next - now).saturating_add(tokens.saturating_mul(self.interval.get())) <= self.tolerance
    }

    #[inline]
    fn taken_back(&self, tat: u64, reading: u64, after: u64, now: u64, cost: u64) -> Option<u64> {
        let charge = Charge {
            now: reading,
            after,
        };
        self.rolled_back(tat, &charge, now, cost)
    }
}

/// The add path's bounds (`Sealed::additive`): a state and a tolerance
/// below 2^61 ns (73 years) and an amount of at most 2^32 ns (4.3 s).
/// Every state an admission writes is then below its reading plus 2^61,
/// so while readings stay below 2^62 ns (146 years after the clock's
/// origin) a state reaches the first reserved word, `2^63 - 3`, only with
/// more than `2^61 / 2^32 = 2^29` adds in flight at once, one per thread:
/// no process runs that many threads.
const ADD_BELOW: u64 = 1 << 61;
const ADD_MOST: u64 = 1 << 32;

impl Algorithm for Gcra {
    #[inline]
    fn check_cost(&self, cost: u64) -> Result<(), CostError> {
        CostError::check(cost, self.burst.get())
    }

    #[inline]
    fn decide(&self, tat: u64, now: u64, cost: u64) -> Step {
        use sealed::Sealed;
        // In two halves, so that a cell's CAS loop runs the first alone.
        let next = self.admit(tat, now, cost);
        Step {
            next,
            decision: self.decision(tat, now, cost, next),
        }
    }

    #[inline]
    fn is_idle(&self, tat: u64, now: u64) -> bool {
        tat <= now
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000_000_000;

    fn gcra(text: &str) -> Gcra {
        Gcra::new(&text.parse().unwrap())
    }

    /// Runs `count` checks of cost 1 at `now`, returning (allowed, new tat).
    fn burst_at(g: &Gcra, mut tat: u64, now: u64, count: usize) -> (usize, u64) {
        let mut allowed = 0;
        for _ in 0..count {
            let step = g.check(tat, now, 1).unwrap();
            if let Some(next) = step.next {
                tat = next;
                allowed += 1;
            }
        }
        (allowed, tat)
    }

    #[test]
    fn capacity_5_refill_2_per_second() {
        let g = gcra("2/s burst 5");
        let (allowed, tat) = burst_at(&g, 0, 0, 7);
        assert_eq!(allowed, 5);
        assert_eq!(burst_at(&g, tat, 1_100 * MS, 3).0, 2);
        assert_eq!(burst_at(&g, tat, 1_500 * MS, 4).0, 3);
    }

    #[test]
    fn decision_figures() {
        let g = gcra("2/s burst 5");
        let step = g.check(0, 0, 1).unwrap();
        let d = step.decision;
        assert!(d.is_allowed());
        assert_eq!((d.remaining(), d.limit()), (4, 5));
        assert_eq!(d.reset_after(), Duration::from_millis(500));
        assert_eq!(d.retry_after(), None);

        // Empty bucket (TAT = now + tau): the next token comes in T.
        let d = g.check(2_500 * MS, 0, 1).unwrap().decision;
        assert!(d.is_denied());
        assert_eq!(d.remaining(), 0);
        assert_eq!(d.retry_after(), Some(Duration::from_millis(500)));
        assert_eq!(d.reset_after(), Duration::from_millis(2_500));
        // Three tokens wait for three intervals.
        let d = g.check(2_500 * MS, 0, 3).unwrap().decision;
        assert_eq!(d.retry_after(), Some(Duration::from_millis(1_500)));
    }

    #[test]
    fn cost_errors_change_nothing() {
        let g = gcra("10/s");
        assert_eq!(g.check(0, 0, 0), Err(CostError::Zero));
        assert_eq!(
            g.check(0, 0, 11),
            Err(CostError::ExceedsCapacity {
                cost: 11,
                capacity: 10
            })
        );
        assert!(g.check(0, 0, 10).unwrap().decision.is_allowed());
    }

    #[test]
    fn backwards_clock_grants_nothing() {
        let g = gcra("1/s");
        let tat = g.check(0, 5 * S, 1).unwrap().next.unwrap();
        assert_eq!(tat, 6 * S);
        // A reading 300 ms in the past: denied, and retry shifted by 300 ms.
        let d = g.check(tat, 5 * S - 300 * MS, 1).unwrap().decision;
        assert_eq!(d.retry_after(), Some(Duration::from_millis(1_300)));
    }

    #[test]
    fn the_end_of_time_denies_instead_of_wrapping() {
        let g = gcra("1/s");
        let near_end = u64::MAX - S / 2;
        let step = g.check(0, near_end, 1).unwrap();
        assert_eq!(step.next, None);
        assert!(step.decision.is_denied());
        let step = g.check(u64::MAX - 1, u64::MAX, 1).unwrap();
        assert!(step.decision.is_denied());
        // The last storable TAT is STATE_END - 1: one interval short of it
        // is still admitted, and the request after it is denied for good.
        let last = STATE_END - 1;
        let step = g.check(0, last - S, 1).unwrap();
        assert_eq!(step.next, Some(last));
        let step = g.check(last, last, 1).unwrap();
        assert_eq!(step.next, None);
        let never = Some(Duration::from_nanos(u64::MAX));
        assert_eq!(step.decision.retry_after(), never);
        assert!(g.is_idle(0, 0));
        assert!(!g.is_idle(1, 0));
    }
}
