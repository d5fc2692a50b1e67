//! `Quota`: how many requests per period, and how many at once.
//!
//! A quota is `count` requests per `period`, with a `burst` of at most `B`
//! requests back to back. GCRA turns it into one number, the emission interval
//! `T = period / count`, rounded **up** to whole nanoseconds so that rounding
//! can never admit more than the quota. The bucket holds `B` tokens, so its
//! tolerance is `tau = B * T` nanoseconds; that product must fit in a `u64`.
//!
//! # Text form
//!
//! ```text
//! quota  := count "/" period [ "burst" count ]      (spaces allowed between tokens)
//! count  := decimal digits, 1 ..= u64::MAX
//! period := [ number ] unit                          (a missing number means 1)
//! number := digits [ "." digits ]                    ("1.5", rounded up to whole ns)
//! unit   := "ns" | "us" | "µs" | "ms"
//!         | "s" | "sec" | "secs" | "second" | "seconds"
//!         | "m" | "min" | "mins" | "minute" | "minutes"
//!         | "h" | "hr" | "hrs" | "hour" | "hours"
//!         | "d" | "day" | "days"
//! ```
//!
//! Examples: `100/min`, `10/s`, `3/1.5s`, `10/s burst 20`, `5 / 30 s`.
//! Without `burst`, the burst equals the count. [`Display`](std::fmt::Display)
//! writes the canonical form, which parses back to the same quota.

use std::fmt;
use std::num::{NonZeroU32, NonZeroU64};
use std::str::FromStr;
use std::time::Duration;

use crate::error::QuotaError;

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// A rate limit: `count` requests per `period`, with bursts of up to `burst`.
///
/// Build one with [`Quota::per_second`], [`Quota::per_minute`],
/// [`Quota::per_hour`], [`Quota::new`] or [`Quota::with_period`], adjust the
/// burst with [`Quota::burst`], or parse text such as `"10/s burst 20"`.
/// Every constructor checks its input and returns a [`QuotaError`] that names
/// the problem; none panics.
///
/// ```
/// use turnstile_rl::Quota;
/// use std::time::Duration;
///
/// let q = Quota::per_minute(100)?;
/// assert_eq!(q.emission_interval(), Duration::from_millis(600));
/// assert_eq!(q.burst_size(), 100);
///
/// let q: Quota = "10/s burst 20".parse()?;
/// assert_eq!(q, Quota::per_second(10)?.burst(20)?);
/// assert_eq!(q.to_string(), "10/s burst 20");
/// # Ok::<(), turnstile_rl::QuotaError>(())
/// ```
///
/// # Changing a quota while serving
///
/// Every limiter changes its quota through `&self`, while it serves
/// (`set_quota` on [`DirectLimiter`](crate::DirectLimiter),
/// [`KeyedLimiter`](crate::KeyedLimiter) and the Redis limiter,
/// `set_quotas` on the multi-limiters), and all follow one rule:
///
/// **A change keeps every bucket's state, its TAT (the time the bucket is
/// full again), and the new quota decides on it as on any other state.**
/// What a caller spent stays spent, as time owed: nobody gets a fresh
/// burst, and no debt is forgiven. A request of cost `n` at `now` under
/// the new `T'` and `tau' = B' * T'` waits
///
/// ```text
/// retry_after = max(TAT, now) + n*T' - now - tau'
/// ```
///
/// and is admitted when it has waited exactly that. So a caller that spent
/// more than the new burst waits until its debt is back within the new
/// tolerance: after spending 10 of `10/min` (`TAT = now + 60 s`), a change
/// to `10/min burst 2` (`tau' = 12 s`) answers 54 s, and a larger burst
/// admits at once what it can. The rule reads nothing but the state, the
/// clock and the new quota, so it needs no pass over the keys, and a fleet
/// on Redis agrees on it whenever each gateway makes the change. A check
/// reads its quota once: it is decided wholly at the old quota or wholly
/// at the new one.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    count: NonZeroU64,
    period: NonZeroU64,
    burst: NonZeroU64,
    // Invariant: interval == ceil(period / count) >= 1, and burst * interval
    // fits in a u64.
    interval: NonZeroU64,
}

impl Quota {
    /// `count` requests per `period`, burst `count`.
    pub fn new(count: u64, period: Duration) -> Result<Quota, QuotaError> {
        let count = NonZeroU64::new(count).ok_or(QuotaError::ZeroCount)?;
        let period_nanos: u64 =
            period
                .as_nanos()
                .try_into()
                .map_err(|_| QuotaError::PeriodTooLong {
                    period: format!("{period:?}"),
                })?;
        let period = NonZeroU64::new(period_nanos).ok_or(QuotaError::ZeroPeriod)?;
        Self::from_parts(count, period, count)
    }

    /// `n` requests per second, burst `n`.
    pub fn per_second(n: u64) -> Result<Quota, QuotaError> {
        Self::new(n, Duration::from_secs(1))
    }

    /// `n` requests per minute, burst `n`.
    pub fn per_minute(n: u64) -> Result<Quota, QuotaError> {
        Self::new(n, Duration::from_secs(60))
    }

    /// `n` requests per hour, burst `n`.
    pub fn per_hour(n: u64) -> Result<Quota, QuotaError> {
        Self::new(n, Duration::from_secs(3600))
    }

    /// One request per `period`, burst 1.
    pub fn with_period(period: Duration) -> Result<Quota, QuotaError> {
        Self::new(1, period)
    }

    /// The same rate with a burst of `burst` requests back to back.
    pub fn burst(self, burst: u64) -> Result<Quota, QuotaError> {
        let burst = NonZeroU64::new(burst).ok_or(QuotaError::ZeroBurst)?;
        Self::from_parts(self.count, self.period, burst)
    }

    /// `n` requests per second, burst `n`, as a `const fn` on a non-zero
    /// count, so a quota can be a `const` or a `static`. Infallible: a
    /// count above 1,000,000,000 a second (one per nanosecond, the clock's
    /// resolution) is held at that.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use turnstile_rl::{DirectLimiter, Quota};
    ///
    /// const LOGIN: Quota = Quota::const_per_minute(NonZeroU32::new(5).unwrap());
    /// static API: Quota = Quota::const_per_second(NonZeroU32::new(10).unwrap())
    ///     .const_burst(NonZeroU32::new(20).unwrap())
    ///     .unwrap(); // None only if burst x interval overflows: a compile error here
    ///
    /// assert_eq!(LOGIN, "5/min".parse()?);
    /// assert_eq!(API, "10/s burst 20".parse()?);
    /// let limiter = DirectLimiter::new(API);
    /// assert!(limiter.check().is_allowed());
    /// # Ok::<(), turnstile_rl::QuotaError>(())
    /// ```
    pub const fn const_per_second(n: NonZeroU32) -> Quota {
        Self::of_rate(n, NANOS_PER_SEC)
    }

    /// `n` requests per minute, burst `n`: [`const_per_second`](Quota::const_per_second)'s
    /// minute.
    pub const fn const_per_minute(n: NonZeroU32) -> Quota {
        Self::of_rate(n, 60 * NANOS_PER_SEC)
    }

    /// `n` requests per hour, burst `n`: [`const_per_second`](Quota::const_per_second)'s
    /// hour.
    pub const fn const_per_hour(n: NonZeroU32) -> Quota {
        Self::of_rate(n, 3_600 * NANOS_PER_SEC)
    }

    /// `n` requests per day, burst `n`: [`const_per_second`](Quota::const_per_second)'s
    /// day.
    pub const fn const_per_day(n: NonZeroU32) -> Quota {
        Self::of_rate(n, 86_400 * NANOS_PER_SEC)
    }

    /// The same rate with a burst of `burst`, as a `const fn`: `None` when
    /// `burst` emission intervals overflow u64 nanoseconds (about 584
    /// years; a `const` that unwraps it then fails to compile). Beside
    /// [`burst`](Quota::burst), which says why in a [`QuotaError`].
    pub const fn const_burst(self, burst: NonZeroU32) -> Option<Quota> {
        let burst = burst.get() as u64;
        match (
            self.interval.get().checked_mul(burst),
            NonZeroU64::new(burst),
        ) {
            (Some(_), Some(burst)) => Some(Quota { burst, ..self }),
            _ => None,
        }
    }

    /// `n` per `period` nanoseconds (a whole unit, at least a second),
    /// burst `n`, holding `n` at one per nanosecond.
    const fn of_rate(n: NonZeroU32, period: u64) -> Quota {
        let n = n.get() as u64;
        let count = if n < period { n } else { period };
        // count >= 1 and period >= count, so each is non-zero and the
        // interval ceil(period / count) is at least 1; burst (= count) times
        // the interval is below period + count, which fits.
        let one = NonZeroU64::MIN;
        let count = match NonZeroU64::new(count) {
            Some(count) => count,
            None => one,
        };
        let period = match NonZeroU64::new(period) {
            Some(period) => period,
            None => one,
        };
        let interval = match NonZeroU64::new(period.get().div_ceil(count.get())) {
            Some(interval) => interval,
            None => one,
        };
        Quota {
            count,
            period,
            burst: count,
            interval,
        }
    }

    /// The quota of a bucket of `burst` tokens that refills one token per
    /// `interval` nanoseconds: `burst` per `burst * interval`. Exact for
    /// what GCRA keeps of a quota (the caller guarantees the product fits,
    /// as every [`Gcra`](crate::Gcra) does).
    pub(crate) fn of_bucket(burst: NonZeroU64, interval: NonZeroU64) -> Quota {
        // Invariant kept: ceil(burst * interval / burst) == interval.
        let period = burst.saturating_mul(interval);
        Quota {
            count: burst,
            period,
            burst,
            interval,
        }
    }

    fn from_parts(
        count: NonZeroU64,
        period: NonZeroU64,
        burst: NonZeroU64,
    ) -> Result<Quota, QuotaError> {
        if count > period {
            return Err(QuotaError::TooFine {
                count: count.get(),
                period: Duration::from_nanos(period.get()),
            });
        }
        // `count <= period`, so the quotient is at least 1.
        let interval =
            NonZeroU64::new(period.get().div_ceil(count.get())).ok_or(QuotaError::ZeroPeriod)?;
        if burst.get().checked_mul(interval.get()).is_none() {
            return Err(QuotaError::BurstTooLarge {
                burst: burst.get(),
                interval: Duration::from_nanos(interval.get()),
            });
        }
        Ok(Quota {
            count,
            period,
            burst,
            interval,
        })
    }

    /// Requests allowed per [`period`](Quota::period) on average.
    pub fn count(&self) -> u64 {
        self.count.get()
    }

    /// The period over which [`count`](Quota::count) requests are allowed.
    pub fn period(&self) -> Duration {
        Duration::from_nanos(self.period.get())
    }

    /// The most requests allowed back to back (the bucket's capacity, `B`).
    pub fn burst_size(&self) -> u64 {
        self.burst.get()
    }

    /// The emission interval `T`: one token comes back every `T`.
    pub fn emission_interval(&self) -> Duration {
        Duration::from_nanos(self.interval.get())
    }

    /// `T` in nanoseconds.
    pub(crate) fn interval_nanos(&self) -> u64 {
        self.interval.get()
    }

    /// The period in nanoseconds.
    pub(crate) fn period_nanos(&self) -> u64 {
        self.period.get()
    }

    /// `tau = B * T` in nanoseconds: how far ahead of now the bucket's
    /// theoretical arrival time may run. Always fits (checked at construction).
    pub(crate) fn tolerance_nanos(&self) -> u64 {
        self.burst.get() * self.interval.get()
    }
}

/// The parts as durations (`period: 60s, interval: 1.2s`), not the
/// nanoseconds they are stored in.
impl fmt::Debug for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Quota")
            .field("count", &self.count)
            .field("period", &self.period())
            .field("burst", &self.burst)
            .field("interval", &self.emission_interval())
            .finish()
    }
}

impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/", self.count)?;
        write_period(f, self.period.get())?;
        if self.burst != self.count {
            write!(f, " burst {}", self.burst)?;
        }
        Ok(())
    }
}

/// Units for display, largest first, with their length in nanoseconds.
const DISPLAY_UNITS: [(&str, u64); 7] = [
    ("d", 86_400 * NANOS_PER_SEC),
    ("h", 3_600 * NANOS_PER_SEC),
    ("min", 60 * NANOS_PER_SEC),
    ("s", NANOS_PER_SEC),
    ("ms", 1_000_000),
    ("us", 1_000),
    ("ns", 1),
];

fn write_period(f: &mut fmt::Formatter<'_>, nanos: u64) -> fmt::Result {
    // The largest unit that divides the period exactly; "ns" always does.
    let (unit, len) = DISPLAY_UNITS
        .iter()
        .copied()
        .find(|&(_, len)| nanos.is_multiple_of(len))
        .unwrap_or(("ns", 1));
    match nanos / len {
        1 => write!(f, "{unit}"),
        n => write!(f, "{n}{unit}"),
    }
}

impl FromStr for Quota {
    type Err = QuotaError;

    fn from_str(text: &str) -> Result<Quota, QuotaError> {
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(QuotaError::Empty);
        }
        let (count, rest) = trimmed.split_once('/').ok_or_else(|| QuotaError::Syntax {
            text: trimmed.to_owned(),
            reason: "expected COUNT/PERIOD, for example \"100/min\"",
        })?;
        let count = parse_count(count.trim(), "count")?;
        let rest = rest.trim();
        let (period, burst) = match rest.find("burst") {
            Some(at) => {
                let burst = parse_count(rest[at + "burst".len()..].trim(), "burst")?;
                (rest[..at].trim(), Some(burst))
            }
            None => (rest, None),
        };
        let period = parse_period(period)?;
        let quota = Quota::new(count, period)?;
        match burst {
            Some(burst) => quota.burst(burst),
            None => Ok(quota),
        }
    }
}

fn parse_count(text: &str, what: &'static str) -> Result<u64, QuotaError> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(QuotaError::BadNumber {
            what,
            text: text.to_owned(),
        });
    }
    text.parse().map_err(|_| QuotaError::BadNumber {
        what,
        text: text.to_owned(),
    })
}

/// Parses `[number] unit` exactly, on integers: `1.5min` is 90 s.
fn parse_period(text: &str) -> Result<Duration, QuotaError> {
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = (text[..split].trim(), text[split..].trim());
    let unit_nanos = unit_nanos(unit)?;
    if number.is_empty() {
        return Ok(Duration::from_nanos(unit_nanos));
    }
    let bad = || QuotaError::BadNumber {
        what: "period",
        text: number.to_owned(),
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
        return Err(bad());
    }
    // value = (whole * 10^k + fraction) / 10^k units; keep it a fraction of
    // u128 integers and round the nanoseconds up. More than 30 fraction digits
    // cannot matter at nanosecond resolution: keep 30, then round up.
    let fraction = &fraction[..fraction.len().min(30)];
    let scale = 10u128.pow(fraction.len() as u32);
    let digits = |s: &str| -> Result<u128, QuotaError> {
        match s {
            "" => Ok(0),
            s => s.parse::<u128>().map_err(|_| bad()),
        }
    };
    let (whole, fraction) = (digits(whole)?, digits(fraction)?);
    let too_long = QuotaError::PeriodTooLong {
        period: text.to_owned(),
    };
    let numerator = whole
        .checked_mul(scale)
        .and_then(|w| w.checked_add(fraction))
        .and_then(|n| n.checked_mul(u128::from(unit_nanos)))
        .ok_or(too_long.clone())?;
    let nanos = numerator.div_ceil(scale);
    let nanos = u64::try_from(nanos).map_err(|_| too_long)?;
    Ok(Duration::from_nanos(nanos))
}

fn unit_nanos(unit: &str) -> Result<u64, QuotaError> {
    Ok(match unit {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" | "sec" | "secs" | "second" | "seconds" => NANOS_PER_SEC,
        "m" | "min" | "mins" | "minute" | "minutes" => 60 * NANOS_PER_SEC,
        "h" | "hr" | "hrs" | "hour" | "hours" => 3_600 * NANOS_PER_SEC,
        "d" | "day" | "days" => 86_400 * NANOS_PER_SEC,
        "" => return Err(QuotaError::MissingUnit),
        other => {
            return Err(QuotaError::UnknownUnit {
                unit: other.to_owned(),
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(text: &str) -> Result<Quota, QuotaError> {
        text.parse()
    }

    #[test]
    fn constructors_round_the_interval_up() {
        let q = Quota::per_second(3).unwrap();
        assert_eq!(q.interval_nanos(), 333_333_334);
        assert_eq!(q.tolerance_nanos(), 1_000_000_002);
        assert_eq!(
            Quota::per_minute(100).unwrap().interval_nanos(),
            600_000_000
        );
        assert_eq!(
            Quota::per_hour(1).unwrap().period(),
            Duration::from_secs(3600)
        );
        let q = Quota::with_period(Duration::from_millis(250)).unwrap();
        assert_eq!((q.count(), q.burst_size()), (1, 1));
        assert_eq!(q.emission_interval(), Duration::from_millis(250));
    }

    #[test]
    fn grammar_examples() {
        assert_eq!(q("100/min").unwrap(), Quota::per_minute(100).unwrap());
        assert_eq!(q("10/s").unwrap(), Quota::per_second(10).unwrap());
        let three = q("3/1.5s").unwrap();
        assert_eq!(three.period(), Duration::from_millis(1500));
        assert_eq!(three.emission_interval(), Duration::from_millis(500));
        assert_eq!(
            q("10/s burst 20").unwrap(),
            Quota::per_second(10).unwrap().burst(20).unwrap()
        );
        assert_eq!(
            q(" 5 / 30 seconds ").unwrap().period(),
            Duration::from_secs(30)
        );
        assert_eq!(q("1/1.5min").unwrap().period(), Duration::from_secs(90));
        assert_eq!(q("7/.5s").unwrap().period(), Duration::from_millis(500));
        assert_eq!(q("1/2d").unwrap().period(), Duration::from_secs(172_800));
        // 1/3 ns is not a whole nanosecond: rounded up, never down.
        assert_eq!(
            q("1/0.0000000001s").unwrap().period(),
            Duration::from_nanos(1)
        );
    }

    /// Issue 37, item 8: the const constructors build the quota the
    /// fallible ones and the parser do, and hold a count above one per
    /// nanosecond at that.
    #[test]
    fn const_constructors_match_the_parser() {
        let nz = |n| NonZeroU32::new(n).unwrap();
        for (quota, text) in [
            (Quota::const_per_second(nz(3)), "3/s"),
            (Quota::const_per_minute(nz(100)), "100/min"),
            (Quota::const_per_hour(nz(1)), "1/h"),
            (Quota::const_per_day(nz(u32::MAX)), "4294967295/d"),
            (Quota::const_per_second(nz(u32::MAX)), "1000000000/s"),
            (
                Quota::const_per_second(nz(10)).const_burst(nz(20)).unwrap(),
                "10/s burst 20",
            ),
        ] {
            assert_eq!(quota, q(text).unwrap(), "{text}");
            assert_eq!(quota.to_string(), text);
        }
        // 1/day's interval is 86,400 s: a burst of u32::MAX of those
        // overflows u64 nanoseconds.
        assert_eq!(Quota::const_per_day(nz(1)).const_burst(nz(u32::MAX)), None);
        assert!(q("1/d").unwrap().burst(u64::from(u32::MAX)).is_err());
    }

    /// Issue 37, item 7: durations, not raw nanoseconds.
    #[test]
    fn debug_shows_durations() {
        assert_eq!(
            format!("{:?}", q("50/min").unwrap()),
            "Quota { count: 50, period: 60s, burst: 50, interval: 1.2s }"
        );
        assert_eq!(
            format!("{:?}", q("3/s burst 6").unwrap()),
            "Quota { count: 3, period: 1s, burst: 6, interval: 333.333334ms }"
        );
    }

    #[test]
    fn display_is_canonical_and_round_trips() {
        for (text, shown) in [
            ("100/min", "100/min"),
            ("10/s", "10/s"),
            ("3/1.5s", "3/1500ms"),
            ("10/s burst 20", "10/s burst 20"),
            ("5/30seconds", "5/30s"),
            ("1/90s", "1/90s"),
            ("2/120min", "2/2h"),
            ("7/9ns", "7/9ns"),
        ] {
            let quota = q(text).unwrap();
            assert_eq!(quota.to_string(), shown, "{text}");
            assert_eq!(q(shown).unwrap(), quota, "{shown}");
        }
    }

    #[test]
    fn bad_input_is_a_typed_error_that_names_the_problem() {
        assert_eq!(q(""), Err(QuotaError::Empty));
        assert_eq!(q("   "), Err(QuotaError::Empty));
        assert!(matches!(q("100"), Err(QuotaError::Syntax { .. })));
        assert_eq!(q("0/s"), Err(QuotaError::ZeroCount));
        assert_eq!(q("1/0s"), Err(QuotaError::ZeroPeriod));
        assert_eq!(q("10/s burst 0"), Err(QuotaError::ZeroBurst));
        assert_eq!(q("10/"), Err(QuotaError::MissingUnit));
        assert_eq!(q("10/5"), Err(QuotaError::MissingUnit));
        assert_eq!(
            q("10/fortnight"),
            Err(QuotaError::UnknownUnit {
                unit: "fortnight".into()
            })
        );
        assert!(matches!(
            q("-1/s"),
            Err(QuotaError::BadNumber { what: "count", .. })
        ));
        assert!(matches!(q("ten/s"), Err(QuotaError::BadNumber { .. })));
        assert!(matches!(q("1/1.2.3s"), Err(QuotaError::BadNumber { .. })));
        assert!(matches!(q("1/.s"), Err(QuotaError::BadNumber { .. })));
        assert!(matches!(
            q("10/s burst x"),
            Err(QuotaError::BadNumber { what: "burst", .. })
        ));
        assert!(matches!(
            q("99999999999999999999/s"),
            Err(QuotaError::BadNumber { .. })
        ));
        assert!(matches!(
            q("1/99999999999d"),
            Err(QuotaError::PeriodTooLong { .. })
        ));
        assert!(matches!(q("2000000000/s"), Err(QuotaError::TooFine { .. })));
        assert!(matches!(
            q("1/s burst 18446744073709551615"),
            Err(QuotaError::BurstTooLarge { .. })
        ));
        let message = q("10/fortnight").unwrap_err().to_string();
        assert!(message.contains("fortnight"), "{message}");
    }

    #[test]
    fn extreme_constructor_inputs_never_panic() {
        assert_eq!(Quota::per_second(0), Err(QuotaError::ZeroCount));
        assert!(Quota::new(1, Duration::MAX).is_err());
        assert!(Quota::new(u64::MAX, Duration::from_nanos(u64::MAX)).is_ok());
        assert!(Quota::with_period(Duration::ZERO).is_err());
        let one = Quota::per_second(1).unwrap();
        assert!(one.burst(u64::MAX).is_err());
        assert_eq!(
            one.burst(18_446_744_073).unwrap().burst_size(),
            18_446_744_073
        );
    }
}
