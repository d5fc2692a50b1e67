// Own binary: it needs a retired table left pending on the process-wide stack; other tests' reclaims would free it.
//! No reclaiming while unwinding (`src/map/pin.rs`, `src/map/mod.rs`):
//! a limiter dropped during a panic must not free another limiter's
//! retired table, since that runs the table's keys' `Drop`, and a key
//! whose `Drop` panicked too would abort the process. An unpin already
//! leaves reclaiming to a later look while the thread panics; dropping a
//! map must do the same.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::thread;
use std::time::Duration;

use turnstile_rl::{KeyedLimiter, Quota};
use turnstile_test_kit::stall::{Gate, StallingKey};
use turnstile_test_kit::watchdog::Watchdog;

/// Checks the test may make before the retired table must be freed.
const BOUND: u64 = 10_000;

/// Drops of keys held by a map's table.
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// A key that counts the drops of the copies a map holds.
struct Counted {
    id: u64,
    stored: bool,
}
impl Counted {
    fn new(id: u64) -> Self {
        Counted { id, stored: false }
    }
}
impl Clone for Counted {
    fn clone(&self) -> Self {
        Counted {
            id: self.id,
            stored: true,
        }
    }
}
impl Hash for Counted {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.id.hash(h)
    }
}
impl PartialEq for Counted {
    fn eq(&self, o: &Self) -> bool {
        self.id == o.id
    }
}
impl Eq for Counted {}
impl Drop for Counted {
    fn drop(&mut self) {
        if self.stored {
            DROPPED.fetch_add(1, SeqCst);
        }
    }
}

/// Where the reader's key stalls.
static GATE: Gate = Gate::new();

/// Drops what it holds when it is dropped: during the unwinding below.
struct DropsOnUnwind<T>(Option<T>);
impl<T> Drop for DropsOnUnwind<T> {
    fn drop(&mut self) {
        assert!(thread::panicking(), "dropped by the unwinding");
        drop(self.0.take());
    }
}

#[test]
fn dropping_a_limiter_while_unwinding_runs_no_other_limiters_key_drops() {
    let dog = Watchdog::start(
        "unwinding",
        Duration::from_secs(30),
        Duration::from_secs(60),
    );
    let counted: KeyedLimiter<Counted> = KeyedLimiter::new(Quota::per_second(10).unwrap());
    let dropped_by_unwinding: KeyedLimiter<u64> = KeyedLimiter::new(Quota::per_second(10).unwrap());
    let _ = dropped_by_unwinding.check(&1);
    // A reader pinned (stalled in a key's `Eq`) while `counted`'s table is
    // retired: the retiring thread's reclaim must leave it pending. Its
    // limiter is handed back, not dropped: a drop outside a panic looks at
    // the retired stack.
    let reader = thread::spawn(|| {
        let limiter: KeyedLimiter<StallingKey> = KeyedLimiter::new(Quota::per_second(10).unwrap());
        let key = StallingKey { id: 1, gate: &GATE };
        let _ = limiter.check(&key);
        GATE.arm();
        let _ = limiter.check(&key);
        limiter
    });
    while !GATE.is_stalled() {
        assert!(!reader.is_finished(), "the reader never stalled");
        thread::yield_now();
        dog.tick();
    }
    for id in 0..10 {
        let _ = counted.check(&Counted::new(id));
    }
    assert_eq!(counted.clear(), 10);
    GATE.open();
    let readers_limiter = reader.join().expect("the reader ends");
    assert_eq!(
        DROPPED.load(SeqCst),
        0,
        "the retired table was freed before the unwinding: the case is not reached ({} drops)",
        DROPPED.load(SeqCst)
    );

    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _dropper = DropsOnUnwind(Some(dropped_by_unwinding));
        panic!("unwinding drops a limiter");
    }));
    assert!(unwound.is_err());
    assert_eq!(
        DROPPED.load(SeqCst),
        0,
        "dropping a limiter while unwinding ran another limiter's key drops"
    );

    // Still freed, by a later look outside the unwinding.
    let mut checks = 0;
    while DROPPED.load(SeqCst) < 10 {
        let _ = counted.check(&Counted::new(checks % 3));
        checks += 1;
        dog.tick();
        assert!(checks <= BOUND, "the retired table was never freed");
    }
    dog.finish();
    drop(readers_limiter);
}
