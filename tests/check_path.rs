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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use turnstile_rl::{KeyedMultiLimiter, ManualClock, MultiLimiter, OverflowPolicy, Quotas};
use turnstile_test_kit::watchdog::Watchdog;

const THREADS: u64 = 4;

/// Keyed, two limits, 4 keys of room per limit for 16 keys, `clear` in a
/// loop: evictions for room, inserts, migrations and clears race the
/// charges and rollbacks.
#[test]
fn keyed_rollbacks_racing_clear_and_eviction_admit_once_per_bucket() {
    let dog = Watchdog::start(
        "keyed rollbacks racing clear",
        Duration::from_secs(20),
        Duration::from_secs(120),
    );
    for policy in [OverflowPolicy::EvictFullest, OverflowPolicy::Deny] {
        let quotas: Quotas = "1/h burst 1000; 1/h burst 1".parse().unwrap();
        let clock = ManualClock::new();
        clock.set(Duration::from_secs(10));
        let limiter = KeyedMultiLimiter::<u64, _>::builder(quotas)
            .clock(clock)
            .max_keys(4)
            .overflow(policy)
            .build();
        let admitted = AtomicU64::new(0);
        let done = AtomicBool::new(false);
        let clears = AtomicU64::new(0);
        std::thread::scope(|s| {
            let workers: Vec<_> = (0..THREADS)
                .map(|t| {
                    let (limiter, admitted, dog) = (&limiter, &admitted, &dog);
                    s.spawn(move || {
                        for i in 0..40_000u64 {
                            // The threads walk the keys in different orders,
                            // so they meet on cells, inserts and evictions.
                            let key = (i * (2 * t + 1)) % 16;
                            if limiter.check(&key).is_allowed() {
                                admitted.fetch_add(1, Ordering::Relaxed);
                            }
                            dog.tick();
                        }
                    })
                })
                .collect();
            s.spawn(|| {
                while !done.load(Ordering::Relaxed) {
                    limiter.clear();
                    clears.fetch_add(1, Ordering::Relaxed);
                    dog.tick();
                    std::thread::yield_now();
                }
            });
            for worker in workers {
                worker.join().unwrap();
            }
            done.store(true, Ordering::Relaxed);
        });
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
    dog.finish();
}

/// Keyed, no clear: eight keys fill both limits before the race (so no
/// insert or migration runs during it), then four threads hammer them and
/// eight keys that find no room. Past its burst of 3 the last limit denies
/// every check of a key after the first limit charged it: that charge is
/// rolled back, racing the other threads' charges and rollbacks on the
/// same cell. Exact: each tracked key admitted 3, holds exactly 3 in the
/// first limit; the others admitted nothing and are tracked nowhere.
#[test]
fn keyed_denials_by_the_last_limit_roll_back_exactly() {
    let dog = Watchdog::start(
        "keyed denials roll back",
        Duration::from_secs(20),
        Duration::from_secs(120),
    );
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
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (limiter, admitted, dog) = (&limiter, &admitted, &dog);
            s.spawn(move || {
                for i in 0..20_000u64 {
                    let key = (i * (2 * t + 1) + t) % 16;
                    if limiter.check(&key).is_allowed() {
                        admitted[key as usize].fetch_add(1, Ordering::Relaxed);
                    }
                    dog.tick();
                }
            });
        }
    });
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
    dog.finish();
}

/// Direct, two limits, the last of burst 1, its bucket reset in a loop:
/// each admission is the one its bucket allows between two resets.
#[test]
fn direct_rollbacks_racing_resets_admit_once_per_bucket() {
    let dog = Watchdog::start(
        "direct rollbacks racing resets",
        Duration::from_secs(20),
        Duration::from_secs(120),
    );
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(10));
    let limiter = MultiLimiter::builder("1/h burst 1000; 1/h burst 1".parse().unwrap())
        .clock(clock)
        .build();
    let admitted = AtomicU64::new(0);
    let emptied = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                let (limiter, admitted, dog) = (&limiter, &admitted, &dog);
                s.spawn(move || {
                    for _ in 0..40_000 {
                        if limiter.check().is_allowed() {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                        dog.tick();
                    }
                })
            })
            .collect();
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                if limiter.limits()[1].reset() {
                    emptied.fetch_add(1, Ordering::Relaxed);
                }
                dog.tick();
                std::thread::yield_now();
            }
        });
        for worker in workers {
            worker.join().unwrap();
        }
        done.store(true, Ordering::Relaxed);
    });
    let in_use = u64::from(limiter.limits()[1].peek().is_denied());
    assert_eq!(
        admitted.load(Ordering::Relaxed),
        emptied.load(Ordering::Relaxed) + in_use,
        "one admission per bucket of the last limit"
    );
    // Every other check was denied by the last limit and rolled the first
    // limit's charge back (or its bucket was never charged): the first
    // limit holds the admissions only.
    let used = 999 - limiter.limits()[0].peek().remaining();
    assert!(
        used <= admitted.load(Ordering::Relaxed),
        "the first limit kept {used} charges for {} admissions",
        admitted.load(Ordering::Relaxed)
    );
    dog.finish();
}
