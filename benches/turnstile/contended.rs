//! Groups `contended/...`: one bucket checked by every thread at once (one
//! limit for a whole service, checked by every worker), turnstile beside
//! governor and the floor in the same group, so the ratios come from one
//! run. Two threads, the whole of this project's 2-core guests, and one
//! thread for the direct subjects (`contended/<mode>/1 thread`): the
//! leased limiter's scaling is the ratio of the two.
//!
//! Subjects:
//!
//! - `turnstile DirectLimiter` / `governor, one bucket`
//!   (`RateLimiter::direct`): one bucket;
//! - `turnstile LeasedLimiter`: the same bucket, leased per stripe
//!   (`src/leased.rs`: adaptive leases of at most 64 tokens, the default
//!   time to live); its over-admission is measured apart
//!   (`examples/instructions leased-over-admission`), since here every
//!   check is admitted;
//! - `turnstile KeyedLimiter, 1 hot key` / `governor DashMap ahash, 1 hot
//!   key`: every thread checks the same key;
//!
//! (No row name holds "direct" or "keyed", so the `-- direct` and `--
//! keyed` filters keep meaning their own groups.)
//! - `floor: CAS loop on one word`: a quanta clock read and GCRA's CAS
//!   loop on one shared `AtomicU64`, nothing else: what one line moving
//!   between cores allows.
//!
//! Modes (every check admitted in both):
//!
//! - `under load`: 1 per ms, burst 1,000,000,000 (a tolerance of 11.6
//!   days): the arrival time runs ahead of the clock, so an admission adds
//!   `T` to the state it finds (a `DirectLimiter` does it with one add);
//! - `below the rate`: 1e9 per second, burst 1e9 (the direct groups'):
//!   the arrival time stays behind the clock, so an admission writes
//!   `now + T`, whatever the state was.
//!
//! Each thread waits on a barrier and runs `iters` checks; the sample is
//! the slowest thread's time, so the figure is wall time per check as each
//! thread sees it while both run, and criterion's `elem/s` (throughput
//! `Elements(2)`) is the aggregate. After each turnstile subject (and the
//! floor) the bench prints its CAS retries per check over all of its
//! checks, warm-up included (`process_cas_retries`: nothing else checks
//! meanwhile).

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput};
use crossbeam_utils::CachePadded;
use turnstile_rl::{Clock, DirectLimiter, KeyedLimiter, LeasedLimiter, QuantaClock, Quota};

use crate::keyed::{parallel, threads_label, Governor};

const THREADS: usize = 2;
const HOT: u64 = 7;

#[derive(Clone, Copy)]
enum Load {
    UnderLoad,
    BelowRate,
}

impl Load {
    fn name(self) -> &'static str {
        match self {
            Load::UnderLoad => "under load",
            Load::BelowRate => "below the rate",
        }
    }

    /// (emission interval, burst).
    fn bucket(self) -> (Duration, u32) {
        match self {
            Load::UnderLoad => (Duration::from_millis(1), 1_000_000_000),
            Load::BelowRate => (Duration::from_nanos(1), 1_000_000_000),
        }
    }

    fn quota(self) -> Quota {
        let (interval, burst) = self.bucket();
        Quota::with_period(interval)
            .and_then(|q| q.burst(u64::from(burst)))
            .expect("a valid quota")
    }

    fn governor(self) -> governor::Quota {
        let (interval, burst) = self.bucket();
        governor::Quota::with_period(interval)
            .expect("a non-zero period")
            .allow_burst(NonZeroU32::new(burst).expect("non-zero"))
    }
}

/// The floor: a clock read and GCRA's CAS loop on one shared word, each
/// thread counting its own retries on a line of its own.
struct Floor {
    clock: QuantaClock,
    interval: u64,
    state: CachePadded<AtomicU64>,
    retries: [CachePadded<AtomicU64>; THREADS],
}

impl Floor {
    fn check(&self, thread: usize) -> bool {
        let now = self.clock.now();
        let mut current = self.state.load(Ordering::Relaxed);
        loop {
            let next = current.max(now) + self.interval;
            match self.state.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(actual) => {
                    self.retries[thread].fetch_add(1, Ordering::Relaxed);
                    current = actual;
                }
            }
        }
    }

    fn retries(&self) -> u64 {
        self.retries.iter().map(|r| r.load(Ordering::Relaxed)).sum()
    }
}

/// Times `check` on `threads` threads at once; with `retries`, prints the
/// CAS retries per check it counted over every check the subject ran.
fn run(
    group: &mut BenchmarkGroup<'_, WallTime>,
    threads: usize,
    name: &str,
    retries: Option<&dyn Fn() -> u64>,
    check: impl Fn(usize) -> bool + Sync,
) {
    assert!(
        (0..1_000).all(|_| check(0)),
        "{name}: not every check was allowed"
    );
    let checks = AtomicU64::new(0);
    let before = retries.map(|count| count());
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            checks.fetch_add(iters * threads as u64, Ordering::Relaxed);
            parallel(threads, iters, |thread| {
                let check = &check;
                move || check(black_box(thread))
            })
        })
    });
    if let (Some(count), Some(before)) = (retries, before) {
        let checks = checks.load(Ordering::Relaxed);
        let retries = count() - before;
        eprintln!(
            "{name}: {:.4} CAS retries per check ({retries} in {checks} checks)",
            retries as f64 / checks as f64
        );
    }
    assert!(check(0), "{name}: after the run, a check was denied");
}

/// The `contended/...` groups.
pub fn bench(c: &mut Criterion) {
    let turnstile_retries = || turnstile_rl::__private::cas_retries();
    for load in [Load::UnderLoad, Load::BelowRate] {
        for threads in [1, THREADS] {
            let mut group = c.benchmark_group(format!(
                "contended/{}/{}",
                load.name(),
                threads_label(threads)
            ));
            group.throughput(Throughput::Elements(threads as u64));
            direct_subjects(&mut group, threads, load);
            if threads > 1 {
                let keyed = KeyedLimiter::<u64>::new(load.quota());
                run(
                    &mut group,
                    threads,
                    "turnstile KeyedLimiter, 1 hot key",
                    Some(&turnstile_retries),
                    |_| keyed.check(black_box(&HOT)).is_allowed(),
                );
                let governor = Governor::<u64, _>::dashmap_with_hasher(
                    load.governor(),
                    ahash::RandomState::new(),
                );
                run(
                    &mut group,
                    threads,
                    "governor DashMap ahash, 1 hot key",
                    None,
                    |_| governor.check_key(black_box(&HOT)).is_ok(),
                );
            }
            let floor = Floor {
                clock: QuantaClock::new(),
                interval: load.bucket().0.as_nanos() as u64,
                state: CachePadded::new(AtomicU64::new(0)),
                retries: [const { CachePadded::new(AtomicU64::new(0)) }; THREADS],
            };
            let floor_retries = || floor.retries();
            run(
                &mut group,
                threads,
                "floor: CAS loop on one word",
                Some(&floor_retries),
                |thread| floor.check(thread),
            );
            group.finish();
        }
    }
}

/// One bucket three ways: exact, leased, and governor's.
fn direct_subjects(group: &mut BenchmarkGroup<'_, WallTime>, threads: usize, load: Load) {
    let turnstile_retries = || turnstile_rl::__private::cas_retries();
    let direct = DirectLimiter::new(load.quota());
    run(
        group,
        threads,
        "turnstile DirectLimiter",
        Some(&turnstile_retries),
        |_| direct.check().is_allowed(),
    );
    let leased = LeasedLimiter::builder(load.quota())
        .build()
        .expect("the default leases fit the quota");
    run(
        group,
        threads,
        "turnstile LeasedLimiter",
        Some(&turnstile_retries),
        |_| leased.check().is_allowed(),
    );
    let governor = governor::RateLimiter::direct(load.governor());
    run(group, threads, "governor, one bucket", None, |_| {
        governor.check().is_ok()
    });
}
