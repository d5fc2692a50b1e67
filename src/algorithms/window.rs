//! What the packed window algorithms share: the horizon their window index
//! must reach, and how a quota becomes a window length and a limit.

use std::num::NonZeroU64;
use std::time::Duration;

use super::sealed::WORDS;
use crate::error::QuotaError;
use crate::quota::Quota;

/// A window algorithm's parameters (window length, limit) as the words of
/// `Sealed::to_words`.
pub(crate) fn to_words(period: NonZeroU64, limit: u64) -> [u64; WORDS] {
    [period.get(), limit, 0]
}

/// The (window length, limit) of [`to_words`]'s words (never a zero
/// length: the words are a window's own).
pub(crate) fn from_words([period, limit, _]: [u64; WORDS]) -> (NonZeroU64, u64) {
    (NonZeroU64::new(period).unwrap_or(NonZeroU64::MIN), limit)
}

/// 50 years of 365.25 days, in nanoseconds: how long after its clock's
/// origin a packed window algorithm must keep distinct window indexes.
pub(crate) const HORIZON_NANOS: u64 = 36_525 * 86_400 * 1_000_000_000 / 2;

/// The shortest period whose `2^index_bits` windows reach the horizon.
pub(crate) const fn min_period_nanos(index_bits: u32) -> u64 {
    HORIZON_NANOS.div_ceil(1 << index_bits)
}

/// The window length and limit of `quota` for a packed window algorithm
/// whose count field holds at most `max_limit` (described as `count_bits`)
/// and whose window index has `index_bits`; or why the quota does not fit.
pub(crate) fn packed_window(
    quota: &Quota,
    algorithm: &'static str,
    max_limit: u64,
    count_bits: &str,
    index_bits: u32,
) -> Result<(NonZeroU64, u64), QuotaError> {
    let does_not_fit = |reason: String| QuotaError::DoesNotFit {
        algorithm,
        quota: quota.to_string(),
        reason,
    };
    if quota.count() > max_limit {
        return Err(does_not_fit(format!(
            "a limit of {} is above the maximum of {max_limit} requests per window \
             (the count is packed in {count_bits}); use GCRA, which has no such bound",
            quota.count()
        )));
    }
    let min_period = min_period_nanos(index_bits);
    if quota.period_nanos() < min_period {
        return Err(does_not_fit(format!(
            "a window of {:?} is shorter than the minimum of {:?} (the window index is \
             packed in {index_bits} bits, and 2^{index_bits} windows must span 50 years); \
             use a longer period, or GCRA, which has no such bound",
            quota.period(),
            Duration::from_nanos(min_period)
        )));
    }
    let period = NonZeroU64::new(quota.period_nanos()).unwrap_or(NonZeroU64::MIN);
    Ok((period, quota.count()))
}

/// Nanoseconds from `now` until `time` (a u128 so products of window
/// indexes and periods never overflow), 0 if `time` is past, saturated at
/// `u64::MAX`.
pub(crate) fn nanos_until(time: u128, now: u64) -> u64 {
    u64::try_from(time.saturating_sub(u128::from(now))).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn horizon_bounds() {
        assert_eq!(min_period_nanos(39), 2_870_148);
        assert_eq!(min_period_nanos(31), 734_757_633);
        assert!(u128::from(min_period_nanos(39)) << 39 >= u128::from(HORIZON_NANOS));
        assert!(u128::from(min_period_nanos(39) - 1) << 39 < u128::from(HORIZON_NANOS));
        assert_eq!(nanos_until(5, 7), 0);
        assert_eq!(nanos_until(u128::MAX, 0), u64::MAX);
    }
}
