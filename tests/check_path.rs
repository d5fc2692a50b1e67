//! The one check path under attack: many threads on a frozen clock, tiny
//! `max_keys`, `clear` and `reset` racing, and a multi-limit whose last
//! limit denies almost every request, so nearly every check charges the
//! first limit and rolls the charge back. Each test counts exactly (no
//! admission lost, none made twice) and runs under a watchdog that aborts
//! on a hang.
//!
//! The exact count comes from the last limit's burst of 1 on a frozen
//! clock: a bucket of that limit admits once, on its insert, and denies
//! from then on, and the last limit's admissions are never rolled back. So
//! the requests admitted are exactly the buckets that limit ever held:
//! those live at the end plus those evicted, reset or cleared.
//!
//! Each test also asserts that it reached the race it names, from the
//! process's counts of raced rollbacks (`rollback_races`); the tests run
//! one at a time, so the counts each one reads are its own.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use turnstile_rl::__private::rollback_races;
use turnstile_rl::{KeyedMultiLimiter, ManualClock, MultiLimiter, OverflowPolicy, Quotas};
use turnstile_test_kit::overlap::overlapping;
use turnstile_test_kit::watchdog::Watchdog;

const THREADS: u64 = 4;

/// Checks each worker makes, at least, after every thread of its round has
/// started.
const OVERLAP: u64 = 20_000;

/// How long a test may take to reach its race.
const REACH_WITHIN: Duration = Duration::from_secs(60);

/// One test at a time (a failed one poisons nothing for the others).
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs `work(t, i)` on `THREADS` threads and, if given, `background` in
/// a loop on one more, until the workers overlapped (see
/// `turnstile_test_kit::overlap`).
fn race_with(work: impl Fn(u64, u64) + Sync, background: Option<&(dyn Fn() + Sync)>) {
    overlapping(THREADS, OVERLAP, work, background);
}

/// Rounds of a race, each exact by itself, run until the rollbacks that
/// raced in all of them (`(moved, gone, after_reset)`, see
/// `rollback_races`) show the race the test names (`reached`), for at most
/// `REACH_WITHIN` (a time, not a count of rounds: a loaded machine races
/// less per round); then asserts that they do.
fn rounds_until_reached(
    name: &str,
    reached: impl Fn((u64, u64, u64)) -> bool,
    mut round: impl FnMut(),
) {
    let start = Instant::now();
    let before = rollback_races();
    let mut rounds = 0;
    let raced = loop {
        round();
        rounds += 1;
        let now = rollback_races();
        let raced = (now.0 - before.0, now.1 - before.1, now.2 - before.2);
        if reached(raced) || start.elapsed() > REACH_WITHIN {
            break raced;
        }
    };
    let took = start.elapsed();
    eprintln!(
        "{name}: {rounds} rounds in {took:.1?}, rollbacks raced (moved, gone, after reset): {raced:?}"
    );
    assert!(
        reached(raced),
        "{name}: not reached in {took:.1?} ({rounds} rounds): rollbacks raced (moved, gone, after reset) {raced:?}"
    );
}

/// Keyed, two limits, 4 keys of room per limit for 16 keys, `clear` in a
/// loop: evictions for room, inserts, migrations and clears race the
/// charges and rollbacks. Reached: rollbacks that found their bucket
/// evicted or cleared (`EvictFullest`), and that found its state moved.
#[test]
fn keyed_rollbacks_racing_clear_and_eviction_admit_once_per_bucket() {
    let _serial = serial();
    let dog = Watchdog::start(
        "keyed rollbacks racing clear",
        Duration::from_secs(20),
        Duration::from_secs(180),
    );
    for policy in [OverflowPolicy::EvictFullest, OverflowPolicy::Deny] {
        let evicts = policy == OverflowPolicy::EvictFullest;
        let reached = |(moved, gone, _): (u64, u64, u64)| moved >= 100 && (!evicts || gone >= 100);
        rounds_until_reached(&format!("{policy:?}"), reached, || {
            clear_race_round(policy, &dog)
        });
    }
    dog.finish();
}

/// One round of [`keyed_rollbacks_racing_clear_and_eviction_admit_once_per_bucket`].
fn clear_race_round(policy: OverflowPolicy, dog: &Watchdog) {
    let quotas: Quotas = "1/h burst 1000; 1/h burst 1".parse().unwrap();
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(10));
    let limiter = KeyedMultiLimiter::<u64, _>::builder(quotas)
        .clock(clock)
        .max_keys(4)
        .overflow(policy)
        .build();
    let admitted = AtomicU64::new(0);
    let clears = AtomicU64::new(0);
    race_with(
        |t, i| {
            // The threads walk the keys in different orders, so they meet
            // on cells, inserts and evictions.
            let key = (i * (2 * t + 1)) % 16;
            if limiter.check(&key).is_allowed() {
                admitted.fetch_add(1, Ordering::Relaxed);
            }
            dog.tick();
        },
        Some(&|| {
            limiter.clear();
            clears.fetch_add(1, Ordering::Relaxed);
            dog.tick();
        }),
    );
    let last = limiter.limits()[1].stats();
    let held = last.keys_held + last.overflow_evictions + last.resets + last.idle_evictions;
    assert_eq!(
        admitted.load(Ordering::Relaxed),
        held,
        "{policy:?}: admitted requests against the buckets the last limit held ({last:?})"
    );
    assert!(clears.load(Ordering::Relaxed) > 0);
    if policy == OverflowPolicy::Deny {
        assert!(
            last.overflow_refusals > 0 || limiter.limits()[0].stats().overflow_refusals > 0,
            "the tiny bound never refused a key"
        );
    }
}

/// Keyed, no clear: eight keys fill both limits before the race (so no
/// insert or migration runs during it), then four threads hammer them and
/// eight keys that find no room. Past its burst of 3 the last limit denies
/// every check of a key after the first limit charged it: that charge is
/// rolled back, racing the other threads' charges and rollbacks on the
/// same cell. Exact: each tracked key admitted 3, holds exactly 3 in the
/// first limit; the others admitted nothing and are tracked nowhere.
/// Reached: rollbacks that found the state moved since their charge.
#[test]
fn keyed_denials_by_the_last_limit_roll_back_exactly() {
    let _serial = serial();
    let dog = Watchdog::start(
        "keyed denials roll back",
        Duration::from_secs(20),
        Duration::from_secs(180),
    );
    rounds_until_reached(
        "denials",
        |(moved, _, _)| moved >= 100,
        || denials_round(&dog),
    );
    dog.finish();
}

/// One round of [`keyed_denials_by_the_last_limit_roll_back_exactly`].
fn denials_round(dog: &Watchdog) {
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(10));
    let limiter =
        KeyedMultiLimiter::<u64, _>::builder("1/h burst 1000; 1/h burst 3".parse().unwrap())
            .clock(clock)
            .max_keys(8)
            .overflow(OverflowPolicy::Deny)
            .build();
    let admitted: Vec<AtomicU64> = (0..16).map(|_| AtomicU64::new(0)).collect();
    for key in 0..8u64 {
        assert!(limiter.check(&key).is_allowed());
        admitted[key as usize].fetch_add(1, Ordering::Relaxed);
    }
    race_with(
        |t, i| {
            let key = (i * (2 * t + 1) + t) % 16;
            if limiter.check(&key).is_allowed() {
                admitted[key as usize].fetch_add(1, Ordering::Relaxed);
            }
            dog.tick();
        },
        None,
    );
    let (first, last) = (&limiter.limits()[0], &limiter.limits()[1]);
    for key in 0..16u64 {
        let admitted = admitted[key as usize].load(Ordering::Relaxed);
        let used = 999 - first.peek(&key).remaining();
        let expected = if key < 8 { 3 } else { 0 };
        assert_eq!(admitted, expected, "key {key}: admitted");
        assert_eq!(used, expected, "key {key}: charges the first limit holds");
        assert_eq!(
            last.peek(&key).is_denied(),
            key < 8,
            "key {key}: the last limit"
        );
    }
    assert_eq!((first.len(), last.len()), (8, 8));
    assert!(
        first.stats().overflow_refusals > 0,
        "no key ever found no room"
    );
}

/// Direct, two limits, the last of burst 1, both buckets reset in a loop:
/// each admission is the one the last limit's bucket allows between two
/// resets, and a rollback of a charge made before a reset of the first
/// limit takes nothing out of the new bucket. Reached: rollbacks that
/// found a reset since their charge, and that found the state moved.
#[test]
fn direct_rollbacks_racing_resets_admit_once_per_bucket() {
    let _serial = serial();
    let dog = Watchdog::start(
        "direct rollbacks racing resets",
        Duration::from_secs(20),
        Duration::from_secs(180),
    );
    let reached = |(moved, _, after_reset): (u64, u64, u64)| moved >= 100 && after_reset >= 10;
    rounds_until_reached("direct", reached, || direct_reset_round(&dog));
    dog.finish();
}

/// One round of [`direct_rollbacks_racing_resets_admit_once_per_bucket`].
fn direct_reset_round(dog: &Watchdog) {
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(10));
    let limiter = MultiLimiter::builder("1/h burst 1000; 1/h burst 1".parse().unwrap())
        .clock(clock)
        .build();
    let admitted = AtomicU64::new(0);
    let emptied = AtomicU64::new(0);
    race_with(
        |_, _| {
            if limiter.check().is_allowed() {
                admitted.fetch_add(1, Ordering::Relaxed);
            }
            dog.tick();
        },
        Some(&|| {
            if limiter.limits()[1].reset() {
                emptied.fetch_add(1, Ordering::Relaxed);
            }
            // The first limit's bucket too: a rollback of a charge made
            // before this reset finds it, and takes nothing out.
            limiter.limits()[0].reset();
            dog.tick();
        }),
    );
    let in_use = u64::from(limiter.limits()[1].peek().is_denied());
    assert_eq!(
        admitted.load(Ordering::Relaxed),
        emptied.load(Ordering::Relaxed) + in_use,
        "one admission per bucket of the last limit"
    );
    // Every other check was denied by the last limit and rolled the first
    // limit's charge back (or its bucket was never charged, or was reset
    // since): the first limit holds at most the admissions.
    let used = 999 - limiter.limits()[0].peek().remaining();
    assert!(
        used <= admitted.load(Ordering::Relaxed),
        "the first limit kept {used} charges for {} admissions",
        admitted.load(Ordering::Relaxed)
    );
}
