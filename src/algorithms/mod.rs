//! The classic alternatives to GCRA (fixed window, sliding-window counter,
//! sliding log), behind the same [`Decision`](crate::Decision).
//!
//! GCRA ([`Gcra`](crate::Gcra)) is the default and the one to pick unless
//! you have a reason not to. These are here for comparison, and for users
//! whose clients already expect window semantics.
//!
//! | algorithm | state per key | at a window boundary | bursts |
//! |-----------|---------------|----------------------|--------|
//! | [`Gcra`](crate::Gcra) | one `u64` (packed cell) | no boundary: tokens come back one every `T` | up to the quota's `burst`, then one per `T` |
//! | [`FixedWindow`] | one `u64` (packed cell): window index (39 bits) and count (24 bits) | the count starts afresh, so `2 * limit` can pass in a moment straddling it | the whole `limit` at once, anywhere in the window |
//! | [`SlidingWindow`] | one `u64` (packed cell): window index (31 bits), previous and current counts (16 bits each) | the previous window's count fades out linearly, so the spike is gone; it is an estimate that assumes the previous window's requests were spread evenly | `limit` at once from an idle start, then as the estimate allows |
//! | [`SlidingLog`] | one entry per distinct request time, up to `limit` entries of 16 bytes, behind a `Mutex` | exact: no more than `limit` in any window of one period | the whole `limit` at once, then each slot frees exactly one period after it was taken |
//!
//! The seed scenario, limit 100 a minute with 150 requests at 59.9 s and 150
//! at 60.1 s: the fixed window admits 200 (100 in each minute), GCRA, the
//! sliding log and the sliding-window counter admit 100.
//!
//! # Quotas for windows
//!
//! A window algorithm counts [`Quota::count`](crate::Quota::count) requests
//! per [`Quota::period`](crate::Quota::period); the quota's burst is a GCRA
//! notion and is ignored. `"100/min burst 10"` is a window of one minute and
//! a limit of 100.
//!
//! # The horizon
//!
//! The packed algorithms store the window index `now / period` in a fixed
//! number of bits, and an index must never wrap around to alias an old
//! window. So `period * 2^bits` must reach a horizon of 50 years (of 365.25
//! days) of clock time: the fixed window (39 bits) needs a period of at least
//! about 2.87 ms, the sliding window (31 bits) at least about 0.735 s. A
//! shorter period is a [`QuotaError::DoesNotFit`](crate::QuotaError) at
//! construction. A clock that does run past `2^bits` windows gets denials,
//! never a wrapped index.

mod fixed_window;
mod sliding_log;
mod sliding_window;

use std::num::NonZeroU64;
use std::time::Duration;

use crate::{Quota, QuotaError};

pub use crate::algorithm::Step;
pub use fixed_window::FixedWindow;
pub use sliding_log::SlidingLog;
pub use sliding_window::SlidingWindow;

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
