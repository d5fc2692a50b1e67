//! Errors: each names what is wrong, in the caller's terms.

use std::time::Duration;

/// A quota that cannot be built or parsed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QuotaError {
    /// The text was empty.
    #[error("empty quota: expected COUNT/PERIOD, for example \"100/min\"")]
    Empty,
    /// The text does not follow the grammar.
    #[error("cannot parse quota {text:?}: {reason}")]
    Syntax {
        /// The text given.
        text: String,
        /// What was expected.
        reason: &'static str,
    },
    /// A number that is not a whole, non-negative number that fits in a u64.
    #[error("the {what} {text:?} is not a number (expected decimal digits that fit in a u64)")]
    BadNumber {
        /// Which part of the quota (count, period, burst).
        what: &'static str,
        /// The text given.
        text: String,
    },
    /// The period has no unit.
    #[error(
        "the period has no unit: write one of ns, us, ms, s, min, h, d (for example \"100/min\")"
    )]
    MissingUnit,
    /// The period's unit is not one we know.
    #[error("unknown time unit {unit:?}: expected one of ns, us, ms, s, min, h, d")]
    UnknownUnit {
        /// The unit given.
        unit: String,
    },
    /// The count is zero: nothing would ever pass.
    #[error("a quota must allow at least one request per period (count is 0)")]
    ZeroCount,
    /// The period is zero.
    #[error("the period must be longer than zero")]
    ZeroPeriod,
    /// The burst is zero: nothing would ever pass.
    #[error("the burst must be at least 1 (a bucket of 0 tokens admits nothing)")]
    ZeroBurst,
    /// The period does not fit in a u64 of nanoseconds.
    #[error("the period {period:?} is longer than u64 nanoseconds allow (about 584 years)")]
    PeriodTooLong {
        /// The period given (`Duration::MAX` when it came from text too large to hold).
        period: Duration,
    },
    /// More than one request per nanosecond: finer than the clock.
    #[error("{count} requests per {period:?} is more than one per nanosecond, finer than the clock measures")]
    TooFine {
        /// The count given.
        count: u64,
        /// The period given.
        period: Duration,
    },
    /// `burst * interval` overflows a u64 of nanoseconds.
    #[error("a burst of {burst} at one token per {interval:?} spans more than u64 nanoseconds (about 584 years)")]
    BurstTooLarge {
        /// The burst given.
        burst: u64,
        /// The emission interval of the quota.
        interval: Duration,
    },
    /// The quota cannot be represented by an algorithm's packed state.
    #[error("{algorithm} cannot hold {quota}: {reason}")]
    DoesNotFit {
        /// The algorithm (for example "fixed window").
        algorithm: &'static str,
        /// The quota, as text.
        quota: String,
        /// Why, with the bound that was exceeded.
        reason: String,
    },
}

/// A cost that no amount of waiting can ever meet. Not a denial: the
/// bucket's state is unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CostError {
    /// A cost of zero tokens asks nothing; it is refused rather than
    /// silently allowed, since it is almost always a caller's bug.
    #[error("a cost of 0 tokens is not a request")]
    Zero,
    /// The cost is larger than the limiter's capacity, the most it ever
    /// admits at once: a GCRA bucket's burst, a window's or a log's limit,
    /// and for several limits the smallest of theirs.
    #[error(
        "a cost of {cost} tokens can never be met: at most {capacity} pass at once \
         (the limiter's capacity: a bucket's burst, a window's limit)"
    )]
    ExceedsCapacity {
        /// The cost asked.
        cost: u64,
        /// The limiter's capacity: the most it ever admits at once.
        capacity: u64,
    },
}

impl CostError {
    /// A cost of `cost` against a limiter that admits at most `capacity`
    /// at once: `Ok`, or why no wait can meet it.
    #[inline]
    pub(crate) fn check(cost: u64, capacity: u64) -> Result<(), CostError> {
        match cost {
            0 => Err(CostError::Zero),
            cost if cost > capacity => Err(CostError::ExceedsCapacity { cost, capacity }),
            _ => Ok(()),
        }
    }
}

/// A list of quotas (`"10/s burst 20; 1000/h"`) that cannot be built or
/// parsed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QuotasError {
    /// No quota at all: a limiter must have at least one limit.
    #[error("empty quota list: expected QUOTA[; QUOTA...], for example \"10/s burst 20; 1000/h\"")]
    Empty,
    /// More limits than one check combines.
    #[error("{count} quotas given, at most {max} combine in one check")]
    TooMany {
        /// How many were given.
        count: usize,
        /// The most allowed.
        max: usize,
    },
    /// A running multi-limiter's quotas were changed to a list of another
    /// length: each limit keeps its buckets, so the number of limits is
    /// fixed when the limiter is built.
    #[error("{given} quotas given for a limiter of {limits} limits: change each limit's quota, in order, or build a new limiter")]
    CountChanged {
        /// How many limits the limiter has.
        limits: usize,
        /// How many quotas were given.
        given: usize,
    },
    /// One quota of the list is wrong.
    #[error("quota {} of the list ({text:?}): {source}", index + 1)]
    Quota {
        /// Its position in the list, from 0.
        index: usize,
        /// Its text.
        text: String,
        /// What is wrong with it.
        source: QuotaError,
    },
}

/// A batch of checks that cannot be decided as given. Nothing was decided
/// and no bucket changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError {
    /// The keys and their costs must come in pairs.
    #[error("{keys} keys but {costs} costs: give one cost per key")]
    LengthMismatch {
        /// Keys given.
        keys: usize,
        /// Costs given.
        costs: usize,
    },
    /// One cost can never be met (0, or above the capacity).
    #[error("the cost of key {index} of the batch (from 0): {source}")]
    Cost {
        /// The position of the first bad cost in the batch.
        index: usize,
        /// What is wrong with it.
        source: CostError,
    },
}

impl BatchError {
    /// Checks a batch before any of it is decided: one cost per key, and
    /// every cost one that `check_cost` (the limiter's algorithm) can meet.
    /// Shared by the local and the Redis batch, so both refuse alike.
    pub(crate) fn check(
        keys: usize,
        costs: &[u64],
        check_cost: impl Fn(u64) -> Result<(), CostError>,
    ) -> Result<(), BatchError> {
        if keys != costs.len() {
            return Err(BatchError::LengthMismatch {
                keys,
                costs: costs.len(),
            });
        }
        for (index, &cost) in costs.iter().enumerate() {
            check_cost(cost).map_err(|source| BatchError::Cost { index, source })?;
        }
        Ok(())
    }
}
