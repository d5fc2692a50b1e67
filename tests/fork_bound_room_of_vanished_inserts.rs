//! A child forked while another thread of the parent is inside the insert
//! of a new key (its place in `len` reserved, its key being made) has the
//! room of that place: the thread does not exist in the child, nor will
//! the bucket it was making, so a map at `max_keys` must not count it.
//! The child's repair counts `len` again (`map::raw::after_fork`).
//! Before, the place stayed taken for good (`map::inflight` said so): at
//! `max_keys(2)` with one key held, the child refused every new key (an
//! eviction that sees one live bucket where two places are taken waits
//! for the insert it thinks is in flight, then refuses). Its own binary:
//! it forks.

#![cfg(target_os = "linux")]

mod fork_kit;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;

use fork_kit::{Slow, PARKED};
use turnstile_rl::{KeyedLimiter, ManualClock, Quota};

#[test]
fn a_child_has_the_room_of_an_insert_that_vanished_in_the_fork() {
    let limiter = Arc::new(
        KeyedLimiter::<Slow>::builder("1/h burst 3".parse::<Quota>().unwrap())
            .clock(ManualClock::new())
            .max_keys(2)
            .build(),
    );
    assert!(limiter.check(&Slow(0)).is_allowed());
    fork_kit::PARK_IN_CLONE.store(true, Ordering::SeqCst);
    fork_kit::arm();
    let parked = {
        let limiter = Arc::clone(&limiter);
        thread::spawn(move || limiter.check(&Slow(PARKED)).is_allowed())
    };
    // Reached: the insert of PARKED holds the map's second place.
    fork_kit::wait_until_parked("the insert of the parked key");
    // The child checks one new key, then key 0 and the new key: each
    // had one of its three tokens taken, so each admits two of four.
    let pid = fork_kit::fork(|| {
        let _ = limiter.check(&Slow(10_000));
        let admitted = |key| {
            (0..4)
                .filter(|_| limiter.check(&Slow(key)).is_allowed())
                .count() as i32
        };
        10 * admitted(0) + admitted(10_000)
    });
    let status = fork_kit::wait_for(pid);
    fork_kit::let_go();
    assert!(parked.join().unwrap(), "the parked key's first request");
    let status = status.expect("the child hung (killed after 20 s)");
    assert_eq!(
        fork_kit::exit_status(status),
        22,
        "ten times what key 0 admitted, plus what the new key admitted"
    );
}
