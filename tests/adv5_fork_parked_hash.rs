//! Adversary 5: a migration chunk parked inside a key's `Hash` (7e50904
//! hashes a key while its bucket is still live, before the COPYING CAS),
//! while other threads act on that same key, with and without a fork.
//!
//! While the chunk's thread hashes, the bucket is live: a check of the key
//! lands on it without waiting, and so does a reset; the chunk's CAS then
//! fails, and it copies (or leaves behind) what it reads next. A child
//! forked at that moment has a live bucket in a claimed chunk, which its
//! repair migrates. In every case the key keeps exactly the admissions
//! made on it. Its own binary: it forks.

#![cfg(target_os = "linux")]

mod fork_kit;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fork_kit::{Limiter, Slow, PARKED};
use turnstile_test_kit::within::within;

/// The cases share fork_kit's park: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// How many of the key's next four checks admit.
fn admits(limiter: &Limiter, key: u64) -> usize {
    (0..4)
        .filter(|_| limiter.check(&Slow(key)).is_allowed())
        .count()
}

/// The other nine of the ten keys, each charged once of three.
fn others_kept(limiter: &Limiter) -> bool {
    (0..10)
        .filter(|&key| key != PARKED)
        .all(|key| admits(limiter, key) == 2)
}

/// With a migration parked hashing [`PARKED`] (its bucket charged once),
/// `act` runs on this thread against that key (bounded: the bucket is
/// live, nothing may wait on the parked thread); then a child forks and
/// checks the key; then the parked thread goes on and the parent checks
/// it. Returns (what the child's key admitted or an error code, what the
/// parent's key admitted).
fn parked_then(act: impl FnOnce(&Limiter) + Send + 'static) -> (i32, usize) {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let limiter = fork_kit::ten_keys_charged_once();
    let grower = fork_kit::park_a_migration(&limiter);
    {
        let limiter = Arc::clone(&limiter);
        within(
            Duration::from_secs(20),
            "a check of a key whose chunk is hashing it",
            move || act(&limiter),
        );
    }
    let pid = fork_kit::fork(|| {
        // Through several migrations, the repair's first.
        for key in 1_000_000..1_050_000 {
            if !limiter.check(&Slow(key)).is_allowed() {
                return 60;
            }
        }
        if !others_kept(&limiter) {
            return 61;
        }
        if turnstile_rl::__private::fork_repairs().1 == 0 {
            // Not reached: no migration left for the repair to finish.
            return 62;
        }
        admits(&limiter, PARKED) as i32
    });
    let status = fork_kit::wait_for(pid);
    fork_kit::let_go();
    grower.join().unwrap();
    let child = fork_kit::exit_status(status.expect("the child hung"));
    assert!(
        others_kept(&limiter),
        "the parent's other keys lost their state"
    );
    (child, admits(&limiter, PARKED))
}

#[test]
fn a_check_landing_while_the_chunk_hashes_its_key_is_copied_in_parent_and_child() {
    let (child, parent) = parked_then(|limiter| {
        // The second of three tokens: lands on the live bucket at once.
        assert!(limiter.check(&Slow(PARKED)).is_allowed());
    });
    assert_eq!(child, 1, "the child's key (60-62: other failures)");
    assert_eq!(parent, 1, "the parent's key after the chunk's CAS failed");
}

#[test]
fn a_reset_landing_while_the_chunk_hashes_its_key_is_not_undone() {
    let (child, parent) = parked_then(|limiter| {
        assert!(limiter.reset(&Slow(PARKED)), "the key was tracked");
        // And back, fresh, in the successor: two tokens of three left.
        assert!(limiter.check(&Slow(PARKED)).is_allowed());
    });
    assert_eq!(child, 2, "the child's key (60-62: other failures)");
    assert_eq!(parent, 2, "the parent's key after the chunk found it dead");
}

#[test]
fn peeks_and_refunds_landing_while_the_chunk_hashes_its_key_count() {
    let (child, parent) = parked_then(|limiter| {
        assert_eq!(limiter.peek(&Slow(PARKED)).remaining(), 1);
        assert!(limiter.check(&Slow(PARKED)).is_allowed());
        assert!(limiter.check(&Slow(PARKED)).is_allowed());
        assert!(limiter.check(&Slow(PARKED)).is_denied());
        assert!(limiter.refund(&Slow(PARKED), 1).unwrap());
    });
    assert_eq!(child, 1, "the child's key (60-62: other failures)");
    assert_eq!(parent, 1, "the parent's key");
}
