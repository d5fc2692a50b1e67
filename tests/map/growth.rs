//! Growth and migration: tables grow, shrink and compact while checks,
//! batches, refunds, resets, `evict_idle` and `clear` run on other threads.
//! Each test asserts that its race happened (migrations seen through
//! `capacity()`, buckets copied through `keys::copies`), that every key
//! kept its bucket (hot keys admit exactly their burst; a reset finds each
//! key once), and that a hang fails within seconds instead of stalling.
//! With `TRACE_MIGRATIONS=1` the growth-against-shrinking races print
//! their rounds every second.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use turnstile_rl::__private::HasherSeed as _;
use turnstile_rl::{KeyedLimiter, ManualClock, OverflowPolicy, Quota};
use turnstile_test_kit::heap;
use turnstile_test_kit::keys::SplitMix;
use turnstile_test_kit::within::within;

use crate::keys::{
    assert_keys_dropped_once, check, check_with, copies, count_by_reset, limiter, settle_counts,
    Counts, Id, Name, TestKey, TestShape as _, Tracked, LOOKUPS,
};
use crate::serial;
use crate::support::{
    bound_table, fast_quota, hot_quota, top_up, wait_progress, watchdog, Seen, HOT_BURST, PROGRESS,
};

/// Replayed deterministically: a shrinking migration is sized for
/// the live keys, and 300 new keys arrive between that count and the
/// successor's installation (the allocation hook stands in for the
/// preemption). The migration must still place every key, and return.
#[test]
fn a_shrinking_migration_raced_by_inserts_does_not_hang() {
    let _serial = serial();
    let clock = ManualClock::new();
    let limiter = Arc::new(
        KeyedLimiter::builder("1000/s burst 1".parse::<Quota>().unwrap())
            .clock(clock.clone())
            .test_shape()
            .build(),
    );
    for key in 0..1_300u64 {
        assert!(limiter.check(&key).is_allowed());
    }
    // 1,300 keys fill a table of 2,048 slots to below its fill limit
    // (four fifths: 1,638).
    assert_eq!(limiter.capacity(), 2_048);
    // Every bucket is full again at 1 ms. One check at 2 s takes this tick's
    // housekeeping, so the inserts below run none of their own.
    clock.set(Duration::from_secs(2));
    assert!(limiter.check(&u64::MAX).is_allowed());

    // The compacting thread: evict_idle evicts everything and starts a
    // migration into a table sized for the one live key (the smallest, 16
    // slots of 16 bytes: a `u64` key beside its cell), whose 256-byte slot
    // array it allocates after counting the live keys. It waits there. (Before the fix the table was 64 slots,
    // and this test hung there.)
    let evictor = {
        let limiter = limiter.clone();
        thread::spawn(move || {
            heap::pause_at(16 * 16);
            limiter.evict_idle()
        })
    };
    let paused = Instant::now();
    while !heap::is_paused() {
        assert!(
            paused.elapsed() < Duration::from_secs(10),
            "the evictor never allocated a 16-slot table"
        );
        thread::yield_now();
    }
    // Meanwhile: 300 new keys.
    let inserter = limiter.clone();
    within(
        Duration::from_secs(20),
        "inserting 300 keys during a shrink",
        move || {
            for key in 10_000..10_300u64 {
                assert!(inserter.check(&key).is_allowed());
            }
        },
    );
    heap::release();
    within(Duration::from_secs(20), "evict_idle", move || {
        evictor.join().unwrap()
    });
    // The idle keys are gone (evicted by `evict_idle`, or by the inserts'
    // migration chunks, which evict the idle buckets they meet); the busy
    // key and the 300 new ones are left.
    assert_eq!(limiter.len(), 301);
    // Every new key kept its state (burst 1: a second check is denied).
    let check = limiter.clone();
    within(
        Duration::from_secs(20),
        "checks after the shrink",
        move || {
            for key in 10_000..10_300u64 {
                assert!(check.check(&key).is_denied(), "key {key} lost its state");
            }
            assert!(check.check(&20_000).is_allowed());
        },
    );
}

/// The same race left to the scheduler, with no hook: three threads check
/// fresh keys while a fourth moves the clock and evicts, so shrinking
/// migrations start while inserts run. Bounded in time; a watchdog turns a
/// hang into a failure, and the test counts that shrinks really raced
/// inserts.
#[test]
fn shrinks_racing_fresh_keys_keep_making_progress() {
    let _serial = serial();
    const RUN: Duration = Duration::from_millis(2_500);
    let clock = ManualClock::new();
    let limiter = Arc::new(
        KeyedLimiter::builder("1000/s burst 1".parse::<Quota>().unwrap())
            .clock(clock.clone())
            .test_shape()
            .build(),
    );
    let checks = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..3u64)
        .map(|t| {
            let (limiter, checks, stop) = (limiter.clone(), checks.clone(), stop.clone());
            thread::spawn(move || {
                let mut key = t << 40;
                while !stop.load(Ordering::Relaxed) {
                    let _ = limiter.check(&key);
                    key += 1;
                    checks.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let (limiter2, checks2, stop2) = (limiter.clone(), checks.clone(), stop.clone());
    let shrinks = within(RUN * 12, "the evicting thread", move || {
        let started = Instant::now();
        let (mut shrinks, mut last_checks) = (0u64, 0u64);
        let mut last_progress = Instant::now();
        // At least RUN, and on until 10 shrinks have raced the inserts (a
        // loaded machine gives this thread fewer turns), within the cap.
        while started.elapsed() < RUN || (shrinks < 10 && started.elapsed() < RUN * 8) {
            let before = limiter2.capacity();
            clock.advance(Duration::from_millis(2));
            limiter2.evict_idle();
            if limiter2.capacity() < before {
                shrinks += 1;
            }
            // The workers must keep deciding too (a hang there shows as no
            // new checks for a long time).
            let now_checks = checks2.load(Ordering::Relaxed);
            if now_checks > last_checks {
                (last_checks, last_progress) = (now_checks, Instant::now());
            }
            assert!(
                last_progress.elapsed() < Duration::from_secs(5),
                "checks stopped making progress"
            );
        }
        stop2.store(true, Ordering::Relaxed);
        shrinks
    });
    for worker in workers {
        within(Duration::from_secs(10), "a checking thread", move || {
            worker.join().unwrap()
        });
    }
    assert!(
        shrinks >= 10,
        "only {shrinks} shrinking migrations: the race was not exercised"
    );
    assert!(checks.load(Ordering::Relaxed) > 10_000);
}

/// Keys one short of the map's next migration, every one spent, and the
/// housekeeping sweep's cursor placed so the whole-table sweep of `clear`
/// (before the fix) reached the table's first slots last. Fresh keys
/// inserted while `clear` runs start a migration, whose first chunks freeze
/// and copy those first slots' buckets before the sweep reaches them.
/// Every spent key live when `clear` began, and untouched since, must be
/// gone when it returns (a check of it admitted); before the fix, the
/// copied ones kept their state. (`evict_idle` runs the same code.)
#[test]
fn clear_forgets_every_key_through_a_migration_started_during_it() {
    let _serial = serial();
    let quota: Quota = "1/h".parse().unwrap();
    let mut reached = 0;
    for round in 0..5 {
        let clock = ManualClock::new();
        let limiter = KeyedLimiter::<u64>::builder(quota)
            .clock(clock.clone())
            .test_shape()
            .build();
        // A table of 2^20 slots, whose migration has ended: every key is
        // in it and none is dead, so the next one starts a migration at
        // half full.
        let mut spent = 0u64;
        while limiter.capacity() < 1 << 20 || limiter.len() < 1 << 18 {
            assert!(limiter.check(&spent).is_allowed());
            spent += 1;
        }
        let capacity = limiter.capacity();
        assert_eq!(capacity, 1 << 20);
        while limiter.len() < capacity / 2 - 1 {
            assert!(limiter.check(&spent).is_allowed());
            spent += 1;
        }
        // Each tick's housekeeping sweeps 256 slots from the cursor: 64
        // ticks put it 16,384 slots in, past the 200 chunks of 64 slots
        // the fresh keys below copy. The tick key fills the table to half.
        for _ in 0..64 {
            clock.advance(Duration::from_millis(1));
            let _ = limiter.check(&u64::MAX);
        }
        assert_eq!(limiter.len(), capacity / 2);
        let limiter = Arc::new(limiter);
        let clearing = Arc::new(AtomicBool::new(false));
        let inserted_while_clearing = Arc::new(AtomicUsize::new(0));
        let barrier = Arc::new(Barrier::new(2));
        let inserter = {
            let (limiter, clearing, inserted, barrier) = (
                Arc::clone(&limiter),
                Arc::clone(&clearing),
                Arc::clone(&inserted_while_clearing),
                Arc::clone(&barrier),
            );
            thread::spawn(move || {
                barrier.wait();
                for fresh in 0..200u64 {
                    let _ = limiter.check(&(u64::MAX / 2 + fresh));
                    if clearing.load(Ordering::SeqCst) {
                        inserted.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        };
        let cleared = Arc::clone(&limiter);
        within(Duration::from_secs(30), "clear()", move || {
            clearing.store(true, Ordering::SeqCst);
            barrier.wait();
            cleared.clear();
            clearing.store(false, Ordering::SeqCst);
        });
        inserter.join().unwrap();
        let kept = (0..spent)
            .filter(|key| limiter.check(key).is_denied())
            .count();
        assert_eq!(
            kept, 0,
            "round {round}: spent keys kept their state through clear()"
        );
        // The first fresh key starts the migration (the table is half
        // full), so any fresh key checked while `clear` ran means the
        // migration started during it.
        if inserted_while_clearing.load(Ordering::SeqCst) > 0 {
            reached += 1;
        }
    }
    assert!(reached > 0, "no round migrated while clear() ran");
}

// ---------------------------------------------------------------------------
// Hot keys exact while the table grows and shrinks under them.

/// Watches `capacity()` from a thread and records how often it grew and
/// shrank (each change is a finished migration).
#[derive(Default)]
struct Migrations {
    grew: AtomicUsize,
    shrank: AtomicUsize,
}
impl Migrations {
    fn saw(&self, before: &mut usize, now: usize) {
        if now > *before {
            self.grew.fetch_add(1, Ordering::Relaxed);
        } else if now < *before {
            self.shrank.fetch_add(1, Ordering::Relaxed);
        }
        *before = now;
    }
}

/// The shared shape of the exact-burst races: `hot` threads hammer 16 hot
/// keys (quota 1/h burst 20) through `hot_check`; two churn threads insert
/// fresh keys on a 1 ms quota (growth); one thread moves the clock 5 ms at a
/// time and calls `evict_idle` (shrinking, and housekeeping on every check).
/// The clock moves 2 s in all, so each hot key admits exactly its burst.
fn exact_burst_race(
    counts: &'static Counts,
    hot: usize,
    batch: bool,
) -> (Vec<u64>, usize, usize, u64) {
    let clock = ManualClock::new();
    let limiter: KeyedLimiter<Tracked, ManualClock> = KeyedLimiter::builder(hot_quota())
        .clock(clock.clone())
        .test_shape()
        .build();
    const HOT_KEYS: u64 = 16;
    let hot_keys: Vec<Tracked> = (0..HOT_KEYS)
        .map(|i| Tracked::new(1 << 40 | i, counts))
        .collect();
    let admitted: Vec<AtomicU64> = (0..HOT_KEYS).map(|_| AtomicU64::new(0)).collect();
    let stop = AtomicBool::new(false);
    let migrations = Migrations::default();
    let fast = fast_quota();
    // New churn keys allowed per step: enough for the table to grow several
    // times between two sweeps, and a bound on what a step's `evict_idle`
    // migrates however long the driver waits to be scheduled (without it
    // the churn piled up on a loaded machine, and each slower step made
    // the next one slower still).
    const CHURN_PER_STEP: u64 = 4_096;
    let churn_budget = AtomicU64::new(CHURN_PER_STEP);
    thread::scope(|s| {
        for t in 0..hot {
            let (limiter, hot_keys, admitted, stop) = (&limiter, &hot_keys, &admitted, &stop);
            s.spawn(move || {
                let mut rng = SplitMix(t as u64 + 1);
                let mut out = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    if batch {
                        let start = (rng.next() % HOT_KEYS) as usize;
                        let keys: Vec<Tracked> = (0..8)
                            .map(|j| hot_keys[(start + j * 3) % HOT_KEYS as usize].clone())
                            .collect();
                        limiter.check_batch(&keys, &mut out);
                        for (key, decision) in keys.iter().zip(&out) {
                            if decision.is_allowed() {
                                admitted[(key.id & 0xff) as usize].fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    } else {
                        let i = (rng.next() % HOT_KEYS) as usize;
                        if limiter.check(&hot_keys[i]).is_allowed() {
                            admitted[i].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    PROGRESS.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        for t in 0..2u64 {
            let (limiter, stop, fast, churn_budget) = (&limiter, &stop, &fast, &churn_budget);
            s.spawn(move || {
                let mut id = t << 32;
                while !stop.load(Ordering::Relaxed) {
                    let spent =
                        churn_budget.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                            b.checked_sub(1)
                        });
                    if spent.is_err() {
                        thread::yield_now();
                        continue;
                    }
                    id += 1;
                    let _ = limiter.check_with(&Tracked::new(id, counts), fast);
                    PROGRESS.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        let mut capacity = limiter.capacity();
        let mut last = PROGRESS.load(Ordering::Relaxed);
        // At most 400 steps (2 s of the clock); on a loaded machine, fewer:
        // the steps end after `STEPS_FOR` once the table has grown and
        // shrunk three times each (each hot key admits exactly its burst
        // however far the clock got: its quota is 1/h).
        const STEPS_FOR: Duration = Duration::from_secs(30);
        let started = Instant::now();
        for _ in 0..400 {
            let reached = migrations.grew.load(Ordering::Relaxed) >= 3
                && migrations.shrank.load(Ordering::Relaxed) >= 3;
            if reached && started.elapsed() > STEPS_FOR {
                break;
            }
            wait_progress(&mut last, 500);
            clock.advance(Duration::from_millis(5));
            limiter.evict_idle();
            churn_budget.store(CHURN_PER_STEP, Ordering::Relaxed);
            migrations.saw(&mut capacity, limiter.capacity());
            for _ in 0..20 {
                thread::yield_now();
                migrations.saw(&mut capacity, limiter.capacity());
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    top_up("exact burst", &admitted, HOT_BURST, |i| {
        limiter.check(&hot_keys[i]).is_allowed()
    });
    // Every hot key is exhausted; nothing else is tracked after a sweep at
    // the same reading but the hot keys.
    limiter.evict_idle();
    let len_after = limiter.len();
    clock.advance(Duration::from_secs(365 * 24 * 3600));
    let evicted = limiter.evict_idle();
    assert_eq!(limiter.len(), 0, "len after evicting everything");
    assert_eq!(evicted, len_after, "evict_idle evicted what len counted");
    let out = admitted.iter().map(|a| a.load(Ordering::Relaxed)).collect();
    let stats = limiter.stats();
    drop(hot_keys);
    drop(limiter);
    (
        out,
        migrations.grew.load(Ordering::Relaxed),
        migrations.shrank.load(Ordering::Relaxed),
        stats.idle_evictions,
    )
}

fn check_exact(name: &str, counts: &'static Counts, result: (Vec<u64>, usize, usize, u64)) {
    settle_counts(counts);
    let (admitted, grew, shrank, idle) = result;
    eprintln!(
        "{name}: admitted per hot key {admitted:?}; migrations seen: grew {grew}, shrank {shrank}; idle evictions {idle}; keys made {} dropped {}",
        counts.made(),
        counts.dropped()
    );
    assert!(
        grew >= 3 && shrank >= 3,
        "the race was not reached: grew {grew}, shrank {shrank}"
    );
    assert!(
        admitted.iter().all(|&a| a == HOT_BURST),
        "a hot key admitted other than exactly its burst: {admitted:?}"
    );
    assert_eq!(counts.made(), counts.dropped(), "keys made vs dropped");
}

/// Exact admissions per hot key while the table grows and
/// shrinks under it (6 hot threads, 2 churn threads, 1 evictor on 2 cores).
#[test]
fn exact_burst_while_growth_and_shrinking_race() {
    let _serial = serial();
    static COUNTS: Counts = Counts::new();
    let result = within(Duration::from_secs(120), "exact burst", || {
        exact_burst_race(&COUNTS, 5, false)
    });
    check_exact("check", &COUNTS, result);
}

/// The same through `check_batch` (prefetches, one pin per batch).
#[test]
fn exact_burst_through_batches_while_migrations_race() {
    let _serial = serial();
    static COUNTS: Counts = Counts::new();
    let result = within(
        Duration::from_secs(120),
        "exact burst through batches",
        || exact_burst_race(&COUNTS, 4, true),
    );
    check_exact("check_batch", &COUNTS, result);
}

/// Refunds, peeks and resets racing the checks of hot keys while
/// churn makes the table migrate both ways. On a frozen-for-the-hot-keys
/// clock: burst <= admitted <= burst + successful refunds for refunded keys,
/// burst <= admitted <= burst * (resets + 1) for reset keys.
#[test]
fn refund_peek_reset_racing_migrations_stay_within_bounds() {
    let _serial = serial();
    static COUNTS: Counts = Counts::new();
    let (admitted, refunds, resets, changes) =
        within(Duration::from_secs(120), "refund/peek/reset", || {
            let clock = ManualClock::new();
            let limiter: KeyedLimiter<Tracked, ManualClock> = KeyedLimiter::builder(hot_quota())
                .clock(clock.clone())
                .test_shape()
                .build();
            const N: u64 = 8;
            let keys: Vec<Tracked> = (0..N).map(|i| Tracked::new(1 << 41 | i, &COUNTS)).collect();
            let admitted: Vec<AtomicU64> = (0..N).map(|_| AtomicU64::new(0)).collect();
            let refunds: Vec<AtomicU64> = (0..N).map(|_| AtomicU64::new(0)).collect();
            let resets: Vec<AtomicU64> = (0..N).map(|_| AtomicU64::new(0)).collect();
            let stop = AtomicBool::new(false);
            let changes = AtomicUsize::new(0);
            let fast = fast_quota();
            thread::scope(|s| {
                for t in 0..3u64 {
                    let (limiter, keys, admitted, stop) = (&limiter, &keys, &admitted, &stop);
                    s.spawn(move || {
                        let mut rng = SplitMix(t + 7);
                        while !stop.load(Ordering::Relaxed) {
                            let i = (rng.next() % N) as usize;
                            if limiter.check(&keys[i]).is_allowed() {
                                admitted[i].fetch_add(1, Ordering::Relaxed);
                            }
                            PROGRESS.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                }
                {
                    let (limiter, keys, refunds, resets, stop) =
                        (&limiter, &keys, &refunds, &resets, &stop);
                    s.spawn(move || {
                        let mut rng = SplitMix(99);
                        while !stop.load(Ordering::Relaxed) {
                            let i = (rng.next() % N) as usize;
                            let _ = limiter.peek(&keys[i]);
                            // Keys 0..4 are refunded, 4..8 reset; rarely.
                            if rng.next().is_multiple_of(64) {
                                if i < 4 {
                                    if limiter.refund(&keys[i], 1).unwrap() {
                                        refunds[i].fetch_add(1, Ordering::Relaxed);
                                    }
                                } else if limiter.reset(&keys[i]) {
                                    resets[i].fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                    });
                }
                {
                    let (limiter, stop, fast) = (&limiter, &stop, &fast);
                    s.spawn(move || {
                        let mut id = 0;
                        while !stop.load(Ordering::Relaxed) {
                            id += 1;
                            let _ = limiter.check_with(&Tracked::new(id, &COUNTS), fast);
                            PROGRESS.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                }
                let mut capacity = limiter.capacity();
                let mut last = PROGRESS.load(Ordering::Relaxed);
                for _ in 0..400 {
                    wait_progress(&mut last, 500);
                    clock.advance(Duration::from_millis(5));
                    limiter.evict_idle();
                    for _ in 0..20 {
                        thread::yield_now();
                        let now = limiter.capacity();
                        if now != capacity {
                            changes.fetch_add(1, Ordering::Relaxed);
                            capacity = now;
                        }
                    }
                }
                stop.store(true, Ordering::Relaxed);
            });
            clock.advance(Duration::from_secs(365 * 24 * 3600));
            limiter.evict_idle();
            assert_eq!(limiter.len(), 0, "len after evicting everything");
            let load = |v: &Vec<AtomicU64>| -> Vec<u64> {
                v.iter().map(|a| a.load(Ordering::Relaxed)).collect()
            };
            let result = (
                load(&admitted),
                load(&refunds),
                load(&resets),
                changes.load(Ordering::Relaxed),
            );
            drop(keys);
            drop(limiter);
            result
        });
    settle_counts(&COUNTS);
    eprintln!(
        "refund/peek/reset: admitted {admitted:?} refunds {refunds:?} resets {resets:?} capacity changes {changes}; made {} dropped {}",
        COUNTS.made(),
        COUNTS.dropped()
    );
    assert!(
        changes >= 6,
        "the race was not reached: {changes} capacity changes"
    );
    assert!(refunds.iter().sum::<u64>() > 0 && resets.iter().sum::<u64>() > 0);
    for i in 0..4 {
        assert!(
            admitted[i] >= HOT_BURST && admitted[i] <= HOT_BURST + refunds[i],
            "key {i}: admitted {} with {} refunds",
            admitted[i],
            refunds[i]
        );
    }
    for i in 4..8 {
        assert!(
            admitted[i] >= HOT_BURST && admitted[i] <= HOT_BURST * (resets[i] + 1),
            "key {i}: admitted {} with {} resets",
            admitted[i],
            resets[i]
        );
    }
    assert_eq!(COUNTS.made(), COUNTS.dropped(), "keys made vs dropped");
}

/// Pure growth under contention on a frozen clock: 6 threads
/// insert the same 20,000 keys (burst 2) in different orders, each checking
/// every key 3 times, while the table grows from 16 to 65,536 slots with
/// every thread copying chunks and meeting frozen buckets. Then half the
/// keys are reset (a quarter of the table dead: compaction) while the
/// threads check the other half again. Each never-reset key admits exactly
/// 2 in total.
#[test]
fn exact_burst_for_thousands_of_keys_while_every_thread_grows_the_table() {
    let _serial = serial();
    static COUNTS: Counts = Counts::new();
    const N: u64 = 20_000;
    let (admitted, capacities, resets) = within(Duration::from_secs(120), "growth", || {
        let clock = ManualClock::new();
        let limiter: KeyedLimiter<Tracked, ManualClock> =
            KeyedLimiter::builder("1/h burst 2".parse::<Quota>().unwrap())
                .clock(clock.clone())
                .test_shape()
                .build();
        let keys: Vec<Tracked> = (0..N).map(|i| Tracked::new(i, &COUNTS)).collect();
        let admitted: Vec<AtomicU64> = (0..N).map(|_| AtomicU64::new(0)).collect();
        let capacities = Mutex::new(vec![limiter.capacity()]);
        let resets = AtomicU64::new(0);
        for phase in 0..2 {
            let running = AtomicUsize::new(6);
            thread::scope(|s| {
                {
                    let (limiter, capacities, running) = (&limiter, &capacities, &running);
                    s.spawn(move || {
                        while running.load(Ordering::Relaxed) > 0 {
                            let c = limiter.capacity();
                            let mut seen = capacities.lock().unwrap();
                            if *seen.last().unwrap() != c {
                                seen.push(c);
                            }
                            drop(seen);
                            thread::yield_now();
                        }
                    });
                }
                for t in 0..6u64 {
                    let running = &running;
                    let (limiter, keys, admitted, resets) = (&limiter, &keys, &admitted, &resets);
                    s.spawn(move || {
                        let mut rng = SplitMix(t * 77 + phase);
                        let offset = rng.next() % N;
                        let stride = [1, 7, 13, 17, 19, 23][t as usize];
                        for round in 0..3 {
                            for j in 0..N {
                                if j % 16 == 0 {
                                    thread::yield_now();
                                }
                                let i = ((offset + j * stride + round) % N) as usize;
                                if phase == 1 && i % 2 == 1 {
                                    if t == 0 && round == 0 && limiter.reset(&keys[i]) {
                                        resets.fetch_add(1, Ordering::Relaxed);
                                    }
                                    continue;
                                }
                                if limiter.check(&keys[i]).is_allowed() {
                                    admitted[i].fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            if t == 0 && phase == 1 {
                                limiter.evict_idle();
                            }
                        }
                        running.fetch_sub(1, Ordering::Relaxed);
                    });
                }
            });
        }
        let result = (
            admitted
                .iter()
                .map(|a| a.load(Ordering::Relaxed))
                .collect::<Vec<_>>(),
            capacities.into_inner().unwrap(),
            resets.load(Ordering::Relaxed),
        );
        clock.advance(Duration::from_secs(24 * 3600));
        limiter.evict_idle();
        assert_eq!(limiter.len(), 0);
        drop(keys);
        drop(limiter);
        result
    });
    settle_counts(&COUNTS);
    let wrong: Vec<(usize, u64)> = admitted
        .iter()
        .enumerate()
        .filter(|&(i, &a)| i % 2 == 0 && a != 2)
        .map(|(i, &a)| (i, a))
        .collect();
    eprintln!(
        "growth: capacities seen {capacities:?}, resets {resets}, keys admitting other than 2: {} {:?}; made {} dropped {}",
        wrong.len(),
        &wrong[..wrong.len().min(10)],
        COUNTS.made(),
        COUNTS.dropped()
    );
    assert!(
        capacities.len() >= 5,
        "the race was not reached: {capacities:?}"
    );
    assert!(resets > 100, "resets: {resets}");
    assert!(wrong.is_empty(), "lost updates or duplicate buckets");
    assert_eq!(COUNTS.made(), COUNTS.dropped(), "keys made vs dropped");
}

// ---------------------------------------------------------------------------
// Growth racing `evict_idle` and `clear`, with no bound on keys.

/// With `TRACE_MIGRATIONS` set, prints every second where a test's driving
/// thread is (its round), the table, and the workers' progress.
fn trace<K: TestKey>(
    limiter: &KeyedLimiter<K, ManualClock>,
    stop: &AtomicBool,
    progress: &AtomicU64,
    round: &AtomicU64,
) {
    if std::env::var_os("TRACE_MIGRATIONS").is_none() {
        return;
    }
    while !stop.load(Ordering::Relaxed) {
        thread::sleep(Duration::from_secs(1));
        eprintln!(
            "[trace: round {}, capacity {}, len {}, progress {}, copies {}]",
            round.load(Ordering::Relaxed),
            limiter.capacity(),
            limiter.len(),
            progress.load(Ordering::Relaxed),
            copies()
        );
    }
}

/// What the driving thread does at the end of each round of churn.
#[derive(Clone, Copy, Debug)]
enum Shrink {
    /// Move the clock 5 ms (the churn keys, on a 1 ms quota, go idle) and
    /// `evict_idle`: the hot keys (1/h) stay, exact.
    EvictIdle,
    /// `clear`: every key goes; the hot keys start again (counted per round).
    Clear,
}

/// Growth racing shrinking with no bound on keys: 6 threads insert 500
/// fresh keys each per round (each in-flight insert is counted in the
/// `len` that sizes a successor, and lands in it directly), growing the
/// table from 32 slots to 4096; when half of them are done with the round,
/// the driving thread shrinks the table (`evict_idle` or `clear`, racing
/// the other half's inserts), 150 rounds. 3 threads check 16 hot keys
/// (burst 20) throughout. Between two shrinks a hot key admits at most its
/// burst (exactly its burst in all, with `evict_idle`); every key is
/// dropped once; in the end nothing is left.
fn growth_against_shrinking<K: TestKey>(how: Shrink) {
    let _serial = serial();
    let name = format!("growth against {how:?}, {} keys", K::NAME);
    const BURST: u64 = 20;
    const HOT: u64 = 16;
    const WORKERS: u64 = 6;
    const PER_ROUND: u64 = 500;
    const ROUNDS: u64 = 150;
    let r = within(
        Duration::from_secs(50),
        "growth against shrinking",
        move || {
            let clock = ManualClock::new();
            let limiter: KeyedLimiter<K, ManualClock> =
                KeyedLimiter::builder(format!("1/h burst {BURST}").parse::<Quota>().unwrap())
                    .clock(clock.clone())
                    .hasher_seed(5)
                    .test_shape()
                    .build();
            let fast: Quota = "1000/s burst 1".parse().unwrap();
            let copies_before = copies();
            let stop = AtomicBool::new(false);
            // Admissions of each hot key in all, and since the last clear
            // (reset at each clear, while the hot checks are held off).
            let epoch = std::sync::RwLock::new(());
            let admitted: Vec<AtomicU64> = (0..HOT).map(|_| AtomicU64::new(0)).collect();
            let since_clear: Vec<AtomicU64> = (0..HOT).map(|_| AtomicU64::new(0)).collect();
            let most_since_clear = AtomicU64::new(0);
            let progress = AtomicU64::new(0);
            let round = AtomicU64::new(0);
            let done = AtomicU64::new(0);
            let biggest = AtomicUsize::new(0);
            let (mut grew, mut shrank, mut removed) = (0, 0, 0);
            thread::scope(|s| {
                {
                    let (limiter, stop, progress, round) = (&limiter, &stop, &progress, &round);
                    s.spawn(move || trace(limiter, stop, progress, round));
                }
                for t in 0..WORKERS {
                    let (limiter, stop, progress, fast) = (&limiter, &stop, &progress, &fast);
                    let (round, done, biggest) = (&round, &done, &biggest);
                    s.spawn(move || {
                        let mut id = (t + 1) << 40;
                        let mut mine = 0;
                        while !stop.load(Ordering::Relaxed) {
                            for i in 0..PER_ROUND {
                                id += 1;
                                LOOKUPS.fetch_add(1, Ordering::Relaxed);
                                let _ = limiter.check_with(&K::new(id), fast);
                                progress.fetch_add(1, Ordering::Relaxed);
                                if i % 16 == 0 {
                                    biggest.fetch_max(limiter.capacity(), Ordering::Relaxed);
                                }
                            }
                            done.fetch_add(1, Ordering::SeqCst);
                            while round.load(Ordering::SeqCst) == mine
                                && !stop.load(Ordering::Relaxed)
                            {
                                thread::yield_now();
                            }
                            mine += 1;
                        }
                    });
                }
                for t in 0..3u64 {
                    let (limiter, stop, epoch) = (&limiter, &stop, &epoch);
                    let (admitted, since_clear, most) =
                        (&admitted, &since_clear, &most_since_clear);
                    s.spawn(move || {
                        let keys: Vec<K> = (0..HOT).map(K::new).collect();
                        let mut rng = SplitMix(t + 21);
                        while !stop.load(Ordering::Relaxed) {
                            let i = (rng.next() % HOT) as usize;
                            let _epoch = epoch.read().unwrap();
                            if check(limiter, &keys[i]).is_allowed() {
                                admitted[i].fetch_add(1, Ordering::Relaxed);
                                let n = since_clear[i].fetch_add(1, Ordering::Relaxed) + 1;
                                most.fetch_max(n, Ordering::Relaxed);
                            }
                            drop(_epoch);
                            thread::yield_now();
                        }
                    });
                }
                let mut capacity = limiter.capacity();
                for r in 0..ROUNDS {
                    // Half the workers through this round's inserts (bounded).
                    let start = std::time::Instant::now();
                    while done.load(Ordering::SeqCst) < r * WORKERS + WORKERS / 2
                        && start.elapsed() < Duration::from_secs(5)
                    {
                        thread::yield_now();
                    }
                    match how {
                        Shrink::EvictIdle => {
                            clock.advance(Duration::from_millis(5));
                            removed += limiter.evict_idle();
                        }
                        Shrink::Clear => {
                            let _epoch = epoch.write().unwrap();
                            removed += limiter.clear();
                            for a in &since_clear {
                                a.store(0, Ordering::Relaxed);
                            }
                        }
                    }
                    let big = biggest.swap(0, Ordering::Relaxed).max(capacity);
                    if big > capacity {
                        grew += 1;
                    }
                    capacity = limiter.capacity();
                    if capacity < big {
                        shrank += 1;
                    }
                    // The rest of the round's inserts, then the next round.
                    let start = std::time::Instant::now();
                    while done.load(Ordering::SeqCst) < (r + 1) * WORKERS
                        && start.elapsed() < Duration::from_secs(5)
                    {
                        thread::yield_now();
                    }
                    round.store(r + 1, Ordering::SeqCst);
                }
                stop.store(true, Ordering::Relaxed);
            });
            if let Shrink::EvictIdle = how {
                top_up("growth against evict_idle", &admitted, BURST, |i| {
                    check(&limiter, &K::new(i as u64)).is_allowed()
                });
            }
            let admitted: Vec<u64> = admitted.iter().map(|a| a.load(Ordering::Relaxed)).collect();
            clock.advance(Duration::from_secs(365 * 24 * 3600));
            limiter.evict_idle();
            assert_eq!(limiter.len(), 0, "len after evicting everything");
            let copies_made = copies() - copies_before;
            drop(limiter);
            (
                grew,
                shrank,
                removed,
                admitted,
                most_since_clear.load(Ordering::Relaxed),
                copies_made,
            )
        },
    );
    let (grew, shrank, removed, admitted, most_since_clear, copies_made) = r;
    eprintln!(
        "{name}: grew {grew} and shrank {shrank} times in {ROUNDS} rounds, {removed} keys \
         removed by the shrinks, {copies_made} buckets copied; admitted per hot key \
         {admitted:?}, most by one between clears {most_since_clear}"
    );
    assert!(
        grew >= ROUNDS / 2 && shrank >= ROUNDS / 2,
        "{name}: not reached: grew {grew}, shrank {shrank}"
    );
    assert!(
        most_since_clear <= BURST,
        "{name}: a hot key admitted {most_since_clear} > {BURST} between clears"
    );
    match how {
        Shrink::EvictIdle => assert!(
            admitted.iter().all(|&a| a == BURST),
            "{name}: a hot key admitted other than its burst: {admitted:?}"
        ),
        // Clears may come faster than a hot key's burst is spent: only
        // the bound is asserted, and that hot keys were admitted at all.
        Shrink::Clear => assert!(most_since_clear > 0, "{name}: hot keys never admitted"),
    }
    assert_keys_dropped_once(&name);
}

#[test]
fn growth_racing_evict_idle_keeps_hot_keys_exact_u64() {
    growth_against_shrinking::<Id>(Shrink::EvictIdle);
}

#[test]
fn growth_racing_evict_idle_keeps_hot_keys_exact_string() {
    growth_against_shrinking::<Name>(Shrink::EvictIdle);
}

#[test]
fn growth_racing_clear_admits_at_most_the_burst_between_clears_u64() {
    growth_against_shrinking::<Id>(Shrink::Clear);
}

#[test]
fn growth_racing_clear_admits_at_most_the_burst_between_clears_string() {
    growth_against_shrinking::<Name>(Shrink::Clear);
}

/// No key is lost by growth with many inserts in flight: 200 limiters, each
/// grown from 16 slots to 1024 by 8 threads inserting 100 keys each at
/// once (no bound, frozen clock: no key may go). Each thread checks every
/// key of its own a second time 20 inserts later, which must find its
/// bucket (one request spent of a burst of 3); at the end every key is
/// there once. A copy that found no room would lose a bucket (release) or
/// fail a `debug_assert!` (debug).
fn growth_loses_no_key<K: TestKey>() {
    let _serial = serial();
    let name = format!("growth loses no key, {} keys", K::NAME);
    const LIMITERS: u64 = 200;
    const THREADS: u64 = 8;
    const KEYS: u64 = 100;
    let (grown, copies_made) = within(Duration::from_secs(50), "growth loses no key", || {
        let copies_before = copies();
        let mut grown = 0;
        for l in 0..LIMITERS {
            let limiter: KeyedLimiter<K, ManualClock> =
                KeyedLimiter::builder("1/h burst 3".parse::<Quota>().unwrap())
                    .clock(ManualClock::new())
                    .hasher_seed(l)
                    .test_shape()
                    .build();
            let barrier = std::sync::Barrier::new(THREADS as usize);
            thread::scope(|s| {
                for t in 0..THREADS {
                    let (limiter, barrier) = (&limiter, &barrier);
                    s.spawn(move || {
                        barrier.wait();
                        let keys: Vec<K> = (0..KEYS).map(|i| K::new(t * 1000 + i)).collect();
                        for (i, key) in keys.iter().enumerate() {
                            LOOKUPS.fetch_add(1, Ordering::Relaxed);
                            assert_eq!(limiter.check(key).remaining(), 2, "a new key");
                            if i >= 20 {
                                LOOKUPS.fetch_add(1, Ordering::Relaxed);
                                let again = limiter.check(&keys[i - 20]).remaining();
                                assert_eq!(again, 1, "key {:?} lost in growth", keys[i - 20]);
                            }
                        }
                    });
                }
            });
            assert_eq!(limiter.len(), (THREADS * KEYS) as usize);
            let mut capacity = limiter.capacity();
            while capacity > 16 {
                grown += 1;
                capacity /= 2;
            }
            let ids = (0..THREADS).flat_map(|t| (0..KEYS).map(move |i| t * 1000 + i));
            assert_eq!(
                count_by_reset(&limiter, ids, None),
                (THREADS * KEYS) as usize
            );
            assert_eq!(limiter.len(), 0);
        }
        (grown, copies() - copies_before)
    });
    eprintln!("{name}: {grown} growth migrations, {copies_made} buckets copied");
    assert!(
        grown >= LIMITERS * 5,
        "{name}: not reached: {grown} growth migrations"
    );
    assert_keys_dropped_once(&name);
}

#[test]
fn growth_loses_no_key_u64() {
    growth_loses_no_key::<Id>();
}

#[test]
fn growth_loses_no_key_string() {
    growth_loses_no_key::<Name>();
}

// ---------------------------------------------------------------------------
// `evict_idle` shrinking odd tables at the bound while inserts grow them.

/// 16 hot keys (1/h burst 20) checked by 3 threads (one through
/// `check_batch`) all along; 2 threads insert churn keys on a 1 ms quota,
/// `max_keys - 24` per step (the table grows through the fill limit of the
/// power of two below the bound into the bound's odd table: 1750 slots
/// for 1000, 875 for 500); a driver moves the clock 5 ms and calls
/// `evict_idle` 200 times (1 s in all), which shrinks the table, racing
/// the inserts that grow it back to the bound's (odd) table. `Deny`, and
/// room for the hot keys and every churn key of a step: no key is ever
/// refused or evicted for room, so each hot key admits exactly 20.
fn shrink_race(max_keys: usize) {
    let _serial = serial();
    let dog = watchdog("evict_idle race", Duration::from_secs(90));
    let started = Instant::now();
    const HOT: u64 = 16;
    const BURST: u64 = 20;
    let clock = ManualClock::new();
    let limiter = limiter::<Id>(
        &format!("1/h burst {BURST}"),
        &clock,
        max_keys,
        OverflowPolicy::Deny,
        max_keys as u64 + 7,
    );
    let fast: Quota = "1000/s burst 1".parse().unwrap();
    let budget_per_step = max_keys as u64 - HOT - 8;
    let budget = AtomicU64::new(budget_per_step);
    let admitted: Vec<AtomicU64> = (0..HOT).map(|_| AtomicU64::new(0)).collect();
    let stop = AtomicBool::new(false);
    let capacities = Mutex::new(BTreeSet::new());
    let (mut grew, mut shrank, mut evicted) = (0u64, 0u64, 0usize);
    let max_len = AtomicUsize::new(0);
    thread::scope(|s| {
        for t in 0..3u64 {
            let (limiter, admitted, stop, dog) = (&limiter, &admitted, &stop, &dog);
            s.spawn(move || {
                let keys: Vec<Id> = (0..HOT).map(|i| Id::new(1 << 50 | i)).collect();
                let mut rng = SplitMix(t + 5);
                let mut out = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    if t == 0 {
                        let start = (rng.next() % HOT) as usize;
                        let batch: Vec<Id> = (0..4)
                            .map(|j| keys[(start + j * 5) % HOT as usize].clone())
                            .collect();
                        LOOKUPS.fetch_add(batch.len() as u64, Ordering::Relaxed);
                        limiter.check_batch(&batch, &mut out);
                        for (key, d) in batch.iter().zip(&out) {
                            if d.is_allowed() {
                                admitted[(key.0 & 0xff) as usize].fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    } else {
                        let i = (rng.next() % HOT) as usize;
                        if check(limiter, &keys[i]).is_allowed() {
                            admitted[i].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    dog.tick();
                    thread::yield_now();
                }
            });
        }
        for t in 0..2u64 {
            let (limiter, budget, stop, fast, capacities, max_len, dog) =
                (&limiter, &budget, &stop, &fast, &capacities, &max_len, &dog);
            s.spawn(move || {
                let mut id = (t + 1) << 40;
                let mut seen = Seen::new();
                while !stop.load(Ordering::Relaxed) {
                    let spent = budget
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(1));
                    if spent.is_err() {
                        thread::yield_now();
                        continue;
                    }
                    id += 1;
                    let _ = check_with(limiter, &Id::new(id), fast);
                    max_len.fetch_max(limiter.len(), Ordering::Relaxed);
                    seen.saw(limiter.capacity());
                    dog.tick();
                }
                capacities.lock().unwrap().extend(seen.all);
            });
        }
        let mut capacity = limiter.capacity();
        for _ in 0..200 {
            let waiting = Instant::now();
            // All of this step's churn inserted (at most the two in flight
            // survive the eviction, not being idle yet): the table holds
            // up to `max_keys - 6` keys, its growth reached the bound's.
            while budget.load(Ordering::Relaxed) > 0 && waiting.elapsed() < Duration::from_secs(2) {
                thread::yield_now();
            }
            let before = limiter.capacity();
            if before > capacity {
                grew += 1;
            }
            clock.advance(Duration::from_millis(5));
            evicted += limiter.evict_idle();
            capacity = limiter.capacity();
            if capacity < before {
                shrank += 1;
            }
            capacities.lock().unwrap().insert(before);
            budget.store(budget_per_step, Ordering::Relaxed);
        }
        stop.store(true, Ordering::Relaxed);
    });
    let stats = limiter.stats();
    top_up("evict_idle race", &admitted, BURST, |i| {
        check(&limiter, &Id::new(1 << 50 | i as u64)).is_allowed()
    });
    let admitted: Vec<u64> = admitted.iter().map(|a| a.load(Ordering::Relaxed)).collect();
    clock.advance(Duration::from_millis(5));
    limiter.evict_idle();
    assert_eq!(limiter.len() as u64, HOT, "only the hot keys are left");
    clock.advance(Duration::from_secs(365 * 24 * 3600));
    assert_eq!(limiter.evict_idle() as u64, HOT);
    assert_eq!(limiter.len(), 0);
    drop(limiter);
    dog.finish();
    let capacities = capacities.into_inner().unwrap();
    eprintln!(
        "evict_idle race, max_keys {max_keys}: grew {grew}, shrank {shrank}, {evicted} evicted \
         by evict_idle, capacities {capacities:?}, max len {}, refusals {}, overflow evictions {}, \
         admitted per hot key {admitted:?}, {:?}",
        max_len.load(Ordering::Relaxed),
        stats.overflow_refusals,
        stats.overflow_evictions,
        started.elapsed()
    );
    let bound = bound_table(max_keys);
    assert!(
        capacities.contains(&bound),
        "not reached: the odd bound table {bound} not in {capacities:?}"
    );
    assert!(
        grew >= 20 && shrank >= 20,
        "not reached: grew {grew}, shrank {shrank}"
    );
    assert!(max_len.load(Ordering::Relaxed) <= max_keys);
    assert_eq!(stats.overflow_evictions, 0);
    assert_eq!(
        stats.overflow_refusals, 0,
        "a key refused: the room was there"
    );
    assert!(
        admitted.iter().all(|&a| a == BURST),
        "a hot key admitted other than its burst: {admitted:?}"
    );
    assert_keys_dropped_once("evict_idle race");
}

#[test]
fn evict_idle_racing_growth_to_the_odd_bound_of_1000_keeps_hot_keys_exact() {
    shrink_race(1000);
}

/// 500: the table of 512 slots fills at 410 and grows into 875.
#[test]
fn evict_idle_racing_growth_to_the_odd_bound_of_500_keeps_hot_keys_exact() {
    shrink_race(500);
}
