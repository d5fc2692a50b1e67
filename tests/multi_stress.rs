//! Several limits per key under contention: four threads on a frozen clock
//! admit exactly what the strictest limit allows, and no limit keeps a
//! rolled-back charge. In a file of its own because it reads the
//! process-wide CAS retry count to prove the threads really raced.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use turnstile_rl::{KeyedMultiLimiter, ManualClock, MultiLimiter, Quotas};
use turnstile_test_kit::overlap::overlapping;
use turnstile_test_kit::watchdog::Watchdog;

/// How long the rounds may take to race on a cell.
const REACH_WITHIN: Duration = Duration::from_secs(60);

/// Attempts each thread makes, at least, after all of its round's threads
/// have started.
const ATTEMPTS: u64 = 100;

/// Four threads on a frozen clock, far more attempts than any limit
/// allows, costs 1 and 2: the admitted cost is exactly the strictest
/// burst, and every limit holds exactly that, none a leaked charge.
#[test]
fn four_threads_admit_exactly_the_strictest_limit() {
    const THREADS: u64 = 4;
    let dog = Watchdog::start(
        "multi stress",
        Duration::from_secs(20),
        Duration::from_secs(240),
    );
    // CAS retries are counted process-wide: this file holds this one test,
    // so only its own threads add to the count.
    let retries = || {
        turnstile_rl::KeyedLimiter::<u64>::new("1/s".parse().unwrap())
            .stats()
            .process_cas_retries
    };
    let before = retries();
    for (text, strictest) in [
        ("1/h burst 60; 1/h burst 40", 40u64),
        ("1/h burst 40; 1/h burst 60", 40),
        ("1/h burst 50; 1/h burst 64; 1/h burst 44", 44),
    ] {
        // Rounds repeat (each one exact) until the threads have raced on a
        // cell, which the OS scheduler decides (each round's threads run
        // until they overlapped, see `overlapping`), for at most
        // `REACH_WITHIN`: a time, since a loaded machine races less per
        // round.
        let start = Instant::now();
        for round in 0.. {
            if round >= 20 && retries() > before {
                break;
            }
            assert!(
                start.elapsed() < REACH_WITHIN,
                "{text}: {round} rounds in {REACH_WITHIN:?} and the threads never raced on a cell"
            );
            let quotas: Quotas = text.parse().unwrap();
            let direct = MultiLimiter::builder(quotas.clone())
                .clock(ManualClock::new())
                .build();
            let keyed = KeyedMultiLimiter::<u64, _>::builder(quotas.clone())
                .clock(ManualClock::new())
                .build();
            let (direct_admitted, keyed_admitted) = (AtomicU64::new(0), AtomicU64::new(0));
            overlapping(
                THREADS,
                ATTEMPTS,
                |t, i| {
                    // Odd threads ask for two tokens at a time at first,
                    // so a denial on the last token leaves room for a
                    // cost-1 request: the binding limit fills exactly.
                    let n = if t % 2 == 1 && i < 10 { 2 } else { 1 };
                    if direct.check_n(n).unwrap().is_allowed() {
                        direct_admitted.fetch_add(n, Ordering::Relaxed);
                    }
                    if keyed.check_n(&7, n).unwrap().is_allowed() {
                        keyed_admitted.fetch_add(n, Ordering::Relaxed);
                    }
                    dog.tick();
                },
                None,
            );
            let direct_total = direct_admitted.load(Ordering::Relaxed);
            let keyed_total = keyed_admitted.load(Ordering::Relaxed);
            assert_eq!(direct_total, strictest, "{text} round {round}");
            assert_eq!(keyed_total, strictest, "{text} round {round}");
            for (i, quota) in quotas.as_slice().iter().enumerate() {
                let left = quota.burst_size() - strictest;
                let d = direct.limits()[i].peek();
                let k = keyed.limits()[i].peek(&7);
                for peek in [d, k] {
                    assert_eq!(peek.is_allowed(), left > 0, "{text} limit {i}");
                    assert_eq!(peek.remaining(), left.saturating_sub(1), "{text} limit {i}");
                }
            }
        }
    }
    dog.finish();
}
