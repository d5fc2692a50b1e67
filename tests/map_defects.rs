//! Regression tests for the keyed map's defects found by an audit, each
//! replayed through the public API: a shrinking migration that hung, fresh
//! keys refused at `max_keys`, a panic when a key's `Drop` uses another
//! limiter, memory a dropped limiter kept, and a fresh bucket decided on a
//! stale clock reading after its key was evicted.
//!
//! Tests that could hang run their work on a thread and wait for it with a
//! watchdog, so a regression fails within seconds instead of hanging CI.
//! The counting allocator is process-wide: the tests take turns.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Barrier, LazyLock, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use turnstile_rl::{Clock, KeyedLimiter, ManualClock, OverflowPolicy, Quota};

use turnstile_test_kit::heap;
use turnstile_test_kit::within;
use within::within;

/// The kit's counting allocator: heap bytes held, and a pause at one allocation.
#[global_allocator]
static HEAP: heap::Counting = heap::Counting;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Defect 1, replayed deterministically: a shrinking migration is sized for
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

/// Defect 1 as the audit first met it, with no hook: three threads check
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

/// Defect 2: at `max_keys`, `EvictFullest` admits a new key by evicting one
/// bucket. Four threads on fresh keys: (almost) none refused.
#[test]
fn evict_fullest_admits_fresh_keys_under_contention() {
    let _serial = serial();
    const THREADS: u64 = 4;
    const PER_THREAD: u64 = 200_000;
    for max_keys in [1usize, 8, 64, 1_000] {
        let limiter = KeyedLimiter::builder("1/s".parse::<Quota>().unwrap())
            .clock(ManualClock::new())
            .max_keys(max_keys)
            .overflow(OverflowPolicy::EvictFullest)
            .build();
        let start = Barrier::new(THREADS as usize);
        let refused: u64 = thread::scope(|s| {
            let workers: Vec<_> = (0..THREADS)
                .map(|t| {
                    let (limiter, start) = (&limiter, &start);
                    s.spawn(move || {
                        start.wait();
                        (0..PER_THREAD)
                            .filter(|i| limiter.check(&(t << 32 | i)).is_denied())
                            .count() as u64
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).sum()
        });
        let total = THREADS * PER_THREAD;
        println!("max_keys({max_keys}): {refused} of {total} fresh keys refused");
        // With one place and four threads, a thread can find the place
        // held by another's insert in flight; from 8 on, never in practice.
        assert!(
            max_keys < 8 || refused * 1_000 <= total,
            "max_keys({max_keys}): {refused} of {total} fresh keys refused"
        );
        assert!(limiter.len() <= max_keys);
    }
}

/// A key whose `Drop` uses another turnstile limiter.
#[derive(Clone, Debug)]
struct Chatty(u64);

static OTHER: LazyLock<KeyedLimiter<u64>> =
    LazyLock::new(|| KeyedLimiter::new("1000/s".parse().unwrap()));
static DROPS_THAT_CHECKED: AtomicUsize = AtomicUsize::new(0);

impl Drop for Chatty {
    fn drop(&mut self) {
        let _ = OTHER.check(&(self.0 % 64));
        DROPS_THAT_CHECKED.fetch_add(1, Ordering::Relaxed);
    }
}
impl PartialEq for Chatty {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}
impl Eq for Chatty {}
impl Hash for Chatty {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state)
    }
}

/// Defect 3: keys are dropped by epoch collection, which may run inside a
/// pin of any map; a key's `Drop` that pins another map must not panic.
#[test]
fn a_key_whose_drop_checks_another_limiter_does_not_panic() {
    let _serial = serial();
    let limiter = KeyedLimiter::builder("1/s".parse::<Quota>().unwrap())
        .max_keys(100)
        .build();
    // Several other limiters in use on this thread too, so handle caching
    // and its evictions are exercised as well.
    let others: Vec<KeyedLimiter<u64>> = (0..10)
        .map(|_| KeyedLimiter::new("1/s".parse().unwrap()))
        .collect();
    let before = DROPS_THAT_CHECKED.load(Ordering::Relaxed);
    for i in 0..100_000u64 {
        let _ = limiter.check(&Chatty(i));
        let _ = others[(i % 10) as usize].check(&i);
    }
    drop(limiter);
    assert!(DROPS_THAT_CHECKED.load(Ordering::Relaxed) - before >= 100_000);
}

/// Defect 4: dropping a limiter gives back all of its memory, retired
/// tables included, also when another thread used it and lives on.
#[test]
fn a_dropped_limiter_frees_everything() {
    let _serial = serial();
    // Warm up this thread's and the helper's lazy statics first.
    let helper = Helper::new();
    helper.run(|| {
        let warm = KeyedLimiter::<u64>::new("1/s".parse().unwrap());
        let _ = warm.check(&1);
    });
    let warm = KeyedLimiter::<u64>::new("1/s".parse().unwrap());
    let _ = warm.check(&1);
    drop(warm);
    let baseline = heap::live();

    let limiter = Arc::new(
        KeyedLimiter::builder("1/s".parse::<Quota>().unwrap())
            .clock(ManualClock::new())
            .build(),
    );
    for key in 0..300_000u64 {
        let _ = limiter.check(&key);
    }
    // The helper thread (a pool thread that stays alive) grows it further,
    // retiring a table on its side.
    let on_helper = limiter.clone();
    helper.run(move || {
        for key in 300_000..700_000u64 {
            let _ = on_helper.check(&key);
        }
    });
    assert!(heap::live() > baseline + (16 << 20));
    drop(limiter);
    // One operation of any limiter on the helper thread lets go of what it
    // still holds for the dropped one.
    helper.run(|| {
        let other = KeyedLimiter::<u64>::new("1/s".parse().unwrap());
        let _ = other.check(&1);
    });
    let left = heap::live().saturating_sub(baseline);
    assert!(
        left < 64 << 10,
        "{left} bytes still held after the limiter was dropped"
    );
    drop(helper);
}

/// Defect 4, second half: with a frozen clock no housekeeping tick ever
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

/// A thread that stays alive between jobs, like a pool's worker.
struct Helper {
    jobs: mpsc::Sender<Box<dyn FnOnce() + Send>>,
    done: mpsc::Receiver<()>,
}

impl Helper {
    fn new() -> Self {
        let (jobs, job_rx) = mpsc::channel::<Box<dyn FnOnce() + Send>>();
        let (done_tx, done) = mpsc::channel();
        thread::spawn(move || {
            for job in job_rx {
                job();
                let _ = done_tx.send(());
            }
        });
        Helper { jobs, done }
    }

    fn run(&self, job: impl FnOnce() + Send + 'static) {
        self.jobs.send(Box::new(job)).unwrap();
        self.done
            .recv_timeout(Duration::from_secs(60))
            .expect("helper job hung");
    }
}

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

/// Defect 6: a check that read the clock before its key was evicted as idle
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
