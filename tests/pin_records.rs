//! The pin's thread records (`src/map/pin.rs`) are reused.
//!
//! The module says "Records are never freed: a thread's is taken back by the
//! next thread that registers", and a pin made while the thread-local is
//! gone takes a record "for that pin only". Both rely on `release` storing
//! `in_use = false`. Measured with a counting allocator: heap bytes held
//! after many short-lived threads have each checked a limiter once, and
//! after one exiting thread checks many times from a TLS destructor.

use std::sync::Mutex;
use std::time::Duration;

use turnstile_rl::KeyedLimiter;
use turnstile_test_kit::heap;
use turnstile_test_kit::watchdog::Watchdog;

#[global_allocator]
static HEAP: heap::Counting = heap::Counting;

static SERIAL: Mutex<()> = Mutex::new(());

static LIMITER: std::sync::LazyLock<KeyedLimiter<u64>> =
    std::sync::LazyLock::new(|| KeyedLimiter::new("1000000/s".parse().unwrap()));

/// Spawns `n` threads one after the other, each checking once, and joins
/// each before the next starts: at most one (plus this) thread owns a
/// record at any time, so reused records keep the registry at 2-3 records.
fn churn(n: u64, dog: &Watchdog) {
    for i in 0..n {
        std::thread::spawn(move || {
            let _ = LIMITER.check(&(i % 8));
        })
        .join()
        .unwrap();
        dog.tick();
    }
}

/// Threads spawned and joined in a loop: heap growth per thread.
#[test]
fn records_are_reused_after_threads_exit() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dog = Watchdog::start(
        "records_reused",
        Duration::from_secs(30),
        Duration::from_secs(60),
    );
    let _ = LIMITER.check(&0);
    // Warm up: thread spawn machinery, the limiter's 8 keys.
    churn(200, &dog);
    let before = heap::live();
    const THREADS: u64 = 5_000;
    churn(THREADS, &dog);
    let after = heap::live();
    let per_thread = after.saturating_sub(before) as f64 / THREADS as f64;
    eprintln!("heap before {before} B, after {after} B: {per_thread:.1} B kept per exited thread");
    dog.finish();
    assert!(
        after <= before + 16 * 1024,
        "{THREADS} threads that each checked once and exited left {} B on the heap \
         ({per_thread:.1} B each): their records were not given back",
        after - before
    );
}

struct ChecksOnExit(u64);

impl Drop for ChecksOnExit {
    fn drop(&mut self) {
        // Runs among the thread's TLS destructors, after `pin`'s LOCAL is
        // gone (it was registered later, so it is destroyed first).
        for i in 0..self.0 {
            let _ = LIMITER.check(&(i % 8));
        }
    }
}

thread_local! {
    static ON_EXIT: ChecksOnExit = const { ChecksOnExit(20_000) };
}

/// One exiting thread pins 20,000 times from a TLS destructor: each pin
/// takes a record "for that pin only".
#[test]
fn pins_from_a_tls_destructor_give_their_records_back() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dog = Watchdog::start(
        "tls_records",
        Duration::from_secs(30),
        Duration::from_secs(60),
    );
    let _ = LIMITER.check(&0);
    // Warm up a thread doing the same with few checks.
    std::thread::spawn(|| {
        let _ = LIMITER.check(&1);
    })
    .join()
    .unwrap();
    let before = heap::live();
    std::thread::spawn(|| {
        // Registers ON_EXIT's destructor before LOCAL's.
        ON_EXIT.with(|_| {});
        let _ = LIMITER.check(&1);
    })
    .join()
    .unwrap();
    let after = heap::live();
    dog.finish();
    eprintln!("heap before {before} B, after {after} B");
    assert!(
        after <= before + 16 * 1024,
        "20,000 pins from a TLS destructor left {} B on the heap: each took a record \
         that was never given back",
        after - before
    );
}
