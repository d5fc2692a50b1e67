//! After a fork: the map's own repair of what the parent's other threads
//! left half done.
//!
//! `fork` copies the address space but only the calling thread. A thread
//! of the parent may have been anywhere in the map's protocol, and in the
//! child it never moves on: a migration chunk it claimed is never
//! finished, so no insert that needs the successor ever returns (it waits
//! for the claimers, `successor`); a slot it held BUSY (an insert or a
//! copy between its claim and its publish) or COPYING (a copy under way)
//! is waited on forever by every insert and copy whose chain passes it.
//! `map::pin::fork` and `map::inflight` clear what such threads held of
//! the pin and of the stripes; this clears what they held of the tables.
//!
//! **When.** The child's first operation on a map repairs it before any
//! other of the child's operations touches it: [`RawMap::after_fork`]
//! compares the map's note with the process's fork count (one load and a
//! compare otherwise), and the thread that wins the note repairs while the
//! others wait. At that moment nothing else moves in the map: every thread
//! that ever touched it vanished in the fork, and the forking thread was
//! not inside an operation (if it was, `pin::pinned_at_fork`, a key's
//! `Hash`, `Eq` or `Drop` or a clock that forked, its own work in
//! progress cannot be told apart from the vanished threads', and nothing
//! is repaired: that child may still wait forever).
//!
//! **What.** In order, in the root and its successor:
//! 1. A BUSY slot is an insert or a copy whose thread vanished after its
//!    claim: its key may be half written, so it is never read, published
//!    or dropped. It becomes COPIED|FROZEN, the one word that owns no key
//!    and that every walk passes over.
//! 2. A COPYING slot of the root is a copy whose copier vanished: it is
//!    marked COPIED, so the old table never owns its key again. If the
//!    copy was published in the successor, the successor owns the key and
//!    nothing is lost. If not, the bucket is lost (COPYING keeps no state,
//!    so there is nothing to copy again), as if evicted, and its key is
//!    leaked, never dropped: one key per copy a fork cut short. Whether
//!    the copy landed is not asked of the key's own `Hash` and `Eq`: one
//!    that panics or lies would leave the key with two owners, each of
//!    which drops it.
//! 3. A migration under way is finished here, by this thread: every slot
//!    of the root is migrated again (those already migrated are left as
//!    they are, the rest migrated as a chunk's claimer would), and the
//!    root swings. One pass over the table, once per map in the child. (A
//!    finisher that vanished between swinging the root and retiring the
//!    old table leaves that table unreachable: it is never freed in the
//!    child.)
//! 4. The one table left is counted again: `occupied` from its filled
//!    slots, `len` from its live buckets. So what vanished threads held of
//!    them is given back or counted once: an insert's place in `len` (which
//!    at a small `max_keys` would refuse new keys for good) and its slot
//!    reservation, a chunk's copies not yet added to `copied`, the room
//!    for copies that a vanished finisher had given back already.
//!
//! A key's `Hash` that panics during the repair loses its bucket
//! (buried, as in a migration) and the repair goes on; the panic is
//! resumed after the note is written, so no other thread waits on it.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering as StdOrdering};

use super::slot::Slot;
use super::table::Table;
use super::RawMap;
use crate::cell::Seen;
use crate::map::pin::Guard;
use crate::sync::Ordering;

/// Set in a map's fork note while a thread repairs it.
const REPAIRING: u64 = 1 << 63;

/// Which fork's process a map's tables belong to (see the module docs).
pub(crate) struct ForkNote {
    forks: AtomicU64,
}

impl ForkNote {
    pub(super) fn new() -> Self {
        ForkNote {
            forks: AtomicU64::new(crate::map::pin::forks()),
        }
    }
}

thread_local! {
    /// Whether this thread is repairing a map: a key's `Hash` or `Eq` that
    /// uses the map during the repair goes on without waiting for itself.
    static REPAIRING_HERE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl<K: std::hash::Hash + Eq> RawMap<K> {
    /// Repairs the map if this is a forked child's first operation on it
    /// (see the module docs); one load and a compare otherwise.
    #[inline]
    pub(crate) fn after_fork(&self) {
        let forks = crate::map::pin::forks();
        // Acquire: pairs with the repair's Release below.
        if self.fork_note.forks.load(StdOrdering::Acquire) != forks {
            self.repair_after_fork(forks);
        }
    }

    #[cold]
    fn repair_after_fork(&self, forks: u64) {
        if REPAIRING_HERE.with(std::cell::Cell::get) {
            return;
        }
        // Marked with this process's fork count: a repair that a later fork
        // cut short (its thread gone in the grandchild) is taken over.
        let repairing = forks | REPAIRING;
        let note = &self.fork_note.forks;
        let mut attempt = 0;
        loop {
            let noted = note.load(StdOrdering::Acquire);
            if noted == forks {
                return;
            }
            if noted != repairing
                && note
                    .compare_exchange(noted, repairing, StdOrdering::Acquire, StdOrdering::Acquire)
                    .is_ok()
            {
                let mut panicked = None;
                // Unpinned only after the note is written: an unpin may free
                // retired tables, whose keys' `Drop` may panic.
                let guard = crate::map::pin::pin();
                if !crate::map::pin::pinned_at_fork() {
                    REPAIRING_HERE.with(|here| here.set(true));
                    panicked = self.repair(&guard);
                    REPAIRING_HERE.with(|here| here.set(false));
                }
                // Release: an operation that sees the new note sees the
                // repaired tables.
                note.store(forks, StdOrdering::Release);
                drop(guard);
                if let Some(panic) = panicked {
                    resume_unwind(panic);
                }
                return;
            }
            crate::sync::wait_briefly(&mut attempt);
        }
    }

    /// Steps 1 to 3 of the module docs, by the one thread that touches the
    /// map; returns the first panic of a key's code, to resume later.
    pub(super) fn repair(&self, guard: &Guard) -> Option<Box<dyn std::any::Any + Send>> {
        let root = self.root.load(Ordering::Acquire, guard);
        // SAFETY: as in `find`.
        let t = unsafe { root.deref() };
        let next = t.next.load(Ordering::Acquire, guard);
        // SAFETY: as in `find`; a successor is never reset.
        let n = unsafe { next.as_ref() };
        for table in std::iter::once(t).chain(n) {
            for slot in table.slots.iter() {
                if slot.cell.word() == crate::cell::BUSY {
                    slot.cell.orphan();
                }
            }
        }
        let mut panicked = None;
        if let Some(n) = n {
            for slot in t.slots.iter() {
                if Seen::of(slot.cell.word()).0 == Seen::Copying {
                    slot.cell.finish_copy();
                }
            }
            // Every chunk, handed out or not, is this thread's now.
            t.counters.claimed.store(t.capacity(), Ordering::Relaxed);
            for slot in t.slots.iter() {
                let moved = catch_unwind(AssertUnwindSafe(|| self.migrate_again(slot, n)));
                if let Err(panic) = moved {
                    self.settle_panicked(slot);
                    panicked.get_or_insert(panic);
                }
            }
            t.counters.migrated.store(t.capacity(), Ordering::Relaxed);
            self.swing_root(root, next, guard);
        }
        self.recount(n.unwrap_or(t));
        panicked
    }

    /// Counts `occupied` and `len` again from `table`, the only table now,
    /// as what they are when nothing is in flight (nothing is: this thread
    /// alone runs): its filled slots, and its live buckets. What vanished
    /// threads held of them (an insert's place in `len` and its slot
    /// reservation, a chunk's copies not yet added to `copied`, room for
    /// copies that a finisher had given back already) is so given back, or
    /// counted, once.
    fn recount(&self, table: &Table<K>) {
        let (mut filled, mut live) = (0, 0);
        for slot in table.slots.iter() {
            match Seen::of(slot.cell.word()).0 {
                Seen::Empty => {}
                Seen::Live(_) => {
                    filled += 1;
                    live += 1;
                }
                _ => filled += 1,
            }
        }
        let closed = table.counters.occupied.load(Ordering::Relaxed) & super::table::CLOSED;
        table
            .counters
            .occupied
            .store(filled | closed, Ordering::Relaxed);
        self.len.store(live, Ordering::Relaxed);
    }

    /// Migrates `slot` of the root into `next` unless it is migrated
    /// already (frozen empty, dead or copied); a frozen live bucket, which
    /// its vanished claimer froze but did not copy, is copied.
    fn migrate_again(&self, slot: &Slot<K>, next: &Table<K>) {
        match Seen::of(slot.cell.word()) {
            (Seen::Live(state), true) => {
                // SAFETY: a live word: its key is published.
                let hash = unsafe { slot.hash_with(&self.hasher) };
                let _ = self.move_bucket(slot, next, state, hash, None);
            }
            (_, true) => {}
            (_, false) => {
                let mut copies = 0;
                let _ = self.migrate_slot(slot, next, &|_| false, &mut copies);
                next.counters.copied.fetch_add(copies, Ordering::Relaxed);
            }
        }
    }
}

/// Each half-done state a vanished thread can leave, staged by hand on one
/// thread (as the child's repairing thread finds them), then repaired.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::cell::{COPIED, FROZEN};
    use crate::map::pin::pin;

    fn never_idle(_: u64) -> bool {
        false
    }

    /// A map holding keys `0..8`, each with state `key + 1`.
    fn map_of_eight() -> RawMap<u64> {
        let map = RawMap::new(ahash::RandomState::with_seeds(1, 2, 3, 4), 1_000);
        let guard = pin();
        for key in 0..8u64 {
            assert!(map.try_reserve(usize::MAX));
            let (_, inserted) = map.insert(
                map.hash(&key),
                &key,
                || key,
                || key + 1,
                &never_idle,
                &guard,
            );
            assert!(inserted);
        }
        map
    }

    /// `key`'s slot in the root, and its state.
    fn slot_of<'g>(map: &RawMap<u64>, key: u64, guard: &'g Guard) -> (&'g Slot<u64>, u64) {
        let slot = map.find(map.hash(&key), &key, guard).expect("the key");
        (slot, slot.cell.state().expect("live"))
    }

    #[test]
    fn a_migration_left_half_done_is_finished_with_every_bucket_but_an_unplaced_copy() {
        let map = map_of_eight();
        let guard = pin();
        let root = map.root.load(Ordering::Acquire, &guard);
        let next = map.start_migration(root, &guard);
        // SAFETY: both tables are alive under `guard`.
        let (t, n) = unsafe { (root.deref(), next.deref()) };
        // The migration had handed out half the table (the repair finishes
        // both halves), and vanished threads had left:
        t.counters
            .claimed
            .fetch_add(t.capacity() / 2, Ordering::Relaxed);
        // key 1: copied, its COPIED mark not yet written;
        let (slot, state) = slot_of(&map, 1, &guard);
        assert!(slot.cell.freeze(slot.cell.word()) && slot.cell.start_copy(state));
        // SAFETY: the word was live; both tables are alive.
        assert!(unsafe { n.place_copy(slot, state, map.hash(&1u64)) });
        // key 2: its copy won, not yet placed (its state went with it);
        let (slot, state) = slot_of(&map, 2, &guard);
        assert!(slot.cell.freeze(slot.cell.word()) && slot.cell.start_copy(state));
        // key 3: frozen, not yet copied;
        let (slot, _) = slot_of(&map, 3, &guard);
        assert!(slot.cell.freeze(slot.cell.word()));
        // and an insert into the successor claimed a slot, not published.
        let busy = n
            .slots
            .iter()
            .find(|slot| slot.cell.claim_empty())
            .expect("an empty slot");

        assert!(map.repair(&guard).is_none());

        assert_eq!(
            map.root.load(Ordering::Acquire, &guard),
            next,
            "the migration ended"
        );
        assert_eq!(busy.cell.word(), COPIED | FROZEN, "the orphan owns no key");
        let filled = n
            .slots
            .iter()
            .filter(|slot| !matches!(Seen::of(slot.cell.word()), (Seen::Empty, _)))
            .count();
        assert_eq!(n.occupied(), filled, "occupied counts the filled slots");
        for key in (0..8u64).filter(|&key| key != 2) {
            assert_eq!(slot_of(&map, key, &guard).1, key + 1, "key {key}");
        }
        assert!(map.find(map.hash(&2u64), &2u64, &guard).is_none());
        assert_eq!(map.held(), 7);
        // The map goes on: inserts through further migrations, each key
        // once.
        for key in 100..400u64 {
            assert!(map.try_reserve(usize::MAX));
            let (_, inserted) =
                map.insert(map.hash(&key), &key, || key, || key, &never_idle, &guard);
            assert!(inserted);
        }
        assert_eq!(map.held(), 307);
        assert_eq!(slot_of(&map, 3, &guard).1, 4);
    }

    #[test]
    fn a_slot_claimed_by_a_vanished_insert_no_longer_blocks_inserts() {
        let map = map_of_eight();
        let guard = pin();
        // SAFETY: the root is alive under `guard`.
        let t = unsafe { map.root.load(Ordering::Acquire, &guard).deref() };
        // Every empty slot claimed and left BUSY by an insert that had
        // reserved its place in `len`: an insert of a new key would wait on
        // the first one of its chain forever, and the places stay taken.
        let orphans = t
            .slots
            .iter()
            .filter(|slot| slot.cell.claim_empty() && map.try_reserve(usize::MAX))
            .count();
        assert!(orphans > 0);
        assert_eq!(map.held(), 8 + orphans);

        assert!(map.repair(&guard).is_none());
        assert_eq!(map.held(), 8, "the vanished inserts' places given back");

        for key in 100..200u64 {
            assert!(map.try_reserve(usize::MAX));
            let (_, inserted) =
                map.insert(map.hash(&key), &key, || key, || key, &never_idle, &guard);
            assert!(inserted);
        }
        for key in 0..8u64 {
            assert_eq!(slot_of(&map, key, &guard).1, key + 1);
        }
    }
}
