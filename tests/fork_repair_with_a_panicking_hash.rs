//! A key's `Hash` that panics while a forked child repairs a map
//! (`map::raw::after_fork`: rehashing a bucket a vanished thread of the
//! parent had frozen in its migration chunk): the panic reaches the
//! check that ran the repair, the other thread of the child that waited
//! for the repair goes on, the key is lost (as in a migration whose
//! `Hash` panics) and every other key keeps its state, and the child goes
//! on inserting new keys through migrations. Its own binary: it forks.

#![cfg(target_os = "linux")]

mod fork_kit;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier};
use std::thread;

use fork_kit::{Limiter, Slow, PANICS, PARKED};

/// The child's checks; its exit status: 0 if all held, else which did
/// not.
fn child(limiter: &Arc<Limiter>) -> i32 {
    PANICS.store(true, Ordering::SeqCst);
    // Two threads make the child's first checks at once: one repairs, and
    // the other waits for it.
    let start = Arc::new(Barrier::new(2));
    let other = {
        let (limiter, start) = (Arc::clone(limiter), Arc::clone(&start));
        thread::spawn(move || {
            start.wait();
            catch_unwind(AssertUnwindSafe(|| limiter.check(&Slow(2_000_000)))).is_err()
        })
    };
    start.wait();
    let here = catch_unwind(AssertUnwindSafe(|| limiter.check(&Slow(2_000_001)))).is_err();
    let Ok(there) = other.join() else {
        return 1;
    };
    if usize::from(here) + usize::from(there) != 1 {
        return 2;
    }
    if PANICS.load(Ordering::SeqCst) {
        return 3;
    }
    let admitted = (3_000_000..3_050_000u64)
        .filter(|&key| limiter.check(&Slow(key)).is_allowed())
        .count();
    if admitted != 50_000 {
        return 4;
    }
    if fork_kit::ten_keys_kept(limiter, &[PARKED]) {
        0
    } else {
        5
    }
}

#[test]
fn a_hash_that_panics_in_a_childs_repair_reaches_one_check_and_stops_none() {
    assert_eq!(
        fork_kit::fork_during_a_parked_migration(child),
        0,
        "1: the waiting thread died, 2: not exactly one check saw the panic, \
         3: no Hash panicked, 4: new keys refused, 5: a key's state changed, \
         50: the child panicked"
    );
}
