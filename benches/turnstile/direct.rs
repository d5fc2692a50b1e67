//! Group `direct`: one bucket, one thread, the cost of a single check.
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
//! - `seed f64 token bucket (Mutex<HashMap>)`: the seeds' design,
//!   `SeedTokenBucket`, one key.
//!
//! Every subject is set up so that (almost) every check is allowed: 1e9 per
//! second (T = 1 ns) with a burst of one second's worth, so a check never
//! outruns the refill and the denial path, which writes nothing, does not
//! flatter the figures.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput};
use turnstile::reference::SeedTokenBucket;
use turnstile::{Clock, DirectLimiter, Quota, RecentClock};

/// 1e9 requests per second, burst 1e9: T = 1 ns, tau = 1 s.
fn quota() -> Quota {
    Quota::per_second(1_000_000_000)
        .and_then(|q| q.burst(1_000_000_000))
        .expect("a valid quota")
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

/// The floor: a clock read as the default clock does it, and one CAS.
struct Floor {
    clock: quanta::Clock,
    origin: u64,
    state: AtomicU64,
}

impl Subject for Floor {
    #[inline]
    fn check(&self) -> bool {
        let now = self.clock.delta_as_nanos(self.origin, self.clock.raw());
        let current = self.state.load(Ordering::Relaxed);
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

fn run<S: Subject>(group: &mut BenchmarkGroup<'_, WallTime>, name: &str, subject: S) {
    // Every subject must really be admitting: a denial is a different path.
    assert!(
        (0..1_000).all(|_| subject.check()),
        "{name}: not every check was allowed"
    );
    group.bench_function(name, |b| b.iter(|| black_box(black_box(&subject).check())));
}

/// The `direct` group.
pub fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("direct");
    group.throughput(Throughput::Elements(1));

    run(
        &mut group,
        "turnstile DirectLimiter::check",
        DirectLimiter::new(quota()),
    );
    let clock = quanta::Clock::new();
    let origin = clock.raw();
    run(
        &mut group,
        "floor: quanta raw + delta + CAS",
        Floor {
            clock,
            origin,
            state: AtomicU64::new(0),
        },
    );
    run(
        &mut group,
        "turnstile DirectLimiter::check (RecentClock)",
        DirectLimiter::with_clock(quota(), RecentClock::new()),
    );
    let seed = SeedTokenBucket::new(1e9, 1e9).expect("a valid capacity and rate");
    run(
        &mut group,
        "seed f64 token bucket (Mutex<HashMap>)",
        Seed(seed),
    );

    group.finish();
}
