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
//! `KeyedMultiLimiter`, 1,000 keys, 2,000,000 checks).

use std::hint::black_box;
use std::time::Duration;

use turnstile_rl::{
    Clock, DirectLimiter, KeyedLimiter, KeyedLimiterBuilder, KeyedMultiLimiter, ManualClock, Quota,
    Quotas,
};

fn main() {
    let Some(mode) = std::env::args().nth(1) else {
        eprintln!(
            "usage: instructions <hits|million|churn|churn-at-default-bound|churn-frozen|churn-frozen-at-default-bound|inserts|strings|multi|denied|direct|direct-denied|contended-direct|contended-key>"
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
