//! A child forked while another thread of the parent holds a migration
//! chunk (claimed, not yet finished): before `map::raw::after_fork`, the
//! child never finished that migration, and its first insert that needed
//! the successor waited forever for a claimer that does not exist in the
//! child. Found at the end of issue 36/38's stop by an ad hoc probe (three
//! threads checking new keys, `clear` and `evict_idle` in a loop, forks
//! every 200 ms): the child's stack was `RawMap::insert` yielding. Its own
//! binary: it forks.

#![cfg(target_os = "linux")]

mod fork_kit;

use fork_kit::{fork_during_a_parked_migration, ten_keys_kept, Slow};

/// The child inserts new keys through several migrations, and the keys
/// of the parent, the parked one (frozen in the abandoned chunk) among
/// them, keep their state: each had one of its three tokens taken.
#[test]
fn a_child_forked_during_a_migration_inserts_new_keys() {
    let status = fork_during_a_parked_migration(|limiter| {
        for key in 1_000_000..1_100_000 {
            let _ = limiter.check(&Slow(key));
        }
        if ten_keys_kept(limiter, &[]) {
            0
        } else {
            3
        }
    });
    assert_eq!(status, 0, "the child's keys lost their state");
}
