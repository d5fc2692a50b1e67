//! Regression, found by an adversarial review: memory kept after a limiter
//! is dropped inside epoch collection that runs inside a cached pin
//! (`src/map/pin.rs`). A key of limiter A owns the last `Arc` of limiter B;
//! B is dropped while the thread's handle cache is borrowed, so its handle
//! cannot be removed then, and a nested pin from the key's `Drop` used to
//! record the drop as handled anyway. Now a pin records it only once it
//! could clean the cache, so a later pin lets go of B's handle.
//!
//! Since issue 22 there is no handle cache (every map shares one collector,
//! `src/map/pin.rs`); the scenario stays, as a test that a limiter dropped
//! inside collection is freed.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use turnstile_rl::{KeyedLimiter, ManualClock, Quota};

use turnstile_test_kit::heap;

/// The kit's counting allocator: heap bytes held, and a pause at one allocation.
#[global_allocator]
static HEAP: heap::Counting = heap::Counting;

use turnstile_test_kit::watchdog;
use watchdog::Watchdog;

static OTHER: LazyLock<KeyedLimiter<u64>> =
    LazyLock::new(|| KeyedLimiter::new("1000/s".parse().unwrap()));
static DROPPED_HOLDERS: AtomicU64 = AtomicU64::new(0);

type B = KeyedLimiter<u64, ManualClock>;

struct Holder {
    id: u64,
    keep: Option<Arc<B>>,
    chatty: bool,
}
impl Clone for Holder {
    fn clone(&self) -> Self {
        Holder {
            id: self.id,
            keep: self.keep.clone(),
            chatty: self.chatty,
        }
    }
}
impl Hash for Holder {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.id.hash(h)
    }
}
impl PartialEq for Holder {
    fn eq(&self, o: &Self) -> bool {
        self.id == o.id
    }
}
impl Eq for Holder {}
impl Drop for Holder {
    fn drop(&mut self) {
        if let Some(b) = self.keep.take() {
            let last = Arc::strong_count(&b) == 1;
            drop(b); // if last: B's map is dropped here
            if last {
                if std::env::var("LEAK_BT").is_ok() {
                    let bt = std::backtrace::Backtrace::force_capture().to_string();
                    for l in bt
                        .lines()
                        .filter(|l| l.contains("turnstile_rl::") || l.contains("crossbeam_epoch::"))
                    {
                        eprintln!("BT {l}");
                    }
                }
                DROPPED_HOLDERS.fetch_add(1, Ordering::Relaxed);
            }
        }
        if self.chatty {
            // Any pin after the drop, nested in the outer pin.
            let _ = OTHER.check(&self.id);
        }
    }
}

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn scenario(chatty: bool) -> usize {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dog = Watchdog::start("leak", Duration::from_secs(10), Duration::from_secs(60));
    let clock = ManualClock::new();
    let a: KeyedLimiter<Holder, ManualClock> =
        KeyedLimiter::builder("1/s".parse::<Quota>().unwrap())
            .clock(clock.clone())
            .build();
    // Warm up: A and OTHER pinned and cached on this thread, A grown to 64 slots.
    for i in 0..20 {
        let _ = a.check(&Holder {
            id: 1000 + i,
            keep: None,
            chatty: false,
        });
    }
    let _ = OTHER.check(&0);
    let baseline = heap::live();

    let b_clock = ManualClock::new();
    let b: Arc<B> = Arc::new(
        KeyedLimiter::builder("1/s".parse::<Quota>().unwrap())
            .clock(b_clock.clone())
            .build(),
    );
    for k in 0..200_000u64 {
        let _ = b.check(&k);
    }
    // B forgets every key: its nodes and its big table go to B's epoch
    // (handed over and flushed, not yet freed: this thread was pinned).
    b_clock.advance(Duration::from_secs(3600));
    assert_eq!(b.evict_idle(), 200_000);
    let before_holders = DROPPED_HOLDERS.load(Ordering::Relaxed);
    let _ = a.check(&Holder {
        id: 7,
        keep: Some(b),
        chatty,
    });
    dog.tick();
    // Everything in A is idle an hour later: the sweep and the compaction
    // hand A's nodes (the holder among them) to A's epoch.
    // The first check after that runs the housekeeping tick (sweep, then
    // a compaction that this check's own insert completes: A's table is
    // one migration chunk), which hands the holder's node to A's epoch and
    // flushes; the epoch cannot free it yet (this thread is pinned).
    clock.advance(Duration::from_secs(3600));
    let _ = a.check(&Holder {
        id: 1,
        keep: None,
        chatty: false,
    });
    // Then only plain checks on that existing key: pins that collect every
    // 128th time, no flush, no map dropped elsewhere (the clock is frozen
    // again: no further tick).

    for _ in 0..10_000 {
        let _ = a.check(&Holder {
            id: 1,
            keep: None,
            chatty: false,
        });
        let _ = OTHER.check(&1);
    }
    dog.tick();
    assert_eq!(
        DROPPED_HOLDERS.load(Ordering::Relaxed),
        before_holders + 1,
        "B was dropped"
    );
    let left = heap::live().saturating_sub(baseline);
    // Any other map dropped anywhere lets this thread's next pin release
    // what it kept: the difference is what the dropped B still held.
    drop(KeyedLimiter::<u64>::new("1/s".parse().unwrap()));
    let _ = a.check(&Holder {
        id: 1,
        keep: None,
        chatty: false,
    });
    let after_release = heap::live().saturating_sub(baseline);
    eprintln!("{left} bytes above baseline; {after_release} after another map's drop");
    dog.finish();
    left
}

/// B's memory is given back once this thread pins again (before the fix,
/// about 26 MB stayed until some other map was dropped anywhere).
#[test]
fn a_limiter_dropped_inside_collection_frees_its_garbage() {
    let left = scenario(true);
    eprintln!("{left} bytes above baseline after B was dropped");
    assert!(
        left < 256 << 10,
        "{left} bytes kept after the limiter was dropped"
    );
}

/// Control: the same, but the key's `Drop` does not pin any map afterwards:
/// this thread's next pin sees the new drop generation and lets go of B.
#[test]
fn control_without_nested_pin_frees_everything() {
    let left = scenario(false);
    assert!(
        left < 256 << 10,
        "{left} bytes kept after the limiter was dropped"
    );
}
