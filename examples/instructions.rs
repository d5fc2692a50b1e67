//! Fixed work for counting instructions, the one measure this project's
//! noisy 2-core guests cannot disturb (`BENCHMARKS.md`, "Instructions per
//! check"). Time is what matters, and criterion measures it; this tells
//! whether a change added or removed work when two timings disagree by
//! less than their noise.
//!
//! ```sh
//! cargo build --release --example instructions
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/examples/instructions churn
//! ```
//!
//! Modes: `hits` (1,000 keys, 2,000,000 checks), `million` (200,000 keys,
//! 2,000,000 checks), `churn` (1,000,000 new keys at a 50,000-key bound),
//! `churn-at-default-bound` (3,000,000 new keys, the last 2,000,000 at the
//! default 1,000,000-key bound: a profile's workload more than a count's),
//! `inserts` (1,000,000 new keys below the default bound: the table grows),
//! `churn-frozen` and `churn-frozen-at-default-bound` (the two churns on a
//! clock that never moves, so that every new key past the bound evicts one
//! and the count does not depend on the machine's speed),
//! `strings` (1,000 `String` keys, 1,000,000 checks), `multi` (a one-limit
//! `KeyedMultiLimiter`, 1,000 keys, 2,000,000 checks), `direct` and
//! `direct-denied` (one `DirectLimiter`, 2,000,000 checks) beside
//! `governor-direct` and `governor-direct-denied` (governor's, on the same
//! quotas), `contended-direct` and `contended-key` (two threads on one
//! bucket: CAS retries per check), `leased` (one `LeasedLimiter`,
//! 2,000,000 checks, one thread: its leases stay one token, so this is the
//! exact path's cost), `leased-fixed` (the same with fixed leases of 64:
//! the path served from a stripe), `contended-leased` (two threads, CAS
//! retries per check), `leased-over-admission` (two threads for a second
//! of the real clock on a bucket under load, leased and then exact: what
//! each admitted beside the exact limiter's bound, printed).

use std::hint::black_box;
use std::time::Duration;

use turnstile_rl::{
    Clock, DirectLimiter, KeyedLimiter, KeyedLimiterBuilder, KeyedMultiLimiter, LeasedLimiter,
    ManualClock, Quota, Quotas,
};

fn main() {
    let Some(mode) = std::env::args().nth(1) else {
        eprintln!(
            "usage: instructions <hits|million|churn|churn-at-default-bound|churn-frozen|churn-frozen-at-default-bound|inserts|strings|multi|denied|direct|direct-denied|governor-direct|governor-direct-denied|contended-direct|contended-key|leased|leased-fixed|contended-leased|leased-over-admission>"
        );
        std::process::exit(2);
    };
    // Every check is admitted: the work measured is the lookup and the CAS.
    let quota = Quota::with_period(Duration::from_secs(15))
        .and_then(|quota| quota.burst(1_000_000_000))
        .expect("a valid quota");
    let admitted = match mode.as_str() {
        "hits" => keyed(quota, 1_000),
        "million" => keyed(quota, 200_000),
        "churn" => churn(
            KeyedLimiter::<u64>::builder(quota).max_keys(50_000).build(),
            1_000_000,
        ),
        // At the default bound (1,000,000 keys), which outgrows the cache:
        // for `perf record`, where the misses are the cost (BENCHMARKS.md,
        // "Profile: where the time goes (churn)").
        "churn-at-default-bound" => churn(KeyedLimiter::<u64>::new(quota), 3_000_000),
        // Below the bound: the table grows from its first 16 slots, every
        // key inserted once (the memory bench's insert row).
        "inserts" => churn(KeyedLimiter::<u64>::new(quota), 1_000_000),
        // `churn` and `churn-at-default-bound` on a clock that never moves:
        // no key goes idle, so every new key past the bound evicts one by
        // overflow, however fast the machine runs the loop. (On the real
        // clock a key of this quota is idle 15 ns after its check, and how
        // many the housekeeping sweeps evict instead depends on the time
        // each check takes: under valgrind, on a loaded host, two runs of
        // one binary at the default bound counted 5.1 and 3.0 billion.)
        "churn-frozen" => churn(frozen(quota).max_keys(50_000).build(), 1_000_000),
        "churn-frozen-at-default-bound" => churn(frozen(quota).build(), 3_000_000),
        "strings" => {
            let limiter = KeyedLimiter::<String>::new(quota);
            let keys: Vec<String> = (0..1_000).map(|i| format!("key-{i:012}")).collect();
            for key in &keys {
                let _ = limiter.check(key.as_str());
            }
            (0..1_000_000usize)
                .filter(|i| {
                    let key = keys[(i * 7_919) % keys.len()].as_str();
                    black_box(limiter.check(black_box(key))).is_allowed()
                })
                .count()
        }
        "denied" => {
            let limiter = KeyedLimiter::<u64>::new(Quota::per_hour(1).expect("a valid quota"));
            walk(1_000, |key| limiter.check(key).is_allowed())
        }
        "direct" => direct(DirectLimiter::new(quota)),
        "direct-denied" => {
            let limiter = DirectLimiter::new(Quota::per_hour(1).expect("a valid quota"));
            let _ = limiter.check();
            direct(limiter)
        }
        // governor's direct limiter on the same quotas, its answer kept as
        // `direct` keeps turnstile's: the peer's count beside ours.
        "governor-direct" => governor_direct(
            governor::Quota::with_period(Duration::from_secs(15))
                .expect("a valid quota")
                .allow_burst(nonzero(1_000_000_000)),
            false,
        ),
        "governor-direct-denied" => governor_direct(governor::Quota::per_hour(nonzero(1)), true),
        // Two threads on one bucket: what these count is CAS retries per
        // check (printed), not instructions.
        "contended-direct" => {
            let limiter = DirectLimiter::new(under_load());
            contended(|| limiter.check().is_allowed())
        }
        "contended-key" => {
            let limiter = KeyedLimiter::<u64>::new(under_load());
            contended(|| limiter.check(&7).is_allowed())
        }
        "leased" => {
            let limiter = leased(quota);
            (0..2_000_000)
                .filter(|_| black_box(black_box(&limiter).check()).is_allowed())
                .count()
        }
        // Leases of 64 from the first check: 63 of every 64 checks are
        // served from the stripe, the path that scales with cores.
        "leased-fixed" => {
            let limiter = LeasedLimiter::builder(quota)
                .adaptive(false)
                .build()
                .expect("the default leases fit the quota");
            (0..2_000_000)
                .filter(|_| black_box(black_box(&limiter).check()).is_allowed())
                .count()
        }
        "contended-leased" => {
            let limiter = leased(under_load());
            contended(|| limiter.check().is_allowed())
        }
        "leased-over-admission" => over_admission(),
        "multi" => {
            let limiter = KeyedMultiLimiter::<u64>::new(Quotas::from(quota));
            walk(1_000, |key| limiter.check(key).is_allowed())
        }
        other => {
            eprintln!("instructions: no mode {other:?}");
            std::process::exit(2);
        }
    };
    eprintln!("{mode}: {admitted} admitted");
}

/// A limiter of `quota` whose clock never moves.
fn frozen(quota: Quota) -> KeyedLimiterBuilder<u64, ManualClock> {
    KeyedLimiter::<u64>::builder(quota).clock(ManualClock::new())
}

/// Checks `new_keys` keys never seen before, one each.
fn churn<C: Clock>(limiter: KeyedLimiter<u64, C>, new_keys: u64) -> usize {
    (0..new_keys)
        .filter(|i| {
            let key = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            black_box(limiter.check(black_box(&key))).is_allowed()
        })
        .count()
}

/// Checks `keys` keys once each, then 2,000,000 times in a scattered order.
fn keyed(quota: Quota, keys: u64) -> usize {
    let limiter = KeyedLimiter::<u64>::new(quota);
    walk(keys, |key| limiter.check(key).is_allowed())
}

fn walk(keys: u64, check: impl Fn(&u64) -> bool) -> usize {
    for key in 0..keys {
        check(&key);
    }
    (0..2_000_000u64)
        .filter(|i| black_box(check(black_box(&((i * 2_654_435_761) % keys)))))
        .count()
}

/// Checks one direct limiter 2,000,000 times.
fn direct(limiter: DirectLimiter) -> usize {
    (0..2_000_000)
        .filter(|_| black_box(black_box(&limiter).check()).is_allowed())
        .count()
}

/// Checks one governor direct limiter 2,000,000 times (after one check
/// that empties it, when `emptied`).
fn governor_direct(quota: governor::Quota, emptied: bool) -> usize {
    let limiter = governor::RateLimiter::direct(quota);
    if emptied {
        let _ = limiter.check();
    }
    (0..2_000_000)
        .filter(|_| black_box(black_box(&limiter).check()).is_ok())
        .count()
}

fn nonzero(n: u32) -> std::num::NonZeroU32 {
    std::num::NonZeroU32::new(n).expect("not zero")
}

/// 1 per ms, burst 1e9 (a tolerance of 11.6 days, within the add path's
/// bound): every check of a run is admitted, and each pushes the arrival
/// time 1 ms further ahead of the clock.
fn under_load() -> Quota {
    Quota::with_period(Duration::from_millis(1))
        .and_then(|quota| quota.burst(1_000_000_000))
        .expect("a valid quota")
}

/// Runs `check` 20,000,000 times on each of two threads at once, and
/// prints the CAS retries per check they took.
fn contended(check: impl Fn() -> bool + Sync) -> usize {
    const CHECKS: usize = 20_000_000;
    let before = turnstile_rl::__private::cas_retries();
    let barrier = std::sync::Barrier::new(2);
    let admitted: usize = std::thread::scope(|s| {
        let threads: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    (0..CHECKS).filter(|_| black_box(check())).count()
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("a thread panicked"))
            .sum()
    });
    let retries = turnstile_rl::__private::cas_retries() - before;
    eprintln!(
        "{retries} CAS retries in {} checks: {:.4} per check",
        2 * CHECKS,
        retries as f64 / (2 * CHECKS) as f64
    );
    admitted
}

/// A leased limiter with the defaults, for `quota`.
fn leased(quota: Quota) -> LeasedLimiter {
    LeasedLimiter::builder(quota)
        .build()
        .expect("the default leases fit the quota")
}

/// Two threads check a leased limiter for one second of the real clock,
/// on a bucket they keep under load (1,000,000 a second, burst 1,000;
/// leases of at most 64, time to live 100 µs), then a `DirectLimiter` of
/// the same quota the same way: prints what each admitted beside the
/// exact limiter's most for its run (`B + floor(end / T)`, the run being
/// one window of readings from the clock's origin), and the leased one's
/// stated slack. Below the most is what the load cost: seconds in which
/// no thread of this process ran let the bucket fill past its burst.
fn over_admission() -> usize {
    let quota: Quota = "1000000/s burst 1000".parse().expect("a valid quota");
    let leased = LeasedLimiter::builder(quota)
        .max_lease(64)
        .lease_ttl(Duration::from_micros(100))
        .build()
        .expect("the leases fit the quota");
    let admitted = for_a_second(&|| leased.check().is_allowed(), &|| leased.clock().now());
    eprintln!(
        "stated bound {} ({} stripes), {} lease races",
        leased.over_admission_bound(),
        leased.stripes(),
        turnstile_rl::__private::lease_races(&leased)
    );
    let direct = DirectLimiter::new(quota);
    for_a_second(&|| direct.check().is_allowed(), &|| direct.clock().now());
    admitted as usize
}

/// Two threads run `check` until `now` passes one second; prints and
/// returns the admissions, beside the exact limiter's most.
fn for_a_second(check: &(dyn Fn() -> bool + Sync), now: &(dyn Fn() -> u64 + Sync)) -> u64 {
    let run = Duration::from_secs(1).as_nanos() as u64;
    let admitted: u64 = std::thread::scope(|s| {
        let threads: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let mut admitted = 0;
                    while now() < run {
                        admitted += u64::from(black_box(check()));
                    }
                    admitted
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("a thread panicked"))
            .sum()
    });
    let end = now();
    let exact = 1_000 + end / 1_000;
    eprintln!(
        "{admitted} admitted in {end} ns: the exact limiter's most {exact}, excess {}",
        admitted as i64 - exact as i64
    );
    admitted
}
