//! Migration: how a table grows, shrinks and sheds its dead slots.
//!
//! When a table is full to its [`fill_limit`] (or sparse: see
//! `compact_if_sparse`), a successor sized for the live keys is installed
//! in `next`. From then on new keys go to the successor, and callers copy
//! the old table a chunk at a time: each chunk is claimed by one thread (a
//! `fetch_add` on a cursor), which evicts idle buckets, copies the live
//! ones (each marked COPYING, then COPIED) and freezes the rest. The
//! thread that finishes the last chunk swings the root to the successor
//! and retires the old table (`crate::map::pin::retire`). A successor
//! migrates only after it has become the root, so there are at most two
//! tables at a time.
//!
//! # Sizing a successor
//!
//! A migration must never have more live buckets to place than its
//! successor has slots (it would probe forever), so the successor is sized
//! from a count that bounds them. Starting a migration first *closes* the
//! table (a bit in `occupied`), then reads `len`, then allocates and
//! installs. Every insert reserves its key in `len` (or takes over an
//! evicted key's place there) *before* it reserves a slot in `occupied`,
//! and a closed table refuses reservations. So an insert that can still
//! land in the old table reserved its slot before the close, and the close
//! (Acquire) synchronises with that reservation (Release): the `len` read
//! after the close counts it. Buckets that die meanwhile are not copied.
//! Hence the buckets copied are at most `len` as read, and the successor
//! is made with that many slots already reserved in its `occupied`
//! (`reserved_for_copies`): direct inserts into it stop at its
//! [`fill_limit`] counting the copies still to come, so copies and inserts
//! together never fill more than that. When the last chunk is migrated,
//! the reservations that no copy used are given back. Any thread that finds a table closed
//! but without a successor computes one the same way and races to install
//! it, so a starter that is descheduled between the close and the install
//! blocks no one.
//!

use std::hash::Hash;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

use crossbeam_epoch::{Owned, Shared};

use super::chain::Chain;
use super::evict::Idle;
use super::slot::Slot;
use super::table::{capacity_for, Table, MIN_CAPACITY};
use super::RawMap;
use crate::cell::Seen;
use crate::map::pin::Guard;
use crate::sync::{wait_briefly, Ordering};

/// Slots a caller copies per migration step: small enough to keep one
/// insert's extra latency to a few microseconds, large enough that a table
/// of a million slots is copied after ~16k steps. One under loom, so that
/// the models' small tables have several chunks to hand out and race over.
pub(crate) const MIGRATION_CHUNK: usize = if cfg!(turnstile_loom) { 1 } else { 64 };

/// What migrating one slot did.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Moved {
    /// The slot was empty.
    Empty,
    /// A live bucket, now in the successor.
    Copied,
    /// An idle bucket, evicted and left behind.
    Evicted,
    /// A dead bucket, left behind.
    Dropped,
}

impl<K> RawMap<K> {
    /// The capacity of a successor for `live` keys: [`capacity_for`]'s, at
    /// most the largest table unless `live` needs more.
    pub(super) fn successor_capacity(&self, live: usize) -> usize {
        capacity_for(live).min(self.largest.max(live.saturating_add(live / 2)))
    }
}

impl<K: Hash + Eq> RawMap<K> {
    /// Copies the bucket in `slot`, which this thread took from live
    /// `state` to COPYING (`Cell::start_copy`), into `next` (`hash` is its
    /// key's), with no code of the key's on the way, and marks the slot
    /// COPIED; counts the copy in `copies`, which the chunk adds to
    /// `next`'s `copied` once before it counts as migrated (inserts into
    /// the successor write the same line). False if the successor had no
    /// room, which its sizing rules out.
    fn copy_won(
        &self,
        slot: &Slot<K>,
        next: &Table<K>,
        state: u64,
        hash: u64,
        copies: &mut usize,
    ) -> bool {
        // SAFETY: the word was live when this thread won it: the key is
        // published; the caller's guard keeps both tables alive.
        if unsafe { next.place_copy(slot, state, hash) } {
            // Its slot was reserved in `occupied` when `next` was made
            // (`reserved_for_copies`).
            *copies += 1;
            slot.cell.finish_copy();
            true
        } else {
            // No room: impossible by the sizing argument, but a lost bucket
            // is a better failure than a hang. Settled before the assertion,
            // so that a debug build's panic leaves no slot COPYING.
            slot.cell.abandon_copy();
            self.len.fetch_sub(1, Ordering::Relaxed);
            debug_assert!(false, "a copy found its successor full");
            false
        }
    }

    /// Waits while another thread copies the bucket in `slot` (a few steps
    /// with no code of the key's: see `copy_won`); what a lookup or insert
    /// that meets its own key COPYING does before it looks again.
    #[cold]
    pub(super) fn wait_for_copy(slot: &Slot<K>) {
        let mut waited = 0;
        loop {
            match Seen::of(slot.cell.word()).0 {
                Seen::Copying => {
                    probe!(WAITED_FOR_COPY);
                    wait_briefly(&mut waited);
                }
                _ => return,
            }
        }
    }

    /// Settles a slot whose key's `Hash` panicked in this thread's
    /// migration chunk, so that the chunk can count as migrated: the
    /// bucket is still live (its key is hashed before its COPYING mark), so
    /// it is buried, lost as if evicted. Nothing of the key's runs once the
    /// slot is COPYING, so the panic never leaves one behind.
    #[cold]
    pub(super) fn settle_panicked(&self, slot: &Slot<K>) {
        while let (Seen::Live(state), false) = Seen::of(slot.cell.word()) {
            // An update may land first: look again.
            if slot.cell.bury(state) {
                self.len.fetch_sub(1, Ordering::Relaxed);
                probe!(PANICKED_CHUNK_BURIED);
                return;
            }
        }
        debug_assert!(
            !matches!(Seen::of(slot.cell.word()).0, Seen::Copying),
            "a chunk's panic left a slot COPYING"
        );
    }

    /// The table to go on to from `table`, where a key is absent and cannot
    /// be inserted: its successor, created if needed. Helps the migration
    /// along, so that inserting can never outrun copying.
    pub(super) fn successor<'g>(
        &self,
        table: Shared<'g, Table<K>>,
        idle: &impl Idle,
        guard: &'g Guard,
    ) -> Shared<'g, Table<K>> {
        loop {
            // SAFETY: as in `find`.
            let t = unsafe { table.deref() };
            let next = t.next.load(Ordering::Acquire, guard);
            if !next.is_null() {
                let _ = self.migrate_chunk(table, next, idle, guard);
                return next;
            }
            let root = self.root.load(Ordering::Acquire, guard);
            if root != table {
                // `table` is the successor of a migration still under way:
                // finish that first, so there are never three tables.
                // SAFETY: as in `find`.
                let r = unsafe { root.deref() };
                let r_next = r.next.load(Ordering::Acquire, guard);
                if r_next.is_null() {
                    // The root moved on past `table` already; start over there.
                    return root;
                }
                if self.migrate_chunk(root, r_next, idle, guard).is_none() {
                    // Every chunk is claimed; wait for their claimers (see
                    // "Progress" in `crate::keyed`).
                    probe!(WAITED_FOR_CLAIMED_CHUNKS);
                    crate::sync::yield_now();
                }
                continue;
            }
            // Whoever starts a migration copies its first chunk.
            let next = self.start_migration(table, guard);
            let _ = self.migrate_chunk(table, next, idle, guard);
            return next;
        }
    }
    /// Installs a successor for the root `table`, sized for the live keys;
    /// any thread may call it, and all get the one successor that won.
    pub(super) fn start_migration<'g>(
        &self,
        table: Shared<'g, Table<K>>,
        guard: &'g Guard,
    ) -> Shared<'g, Table<K>> {
        // SAFETY: as in `find`.
        let t = unsafe { table.deref() };
        // Close first, count second: every insert that can still land in
        // `table` is counted in `len` now (see "Sizing a successor").
        let closed_here = t.close();
        let current = t.next.load(Ordering::Acquire, guard);
        if !current.is_null() {
            return current;
        }
        let live = self.len.load(Ordering::Relaxed);
        let next = Owned::new(Table::new(self.successor_capacity(live), live));
        // AcqRel: publishes the new table's fields; Acquire on failure to
        // read the winner's. A loser's table is dropped unpublished.
        match t.next.compare_exchange(
            Shared::null(),
            next,
            Ordering::AcqRel,
            Ordering::Acquire,
            guard,
        ) {
            Ok(next) => {
                if !closed_here {
                    probe!(SUCCESSOR_INSTALLED_BY_HELPER);
                }
                next
            }
            Err(lost) => lost.current,
        }
    }

    /// Starts a migration of the root if a quarter of it is dead weight
    /// (dead buckets) or it is four times larger than the live keys need, so
    /// memory follows the live keys down as well as up.
    pub(crate) fn compact_if_sparse(&self, guard: &Guard) {
        let root = self.root.load(Ordering::Acquire, guard);
        // SAFETY: as in `find`.
        let t = unsafe { root.deref() };
        let live = self.held();
        let dead = t.occupied().saturating_sub(live);
        let oversized = self.successor_capacity(live) <= t.capacity() / 4;
        if t.capacity() > MIN_CAPACITY
            && (dead >= t.capacity() / 4 || oversized)
            && t.next.load(Ordering::Acquire, guard).is_null()
        {
            self.start_migration(root, guard);
        }
    }

    /// Copies up to `chunks` chunks of a migration under way, if there is
    /// one, and returns how many idle keys it evicted on the way; `None` when
    /// no migration was under way.
    pub(crate) fn help_migrate(
        &self,
        chunks: usize,
        idle: &impl Idle,
        guard: &Guard,
    ) -> Option<usize> {
        let root = self.root.load(Ordering::Acquire, guard);
        // SAFETY: as in `find`.
        let next = unsafe { root.deref() }.next.load(Ordering::Acquire, guard);
        if next.is_null() {
            return None;
        }
        let mut evicted = 0;
        for copied in 0..chunks {
            match self.migrate_chunk(root, next, idle, guard) {
                Some(n) => evicted += n,
                None => {
                    // Every chunk was claimed already: this caller waits
                    // for the claimers if it must (see `finish_migration`).
                    if copied == 0 {
                        probe!(WAITED_FOR_CLAIMED_CHUNKS);
                    }
                    let _ = copied;
                    break;
                }
            }
        }
        Some(evicted)
    }

    /// Claims and copies one chunk of `table` into `next`, returning how
    /// many idle keys it evicted; `None` when nothing was left to claim.
    pub(super) fn migrate_chunk(
        &self,
        table: Shared<'_, Table<K>>,
        next: Shared<'_, Table<K>>,
        idle: &impl Idle,
        guard: &Guard,
    ) -> Option<usize> {
        // SAFETY: as in `find`.
        let t = unsafe { table.deref() };
        let start = t.counters.claimed.fetch_add(self.chunk, Ordering::Relaxed);
        if start >= t.capacity() {
            return None;
        }
        let end = (start + self.chunk).min(t.capacity());
        Some(self.migrate_range(table, next, start..end, idle, guard))
    }

    /// Migrates the slots `range` of `table` into `next` (this thread
    /// claimed them), returning how many idle keys it evicted; the thread
    /// that migrates the last slot swings the root and retires the table.
    pub(super) fn migrate_range(
        &self,
        table: Shared<'_, Table<K>>,
        next: Shared<'_, Table<K>>,
        range: std::ops::Range<usize>,
        idle: &impl Idle,
        guard: &Guard,
    ) -> usize {
        // SAFETY: as in `find`.
        let (t, n) = unsafe { (table.deref(), next.deref()) };
        let (start, end) = (range.start, range.end);
        #[cfg(turnstile_loom)]
        {
            let mut copiers = t.copiers.lock().unwrap();
            let me = loom::thread::current().id();
            if !copiers.contains(&me) {
                copiers.push(me);
                if copiers.len() == 2 {
                    probe!(CHUNKS_COPIED_BY_TWO_THREADS);
                }
            }
        }
        let mut evicted = 0;
        let mut copies = 0;
        let mut panicked = None;
        for slot in &t.slots[start..end] {
            // A key's `Hash` may panic before its bucket is copied: the
            // bucket is lost (as if evicted), the chunk is finished so the
            // migration can still end, and the panic goes on after.
            let moved = catch_unwind(AssertUnwindSafe(|| {
                self.migrate_slot(slot, n, idle, &mut copies)
            }));
            match moved {
                Ok(Moved::Evicted) => evicted += 1,
                Ok(_) => {}
                Err(panic) => {
                    self.settle_panicked(slot);
                    panicked.get_or_insert(panic);
                }
            }
        }
        if copies > 0 {
            n.counters.copied.fetch_add(copies, Ordering::Relaxed);
        }
        // AcqRel: the finisher must see every other chunk's copies (and
        // their count) before it retires the table.
        let migrated = t.counters.migrated.fetch_add(end - start, Ordering::AcqRel) + (end - start);
        if migrated == t.capacity() {
            self.end_migration(table, next, guard);
        }
        if let Some(panic) = panicked {
            resume_unwind(panic);
        }
        evicted
    }

    /// The end of the migration of `table` into `next`, by the thread that
    /// migrated its last slot: gives back the room held for copies that
    /// did not come, swings the root and retires `table`.
    pub(super) fn end_migration(
        &self,
        table: Shared<'_, Table<K>>,
        next: Shared<'_, Table<K>>,
        guard: &Guard,
    ) {
        // SAFETY: as in `find`.
        let n = unsafe { next.deref() };
        // Every copy has landed: give back the room held for the buckets
        // that died instead of moving. Never more than was held, so
        // `occupied` cannot wrap into its CLOSED bit.
        let copied = n.counters.copied.load(Ordering::Relaxed);
        let unused = n.reserved_for_copies.saturating_sub(copied);
        if copied > 0 && n.occupied() > n.reserved_for_copies {
            probe!(SUCCESSOR_TOOK_COPIES_AND_INSERTS);
        }
        n.counters.occupied.fetch_sub(unused, Ordering::Relaxed);
        self.swing_root(table, next, guard);
    }

    /// Makes `next`, which holds every live bucket of the root `table`,
    /// the root, and retires `table`.
    pub(super) fn swing_root(
        &self,
        table: Shared<'_, Table<K>>,
        next: Shared<'_, Table<K>>,
        guard: &Guard,
    ) {
        // Every slot is frozen and its bucket copied or left behind: the
        // successor holds every live bucket. Release: publishes it.
        let swung =
            self.root
                .compare_exchange(table, next, Ordering::AcqRel, Ordering::Acquire, guard);
        // A successor is only ever installed on the root (see
        // `start_migration`'s callers), so the swing succeeds; were it
        // ever to fail, leaking the table beats freeing a live one.
        debug_assert!(swung.is_ok(), "only the root is ever migrated");
        if swung.is_ok() {
            #[cfg(turnstile_loom)]
            {
                // SAFETY: as in `find`.
                let t = unsafe { table.deref() };
                if t.copiers.lock().unwrap().first() != Some(&loom::thread::current().id()) {
                    probe!(ROOT_SWUNG_BY_HELPER);
                }
            }
            // SAFETY: the table is unreachable from the root now, so no
            // pin that starts later can load it; threads that loaded it
            // earlier are pinned, and it is freed only after they unpin
            // (see `pin`). It drops only the keys it still owns (dead
            // ones); copied keys are the successor's, and every map's `K`
            // is `Send`.
            unsafe { crate::map::pin::retire(table.as_raw().cast_mut()) };
            probe!(TABLE_RETIRED);
        }
    }

    /// Evicts the bucket in `slot` if it is idle, copies a live bucket on
    /// and freezes what is left (this thread owns the slot's migration: it
    /// claimed the chunk), counting a copy it places in `copies`.
    pub(super) fn migrate_slot(
        &self,
        slot: &Slot<K>,
        next: &Table<K>,
        idle: &impl Idle,
        copies: &mut usize,
    ) -> Moved {
        let mut evicted = false;
        let mut waited = 0;
        // The key's hash, computed once while its bucket is live (the key
        // never changes; only its state does).
        let mut hash = None;
        // Only the claimer copies or freezes a filled slot, so this loop
        // ends once the inserts and updates racing it are done: an insert
        // fills or freezes an EMPTY slot once, and publishes a BUSY one
        // within a few instructions; each update that beats a CAS here is
        // one more decision made on the old table, which the copy then
        // carries.
        loop {
            let word = slot.cell.word();
            match Seen::of(word) {
                // Frozen by an insert that moved on to the successor.
                (Seen::Empty, true) => return Moved::Empty,
                (Seen::Empty, false) => {
                    if slot.cell.freeze(word) {
                        return Moved::Empty;
                    }
                }
                (Seen::Busy, _) => {
                    probe!(MIGRATION_WAITED_FOR_INSERT);
                    wait_briefly(&mut waited);
                }
                (Seen::Live(state), false) => {
                    if idle.is_idle(state) {
                        // Evicted before the copy, by the same claim as a
                        // sweep's: then left behind as dead.
                        evicted |= self.claim_if_idle(slot, idle);
                        continue;
                    }
                    // The key's own code runs here, while the bucket is
                    // live and updates still land on it: never while the
                    // slot is COPYING, which other threads wait on.
                    // SAFETY: the word was live: the key is published;
                    // `guard` (the caller's) keeps the table alive.
                    let hash = *hash.get_or_insert_with(|| unsafe { slot.hash_with(&self.hasher) });
                    if slot.cell.start_copy(state) {
                        return if self.copy_won(slot, next, state, hash, copies) {
                            Moved::Copied
                        } else {
                            Moved::Dropped
                        };
                    }
                }
                (Seen::Dead, false) => {
                    if slot.cell.freeze(word) {
                        return if evicted {
                            Moved::Evicted
                        } else {
                            Moved::Dropped
                        };
                    }
                }
                // A slot a vanished thread held BUSY, orphaned by a forked
                // child's repair (`super::after_fork`): it owns no key.
                (Seen::Copied, true) => return Moved::Dropped,
                (Seen::Live(_) | Seen::Copying | Seen::Dead, true) => {
                    debug_assert!(false, "a filled slot frozen by another thread");
                    return Moved::Dropped;
                }
                (Seen::Copied | Seen::Copying, false) => {
                    unreachable!("COPIED and COPYING are frozen")
                }
            }
        }
    }
}

impl<K> Table<K> {
    /// Puts a copy of the COPYING bucket in `from` (state `state`, key hash
    /// `hash`) into the first free slot of its chain in this (not yet
    /// migrating) table; false if there is none, which the sizing of
    /// successors rules out. The caller won the right to copy it
    /// (`Cell::start_copy`), so no other copy exists; and no other bucket
    /// for the key can be here: an insert puts a key here only after
    /// finding it absent or dead in the old table, where this bucket was
    /// live. So the chain's keys need no comparing.
    ///
    /// In a tagged map it reads only the slots with no tag (a tagged one is
    /// filled), and tags the copy before it publishes it (`super::tags`).
    ///
    /// Bounded: one pass over the table, each slot looked at again only
    /// while another thread fills or publishes it.
    ///
    /// # Safety
    /// `from` holds a published key (its word was live), and the caller's
    /// guard keeps both tables alive.
    pub(super) unsafe fn place_copy(&self, from: &Slot<K>, state: u64, hash: u64) -> bool {
        let mut waited = 0;
        let mut chain = Chain::new(self, hash);
        loop {
            // A tagged slot is filled: not ours to take.
            if super::tags::tagged::<K>() && chain.tag() != 0 {
                if !chain.advance() {
                    return false;
                }
                continue;
            }
            let slot = chain.slot();
            match Seen::of(slot.cell.word()) {
                (Seen::Empty, false) => {
                    if slot.cell.claim_empty() {
                        // SAFETY: this thread claimed the slot; `from` is
                        // the caller's contract.
                        unsafe { slot.copy_key(from) };
                        if super::tags::tagged::<K>() {
                            chain.set_tag(hash);
                        }
                        slot.cell.publish(state);
                        return true;
                    }
                    continue;
                }
                (Seen::Empty, true) => return false,
                // A BUSY slot may hold any key, and its insert publishes it
                // within a few steps: wait for it.
                (Seen::Busy, _) => {
                    probe!(COPY_WAITED_FOR_BUSY_SLOT);
                    wait_briefly(&mut waited);
                    continue;
                }
                _ => {}
            }
            if !chain.advance() {
                return false;
            }
        }
    }
}
