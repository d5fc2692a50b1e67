// Own binary: it forks, and counts heap bytes in the child; other tests' threads would blur both.
//! A forked child reclaims as any process does (`src/map/pin.rs`, "After
//! a fork"): only the forking thread lives on in the child, so a record
//! left pinned by another thread, or the batches' lock left held by
//! another thread's reclaim, must not keep the child's retired tables
//! alive. Each test forks while another thread is in that state; the child
//! grows limiters (every growth retires a table), drops them, checks
//! another limiter until what they retired is freed, and exits with a
//! status the parent asserts. The child's run and the parent's wait for it
//! are bounded by checks and by a deadline, never by a wait on time that
//! decides the outcome.
#![cfg(target_os = "linux")]

use std::hash::{Hash, Hasher};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use turnstile_rl::{KeyedLimiter, ManualClock, Quota};
use turnstile_test_kit::heap;
use turnstile_test_kit::stall::{Gate, StallingKey};
use turnstile_test_kit::watchdog::Watchdog;

#[global_allocator]
static HEAP: heap::Counting = heap::Counting;

/// The tests fork and park threads in keys: they take turns.
static SERIAL: Mutex<()> = Mutex::new(());

/// Keys each limiter in the child grows to (several migrations, about
/// 1 MiB of retired tables).
const GROWN: u64 = 50_000;

/// Limiters the child grows and drops.
const LIMITERS: usize = 3;

/// Checks of another limiter the child may make before the retired tables
/// must be gone.
const BOUND: usize = 2_000;

/// Slack for a map of a few keys and the child's registrations.
const SLACK: usize = 64 << 10;

/// The child's exit statuses.
const FREED: i32 = 0;
const NOT_FREED: i32 = 1;
const PANICKED: i32 = 2;

/// How long the parent waits for a child before killing it.
const CHILD_LIMIT: Duration = Duration::from_secs(60);

fn quota() -> Quota {
    Quota::per_second(10).expect("a valid quota")
}

/// Writes to the real standard error (the test harness's capture lives
/// in the parent's memory).
fn tell(message: &str) {
    // SAFETY: `write` reads `message.len()` bytes from a live `&str`.
    unsafe { libc::write(2, message.as_ptr().cast(), message.len()) };
}

/// The child's work: grows and drops limiters, then checks another one
/// until what they retired is freed.
fn grow_drop_and_reclaim() -> i32 {
    let other: KeyedLimiter<u64> = KeyedLimiter::new(quota());
    let _ = other.check(&0);
    let baseline = heap::live();
    heap::reset_peak();
    for _ in 0..LIMITERS {
        let limiter: KeyedLimiter<u64, ManualClock> = KeyedLimiter::builder(quota())
            .clock(ManualClock::new())
            .max_keys(2 * GROWN as usize)
            .build();
        for key in 0..GROWN {
            let _ = limiter.check(&key);
        }
        drop(limiter);
    }
    let after_drop = heap::live();
    for checks in 0..BOUND {
        if heap::live() <= baseline + SLACK {
            return FREED;
        }
        let _ = other.check(&(checks as u64 % 3));
    }
    tell(&format!(
        "child: after {BOUND} checks still {} KiB held (peak {} KiB, after the drops {} KiB)\n",
        (heap::live() - baseline) >> 10,
        (heap::peak() - baseline) >> 10,
        (after_drop - baseline) >> 10,
    ));
    NOT_FREED
}

/// Forks: the child runs `grow_drop_and_reclaim` and exits with its
/// status; the parent waits for it (killing it after `CHILD_LIMIT`) and
/// returns that status.
fn fork_child() -> i32 {
    // SAFETY: the child runs only the forking thread's code: the
    // allocator (glibc's is made whole by `fork`), the limiters, and
    // `_exit`, which runs none of the parent's destructors or handlers.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let status =
            std::panic::catch_unwind(AssertUnwindSafe(grow_drop_and_reclaim)).unwrap_or(PANICKED);
        // SAFETY: ends the child at once, as a forked child must.
        unsafe { libc::_exit(status) }
    }
    let deadline = Instant::now() + CHILD_LIMIT;
    loop {
        let mut status = 0;
        // SAFETY: `status` is a live `c_int`; `pid` is our child.
        let waited = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        assert!(waited >= 0, "waitpid: {}", std::io::Error::last_os_error());
        if waited == pid {
            assert!(
                libc::WIFEXITED(status),
                "the child died of signal {}",
                libc::WTERMSIG(status)
            );
            return libc::WEXITSTATUS(status);
        }
        if Instant::now() > deadline {
            // SAFETY: signals and reaps our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            panic!("the child ran over {CHILD_LIMIT:?}");
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// Where the pinned thread's key stalls.
static GATE: Gate = Gate::new();

/// Another thread is pinned (inside a check, stalled in a key's `Eq`) when
/// the process forks: in the child its record stays pinned for good.
#[test]
fn a_child_forked_while_another_thread_is_pinned_frees_its_retired_tables() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dog = Watchdog::start(
        "fork_pinned",
        Duration::from_secs(60),
        Duration::from_secs(120),
    );
    let reader = thread::spawn(|| {
        let limiter: KeyedLimiter<StallingKey> = KeyedLimiter::new(quota());
        let key = StallingKey { id: 1, gate: &GATE };
        let _ = limiter.check(&key);
        GATE.arm();
        let _ = limiter.check(&key);
    });
    while !GATE.is_stalled() {
        assert!(!reader.is_finished(), "the reader never stalled");
        thread::yield_now();
        dog.tick();
    }
    let status = fork_child();
    GATE.open();
    reader.join().expect("the reader ends");
    dog.finish();
    assert_eq!(status, FREED, "the child kept its retired tables");
}

static BLOCKING: AtomicBool = AtomicBool::new(false);
static UNBLOCK: AtomicBool = AtomicBool::new(false);

/// A key whose `Drop` blocks when the map's copy of it is freed: a
/// reclaimer freeing the table that holds it stalls with the batches'
/// lock held.
struct BlocksInDrop {
    stored: bool,
}
impl Clone for BlocksInDrop {
    fn clone(&self) -> Self {
        BlocksInDrop { stored: true }
    }
}
impl Hash for BlocksInDrop {
    fn hash<H: Hasher>(&self, h: &mut H) {
        0u8.hash(h)
    }
}
impl PartialEq for BlocksInDrop {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for BlocksInDrop {}
impl Drop for BlocksInDrop {
    fn drop(&mut self) {
        if self.stored {
            BLOCKING.store(true, SeqCst);
            while !UNBLOCK.load(SeqCst) {
                thread::yield_now();
            }
        }
    }
}

/// Another thread is reclaiming (freeing a table, stalled in a key's
/// `Drop`) when the process forks: in the child the batches' lock stays
/// held for good.
#[test]
fn a_child_forked_while_another_thread_reclaims_frees_its_retired_tables() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dog = Watchdog::start(
        "fork_reclaiming",
        Duration::from_secs(60),
        Duration::from_secs(120),
    );
    let reclaimer = thread::spawn(|| {
        let limiter: KeyedLimiter<BlocksInDrop> = KeyedLimiter::new(quota());
        let _ = limiter.check(&BlocksInDrop { stored: false });
        // Retires the table holding the key; this unpin (or, if another
        // thread was pinned, one of the later checks) frees it.
        assert_eq!(limiter.clear(), 1);
        let other: KeyedLimiter<u64> = KeyedLimiter::new(quota());
        let mut key = 0;
        while !BLOCKING.load(SeqCst) {
            let _ = other.check(&key);
            key += 1;
        }
    });
    while !BLOCKING.load(SeqCst) {
        assert!(!reclaimer.is_finished(), "the reclaimer never stalled");
        thread::yield_now();
        dog.tick();
    }
    let status = fork_child();
    UNBLOCK.store(true, SeqCst);
    reclaimer.join().expect("the reclaimer ends");
    dog.finish();
    assert_eq!(status, FREED, "the child kept its retired tables");
}

/// Children forked: stop at this many, or at the deadline.
const FORKS: usize = 20;
/// Children that must have been forked by the deadline.
const MIN_FORKS: usize = 5;
const FORKING_FOR: Duration = Duration::from_secs(20);

/// The form: a thread checks a limiter in a tight loop (pinned for
/// much of its time, reclaiming now and then) while the process forks
/// child after child; every child frees what it retires.
#[test]
fn children_forked_beside_a_checking_thread_free_their_retired_tables() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dog = Watchdog::start(
        "fork_busy",
        Duration::from_secs(60),
        Duration::from_secs(180),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let checker = {
        let stop = stop.clone();
        thread::spawn(move || {
            let limiter: KeyedLimiter<u64> = KeyedLimiter::new(quota());
            let mut key = 0u64;
            while !stop.load(SeqCst) {
                let _ = limiter.check(&(key % 1_000));
                key += 1;
            }
            key
        })
    };
    let deadline = Instant::now() + FORKING_FOR;
    let mut statuses = Vec::new();
    while statuses.len() < FORKS && Instant::now() < deadline {
        statuses.push(fork_child());
        dog.tick();
    }
    stop.store(true, SeqCst);
    let checks = checker.join().expect("the checker ends");
    dog.finish();
    eprintln!(
        "{} children forked beside {checks} checks; statuses {statuses:?}",
        statuses.len()
    );
    assert!(
        statuses.len() >= MIN_FORKS,
        "only {} children forked in {FORKING_FOR:?}",
        statuses.len()
    );
    let kept = statuses.iter().filter(|&&s| s != FREED).count();
    assert_eq!(
        kept,
        0,
        "{kept} of {} children kept their retired tables",
        statuses.len()
    );
}
