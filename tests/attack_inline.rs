//! Adversarial review of the inline-slot map (cells and keys in the table,
//! frozen before they are copied). Each test races one part of the
//! protocol through the public API, bounds itself with a watchdog, and
//! asserts that it reached its race (migrations seen through `capacity()`
//! changes, evictions through `stats()`).
//!
//! Keys count themselves: every key made (`new` or `clone`) must be dropped
//! exactly once by the time the limiter and the threads that used it are
//! gone. A key dropped twice, or never, shows as `made != dropped`.
//!
//! The counting allocator is process-wide: the tests take turns.

use std::hash::{Hash, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::Duration;

use turnstile_rl::__private::HasherSeed as _;
use turnstile_rl::{KeyedLimiter, ManualClock, OverflowPolicy, Quota};

use turnstile_test_kit::heap;
use turnstile_test_kit::keys::SplitMix;
use turnstile_test_kit::within;
use within::within;

/// The kit's counting allocator: heap bytes held, and a pause at one allocation.
#[global_allocator]
static HEAP: heap::Counting = heap::Counting;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    eprintln!("[heap live at test start: {} B]", heap::live());
    guard
}

/// Checks made by a test's workers: the thread driving the clock waits for
/// them between its steps, so the race happens even when the workers are
/// slow to be scheduled (2 shared cores).
static PROGRESS: AtomicU64 = AtomicU64::new(0);

fn wait_progress(last: &mut u64, n: u64) {
    let start = std::time::Instant::now();
    while PROGRESS.load(Ordering::Relaxed) < *last + n && start.elapsed() < Duration::from_secs(2) {
        thread::yield_now();
    }
    *last = PROGRESS.load(Ordering::Relaxed);
}

/// Holds this thread until the replay's `stage` reaches `at_least`: the
/// gate through which each replay's `Hash` and `Eq` force their
/// interleaving (defects A and B). A stage that never comes fails the test
/// instead of hanging it.
fn wait_for(stage: &AtomicUsize, at_least: usize) {
    let start = std::time::Instant::now();
    while stage.load(Ordering::SeqCst) < at_least {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "stage {at_least} never came"
        );
        thread::yield_now();
    }
}

/// Made/dropped counters for one test's keys.
#[derive(Debug)]
struct Counts {
    made: AtomicUsize,
    dropped: AtomicUsize,
}
impl Counts {
    const fn new() -> Self {
        Counts {
            made: AtomicUsize::new(0),
            dropped: AtomicUsize::new(0),
        }
    }
    fn made(&self) -> usize {
        self.made.load(Ordering::SeqCst)
    }
    fn dropped(&self) -> usize {
        self.dropped.load(Ordering::SeqCst)
    }
}

/// Waits (up to 2 s) for keys still held by the epoch garbage of threads
/// that are exiting (their thread-local handles are let go after `scope`
/// returns, and hand their garbage to the collector then) to be dropped.
/// Garbage is freed by later pins of any map: each round drops a map, whose
/// drop pins and flushes. A double drop shows at once as dropped > made.
fn settle(counts: &Counts) {
    for _ in 0..200 {
        if counts.dropped() >= counts.made() {
            return;
        }
        drop(KeyedLimiter::<u64>::new(hot_quota()));
        thread::sleep(Duration::from_millis(10));
    }
}

/// A key that owns heap memory and counts its drops.
#[derive(Debug)]
struct Key {
    id: u64,
    name: String,
    counts: &'static Counts,
}
impl Key {
    fn new(id: u64, counts: &'static Counts) -> Self {
        counts.made.fetch_add(1, Ordering::SeqCst);
        Key {
            id,
            name: format!("key-{id}"),
            counts,
        }
    }
}
impl Clone for Key {
    fn clone(&self) -> Self {
        Key::new(self.id, self.counts)
    }
}
impl Drop for Key {
    fn drop(&mut self) {
        self.counts.dropped.fetch_add(1, Ordering::SeqCst);
    }
}
impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id && self.name == other.name
    }
}
impl Eq for Key {}
impl Hash for Key {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.id.hash(h);
        self.name.hash(h);
    }
}

const HOT_BURST: u64 = 20;

fn hot_quota() -> Quota {
    format!("1/h burst {HOT_BURST}").parse().unwrap()
}

/// Quota for churn keys: idle 1 ms after their one request.
fn fast_quota() -> Quota {
    "1000/s burst 1".parse().unwrap()
}

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

/// The shared shape of the exact-burst attacks: `hot` threads hammer 16 hot
/// keys (quota 1/h burst 20) through `hot_check`; two churn threads insert
/// fresh keys on a 1 ms quota (growth); one thread moves the clock 5 ms at a
/// time and calls `evict_idle` (shrinking, and housekeeping on every check).
/// The clock moves 2 s in all, so each hot key admits exactly its burst.
fn exact_burst_attack(
    counts: &'static Counts,
    hot: usize,
    batch: bool,
) -> (Vec<u64>, usize, usize, u64) {
    let clock = ManualClock::new();
    let limiter: KeyedLimiter<Key, ManualClock> = KeyedLimiter::builder(hot_quota())
        .clock(clock.clone())
        .build();
    const HOT_KEYS: u64 = 16;
    let hot_keys: Vec<Key> = (0..HOT_KEYS)
        .map(|i| Key::new(1 << 40 | i, counts))
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
                        let keys: Vec<Key> = (0..8)
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
                    let _ = limiter.check_with(&Key::new(id, counts), fast);
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
            churn_budget.store(CHURN_PER_STEP, Ordering::Relaxed);
            migrations.saw(&mut capacity, limiter.capacity());
            for _ in 0..20 {
                thread::yield_now();
                migrations.saw(&mut capacity, limiter.capacity());
            }
        }
        stop.store(true, Ordering::Relaxed);
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
    settle(counts);
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

/// Attack 1: exact admissions per hot key while the table grows and
/// shrinks under it (6 hot threads, 2 churn threads, 1 evictor on 2 cores).
#[test]
fn exact_burst_while_growth_and_shrinking_race() {
    let _serial = serial();
    static COUNTS: Counts = Counts::new();
    let result = within(Duration::from_secs(120), "exact burst attack", || {
        exact_burst_attack(&COUNTS, 5, false)
    });
    check_exact("check", &COUNTS, result);
}

/// Attack 2: the same through `check_batch` (prefetches, one pin per batch).
#[test]
fn exact_burst_through_batches_while_migrations_race() {
    let _serial = serial();
    static COUNTS: Counts = Counts::new();
    let result = within(Duration::from_secs(120), "batch attack", || {
        exact_burst_attack(&COUNTS, 4, true)
    });
    check_exact("check_batch", &COUNTS, result);
}

/// Attack 3: `max_keys` 100 under `EvictFullest`, 6 threads of random keys,
/// one thread jumping the clock and evicting idle keys. `len` must never
/// pass `max_keys`, must end at 0, and every key is dropped once.
#[test]
fn evict_fullest_at_small_max_keys_keeps_len_and_keys_exact() {
    let _serial = serial();
    const MAX_KEYS: usize = 100;
    static CHECKS: AtomicU64 = AtomicU64::new(0);
    static COUNTS: Counts = Counts::new();
    let (overflow, max_len, migrations) = within(Duration::from_secs(120), "evict fullest", || {
        let clock = ManualClock::new();
        let limiter: KeyedLimiter<Key, ManualClock> =
            KeyedLimiter::builder("10/s burst 3".parse::<Quota>().unwrap())
                .clock(clock.clone())
                .max_keys(MAX_KEYS)
                .overflow(OverflowPolicy::EvictFullest)
                .build();
        let stop = AtomicBool::new(false);
        let max_len = AtomicUsize::new(0);
        let changes = AtomicUsize::new(0);
        let pause = AtomicBool::new(false);
        thread::scope(|s| {
            for t in 0..6u64 {
                let (limiter, stop, max_len, pause) = (&limiter, &stop, &max_len, &pause);
                s.spawn(move || {
                    let mut rng = SplitMix(t + 100);
                    while !stop.load(Ordering::Relaxed) {
                        if pause.load(Ordering::Relaxed) {
                            thread::yield_now();
                            continue;
                        }
                        let key = Key::new(rng.next() % 1_000, &COUNTS);
                        let _ = limiter.check(&key);
                        CHECKS.fetch_add(1, Ordering::Relaxed);
                        PROGRESS.fetch_add(1, Ordering::Relaxed);
                        if rng.next().is_multiple_of(16) {
                            let _ = limiter.reset(&key);
                        }
                        max_len.fetch_max(limiter.len(), Ordering::Relaxed);
                    }
                });
            }
            let mut capacity = limiter.capacity();
            let mut last = PROGRESS.load(Ordering::Relaxed);
            for i in 0..300 {
                wait_progress(&mut last, 500);
                // Every 10th step the workers pause, so that evicting
                // everything shrinks the table (and refilling grows it);
                // the other steps race evict_idle against the inserts.
                let jump = i % 10 == 0;
                if jump {
                    pause.store(true, Ordering::Relaxed);
                    thread::sleep(Duration::from_millis(2));
                }
                clock.advance(Duration::from_millis(if jump { 2_000 } else { 3 }));
                limiter.evict_idle();
                // Sampled before the workers resume too: they refill the
                // shrunk table within microseconds.
                let now = limiter.capacity();
                if now != capacity {
                    changes.fetch_add(1, Ordering::Relaxed);
                    capacity = now;
                }
                pause.store(false, Ordering::Relaxed);
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
        let stats = limiter.stats();
        clock.advance(Duration::from_secs(3600));
        limiter.evict_idle();
        assert_eq!(limiter.len(), 0, "len after evicting everything");
        drop(limiter);
        (
            stats.overflow_evictions,
            max_len.load(Ordering::Relaxed),
            changes.load(Ordering::Relaxed),
        )
    });
    settle(&COUNTS);
    thread::sleep(Duration::from_millis(200));
    eprintln!(
        "[evict fullest: heap live after the limiter is dropped: {} B]",
        heap::live()
    );
    eprintln!(
        "evict fullest: {} checks, overflow evictions {overflow}, max len seen {max_len}, capacity changes {migrations}, made {} dropped {}",
        CHECKS.load(Ordering::Relaxed),
        COUNTS.made(),
        COUNTS.dropped()
    );
    assert!(
        overflow > 100,
        "the race was not reached: {overflow} overflow evictions"
    );
    assert!(
        migrations >= 6,
        "the race was not reached: {migrations} capacity changes"
    );
    assert!(max_len <= MAX_KEYS, "len passed max_keys: {max_len}");
    assert_eq!(COUNTS.made(), COUNTS.dropped(), "keys made vs dropped");
}

/// Attack 4: refunds, peeks and resets racing the checks of hot keys while
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
            let limiter: KeyedLimiter<Key, ManualClock> = KeyedLimiter::builder(hot_quota())
                .clock(clock.clone())
                .build();
            const N: u64 = 8;
            let keys: Vec<Key> = (0..N).map(|i| Key::new(1 << 41 | i, &COUNTS)).collect();
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
                            let _ = limiter.check_with(&Key::new(id, &COUNTS), fast);
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
    settle(&COUNTS);
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

/// Attack 6: memory is given back. A limiter that went through many
/// migrations on 6 threads, dropped after its threads exit, leaves the heap
/// where it found it (within slack for thread-local bookkeeping).
#[test]
fn memory_is_returned_after_many_migrations() {
    let _serial = serial();
    static COUNTS: Counts = Counts::new();
    let before = heap::live();
    within(Duration::from_secs(120), "memory", || {
        let clock = ManualClock::new();
        let limiter: KeyedLimiter<Key, ManualClock> = KeyedLimiter::builder(fast_quota())
            .clock(clock.clone())
            .build();
        thread::scope(|s| {
            for t in 0..6u64 {
                let (limiter, clock) = (&limiter, &clock);
                s.spawn(move || {
                    for i in 0..20_000u64 {
                        let _ = limiter.check(&Key::new(t << 32 | i, &COUNTS));
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
    settle(&COUNTS);
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

// ---------------------------------------------------------------------------
// Attack 5: a `Hash` that panics inside a migration, while readers copy the
// frozen buckets themselves.

thread_local! {
    /// This thread's `Hash` of a stored key panics (the migrating thread).
    static PANIC_IN_HASH: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}
static PANIC_COUNTS: Counts = Counts::new();
thread_local! {
    /// This thread's `Eq` panics (the migrating thread, `place_copy`).
    static PANIC_IN_EQ: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}
/// Which of the two hostile impls attack 5 arms on the migrating thread.
static ARM_EQ: AtomicBool = AtomicBool::new(false);
static HASHES_PANICKED: AtomicUsize = AtomicUsize::new(0);

/// Every key hashes alike (one long probe chain), so a copy compares its key
/// with many others; `Eq` is slow, so a copy by a reader takes a while.
#[derive(Debug)]
struct Hostile(u64);
impl Hostile {
    fn new(id: u64) -> Self {
        PANIC_COUNTS.made.fetch_add(1, Ordering::SeqCst);
        Hostile(id)
    }
}
impl Clone for Hostile {
    fn clone(&self) -> Self {
        Hostile::new(self.0)
    }
}
impl Drop for Hostile {
    fn drop(&mut self) {
        PANIC_COUNTS.dropped.fetch_add(1, Ordering::SeqCst);
    }
}
impl PartialEq for Hostile {
    fn eq(&self, other: &Self) -> bool {
        if PANIC_IN_EQ.with(|p| p.get()) {
            HASHES_PANICKED.fetch_add(1, Ordering::Relaxed);
            panic!("hostile eq");
        }
        for _ in 0..200 {
            std::hint::spin_loop();
        }
        self.0 == other.0
    }
}
impl Eq for Hostile {}
impl Hash for Hostile {
    fn hash<H: Hasher>(&self, h: &mut H) {
        if PANIC_IN_HASH.with(|p| p.get()) {
            HASHES_PANICKED.fetch_add(1, Ordering::Relaxed);
            panic!("hostile hash");
        }
        0u64.hash(h);
    }
}

/// Readers check 24 keys; one thread, whose `Hash` panics, keeps making the
/// map migrate (resets make a quarter of the table dead, then `evict_idle`
/// compacts and copies). Its chunks bury the buckets they cannot hash, while
/// readers that met those buckets frozen are copying them into the successor.
/// Every key made must still be dropped exactly once, and `len` must end at 0.
#[test]
fn a_panicking_hash_in_a_migration_racing_reader_copies() {
    let _serial = serial();
    ARM_EQ.store(false, Ordering::Relaxed);
    let (panics, len_before, evicted, len_after) = panicking_hash_attack(4);
    assert!(
        panics > 100,
        "the race was not reached: {panics} panicking migrations"
    );
    assert_eq!(
        len_after, 0,
        "len drifted: {len_after} after evicting everything"
    );
    assert_eq!(evicted, len_before, "evicted vs len");
    assert_eq!(
        PANIC_COUNTS.made(),
        PANIC_COUNTS.dropped(),
        "keys made vs dropped"
    );
}

/// Control for attack 5: the same panicking migrations with no concurrent
/// reader (the migrating thread puts the keys back itself, its hash
/// disarmed). Nobody copies a frozen bucket but the claimer, so the
/// bury-on-panic path alone is exercised: it must keep `len` and drops exact.
#[test]
fn control_a_panicking_hash_in_a_migration_without_readers() {
    let _serial = serial();
    ARM_EQ.store(false, Ordering::Relaxed);
    let made = PANIC_COUNTS.made();
    let dropped = PANIC_COUNTS.dropped();
    let (panics, len_before, evicted, len_after) = panicking_hash_attack(0);
    assert!(
        panics > 100,
        "the race was not reached: {panics} panicking migrations"
    );
    assert_eq!(
        len_after, 0,
        "len drifted: {len_after} after evicting everything"
    );
    assert_eq!(evicted, len_before, "evicted vs len");
    assert_eq!(
        PANIC_COUNTS.made() - made,
        PANIC_COUNTS.dropped() - dropped,
        "keys made vs dropped"
    );
}

/// Attack 5b: the same with the migrating thread's `Eq` armed to panic. It
/// used to run in `place_copy` (comparing the successor's keys) and reach
/// the same bury path; copies now compare no keys, so it never runs there.
#[test]
fn a_panicking_eq_in_a_migration_racing_reader_copies() {
    let _serial = serial();
    ARM_EQ.store(true, Ordering::Relaxed);
    let made = PANIC_COUNTS.made();
    let dropped = PANIC_COUNTS.dropped();
    let (panics, len_before, evicted, len_after) = panicking_hash_attack(4);
    ARM_EQ.store(false, Ordering::Relaxed);
    // Copies compare no keys any more (the one copier is chosen by a CAS
    // before anything is published), so a key's `Eq` never runs inside a
    // migration: none may panic there.
    assert_eq!(panics, 0, "a key's Eq ran inside a migration");
    assert_eq!(
        len_after, 0,
        "len drifted: {len_after} after evicting everything"
    );
    assert_eq!(evicted, len_before, "evicted vs len");
    assert_eq!(
        PANIC_COUNTS.made() - made,
        PANIC_COUNTS.dropped() - dropped,
        "keys made vs dropped"
    );
}

fn panicking_hash_attack(readers: u64) -> (usize, usize, usize, usize) {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let outcome = catch_unwind(|| {
        within(Duration::from_secs(120), "panicking hash", move || {
            let clock = ManualClock::new();
            let limiter: KeyedLimiter<Hostile, ManualClock> =
                KeyedLimiter::builder("1/h burst 1000000".parse::<Quota>().unwrap())
                    .clock(clock.clone())
                    .build();
            const N: u64 = 24;
            let keys: Vec<Hostile> = (0..N).map(Hostile::new).collect();
            let stop = AtomicBool::new(false);
            let panics = AtomicUsize::new(0);
            thread::scope(|s| {
                for t in 0..readers {
                    let (limiter, keys, stop) = (&limiter, &keys, &stop);
                    s.spawn(move || {
                        let mut rng = SplitMix(t + 31);
                        while !stop.load(Ordering::Relaxed) {
                            let key = &keys[(rng.next() % N) as usize];
                            let _ = catch_unwind(AssertUnwindSafe(|| limiter.check(key)));
                        }
                    });
                }
                let mut rng = SplitMix(5);
                for _ in 0..3_000 {
                    // Kill some keys (readers put them back), then migrate
                    // with a panicking hash.
                    for _ in 0..6 {
                        limiter.reset(&keys[(rng.next() % N) as usize]);
                    }
                    if ARM_EQ.load(Ordering::Relaxed) {
                        PANIC_IN_EQ.with(|p| p.set(true));
                    } else {
                        PANIC_IN_HASH.with(|p| p.set(true));
                    }
                    if catch_unwind(AssertUnwindSafe(|| limiter.evict_idle())).is_err() {
                        panics.fetch_add(1, Ordering::Relaxed);
                    }
                    PANIC_IN_HASH.with(|p| p.set(false));
                    PANIC_IN_EQ.with(|p| p.set(false));
                    // Let the readers run (2 cores, 5 threads).
                    thread::sleep(Duration::from_micros(200));
                    if readers == 0 {
                        for key in &keys {
                            let _ = limiter.check(key);
                        }
                    }
                }
                stop.store(true, Ordering::Relaxed);
            });
            let len_before = limiter.len();
            clock.advance(Duration::from_secs(100 * 365 * 24 * 3600));
            let evicted = limiter.evict_idle();
            let len_after = limiter.len();
            drop(keys);
            drop(limiter);
            (
                panics.load(Ordering::Relaxed),
                len_before,
                evicted,
                len_after,
            )
        })
    });
    std::panic::set_hook(previous);
    let (panics, len_before, evicted, len_after) = outcome.unwrap();
    settle(&PANIC_COUNTS);
    eprintln!(
        "panicking hash: {panics} migrations panicked ({} hashes), len before {len_before}, evicted {evicted}, len after {len_after}; made {} dropped {}",
        HASHES_PANICKED.load(Ordering::Relaxed),
        PANIC_COUNTS.made(),
        PANIC_COUNTS.dropped()
    );
    (panics, len_before, evicted, len_after)
}

// Defect A (a bury racing a reader's copy of the same bucket) is modelled
// in `loom-tests`: `a_panicking_hash_never_splits_a_key`.

/// Attack 7: pure growth under contention on a frozen clock: 6 threads
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
        let limiter: KeyedLimiter<Key, ManualClock> =
            KeyedLimiter::builder("1/h burst 2".parse::<Quota>().unwrap())
                .clock(clock.clone())
                .build();
        let keys: Vec<Key> = (0..N).map(|i| Key::new(i, &COUNTS)).collect();
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
    settle(&COUNTS);
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
// Defect B: a copy placed twice. `place_copy` trusts `Eq` to recognise a
// copy another thread placed; an `Eq` that is inconsistent (a logic error,
// which std's maps contain without undefined behaviour) makes two threads
// both place a copy of one frozen bucket: two live buckets for one key,
// each owning the same key bytes.

static LIAR_COUNTS: Counts = Counts::new();
/// 0: idle; 1: the migrating thread froze LIAR_TARGET and is in its `Hash`;
/// 2: the reader has copied LIAR_TARGET itself.
static LIAR_STAGE: AtomicUsize = AtomicUsize::new(0);
const LIAR_TARGET: u64 = 3;
thread_local! {
    /// On this thread `Eq` says no to everything (the migrating thread).
    static LIES: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

#[derive(Debug)]
struct Liar {
    id: u64,
}
impl Liar {
    fn new(id: u64) -> Self {
        LIAR_COUNTS.made.fetch_add(1, Ordering::SeqCst);
        Liar { id }
    }
}
impl Clone for Liar {
    fn clone(&self) -> Self {
        Liar::new(self.id)
    }
}
impl Drop for Liar {
    fn drop(&mut self) {
        LIAR_COUNTS.dropped.fetch_add(1, Ordering::SeqCst);
    }
}
impl PartialEq for Liar {
    fn eq(&self, other: &Self) -> bool {
        !LIES.with(|l| l.get()) && self.id == other.id
    }
}
impl Eq for Liar {}
impl Hash for Liar {
    fn hash<H: Hasher>(&self, h: &mut H) {
        if self.id == LIAR_TARGET && LIES.with(|l| l.get()) {
            // `migrate_slot` froze the target and hashes it: let the reader
            // copy it first.
            LIAR_STAGE.store(1, Ordering::SeqCst);
            wait_for(&LIAR_STAGE, 2);
        }
        0u64.hash(h);
    }
}

/// The interleaving this replays, as it was before the fix (copies now
/// compare no keys, and only the thread that won COPYING places one): the
/// migrating thread C freezes the target (`migrate_slot`)
/// and is held in its `Hash`; reader R's check meets the frozen bucket,
/// copies it (`copy_frozen` → `place_copy` → New) and marks it COPIED; C
/// goes on to `place_copy`, whose `Eq` does not recognise R's copy, and
/// places a second one (New; its `mark_copied` fails silently). The
/// successor then holds two live buckets for the target, both owning its
/// key: `len` is one short (it wraps below 0 once both are evicted) and
/// the key is dropped twice (a double free for a key with heap memory).
/// With a consistent `Eq` this cannot happen; with an inconsistent one it
/// must not be undefined behaviour (std's maps contain such logic errors).
#[test]
fn defect_b_an_inconsistent_eq_makes_two_copies_of_one_bucket() {
    let _serial = serial();
    LIAR_STAGE.store(0, Ordering::SeqCst);
    let (len_before, evicted, len_end) = within(Duration::from_secs(60), "defect B", || {
        let clock = ManualClock::new();
        let limiter: KeyedLimiter<Liar, ManualClock> =
            KeyedLimiter::builder("1/h burst 5".parse::<Quota>().unwrap())
                .clock(clock.clone())
                .hasher_seed(1)
                .build();
        // Fills the smallest table (16 slots) to its fill limit (13), so
        // that the next new key starts a migration.
        for id in 0..13 {
            assert!(limiter.check(&Liar::new(id)).is_allowed());
        }
        assert_eq!(limiter.capacity(), 16);
        let len_before = limiter.len();
        thread::scope(|s| {
            s.spawn(|| {
                wait_for(&LIAR_STAGE, 1);
                assert!(limiter.check(&Liar::new(LIAR_TARGET)).is_allowed());
                LIAR_STAGE.store(2, Ordering::SeqCst);
            });
            LIES.with(|l| l.set(true));
            let _ = limiter.check(&Liar::new(100));
            LIES.with(|l| l.set(false));
        });
        assert!(limiter.capacity() > 16, "the migration did not finish");
        clock.advance(Duration::from_secs(100 * 3600));
        let evicted = limiter.evict_idle();
        let len_end = limiter.len();
        drop(limiter);
        (len_before, evicted, len_end)
    });
    settle(&LIAR_COUNTS);
    eprintln!(
        "defect B replay: len before {len_before}, evict_idle evicted {evicted}, len then {len_end}; keys made {} dropped {}",
        LIAR_COUNTS.made(),
        LIAR_COUNTS.dropped()
    );
    assert!(
        LIAR_COUNTS.dropped() <= LIAR_COUNTS.made(),
        "a key was dropped twice: made {} dropped {}",
        LIAR_COUNTS.made(),
        LIAR_COUNTS.dropped()
    );
    assert_eq!(len_end, 0, "len drifted");
}
