//! Errors: each names what is wrong, in the caller's terms.

use std::time::Duration;

/// Every unit spelling the quota grammar accepts, for its errors (the
/// grammar itself is in the docs of `crate::quota`).
const UNITS: &str = "ns; us, µs; ms; s, sec, secs, second, seconds; m, min, mins, minute, minutes; h, hr, hrs, hour, hours; d, day, days";

/// `n thing` or `n things`.
pub(crate) fn plural<N>(n: N, thing: &str) -> String
where
    N: std::fmt::Display + PartialEq + From<u8>,
{
    if n == N::from(1) {
        format!("1 {thing}")
    } else {
        format!("{n} {thing}s")
    }
}

/// The message of a quota of a list that is wrong: its place and text,
/// and the problem, without saying the text twice.
fn in_list(index: usize, text: &str, source: &QuotaError) -> String {
    let n = index + 1;
    match source {
        QuotaError::Syntax { reason, .. } => {
            format!("quota {n} of the list, {text:?}, is not a quota: {reason}")
        }
        QuotaError::Empty => format!("quota {n} of the list is empty: {source}"),
        other => format!("quota {n} of the list, {text:?}: {other}"),
    }
}

/// A quota that cannot be built or parsed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QuotaError {
    /// The text was empty.
    #[error("empty quota: expected COUNT/PERIOD, for example \"100/min\"")]
    Empty,
    /// The text does not follow the grammar.
    #[error("{text:?} is not a quota: {reason}")]
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
    #[error("the period has no unit: write one (for example \"100/min\"); the units are {UNITS}")]
    MissingUnit,
    /// The period's unit is not one we know.
    #[error("unknown time unit {unit:?}: the units are {UNITS}")]
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
    #[error("the period {period} is longer than a quota can hold: at most about 584 years (2^64 - 1 ns)")]
    PeriodTooLong {
        /// The period given: as written for a parsed quota (`1000000d`),
        /// else in whole seconds (`18446744073709551615s`).
        period: String,
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
    /// A refund of zero tokens gives nothing back; refused, as a cost of
    /// zero is, since it is almost always a caller's bug.
    #[error("a refund of 0 tokens gives nothing back")]
    ZeroRefund,
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
    /// A refund larger than the limiter's capacity: more than any check
    /// could have taken.
    #[error(
        "a refund of {refund} tokens is more than any check took: at most {capacity} \
         are taken at once (the limiter's capacity)"
    )]
    RefundAboveCapacity {
        /// The tokens to give back.
        refund: u64,
        /// The limiter's capacity: the most one check takes.
        capacity: u64,
    },
}

impl CostError {
    /// The same error about a refund of `n` tokens rather than a cost:
    /// refunds check their size by the cost rule, and say so in their own
    /// words.
    pub(crate) fn for_refund(self) -> CostError {
        match self {
            CostError::Zero => CostError::ZeroRefund,
            CostError::ExceedsCapacity { cost, capacity } => CostError::RefundAboveCapacity {
                refund: cost,
                capacity,
            },
            other => other,
        }
    }

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

/// A [`LeasedLimiter`](crate::LeasedLimiter) that cannot be built as
/// configured: each says which setting is out of range, and its range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// A lease of zero tokens leases nothing.
    #[error("a lease of 0 tokens leases nothing: give 1 for an exact limiter, or more to scale")]
    ZeroLease,
    /// A lease is taken from the bucket in one step, so it must fit in it.
    #[error(
        "a lease of {lease} tokens is above the burst ({burst}): a lease is taken from \
         the bucket in one step, so it must fit in it"
    )]
    LeaseAboveBurst {
        /// The lease asked for.
        lease: u64,
        /// The quota's burst.
        burst: u64,
    },
    /// More tokens than a stripe's lease counter holds.
    #[error("a lease of {lease} tokens is more than a stripe holds: at most {max}")]
    LeaseTooLarge {
        /// The lease asked for.
        lease: u64,
        /// The largest lease ([`MAX_LEASE`](crate::leased::MAX_LEASE)).
        max: u64,
    },
    /// A time to live too short to spend a lease in.
    #[error("a lease time to live of {ttl:?} is too short: at least {min:?}")]
    TtlTooShort {
        /// The time to live asked for.
        ttl: std::time::Duration,
        /// The shortest ([`MIN_LEASE_TTL`](crate::leased::MIN_LEASE_TTL)).
        min: std::time::Duration,
    },
    /// A time to live so long that the bound on what leases over-admit
    /// would mean nothing.
    #[error("a lease time to live of {ttl:?} is too long: at most {max:?}")]
    TtlTooLong {
        /// The time to live asked for.
        ttl: std::time::Duration,
        /// The longest ([`MAX_LEASE_TTL`](crate::leased::MAX_LEASE_TTL)).
        max: std::time::Duration,
    },
    /// A number of stripes out of range.
    #[error("{stripes} stripes: give 1 to {max}")]
    Stripes {
        /// The number asked for.
        stripes: usize,
        /// The most ([`MAX_STRIPES`](crate::leased::MAX_STRIPES)).
        max: usize,
    },
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
    #[error("{} given, at most {max} combine in one check", plural(*count, "quota"))]
    TooMany {
        /// How many were given.
        count: usize,
        /// The most allowed.
        max: usize,
    },
    /// A running multi-limiter's quotas were changed to a list of another
    /// length: each limit keeps its buckets, so the number of limits is
    /// fixed when the limiter is built.
    #[error(
        "{} given for a limiter of {}: change each limit's quota, in order, or build a new limiter",
        plural(*given, "quota"),
        plural(*limits, "limit")
    )]
    CountChanged {
        /// How many limits the limiter has.
        limits: usize,
        /// How many quotas were given.
        given: usize,
    },
    /// One quota of the list is wrong.
    #[error("{}", in_list(*index, text, source))]
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{KeyedLimiter, Quota, Quotas};

    fn quota_error(text: &str) -> String {
        text.parse::<Quota>().expect_err(text).to_string()
    }

    fn quotas_error(text: &str) -> String {
        text.parse::<Quotas>().expect_err(text).to_string()
    }

    /// Issue 37, item 6: each message the issue quoted, as it reads now.
    #[test]
    fn errors_read_as_plain_sentences() {
        assert_eq!(
            quota_error("1/1000000d"),
            "the period 1000000d is longer than a quota can hold: \
             at most about 584 years (2^64 - 1 ns)"
        );
        assert_eq!(
            Quota::new(1, Duration::from_secs(u64::MAX))
                .unwrap_err()
                .to_string(),
            "the period 18446744073709551615s is longer than a quota can hold: \
             at most about 584 years (2^64 - 1 ns)"
        );
        assert_eq!(
            quotas_error("10/s; bogus"),
            "quota 2 of the list, \"bogus\", is not a quota: \
             expected COUNT/PERIOD, for example \"100/min\""
        );
        assert_eq!(
            quota_error(" bogus "),
            "\"bogus\" is not a quota: expected COUNT/PERIOD, for example \"100/min\""
        );
        assert_eq!(
            quotas_error("10/s; 0/min"),
            "quota 2 of the list, \"0/min\": a quota must allow at least one request \
             per period (count is 0)"
        );
        assert_eq!(
            QuotasError::CountChanged {
                limits: 2,
                given: 1
            }
            .to_string(),
            "1 quota given for a limiter of 2 limits: change each limit's quota, in order, \
             or build a new limiter"
        );
        assert_eq!(
            QuotasError::CountChanged {
                limits: 1,
                given: 3
            }
            .to_string(),
            "3 quotas given for a limiter of 1 limit: change each limit's quota, in order, \
             or build a new limiter"
        );
        // A refund too large is about a refund, not a cost never met.
        let limiter = KeyedLimiter::<u64>::new("10/min".parse().unwrap());
        assert_eq!(
            limiter.refund(&1, 500).unwrap_err().to_string(),
            "a refund of 500 tokens is more than any check took: at most 10 are taken \
             at once (the limiter's capacity)"
        );
        assert_eq!(
            limiter.refund(&1, 0).unwrap_err().to_string(),
            "a refund of 0 tokens gives nothing back"
        );
        assert_eq!(
            limiter.check_n(&1, 500).unwrap_err().to_string(),
            "a cost of 500 tokens can never be met: at most 10 pass at once \
             (the limiter's capacity: a bucket's burst, a window's limit)"
        );
        assert_eq!(plural(1u64, "token"), "1 token");
        assert_eq!(plural(2usize, "token"), "2 tokens");
    }

    /// The unit errors list every spelling the grammar accepts, and every
    /// spelling they list parses: the message and the grammar cannot drift.
    #[test]
    fn unit_errors_list_every_accepted_spelling() {
        let listed: Vec<&str> = UNITS.split([';', ',']).map(str::trim).collect();
        assert_eq!(listed.len(), 22, "{listed:?}");
        for unit in &listed {
            let one: Quota = format!("1/{unit}")
                .parse()
                .unwrap_or_else(|e| panic!("{unit}: {e}"));
            assert!(one.period() > Duration::ZERO);
        }
        let unknown = quota_error("10/fortnight");
        assert!(
            unknown.starts_with("unknown time unit \"fortnight\": the units are ns; us, µs; ms;"),
            "{unknown}"
        );
        assert!(unknown.ends_with("d, day, days"), "{unknown}");
        assert!(quota_error("10/5").contains(UNITS));
        // Spellings users wrote, spaces included; "m" is a minute (as in Go
        // durations, humantime and nginx), beside "ms".
        for (text, period) in [
            ("10/sec", 1),
            ("10/minute", 60),
            ("10/m", 60),
            ("5 / min", 60),
            ("10/2 hours", 7_200),
        ] {
            let quota: Quota = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(quota.period(), Duration::from_secs(period), "{text}");
        }
        assert_eq!(
            "10/ms".parse::<Quota>().unwrap().period(),
            Duration::from_millis(1)
        );
    }
}
