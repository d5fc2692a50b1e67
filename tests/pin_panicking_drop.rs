// Own binary: it counts one panic out of a pile on the process-wide retired stack.
//! A key whose `Drop` panics while a reclaimer frees a batch of several
//! retired tables (`src/map/pin.rs`): the panic unwinds out of the walk of
//! the batch's chain, and the tables after the panicking one go back on
//! the retired stack, freed by a later look (they leaked before).
//!
//! To get several tables into one batch, a first reclaimer is held inside
//! a key's `Drop` (it holds the batches' lock), so the tables retired
//! meanwhile pile up on the retired stack; the next reclaimer takes them
//! all as one batch.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::LazyLock;
use std::time::Duration;

use turnstile_rl::{KeyedLimiter, Quota};
use turnstile_test_kit::watchdog::Watchdog;

static OTHER: LazyLock<KeyedLimiter<u64>> =
    LazyLock::new(|| KeyedLimiter::new(Quota::per_second(1_000_000).unwrap()));

/// Drops of map-held clones of group `g` (ids `g * 100 ..`).
static DROPS: [AtomicU64; 16] = [const { AtomicU64::new(0) }; 16];
static MADE: [AtomicU64; 16] = [const { AtomicU64::new(0) }; 16];
static BLOCKING: AtomicBool = AtomicBool::new(false);
static UNBLOCK: AtomicBool = AtomicBool::new(false);
static PANICKED_ONCE: AtomicBool = AtomicBool::new(false);

const BLOCKER: u64 = 10_000;
const PANICKER: u64 = 555;

struct PKey {
    id: u64,
    stored: bool,
}
impl Clone for PKey {
    fn clone(&self) -> Self {
        if self.id < BLOCKER {
            MADE[(self.id / 100) as usize].fetch_add(1, SeqCst);
        }
        PKey {
            id: self.id,
            stored: true,
        }
    }
}
impl Hash for PKey {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.id.hash(h)
    }
}
impl PartialEq for PKey {
    fn eq(&self, o: &Self) -> bool {
        self.id == o.id
    }
}
impl Eq for PKey {}
impl Drop for PKey {
    fn drop(&mut self) {
        if !self.stored {
            return;
        }
        if self.id == BLOCKER {
            BLOCKING.store(true, SeqCst);
            while !UNBLOCK.load(SeqCst) {
                std::thread::yield_now();
            }
            return;
        }
        DROPS[(self.id / 100) as usize].fetch_add(1, SeqCst);
        if self.id == PANICKER && !PANICKED_ONCE.swap(true, SeqCst) {
            panic!("key {PANICKER} panics in Drop");
        }
    }
}

#[test]
fn a_panicking_key_drop_does_not_leak_the_rest_of_its_batch() {
    let dog = Watchdog::start(
        "pin_panic",
        Duration::from_secs(30),
        Duration::from_secs(60),
    );
    let _ = OTHER.check(&0);
    // The blocker: a thread retires a table holding BLOCKER (dead) and,
    // reclaiming it at its unpin, blocks in the key's Drop, lock held.
    let blocker = std::thread::spawn(|| {
        let q: KeyedLimiter<PKey> = KeyedLimiter::new(Quota::per_second(10).unwrap());
        let _ = q.check(&PKey {
            id: BLOCKER,
            stored: false,
        });
        let _ = q.clear();
        // If the table was not freed at clear's unpin (a reader was
        // pinned), later checks get there.
        for i in 0..10_000 {
            if BLOCKING.load(SeqCst) {
                break;
            }
            let _ = OTHER.check(&i);
        }
    });
    while !BLOCKING.load(SeqCst) {
        assert!(!blocker.is_finished(), "the blocker never blocked");
        std::thread::yield_now();
        dog.tick();
    }
    // Ten tables retired while the lock is held: ten keys each, group 5
    // holds the panicking key.
    let p: KeyedLimiter<PKey> = KeyedLimiter::new(Quota::per_second(10).unwrap());
    for g in 0..10u64 {
        for i in 0..10 {
            let _ = p.check(&PKey {
                id: g * 100 + i + if g == 5 { 55 } else { 0 },
                stored: false,
            });
        }
        assert_eq!(p.clear(), 10);
    }
    let dropped_while_blocked: u64 = DROPS.iter().map(|d| d.load(SeqCst)).sum();
    UNBLOCK.store(true, SeqCst);
    // The blocker's last unpin or its map's drop may free the pile and
    // meet the panic.
    let mut panics = u32::from(blocker.join().is_err());
    // Drive reclamation; the panic comes out of one of these checks.
    for i in 0..10_000u64 {
        if std::panic::catch_unwind(|| {
            let _ = OTHER.check(&(i % 7));
        })
        .is_err()
        {
            panics += 1;
        }
    }
    drop(p);
    for i in 0..10_000u64 {
        let _ = OTHER.check(&(i % 7));
    }
    dog.finish();
    let made: Vec<u64> = MADE[..10].iter().map(|d| d.load(SeqCst)).collect();
    let drops: Vec<u64> = DROPS[..10].iter().map(|d| d.load(SeqCst)).collect();
    eprintln!(
        "panics caught {panics}; dropped while the reclaimer was blocked {dropped_while_blocked}; \
         clones made per table {made:?}; dropped per table {drops:?}"
    );
    assert_eq!(panics, 1);
    for g in 0..10 {
        if g == 5 {
            continue; // the panicking table's own later keys may leak with it
        }
        assert_eq!(
            drops[g], made[g],
            "table {g} (retired while the reclaimer was blocked) was never freed"
        );
    }
}
