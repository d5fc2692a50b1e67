//! The limiter factory: the algorithms a command can run on one quota, and
//! one limiter of any of them, so `check`, `latency` and `scenarios` build
//! them alike and none special-cases the sliding log.

use clap::ValueEnum;
use turnstile_rl::algorithms::{FixedWindow, SlidingWindow};
use turnstile_rl::{Clock, Decision, DirectLimiter, Quota, QuotaError, SlidingLog};

/// An algorithm that decides requests against one quota.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Algorithm {
    /// GCRA (`DirectLimiter`), the default.
    Gcra,
    /// Fixed window (the quota's burst is ignored).
    FixedWindow,
    /// Sliding-window counter (the quota's burst is ignored).
    SlidingWindow,
    /// Sliding log (the quota's burst is ignored).
    SlidingLog,
}

impl Algorithm {
    /// Its name on the command line, for example `fixed-window`.
    pub(crate) fn name(self) -> String {
        self.to_possible_value()
            .map_or_else(String::new, |v| v.get_name().to_owned())
    }

    /// The largest count per window the algorithm can hold, if it has a
    /// bound (the packed windows do; GCRA and the log do not).
    pub(crate) fn max_limit(self) -> Option<u64> {
        match self {
            Algorithm::FixedWindow => Some(FixedWindow::MAX_LIMIT),
            Algorithm::SlidingWindow => Some(SlidingWindow::MAX_LIMIT),
            Algorithm::Gcra | Algorithm::SlidingLog => None,
        }
    }

    /// A limiter of this algorithm for `quota` on `clock`, starting full;
    /// [`QuotaError::DoesNotFit`] when a window cannot hold the quota.
    pub(crate) fn build<C: Clock>(self, quota: Quota, clock: C) -> Result<Limiter<C>, QuotaError> {
        Ok(match self {
            Algorithm::Gcra => Limiter::Gcra(DirectLimiter::builder(quota).clock(clock).build()),
            Algorithm::FixedWindow => Limiter::FixedWindow(
                DirectLimiter::builder(quota)
                    .clock(clock)
                    .algorithm_for::<FixedWindow>()?
                    .build(),
            ),
            Algorithm::SlidingWindow => Limiter::SlidingWindow(
                DirectLimiter::builder(quota)
                    .clock(clock)
                    .algorithm_for::<SlidingWindow>()?
                    .build(),
            ),
            Algorithm::SlidingLog => {
                Limiter::SlidingLog(SlidingLog::builder(quota).clock(clock).build())
            }
        })
    }
}

/// One limiter of any [`Algorithm`]: an enum rather than a trait object, so
/// a check is a predictable branch and not an indirect call.
#[derive(Debug)]
pub(crate) enum Limiter<C: Clock> {
    /// GCRA.
    Gcra(DirectLimiter<C>),
    /// The fixed window, on the same engine.
    FixedWindow(DirectLimiter<C, FixedWindow>),
    /// The sliding-window counter, on the same engine.
    SlidingWindow(DirectLimiter<C, SlidingWindow>),
    /// The sliding log, a limiter of its own (behind a mutex).
    SlidingLog(SlidingLog<C>),
}

impl<C: Clock> Limiter<C> {
    /// Decides one request of cost 1.
    #[inline]
    pub(crate) fn check(&self) -> Decision {
        match self {
            Limiter::Gcra(limiter) => limiter.check(),
            Limiter::FixedWindow(limiter) => limiter.check(),
            Limiter::SlidingWindow(limiter) => limiter.check(),
            Limiter::SlidingLog(log) => log.check(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnstile_rl::ManualClock;

    #[test]
    fn every_algorithm_builds_and_admits_its_limit() {
        for algorithm in Algorithm::value_variants() {
            let limiter = algorithm
                .build("5/min".parse().unwrap(), ManualClock::new())
                .unwrap();
            let admitted = (0..8).filter(|_| limiter.check().is_allowed()).count();
            assert_eq!(admitted, 5, "{algorithm:?}");
        }
    }

    #[test]
    fn a_window_refuses_a_quota_above_its_public_limit() {
        for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
            let limit = algorithm.max_limit().unwrap();
            let clock = ManualClock::new;
            assert!(algorithm
                .build(Quota::per_hour(limit).unwrap(), clock())
                .is_ok());
            let err = algorithm
                .build(Quota::per_hour(limit + 1).unwrap(), clock())
                .unwrap_err();
            assert!(matches!(err, QuotaError::DoesNotFit { .. }), "{err}");
        }
        assert_eq!(Algorithm::Gcra.max_limit(), None);
        assert_eq!(Algorithm::SlidingWindow.name(), "sliding-window");
    }
}
