//! loom models of the pin (`src/map/pin.rs`): every thread announces its
//! pins in a record of its own, every map retires its tables to one stack,
//! and a reclaimer frees a table once each record it saw pinned has moved
//! on. Under loom the records, the stack and the thread-locals are loom's,
//! made afresh for each execution, and both barriers are `SeqCst` fences
//! (the form without `membarrier`), so these models run the pin the crate
//! ships, not a stand-in.
//!
//! Sharing one reclaimer means another map's operations can free a table
//! while a reader is inside a check of its own map; these models name
//! those races and assert that an execution reached them. A table freed
//! too early would be caught by loom itself (its cells are loom objects:
//! touching one after it is freed fails the model).
//!
//! Run with `scripts/loom.sh`; without both cfgs this file compiles to
//! nothing.
#![cfg(all(turnstile_loom, crossbeam_loom))]

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use loom::thread;
use turnstile_rl::probe;
use turnstile_rl::{KeyedLimiter, ManualClock, Quota};

/// Runs `body` under loom on a thread with room for crossbeam-epoch's
/// frames (as in `loom.rs`).
fn model(body: impl Fn() + Sync + Send + 'static) {
    let body = Arc::new(body);
    let mut builder = loom::model::Builder::new();
    builder.max_branches = 100_000;
    builder.check(move || {
        let body = body.clone();
        thread::Builder::new()
            .stack_size(STACK)
            .spawn(move || body())
            .unwrap()
            .join()
            .unwrap();
    });
}

const STACK: usize = 8 << 20;

fn spawn<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> thread::JoinHandle<T> {
    thread::Builder::new().stack_size(STACK).spawn(f).unwrap()
}

/// One request per 100 µs (well under the 1 ms housekeeping tick).
const T: Duration = Duration::from_micros(100);

fn keyed<K: Hash + Eq + Send + Sync + 'static>(
    clock: &ManualClock,
) -> Arc<KeyedLimiter<K, ManualClock>> {
    let quota = Quota::per_second(10_000).unwrap().burst(2).unwrap();
    Arc::new(KeyedLimiter::builder(quota).clock(clock.clone()).build())
}

/// Drops of keys that a map owned (its copies, made by `Clone`), and of
/// those, the drops made by a thread other than the reader while the reader
/// was inside a check: std atomics, which loom does not model (no extra
/// branches), read in the real order loom runs the threads in.
/// Whether the reader is inside its check is loom's to order (below).
static OWNED_DROPS: AtomicUsize = AtomicUsize::new(0);
static DROPS_DURING_READ: AtomicUsize = AtomicUsize::new(0);
loom::lazy_static! {
    /// A loom atomic, unlike the counters: loom then orders the reader's
    /// entry into its check against the reclaimer's drops, and explores a
    /// free that lands inside the check.
    static ref READING: loom::sync::atomic::AtomicBool = loom::sync::atomic::AtomicBool::new(false);
}
static READER: Mutex<Option<thread::ThreadId>> = Mutex::new(None);

/// A key that reports when a map's copy of it is dropped: a retired table
/// drops the keys it still owns when it is freed.
#[derive(Debug)]
struct Key {
    id: u64,
    owned: bool,
}

fn key(id: u64) -> Key {
    Key { id, owned: false }
}

impl Clone for Key {
    /// The map's copy (made on insert).
    fn clone(&self) -> Self {
        Key {
            id: self.id,
            owned: true,
        }
    }
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.id.hash(h)
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for Key {}

impl Drop for Key {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        OWNED_DROPS.fetch_add(1, Ordering::Relaxed);
        let reader = *READER.lock().unwrap();
        if READING.load(Ordering::SeqCst) && reader != Some(thread::current().id()) {
            DROPS_DURING_READ.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Runs `check` as the reader: drops of owned keys by other threads while
/// it runs are counted in `DROPS_DURING_READ`.
fn reading<R>(check: impl FnOnce() -> R) -> R {
    *READER.lock().unwrap() = Some(thread::current().id());
    READING.store(true, Ordering::SeqCst);
    let result = check();
    READING.store(false, Ordering::SeqCst);
    result
}

/// A reader holding its slot of map `x` while another thread evicts the
/// bucket and retires `x`'s table (its unpin reclaims, and finds the reader
/// pinned), then retires another map `z`'s tables (each unpin reclaims
/// again): the reader's update meets the tombstone on memory that is still
/// valid, and the table is freed only after the reader leaves (in some
/// executions, before the model ends).
#[test]
fn reader_holds_its_table_while_another_map_collects() {
    static HELD: AtomicBool = AtomicBool::new(false);
    static FREED: AtomicBool = AtomicBool::new(false);
    model(|| {
        let start = probe::sequence();
        let drops = OWNED_DROPS.load(Ordering::Relaxed);
        let clock = ManualClock::new();
        let x = keyed::<Key>(&clock);
        let z = keyed::<u64>(&clock);
        assert!(x.check(&key(1)).is_allowed());
        assert!(x.check(&key(2)).is_allowed());
        // Key 1 idle, key 2 not: `evict_idle` migrates x's table whole,
        // evicting key 1 on the way, and retires it (one retirement: the
        // key it keeps spares the table a shrinking migration after it).
        clock.set(T);
        assert!(x.check(&key(2)).is_allowed());
        let other = x.clone();
        let reclaimer = spawn(move || {
            other.evict_idle();
            // Each retires one of z's tables and reclaims at its unpin:
            // x's table is freed by whichever finds the reader gone.
            z.evict_idle();
            z.evict_idle();
        });
        assert!(x.check(&key(1)).is_allowed());
        reclaimer.join().unwrap();
        if OWNED_DROPS.load(Ordering::Relaxed) > drops {
            FREED.store(true, Ordering::Relaxed);
        }
        let last = x.check(&key(1));
        assert_eq!(last.remaining(), 0, "the reader's update was lost");
        let retired = probe::TABLE_RETIRED.last();
        if retired > start && probe::UPDATE_MET_TOMBSTONE.last() > retired {
            HELD.store(true, Ordering::Relaxed);
        }
    });
    assert!(
        HELD.load(Ordering::Relaxed),
        "no execution had the reader meet its cell after its table was retired"
    );
    assert!(
        FREED.load(Ordering::Relaxed),
        "no execution freed the retired table before the model ended"
    );
}

/// A reclaimer racing a reader's announcement: one thread retires map
/// `x`'s table and reclaims at once (its own unpin), while the reader pins
/// and checks another map `y`. Either the reader's pin is visible to the
/// reclaimer's scan (the table waits for it) or it is not (the table is
/// freed at once, while the reader is inside its check: one map's garbage
/// does not wait for another map's readers). Both happen in some execution.
#[test]
fn collection_races_a_readers_pin_on_another_map() {
    static RACED: AtomicBool = AtomicBool::new(false);
    static WAITED: AtomicBool = AtomicBool::new(false);
    model(|| {
        let during = DROPS_DURING_READ.load(Ordering::Relaxed);
        let clock = ManualClock::new();
        // y's own clock never moves: its key stays busy, so the reader's
        // check is a lookup and a CAS (it inserts and drops no key).
        let y_clock = ManualClock::new();
        let x = keyed::<Key>(&clock);
        let y = keyed::<u64>(&y_clock);
        assert!(x.check(&key(1)).is_allowed());
        assert!(x.check(&key(2)).is_allowed());
        assert!(y.check(&7).is_allowed());
        // Both idle: the eviction's migration retires x's table (with both
        // keys in it), and the evicting thread's unpin reclaims.
        clock.set(T);
        let start = probe::sequence();
        let reclaimer = spawn(move || {
            assert_eq!(x.evict_idle(), 2);
        });
        assert!(reading(|| y.check(&7)).is_allowed());
        reclaimer.join().unwrap();
        assert!(y.check(&7).is_denied(), "the reader's update was lost");
        if DROPS_DURING_READ.load(Ordering::Relaxed) > during {
            RACED.store(true, Ordering::Relaxed);
        }
        if probe::RECLAIM_WAITED_FOR_READER.last() > start {
            WAITED.store(true, Ordering::Relaxed);
        }
    });
    assert!(
        RACED.load(Ordering::Relaxed),
        "no execution freed a table while the other thread was inside a check"
    );
    assert!(
        WAITED.load(Ordering::Relaxed),
        "no execution had the reclaimer see the reader's pin and wait"
    );
}
