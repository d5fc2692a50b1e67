//! The unsafe core of the keyed map: an open-addressed table of pointers to
//! nodes that never move, grown (and shrunk) by cooperative, incremental
//! migration, on `crossbeam-epoch`.
//!
//! # Why this design
//!
//! A bucket's cell must never be copied, or an update made on the old copy
//! is lost. So cells live in heap nodes that never move, and a table holds
//! only pointers: growth copies pointers, and an update that found the node
//! through the old table lands on the same cell as everyone else's.
//! Split-ordered lists would also keep nodes in place, but every lookup
//! would chase a bucket sentinel and then list nodes; a linear-probing table
//! of pointers finds a key in one slot load and one node load in the common
//! case (load factor at most 1/2).
//!
//! Measured (`BENCHMARKS.md`, one run): with 1,000 keys a check costs
//! 52 ns against 50 ns for governor's DashMap with the same hasher, and
//! 115 ns against 157 ns on two threads, where DashMap's shard locks
//! contend and this map takes none. With 1,000,000 keys every lookup
//! misses the cache, and the pointer indirection shows: 422 ns against
//! 263 ns, because a hit loads a slot and then a node, and each probe that
//! is not the key loads a node too (the hash lives in the node). Keeping a
//! few hash bits beside each pointer, or the entries of small keys inline,
//! is the known next step.
//!
//! # Slots
//!
//! A slot is an `Atomic<Node>`; its tag says where the slot is in its life,
//! and a slot only moves forward through it:
//!
//! ```text
//! null, LIVE    EMPTY         ──insert──▶ node, LIVE
//!                             ──migrate─▶ null, FROZEN   (never filled again; an
//!                                                         insert that moves on to
//!                                                         the successor freezes it too)
//! node, LIVE    in use        ──migrate─▶ node, FROZEN ──▶ node, COPIED  (now also in `next`)
//!                                                     └──▶ node, DROPPED (unlinked; freed by the epoch)
//! ```
//!
//! Invariant (probe chains): a slot never becomes EMPTY again, and inserts
//! only fill the first EMPTY slot of a key's probe sequence. So if a probe
//! from a key's home reaches a null slot without meeting the key, the key is
//! not in this table.
//!
//! # Nodes die once
//!
//! A node whose cell holds [`TOMBSTONE`] is dead: no update lands on it
//! again (the cell refuses), lookups pass over it, and an insert of its key
//! makes a new node further along the chain. Dead nodes stay in their slot
//! until the next migration, which does not copy them and hands them to the
//! epoch (`defer_destroy`) instead. That is the only place a node is freed
//! while the map is shared, so nothing is freed twice and no live table
//! points at freed memory.
//!
//! # Migration
//!
//! When a table is half full (or a quarter of it is dead, or it is four times
//! larger than its live keys need), a successor sized
//! for the live keys is installed in `next`. From then on new keys go to the
//! successor, and callers copy the old table a chunk at a time: each chunk
//! is claimed by one thread (a `fetch_add` on a cursor), and for each slot
//! the claimer freezes it, decides (dead or idle: drop; otherwise copy the
//! pointer), and marks it. Readers are never blocked: a frozen or copied
//! slot still points at the node, whose cell is the one true state. The
//! thread that finishes the last chunk swings the root to the successor and
//! retires the old table through the epoch. A successor migrates only after
//! it has become the root, so there are at most two tables at a time.
//!
//! # Sizing a successor
//!
//! A migration must never have more live nodes to place than its successor
//! has slots (it would probe forever), so the successor is sized from a
//! count that bounds them. Starting a migration first *closes* the table
//! (a bit in `occupied`), then reads `len`, then allocates and installs.
//! Every insert reserves its key in `len` (or takes over an evicted key's
//! place there) *before* it reserves a slot in `occupied`, and a closed
//! table refuses reservations. So an insert that can still land in the old
//! table reserved its slot before the close, and the close (Acquire)
//! synchronises with that reservation (Release): the `len` read after the
//! close counts it. Nodes that die meanwhile are not copied. Hence the
//! nodes copied are at most `len` as read, the successor gets three slots
//! per such key, and direct inserts into it stop at half full: it is never
//! more than `5/6` full. Any thread that finds a table closed but without a
//! successor computes one the same way and races to install it, so a
//! starter that is descheduled between the close and the install blocks no
//! one.
//!
//! # Orderings
//!
//! One rule for the whole file, so each access need not repeat it:
//! - **Pointers** (`root`, `next`, slots) are published with a `Release`
//!   (or `AcqRel`) CAS or store and read with `Acquire`, because every
//!   reader dereferences what it loads: the node's or table's fields must
//!   be visible before its address is.
//! - **Counters** (`claimed`, `sweep`, `len`) are `Relaxed`: they steer
//!   heuristics (where to sweep, whether there is room for a key) or are
//!   owned by the one `fetch_add` that returned them (a `claimed` chunk),
//!   whatever the ordering.
//! - **`occupied`** is `Relaxed` too, except the pair that sizes a
//!   successor: a slot reservation is `Release` and the close is `Acquire`
//!   (see "Sizing a successor").
//! - **`migrated`** is `AcqRel`: the thread that brings it to the capacity
//!   retires the table, so it must see every other chunk's copies first.
//! - **Cells** have their own argument, in `crate::cell`.

use std::borrow::Borrow;
use std::hash::Hash;

use crossbeam_epoch::{Atomic, Guard, Owned, Shared};
use crossbeam_utils::CachePadded;

use crate::algorithm::TOMBSTONE;
use crate::cell::Cell;
use crate::sync::{AtomicUsize, Ordering};

/// Slot tags (see the module docs).
const LIVE: usize = 0;
const FROZEN: usize = 1;
const COPIED: usize = 2;
const DROPPED: usize = 3;

/// The smallest table. Small in loom models so that growth happens after a
/// couple of inserts.
#[cfg(not(turnstile_loom))]
pub(crate) const MIN_CAPACITY: usize = 16;
#[cfg(turnstile_loom)]
pub(crate) const MIN_CAPACITY: usize = 2;

/// Slots a caller copies per migration step: small enough to keep one
/// insert's extra latency to a few microseconds, large enough that a table
/// of a million slots is copied after ~16k steps. One under loom, so that
/// the models' small tables have several chunks to hand out and race over.
pub const MIGRATION_CHUNK: usize = if cfg!(turnstile_loom) { 1 } else { 64 };

/// The bit of `occupied` that closes a table to inserts (see `close`).
const CLOSED: usize = 1 << (usize::BITS - 1);

/// One key's bucket. Never moves while the map is shared.
#[derive(Debug)]
pub(crate) struct Node<K> {
    pub(crate) hash: u64,
    pub(crate) cell: Cell,
    pub(crate) key: K,
}

// Slot tags need two low bits of every node pointer.
const _: () = assert!(std::mem::align_of::<Node<u8>>() >= 4);

struct Table<K> {
    // Read by every lookup.
    slots: Box<[Atomic<Node<K>>]>,
    mask: usize,
    /// The successor while this table is being migrated.
    next: Atomic<Table<K>>,
    // Written by inserts, migrations and sweeps: on a line of their own, so
    // those writes do not evict the fields above from every reader's cache.
    counters: CachePadded<TableCounters>,
    /// Which threads copied chunks of this table (loom probes only).
    #[cfg(turnstile_loom)]
    copiers: std::sync::Mutex<Vec<loom::thread::ThreadId>>,
}

struct TableCounters {
    /// Slots ever filled (live, dead or copied in) or reserved by an insert
    /// about to fill one, and the [`CLOSED`] bit. Only a failed reservation
    /// takes one back.
    occupied: AtomicUsize,
    /// Migration cursor: slots `[0, claimed)` have been handed out.
    claimed: AtomicUsize,
    /// Slots whose migration is finished.
    migrated: AtomicUsize,
    /// Eviction sweep cursor (wraps).
    sweep: AtomicUsize,
}

impl<K> Table<K> {
    fn new(capacity: usize) -> Self {
        debug_assert!(capacity.is_power_of_two());
        Table {
            slots: (0..capacity).map(|_| Atomic::null()).collect(),
            mask: capacity - 1,
            next: Atomic::null(),
            counters: CachePadded::new(TableCounters {
                occupied: AtomicUsize::new(0),
                claimed: AtomicUsize::new(0),
                migrated: AtomicUsize::new(0),
                sweep: AtomicUsize::new(0),
            }),
            #[cfg(turnstile_loom)]
            copiers: std::sync::Mutex::new(Vec::new()),
        }
    }

    fn capacity(&self) -> usize {
        self.mask + 1
    }

    /// Slots filled or reserved.
    fn occupied(&self) -> usize {
        self.counters.occupied.load(Ordering::Relaxed) & !CLOSED
    }

    /// Reserves a slot for an insert, unless the table is closed or half
    /// full (direct inserts stop there: probe chains stay short). A
    /// reservation is held while the insert's slot CAS runs.
    ///
    /// Release: pairs with `close`'s Acquire. An insert reserves its key in
    /// the map's `len` first (program order), so a migration that closes
    /// this table and then counts `len` counts every insert that can still
    /// land here (see "Sizing a successor" in the module docs).
    fn reserve_slot(&self) -> bool {
        let before = self.counters.occupied.fetch_add(1, Ordering::Release);
        if before & CLOSED != 0 || before >= self.capacity() / 2 {
            #[cfg(turnstile_loom)]
            if before & CLOSED != 0 {
                crate::probe::hit(&crate::probe::CLOSED_TABLE_REFUSED_INSERT);
            }
            self.release_slot();
            return false;
        }
        true
    }

    /// Gives back a reservation that did not fill a slot.
    fn release_slot(&self) {
        self.counters.occupied.fetch_sub(1, Ordering::Relaxed);
    }

    /// Closes the table to inserts: every `reserve_slot` after this fails.
    /// Returns whether this call closed it. Acquire: see `reserve_slot`.
    fn close(&self) -> bool {
        self.counters.occupied.fetch_or(CLOSED, Ordering::Acquire) & CLOSED == 0
    }
}

/// The capacity for a table that will hold `live` keys: at most a third
/// full right after the migration, so it takes many inserts to fill again,
/// and never more than `5/6` full counting the inserts made during the
/// migration (those stop at half full).
fn capacity_for(live: usize) -> usize {
    live.saturating_mul(3)
        .max(MIN_CAPACITY)
        .checked_next_power_of_two()
        .unwrap_or(1 << (usize::BITS - 2))
}

/// What a caller wants done with idle cells met during a migration or a sweep.
pub(crate) trait Idle {
    /// Whether `state` may be forgotten without changing any decision.
    fn is_idle(&self, state: u64) -> bool;
}

impl<F: Fn(u64) -> bool> Idle for F {
    fn is_idle(&self, state: u64) -> bool {
        self(state)
    }
}

/// What migrating one slot did.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Moved {
    /// The slot was empty.
    Empty,
    /// A live node, now in the successor.
    Copied,
    /// An idle node, evicted and handed to the epoch.
    Evicted,
    /// A dead node, handed to the epoch.
    Dropped,
}

/// The map's shared state. All methods take a `Guard` pinned on `collector`
/// (the safe front, `super::Map`, makes sure of that).
pub(crate) struct RawMap<K> {
    root: Atomic<Table<K>>,
    /// Live (not dead) nodes in all tables. Padded: inserts write it, every
    /// lookup reads `root`.
    len: CachePadded<AtomicUsize>,
}

impl<K> RawMap<K> {
    pub(crate) fn new() -> Self {
        RawMap {
            root: Atomic::new(Table::new(MIN_CAPACITY)),
            len: CachePadded::new(AtomicUsize::new(0)),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Reserves room for one more live key if fewer than `max` are live.
    pub(crate) fn try_reserve(&self, max: usize) -> bool {
        self.len
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
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
        // epoch, which `guard` holds off.
        unsafe { self.root.load(Ordering::Acquire, guard).deref() }.capacity()
    }
}

impl<K> RawMap<K> {
    /// Starts fetching the home slot of `hash` in the root table into the
    /// cache: where `find` reads first. A hint only: nothing is read or
    /// written that a lookup can observe.
    #[inline]
    pub(crate) fn prefetch_slot(&self, hash: u64, guard: &Guard) {
        // SAFETY: as in `capacity`: the root is never null and is retired
        // only through the epoch, which `guard` holds off.
        let t = unsafe { self.root.load(Ordering::Acquire, guard).deref() };
        prefetch(std::ptr::from_ref(&t.slots[hash as usize & t.mask]).cast());
    }

    /// Starts fetching the node the home slot of `hash` points at now (the
    /// node `find` loads second, and usually the key's). A hint only.
    #[inline]
    pub(crate) fn prefetch_node(&self, hash: u64, guard: &Guard) {
        // SAFETY: as in `capacity`.
        let t = unsafe { self.root.load(Ordering::Acquire, guard).deref() };
        // Relaxed, an exception to the file's rule for pointers: this one
        // is never dereferenced, only handed to the CPU as an address to
        // fetch, which is harmless even if the node has been freed since.
        let slot = t.slots[hash as usize & t.mask].load(Ordering::Relaxed, guard);
        if !slot.is_null() {
            prefetch(slot.as_raw().cast());
        }
    }
}

/// Asks the CPU to bring the cache line holding `addr` into L1, where the
/// target has an instruction for it (x86_64, aarch64); nothing elsewhere.
#[inline(always)]
fn prefetch(addr: *const u8) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch is a hint: it never faults (any address, even
        // a dangling or unmapped one, is allowed), writes nothing and has
        // no effect a program can observe but timing. SSE, which provides
        // it, is part of the x86_64 baseline.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(addr.cast()) };
    }
    #[cfg(target_arch = "aarch64")]
    {
        // SAFETY: `prfm` is a hint: it never faults on any address, writes
        // nothing, touches no flags and no stack (the options say so).
        unsafe {
            core::arch::asm!(
                "prfm pldl1keep, [{addr}]",
                addr = in(reg) addr,
                options(nostack, readonly, preserves_flags)
            )
        };
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = addr;
}

impl<K: Hash + Eq> RawMap<K> {
    /// The live node for `key`, if any.
    pub(crate) fn find<'g, Q>(&self, hash: u64, key: &Q, guard: &'g Guard) -> Option<&'g Node<K>>
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        let mut table = self.root.load(Ordering::Acquire, guard);
        loop {
            // SAFETY: tables are reached from the root or a `next` pointer
            // and retired only through the epoch, which `guard` holds off.
            let t = unsafe { table.deref() };
            let mut index = hash as usize & t.mask;
            for _ in 0..t.capacity() {
                let slot = t.slots[index].load(Ordering::Acquire, guard);
                if slot.is_null() {
                    break;
                }
                if let Some(node) = Self::live_match(slot, hash, key) {
                    return Some(node);
                }
                index = (index + 1) & t.mask;
            }
            // Not in this table: a key inserted during a migration may be in
            // the successor.
            table = t.next.load(Ordering::Acquire, guard);
            if table.is_null() {
                return None;
            }
        }
    }

    /// The node behind `slot` if it holds `key` and is alive.
    #[inline]
    fn live_match<'g, Q>(slot: Shared<'g, Node<K>>, hash: u64, key: &Q) -> Option<&'g Node<K>>
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        if slot.tag() == DROPPED {
            return None;
        }
        // SAFETY: a non-null slot that is not DROPPED points at a node that
        // has not been handed to the epoch yet (only the DROPPED transition
        // does that), and `guard` (the lifetime 'g) holds off its reclamation.
        let node = unsafe { slot.deref() };
        let found = node.hash == hash && node.key.borrow() == key && node.cell.load() != TOMBSTONE;
        #[cfg(turnstile_loom)]
        if found && slot.tag() != LIVE {
            crate::probe::hit(&crate::probe::READ_FROM_MIGRATING_TABLE);
        }
        found.then_some(node)
    }

    /// The live node for `key`, inserting `make()` if there is none, with
    /// the state `state()` returns. Returns the node and whether it was
    /// inserted by this call.
    ///
    /// `state` is called right before each attempt to publish the node,
    /// after the probe that found the key absent: so a state that depends
    /// on a clock reading is decided after any eviction of the key's
    /// previous node (see "Clocks and eviction" in `crate::keyed`).
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
    ) -> (&'g Node<K>, bool)
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        let mut make = Some(make);
        let mut fresh: Option<Owned<Node<K>>> = None;
        let mut table = self.root.load(Ordering::Acquire, guard);
        'tables: loop {
            // SAFETY: as in `find`.
            let t = unsafe { table.deref() };
            let mut index = hash as usize & t.mask;
            let mut probed = 0;
            // Bounded: each pass of the loop either moves to the next slot
            // (at most `capacity` times) or follows a slot that another
            // thread changed (filled or froze: each slot changes at most
            // twice).
            while probed < t.capacity() {
                let slot = t.slots[index].load(Ordering::Acquire, guard);
                if !slot.is_null() {
                    if let Some(node) = Self::live_match(slot, hash, key) {
                        return (node, false);
                    }
                    index = (index + 1) & t.mask;
                    probed += 1;
                    continue;
                }
                // The key is not in this table. Insert here only if this
                // table is not being migrated and has room.
                if slot.tag() != LIVE {
                    table = self.successor(table, idle, guard);
                    continue 'tables;
                }
                if !t.next.load(Ordering::Acquire, guard).is_null() || !t.reserve_slot() {
                    // Going on to the successor: first make sure no one
                    // fills this slot with our key behind our back (a thread
                    // that reserved room here a moment ago). Freeze it; if
                    // that fails, someone filled it: look at it again.
                    let next = self.successor(table, idle, guard);
                    if t.slots[index]
                        .compare_exchange(
                            slot,
                            slot.with_tag(FROZEN),
                            Ordering::AcqRel,
                            Ordering::Acquire,
                            guard,
                        )
                        .is_ok()
                    {
                        #[cfg(turnstile_loom)]
                        crate::probe::hit(&crate::probe::INSERT_FROZE_EMPTY_SLOT);
                        table = next;
                        continue 'tables;
                    }
                    continue;
                }
                let mut node = fresh.take().unwrap_or_else(|| {
                    let key = make.take().map(|make| make());
                    Owned::new(Node {
                        hash,
                        cell: Cell::new(0),
                        key: key.expect("a fresh node is made at most once"),
                    })
                });
                // Not shared yet: this thread owns the node until the CAS.
                node.cell = Cell::new(state());
                // Release: publishes the node's fields to whoever loads the
                // slot with Acquire. Acquire on failure: we may deref what won.
                match t.slots[index].compare_exchange(
                    Shared::null(),
                    node,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                    guard,
                ) {
                    Ok(inserted) => {
                        // SAFETY: we just published it; it is freed only
                        // after a migration drops it, which `guard` outlives.
                        return (unsafe { inserted.deref() }, true);
                    }
                    // Someone filled or froze the slot first: give the
                    // reservation back and look at the slot again.
                    Err(lost) => {
                        t.release_slot();
                        fresh = Some(lost.new);
                        #[cfg(turnstile_loom)]
                        crate::probe::hit(&crate::probe::INSERT_LOST_SLOT);
                    }
                }
            }
            table = self.successor(table, idle, guard);
        }
    }

    /// The table to go on to from `table`, where a key is absent and cannot
    /// be inserted: its successor, created if needed. Helps the migration
    /// along, so that inserting can never outrun copying.
    fn successor<'g>(
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
                    #[cfg(turnstile_loom)]
                    crate::probe::hit(&crate::probe::WAITED_FOR_CLAIMED_CHUNKS);
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
    fn start_migration<'g>(
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
        let next = Owned::new(Table::new(capacity_for(live)));
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
                #[cfg(turnstile_loom)]
                if !closed_here {
                    crate::probe::hit(&crate::probe::SUCCESSOR_INSTALLED_BY_HELPER);
                }
                let _ = closed_here;
                next
            }
            Err(lost) => lost.current,
        }
    }

    /// Starts a migration of the root if a quarter of it is dead weight
    /// (dead nodes) or it is four times larger than the live keys need, so
    /// memory follows the live keys down as well as up.
    pub(crate) fn compact_if_sparse(&self, guard: &Guard) {
        let root = self.root.load(Ordering::Acquire, guard);
        // SAFETY: as in `find`.
        let t = unsafe { root.deref() };
        let live = self.len();
        let dead = t.occupied().saturating_sub(live);
        let oversized = capacity_for(live) <= t.capacity() / 4;
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
                    #[cfg(turnstile_loom)]
                    if copied == 0 {
                        crate::probe::hit(&crate::probe::WAITED_FOR_CLAIMED_CHUNKS);
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
    fn migrate_chunk(
        &self,
        table: Shared<'_, Table<K>>,
        next: Shared<'_, Table<K>>,
        idle: &impl Idle,
        guard: &Guard,
    ) -> Option<usize> {
        // SAFETY: as in `find`.
        let (t, n) = unsafe { (table.deref(), next.deref()) };
        let start = t
            .counters
            .claimed
            .fetch_add(MIGRATION_CHUNK, Ordering::Relaxed);
        if start >= t.capacity() {
            return None;
        }
        let end = (start + MIGRATION_CHUNK).min(t.capacity());
        #[cfg(turnstile_loom)]
        {
            let mut copiers = t.copiers.lock().unwrap();
            let me = loom::thread::current().id();
            if !copiers.contains(&me) {
                copiers.push(me);
                if copiers.len() == 2 {
                    crate::probe::hit(&crate::probe::CHUNKS_COPIED_BY_TWO_THREADS);
                }
            }
        }
        let mut dropped = false;
        let evicted = (start..end)
            .filter(|&index| {
                let outcome = self.migrate_slot(&t.slots[index], n, idle, guard);
                dropped |= outcome != Moved::Copied;
                outcome == Moved::Evicted
            })
            .count();
        // AcqRel: the finisher must see every other chunk's copies before it
        // retires the table.
        let migrated = t.counters.migrated.fetch_add(end - start, Ordering::AcqRel) + (end - start);
        if migrated == t.capacity() {
            // Every slot is frozen and its node copied or dropped: the
            // successor holds every live node. Release: publishes it.
            let swung =
                self.root
                    .compare_exchange(table, next, Ordering::AcqRel, Ordering::Acquire, guard);
            // A successor is only ever installed on the root (see
            // `start_migration`'s callers), so the swing succeeds; were it
            // ever to fail, leaking the table beats freeing a live one.
            debug_assert!(swung.is_ok(), "only the root is ever migrated");
            if swung.is_ok() {
                #[cfg(turnstile_loom)]
                if t.copiers.lock().unwrap().first() != Some(&loom::thread::current().id()) {
                    crate::probe::hit(&crate::probe::ROOT_SWUNG_BY_HELPER);
                }
                // SAFETY: the table is unreachable from the root now;
                // threads that loaded it earlier are pinned, and the epoch
                // frees it only after they unpin. Its nodes are not freed
                // with it (dropping a `Table` drops only its pointers).
                unsafe { guard.defer_destroy(table) };
                dropped = true;
            }
        }
        if dropped {
            // Hand what this chunk retired to the collector now, not when
            // this thread's local bag fills: retired memory must not wait
            // on a housekeeping tick (a frozen clock has none), and a bag
            // left on a thread outlives the map.
            guard.flush();
        }
        Some(evicted)
    }

    /// Freezes one slot and moves its node on (this thread owns the slot's
    /// migration: it claimed the chunk).
    fn migrate_slot(
        &self,
        slot: &Atomic<Node<K>>,
        next: &Table<K>,
        idle: &impl Idle,
        guard: &Guard,
    ) -> Moved {
        // Freeze: after this no insert can fill the slot. Only inserts race
        // with us here (they fill or freeze EMPTY slots, once), so this
        // loop retries at most twice.
        let frozen = loop {
            let current = slot.load(Ordering::Acquire, guard);
            if current.tag() != LIVE {
                // Only an inserter that moved on to the successor freezes a
                // slot ahead of us, and only an empty one.
                debug_assert!(current.is_null() && current.tag() == FROZEN);
                return Moved::Empty;
            }
            match slot.compare_exchange(
                current,
                current.with_tag(FROZEN),
                Ordering::AcqRel,
                Ordering::Acquire,
                guard,
            ) {
                Ok(frozen) => break frozen,
                Err(_) => continue,
            }
        };
        if frozen.is_null() {
            return Moved::Empty;
        }
        // SAFETY: the slot is FROZEN, not DROPPED, so the node has not been
        // handed to the epoch; `guard` holds off reclamation in any case.
        let node = unsafe { frozen.deref() };
        let evicted = self.claim_if_idle(node, idle);
        if !evicted && node.cell.load() != TOMBSTONE {
            if next.place(frozen.with_tag(LIVE), node.hash, guard) {
                slot.store(frozen.with_tag(COPIED), Ordering::Release);
                return Moved::Copied;
            }
            // No room: impossible by the sizing argument, but a lost bucket
            // is a better failure than a hang. Kill it like an eviction.
            debug_assert!(false, "a migration found its successor full");
            if node.cell.try_claim(|_| true) {
                self.len.fetch_sub(1, Ordering::Relaxed);
            }
        }
        // Dead: unlink it from this table (readers skip DROPPED slots and
        // it was never copied), then let the epoch free it.
        slot.store(frozen.with_tag(DROPPED), Ordering::Release);
        // SAFETY: the node is reachable only through this slot, which no
        // longer yields it; threads that loaded it earlier are pinned.
        unsafe { guard.defer_destroy(frozen.with_tag(LIVE)) };
        #[cfg(turnstile_loom)]
        crate::probe::hit(&crate::probe::NODE_DROPPED);
        if evicted {
            Moved::Evicted
        } else {
            Moved::Dropped
        }
    }

    /// Tombstones `node` if its state is idle; counts it out of `len`.
    fn claim_if_idle(&self, node: &Node<K>, idle: &impl Idle) -> bool {
        let claimed = node.cell.try_claim(|state| idle.is_idle(state));
        if claimed {
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
        claimed
    }

    /// Sweeps up to `budget` slots of the root for idle cells and tombstones
    /// them (their slots are reclaimed by the next migration). Returns how
    /// many it evicted.
    pub(crate) fn sweep(&self, budget: usize, idle: &impl Idle, guard: &Guard) -> usize {
        let root = self.root.load(Ordering::Acquire, guard);
        // SAFETY: as in `find`.
        let t = unsafe { root.deref() };
        let start = t.counters.sweep.fetch_add(budget, Ordering::Relaxed);
        let mut evicted = 0;
        for offset in 0..budget.min(t.capacity()) {
            let slot = t.slots[(start + offset) & t.mask].load(Ordering::Acquire, guard);
            if slot.is_null() || slot.tag() == DROPPED {
                continue;
            }
            // SAFETY: as in `live_match`.
            let node = unsafe { slot.deref() };
            if self.claim_if_idle(node, idle) {
                evicted += 1;
            }
        }
        evicted
    }

    /// Tombstones the live node with the smallest state (for GCRA, the
    /// bucket closest to full) among the first `sample` live nodes found
    /// from `hash` on, in the root and, during a migration, its successor
    /// (keys inserted since the migration began are only there). At least
    /// two candidates are compared whenever the map holds two, so a busy
    /// key is never chosen merely for being alone in its neighbourhood.
    ///
    /// On success the evicted key's place in `len` passes to the caller,
    /// who holds it as a reservation: `len` does not change, and no other
    /// thread can take the room this call made. Returns false if nothing
    /// was evicted (no live node found, or the chosen one was updated or
    /// evicted by someone else first).
    pub(crate) fn evict_one_near(&self, hash: u64, sample: usize, guard: &Guard) -> bool {
        let want = sample.max(2);
        let mut best: Option<(&Node<K>, u64)> = None;
        let mut seen = 0;
        let mut table = self.root.load(Ordering::Acquire, guard);
        while !table.is_null() && seen < want {
            // SAFETY: as in `find`.
            let t = unsafe { table.deref() };
            let start = hash as usize;
            for offset in 0..t.capacity() {
                let slot = t.slots[(start + offset) & t.mask].load(Ordering::Acquire, guard);
                if slot.is_null() || slot.tag() == DROPPED {
                    continue;
                }
                // SAFETY: as in `live_match`.
                let node = unsafe { slot.deref() };
                let state = node.cell.load();
                if state == TOMBSTONE {
                    continue;
                }
                seen += 1;
                if best.is_none_or(|(_, s)| state < s) {
                    best = Some((node, state));
                }
                if seen >= want {
                    break;
                }
            }
            table = t.next.load(Ordering::Acquire, guard);
        }
        // Lost to an update or another evictor: the caller samples again.
        best.is_some_and(|(node, state)| node.cell.try_claim(|now| now == state))
    }

    /// Tombstones the live node for `key`, whatever its state, and counts
    /// it out of `len`; its slot is reclaimed by the next migration, as an
    /// evicted one is. Returns false if no live node held `key`, or another
    /// evictor claimed it first (the key was absent from that instant on).
    pub(crate) fn remove<Q>(&self, hash: u64, key: &Q, guard: &Guard) -> bool
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        let claimed = self
            .find(hash, key, guard)
            .is_some_and(|node| node.cell.try_claim(|_| true));
        if claimed {
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
        claimed
    }
}

impl<K> Table<K> {
    /// Puts an existing live node into this (not yet migrating) table;
    /// false if no slot is free, which the sizing of successors rules out.
    /// Bounded: one pass over the table, each slot retried only while
    /// inserts fill it (once).
    fn place(&self, node: Shared<'_, Node<K>>, hash: u64, guard: &Guard) -> bool {
        let mut index = hash as usize & self.mask;
        let mut probed = 0;
        while probed < self.capacity() {
            let slot = self.slots[index].load(Ordering::Acquire, guard);
            if slot.is_null() {
                // Release: readers of the slot see the node's fields (they
                // were published when the node was first inserted, and this
                // thread acquired them when it loaded the old slot).
                if self.slots[index]
                    .compare_exchange(slot, node, Ordering::AcqRel, Ordering::Acquire, guard)
                    .is_ok()
                {
                    self.counters.occupied.fetch_add(1, Ordering::Relaxed);
                    return true;
                }
                continue;
            }
            index = (index + 1) & self.mask;
            probed += 1;
        }
        false
    }
}

impl<K> Drop for RawMap<K> {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no other thread can reach this map, so nothing
        // needs protecting. Each node is freed exactly once: nodes of the
        // root that were COPIED are freed through the successor, DROPPED ones
        // were already handed to the epoch, and the successor holds only
        // LIVE slots (it is not migrating).
        unsafe {
            let guard = crossbeam_epoch::unprotected();
            let mut table = self.root.load(Ordering::Relaxed, guard);
            while !table.is_null() {
                let t = table.deref();
                for slot in t.slots.iter() {
                    let node = slot.load(Ordering::Relaxed, guard);
                    if !node.is_null() && matches!(node.tag(), LIVE | FROZEN) {
                        drop(node.with_tag(LIVE).into_owned());
                    }
                }
                let next = t.next.load(Ordering::Relaxed, guard);
                drop(table.into_owned());
                table = next;
            }
        }
    }
}
