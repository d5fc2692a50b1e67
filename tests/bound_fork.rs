//! A child forked while another thread of the parent is inside an
//! admission at `max_keys` (holding its key's claim and a mark of an
//! insert in flight) admits new keys at the bound like any process: the
//! child clears the stripes of inserts in flight on its first admission
//! (`map::inflight`), since the threads that held them do not exist there.
//! Before that, the child's first request for a new key of that stripe
//! waited forever for a claim no thread would end (found by an adversary's
//! test). Its own binary: the test forks the whole process.

#![cfg(target_os = "linux")]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use turnstile_rl::{KeyedLimiter, ManualClock, Quota};

/// 0: not parked yet; 1: the parked check is inside its insert; 2: let go.
static STAGE: AtomicUsize = AtomicUsize::new(0);

/// The key whose insert is parked.
const PARKED: u64 = 777;

/// A key whose clone for [`PARKED`] (made inside its insert, after the
/// request has claimed its stripe at the bound) waits until let go.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Parked(u64);

impl Clone for Parked {
    fn clone(&self) -> Self {
        if self.0 == PARKED && STAGE.load(Ordering::SeqCst) == 0 {
            STAGE.store(1, Ordering::SeqCst);
            while STAGE.load(Ordering::SeqCst) != 2 {
                thread::sleep(Duration::from_millis(1));
            }
        }
        Parked(self.0)
    }
}

/// New keys the child checks: with 256 stripes, some of them share the
/// parked key's stripe (all but certainly: 1 - (255/256)^2000).
const CHILD_KEYS: u64 = 2_000;

#[test]
fn a_child_forked_during_an_admission_at_the_bound_admits_new_keys() {
    let limiter = Arc::new(
        KeyedLimiter::<Parked>::builder("1/h burst 3".parse::<Quota>().unwrap())
            .clock(ManualClock::new())
            .max_keys(4)
            .build(),
    );
    for key in 0..4 {
        assert!(limiter.check(&Parked(key)).is_allowed());
    }
    let parked = {
        let limiter = Arc::clone(&limiter);
        thread::spawn(move || limiter.check(&Parked(PARKED)).is_allowed())
    };
    let started = Instant::now();
    while STAGE.load(Ordering::SeqCst) != 1 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the check of the parked key never reached its insert"
        );
        thread::sleep(Duration::from_millis(1));
    }
    // Reached: the parked check is inside its admission at the bound (the
    // map was full, so it holds its key's claim), and stays there.
    // SAFETY: the child only checks the limiter (no lock a vanished thread
    // could hold is taken on that path: see the module docs) and leaves
    // with `_exit`, running no destructors.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let admitted = (10_000..10_000 + CHILD_KEYS)
            .filter(|&key| limiter.check(&Parked(key)).is_allowed())
            .count() as u64;
        let code = if admitted == CHILD_KEYS { 0 } else { 1 };
        // SAFETY: ends the forked child at once.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    let mut exited = false;
    let waiting = Instant::now();
    while waiting.elapsed() < Duration::from_secs(20) {
        // SAFETY: polls this process's own child; `status` is a live local.
        if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
            exited = true;
            break;
        }
        thread::sleep(Duration::from_millis(10));
    }
    if !exited {
        // SAFETY: `pid` is this process's own child: kill and reap it.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, &mut status, 0);
        }
    }
    STAGE.store(2, Ordering::SeqCst);
    assert!(parked.join().unwrap(), "the parked key's first request");
    assert!(
        exited,
        "the child hung admitting new keys at the bound (killed after 20 s)"
    );
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child did not admit every new key: status {status:#x}"
    );
}
