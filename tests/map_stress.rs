//! Every path of the map that frees memory, raced on several threads: String
//! keys (so each node owns a heap allocation a sanitizer can watch), a
//! `max_keys` far below the key space (overflow evictions on every few
//! inserts), a clock that moves and `evict_idle` called while checks run
//! (idle eviction and shrinking migrations under readers).
//!
//! It runs in `cargo test`, and `scripts/sanitize.sh` runs it again under
//! AddressSanitizer and LeakSanitizer, where a use after free, a double free
//! or a leaked node fails it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::Duration;

use turnstile_rl::{KeyedLimiter, ManualClock, OverflowPolicy, Quota};

use keys::SplitMix;
use turnstile_test_kit::keys;

const CHECKERS: u64 = 3;
const CHECKS_PER_THREAD: u64 = 60_000;
const KEY_SPACE: u64 = 4_000;
const MAX_KEYS: usize = 256;

fn key(n: u64) -> String {
    format!("client-{n:016x}")
}

#[test]
fn checks_evictions_and_migrations_race_without_losing_memory_safety() {
    let quota: Quota = "20/s burst 5".parse().unwrap();
    let clock = ManualClock::new();
    let limiter: KeyedLimiter<String, ManualClock> = KeyedLimiter::builder(quota)
        .clock(clock.clone())
        .max_keys(MAX_KEYS)
        .overflow(OverflowPolicy::EvictFullest)
        .build();
    let start = Barrier::new(CHECKERS as usize + 1);
    let done = AtomicBool::new(false);

    let (allowed, denied) = std::thread::scope(|s| {
        let checkers: Vec<_> = (0..CHECKERS)
            .map(|thread| {
                let (limiter, start) = (&limiter, &start);
                s.spawn(move || {
                    let mut rng = SplitMix(thread);
                    let (mut allowed, mut denied) = (0u64, 0u64);
                    start.wait();
                    for _ in 0..CHECKS_PER_THREAD {
                        // Half the traffic on 64 hot keys (cells updated
                        // in place), half spread over the whole key space
                        // (inserts, overflow evictions, migrations).
                        let n = rng.next();
                        let k = if n & 1 == 0 { n % 64 } else { n % KEY_SPACE };
                        if limiter.check(key(k).as_str()).is_allowed() {
                            allowed += 1;
                        } else {
                            denied += 1;
                        }
                    }
                    (allowed, denied)
                })
            })
            .collect();
        // The housekeeper: time moves in steps of 0..100 ms, and idle keys
        // are dropped (with the table shrunk) while the checks run.
        s.spawn(|| {
            let mut rng = SplitMix(99);
            start.wait();
            while !done.load(Ordering::Relaxed) {
                clock.advance(Duration::from_millis(rng.next() % 100));
                limiter.evict_idle();
                std::thread::yield_now();
            }
        });
        let totals = checkers
            .into_iter()
            .map(|c| c.join().unwrap())
            .fold((0, 0), |(a, d), (a2, d2)| (a + a2, d + d2));
        done.store(true, Ordering::Relaxed);
        totals
    });

    assert_eq!(allowed + denied, CHECKERS * CHECKS_PER_THREAD);
    assert!(
        allowed > 0 && denied > 0,
        "{allowed} allowed, {denied} denied"
    );
    assert!(
        limiter.len() <= MAX_KEYS,
        "{} keys tracked, bound {MAX_KEYS}",
        limiter.len()
    );

    // Once every bucket is full again, all of them go, and the map still
    // decides exactly: a fresh key admits its burst and no more.
    clock.advance(Duration::from_secs(1));
    limiter.evict_idle();
    assert_eq!(limiter.len(), 0);
    let admitted = (0..10)
        .filter(|_| limiter.check("after").is_allowed())
        .count();
    assert_eq!(admitted, 5);
}
