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
//! line. Probes past foreign keys compare keys in place (for keys that own
//! heap memory, such as `String`, a foreign key of the same length is the
//! one case that reads another line). Figures, beside governor's DashMap
//! and the one-probe floor, are in `BENCHMARKS.md`.
//!
//! A cell must never be copied while it can still be updated, or an update
//! made on the old copy is lost. So a migration *freezes* a cell before it
//! copies it: one CAS sets the word's FROZEN bit, which makes every later
//! update, claim or insert CAS on it fail (see `crate::cell`). A check that
//! meets a frozen cell copies it into the successor itself if no thread has
//! started to (or waits for the one that has), and retries there. Who
//! copies is decided by one CAS to COPYING before anything is published,
//! so there is never a second copy and a key never has two owners. This
//! is Cliff Click's non-blocking hash table protocol, with the frozen word
//! in the role of his boxed "prime" value.
//!
//! # Slots
//!
//! A slot is a [`Cell`] (one `AtomicU64`) and an inline key. The word says
//! where the slot is in its life (the encoding is in `crate::cell`), and a
//! slot only moves forward through it:
//!
//! ```text
//! EMPTY ──claim──▶ BUSY ──publish──▶ live ──claim──▶ TOMBSTONE ──freeze──▶ TOMBSTONE|FROZEN
//!   │                                  │
//!   └─freeze─▶ EMPTY|FROZEN            └─freeze─▶ live|FROZEN ──win──▶ COPYING ──placed──▶ COPIED|FROZEN
//!              (never filled)                         │
//!                                                     └─▶ TOMBSTONE|FROZEN (its key's Hash
//!                                                         panicked; or no room, which the
//!                                                         sizing rules out)
//! ```
//!
//! - **BUSY** lasts a few instructions: the claimer has already built its
//!   key, so it only moves it into the slot and publishes the word. A
//!   lookup passes over a BUSY slot (a key not yet published is not yet
//!   there); an insert, a copy and a migration wait for it to be published,
//!   because it may hold their key. **COPYING** likewise lasts a few steps
//!   with no code of the key's: a thread that meets it waits for COPIED.
//! - **Probe chains.** A slot never becomes EMPTY again, and inserts only
//!   fill the first EMPTY slot of a key's probe sequence. So if a probe
//!   from a key's home reaches an EMPTY slot without meeting the key, the
//!   key is not in this table.
//! - **One live bucket per key.** An insert publishes a key only after
//!   probing its whole chain in every table (old before new) without
//!   finding it live; a bucket is copied once, by the thread that won its
//!   COPYING; and an insert that goes on to the successor freezes the
//!   EMPTY slot that ended its chain, so no insert of the same key can land
//!   behind it in the old table.
//!
//! # Keys and memory
//!
//! Keys are immutable once published. A migration copies a key's bytes
//! into the successor; from the COPIED mark on, the successor owns it and
//! the old table does not drop it. Dead slots (TOMBSTONE) keep their key
//! until a migration leaves them behind; the old table, retired through the
//! pin (`super::pin`), then drops the keys it still owns (`Table`'s `Drop`). So nothing
//! is freed per eviction, nothing is freed twice, and no reader ever
//! compares against freed memory. A table is zeroed memory (EMPTY is `0`),
//! which the OS maps lazily: starting a migration does not write the whole
//! successor.
//!
//! # Migration
//!
//! When a table is full to its [`fill_limit`] (or a quarter of it is dead,
//! or it is four times larger than its live keys need), a successor sized
//! for the live keys is
//! installed in `next`. From then on new keys go to the successor, and
//! callers copy the old table a chunk at a time: each chunk is claimed by
//! one thread (a `fetch_add` on a cursor), which evicts idle buckets,
//! freezes every slot and copies the live ones. The thread that finishes
//! the last chunk swings the root to the successor and retires the old
//! table (`super::pin::retire`). A successor migrates only after it has become
//! the root, so there are at most two tables at a time.
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
//! # Orderings
//!
//! One rule for the whole file, so each access need not repeat it:
//! - **Pointers** (`root`, `next`) are published with a `Release` (or
//!   `AcqRel`) CAS and read with `Acquire`, because every reader
//!   dereferences what it loads.
//! - **Slot words** publish keys; their protocol is in `crate::cell`.
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

use std::borrow::Borrow;
use std::hash::Hash;
use std::mem::MaybeUninit;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

use crossbeam_epoch::{Atomic, Guard, Owned, Shared};
use crossbeam_utils::CachePadded;

use super::inflight::InFlight;
use crate::cell::{Cell, Gone, Seen};
use crate::sync::{wait_briefly, AtomicUsize, Ordering, UnsafeCell};

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
pub(crate) const MIGRATION_CHUNK: usize = if cfg!(turnstile_loom) { 1 } else { 64 };

/// Slots per 64-byte cache line (at least one).
const fn slots_per_line<K>() -> usize {
    let size = std::mem::size_of::<Slot<K>>();
    if size >= 64 {
        1
    } else {
        64 / size
    }
}

/// Cache lines, from a new key's home slot on, among whose live buckets an
/// eviction for it chooses its victim (`evict_one_near`): the home line
/// and the next, which its lookup has just read.
const EVICTION_LINES: usize = 2;

/// The bit of `occupied` that closes a table to inserts (see `close`).
const CLOSED: usize = 1 << (usize::BITS - 1);

/// One key's bucket: its cell, and the key inline.
pub(crate) struct Slot<K> {
    pub(crate) cell: Cell,
    key: UnsafeCell<MaybeUninit<K>>,
}

// SAFETY: the key is written only by the thread that claimed the slot
// (BUSY), before it publishes the word with Release; every other access
// reads it after an Acquire load of a published word, and it is dropped
// only by the table's `Drop` (`&mut`). So sharing a slot shares `&K`
// across threads (K: Sync) and may drop `K` on another thread (K: Send).
unsafe impl<K: Send + Sync> Sync for Slot<K> {}
// SAFETY: as above: a slot owns at most one `K`.
unsafe impl<K: Send> Send for Slot<K> {}

impl<K> Slot<K> {
    /// An EMPTY slot (loom's atomics cannot be zeroed memory).
    #[cfg(turnstile_loom)]
    fn empty() -> Self {
        Slot {
            cell: Cell::empty(),
            key: UnsafeCell::new(MaybeUninit::uninit()),
        }
    }

    /// Whether this slot's key is `key`.
    ///
    /// # Safety
    /// The caller read a word that has a published key (live, copying,
    /// copied or dead) through [`Cell::word`], and holds a guard that keeps
    /// this slot's table alive.
    #[inline]
    unsafe fn key_is<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        // SAFETY: the key is initialised and immutable (the caller's
        // contract), and lives as long as the table.
        self.key
            .with(|k| unsafe { (*k).assume_init_ref() }.borrow() == key)
    }

    /// This slot's key hashed with `hasher`.
    ///
    /// # Safety
    /// As [`key_is`](Slot::key_is).
    unsafe fn hash_with(&self, hasher: &ahash::RandomState) -> u64
    where
        K: Hash,
    {
        // SAFETY: the caller's contract.
        self.key
            .with(|k| hasher.hash_one(unsafe { (*k).assume_init_ref() }))
    }

    /// Moves `key` into the slot.
    ///
    /// # Safety
    /// This thread claimed the slot ([`Cell::claim_empty`]) and has not
    /// published it yet: no other thread reads the key.
    #[inline]
    unsafe fn write_key(&self, key: K) {
        // SAFETY: the caller's contract: this thread alone touches the key.
        self.key.with_mut(|k| unsafe { (*k).write(key) });
    }

    /// Copies `from`'s key into this slot, bit for bit: the successor's
    /// copy of a frozen bucket's key, which the old table stops owning
    /// when it marks the bucket COPIED.
    ///
    /// # Safety
    /// As [`write_key`](Slot::write_key) for this slot, and as
    /// [`key_is`](Slot::key_is) for `from`.
    unsafe fn copy_key(&self, from: &Slot<K>) {
        // SAFETY: the caller's contract: `from`'s key is initialised and
        // immutable, this slot's is written by this thread alone, and the
        // two slots are distinct (they are in different tables).
        from.key.with(|src| {
            self.key.with_mut(|dst| {
                // SAFETY: as above: `src` is initialised and read only,
                // `dst` is written by this thread alone, and they do not
                // overlap.
                unsafe { std::ptr::copy_nonoverlapping(src, dst, 1) }
            })
        });
    }
}

struct Table<K> {
    // Read by every lookup.
    slots: Box<[Slot<K>]>,
    /// The successor while this table is being migrated.
    next: Atomic<Table<K>>,
    /// Slots held back in `occupied` for the buckets a migration may copy
    /// in: the live keys counted when this table was made its
    /// predecessor's successor (see "Sizing a successor").
    reserved_for_copies: usize,
    // Written by inserts, migrations and sweeps: on a line of their own, so
    // those writes do not evict the fields above from every reader's cache.
    counters: CachePadded<TableCounters>,
    /// Which threads copied chunks of this table (loom probes only).
    #[cfg(turnstile_loom)]
    copiers: std::sync::Mutex<Vec<loom::thread::ThreadId>>,
}

struct TableCounters {
    /// Slots ever filled (live, dead or copied in) or reserved by an insert
    /// about to fill one or by a copy (`reserved_for_copies`), and the
    /// [`CLOSED`] bit. Only a failed reservation takes one back, and the
    /// end of the migration into this table the copies it did not need.
    occupied: AtomicUsize,
    /// Buckets copied into this table by its predecessor's migration.
    copied: AtomicUsize,
    /// Migration cursor: slots `[0, claimed)` have been handed out.
    claimed: AtomicUsize,
    /// Slots whose migration is finished.
    migrated: AtomicUsize,
    /// Eviction sweep cursor (wraps).
    sweep: AtomicUsize,
}

/// `capacity` EMPTY slots, as zeroed memory that the OS maps on first touch.
#[cfg(not(turnstile_loom))]
fn empty_slots<K>(capacity: usize) -> Box<[Slot<K>]> {
    let layout = std::alloc::Layout::array::<Slot<K>>(capacity)
        .unwrap_or_else(|_| panic!("a table of {capacity} slots does not fit in memory"));
    // SAFETY: the layout is not zero-sized (a slot holds an `AtomicU64` and
    // capacity >= MIN_CAPACITY), and all-zero bytes are a valid slot: an
    // `AtomicU64` of 0 (EMPTY) and a key that is `MaybeUninit`. The box
    // frees with the same layout (`Layout::array` is `[Slot<K>]`'s).
    unsafe {
        let slots = std::alloc::alloc_zeroed(layout).cast::<Slot<K>>();
        if slots.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Box::from_raw(std::ptr::slice_from_raw_parts_mut(slots, capacity))
    }
}

#[cfg(turnstile_loom)]
fn empty_slots<K>(capacity: usize) -> Box<[Slot<K>]> {
    (0..capacity).map(|_| Slot::empty()).collect()
}

impl<K> Table<K> {
    /// A table of `capacity` slots that holds back room for
    /// `reserved_for_copies` buckets copied in by a migration.
    fn new(capacity: usize, reserved_for_copies: usize) -> Self {
        debug_assert!(reserved_for_copies <= fill_limit(capacity));
        Table {
            slots: empty_slots(capacity),
            next: Atomic::null(),
            reserved_for_copies,
            counters: CachePadded::new(TableCounters {
                occupied: AtomicUsize::new(reserved_for_copies),
                copied: AtomicUsize::new(0),
                claimed: AtomicUsize::new(0),
                migrated: AtomicUsize::new(0),
                sweep: AtomicUsize::new(0),
            }),
            #[cfg(turnstile_loom)]
            copiers: std::sync::Mutex::new(Vec::new()),
        }
    }

    #[inline]
    fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// The slot where the probe for `hash` starts. A multiply-shift (Lemire's
    /// "fastrange") maps the hash onto any capacity, so tables need not be
    /// powers of two: it takes the hash's high bits, which ahash mixes as
    /// well as its low ones.
    #[inline]
    fn home(&self, hash: u64) -> usize {
        ((u128::from(hash) * self.capacity() as u128) >> 64) as usize
    }

    /// The slot `offset` slots after `index`, wrapping at the end of the
    /// table (`offset` is at most the capacity).
    #[inline]
    fn after(&self, index: usize, offset: usize) -> usize {
        let slot = index + offset;
        if slot >= self.capacity() {
            slot - self.capacity()
        } else {
            slot
        }
    }

    /// Slots filled or reserved.
    fn occupied(&self) -> usize {
        self.counters.occupied.load(Ordering::Relaxed) & !CLOSED
    }

    /// Reserves a slot for an insert, unless the table is closed or at its
    /// [`fill_limit`] (direct inserts stop there: probe chains stay short).
    /// A reservation is held while the insert's slot CAS runs.
    ///
    /// Release: pairs with `close`'s Acquire. An insert reserves its key in
    /// the map's `len` first (program order), so a migration that closes
    /// this table and then counts `len` counts every insert that can still
    /// land here (see "Sizing a successor" in the module docs).
    fn reserve_slot(&self) -> bool {
        let before = self.counters.occupied.fetch_add(1, Ordering::Release);
        if before & CLOSED != 0 || before >= fill_limit(self.capacity()) {
            if before & CLOSED != 0 {
                probe!(CLOSED_TABLE_REFUSED_INSERT);
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

impl<K> Drop for Table<K> {
    fn drop(&mut self) {
        if !std::mem::needs_drop::<K>() {
            return;
        }
        for slot in self.slots.iter_mut() {
            if slot.cell.owns_key() {
                // SAFETY: the key was published and did not move to a
                // successor (`owns_key`), so this table owns it, and
                // `&mut self` means no thread can read it any more.
                slot.key.with_mut(|k| unsafe { (*k).assume_init_drop() });
            }
        }
    }
}

/// Slots per key, as a fraction, of a table that holds as many keys as
/// the map may (`max_keys`): above the three halves `capacity_for` gives,
/// so that evictions there leave room for some dead slots before a
/// cleanup migration, and not the power of two above, whose table is the
/// flood's peak twice over while it migrates (`BENCHMARKS.md`, "The
/// bound's table").
const SLOTS_PER_KEY_AT_THE_BOUND: (usize, usize) = (7, 4);

/// The capacity for a table that will hold `live` keys: three slots for
/// every two keys, rounded up to a power of two, so a growing table starts
/// a migration's life between two fifths and four fifths full and grows
/// (at [`fill_limit`]) into a successor twice its size, each key copied
/// about once on its way up. (Growing by a fifth instead would keep every
/// table two thirds full or more, but copies each key five times.) Its
/// fill limit is always above `live` (at least a fifth above), so a
/// successor that holds room for `live` copies still takes inserts. Under
/// loom, three slots a key, as the models' tables were drawn for.
fn capacity_for(live: usize) -> usize {
    let slots = if cfg!(turnstile_loom) {
        live.saturating_mul(3)
    } else {
        live.saturating_add(live / 2)
    };
    slots
        .max(MIN_CAPACITY)
        .checked_next_power_of_two()
        .unwrap_or(1 << (usize::BITS - 2))
}

/// The largest table a map of at most `max_keys` live keys grows to
/// ([`SLOTS_PER_KEY_AT_THE_BOUND`]); no cap under loom.
fn largest_capacity(max_keys: usize) -> usize {
    let (slots, keys) = SLOTS_PER_KEY_AT_THE_BOUND;
    if cfg!(turnstile_loom) {
        return usize::MAX;
    }
    (max_keys.saturating_mul(slots) / keys).max(MIN_CAPACITY)
}

/// How many slots of a table of `capacity` may be filled or reserved
/// before inserts stop and the table migrates: four fifths. Linear probing
/// with several slots to a cache line keeps a hit on its home line at that
/// load, and a fuller table holds fewer bytes per key (`BENCHMARKS.md`).
/// Half under loom, whose tables of two and four slots must keep room for
/// the races the models stage.
const fn fill_limit(capacity: usize) -> usize {
    if cfg!(turnstile_loom) {
        capacity / 2
    } else {
        capacity - capacity / 5
    }
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
    /// A live bucket, now in the successor.
    Copied,
    /// An idle bucket, evicted and left behind.
    Evicted,
    /// A dead bucket, left behind.
    Dropped,
}

/// What `evict_one_near` did to make room for a key.
pub(crate) enum Evicted<'g, K> {
    /// Evicted a bucket: its place is the caller's reservation.
    Victim,
    /// The bucket it would have evicted is the key's own: the key is
    /// tracked, in this slot.
    OwnKey(&'g Slot<K>),
    /// Evicted nothing (no candidate, or it changed first).
    Nothing,
}

/// How `move_bucket` left a frozen live bucket.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Move {
    /// In the successor, copied by this thread.
    CopiedHere,
    /// In the successor, copied by another thread (this one waited).
    CopiedByAnother,
    /// Lost: the copy was abandoned because the successor had no room,
    /// which its sizing rules out.
    Lost,
}

/// The map's shared state. All methods take the guard of a pin of the
/// current thread (the safe front, `super::Map`, makes sure of that).
pub(crate) struct RawMap<K> {
    root: Atomic<Table<K>>,
    /// Live (not dead) buckets in all tables. Padded: inserts write it,
    /// every lookup reads `root`.
    len: CachePadded<AtomicUsize>,
    /// The capacity past which no table grows: the size for `max_keys`
    /// (see [`largest_capacity`]).
    largest: usize,
    /// Hashes keys; a migration rehashes each key it copies.
    hasher: ahash::RandomState,
    /// Inserts announced and not yet finished (see `super::inflight`).
    pub(crate) inflight: InFlight,
}

impl<K> RawMap<K> {
    /// An empty map for at most `max_keys` live keys (more are never
    /// lost, but its tables are sized for that many).
    pub(crate) fn new(hasher: ahash::RandomState, max_keys: usize) -> Self {
        RawMap {
            largest: largest_capacity(max_keys),
            root: Atomic::new(Table::new(MIN_CAPACITY, 0)),
            len: CachePadded::new(AtomicUsize::new(0)),
            hasher,
            inflight: InFlight::new(),
        }
    }

    /// The capacity of a successor for `live` keys: [`capacity_for`]'s, at
    /// most the largest table unless `live` needs more.
    fn successor_capacity(&self, live: usize) -> usize {
        capacity_for(live).min(self.largest.max(live.saturating_add(live / 2)))
    }

    #[inline]
    pub(crate) fn hash<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.hasher.hash_one(key)
    }

    pub(crate) fn len(&self) -> usize {
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
        let filled = t
            .slots
            .iter()
            .filter(|slot| !matches!(Seen::of(slot.cell.word()), (Seen::Empty, _)))
            .count();
        assert_eq!(t.occupied(), filled, "occupied against filled slots");
    }

    /// Starts fetching the home slot of `hash` in the root table into the
    /// cache: the slot `find` reads first, which holds the key's bucket in
    /// the common case. A hint only: nothing is read or written that a
    /// lookup can observe.
    #[inline]
    pub(crate) fn prefetch_slot(&self, hash: u64, guard: &Guard) {
        // SAFETY: as in `capacity`: the root is never null and is retired
        // only through the pin, which waits for `guard`'s.
        let t = unsafe { self.root.load(Ordering::Acquire, guard).deref() };
        prefetch(std::ptr::from_ref(&t.slots[t.home(hash)]).cast());
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
    /// The live, unfrozen bucket for `key`, if any. A frozen one met on
    /// the way is copied into the successor first (see `copy_frozen`), and
    /// found there.
    #[inline]
    pub(crate) fn find<'g, Q>(&self, hash: u64, key: &Q, guard: &'g Guard) -> Option<&'g Slot<K>>
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        let mut table = self.root.load(Ordering::Acquire, guard);
        loop {
            // SAFETY: tables are reached from the root or a `next` pointer
            // and retired only through the pin, which waits for `guard`'s.
            let t = unsafe { table.deref() };
            let mut index = t.home(hash);
            let mut probed = 0;
            while probed < t.capacity() {
                let slot = &t.slots[index];
                match Seen::of(slot.cell.word()) {
                    (Seen::Empty, _) => break,
                    // SAFETY: a live or copying word has a published key,
                    // read through `word`; `guard` keeps the table alive.
                    (Seen::Live(_) | Seen::Copying, frozen) if unsafe { slot.key_is(key) } => {
                        if !frozen {
                            return Some(slot);
                        }
                        // On its way to the successor: see it there, then
                        // look at this slot again (COPIED now).
                        self.copy_frozen(t, slot, hash, guard);
                        continue;
                    }
                    // BUSY: not published, so not there yet. COPIED: in the
                    // successor. Dead: absent (a live one may follow).
                    _ => {}
                }
                index = t.after(index, 1);
                probed += 1;
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
        'tables: loop {
            // SAFETY: as in `find`.
            let t = unsafe { table.deref() };
            let mut index = t.home(hash);
            let mut probed = 0;
            let mut waited = 0;
            // Bounded: each pass either moves to the next slot (at most
            // `capacity` times), or looks at a slot again after another
            // thread changed it (filled, froze or published it: each slot
            // changes at most that many times), or waits for a BUSY slot's
            // claimer to publish it (a few instructions).
            while probed < t.capacity() {
                let slot = &t.slots[index];
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
                        // On its way to the successor, where it is found:
                        // see it there, then look at this slot again.
                        self.copy_frozen(t, slot, hash, guard);
                        continue;
                    }
                    _ => {}
                }
                index = t.after(index, 1);
                probed += 1;
            }
            table = self.successor(table, idle, guard);
        }
    }

    /// Sees the frozen bucket in `slot` (of `table`, whose key hashes to
    /// `hash`) into the successor: copies it there if no thread has started
    /// to, or waits for the thread that has. Any thread may call it: what a
    /// check that met its bucket frozen does before it looks again.
    #[cold]
    fn copy_frozen(&self, table: &Table<K>, slot: &Slot<K>, hash: u64, guard: &Guard) {
        match Seen::of(slot.cell.word()) {
            (Seen::Live(state), true) => {
                // A live slot is frozen only by a migration's chunk, after
                // the successor is installed, and `next` is never reset.
                let next = table.next.load(Ordering::Acquire, guard);
                debug_assert!(
                    !next.is_null(),
                    "a frozen bucket in a table with no successor"
                );
                // SAFETY: checked non-null; the successor is retired only
                // through the pin, which waits for `guard`'s.
                if let Some(next) = unsafe { next.as_ref() } {
                    if self.move_bucket(slot, next, state, hash) == Move::CopiedHere {
                        probe!(COPIED_BY_READER);
                    }
                }
            }
            (Seen::Copying, _) => {
                Self::wait_for_copy(slot);
            }
            // Copied or buried since the caller looked.
            _ => {}
        }
    }

    /// Moves the frozen live bucket in `slot` (state `state`, key hash
    /// `hash`) to `next`, if this thread wins the right to: one CAS to
    /// COPYING decides the one copier before anything is published, so a
    /// key never has two owners and no second copy is ever placed, however
    /// its `Eq` behaves. The winner places the copy and marks the slot
    /// COPIED, with no code of the key's in between; a loser waits for that
    /// mark. Returns how the move ended, as this thread saw it.
    fn move_bucket(&self, slot: &Slot<K>, next: &Table<K>, state: u64, hash: u64) -> Move {
        if !slot.cell.start_copy(state) {
            // Another thread won the copy, or buried the bucket.
            return match Self::wait_for_copy(slot) {
                Seen::Copied => {
                    probe!(COPY_WON_BY_ANOTHER);
                    Move::CopiedByAnother
                }
                _ => {
                    probe!(COPY_FOUND_BURIED);
                    Move::Lost
                }
            };
        }
        // SAFETY: the word was live before this thread froze or won it: the
        // key is published; the caller's guard keeps both tables alive.
        if unsafe { next.place_copy(slot, state, hash) } {
            slot.cell.finish_copy();
            Move::CopiedHere
        } else {
            // No room: impossible by the sizing argument, but a lost bucket
            // is a better failure than a hang. Settled before the assertion,
            // so that a debug build's panic leaves no slot COPYING.
            slot.cell.abandon_copy();
            self.len.fetch_sub(1, Ordering::Relaxed);
            debug_assert!(false, "a copy found its successor full");
            Move::Lost
        }
    }

    /// Waits while another thread copies the bucket in `slot` (a few steps
    /// with no code of the key's: see `move_bucket`); returns what the slot
    /// holds after the copy (COPIED, or dead if the copy was abandoned).
    fn wait_for_copy(slot: &Slot<K>) -> Seen {
        let mut waited = 0;
        loop {
            match Seen::of(slot.cell.word()).0 {
                Seen::Copying => {
                    probe!(WAITED_FOR_COPY);
                    wait_briefly(&mut waited);
                }
                seen => return seen,
            }
        }
    }

    /// Settles a slot whose key's `Hash` panicked while this thread's
    /// migration chunk held it frozen, so that the chunk can count as
    /// migrated: buries the bucket (it is lost, as if evicted), unless a
    /// reader won its copy first, in which case waits for the copy to land
    /// as `move_bucket`'s losers do. A chunk never counts while one of its
    /// slots is COPYING: the root could otherwise swing before the copy
    /// lands, and a check on the new root insert a second bucket for the
    /// key beside it.
    #[cold]
    fn settle_panicked(&self, slot: &Slot<K>) {
        loop {
            match Seen::of(slot.cell.word()) {
                (Seen::Live(state), true) => {
                    if slot.cell.kill_frozen(state) {
                        self.len.fetch_sub(1, Ordering::Relaxed);
                        probe!(PANICKED_CHUNK_BURIED);
                        return;
                    }
                    // A reader won the copy first: look again.
                }
                (Seen::Copying, _) => {
                    probe!(PANICKED_CHUNK_WAITED_FOR_COPY);
                    Self::wait_for_copy(slot);
                    return;
                }
                // Copied, dead or empty: settled.
                _ => return,
            }
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
        let live = self.len();
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
    fn migrate_chunk(
        &self,
        table: Shared<'_, Table<K>>,
        next: Shared<'_, Table<K>>,
        idle: &impl Idle,
        guard: &Guard,
    ) -> Option<usize> {
        // SAFETY: as in `find`.
        let t = unsafe { table.deref() };
        let start = t
            .counters
            .claimed
            .fetch_add(MIGRATION_CHUNK, Ordering::Relaxed);
        if start >= t.capacity() {
            return None;
        }
        let end = (start + MIGRATION_CHUNK).min(t.capacity());
        Some(self.migrate_range(table, next, start..end, idle, guard))
    }

    /// Migrates the slots `range` of `table` into `next` (this thread
    /// claimed them), returning how many idle keys it evicted; the thread
    /// that migrates the last slot swings the root and retires the table.
    fn migrate_range(
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
        let mut panicked = None;
        for slot in &t.slots[start..end] {
            // A key's `Hash` or `Eq` may panic while its bucket is frozen:
            // the bucket is lost (as if evicted), the chunk is finished so
            // the migration can still end, and the panic goes on after.
            let moved = catch_unwind(AssertUnwindSafe(|| self.migrate_slot(slot, n, idle)));
            match moved {
                Ok(Moved::Evicted) => evicted += 1,
                Ok(_) => {}
                Err(panic) => {
                    self.settle_panicked(slot);
                    panicked.get_or_insert(panic);
                }
            }
        }
        // AcqRel: the finisher must see every other chunk's copies before it
        // retires the table.
        let migrated = t.counters.migrated.fetch_add(end - start, Ordering::AcqRel) + (end - start);
        if migrated == t.capacity() {
            // Every copy has landed (AcqRel above): give back the room held
            // for the buckets that died instead of moving. Never more than
            // was held, so `occupied` cannot wrap into its CLOSED bit.
            let copied = n.counters.copied.load(Ordering::Relaxed);
            let unused = n.reserved_for_copies.saturating_sub(copied);
            if copied > 0 && n.occupied() > n.reserved_for_copies {
                probe!(SUCCESSOR_TOOK_COPIES_AND_INSERTS);
            }
            n.counters.occupied.fetch_sub(unused, Ordering::Relaxed);
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
                if t.copiers.lock().unwrap().first() != Some(&loom::thread::current().id()) {
                    probe!(ROOT_SWUNG_BY_HELPER);
                }
                // SAFETY: the table is unreachable from the root now, so
                // no pin that starts later can load it; threads that loaded
                // it earlier are pinned, and it is freed only after they
                // unpin (see `pin`). It drops only the keys it still owns
                // (dead ones); copied keys are the successor's, and every
                // map's `K` is `Send`.
                unsafe { super::pin::retire(table.as_raw().cast_mut()) };
                probe!(TABLE_RETIRED);
            }
        }
        if let Some(panic) = panicked {
            resume_unwind(panic);
        }
        evicted
    }

    /// Evicts every idle bucket of the root by migrating it whole, this
    /// thread deciding every slot. Returns how many it evicted, or `None`
    /// if another thread's migration of the root had claimed every chunk
    /// (the caller finishes that migration and calls again).
    ///
    /// A sweep of the root cannot be exact while inserts may start a
    /// migration: its chunks freeze and copy buckets before the sweep
    /// reaches them. So this closes the root itself (no other migration
    /// can start until the successor becomes the root, which waits for
    /// this thread's chunks) and claims every chunk left. Chunks claimed by
    /// others before that are waited for, then the successor, which holds
    /// what they copied and every key inserted since, is swept whole; then
    /// this thread migrates its own chunks, evicting their idle buckets
    /// instead of copying them. The caller has finished any migration that
    /// was under way.
    pub(crate) fn evict_idle_migrating(&self, idle: &impl Idle, guard: &Guard) -> Option<usize> {
        let root = self.root.load(Ordering::Acquire, guard);
        let next = self.start_migration(root, guard);
        // SAFETY: as in `find`.
        let (t, n) = unsafe { (root.deref(), next.deref()) };
        let start = t
            .counters
            .claimed
            .fetch_add(t.capacity(), Ordering::Relaxed);
        if start >= t.capacity() {
            return None;
        }
        if start > 0 {
            // Another thread started this migration and copies its first
            // chunks with its own idle test: wait for them to land.
            probe!(EVICTION_WAITED_FOR_EARLIER_CHUNKS);
            // Acquire: their copies are in the successor before the sweep.
            while t.counters.migrated.load(Ordering::Acquire) < start {
                crate::sync::yield_now();
            }
        }
        let mut evicted = n
            .slots
            .iter()
            .filter(|slot| self.sweep_slot(slot, idle))
            .count();
        evicted += self.migrate_range(root, next, start..t.capacity(), idle, guard);
        Some(evicted)
    }

    /// Evicts the bucket in `slot` if it is idle, freezes the slot and
    /// copies a live bucket on (this thread owns the slot's migration: it
    /// claimed the chunk).
    fn migrate_slot(&self, slot: &Slot<K>, next: &Table<K>, idle: &impl Idle) -> Moved {
        let mut evicted = false;
        let mut waited = 0;
        // Only the claimer freezes a filled slot, so this loop ends once
        // the inserts and updates racing it are done: an insert fills or
        // freezes an EMPTY slot once, and publishes a BUSY one within a few
        // instructions; each update that beats a CAS here is one more
        // decision made on the old table, which the copy then carries.
        let state = loop {
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
                        // Evicted before the freeze, by the same claim as a
                        // sweep's: then left behind as dead.
                        evicted |= self.claim_if_idle(slot, idle);
                    } else if slot.cell.freeze(word) {
                        break state;
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
                (Seen::Live(_) | Seen::Copying | Seen::Copied | Seen::Dead, true) => {
                    debug_assert!(false, "a filled slot frozen by another thread");
                    return Moved::Dropped;
                }
                (Seen::Copied | Seen::Copying, false) => {
                    unreachable!("COPIED and COPYING are frozen")
                }
            }
        };
        // SAFETY: the word was live: the key is published; `guard` (the
        // caller's) keeps both tables alive.
        let hash = unsafe { slot.hash_with(&self.hasher) };
        // A reader that met the bucket frozen may have copied it already.
        match self.move_bucket(slot, next, state, hash) {
            Move::CopiedHere | Move::CopiedByAnother => Moved::Copied,
            Move::Lost => Moved::Dropped,
        }
    }

    /// Tombstones the bucket in `slot` if its state is idle; counts it out
    /// of `len`.
    fn claim_if_idle(&self, slot: &Slot<K>, idle: &impl Idle) -> bool {
        let claimed = slot.cell.try_claim(|state| idle.is_idle(state));
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
        let start = t.counters.sweep.fetch_add(budget, Ordering::Relaxed) % t.capacity();
        (0..budget.min(t.capacity()))
            .filter(|offset| {
                let slot = &t.slots[t.after(start, *offset)];
                self.sweep_slot(slot, idle)
            })
            .count()
    }

    /// Tombstones the bucket in `slot` if it is live, unfrozen and idle;
    /// counts it out of `len`.
    fn sweep_slot(&self, slot: &Slot<K>, idle: &impl Idle) -> bool {
        matches!(Seen::of(slot.cell.word()), (Seen::Live(_), false))
            && self.claim_if_idle(slot, idle)
    }

    /// Tombstones the live bucket with the smallest state (for GCRA, the
    /// bucket closest to full) among the live buckets of a window from
    /// `hash` on (at most `sample` of them), in the successor during a migration (every bucket
    /// copied so far and every key inserted since is there) and in the
    /// root (whose frozen buckets can no longer be claimed), to make room
    /// for `key`. At least two candidates are compared whenever the map
    /// holds two, so a busy key is never chosen merely for being alone in
    /// its neighbourhood. States are read in place; the one key compared
    /// is the chosen victim's, because an eviction made for `key` must
    /// never evict `key`: if the victim is `key`'s own bucket, the key is
    /// tracked after all and that bucket is returned instead.
    ///
    /// The scan of each table is a window of [`EVICTION_LINES`] cache
    /// lines' worth of slots from the key's home, doubled on each `attempt`
    /// of the caller's, and goes past it only until two candidates are
    /// found: the lines the key's own lookup has just read (it found the
    /// key absent there), so choosing costs no new miss, and the key's
    /// insert then probes the same lines.
    ///
    /// On [`Evicted::Victim`] the evicted key's place in `len` passes to
    /// the caller, who holds it as a reservation: `len` does not change,
    /// and no other thread can take the room this call made.
    pub(crate) fn evict_one_near<'g, Q>(
        &self,
        hash: u64,
        key: &Q,
        sample: usize,
        attempt: usize,
        guard: &'g Guard,
    ) -> Evicted<'g, K>
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        let want = sample.max(2);
        let window = (EVICTION_LINES * slots_per_line::<K>())
            .checked_shl(attempt.min(32) as u32)
            .unwrap_or(usize::MAX);
        let mut best: Option<(&Slot<K>, u64)> = None;
        let mut seen = 0;
        let root = self.root.load(Ordering::Acquire, guard);
        // SAFETY: as in `find`.
        let next = unsafe { root.deref() }.next.load(Ordering::Acquire, guard);
        for table in [next, root] {
            if table.is_null() || seen >= want {
                continue;
            }
            // SAFETY: as in `find`.
            let t = unsafe { table.deref() };
            let start = t.home(hash);
            // The window's lines are independent loads: ask for them all
            // at once, so their misses overlap instead of queueing.
            for offset in (0..t.capacity().min(window)).step_by(slots_per_line::<K>()) {
                prefetch(std::ptr::from_ref(&t.slots[t.after(start, offset)]).cast());
            }
            for offset in 0..t.capacity() {
                // Past the window only until two candidates are in hand.
                if offset >= window && seen >= 2 {
                    break;
                }
                let slot = &t.slots[t.after(start, offset)];
                let (Seen::Live(state), false) = Seen::of(slot.cell.word()) else {
                    continue;
                };
                seen += 1;
                if best.is_none_or(|(_, s)| state < s) {
                    best = Some((slot, state));
                }
                if seen >= want {
                    break;
                }
            }
        }
        let Some((slot, state)) = best else {
            return Evicted::Nothing;
        };
        // SAFETY: the word was live when read: the key is published, and
        // `guard` keeps the table alive.
        if unsafe { slot.key_is(key) } {
            probe!(EVICTION_SPARED_OWN_KEY);
            return Evicted::OwnKey(slot);
        }
        // Lost to an update or another evictor: the caller samples again.
        if slot.cell.try_claim(|now| now == state) {
            Evicted::Victim
        } else {
            Evicted::Nothing
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
        loop {
            let Some(slot) = self.find(hash, key, guard) else {
                return false;
            };
            match slot.cell.claim(|_| true) {
                Ok(claimed) => {
                    if claimed {
                        self.len.fetch_sub(1, Ordering::Relaxed);
                    }
                    return claimed;
                }
                Err(Gone::Dead) => return false,
                // Frozen since `find`: look again, in the successor.
                Err(Gone::Moved) => {}
            }
        }
    }
}

impl<K> Table<K> {
    /// Puts a copy of the frozen bucket in `from` (state `state`, key hash
    /// `hash`) into the first free slot of its chain in this (not yet
    /// migrating) table; false if there is none, which the sizing of
    /// successors rules out. The caller won the right to copy it
    /// (`Cell::start_copy`), so no other copy exists; and no other bucket
    /// for the key can be here: an insert puts a key here only after
    /// finding it absent or dead in the old table, where this bucket was
    /// live. So the chain's keys need no comparing.
    ///
    /// Bounded: one pass over the table, each slot looked at again only
    /// while another thread fills or publishes it.
    ///
    /// # Safety
    /// `from` holds a published key (its word was live), and the caller's
    /// guard keeps both tables alive.
    unsafe fn place_copy(&self, from: &Slot<K>, state: u64, hash: u64) -> bool {
        let mut index = self.home(hash);
        let mut probed = 0;
        let mut waited = 0;
        while probed < self.capacity() {
            let slot = &self.slots[index];
            match Seen::of(slot.cell.word()) {
                (Seen::Empty, false) => {
                    if slot.cell.claim_empty() {
                        // SAFETY: this thread claimed the slot; `from` is
                        // the caller's contract.
                        unsafe { slot.copy_key(from) };
                        slot.cell.publish(state);
                        // Its slot was reserved in `occupied` when this
                        // table was made (`reserved_for_copies`).
                        self.counters.copied.fetch_add(1, Ordering::Relaxed);
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
            index = self.after(index, 1);
            probed += 1;
        }
        false
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
