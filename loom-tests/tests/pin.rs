//! loom models of the epoch pin (`src/map/pin.rs`): every map retires its
//! tables to one collector, and each thread pins it through one handle in a
//! thread-local. Under loom that collector and those handles are loom's
//! statics and thread-locals, made afresh for each execution, so these
//! models run the pin the crate ships, not a stand-in.
//!
//! Sharing the collector means another map's operations can advance the
//! epoch and run collection while a reader is inside a check; these models
//! name those races and assert that an execution reached them. A table
//! freed too early would be caught by loom itself (its cells are loom
//! objects: touching one after it is freed fails the model).
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
static OWNED_DROPS: AtomicUsize = AtomicUsize::new(0);
static DROPS_DURING_READ: AtomicUsize = AtomicUsize::new(0);
static READING: AtomicBool = AtomicBool::new(false);
static READER: Mutex<Option<thread::ThreadId>> = Mutex::new(None);

/// A key that reports when a map's copy of it is dropped: a retired table
/// drops the keys it still owns when the epoch frees it.
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
        if READING.load(Ordering::Relaxed) && reader != Some(thread::current().id()) {
            DROPS_DURING_READ.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Runs `check` as the reader: drops of owned keys by other threads while
/// it runs are counted in `DROPS_DURING_READ`.
fn reading<R>(check: impl FnOnce() -> R) -> R {
    *READER.lock().unwrap() = Some(thread::current().id());
    READING.store(true, Ordering::Relaxed);
    let result = check();
    READING.store(false, Ordering::Relaxed);
    result
}

/// A reader holding its slot of map `x` while another thread evicts the
/// bucket, retires `x`'s table and then, through another map `z`, advances
/// the shared epoch and collects: the reader's update meets the tombstone
/// on memory that is still valid, and the table is freed only after the
/// reader leaves (in some executions, before the model ends).
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
            // New pins and flushes on the shared collector: the epoch
            // moves on (a bag is freed two advances after it was sealed)
            // and x's table is freed.
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

/// A reclaimer racing a reader's announcement on the shared collector:
/// map `x`'s table is retired, then a reclaimer collects (through a pin of
/// another map `z`) while the reader pins and checks a third map `y`. The
/// reader's pin either comes first at an older epoch (the table waits) or
/// announces the current one (the epoch moves on): in some execution the
/// table is freed while the reader is inside its check, so one map's
/// garbage does not wait for another map's readers to finish.
#[test]
fn collection_races_a_readers_pin_on_another_map() {
    static RACED: AtomicBool = AtomicBool::new(false);
    model(|| {
        let during = DROPS_DURING_READ.load(Ordering::Relaxed);
        let clock = ManualClock::new();
        // y's own clock never moves: its key stays busy, so the reader's
        // check is a lookup and a CAS (it inserts and drops no key).
        let y_clock = ManualClock::new();
        let x = keyed::<Key>(&clock);
        let y = keyed::<u64>(&y_clock);
        let z = keyed::<u64>(&clock);
        assert!(x.check(&key(1)).is_allowed());
        assert!(x.check(&key(2)).is_allowed());
        assert!(y.check(&7).is_allowed());
        // Both idle: the eviction's shrinking migration retires x's table
        // (with both keys in it) and hands it to the collector.
        clock.set(T);
        assert_eq!(x.evict_idle(), 2);
        let reclaimer = spawn(move || {
            z.evict_idle();
        });
        assert!(reading(|| y.check(&7)).is_allowed());
        reclaimer.join().unwrap();
        assert!(y.check(&7).is_denied(), "the reader's update was lost");
        if DROPS_DURING_READ.load(Ordering::Relaxed) > during {
            RACED.store(true, Ordering::Relaxed);
        }
    });
    assert!(
        RACED.load(Ordering::Relaxed),
        "no execution freed a table while the other thread was inside a check"
    );
}
