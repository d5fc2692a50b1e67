//! The keyed limiter's memory, measured by a counting allocator (not RSS):
//! it follows the live keys up and back down by itself, and stays flat under
//! a flood of random keys while a steady user's decisions stay exact.
//!
//! Run with `--nocapture` to see the figures.

use std::sync::Mutex;
use std::time::Duration;

use turnstile_rl::__private::TICK;
use turnstile_rl::{KeyedLimiter, ManualClock, Quota};

use turnstile_test_kit::heap;

/// The kit's counting allocator: heap bytes held, and a pause at one allocation.
#[global_allocator]
static HEAP: heap::Counting = heap::Counting;

use heap::live;
use keys::SplitMix;
use turnstile_test_kit::keys;

/// The counters are process-wide: the tests take turns.
static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn a_million_idle_keys_go_away_by_themselves() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::builder(Quota::per_second(10).unwrap())
        .clock(clock.clone())
        .max_keys(2_000_000)
        .build();
    let _ = limiter.check(&u64::MAX);
    let baseline = live();

    for key in 0..1_000_000u64 {
        assert!(limiter.check(&key).is_allowed());
    }
    let full = live();
    let per_key = (full - baseline) as f64 / 1e6;
    println!(
        "1,000,000 u64 keys: {:.1} MB, {per_key:.1} bytes per key ({} slots)",
        heap::mib(full - baseline),
        limiter.capacity()
    );
    assert_eq!(limiter.len(), 1_000_001);

    // Every bucket is full again after 100 ms; one user keeps sending, one
    // request per housekeeping tick, and nobody calls evict_idle.
    clock.advance(Duration::from_secs(1));
    let mut checks = 0u64;
    while limiter.len() > 1 || live() > baseline + (1 << 20) {
        clock.advance(TICK);
        let _ = limiter.check(&u64::MAX);
        checks += 1;
        assert!(
            checks < 2_000_000,
            "after {checks} checks: {} keys, {:.1} MB above baseline",
            limiter.len(),
            heap::mib(live().saturating_sub(baseline))
        );
    }
    println!(
        "back to {} key(s) and {:.2} MB above baseline after {checks} checks \
         ({:.0} s of traffic at one check per {TICK:?} tick), {} slots",
        limiter.len(),
        heap::mib(live().saturating_sub(baseline)),
        checks as f64 * TICK.as_secs_f64(),
        limiter.capacity()
    );
}

#[test]
fn a_flood_of_random_keys_keeps_memory_flat_and_users_exact() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    const MAX_KEYS: usize = 100_000;
    const FLOOD: u64 = 10_000_000;
    const STEADY: u64 = u64::MAX;
    // A flood key stays non-idle for 600 ms, so 600,000 of them would be
    // live at once: far past the bound, which must hold.
    let quota: Quota = "100/min burst 10".parse().unwrap();
    let clock = ManualClock::new();
    let twin = KeyedLimiter::builder(quota).clock(clock.clone()).build();
    let baseline = live();
    heap::reset_peak();
    let flooded = KeyedLimiter::builder(quota)
        .clock(clock.clone())
        .max_keys(MAX_KEYS)
        .build();

    let mut keys = SplitMix(42);
    let mut compared = 0;
    for i in 0..FLOOD {
        // 1 µs between flood requests: 1,000,000 new keys a second.
        clock.advance(Duration::from_micros(1));
        let _ = flooded.check(&keys.next());
        assert!(flooded.len() <= MAX_KEYS, "{} keys at {i}", flooded.len());
        // The steady user asks ten times faster than its quota allows, so
        // its bucket is always nearly empty: real state worth keeping.
        if i % 1_000 == 0 {
            assert_eq!(flooded.check(&STEADY), twin.check(&STEADY), "request {i}");
            compared += 1;
        }
    }
    let peak = heap::peak() - baseline;
    println!(
        "flood of {FLOOD} random keys with max_keys = {MAX_KEYS}: peak {:.1} MB, \
         {} keys and {} slots at the end; steady user identical on {compared} checks",
        heap::mib(peak),
        flooded.len(),
        flooded.capacity()
    );
    // A table of 16-byte slots (a `u64` key beside its cell) sized for the
    // bound (`SLOTS_PER_KEY_AT_THE_BOUND` in `src/map/raw.rs`: 175,000
    // slots, 2.7 MiB, for 100,000 keys), twice while a migration copies
    // it, and a retired one awaiting reclamation.
    assert!(peak < 9 << 20, "peak {:.1} MB", heap::mib(peak));
}
