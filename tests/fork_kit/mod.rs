//! What the fork tests share: a key whose rehash parks the migration that
//! makes it (so a process forks while a thread holds a migration chunk),
//! and the forking itself: a child's end and the wait for it.

#![allow(dead_code)]

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use turnstile_rl::{KeyedLimiter, ManualClock, Quota};

/// 0: idle; 1: armed; 2: a thread is parked hashing [`PARKED`]; 3: let go.
pub static STAGE: AtomicUsize = AtomicUsize::new(0);

/// Set: [`PARKED`] parks in its `Clone` (the key an insert stores), not
/// in its `Hash` (a rehash in a migration).
pub static PARK_IN_CLONE: AtomicBool = AtomicBool::new(false);

/// Set: [`PARKED`]'s next `Hash` panics (and clears it).
pub static PANICS: AtomicBool = AtomicBool::new(false);

/// The key whose rehash parks its thread while [`STAGE`] is armed.
pub const PARKED: u64 = 7;

/// How long a process waits for a step of another before calling it hung.
pub const LIMIT: Duration = Duration::from_secs(20);

/// A key that hashes its number; at [`PARKED`], its `Hash` (or its
/// `Clone`: [`PARK_IN_CLONE`]) parks while [`STAGE`] is armed, and its
/// `Hash` panics while [`PANICS`] is set.
#[derive(Debug, PartialEq, Eq)]
pub struct Slow(pub u64);

/// Parks this thread if [`STAGE`] is armed, until [`let_go`].
fn park_here() {
    if STAGE
        .compare_exchange(1, 2, Ordering::SeqCst, Ordering::SeqCst)
        .is_ok()
    {
        while STAGE.load(Ordering::SeqCst) != 3 {
            thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Clone for Slow {
    fn clone(&self) -> Self {
        if self.0 == PARKED && PARK_IN_CLONE.load(Ordering::SeqCst) {
            park_here();
        }
        Slow(self.0)
    }
}

impl Hash for Slow {
    fn hash<H: Hasher>(&self, state: &mut H) {
        if self.0 == PARKED {
            if !PARK_IN_CLONE.load(Ordering::SeqCst) {
                park_here();
            }
            if PANICS.swap(false, Ordering::SeqCst) {
                panic!("the parked key's Hash panicked");
            }
        }
        self.0.hash(state);
    }
}

pub type Limiter = KeyedLimiter<Slow, ManualClock>;

/// A limiter of burst 3 on a frozen clock, keys `0..10` checked once each
/// (two tokens left).
pub fn ten_keys_charged_once() -> Arc<Limiter> {
    let limiter = Arc::new(
        KeyedLimiter::<Slow>::builder("1/h burst 3".parse::<Quota>().unwrap())
            .clock(ManualClock::new())
            .build(),
    );
    for key in 0..10 {
        assert!(limiter.check(&Slow(key)).is_allowed());
    }
    limiter
}

/// Arms the park: the next rehash of [`PARKED`] parks its thread.
pub fn arm() {
    STAGE.store(1, Ordering::SeqCst);
}

/// Waits until a thread is parked hashing [`PARKED`].
pub fn wait_until_parked(what: &str) {
    let started = Instant::now();
    while STAGE.load(Ordering::SeqCst) != 2 {
        assert!(started.elapsed() < LIMIT, "{what} never parked");
        thread::sleep(Duration::from_millis(1));
    }
}

/// Parks a migration of `limiter`: a thread checks new keys until a
/// growth's migration rehashes [`PARKED`] inside its chunk, and parks
/// there. Join the thread after [`let_go`].
pub fn park_a_migration(limiter: &Arc<Limiter>) -> thread::JoinHandle<()> {
    arm();
    let grower = {
        let limiter = Arc::clone(limiter);
        thread::spawn(move || {
            let mut key = 1_000;
            while STAGE.load(Ordering::SeqCst) == 1 {
                let _ = limiter.check(&Slow(key));
                key += 1;
            }
        })
    };
    wait_until_parked("the parent's migration");
    grower
}

/// Forks while a migration of [`ten_keys_charged_once`]'s limiter is
/// parked (its chunk claimed by a thread the child does not have): the
/// child runs `child`; returns its exit status, or panics if it hung.
pub fn fork_during_a_parked_migration(child: impl FnOnce(&Arc<Limiter>) -> i32) -> i32 {
    let limiter = ten_keys_charged_once();
    let grower = park_a_migration(&limiter);
    let pid = fork(|| child(&limiter));
    let status = wait_for(pid);
    let_go();
    grower.join().unwrap();
    exit_status(status.unwrap_or_else(|| panic!("the child hung (killed after {LIMIT:?})")))
}

/// Lets the parked thread go on.
pub fn let_go() {
    STAGE.store(3, Ordering::SeqCst);
}

/// Forks: the child runs `child` (a panic is status 50) and ends with its
/// status, running no destructors; the parent gets the child's pid.
pub fn fork(child: impl FnOnce() -> i32) -> libc::pid_t {
    // SAFETY: the child only runs `child`, which uses what the tests
    // share with it (no lock a vanished thread could hold), and leaves
    // with `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(50);
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    pid
}

/// Waits for the child `pid` at most [`LIMIT`]: its raw wait status, or
/// `None` if it hung (then it is killed and reaped).
pub fn wait_for(pid: libc::pid_t) -> Option<libc::c_int> {
    let mut status = 0;
    let waiting = Instant::now();
    loop {
        // SAFETY: polls this process's own child; `status` is a live local.
        if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
            return Some(status);
        }
        if waiting.elapsed() > LIMIT {
            // SAFETY: `pid` is this process's own child: kill and reap it.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return None;
        }
        thread::sleep(Duration::from_millis(1));
    }
}

/// A child's exit status from its raw wait status (`-1`: it did not exit).
pub fn exit_status(status: libc::c_int) -> i32 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -1
    }
}

/// How many of keys `0..10`'s next four checks each admits, as they
/// should be after [`ten_keys_charged_once`]: two, or three for a key in
/// `lost`. False if any differs.
pub fn ten_keys_kept(limiter: &Limiter, lost: &[u64]) -> bool {
    (0..10).all(|key| {
        let admitted = (0..4)
            .filter(|_| limiter.check(&Slow(key)).is_allowed())
            .count();
        admitted == if lost.contains(&key) { 3 } else { 2 }
    })
}
