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
//!    and that every walk passes over. In a tagged map it is tagged too,
//!    so lookups pass it as well (`super::tags`), and so is an orphan a
//!    repair that a fork cut short left untagged.
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
//!
//! **Limits: a key's code that uses a limiter during a repair.** Two
//! cases the second adversary found are not handled, each with an ignored
//! reproducer in this module's tests (`cargo test --lib
//! map::raw::after_fork -- --include-ignored`):
//! - A key's `Hash` that checks another map while a second thread is
//!   repairing that map goes on in it unrepaired (a thread inside a repair
//!   never waits for another's, so two repairs whose keys use each other's
//!   maps cannot deadlock); that repair's recount can then miss the first
//!   thread's reservation, and the map admits one key past `max_keys` for
//!   good (`a_map_checked_during_another_threads_repair_of_it_counts_every_live_bucket`).
//!   A fix (one repairing thread per process) trades it for a deadlock
//!   when a waiting thread holds what the repairer's key code waits for.
//! - A key's `Hash` that calls `clear` or `evict_idle` on its own limiter
//!   during the repair waits for the migration the repair holds, forever
//!   (`a_clear_by_a_keys_code_during_the_repair_sees_the_migration_end`);
//!   the same self-wait exists without a fork when such a `Hash` runs in
//!   the thread's own migration chunk.
//!
//! Both need a key whose own code checks a limiter in a forked child
//! (the second its own limiter, which `crate::keyed` already asks keys not
//! to do).

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering as StdOrdering};

use super::slot::Slot;
use super::table::Table;
use super::RawMap;
use crate::cell::{Seen, COPIED, FROZEN};
use crate::map::pin::Guard;
use crate::sync::Ordering;

/// Set in a map's fork note while a thread repairs it.
const REPAIRING: u64 = 1 << 63;

/// What this process's repairs did, for the fork tests to know which
/// cases they reached (`__private::fork_repairs`): maps repaired,
/// migrations finished, slots orphaned, copies cut short.
pub(crate) static REPAIRS: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];
/// Indices of [`REPAIRS`].
const MAPS: usize = 0;
const MIGRATIONS: usize = 1;
const ORPHANS: usize = 2;
const COPIES: usize = 3;

/// Counts one more of `what` in [`REPAIRS`] (the repair's cold path only).
fn count(what: usize) {
    REPAIRS[what].fetch_add(1, StdOrdering::Relaxed);
}

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
    /// The maps this thread is repairing, innermost first: a chain through
    /// the repairs' stack frames (null: none). A key's `Hash` that uses one
    /// of them during its repair goes on without waiting for itself;
    /// another map it uses is repaired first if no thread is repairing it
    /// yet, as at any first pin, and otherwise gone on with unrepaired: a
    /// thread inside a repair never waits for another thread's, so two
    /// repairs whose keys use each other's map cannot wait for each other.
    /// (Helper `adv3`'s design, after it found one flag for every map let
    /// another map go unrepaired.)
    static REPAIRING_HERE: std::cell::Cell<*const Repairing> =
        const { std::cell::Cell::new(std::ptr::null()) };
}

/// One link of [`REPAIRING_HERE`]: the map a repair on this thread is
/// repairing, and the repair it runs inside of. Unlinks itself when the
/// repair ends, unwinding or not.
struct Repairing {
    map: *const (),
    outer: *const Repairing,
}

impl Repairing {
    /// Whether this thread is inside a repair, and whether of `map`.
    fn here(map: *const ()) -> (bool, bool) {
        let innermost = REPAIRING_HERE.with(std::cell::Cell::get);
        let mut link = innermost;
        // SAFETY: every link in the chain is the frame of a repair running
        // on this thread, which unlinks it before it ends (`Drop`).
        while let Some(repairing) = unsafe { link.as_ref() } {
            if repairing.map == map {
                return (true, true);
            }
            link = repairing.outer;
        }
        (!innermost.is_null(), false)
    }

    /// Runs `repair` of `map` with this thread's chain holding it.
    fn run<T>(map: *const (), repair: impl FnOnce() -> T) -> T {
        let link = Repairing {
            map,
            outer: REPAIRING_HERE.with(std::cell::Cell::get),
        };
        REPAIRING_HERE.with(|here| here.set(&link));
        let result = repair();
        drop(link);
        result
    }
}

impl Drop for Repairing {
    fn drop(&mut self) {
        REPAIRING_HERE.with(|here| here.set(self.outer));
    }
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
        let me = std::ptr::from_ref(self).cast::<()>();
        let (inside_a_repair, repairing_me) = Repairing::here(me);
        if repairing_me {
            return;
        }
        // Marked with this process's fork count: a repair that a later fork
        // cut short (its thread gone in the grandchild) is taken over.
        let repairing = forks | REPAIRING;
        let note = &self.fork_note.forks;
        let mut attempt = 0;
        loop {
            let noted = note.load(StdOrdering::Acquire);
            if noted == forks || (noted == repairing && inside_a_repair) {
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
                    panicked = Repairing::run(me, || self.repair(&guard));
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

    /// Steps 1 to 4 of the module docs, by the one thread that touches the
    /// map; returns the first panic of a key's code, to resume later.
    pub(super) fn repair(&self, guard: &Guard) -> Option<Box<dyn std::any::Any + Send>> {
        let root = self.root.load(Ordering::Acquire, guard);
        // SAFETY: as in `find`.
        let t = unsafe { root.deref() };
        let next = t.next.load(Ordering::Acquire, guard);
        // SAFETY: as in `find`; a successor is never reset.
        let n = unsafe { next.as_ref() };
        count(MAPS);
        for table in std::iter::once(t).chain(n) {
            for (index, slot) in table.slots.iter().enumerate() {
                let word = slot.cell.word();
                if word == crate::cell::BUSY {
                    slot.cell.orphan();
                    count(ORPHANS);
                }
                // Keys inserted from now on may lie past an orphan: a
                // lookup must not stop at it (`super::tags`). Also one a
                // repair cut short by a fork orphaned but had not tagged
                // yet (no published slot is COPIED|FROZEN without a tag).
                let orphaned = word == crate::cell::BUSY || word == COPIED | FROZEN;
                if super::tags::tagged::<K>() && orphaned {
                    table.tags.set_any(index);
                }
            }
        }
        let mut panicked = None;
        if let Some(n) = n {
            for slot in t.slots.iter() {
                if Seen::of(slot.cell.word()).0 == Seen::Copying {
                    slot.cell.finish_copy();
                    count(COPIES);
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
            count(MIGRATIONS);
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
        let filled = table.filled();
        let live = table
            .slots
            .iter()
            .filter(|slot| matches!(Seen::of(slot.cell.word()).0, Seen::Live(_)))
            .count();
        let closed = table.counters.occupied.load(Ordering::Relaxed) & super::table::CLOSED;
        table
            .counters
            .occupied
            .store(filled | closed, Ordering::Relaxed);
        self.len.store(live, Ordering::Relaxed);
    }

    /// Migrates `slot` of the root into `next` unless it is migrated
    /// already (frozen empty, dead or copied: every word with the FROZEN
    /// bit, since a live word is never frozen).
    fn migrate_again(&self, slot: &Slot<K>, next: &Table<K>) {
        if Seen::of(slot.cell.word()).1 {
            return;
        }
        let mut copies = 0;
        let _ = self.migrate_slot(slot, next, &|_| false, &mut copies);
        next.counters.copied.fetch_add(copies, Ordering::Relaxed);
    }
}

/// Each half-done state a vanished thread can leave, staged by hand on one
/// thread (as the child's repairing thread finds them), then repaired.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::map::pin::pin;
    use crossbeam_epoch::Shared;

    fn never_idle(_: u64) -> bool {
        false
    }

    /// A map holding keys `0..8`, each with state `key + 1`.
    fn map_of_eight() -> RawMap<u64> {
        let map = RawMap::new(ahash::RandomState::with_seeds(1, 2, 3, 4), 1_000);
        insert_ids(&map, 0..8, |id| id);
        map
    }

    /// Inserts the keys `key(id)` for `ids` into `map`, each with state
    /// `id + 1`.
    fn insert_ids<K: std::hash::Hash + Eq>(
        map: &RawMap<K>,
        ids: std::ops::Range<u64>,
        key: impl Fn(u64) -> K,
    ) {
        let guard = pin();
        for id in ids {
            assert!(map.try_reserve(usize::MAX));
            let probe = key(id);
            let (_, inserted) = map.insert(
                map.hash(&probe),
                &probe,
                || key(id),
                || id + 1,
                &never_idle,
                &guard,
            );
            assert!(inserted);
        }
    }

    /// Starts a migration of `map` whose chunks were handed out (to
    /// threads that vanished) up to slot `handed_out`: the root, its
    /// successor, and the successor's pointer (what the root becomes).
    fn migration_handed_out<'g, K: std::hash::Hash + Eq>(
        map: &RawMap<K>,
        handed_out: usize,
        guard: &'g Guard,
    ) -> (&'g Table<K>, &'g Table<K>, Shared<'g, Table<K>>) {
        let root = map.root.load(Ordering::Acquire, guard);
        let next = map.start_migration(root, guard);
        // SAFETY: both tables are alive under `guard`.
        let (t, n) = unsafe { (root.deref(), next.deref()) };
        t.counters.claimed.fetch_add(handed_out, Ordering::Relaxed);
        (t, n, next)
    }

    /// A migration of `map` whose every chunk a vanished thread claimed:
    /// its repair migrates (and so hashes) every key again.
    fn claim_every_chunk<K: std::hash::Hash + Eq>(map: &RawMap<K>, guard: &Guard) {
        let capacity = map.capacity(guard);
        let _ = migration_handed_out(map, capacity, guard);
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
        // The migration had handed out half the table (the repair finishes
        // both halves), and vanished threads had left:
        let half = map.capacity(&guard) / 2;
        let (_, n, next) = migration_handed_out(&map, half, &guard);
        // key 1: copied, its COPIED mark not yet written;
        let (slot, state) = slot_of(&map, 1, &guard);
        assert!(slot.cell.start_copy(state));
        // SAFETY: the word was live; both tables are alive.
        assert!(unsafe { n.place_copy(slot, state, map.hash(&1u64)) });
        // key 2: its copy won, not yet placed (its state went with it);
        let (slot, state) = slot_of(&map, 2, &guard);
        assert!(slot.cell.start_copy(state));
        // key 3: live, its chunk's thread gone before it reached it;
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
        let filled = n.filled();
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

    /// Inserts into `map` (root `t`) a key whose home is slot `orphan`, so
    /// it lands past it, and asserts that a lookup finds it.
    fn a_key_past_is_found(map: &RawMap<String>, t: &Table<String>, orphan: usize, guard: &Guard) {
        let key = (0..)
            .map(|i| format!("past the orphan {i}"))
            .find(|key| t.home(map.hash(key.as_str())) == orphan)
            .expect("a key whose home is the orphan");
        let hash = map.hash(key.as_str());
        assert!(map.try_reserve(usize::MAX));
        let (slot, inserted) =
            map.insert(hash, key.as_str(), || key.clone(), || 1, &never_idle, guard);
        assert!(inserted);
        let found = map
            .find(hash, key.as_str(), guard)
            .expect("the key past the orphan");
        assert!(std::ptr::eq(found, slot));
    }

    /// A tagged map (`String` keys): a slot a vanished insert held BUSY had
    /// no tag yet, and a lookup stops at a tag of 0 (`super::tags`). Once
    /// the repair has orphaned it, keys inserted later may lie past it, so
    /// the repair tags it: without that, the key below is inserted past the
    /// orphan and then never found.
    #[test]
    fn a_slot_orphaned_by_the_repair_is_tagged_so_lookups_pass_it() {
        let map = RawMap::<String>::new(ahash::RandomState::with_seeds(5, 6, 7, 8), 1_000);
        let guard = pin();
        // SAFETY: the root is alive under `guard`.
        let t = unsafe { map.root.load(Ordering::Acquire, &guard).deref() };
        let orphan = 3;
        assert!(t.slots[orphan].cell.claim_empty() && map.try_reserve(usize::MAX));
        assert_eq!(t.tags.get(orphan), 0, "claimed, not yet tagged");

        assert!(map.repair(&guard).is_none());
        assert_ne!(t.tags.get(orphan), 0, "the orphan is tagged");
        a_key_past_is_found(&map, t, orphan, &guard);
    }

    /// A repair that a fork cut short between orphaning a slot and tagging
    /// it (another thread of the child forked then) leaves the grandchild a
    /// slot COPIED|FROZEN with no tag. The grandchild takes the repair over
    /// and runs it whole; the slot is no longer BUSY, yet it must be tagged
    /// all the same, or the grandchild's lookups stop there while its
    /// inserts pass it (as after a repair that never tagged).
    #[test]
    fn an_orphan_left_untagged_by_a_repair_cut_short_is_tagged_by_the_next() {
        let map = RawMap::<String>::new(ahash::RandomState::with_seeds(5, 6, 7, 8), 1_000);
        let guard = pin();
        // SAFETY: the root is alive under `guard`.
        let t = unsafe { map.root.load(Ordering::Acquire, &guard).deref() };
        let orphan = 3;
        assert!(t.slots[orphan].cell.claim_empty() && map.try_reserve(usize::MAX));
        // The cut repair's step 1, up to the fork: orphaned, not tagged.
        t.slots[orphan].cell.orphan();
        assert_eq!(t.tags.get(orphan), 0);

        assert!(map.repair(&guard).is_none());
        assert_ne!(t.tags.get(orphan), 0, "the orphan is tagged");
        a_key_past_is_found(&map, t, orphan, &guard);
    }

    /// A thread closed the root to start a migration and vanished before
    /// it installed the successor (a vanished insert also held a place in
    /// `len` and a slot): the repair counts both again and keeps the table
    /// closed, and the child's next insert installs the successor itself,
    /// sized from the recounted `len`, and goes on through growths.
    #[test]
    fn a_root_closed_without_a_successor_is_counted_again_and_still_grows() {
        let map = map_of_eight();
        let guard = pin();
        let root = map.root.load(Ordering::Acquire, &guard);
        // SAFETY: the root is alive under `guard`.
        let t = unsafe { root.deref() };
        assert!(map.try_reserve(usize::MAX) && t.reserve_slot());
        assert!(t.close());
        assert!(!t.reserve_slot(), "closed");

        assert!(map.repair(&guard).is_none());
        assert_eq!(map.held(), 8, "the vanished insert's place given back");
        assert_eq!(map.root.load(Ordering::Acquire, &guard), root);
        assert!(!t.reserve_slot(), "still closed: no insert lands here");

        for key in 100..400u64 {
            assert!(map.try_reserve(usize::MAX));
            let (_, inserted) =
                map.insert(map.hash(&key), &key, || key, || key, &never_idle, &guard);
            assert!(inserted);
        }
        assert_ne!(map.root.load(Ordering::Acquire, &guard), root, "it grew");
        assert_eq!(map.held(), 308);
        for key in (0..8u64).chain(100..400) {
            let expected = if key < 8 { key + 1 } else { key };
            assert_eq!(slot_of(&map, key, &guard).1, expected, "key {key}");
        }
    }

    /// Keys of the landed-copy tests below: `LIVE[id]` counts the
    /// instances alive (made minus dropped: a key dropped twice brings it
    /// below zero); the key whose id is in `HASH_PANICS` panics in `Hash`,
    /// and the one in `EQ_LIES` says it is not equal to itself.
    mod owned_keys {
        use std::hash::{Hash, Hasher};
        use std::sync::atomic::{AtomicIsize, AtomicU64, Ordering::SeqCst};

        pub(super) static LIVE: [AtomicIsize; 16] = [const { AtomicIsize::new(0) }; 16];
        /// The id whose `Hash` panics (`u64::MAX`: none).
        pub(super) static HASH_PANICS: AtomicU64 = AtomicU64::new(u64::MAX);
        /// The id whose `Eq` lies (`u64::MAX`: none).
        pub(super) static EQ_LIES: AtomicU64 = AtomicU64::new(u64::MAX);

        pub(super) struct Owned(pub(super) u64);

        impl Owned {
            pub(super) fn new(id: u64) -> Self {
                LIVE[id as usize].fetch_add(1, SeqCst);
                Owned(id)
            }
        }

        impl Drop for Owned {
            fn drop(&mut self) {
                LIVE[self.0 as usize].fetch_sub(1, SeqCst);
            }
        }

        impl Hash for Owned {
            fn hash<H: Hasher>(&self, state: &mut H) {
                assert!(HASH_PANICS.load(SeqCst) != self.0, "a key's Hash panicked");
                self.0.hash(state);
            }
        }

        impl PartialEq for Owned {
            fn eq(&self, other: &Self) -> bool {
                self.0 == other.0 && EQ_LIES.load(SeqCst) != self.0
            }
        }

        impl Eq for Owned {}
    }

    /// Keys `base..base + 8`; a vanished thread won the copy of key
    /// `base + 1`, placed it in the successor and did not mark the old
    /// slot COPIED. The repair runs with `misbehaving` (a static of
    /// `owned_keys`) naming that key; then the map is dropped, and each
    /// key must have been dropped once. The successor owns the copy, so
    /// the old slot must not own the key too, whatever the key's code
    /// said: both tables would drop it (a double free of a `String`).
    fn landed_copy_repaired_with(
        base: u64,
        misbehaving: &std::sync::atomic::AtomicU64,
    ) -> Option<Box<dyn std::any::Any + Send>> {
        use owned_keys::{Owned, LIVE};
        use std::sync::atomic::Ordering::SeqCst;

        let map = RawMap::<Owned>::new(ahash::RandomState::with_seeds(1, 2, 3, 4), 1_000);
        let (old, panicked) = {
            let guard = pin();
            insert_ids(&map, base..base + 8, Owned::new);
            let (_, n, _) = migration_handed_out(&map, 0, &guard);
            let key = Owned::new(base + 1);
            let slot = map.find(map.hash(&key), &key, &guard).expect("the key");
            let state = slot.cell.state().expect("live");
            assert!(slot.cell.start_copy(state));
            // SAFETY: the word was live; both tables are alive.
            assert!(unsafe { n.place_copy(slot, state, map.hash(&key)) });
            drop(key);

            misbehaving.store(base + 1, SeqCst);
            let panicked = map.repair(&guard);
            misbehaving.store(u64::MAX, SeqCst);
            let copy_is_live = n.slots.iter().any(|other| {
                // SAFETY: a published word; `guard` keeps the table alive.
                matches!(Seen::of(other.cell.word()).0, Seen::Live(_))
                    && unsafe { other.key() }.0 == base + 1
            });
            assert!(copy_is_live, "the copy is in the successor");
            (Seen::of(slot.cell.word()).0, panicked)
        };
        // Both tables are dropped with the map.
        drop(map);
        for id in base..base + 8 {
            assert_eq!(
                LIVE[id as usize].load(SeqCst),
                0,
                "key {id}: instances made minus dropped (the old slot: {old:?})"
            );
        }
        panicked
    }

    #[test]
    fn a_landed_copy_is_dropped_once_when_its_hash_panics_in_the_repair() {
        // The repair asks nothing of the COPYING key's own code: its Hash
        // never runs, so there is no panic to hand back.
        assert!(landed_copy_repaired_with(0, &owned_keys::HASH_PANICS).is_none());
    }

    #[test]
    fn a_landed_copy_is_dropped_once_when_its_eq_lies_in_the_repair() {
        assert!(landed_copy_repaired_with(8, &owned_keys::EQ_LIES).is_none());
    }

    /// Two copies a fork cut short after their claim of a slot in the
    /// successor: key 1's published there but not yet counted in
    /// `copied`, key 2's still BUSY. The repair keeps one and orphans the
    /// other, and ends the migration: the new root's `occupied` must count
    /// every slot filled in it (as once no operation is in flight it always
    /// does), or inserts fill it past its fill limit.
    #[test]
    fn after_a_repair_occupied_counts_every_filled_slot() {
        let map = map_of_eight();
        let guard = pin();
        let capacity = map.capacity(&guard);
        let (_, n, next) = migration_handed_out(&map, capacity, &guard);
        // Key 1: placed and published; its copier vanished before it
        // counted the copy.
        let (slot, state) = slot_of(&map, 1, &guard);
        assert!(slot.cell.start_copy(state));
        // SAFETY: the word was live; both tables are alive.
        // (`place_copy` counts nothing: its callers count in `copied`.)
        assert!(unsafe { n.place_copy(slot, state, map.hash(&1u64)) });
        // Key 2: its copier claimed a slot of the successor and vanished.
        let (slot, state) = slot_of(&map, 2, &guard);
        assert!(slot.cell.start_copy(state));
        assert!(n.slots.iter().any(|slot| slot.cell.claim_empty()));

        assert!(map.repair(&guard).is_none());

        assert_eq!(map.root.load(Ordering::Acquire, &guard), next);
        let filled = n.filled();
        assert_eq!(n.occupied(), filled, "occupied against filled slots");
    }

    /// A thread migrated the whole table, every bucket evicted as idle (a
    /// `clear`), and vanished inside `end_migration`: after it gave back
    /// the room held for copies that did not come, before it swung the
    /// root. The repair ends the migration again; the room must not be
    /// given back twice, or `occupied` wraps below zero into its CLOSED
    /// bit and the new root refuses every insert (or, short of a wrap,
    /// counts fewer slots than are filled).
    #[test]
    fn after_a_repair_the_room_held_for_copies_is_given_back_once() {
        let map = map_of_eight();
        let guard = pin();
        let capacity = map.capacity(&guard);
        let (t, n, next) = migration_handed_out(&map, capacity, &guard);
        for slot in t.slots.iter() {
            let _ = map.migrate_slot(slot, n, &|_| true, &mut 0);
        }
        t.counters.migrated.store(t.capacity(), Ordering::Relaxed);
        // The first half of `end_migration`, by the thread that vanished:
        // all 8 places held for copies given back.
        assert_eq!(n.counters.copied.load(Ordering::Relaxed), 0, "none copied");
        n.counters
            .occupied
            .fetch_sub(n.reserved_for_copies, Ordering::Relaxed);
        assert_eq!(n.occupied(), 0);

        assert!(map.repair(&guard).is_none());

        assert_eq!(map.root.load(Ordering::Acquire, &guard), next);
        let occupied = n.counters.occupied.load(Ordering::Relaxed);
        assert_eq!(occupied, 0, "the new root's occupied, with its CLOSED bit");
        assert!(n.reserve_slot(), "the new root takes inserts");
    }

    /// Keys of the re-entrant repair test below: the first `Hash` after
    /// `HELP_ONCE` is set helps the migration of [`MAP`] along by one
    /// chunk, as a key's code that uses its own limiter during a repair
    /// does (`REPAIRING_HERE` lets it in).
    mod nested_keys {
        use std::hash::{Hash, Hasher};
        use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
        use std::sync::OnceLock;

        use super::super::RawMap;
        use crate::map::pin::pin;

        pub(super) static MAP: OnceLock<RawMap<Nested>> = OnceLock::new();
        pub(super) static HELP_ONCE: AtomicBool = AtomicBool::new(false);

        #[derive(PartialEq, Eq)]
        pub(super) struct Nested(pub(super) u64);

        impl Hash for Nested {
            fn hash<H: Hasher>(&self, state: &mut H) {
                if HELP_ONCE.swap(false, SeqCst) {
                    let map = MAP.get().expect("the map");
                    let _ = map.help_migrate(1, &|_| false, &pin());
                }
                self.0.hash(state);
            }
        }
    }

    /// A key's code that migrates a chunk of the map during its repair
    /// (the repair lets the repairing thread's own operations in): the
    /// chunk counts in `migrated`, beside the ones the repair migrated
    /// again, and the migration still ends.
    #[test]
    fn a_chunk_migrated_by_a_keys_code_during_the_repair_still_counts() {
        use nested_keys::{Nested, HELP_ONCE, MAP};
        use std::sync::atomic::Ordering::SeqCst;

        let map = MAP.get_or_init(|| {
            let mut map = RawMap::new(ahash::RandomState::with_seeds(1, 2, 3, 4), 1_000);
            map.chunk = 4;
            map
        });
        let guard = pin();
        insert_ids(map, 0..8, Nested);
        assert_eq!(map.capacity(&guard), 16);
        // Vanished threads claimed the first two chunks and finished none.
        let (t, _, next) = migration_handed_out(map, 8, &guard);

        HELP_ONCE.store(true, SeqCst);
        assert!(map.repair(&guard).is_none());
        assert!(!HELP_ONCE.load(SeqCst), "a key's Hash migrated a chunk");

        for _ in 0..100 {
            if map.help_migrate(usize::MAX, &never_idle, &guard).is_none() {
                break;
            }
        }
        assert_eq!(
            map.root.load(Ordering::Acquire, &guard),
            next,
            "the migration ended ({} of 16 slots counted migrated)",
            t.counters.migrated.load(Ordering::Relaxed)
        );
        for id in 0..8u64 {
            let found = map.find(map.hash(&Nested(id)), &Nested(id), &guard);
            assert_eq!(found.and_then(|slot| slot.cell.state().ok()), Some(id + 1));
        }
    }

    /// Keys of the cross-map repair test below: the first `Hash` after
    /// `FIRST_PIN_OF_B` is set makes the first pin of [`B`] after a fork,
    /// as a key's code that checks another limiter does, and notes
    /// whether [`B`] was repaired by then.
    mod cross_keys {
        use std::hash::{Hash, Hasher};
        use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
        use std::sync::OnceLock;

        use super::super::RawMap;

        pub(super) static A: OnceLock<RawMap<Cross>> = OnceLock::new();
        pub(super) static B: OnceLock<RawMap<Cross>> = OnceLock::new();
        pub(super) static FIRST_PIN_OF_B: AtomicBool = AtomicBool::new(false);
        pub(super) static B_REPAIRED: AtomicBool = AtomicBool::new(false);

        #[derive(PartialEq, Eq)]
        pub(super) struct Cross(pub(super) u64);

        impl Hash for Cross {
            fn hash<H: Hasher>(&self, state: &mut H) {
                if FIRST_PIN_OF_B.swap(false, SeqCst) {
                    let b = B.get().expect("map B");
                    b.after_fork();
                    let note = b.fork_note.forks.load(SeqCst);
                    B_REPAIRED.store(note == crate::map::pin::forks(), SeqCst);
                }
                self.0.hash(state);
            }
        }
    }

    /// A key of map A whose `Hash`, run by A's repair after a fork, makes
    /// the child's first pin of another map B: B is repaired before that
    /// pin returns, as any first pin's map is (`REPAIRING_HERE` lets in
    /// the map being repaired, not every map).
    #[test]
    fn another_map_pinned_during_a_repair_is_repaired_first() {
        use cross_keys::{Cross, A, B, B_REPAIRED, FIRST_PIN_OF_B};
        use std::sync::atomic::Ordering::SeqCst;

        let new_map = || RawMap::new(ahash::RandomState::with_seeds(1, 2, 3, 4), 1_000);
        let (a, b) = (A.get_or_init(new_map), B.get_or_init(new_map));
        let guard = pin();
        insert_ids(a, 0..8, Cross);
        // A migration of A whose every chunk a vanished thread claimed: the
        // repair rehashes A's keys.
        claim_every_chunk(a, &guard);
        // Both maps were made before a fork this process is a child of.
        let forks = crate::map::pin::forks();
        a.fork_note.forks.store(forks + 1, SeqCst);
        b.fork_note.forks.store(forks + 1, SeqCst);

        FIRST_PIN_OF_B.store(true, SeqCst);
        a.after_fork();
        assert!(!FIRST_PIN_OF_B.load(SeqCst), "a key's Hash pinned B");
        assert_eq!(a.fork_note.forks.load(SeqCst), forks, "A is repaired");
        assert!(
            B_REPAIRED.load(SeqCst),
            "B was not repaired when its first pin returned"
        );
    }

    /// Keys of the racing-repair test below, of map [`A`] or [`B`] by
    /// their second field. [`PHASE`] (0: not yet armed) stages one
    /// interleaving of two child threads: 1 → 2 when B's repair (thread
    /// 2) hashes its first key, which then waits for 3; 2 → 3 when A's
    /// repair (thread 1) hashes its first key, which reserves a place in B for a new key (as a
    /// check's admission does before it builds and publishes the key),
    /// lets B's repair go on, and publishes the key once B is repaired.
    mod racing_keys {
        use std::hash::{Hash, Hasher};
        use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
        use std::sync::OnceLock;

        use super::super::RawMap;
        use crate::map::pin::pin;

        pub(super) static A: OnceLock<RawMap<Racing>> = OnceLock::new();
        pub(super) static B: OnceLock<RawMap<Racing>> = OnceLock::new();
        pub(super) static PHASE: AtomicU32 = AtomicU32::new(0);
        /// Whether B's repair was still under way when thread 1's pin of
        /// B returned.
        pub(super) static B_UNDER_REPAIR: AtomicBool = AtomicBool::new(false);

        #[derive(PartialEq, Eq)]
        pub(super) struct Racing(pub(super) u64, pub(super) bool);

        fn wait_for(phase: u32) {
            while PHASE.load(SeqCst) < phase {
                std::thread::yield_now();
            }
        }

        impl Hash for Racing {
            fn hash<H: Hasher>(&self, state: &mut H) {
                let in_b = self.1;
                if in_b && PHASE.compare_exchange(1, 2, SeqCst, SeqCst).is_ok() {
                    wait_for(4);
                } else if !in_b && PHASE.compare_exchange(2, 3, SeqCst, SeqCst).is_ok() {
                    let b = B.get().expect("map B");
                    // What `Map::pin` does: B's note says another thread
                    // repairs it, and this thread is inside A's repair.
                    b.after_fork();
                    let forks = crate::map::pin::forks();
                    B_UNDER_REPAIR.store(b.fork_note.forks.load(SeqCst) != forks, SeqCst);
                    let guard = pin();
                    assert!(b.try_reserve(usize::MAX));
                    PHASE.store(4, SeqCst);
                    // The key is built (its `Clone`) and published after
                    // B's repair ended.
                    while b.fork_note.forks.load(SeqCst) != forks {
                        std::thread::yield_now();
                    }
                    let key = Racing(100, true);
                    let (_, inserted) = b.insert(
                        b.hash(&key),
                        &key,
                        || Racing(100, true),
                        || 1,
                        &super::never_idle,
                        &guard,
                    );
                    assert!(inserted);
                }
                self.0.hash(state);
            }
        }
    }

    /// Two child threads' first pins: thread 2's of map B, whose repair
    /// hashes B's keys; thread 1's of map A, whose key's `Hash` checks
    /// B meanwhile (a key's code that uses another limiter). Thread 1 is
    /// inside a repair, so its pin of B does not wait for B's repair and
    /// uses B while thread 2 repairs it. Its check reserved its place in
    /// `len` before B's recount and published the key after: B's `len`
    /// must still count every live bucket, or B admits a key past its
    /// `max_keys` (and, with an eviction after the recount's scan, keeps a
    /// place taken forever). The staging assumes thread 1 goes on into B:
    /// a fix that makes it wait for B's repair (one repairing thread per
    /// process, say) must stage the test again, or it waits for itself.
    #[test]
    #[ignore = "reproduces: a map used by another repair's key code while it is repaired loses a reservation in its recount (len below the live buckets)"]
    fn a_map_checked_during_another_threads_repair_of_it_counts_every_live_bucket() {
        use racing_keys::{Racing, A, B, B_UNDER_REPAIR, PHASE};
        use std::sync::atomic::Ordering::SeqCst;

        let new_map = || RawMap::new(ahash::RandomState::with_seeds(1, 2, 3, 4), 1_000);
        let (a, b) = (A.get_or_init(new_map), B.get_or_init(new_map));
        {
            let guard = pin();
            insert_ids(a, 0..8, |id| Racing(id, false));
            insert_ids(b, 0..8, |id| Racing(id, true));
            // A migration of each whose every chunk a vanished thread
            // claimed: both repairs rehash their map's keys.
            claim_every_chunk(a, &guard);
            claim_every_chunk(b, &guard);
        }
        let forks = crate::map::pin::forks();
        a.fork_note.forks.store(forks + 1, SeqCst);
        b.fork_note.forks.store(forks + 1, SeqCst);

        PHASE.store(1, SeqCst);
        std::thread::scope(|scope| {
            scope.spawn(|| b.after_fork());
            while PHASE.load(SeqCst) < 2 {
                std::thread::yield_now();
            }
            a.after_fork();
        });
        assert!(
            B_UNDER_REPAIR.load(SeqCst),
            "thread 1 used B during its repair"
        );

        let guard = pin();
        let live = (0..8)
            .chain([100])
            .filter(|&id| {
                let key = Racing(id, true);
                b.find(b.hash(&key), &key, &guard).is_some()
            })
            .count();
        assert_eq!(live, 9);
        assert_eq!(b.held(), live, "B's len against its live buckets");
    }

    /// Keys of the nested-clear test below: the first `Hash` after
    /// `CLEAR_ONCE` is set does what `clear` and `evict_idle` do first
    /// on [`MAP`] (`Pinned::finish_migration`: help the migration until
    /// none is under way), bounded here to [`LOOKS`] looks, and notes in
    /// `ENDED` whether it saw the migration end.
    mod clearing_keys {
        use std::hash::{Hash, Hasher};
        use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
        use std::sync::OnceLock;

        use super::super::RawMap;
        use crate::map::pin::pin;

        pub(super) static MAP: OnceLock<RawMap<Clearing>> = OnceLock::new();
        pub(super) static CLEAR_ONCE: AtomicBool = AtomicBool::new(false);
        pub(super) static ENDED: AtomicBool = AtomicBool::new(false);
        /// `finish_migration` looks forever; this test looks this often.
        const LOOKS: usize = 10_000;

        #[derive(PartialEq, Eq)]
        pub(super) struct Clearing(pub(super) u64);

        impl Hash for Clearing {
            fn hash<H: Hasher>(&self, state: &mut H) {
                if CLEAR_ONCE.swap(false, SeqCst) {
                    let map = MAP.get().expect("the map");
                    let ended = (0..LOOKS).any(|_| {
                        let helped = map.help_migrate(usize::MAX, &|_| true, &pin());
                        std::thread::yield_now();
                        helped.is_none()
                    });
                    ENDED.store(ended, SeqCst);
                }
                self.0.hash(state);
            }
        }
    }

    /// A key's `Hash` that calls `clear` (or `evict_idle`) on its own
    /// limiter while the repair finishes a migration (the repair lets the
    /// repairing thread's own operations in): `clear` helps the migration
    /// until none is under way, but every chunk is the repair's own
    /// (`claimed` is set to the capacity first) and the root swings only
    /// when the repair's pass is over, after this `Hash` returns. The
    /// nested `clear` waits for itself forever.
    #[test]
    #[ignore = "reproduces: a clear() from a key's Hash during the repair's migration never sees the migration end (it would spin forever)"]
    fn a_clear_by_a_keys_code_during_the_repair_sees_the_migration_end() {
        use clearing_keys::{Clearing, CLEAR_ONCE, ENDED, MAP};
        use std::sync::atomic::Ordering::SeqCst;

        let map =
            MAP.get_or_init(|| RawMap::new(ahash::RandomState::with_seeds(1, 2, 3, 4), 1_000));
        let guard = pin();
        insert_ids(map, 0..8, Clearing);
        claim_every_chunk(map, &guard);

        CLEAR_ONCE.store(true, SeqCst);
        let _ = map.repair(&guard);
        assert!(!CLEAR_ONCE.load(SeqCst), "a key's Hash cleared the map");
        assert!(
            ENDED.load(SeqCst),
            "the nested clear never saw the migration end"
        );
    }
}
