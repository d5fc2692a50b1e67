//! Clocks: where "now" comes from, in nanoseconds since the clock's origin.
//!
//! | clock            | cost of a reading | resolution | safe when                                   |
//! |------------------|-------------------|------------|---------------------------------------------|
//! | [`QuantaClock`]  | one TSC read, scaled: cheaper than `Instant` | ~1 ns      | the TSC is invariant and synchronised across cores (any x86 server of the last decade; quanta falls back to `CLOCK_MONOTONIC` by itself where there is no usable TSC) |
//! | [`RecentClock`]  | one atomic load: the cheapest | [`RECENT_CLOCK_TICK`] | a decision may be up to one upkeep tick late: fine for quotas whose interval is much longer than that tick |
//! | [`MonotonicClock`] | an OS clock read (`std::time::Instant`): the dearest | ~1 ns      | always: `std::time::Instant` is monotonic by contract; pick it where the TSC cannot be trusted (some VMs, old multi-socket boxes) |
//! | [`ManualClock`]  | one atomic load   | exact      | tests and simulations: time moves only when you move it |
//!
//! The clock read is most of what a check costs: the measured figures, a
//! check on [`RecentClock`] beside one on the TSC, are in the repository's
//! `BENCHMARKS.md`.
//!
//! # A clock that steps backwards
//!
//! TSC readings are not always monotonic across cores (governor users saw
//! spurious denials from this, governor issue #299). GCRA is robust to it by
//! construction: on a bucket it finds, a reading `d` nanoseconds in the past
//! can only make the bucket look *more* used (`TAT - now` grows by `d`), so
//! it grants no token there, and it shifts the decision by at most `d`. The
//! next correct reading restores exact behaviour; no state is corrupted.
//!
//! The one way a late reading can grant is through a bucket that is no
//! longer there. A keyed limiter forgets a key as idle at one thread's
//! reading; a check of that key whose reading is `d` behind starts a fresh
//! bucket at its own reading, and so can admit at most `d / T` more
//! requests than the quota (`T` the emission interval), once. The bound and
//! why it holds are in [`keyed`](crate::keyed)'s "Clocks and eviction".

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::sync::{AtomicU64, Ordering};

/// A source of time for a limiter: nanoseconds since this clock's origin.
///
/// Readings should never decrease; if one does (see the module docs), the
/// limiter denies rather than grants, except for the bounded extra a keyed
/// limiter may admit on a key just evicted by a later reading. Implement it for your own time source
/// (a simulation, a shared coarse clock) as needed.
pub trait Clock: Send + Sync {
    /// Nanoseconds elapsed since this clock's origin.
    fn now(&self) -> u64;
}

/// The clock a limiter uses unless told otherwise.
pub type DefaultClock = QuantaClock;

/// The TSC through `quanta`: cheaper to read than `std::time::Instant`,
/// and the clock read is most of a check (figures: `BENCHMARKS.md`).
///
/// On x86-64, where quanta reads the TSC, the reading is taken inline
/// (one `rdtsc`, a subtraction and a multiply) with quanta's calibration:
/// `quanta::Clock::raw` is not `#[inline]`, so through it every check
/// paid a call and a match on quanta's clock kind (issue 34's profile
/// found it as a symbol of its own). Anywhere else, and where quanta fell
/// back to the OS clock, readings go through quanta.
#[derive(Clone, Debug)]
pub struct QuantaClock {
    clock: quanta::Clock,
    origin: u64,
    /// Nanoseconds per 2^[`SCALE_SHIFT`] ticks when quanta's clock is the
    /// TSC and this clock reads it inline; 0 otherwise.
    tsc_scale: u64,
}

/// The fixed-point shift of [`QuantaClock`]'s inline scale: 2^40 ticks
/// (about seven minutes at 2.6 GHz) keep the rounding of quanta's scale
/// below a nanosecond per seven minutes.
const SCALE_SHIFT: u32 = 40;

impl QuantaClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let tsc_scale = if tsc::is_source_of(&clock) {
            clock.delta_as_nanos(0, 1 << SCALE_SHIFT)
        } else {
            0
        };
        let origin = clock.raw();
        QuantaClock {
            clock,
            origin,
            tsc_scale,
        }
    }
}

impl Default for QuantaClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for QuantaClock {
    #[inline]
    fn now(&self) -> u64 {
        if self.tsc_scale != 0 {
            // A reading behind the origin (another core's TSC) counts as 0,
            // as quanta's `delta_as_nanos` counts it.
            return scale(tsc::read().saturating_sub(self.origin), self.tsc_scale);
        }
        self.clock.delta_as_nanos(self.origin, self.clock.raw())
    }
}

/// `ticks` of the TSC in nanoseconds, at `tsc_scale` nanoseconds per
/// 2^[`SCALE_SHIFT`] ticks.
#[inline(always)]
fn scale(ticks: u64, tsc_scale: u64) -> u64 {
    ((u128::from(ticks) * u128::from(tsc_scale)) >> SCALE_SHIFT) as u64
}

/// The time stamp counter read inline, where there is one to read.
mod tsc {
    /// Whether `clock`'s raw readings are the TSC's: three of them, each
    /// between two readings of the TSC. quanta reads the TSC with a plain
    /// `rdtsc` when it can, and `CLOCK_MONOTONIC` (nanoseconds, another
    /// scale) when it cannot, which falls between two close TSC readings
    /// by chance alone, and not three times over.
    pub(super) fn is_source_of(clock: &quanta::Clock) -> bool {
        cfg!(all(target_arch = "x86_64", not(miri)))
            && (0..3).all(|_| {
                let before = read();
                let raw = clock.raw();
                before <= raw && raw <= read()
            })
    }

    /// One TSC reading (0 where this build reads none, a value
    /// [`is_source_of`] never accepts).
    #[inline(always)]
    pub(super) fn read() -> u64 {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        // SAFETY: `rdtsc` is part of x86-64's baseline: every x86-64 CPU
        // executes it, and it only reads a counter into registers.
        return unsafe { core::arch::x86_64::_rdtsc() };
        #[cfg(not(all(target_arch = "x86_64", not(miri))))]
        0
    }
}

/// `quanta`'s "recent" time: one shared value that an upkeep thread refreshes
/// every [`RECENT_CLOCK_TICK`], so a reading is a single load (figures:
/// `BENCHMARKS.md`).
///
/// The upkeep thread is started once per process by the first `RecentClock`
/// and runs until the process exits. If your program already runs a
/// `quanta::Upkeep`, that one keeps the time current and none is started.
/// Decisions are up to one tick late: use it where quotas have intervals far
/// longer than [`RECENT_CLOCK_TICK`] and every nanosecond of the check
/// counts.
#[derive(Clone, Debug)]
pub struct RecentClock {
    clock: quanta::Clock,
    origin: quanta::Instant,
}

/// The process-wide upkeep: kept for the life of the process.
static UPKEEP: OnceLock<Option<quanta::Handle>> = OnceLock::new();

/// How often the upkeep thread refreshes the recent time.
pub const RECENT_CLOCK_TICK: Duration = Duration::from_millis(1);

impl RecentClock {
    /// Starts the upkeep thread if no one has, and makes a clock whose origin
    /// is now.
    pub fn new() -> Self {
        // `UpkeepRunning` means someone else's upkeep keeps the time current,
        // which serves as well; a failed spawn leaves `recent` at the last
        // value set, which `start` sets to now, so readings stay sane.
        UPKEEP.get_or_init(|| quanta::Upkeep::new(RECENT_CLOCK_TICK).start().ok());
        let clock = quanta::Clock::new();
        let origin = clock.now();
        RecentClock { clock, origin }
    }
}

impl Default for RecentClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for RecentClock {
    #[inline]
    fn now(&self) -> u64 {
        let elapsed = self.clock.recent().saturating_duration_since(self.origin);
        saturating_nanos(elapsed)
    }
}

/// `std::time::Instant`: monotonic by contract on every platform, for
/// machines whose TSC cannot be trusted. Dearer to read than the TSC.
#[derive(Clone, Copy, Debug)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        MonotonicClock {
            origin: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now(&self) -> u64 {
        saturating_nanos(self.origin.elapsed())
    }
}

/// A clock that moves only when told to: for tests, simulations and your
/// own tests of code that uses turnstile.
///
/// Clones share one time, so a test keeps a clone and moves the time of the
/// limiter that holds the other.
///
/// ```
/// use turnstile_rl::{DirectLimiter, ManualClock, Quota};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let limiter = DirectLimiter::builder(Quota::per_second(1)?).clock(clock.clone()).build();
/// assert!(limiter.check().is_allowed());
/// assert!(limiter.check().is_denied());
/// clock.advance(Duration::from_secs(1));
/// assert!(limiter.check().is_allowed());
/// # Ok::<(), turnstile_rl::QuotaError>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock at time zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// A clock at `time` after its origin.
    pub fn starting_at(time: Duration) -> Self {
        let clock = Self::new();
        clock.set(time);
        clock
    }

    /// Moves time forward by `by` (saturating at `u64::MAX` nanoseconds).
    pub fn advance(&self, by: Duration) {
        let by = saturating_nanos(by);
        // Relaxed: the clock publishes only its own value.
        let _ = self
            .nanos
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some(t.saturating_add(by))
            });
    }

    /// Sets the time, forwards or backwards (to test a clock that steps back).
    pub fn set(&self, time: Duration) {
        self.nanos.store(saturating_nanos(time), Ordering::Relaxed);
    }

    /// Sets the time in nanoseconds since the origin.
    pub fn set_nanos(&self, nanos: u64) {
        self.nanos.store(nanos, Ordering::Relaxed);
    }

    /// The current time since the origin.
    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.now())
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now(&self) -> u64 {
        self.nanos.load(Ordering::Relaxed)
    }
}

/// `d` in whole nanoseconds, `u64::MAX` for anything longer (584 years).
pub(crate) fn saturating_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_clones_share_time_and_saturate() {
        let clock = ManualClock::new();
        let other = clock.clone();
        clock.advance(Duration::from_millis(5));
        assert_eq!(other.now(), 5_000_000);
        other.set(Duration::from_millis(1));
        assert_eq!(clock.elapsed(), Duration::from_millis(1));
        clock.advance(Duration::MAX);
        assert_eq!(clock.now(), u64::MAX);
        clock.advance(Duration::from_secs(1));
        assert_eq!(clock.now(), u64::MAX);
        clock.set(Duration::MAX);
        assert_eq!(clock.now(), u64::MAX);
    }

    #[test]
    fn the_inline_tsc_scale_agrees_with_quantas() {
        let clock = quanta::Clock::new();
        let tsc_scale = clock.delta_as_nanos(0, 1 << SCALE_SHIFT);
        for ticks in [
            1,
            999,
            2_600_000_000,
            1 << 40,
            3_600 * 5_000_000_000,
            1 << 62,
        ] {
            let quantas = clock.delta_as_nanos(0, ticks);
            let ours = scale(ticks, tsc_scale);
            // One nanosecond of rounding per 2^40 ticks, and one more.
            let tolerance = (ticks >> SCALE_SHIFT) + 1;
            assert!(
                ours.abs_diff(quantas) <= tolerance,
                "{ticks} ticks: {ours} ns inline, {quantas} ns by quanta"
            );
        }
    }

    #[test]
    fn real_clocks_start_near_zero_and_move_forward() {
        let clocks: [Box<dyn Clock>; 3] = [
            Box::new(QuantaClock::new()),
            Box::new(MonotonicClock::new()),
            Box::new(RecentClock::new()),
        ];
        for clock in &clocks {
            let first = clock.now();
            std::thread::sleep(Duration::from_millis(5));
            let second = clock.now();
            assert!(first < Duration::from_secs(1).as_nanos() as u64);
            assert!(second > first, "{first} then {second}");
        }
    }
}
