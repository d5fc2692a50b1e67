//! Issue 22's cliff: a thread that uses more limiters than a per-thread
//! cache of epoch handles holds (there were 8) re-registered a handle, and
//! allocated twice, on every check. Now every limiter shares one collector
//! and a thread one handle: a known key's check allocates nothing, however
//! many limiters the thread uses in turn.

use std::sync::Mutex;

use turnstile_rl::{KeyedLimiter, ManualClock, Quota};

use turnstile_test_kit::heap;

/// The kit's counting allocator (its allocation count is per thread, so
/// other tests running meanwhile do not count).
#[global_allocator]
static HEAP: heap::Counting = heap::Counting;

const KEYS: u64 = 1_000;

/// The tests take turns: another test's limiters, dropped while this one
/// measures, leave garbage that this thread's pins help collect, and the
/// epoch's bookkeeping of that (one queue node per 64 bags) allocates now
/// and then, which is not a check's cost.
static SERIAL: Mutex<()> = Mutex::new(());

/// Allocations per check of `n` limiters used in turn on known keys.
fn allocations_per_check(n: usize) -> f64 {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // A manual clock that never moves: no housekeeping tick, so what is
    // counted is the check itself. Nothing is ever denied or idle.
    let clock = ManualClock::new();
    let quota = Quota::per_second(1)
        .and_then(|q| q.burst(1_000_000))
        .expect("a valid quota");
    let limiters: Vec<KeyedLimiter<u64, ManualClock>> = (0..n)
        .map(|_| KeyedLimiter::builder(quota).clock(clock.clone()).build())
        .collect();
    // Warm-up: every key of every limiter exists, the tables have stopped
    // growing, this thread has whatever it registers once, and the epoch
    // has freed the tables the growth retired.
    for _ in 0..3 {
        for limiter in &limiters {
            for key in 0..KEYS {
                assert!(limiter.check(&key).is_allowed());
            }
        }
    }
    let checks = 20 * KEYS as usize * n.max(9);
    let before = heap::allocations();
    for i in 0..checks {
        let limiter = &limiters[i % n];
        assert!(limiter.check(&(i as u64 % KEYS)).is_allowed());
    }
    (heap::allocations() - before) as f64 / checks as f64
}

#[test]
fn one_limiter_allocates_nothing_per_check() {
    assert_eq!(allocations_per_check(1), 0.0);
}

#[test]
fn nine_limiters_in_turn_allocate_nothing_per_check() {
    assert_eq!(allocations_per_check(9), 0.0);
}

#[test]
fn sixteen_limiters_in_turn_allocate_nothing_per_check() {
    assert_eq!(allocations_per_check(16), 0.0);
}
