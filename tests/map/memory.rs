//! The keyed limiter's memory, measured by the kit's counting allocator
//! (heap bytes held, not RSS): it follows the live keys up and back down
//! by itself, stays flat under a flood of random keys while a steady
//! user's decisions stay exact, frees retired tables on a frozen clock,
//! comes back after thousands of migrations, and the pin's thread records
//! are reused.
//!
//! Run with `--nocapture` to see the figures.

use std::thread;
use std::time::Duration;

use turnstile_rl::__private::TICK;
use turnstile_rl::{KeyedLimiter, ManualClock, Quota};
use turnstile_test_kit::heap;
use turnstile_test_kit::keys::SplitMix;
use turnstile_test_kit::watchdog::Watchdog;
use turnstile_test_kit::within::within;

use crate::keys::{assert_keys_dropped_once, settle, settle_counts, Counts, Name, Tracked};
use crate::serial;
use crate::sizing::tight_race;
use crate::support::fast_quota;

use heap::live;

#[test]
fn a_million_idle_keys_go_away_by_themselves() {
    let _serial = serial();
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
    let _serial = serial();
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

/// With a frozen clock no housekeeping tick ever
/// comes, yet tables retired by growth are freed within a bounded number of
/// operations.
#[test]
fn retired_tables_are_freed_on_a_frozen_clock() {
    let _serial = serial();
    let limiter = KeyedLimiter::builder("1/s".parse::<Quota>().unwrap())
        .clock(ManualClock::new())
        .build();
    let _ = limiter.check(&u64::MAX);
    let baseline = heap::live();
    for key in 0..500_000u64 {
        let _ = limiter.check(&key);
    }
    for _ in 0..1_000 {
        let _ = limiter.check(&7);
    }
    let held = heap::live() - baseline;
    // What the live table needs: 16 bytes per slot (a `u64` key beside its
    // cell), plus a little. The table it grew from (half as many slots)
    // would add half as much again.
    let needed = limiter.capacity() * 16;
    assert!(
        held < needed + (256 << 10),
        "{held} bytes held, {needed} needed by the live table: retired tables were kept"
    );
}

/// Memory is given back. A limiter that went through many
/// migrations on 6 threads, dropped after its threads exit, leaves the heap
/// where it found it (within slack for thread-local bookkeeping).
#[test]
fn memory_is_returned_after_many_migrations_of_string_keys() {
    let _serial = serial();
    static COUNTS: Counts = Counts::new();
    let before = heap::live();
    within(Duration::from_secs(120), "memory", || {
        let clock = ManualClock::new();
        let limiter: KeyedLimiter<Tracked, ManualClock> = KeyedLimiter::builder(fast_quota())
            .clock(clock.clone())
            .build();
        thread::scope(|s| {
            for t in 0..6u64 {
                let (limiter, clock) = (&limiter, &clock);
                s.spawn(move || {
                    for i in 0..20_000u64 {
                        let _ = limiter.check(&Tracked::new(t << 32 | i, &COUNTS));
                        if i % 1000 == 0 {
                            clock.advance(Duration::from_millis(10));
                            if t == 0 {
                                limiter.evict_idle();
                            }
                        }
                    }
                });
            }
        });
        drop(limiter);
    });
    settle_counts(&COUNTS);
    let after = heap::live();
    eprintln!(
        "memory: before {before} B, after {after} B; made {} dropped {}",
        COUNTS.made(),
        COUNTS.dropped()
    );
    assert_eq!(COUNTS.made(), COUNTS.dropped(), "keys made vs dropped");
    assert!(
        after <= before + 64 * 1024,
        "{} B not returned",
        after - before
    );
}

/// Memory comes back after thousands of tight migrations of `String` keys.
#[test]
fn memory_returns_after_tight_migrations() {
    let _serial = serial();
    settle();
    let before = heap::live();
    let r = within(Duration::from_secs(50), "memory", || {
        tight_race::<Name>(21, 6, 4_000)
    });
    assert_keys_dropped_once("memory");
    thread::sleep(Duration::from_millis(100));
    settle();
    let after = heap::live();
    eprintln!(
        "memory: {} copies, heap before {before} B, after {after} B",
        r.copies
    );
    assert!(r.copies / 21 >= 200, "not reached: {} copies", r.copies);
    assert!(
        after <= before + 64 * 1024,
        "{} B not returned",
        after.saturating_sub(before)
    );
}

// ---------------------------------------------------------------------------
// The pin's thread records (`src/map/pin.rs`) are reused. The module says
// "Records are never freed: a thread's is taken back by the next thread
// that registers", and a pin made while the thread-local is gone takes a
// record "for that pin only". Both rely on `release` storing
// `in_use = false`: heap bytes held after many short-lived threads have
// each checked a limiter once, and after one exiting thread checks many
// times from a TLS destructor.

static LIMITER: std::sync::LazyLock<KeyedLimiter<u64>> =
    std::sync::LazyLock::new(|| KeyedLimiter::new("1000000/s".parse().unwrap()));

/// Spawns `n` threads one after the other, each checking once, and joins
/// each before the next starts: at most one (plus this) thread owns a
/// record at any time, so reused records keep the registry at 2-3 records.
fn churn(n: u64, dog: &Watchdog) {
    for i in 0..n {
        std::thread::spawn(move || {
            let _ = LIMITER.check(&(i % 8));
        })
        .join()
        .unwrap();
        dog.tick();
    }
}

/// Threads spawned and joined in a loop: heap growth per thread.
#[test]
fn records_are_reused_after_threads_exit() {
    let _serial = serial();
    let dog = Watchdog::start(
        "records_reused",
        Duration::from_secs(30),
        Duration::from_secs(60),
    );
    let _ = LIMITER.check(&0);
    // Warm up: thread spawn machinery, the limiter's 8 keys.
    churn(200, &dog);
    let before = heap::live();
    const THREADS: u64 = 5_000;
    churn(THREADS, &dog);
    let after = heap::live();
    let per_thread = after.saturating_sub(before) as f64 / THREADS as f64;
    eprintln!("heap before {before} B, after {after} B: {per_thread:.1} B kept per exited thread");
    dog.finish();
    assert!(
        after <= before + 16 * 1024,
        "{THREADS} threads that each checked once and exited left {} B on the heap \
         ({per_thread:.1} B each): their records were not given back",
        after - before
    );
}

struct ChecksOnExit(u64);

impl Drop for ChecksOnExit {
    fn drop(&mut self) {
        // Runs among the thread's TLS destructors, after `pin`'s LOCAL is
        // gone (it was registered later, so it is destroyed first).
        for i in 0..self.0 {
            let _ = LIMITER.check(&(i % 8));
        }
    }
}

thread_local! {
    static ON_EXIT: ChecksOnExit = const { ChecksOnExit(20_000) };
}

/// One exiting thread pins 20,000 times from a TLS destructor: each pin
/// takes a record "for that pin only".
#[test]
fn pins_from_a_tls_destructor_give_their_records_back() {
    let _serial = serial();
    let dog = Watchdog::start(
        "tls_records",
        Duration::from_secs(30),
        Duration::from_secs(60),
    );
    let _ = LIMITER.check(&0);
    // Warm up a thread doing the same with few checks.
    std::thread::spawn(|| {
        let _ = LIMITER.check(&1);
    })
    .join()
    .unwrap();
    let before = heap::live();
    std::thread::spawn(|| {
        // Registers ON_EXIT's destructor before LOCAL's.
        ON_EXIT.with(|_| {});
        let _ = LIMITER.check(&1);
    })
    .join()
    .unwrap();
    let after = heap::live();
    dog.finish();
    eprintln!("heap before {before} B, after {after} B");
    assert!(
        after <= before + 16 * 1024,
        "20,000 pins from a TLS destructor left {} B on the heap: each took a record \
         that was never given back",
        after - before
    );
}
