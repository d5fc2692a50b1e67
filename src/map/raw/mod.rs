//! The unsafe core of the keyed map: an open-addressed table whose slots
//! hold each bucket's cell and key inline, grown (and shrunk) by
//! cooperative, incremental migration; retired tables are freed once no
//! pin can hold them (`super::pin`).
//!
//! # Why this design
//!
//! At a million keys every lookup misses the cache, so what a check costs
//! is the number of cache lines it must wait for. Here a hit waits for one:
//! the slot holds the key beside its cell, so the probe that finds the key
//! has the bucket's state in hand, and the update is a CAS on the same
//! line. Probes past foreign keys compare keys in place; keys that own
//! heap memory (a `String`, whose comparison with a foreign key of the
//! same length reads another line) keep a four-bit tag a slot beside the
//! table ([`tags`]), so a probe skips most foreign keys unread. Figures,
//! beside governor's DashMap and the one-probe floor, are in
//! `BENCHMARKS.md`.
//!
//! A cell must never be copied while it can still be updated, or an update
//! made on the old copy is lost. So the migration's chunk that holds a
//! live cell's slot takes it to COPYING before it copies it: one CAS from
//! the state it read, which fails if an update landed since (the chunk
//! reads the state again), and after which every update, claim or insert
//! CAS on the word fails (see `crate::cell`). The CAS decides the one
//! copier before anything is published, so there is never a second copy
//! and a key never has two owners; a check that meets its key COPYING
//! waits for the copy (a few steps with no code of the key's: the key was
//! hashed before) and retries in the successor. Empty and dead slots are
//! frozen instead (a FROZEN bit), so that no insert fills them behind the
//! migration. This is Cliff Click's non-blocking hash table protocol, with
//! the COPYING word in the role of his boxed "prime" value, except that
//! only the chunk's thread copies: a reader that helped would need a
//! frozen state to copy from, and that state's CAS is one more locked
//! instruction for every bucket copied (`BENCHMARKS.md`).
//!
//! # Rooms
//!
//! - [`slot`]: a slot (a [`Cell`](crate::cell::Cell) and an inline key)
//!   and the unsafe access to its key: who owns a key, and when it is
//!   dropped.
//! - [`lifecycle`]: the transitions of a slot's life, EMPTY to COPIED or
//!   dead (the word's values are in `crate::cell`).
//! - [`table`]: one table: its slots, its counters, and how big a table is
//!   made for a number of keys.
//! - [`chain`]: a key's probe chain, the one walk that lookups, inserts
//!   and copies take through a table.
//! - [`tags`]: a nibble a slot for keys that are dear to compare, and why
//!   a lookup may stop at a slot without one.
//! - [`migrate`]: growing, shrinking and compacting, by cooperative copy.
//! - [`evict`]: idle keys swept, and a bucket evicted for a new key at the
//!   bound.
//! - [`prefetch`]: cache hints for batches and the eviction window.
//! - [`huge_pages`]: large tables advised to the kernel for 2 MiB pages.
//! - `after_fork`: a forked child's repair of what the parent's other
//!   threads left half done.
//!
//! # Orderings
//!
//! One rule for every room, so each access need not repeat it:
//! - **Pointers** (`root`, `next`) are published with a `Release` (or
//!   `AcqRel`) CAS and read with `Acquire`, because every reader
//!   dereferences what it loads.
//! - **Slot words** publish keys; their protocol is in `crate::cell` and
//!   [`lifecycle`].
//! - **Counters** (`claimed`, `sweep`, `len`) are `Relaxed`: they steer
//!   heuristics (where to sweep, whether there is room for a key) or are
//!   owned by the one `fetch_add` that returned them (a `claimed` chunk),
//!   whatever the ordering. The exception is a reservation in `len`:
//!   `Release` when it succeeds and `Acquire` when it fails, for the wait
//!   on inserts in flight (`super::inflight`).
//! - **`occupied`** is `Relaxed` too, except the pair that sizes a
//!   successor: a slot reservation is `Release` and the close is `Acquire`
//!   (see "Sizing a successor").
//! - **`migrated`** is `AcqRel`: the thread that brings it to the capacity
//!   retires the table, so it must see every other chunk's copies first.

#[cfg(not(turnstile_loom))]
mod after_fork;
mod chain;
mod evict;
#[cfg(not(turnstile_loom))]
mod huge_pages;
mod lifecycle;
mod migrate;
mod prefetch;
mod slot;
mod table;
mod tags;

use std::borrow::Borrow;
use std::hash::Hash;

use crossbeam_epoch::Atomic;
use crossbeam_utils::CachePadded;

use super::inflight::InFlight;
use super::pin::Guard;
use crate::cell::{Cell, Gone, Seen};
use crate::sync::{wait_briefly, AtomicUsize, Ordering};
use chain::Chain;
use table::{largest_capacity, Table, MIN_CAPACITY};

pub(crate) use evict::{Evicted, Idle};

/// What this process's fork repairs did (see `__private::fork_repairs`).
#[cfg(not(turnstile_loom))]
pub(crate) fn fork_repairs() -> [u64; 4] {
    after_fork::REPAIRS
        .each_ref()
        .map(|n| n.load(std::sync::atomic::Ordering::Relaxed))
}
pub(crate) use migrate::MIGRATION_CHUNK;
pub(crate) use slot::Slot;

/// The map's shared state. Its methods are sound only while the calling
/// thread is pinned, and each takes the pin's [`Guard`] to say so: only
/// `super::pin::pin` makes one, so no call can lack it.
pub(crate) struct RawMap<K> {
    root: Atomic<Table<K>>,
    /// Live (not dead) buckets in all tables. Padded: inserts write it,
    /// every lookup reads `root`.
    len: CachePadded<AtomicUsize>,
    /// The capacity past which no table grows: the size for `max_keys`
    /// (see [`largest_capacity`]).
    largest: usize,
    /// The most live keys the caller reserves room for (`try_reserve`):
    /// from two on, an overflow eviction always has two buckets to
    /// compare, or waits until it has (see `evict_one_near`).
    max_keys: usize,
    /// Hashes keys; a migration rehashes each key it copies.
    hasher: ahash::RandomState,
    /// Inserts announced and not yet finished (see `super::inflight`).
    pub(crate) inflight: InFlight,
    /// Which fork's process the tables belong to (see `after_fork`).
    #[cfg(not(turnstile_loom))]
    fork_note: after_fork::ForkNote,
    /// Slots a thread claims and copies at a time in a migration:
    /// [`MIGRATION_CHUNK`] but in tests that run the map's races at other
    /// sizes (`__private::MigrationChunk`).
    pub(crate) chunk: usize,
}

impl<K> RawMap<K> {
    /// An empty map for at most `max_keys` live keys (more are never
    /// lost, but its tables are sized for that many).
    pub(crate) fn new(hasher: ahash::RandomState, max_keys: usize) -> Self {
        RawMap {
            largest: largest_capacity(max_keys),
            max_keys,
            root: Atomic::new(Table::new(MIN_CAPACITY, 0)),
            len: CachePadded::new(AtomicUsize::new(0)),
            hasher,
            inflight: InFlight::new(),
            #[cfg(not(turnstile_loom))]
            fork_note: after_fork::ForkNote::new(),
            chunk: MIGRATION_CHUNK,
        }
    }

    #[inline]
    pub(crate) fn hash<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.hasher.hash_one(key)
    }

    /// Buckets not dead (see [`Map::held`](super::Map::held)).
    pub(crate) fn held(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Reserves room for one more live key if fewer than `max` are live.
    ///
    /// Release on success, Acquire on failure: a check that finds no room
    /// sees the insert announcements made before the reservations that
    /// filled it (see `super::inflight`).
    pub(crate) fn try_reserve(&self, max: usize) -> bool {
        self.len
            .fetch_update(Ordering::Release, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok()
    }

    /// Gives back a reservation that was not used.
    pub(crate) fn unreserve(&self) {
        self.len.fetch_sub(1, Ordering::Relaxed);
    }

    /// Slots in the current root table (for tests and memory accounting).
    pub(crate) fn capacity(&self, guard: &Guard) -> usize {
        // SAFETY: the root is never null and is retired only through the
        // pin, which waits for `guard`'s.
        unsafe { self.root.load(Ordering::Acquire, guard).deref() }.capacity()
    }

    /// Asserts that the root's `occupied` counts exactly its filled slots,
    /// as it must once no operation is in flight and no migration under
    /// way: every reservation, the ones held for copies included, was
    /// either used or given back.
    #[cfg(turnstile_loom)]
    pub(crate) fn assert_quiescent_accounting(&self, guard: &Guard) {
        // SAFETY: as in `capacity`.
        let t = unsafe { self.root.load(Ordering::Acquire, guard).deref() };
        assert!(
            t.next.load(Ordering::Acquire, guard).is_null(),
            "a migration is under way"
        );
        let filled = t.filled();
        assert_eq!(t.occupied(), filled, "occupied against filled slots");
    }
}

impl<K: Hash + Eq> RawMap<K> {
    /// The live bucket for `key`, if any. One met on its way to the
    /// successor (COPYING) is waited for, and found there. In a tagged map
    /// the walk reads only the slots tagged with the key's fingerprint, and
    /// ends at the first slot with no tag (`tags`).
    #[inline]
    pub(crate) fn find<'g, Q>(&self, hash: u64, key: &Q, guard: &'g Guard) -> Option<&'g Slot<K>>
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        let mut table = self.root.load(Ordering::Acquire, guard);
        // Read only in a tagged map (`tags`), once for the whole walk.
        let fingerprint = tags::fingerprint(hash);
        loop {
            // SAFETY: tables are reached from the root or a `next` pointer
            // and retired only through the pin, which waits for `guard`'s.
            let t = unsafe { table.deref() };
            let mut chain = Chain::new(t, hash);
            loop {
                if tags::tagged::<K>() {
                    match chain.tag() {
                        // EMPTY, or claimed and not yet tagged: no key of
                        // this chain lies past it (see `tags`).
                        0 => {
                            // Relaxed: the probe's read must add no
                            // synchronisation the models would rely on.
                            #[cfg(turnstile_loom)]
                            if chain.slot().cell.word.load(Ordering::Relaxed) == crate::cell::BUSY {
                                probe!(LOOKUP_STOPPED_AT_A_CLAIM);
                            }
                            break;
                        }
                        tag if tag != fingerprint => {
                            probe!(LOOKUP_SKIPPED_BY_TAG);
                            if !chain.advance() {
                                break;
                            }
                            continue;
                        }
                        _ => {}
                    }
                }
                let slot = chain.slot();
                match Seen::of(slot.cell.word()) {
                    (Seen::Empty, _) => break,
                    // SAFETY: a live or copying word has a published key,
                    // read through `word`; `guard` keeps the table alive.
                    (Seen::Live(_) | Seen::Copying, frozen) if unsafe { slot.key_is(key) } => {
                        if !frozen {
                            return Some(slot);
                        }
                        // COPYING (a live word is never frozen): on its way
                        // to the successor. Wait until it is there, then
                        // look at this slot again (COPIED now).
                        Self::wait_for_copy(slot);
                        continue;
                    }
                    // BUSY: not published, so not there yet. COPIED: in the
                    // successor. Dead: absent (a live one may follow).
                    _ => {}
                }
                if !chain.advance() {
                    break;
                }
            }
            // Not in this table: a key inserted or copied during a
            // migration is in the successor.
            table = t.next.load(Ordering::Acquire, guard);
            if table.is_null() {
                return None;
            }
        }
    }

    /// The live bucket for `key`, inserting a fresh one holding `state()`
    /// if there is none. Returns the bucket and whether it was inserted by
    /// this call.
    ///
    /// `make` builds the key (once) before any slot is claimed, and `state`
    /// is called right before each attempt to publish, after the probe that
    /// found the key absent: so a state that depends on a clock reading is
    /// decided after any eviction of the key's previous bucket (see
    /// "Clocks and eviction" in `crate::keyed`).
    ///
    /// The caller holds a reservation in `len` for the key (`try_reserve`,
    /// or an overflow eviction's), taken before this call: migrations size
    /// their successor by it.
    pub(crate) fn insert<'g, Q>(
        &self,
        hash: u64,
        key: &Q,
        make: impl FnOnce() -> K,
        mut state: impl FnMut() -> u64,
        idle: &impl Idle,
        guard: &'g Guard,
    ) -> (&'g Slot<K>, bool)
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        let mut make = Some(make);
        let mut owned: Option<K> = None;
        let mut table = self.root.load(Ordering::Acquire, guard);
        // Read only in a tagged map (`tags`), once for the whole walk.
        let fingerprint = tags::fingerprint(hash);
        'tables: loop {
            // SAFETY: as in `find`.
            let t = unsafe { table.deref() };
            let mut waited = 0;
            // Bounded: each slot of the chain is passed once, and looked at
            // again only after another thread changed it (filled, froze or
            // published it: each slot changes at most that many times), or
            // while a BUSY slot's claimer publishes it (a few instructions).
            let mut chain = Chain::new(t, hash);
            loop {
                if tags::tagged::<K>() {
                    let tag = chain.tag();
                    // Another key's slot: filled, and not ours. (A slot
                    // with no tag is read: EMPTY, or BUSY and maybe ours.)
                    if tag != 0 && tag != fingerprint {
                        if !chain.advance() {
                            break;
                        }
                        continue;
                    }
                }
                let slot = chain.slot();
                match Seen::of(slot.cell.word()) {
                    (Seen::Empty, true) => {
                        table = self.successor(table, idle, guard);
                        continue 'tables;
                    }
                    (Seen::Empty, false) => {
                        // The key's own code runs before any reservation of
                        // this table's, so a panic in it leaves none held.
                        if owned.is_none() {
                            owned = make.take().map(|make| make());
                        }
                        if !t.next.load(Ordering::Acquire, guard).is_null() || !t.reserve_slot() {
                            // Going on to the successor: first make sure no
                            // one fills this slot with our key behind our
                            // back (a thread that reserved room here a moment
                            // ago). Freeze it; if that fails, someone filled
                            // it: look at it again.
                            let next = self.successor(table, idle, guard);
                            if slot.cell.freeze_empty() {
                                probe!(INSERT_FROZE_EMPTY_SLOT);
                                table = next;
                                continue 'tables;
                            }
                            continue;
                        }
                        let fresh = state();
                        if slot.cell.claim_empty() {
                            let key = owned
                                .take()
                                .expect("a key is made before its slot is claimed");
                            // SAFETY: this thread claimed the slot just now.
                            unsafe { slot.write_key(key) };
                            // Tagged before it is published (`tags`).
                            if tags::tagged::<K>() {
                                chain.set_tag(hash);
                            }
                            slot.cell.publish(fresh);
                            return (slot, true);
                        }
                        // Someone filled or froze the slot first: give the
                        // reservation back and look at the slot again.
                        t.release_slot();
                        probe!(INSERT_LOST_SLOT);
                        continue;
                    }
                    // It may be our key: wait for it to be published.
                    (Seen::Busy, _) => {
                        probe!(INSERT_WAITED_FOR_BUSY_SLOT);
                        wait_briefly(&mut waited);
                        continue;
                    }
                    // SAFETY: as in `find`.
                    (Seen::Live(_) | Seen::Copying, frozen) if unsafe { slot.key_is(key) } => {
                        if !frozen {
                            return (slot, false);
                        }
                        // COPYING: on its way to the successor, where it is
                        // found. Wait until it is there, then look at this
                        // slot again.
                        Self::wait_for_copy(slot);
                        continue;
                    }
                    _ => {}
                }
                if !chain.advance() {
                    break;
                }
            }
            table = self.successor(table, idle, guard);
        }
    }

    /// Tombstones the live bucket for `key`, whatever its state, and counts
    /// it out of `len`; its slot is reclaimed by the next migration, as an
    /// evicted one is. Returns false if no live bucket held `key`, or
    /// another evictor claimed it first (the key was absent from that
    /// instant on).
    pub(crate) fn remove<Q>(&self, hash: u64, key: &Q, guard: &Guard) -> bool
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        let claimed = self.on_bucket(hash, key, guard, |cell| cell.claim(|_| true));
        if claimed == Some(true) {
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
        claimed == Some(true)
    }

    /// Runs `op` on `key`'s live bucket, and again on the bucket found by
    /// a new lookup whenever `op` met it frozen (moved to a successor
    /// table since it was found); `None` if the key is absent, or its
    /// bucket died (evicted or reset) under `op`, which makes it absent
    /// from then on. The one place the "frozen: look again" retry lives,
    /// for every operation on an existing bucket but the check, whose
    /// absent key is inserted instead (`KeyedLimiter::decide_found`).
    pub(crate) fn on_bucket<Q, T>(
        &self,
        hash: u64,
        key: &Q,
        guard: &Guard,
        mut op: impl FnMut(&Cell) -> Result<T, Gone>,
    ) -> Option<T>
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        loop {
            match op(&self.find(hash, key, guard)?.cell) {
                Ok(done) => return Some(done),
                Err(Gone::Dead) => return None,
                Err(Gone::Moved) => {}
            }
        }
    }
}

impl<K> Drop for RawMap<K> {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no other thread can reach this map, so nothing
        // needs protecting. Each table is freed once, and drops only the
        // keys it owns (see `Table`'s `Drop`): a key copied from the root
        // into its successor is dropped with the successor.
        unsafe {
            let guard = crossbeam_epoch::unprotected();
            let mut table = self.root.load(Ordering::Relaxed, guard);
            while !table.is_null() {
                let next = table.deref().next.load(Ordering::Relaxed, guard);
                drop(table.into_owned());
                table = next;
            }
        }
    }
}
