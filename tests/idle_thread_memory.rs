// Own binary: it measures what parked threads keep alive; other tests' threads would blur it.
//! Memory stays bounded whatever other threads do (issue 22): a thread that
//! checked a limiter once and then sleeps forever (a parked worker) keeps
//! none of its retired tables alive, nor a dropped limiter's. Measured by a
//! counting allocator; "freed" means within a bounded number of checks made
//! by the thread that is still working, never a wait on time.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use turnstile_rl::{KeyedLimiter, ManualClock, Quota};

use turnstile_test_kit::heap;

/// The kit's counting allocator: heap bytes held.
#[global_allocator]
static HEAP: heap::Counting = heap::Counting;

/// The byte counters are process-wide: the tests take turns.
static SERIAL: Mutex<()> = Mutex::new(());

/// Keys that grow the table through several migrations (each retiring a
/// table), to about 2 MiB.
const GROWN: u64 = 100_000;

/// At least what the grown table holds: a 16-byte slot per key. (Its exact
/// size may sit just under what the smaller tables it retired held,
/// depending on when those are freed.)
const GROWN_BYTES: usize = 16 * GROWN as usize;

/// Checks the working thread may make before the garbage must be gone.
const BOUND: usize = 2_000;

/// Slack for what a map of one key and the threads' registrations hold.
const SLACK: usize = 64 << 10;

type Limiter = KeyedLimiter<u64, ManualClock>;

fn limiter(clock: &ManualClock) -> Limiter {
    KeyedLimiter::builder(Quota::per_second(10).expect("a valid quota"))
        .clock(clock.clone())
        .max_keys(2 * GROWN as usize)
        .build()
}

/// A thread that runs `first` (its checks, which give it a pin record)
/// and then sleeps until the returned sender is dropped.
fn sleeper(first: impl FnOnce() + Send + 'static) -> (mpsc::Sender<()>, thread::JoinHandle<()>) {
    let (parked_tx, parked_rx) = mpsc::channel();
    let (wake_tx, wake_rx) = mpsc::channel::<()>();
    let handle = thread::spawn(move || {
        first();
        parked_tx.send(()).expect("the test waits for this");
        // Sleeps until the test ends (the sender is dropped).
        let _ = wake_rx.recv();
    });
    parked_rx.recv().expect("the sleeper parks");
    (wake_tx, handle)
}

/// Checks `key` on `limiter` until at most `target` heap bytes are held;
/// returns how many checks that took.
fn checks_until_at_most(limiter: &Limiter, key: u64, target: usize) -> usize {
    let mut checks = 0;
    while heap::live() > target {
        let _ = limiter.check(&key);
        checks += 1;
        assert!(
            checks <= BOUND,
            "after {checks} checks, still {} KiB above the target",
            (heap::live() - target) >> 10
        );
    }
    checks
}

/// The sleeper checked the limiter (and grew it: it retired tables of its
/// own) before parking; the working thread grows it to 100,000 keys and then
/// evicts them all, retiring every big table.
#[test]
fn retired_tables_are_freed_while_a_thread_that_checked_sleeps() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let clock = ManualClock::new();
    let map = Arc::new(limiter(&clock));
    let _ = map.check(&0);
    let baseline = heap::live();
    let theirs = map.clone();
    let (wake, sleeping) = sleeper(move || {
        for key in 0..100 {
            let _ = theirs.check(&key);
        }
    });
    for key in 0..GROWN {
        let _ = map.check(&key);
    }
    assert!(heap::live() > baseline + GROWN_BYTES, "the table grew");
    clock.advance(Duration::from_secs(3600));
    assert_eq!(map.evict_idle(), GROWN as usize);
    let checks = checks_until_at_most(&map, 0, baseline + SLACK);
    eprintln!("retired tables freed after {checks} more checks");
    drop(wake);
    sleeping.join().expect("the sleeper exits");
}

/// The sleeper checked the limiter before parking; the working thread grows
/// it, retires its big table, drops it, and goes on with another limiter:
/// what the dropped one still held is freed though the sleeper never checks
/// again. (With a collector per map, the sleeper's handle kept the dropped
/// map's collector, and the retired table in it, alive for good.)
#[test]
fn a_dropped_limiter_is_freed_while_a_thread_that_checked_it_sleeps() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let clock = ManualClock::new();
    let other = limiter(&clock);
    let _ = other.check(&0);
    let map = Arc::new(limiter(&clock));
    let theirs = map.clone();
    let (wake, sleeping) = sleeper(move || {
        let _ = theirs.check(&1);
        // Only its pin record stays with it.
        drop(theirs);
    });
    let baseline = heap::live();
    for key in 0..GROWN {
        let _ = map.check(&key);
    }
    assert!(heap::live() > baseline + GROWN_BYTES, "the table grew");
    // Every key idle: the big table is retired (and freed at once, no
    // other thread being pinned, or by a later unpin).
    clock.advance(Duration::from_secs(3600));
    assert_eq!(map.evict_idle(), GROWN as usize);
    drop(map);
    let checks = checks_until_at_most(&other, 0, baseline + SLACK);
    eprintln!("the dropped limiter's memory freed after {checks} checks of another");
    drop(wake);
    sleeping.join().expect("the sleeper exits");
}
