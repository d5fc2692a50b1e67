//! A child forked while another thread of the parent holds a migration
//! chunk (claimed, not yet finished): before `map::raw::after_fork`, the
//! child never finished that migration, and its first insert that needed
//! the successor waited forever for a claimer that does not exist in the
//! child. Found at the end of issue 36/38's stop by an ad hoc probe (three
//! threads checking new keys, `clear` and `evict_idle` in a loop, forks
//! every 200 ms): the child's stack was `RawMap::insert` yielding. Its own
//! binary: it forks.

#![cfg(target_os = "linux")]

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use turnstile_rl::{KeyedLimiter, ManualClock, Quota};

/// 0: idle; 1: armed; 2: a migration is parked hashing [`PARKED`]; 3: let go.
static STAGE: AtomicUsize = AtomicUsize::new(0);

/// The key whose rehash, inside a migration's chunk, parks its copier.
const PARKED: u64 = 7;

#[derive(Debug, PartialEq, Eq, Clone)]
struct Slow(u64);

impl Hash for Slow {
    fn hash<H: Hasher>(&self, state: &mut H) {
        if self.0 == PARKED
            && STAGE
                .compare_exchange(1, 2, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            while STAGE.load(Ordering::SeqCst) != 3 {
                thread::sleep(Duration::from_millis(1));
            }
        }
        self.0.hash(state);
    }
}

/// The child inserts new keys through several migrations, and the keys
/// of the parent, the parked one (frozen in the abandoned chunk) among
/// them, keep their state: each had one of its three tokens taken.
#[test]
fn a_child_forked_during_a_migration_inserts_new_keys() {
    let limiter = Arc::new(
        KeyedLimiter::<Slow>::builder("1/h burst 3".parse::<Quota>().unwrap())
            .clock(ManualClock::new())
            .build(),
    );
    for key in 0..10 {
        assert!(limiter.check(&Slow(key)).is_allowed());
    }
    STAGE.store(1, Ordering::SeqCst);
    // New keys until a growth's migration rehashes PARKED and parks there.
    let grower = {
        let limiter = Arc::clone(&limiter);
        thread::spawn(move || {
            let mut key = 1_000;
            while STAGE.load(Ordering::SeqCst) == 1 {
                let _ = limiter.check(&Slow(key));
                key += 1;
            }
        })
    };
    let started = Instant::now();
    while STAGE.load(Ordering::SeqCst) != 2 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no migration rehashed the parked key"
        );
        thread::sleep(Duration::from_millis(1));
    }
    // Reached: a migration's chunk is claimed by the parked thread.
    // SAFETY: the child only checks the limiter and leaves with `_exit`,
    // running no destructors.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        for key in 1_000_000..1_100_000 {
            let _ = limiter.check(&Slow(key));
        }
        let kept = (0..10).all(|key| {
            let taken: Vec<bool> = (0..3)
                .map(|_| limiter.check(&Slow(key)).is_allowed())
                .collect();
            taken == [true, true, false]
        });
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(if kept { 0 } else { 3 }) };
    }
    let mut status = 0;
    let waited = Instant::now();
    let hung = loop {
        // SAFETY: waits for our own child, non-blocking.
        if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
            break false;
        }
        if waited.elapsed() > Duration::from_secs(20) {
            // SAFETY: our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            break true;
        }
        thread::sleep(Duration::from_millis(10));
    };
    STAGE.store(3, Ordering::SeqCst);
    grower.join().unwrap();
    assert!(!hung, "the child hung (killed after 20 s)");
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child failed: {status}"
    );
}
