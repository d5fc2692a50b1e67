//! Clocks and housekeeping: a reading taken before its key was evicted
//! (a preemption between reading the clock and using the reading) never
//! starts a bucket in the past, one reading far ahead of the others does
//! not stop housekeeping, and the sweep's cursor covers a table of any
//! size (odd ones at the bound) in one lap of ticks.

use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

use turnstile_rl::__private::TICK;
use turnstile_rl::{Clock, KeyedLimiter, ManualClock, OverflowPolicy, Quota};
use turnstile_test_kit::watchdog::Watchdog;
use turnstile_test_kit::within::within;

use crate::keys::{
    assert_keys_dropped_once, check, check_with, count_by_reset, limiter, peek, reset, Id, TestKey,
};
use crate::serial;
use crate::support::{bound_table, watchdog, Seen};

// ---------------------------------------------------------------------------
// Stale readings: a clock that holds a reading back until released, as a
// preemption would.

/// A clock whose next reading, on a thread that asked for it, is taken and
/// then held back until released: the reading is stale by the time it is
/// used, as after a preemption.
#[derive(Clone)]
struct StallingClock {
    time: ManualClock,
    stall: Arc<(Mutex<bool>, std::sync::Condvar)>,
}

thread_local! {
    static STALL_NEXT_READING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl Clock for StallingClock {
    fn now(&self) -> u64 {
        let now = self.time.now();
        if STALL_NEXT_READING.with(|s| s.replace(false)) {
            let (released, wake) = &*self.stall;
            let mut released = released.lock().unwrap();
            while !*released {
                released = wake.wait(released).unwrap();
            }
        }
        now
    }
}

/// A check that read the clock before its key was evicted as idle
/// by a thread with a later reading must not start a fresh bucket in the
/// past, which would admit more than the quota allows.
#[test]
fn a_stale_reading_never_restarts_an_evicted_bucket_in_the_past() {
    let _serial = serial();
    let time = ManualClock::new();
    let clock = StallingClock {
        time: time.clone(),
        stall: Arc::new((Mutex::new(false), std::sync::Condvar::new())),
    };
    let limiter = Arc::new(
        KeyedLimiter::builder("1/s burst 1".parse::<Quota>().unwrap())
            .clock(clock.clone())
            .build(),
    );
    // Housekeeping ticks are taken now, so none interferes below.
    time.set(Duration::from_millis(400));
    let _ = limiter.check(&999);
    time.set(Duration::ZERO);
    assert!(limiter.check(&1).is_allowed()); // TAT = 1 s
    time.set(Duration::from_millis(500));
    let stale = {
        let limiter = limiter.clone();
        thread::spawn(move || {
            STALL_NEXT_READING.with(|s| s.set(true));
            limiter.check(&1) // reads 0.5 s, then stalls
        })
    };
    thread::sleep(Duration::from_millis(50));
    // At 1 s the bucket is full again: idle, and evicted.
    time.set(Duration::from_secs(1));
    assert!(limiter.evict_idle() >= 1);
    {
        let (released, wake) = &*clock.stall;
        *released.lock().unwrap() = true;
        wake.notify_all();
    }
    let stale = within(Duration::from_secs(10), "the stalled check", move || {
        stale.join().unwrap()
    });
    // Admitted or not, the stalled check must not be decided at 0.5 s on a
    // full bucket: that would let a check at 1.5 s through as well, two
    // admissions 0.5 s apart under a quota of one a second.
    time.set(Duration::from_millis(1_500));
    let next = limiter.check(&1);
    assert!(
        !(stale.is_allowed() && next.is_allowed()),
        "admitted at a stale 0.5 s and again at 1.5 s"
    );
}

// A fresh bucket decided at a clock reading taken early in `admit`, then
// inserted after another thread had inserted the key, used it and evicted
// it as idle at a later reading, started in the past and admitted more
// than GCRA allows. The fresh state is now decided right before each
// attempt to publish the key (`RawMap::insert`'s `state`), after the
// probe that found the key absent; a stall in between makes the CAS fail
// (the key's chain changed) and the next attempt reads the clock again.
// Made deterministic with a clock that holds back the stalled thread's
// second reading until released.

#[derive(Clone)]
struct SecondReadingStalls {
    time: ManualClock,
    gate: Arc<(Mutex<(bool, bool)>, Condvar)>, // (stalled, released)
}

thread_local! {
    static READS_UNTIL_STALL: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

impl Clock for SecondReadingStalls {
    fn now(&self) -> u64 {
        let now = self.time.now();
        let left = READS_UNTIL_STALL.with(|r| r.get());
        if left > 0 {
            READS_UNTIL_STALL.with(|r| r.set(left - 1));
            if left == 1 {
                let (state, wake) = &*self.gate;
                let mut s = state.lock().unwrap();
                s.0 = true;
                wake.notify_all();
                while !s.1 {
                    s = wake.wait(s).unwrap();
                }
            }
        }
        now
    }
}

/// Quota 1/s burst 3. A's check of a fresh key reads 10 s twice and stalls
/// after the second reading. Meanwhile the key is inserted and its 3
/// tokens used at 10 s; at 13 s it is full again and evicted as idle. A
/// resumes and inserts a bucket decided at 10 s: admitted. At 13 s three
/// more are admitted. Over [10 s, 13 s] GCRA allows burst + 3 s / 1 s = 6;
/// 7 are admitted.
#[test]
fn a_fresh_bucket_is_decided_after_any_later_eviction() {
    let _serial = serial();
    let dog = Watchdog::start("stale", Duration::from_secs(10), Duration::from_secs(30));
    let time = ManualClock::new();
    let clock = SecondReadingStalls {
        time: time.clone(),
        gate: Arc::new((Mutex::new((false, false)), Condvar::new())),
    };
    let limiter = Arc::new(
        KeyedLimiter::builder("1/s burst 3".parse::<Quota>().unwrap())
            .clock(clock.clone())
            .build(),
    );
    // Take the housekeeping tick now so none runs below.
    time.set(Duration::from_secs(10));
    let _ = limiter.check(&999u64);
    let a = {
        let limiter = limiter.clone();
        thread::spawn(move || {
            READS_UNTIL_STALL.with(|r| r.set(2));
            limiter.check(&1u64).is_allowed() // reads 10 s, misses, re-reads 10 s, stalls
        })
    };
    {
        let (state, wake) = &*clock.gate;
        let mut s = state.lock().unwrap();
        while !s.0 {
            s = wake.wait(s).unwrap();
        }
    }
    dog.tick();
    let mut admitted = 0;
    for _ in 0..3 {
        admitted += limiter.check(&1u64).is_allowed() as u32;
    }
    assert_eq!(admitted, 3);
    time.set(Duration::from_secs(13));
    assert!(limiter.evict_idle() >= 1, "the key is idle at 13 s");
    {
        let (state, wake) = &*clock.gate;
        state.lock().unwrap().1 = true;
        wake.notify_all();
    }
    let a_admitted = a.join().unwrap();
    admitted += a_admitted as u32;
    for _ in 0..3 {
        admitted += limiter.check(&1u64).is_allowed() as u32;
    }
    dog.finish();
    assert!(
        admitted <= 6,
        "{admitted} admissions for key 1 over [10 s, 13 s]; GCRA allows 3 + 3 = 6 \
         (the stalled check was admitted: {a_admitted})"
    );
}

// ---------------------------------------------------------------------------
// Housekeeping keeps its pace whatever one clock reading says: a reading
// far ahead of the others (a clock jump undone, another core's skewed
// counter) once set the next step an hour out, and idle keys piled up
// until the clock caught up with it.

#[test]
fn one_reading_far_ahead_does_not_stop_housekeeping() {
    let _serial = serial();
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::<u64, _>::builder(Quota::per_second(1_000).unwrap())
        .clock(clock.clone())
        .build();
    let (spiked, busy) = (u64::MAX, u64::MAX - 1);
    clock.set(Duration::from_secs(3_600));
    let _ = limiter.check(&spiked);
    clock.set(Duration::from_millis(3));
    for key in 0..10_000 {
        let _ = limiter.check(&key);
    }
    // Every key is idle a second later; 10 s of one check a tick.
    for _ in 0..10_000 {
        clock.advance(TICK);
        let _ = limiter.check(&busy);
    }
    let stats = limiter.stats();
    assert!(
        stats.idle_evictions >= 10_000,
        "{} idle evictions",
        stats.idle_evictions
    );
    // The busy key and the one checked an hour ahead (not idle till then).
    assert_eq!(limiter.len(), 2, "keys still tracked");
}

// ---------------------------------------------------------------------------
// The sweep cursor on an odd table.

/// A table at the bound (odd) holds `max_keys - 1` keys, about a fifth of
/// its slots of which go idle (fewer than a quarter: no cleanup migration
/// starts, so only the sweep evicts them). Each 1 ms tick sweeps 256 slots
/// from the cursor, reduced modulo the capacity and wrapped with `after`:
/// after `ceil(capacity / 256) - 1` ticks some idle keys are left (the
/// slots not yet swept), after `ceil(capacity / 256)` none is, whatever the
/// wrap; the busy keys are all there, untouched, after many more laps.
fn sweep_laps(max_keys: usize) {
    let dog = watchdog("sweep laps", Duration::from_secs(60));
    let clock = ManualClock::new();
    let bound = bound_table(max_keys);
    assert!(!bound.is_power_of_two());
    let limiter = limiter::<Id>(
        "1/h burst 5",
        &clock,
        max_keys,
        OverflowPolicy::Deny,
        max_keys as u64 * 3,
    );
    let fast: Quota = "1000/s burst 1".parse().unwrap();
    let live = max_keys as u64 - 1;
    // Below a quarter of the table even with a dead slot or two left by
    // the churn below: no cleanup migration.
    let idle_keys = (bound / 5).min(bound / 4 - 2) as u64;
    // Ids below `idle_keys` go idle at 1 ms; the rest (and the ticker, id
    // `live - 1`) are busy for an hour.
    let is_idle = |id: u64| id < idle_keys;
    for id in 0..live {
        let d = if is_idle(id) {
            check_with(&limiter, &Id::new(id), &fast)
        } else {
            check(&limiter, &Id::new(id))
        };
        assert!(d.is_allowed());
        if id % 4096 == 0 {
            dog.tick();
        }
    }
    // Dead slots until the table at the bound is the root: fresh keys
    // inserted and reset in the one place left (`Deny` keeps the rest).
    let mut churn = 1u64 << 40;
    let mut seen = Seen::new();
    while limiter.capacity() != bound {
        churn += 1;
        assert!(check(&limiter, &Id::new(churn)).is_allowed());
        assert!(reset(&limiter, &Id::new(churn)));
        seen.saw(limiter.capacity());
        assert!(
            churn - (1 << 40) < 10 * bound as u64,
            "the bound table never came"
        );
        if churn.is_multiple_of(4096) {
            dog.tick();
        }
    }
    assert_eq!(limiter.len() as u64, live);
    let ticker = Id::new(live - 1);
    let laps = bound.div_ceil(256);
    clock.advance(Duration::from_millis(2));
    let mut after = Vec::new();
    for _ in 0..laps {
        let _ = check(&limiter, &ticker);
        clock.advance(Duration::from_millis(1));
        after.push(limiter.len() as u64);
        dog.tick();
    }
    let stats = limiter.stats();
    eprintln!(
        "sweep laps, max_keys {max_keys}: table {} (odd), {live} keys of which {idle_keys} idle, \
         {} churn keys to reach it; len after each of {laps} ticks: ..{:?}; idle evictions {}",
        limiter.capacity(),
        churn - (1 << 40),
        &after[after.len().saturating_sub(3)..],
        stats.idle_evictions
    );
    assert_eq!(
        limiter.capacity(),
        bound,
        "a migration ran: the sweep was not alone"
    );
    assert!(
        laps == 1 || after[laps - 2] > live - idle_keys,
        "the idle keys were gone before a whole lap (len {}): no migration was to run",
        after[laps - 2]
    );
    assert_eq!(
        after[laps - 1],
        live - idle_keys,
        "one lap of {laps} ticks of 256 slots did not sweep all {bound} slots"
    );
    assert_eq!(stats.idle_evictions, idle_keys);
    // Many more laps, wrapping at odd places: no busy key goes.
    for _ in 0..5 * laps {
        let _ = check(&limiter, &ticker);
        clock.advance(Duration::from_millis(1));
        dog.tick();
    }
    assert_eq!(limiter.len() as u64, live - idle_keys);
    for id in idle_keys..live - 1 {
        assert_eq!(peek(&limiter, &Id::new(id)).remaining(), 3, "busy key {id}");
    }
    let found = count_by_reset(&limiter, 0..live, Some(&dog));
    assert_eq!(found as u64, live - idle_keys);
    drop(limiter);
    dog.finish();
}

#[test]
fn one_lap_of_sweep_ticks_covers_an_odd_table_of_1750() {
    let _serial = serial();
    sweep_laps(1000);
    assert_keys_dropped_once("sweep 1750");
}

#[test]
fn one_lap_of_sweep_ticks_covers_an_odd_table_of_131071() {
    let _serial = serial();
    sweep_laps(74_898);
    assert_keys_dropped_once("sweep 131071");
}

#[test]
fn one_lap_of_sweep_ticks_covers_an_odd_table_of_22() {
    let _serial = serial();
    sweep_laps(13);
    assert_keys_dropped_once("sweep 22");
}
