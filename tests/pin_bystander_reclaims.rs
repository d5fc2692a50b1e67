// Own binary: a bystander's checks alone must free the tables; no other thread may pin or reclaim.
//! The pin's memory bound (`src/map/pin.rs`): the retiring
//! thread reclaims at once, but a reader is pinned (blocked in a key's
//! `Hash`), so the batch must wait; then the retiring thread parks for
//! good, the reader finishes its one check and parks too. Only a third
//! thread, checking an unrelated limiter, does anything: its looks every
//! `RECLAIM_EVERY` unpins must free the big tables.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::mpsc;
use std::time::Duration;

use turnstile_rl::{KeyedLimiter, ManualClock, Quota};
use turnstile_test_kit::heap;
use turnstile_test_kit::watchdog::Watchdog;

#[global_allocator]
static HEAP: heap::Counting = heap::Counting;

static IN_HASH: AtomicBool = AtomicBool::new(false);
static RELEASE: AtomicBool = AtomicBool::new(false);

static ARMED: AtomicBool = AtomicBool::new(false);

#[derive(Clone)]
struct Slow(u64);
impl Hash for Slow {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.0.hash(h)
    }
}
/// Blocks in `Eq` (called under the pin, when the lookup meets the key).
impl PartialEq for Slow {
    fn eq(&self, o: &Self) -> bool {
        if ARMED.load(SeqCst) {
            IN_HASH.store(true, SeqCst);
            while !RELEASE.load(SeqCst) {
                std::thread::yield_now();
            }
        }
        self.0 == o.0
    }
}
impl Eq for Slow {}

#[test]
fn tables_freed_by_a_bystander_after_retirer_and_reader_park() {
    let dog = Watchdog::start("pin_idle", Duration::from_secs(30), Duration::from_secs(60));
    let other: KeyedLimiter<u64> = KeyedLimiter::new(Quota::per_second(1000).unwrap());
    let _ = other.check(&0);
    let baseline = heap::live();
    // Reader: pinned inside a check, blocked in Hash.
    let (reader_done_tx, reader_done_rx) = mpsc::channel();
    let (reader_park_tx, reader_park_rx) = mpsc::channel::<()>();
    let reader = std::thread::spawn(move || {
        let m: KeyedLimiter<Slow> = KeyedLimiter::new(Quota::per_second(10).unwrap());
        let _ = m.check(&Slow(1));
        ARMED.store(true, SeqCst);
        let _ = m.check(&Slow(1));
        reader_done_tx.send(()).unwrap();
        let _ = reader_park_rx.recv();
    });
    while !IN_HASH.load(SeqCst) {
        std::thread::yield_now();
    }
    // Retirer: grows a map to 100k keys and evicts all, then parks.
    let (retired_tx, retired_rx) = mpsc::channel();
    let (retirer_park_tx, retirer_park_rx) = mpsc::channel::<()>();
    let retirer = std::thread::spawn(move || {
        let clock = ManualClock::new();
        let m: KeyedLimiter<u64, ManualClock> =
            KeyedLimiter::builder(Quota::per_second(10).unwrap())
                .clock(clock.clone())
                .max_keys(200_000)
                .build();
        for k in 0..100_000u64 {
            let _ = m.check(&k);
        }
        let grown = heap::live();
        clock.advance(Duration::from_secs(3600));
        assert_eq!(m.evict_idle(), 100_000);
        retired_tx.send((grown, m)).unwrap();
        let _ = retirer_park_rx.recv();
    });
    let (grown, m) = retired_rx.recv().unwrap();
    // The map is alive (held here) but its big tables are retired.
    let held = heap::live();
    assert!(
        held > baseline + (1 << 20),
        "the pinned reader holds the retired tables"
    );
    RELEASE.store(true, SeqCst);
    reader_done_rx.recv().unwrap();
    let mut checks = 0;
    while heap::live() > baseline + (256 << 10) + m.capacity() * 64 {
        let _ = other.check(&(checks % 3));
        checks += 1;
        dog.tick();
        assert!(
            checks <= 10_000,
            "still {} KiB held after {checks} bystander checks (grown {} KiB, after retire {} KiB)",
            (heap::live() - baseline) >> 10,
            (grown - baseline) >> 10,
            (held - baseline) >> 10
        );
    }
    eprintln!(
        "grown {} KiB, held after the retire {} KiB, freed after {checks} bystander checks",
        (grown - baseline) >> 10,
        (held - baseline) >> 10
    );
    dog.finish();
    drop(reader_park_tx);
    drop(retirer_park_tx);
    reader.join().unwrap();
    retirer.join().unwrap();
}
