//! Regression, found by an adversarial review: a map dropped while another
//! thread pins any map must not stay in that thread's handle cache. The map
//! used to announce its drop (the global drop generation) before its
//! liveness token died, and a thread pinning in between recorded the news
//! yet kept the entry; now the token dies first (`Map::drop`,
//! `src/map/mod.rs`), and `pin` reads the generation with Acquire.
//!
//! The window is made deterministic by a key whose `Drop` (run while the
//! map frees its nodes) asks the other thread to make one check.
//!
//! Since issue 22 there is no handle cache (every map shares one collector,
//! `src/map/pin.rs`); the scenarios stay, as tests that a dropped limiter's
//! memory is not kept by a live thread.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::Duration;

use turnstile_rl::{KeyedLimiter, ManualClock, Quota};

use turnstile_test_kit::heap;

/// The kit's counting allocator: heap bytes held, and a pause at one allocation.
#[global_allocator]
static HEAP: heap::Counting = heap::Counting;

use turnstile_test_kit::watchdog;
use watchdog::Watchdog;

/// While armed, dropping key `GATE` asks the helper for one pin and waits.
static ARMED: AtomicBool = AtomicBool::new(false);
const GATE: u64 = u64::MAX;
#[allow(clippy::type_complexity)]
static CHANNELS: Mutex<Option<(mpsc::Sender<()>, mpsc::Receiver<()>)>> = Mutex::new(None);

#[derive(Clone, PartialEq, Eq)]
struct Key(u64);
impl Hash for Key {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.0.hash(h)
    }
}
impl Drop for Key {
    fn drop(&mut self) {
        if self.0 == GATE && ARMED.swap(false, Ordering::Relaxed) {
            let guard = CHANNELS.lock().unwrap();
            let (ask, answer) = guard.as_ref().unwrap();
            ask.send(()).unwrap();
            answer.recv_timeout(Duration::from_secs(10)).unwrap();
        }
    }
}

type B = KeyedLimiter<Key, ManualClock>;

/// The heap counter is process-wide: the tests take turns.
static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn a_limiter_dropped_while_another_thread_pins_frees_its_garbage() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dog = Watchdog::start(
        "drop race",
        Duration::from_secs(10),
        Duration::from_secs(60),
    );
    let (ask_tx, ask_rx) = mpsc::channel::<()>();
    let (answer_tx, answer_rx) = mpsc::channel::<()>();
    *CHANNELS.lock().unwrap() = Some((ask_tx, answer_rx));
    let clock = ManualClock::new();
    let b: Arc<B> = Arc::new(
        KeyedLimiter::builder("1/s".parse::<Quota>().unwrap())
            .clock(clock.clone())
            .build(),
    );
    // A helper thread that stays alive, like a pool's worker: it used B
    // once (its handle on B's collector is cached), then serves requests
    // to check its own limiter A (one pin each).
    let (ready_tx, ready) = mpsc::channel();
    let (cmd_tx, cmd) = mpsc::channel::<&'static str>();
    let (done_tx, done) = mpsc::channel::<()>();
    let helper = {
        let b = b.clone();
        thread::spawn(move || {
            let a: KeyedLimiter<u64, ManualClock> =
                KeyedLimiter::builder("1000/s".parse::<Quota>().unwrap())
                    .clock(ManualClock::new())
                    .build();
            let _ = a.check(&1);
            let _ = b.check(&Key(GATE));
            drop(b);
            ready_tx.send(()).unwrap();
            loop {
                // Either a pin asked for by the gate key's Drop, or a command.
                if ask_rx.recv_timeout(Duration::from_millis(1)).is_ok() {
                    let _ = a.check(&1);
                    answer_tx.send(()).unwrap();
                }
                match cmd.try_recv() {
                    Ok("check") => {
                        let _ = a.check(&1);
                        done_tx.send(()).unwrap();
                    }
                    Ok(_) => break,
                    Err(_) => {}
                }
            }
            drop(a);
            done_tx.send(()).unwrap();
        })
    };
    ready.recv().unwrap();
    let baseline = heap::live();
    // 300k keys that go idle at 2 s and are handed to B's epoch by
    // `evict_idle` (flushed, not yet freed: this thread was pinned).
    for k in 0..300_000u64 {
        let _ = b.check(&Key(k));
    }
    clock.set(Duration::from_secs(2));
    let _ = b.check(&Key(GATE));
    let _ = b.evict_idle();
    assert_eq!(b.len(), 1);
    dog.tick();
    ARMED.store(true, Ordering::Relaxed);
    drop(b); // the gate key's Drop runs inside, after the generation bump
    assert!(!ARMED.load(Ordering::Relaxed), "the gate key was dropped");
    dog.tick();
    // The helper checks A again, as often as we like: nothing changes.
    for _ in 0..3 {
        cmd_tx.send("check").unwrap();
        done.recv().unwrap();
    }
    let kept = heap::live().saturating_sub(baseline);
    // Control: any other map dropped lets the helper's next pin let go.
    drop(KeyedLimiter::<u64>::new("1/s".parse().unwrap()));
    cmd_tx.send("check").unwrap();
    done.recv().unwrap();
    let after = heap::live().saturating_sub(baseline);
    cmd_tx.send("exit").unwrap();
    done.recv().unwrap();
    helper.join().unwrap();
    dog.finish();
    eprintln!("{kept} bytes kept after B was dropped; {after} after another map's drop");
    assert!(
        kept < 1 << 20,
        "{kept} bytes of a dropped limiter kept by a live thread"
    );
}

/// The same without the gate: a helper thread checks its own limiter in a
/// tight loop while this thread drops a limiter holding 500k live keys
/// (RawMap::drop takes milliseconds) and ~300k evicted ones in its epoch.
/// Fails (5/5 runs) when the helper still holds B's collector afterwards.
#[test]
fn a_busy_thread_lets_go_of_a_dropped_limiter() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dog = Watchdog::start(
        "drop race 2",
        Duration::from_secs(10),
        Duration::from_secs(60),
    );
    let clock = ManualClock::new();
    let b: Arc<KeyedLimiter<u64, ManualClock>> = Arc::new(
        KeyedLimiter::builder("1/s burst 10".parse::<Quota>().unwrap())
            .clock(clock.clone())
            .build(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready) = mpsc::channel();
    let (cmd_tx, cmd) = mpsc::channel::<()>();
    let (done_tx, done) = mpsc::channel::<()>();
    let helper = {
        let (b, stop) = (b.clone(), stop.clone());
        thread::spawn(move || {
            let a: KeyedLimiter<u64, ManualClock> =
                KeyedLimiter::builder("1000/s".parse::<Quota>().unwrap())
                    .clock(ManualClock::new())
                    .build();
            let _ = a.check(&1);
            let _ = b.check(&u64::MAX);
            drop(b);
            ready_tx.send(()).unwrap();
            while !stop.load(Ordering::Relaxed) {
                let _ = a.check(&1);
            }
            done_tx.send(()).unwrap();
            while cmd.recv().is_ok() {
                let _ = a.check(&1);
                done_tx.send(()).unwrap();
            }
        })
    };
    ready.recv().unwrap();
    let baseline = heap::live();
    // 500k keys that stay live (TAT 10 s), 300k that go idle at 1 s; at
    // 2 s `evict_idle` hands the 300k to B's epoch at once.
    for k in 1_000_000..1_500_000u64 {
        let _ = b.check_n(&k, 10);
    }
    for k in 0..300_000u64 {
        let _ = b.check(&k);
    }
    clock.set(Duration::from_secs(2));
    let _ = b.evict_idle();
    assert_eq!(b.len(), 500_000);
    dog.tick();
    drop(b);
    dog.tick();
    thread::sleep(Duration::from_millis(20));
    stop.store(true, Ordering::Relaxed);
    done.recv().unwrap();
    let kept = heap::live().saturating_sub(baseline);
    drop(KeyedLimiter::<u64>::new("1/s".parse().unwrap()));
    cmd_tx.send(()).unwrap();
    done.recv().unwrap();
    let after = heap::live().saturating_sub(baseline);
    drop(cmd_tx);
    helper.join().unwrap();
    dog.finish();
    eprintln!("no gate: {kept} bytes kept after B was dropped; {after} after another map's drop");
    // Had the helper let go of B at its next pin, an unrelated drop would
    // free nothing more. It frees B's collector (and whatever garbage is
    // still queued in it: here little, as B's epoch had caught up).
    assert!(
        kept <= after + 1024,
        "the helper kept B's collector ({} bytes) until an unrelated map was dropped",
        kept - after
    );
}
