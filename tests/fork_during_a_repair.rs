//! A grandchild forked while its parent (itself a forked child) is in the
//! middle of repairing a map (`map::raw::after_fork`: its repairing
//! thread stopped inside a key's `Hash`, halfway through re-migrating the
//! chunk a vanished thread of the first parent had claimed) takes the
//! repair over: the repairing thread does not exist in the grandchild, so
//! the REPAIRING note it left is its own fork's, not the grandchild's.
//! The grandchild inserts new keys through migrations, and the keys of
//! the first parent keep their state. The child, let go, finishes its own
//! repair and does the same. Its own binary: it forks.

#![cfg(target_os = "linux")]

mod fork_kit;

use std::sync::Arc;
use std::thread;

use fork_kit::{Limiter, Slow};

/// New keys through several migrations, then the first parent's keys:
/// 0 if each kept its state, 3 if not.
fn insert_and_check(limiter: &Limiter, first: u64) -> i32 {
    for key in first..first + 50_000 {
        let _ = limiter.check(&Slow(key));
    }
    if fork_kit::ten_keys_kept(limiter, &[]) {
        0
    } else {
        3
    }
}

/// The child: its repairing thread parks at `PARKED` (which the first
/// parent's vanished copier had frozen), and a grandchild is forked
/// then. Exit status: 0 if both went on and kept the keys; 10 + the
/// grandchild's status if it failed, 20 if it hung; 34 if the child's
/// repairing check failed, 33 if its keys changed after.
fn child(limiter: &Arc<Limiter>) -> i32 {
    fork_kit::arm();
    let repairer = {
        let limiter = Arc::clone(limiter);
        thread::spawn(move || limiter.check(&Slow(2_000_000)).is_allowed())
    };
    fork_kit::wait_until_parked("the child's repair");
    let pid = fork_kit::fork(|| {
        fork_kit::let_go();
        insert_and_check(limiter, 3_000_000)
    });
    let grandchild = fork_kit::wait_for(pid);
    fork_kit::let_go();
    let repaired = repairer.join().is_ok_and(|allowed| allowed);
    match grandchild.map(fork_kit::exit_status) {
        None => 20,
        Some(status) if status != 0 => 10 + status.max(0),
        Some(_) if !repaired => 34,
        Some(_) => match insert_and_check(limiter, 4_000_000) {
            0 => 0,
            code => 30 + code,
        },
    }
}

#[test]
fn a_grandchild_forked_during_its_parents_repair_takes_the_repair_over() {
    assert_eq!(
        fork_kit::fork_during_a_parked_migration(child),
        0,
        "1x: the grandchild failed (x: its status), 20: the grandchild hung, \
         34: the child's repairing check failed, 33: the child's keys changed, \
         50: the child panicked"
    );
}
