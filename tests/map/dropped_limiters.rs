//! A dropped limiter gives back all of its memory, retired tables
//! included: also when another thread used it and lives on, when another
//! thread pins while it is dropped, and when it is dropped inside epoch
//! collection (a key of one limiter owning the last `Arc` of another).
//!
//! The scenarios were written against a handle cache per thread, now gone
//! (every map shares one collector, `src/map/pin.rs`); they stay, as tests
//! that a dropped limiter's memory is not kept by a live thread.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, LazyLock, Mutex};
use std::thread;
use std::time::Duration;

use turnstile_rl::{KeyedLimiter, ManualClock, Quota};
use turnstile_test_kit::heap;
use turnstile_test_kit::watchdog::Watchdog;

use crate::serial;

/// Dropping a limiter gives back all of its memory, retired
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

// ---------------------------------------------------------------------------
// A limiter dropped while another thread pins. The map used to announce
// its drop (the global drop generation) before its liveness token died,
// and a thread pinning in between recorded the news yet kept the entry in
// its handle cache; now the token dies first (`Map::drop`,
// `src/map/mod.rs`). The window is made deterministic by a key whose
// `Drop` (run while the map frees its nodes) asks the other thread to make
// one check.

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

type Gated = KeyedLimiter<Key, ManualClock>;

#[test]
fn a_limiter_dropped_while_another_thread_pins_frees_its_garbage() {
    let _serial = serial();
    let dog = Watchdog::start(
        "drop race",
        Duration::from_secs(10),
        Duration::from_secs(60),
    );
    let (ask_tx, ask_rx) = mpsc::channel::<()>();
    let (answer_tx, answer_rx) = mpsc::channel::<()>();
    *CHANNELS.lock().unwrap() = Some((ask_tx, answer_rx));
    let clock = ManualClock::new();
    let b: Arc<Gated> = Arc::new(
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
    let _serial = serial();
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

// ---------------------------------------------------------------------------
// A limiter dropped inside epoch collection that runs inside a pin. A key
// of limiter A owns the last `Arc` of limiter B; B used to be dropped while
// the thread's handle cache was borrowed, so its handle could not be
// removed then, and a nested pin from the key's `Drop` recorded the drop
// as handled anyway.

static OTHER: LazyLock<KeyedLimiter<u64>> =
    LazyLock::new(|| KeyedLimiter::new("1000/s".parse().unwrap()));
static DROPPED_HOLDERS: AtomicU64 = AtomicU64::new(0);

type Inner = KeyedLimiter<u64, ManualClock>;

struct Holder {
    id: u64,
    keep: Option<Arc<Inner>>,
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

fn dropped_inside_collection(chatty: bool) -> usize {
    let _serial = serial();
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
    let b: Arc<Inner> = Arc::new(
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
    let left = dropped_inside_collection(true);
    eprintln!("{left} bytes above baseline after B was dropped");
    assert!(
        left < 256 << 10,
        "{left} bytes kept after the limiter was dropped"
    );
}

/// The same, but the key's `Drop` does not pin any map afterwards:
/// this thread's next pin sees the new drop generation and lets go of B.
#[test]
fn a_limiter_dropped_inside_collection_without_a_nested_pin_frees_its_garbage() {
    let left = dropped_inside_collection(false);
    assert!(
        left < 256 << 10,
        "{left} bytes kept after the limiter was dropped"
    );
}
