//! Groups `direct/...`: one bucket, one thread, the cost of a single check.
//!
//! - `turnstile DirectLimiter::check`: the limiter on its default (quanta)
//!   clock;
//! - `floor: quanta raw + delta + CAS`: the physical floor of any such
//!   limiter, the same clock work (a raw TSC read and its conversion to
//!   nanoseconds since an origin) plus one uncontended load and
//!   `compare_exchange` on a private `AtomicU64`: what is left of a check
//!   once the decision arithmetic is free;
//! - `turnstile DirectLimiter::check (RecentClock)`: the limiter on the
//!   coarse 1 ms clock (a load instead of a TSC read);
//! - `governor direct`: `governor::RateLimiter::direct`, on its default
//!   (quanta) clock;
//! - `ratelimit`: the `ratelimit` crate's lock-free token bucket
//!   (`try_wait`, on its `std::time::Instant` clock);
//! - `seed f64 token bucket (Mutex<HashMap>)`: the seeds' design,
//!   `SeedTokenBucket`, one key.
//!
//! Two groups:
//!
//! - `direct/allowed`: every subject is set up so that (almost) every check
//!   is allowed: 1e9 per second (T = 1 ns) with a burst of one second's
//!   worth, so a check never outruns the refill, and every check writes;
//! - `direct/denied`: 1 per hour with a burst of 1, taken before timing, so
//!   every timed check is a denial (a clock read and a load, no write): the
//!   path a limiter takes under attack. The floor there is the clock read
//!   and the load.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput};
use turnstile_rl::{Clock, DirectLimiter, Quota, RecentClock};
use turnstile_test_kit::reference::SeedTokenBucket;

use crate::mode::Mode;

/// This module's quotas for each [`Mode`].
trait Setup {
    fn quota(self) -> Quota;
    fn governor(self) -> governor::Quota;
    fn ratelimit(self) -> ratelimit::Ratelimiter;
    fn seed(self) -> SeedTokenBucket<String>;
}

impl Setup for Mode {
    /// Allowed: 1e9 per second, burst 1e9 (T = 1 ns, tau = 1 s).
    /// Denied: 1 per hour, burst 1.
    fn quota(self) -> Quota {
        match self {
            Mode::Allowed => Quota::per_second(1_000_000_000).and_then(|q| q.burst(1_000_000_000)),
            Mode::Denied => Quota::per_hour(1),
        }
        .expect("a valid quota")
    }

    /// governor's quota, the same as [`Mode::quota`].
    fn governor(self) -> governor::Quota {
        match self {
            Mode::Allowed => {
                let rate = NonZeroU32::new(1_000_000_000).expect("non-zero");
                governor::Quota::per_second(rate).allow_burst(rate)
            }
            Mode::Denied => governor::Quota::per_hour(NonZeroU32::MIN),
        }
    }

    /// The `ratelimit` crate's bucket, the same as [`Mode::quota`].
    fn ratelimit(self) -> ratelimit::Ratelimiter {
        let (rate, period, tokens) = match self {
            Mode::Allowed => (1_000_000_000, Duration::from_secs(1), 1_000_000_000),
            Mode::Denied => (1, Duration::from_secs(3600), 1),
        };
        ratelimit::Ratelimiter::builder(rate)
            .period(period)
            .max_tokens(tokens)
            .initial_available(tokens)
            .build()
            .expect("a valid ratelimit bucket")
    }

    /// The seeds' bucket (capacity, tokens per second), the same as
    /// [`Mode::quota`].
    fn seed(self) -> SeedTokenBucket<String> {
        let (capacity, rate) = match self {
            Mode::Allowed => (1e9, 1e9),
            Mode::Denied => (1.0, 1.0 / 3600.0),
        };
        SeedTokenBucket::new(capacity, rate).expect("a valid capacity and rate")
    }
}

/// Something that decides one request: the subjects of the group.
trait Subject {
    fn check(&self) -> bool;
}

impl<C: Clock> Subject for DirectLimiter<C> {
    #[inline]
    fn check(&self) -> bool {
        DirectLimiter::check(self).is_allowed()
    }
}

impl Subject for governor::DefaultDirectRateLimiter {
    #[inline]
    fn check(&self) -> bool {
        governor::RateLimiter::check(self).is_ok()
    }
}

impl Subject for ratelimit::Ratelimiter {
    #[inline]
    fn check(&self) -> bool {
        self.try_wait().is_ok()
    }
}

/// The floor: a clock read as the default clock does it, and one CAS (or,
/// for denials, one load).
struct Floor {
    clock: quanta::Clock,
    origin: u64,
    state: AtomicU64,
    mode: Mode,
}

impl Subject for Floor {
    #[inline]
    fn check(&self) -> bool {
        let now = self.clock.delta_as_nanos(self.origin, self.clock.raw());
        let current = self.state.load(Ordering::Relaxed);
        if self.mode == Mode::Denied {
            // Only the first check (taken before timing) writes.
            if current > now {
                return false;
            }
            self.state.store(now + 3_600_000_000_000, Ordering::Relaxed);
            return true;
        }
        self.state
            .compare_exchange(
                current,
                current.max(now) + 1,
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_ok()
    }
}

/// The seeds' bucket on one key, looked up by `&str` as a server would.
struct Seed(SeedTokenBucket<String>);

impl Subject for Seed {
    #[inline]
    fn check(&self) -> bool {
        self.0.allow_request(black_box("user_42"), 1.0)
    }
}

fn run<S: Subject>(group: &mut BenchmarkGroup<'_, WallTime>, mode: Mode, name: &str, subject: S) {
    // Every subject must really take the mode's path: a denial writes
    // nothing, an admission writes.
    match mode {
        Mode::Allowed => assert!(
            (0..1_000).all(|_| subject.check()),
            "{name}: not every check was allowed"
        ),
        Mode::Denied => {
            let _ = subject.check();
            assert!(
                (0..1_000).all(|_| !subject.check()),
                "{name}: not every check was denied"
            );
        }
    }
    group.bench_function(name, |b| b.iter(|| black_box(black_box(&subject).check())));
}

/// The `direct/allowed` and `direct/denied` groups.
pub fn bench(c: &mut Criterion) {
    for mode in [Mode::Allowed, Mode::Denied] {
        let mut group = c.benchmark_group(format!("direct/{}", mode.name()));
        group.throughput(Throughput::Elements(1));

        let quota = mode.quota();
        run(
            &mut group,
            mode,
            "turnstile DirectLimiter::check",
            DirectLimiter::new(quota),
        );
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        let floor = Floor {
            clock,
            origin,
            state: AtomicU64::new(0),
            mode,
        };
        run(
            &mut group,
            mode,
            "floor: quanta raw + delta + CAS (load if denied)",
            floor,
        );
        let recent = DirectLimiter::builder(quota)
            .clock(RecentClock::new())
            .build();
        run(
            &mut group,
            mode,
            "turnstile DirectLimiter::check (RecentClock)",
            recent,
        );
        let governor = governor::RateLimiter::direct(mode.governor());
        run(&mut group, mode, "governor direct", governor);
        run(&mut group, mode, "ratelimit (try_wait)", mode.ratelimit());
        run(
            &mut group,
            mode,
            "seed f64 token bucket (Mutex<HashMap>)",
            Seed(mode.seed()),
        );

        group.finish();
    }
}
