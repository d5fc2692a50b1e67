//! One table: its slots, the counters that steer inserts and migrations,
//! and how many slots a table is made with for a number of keys.

use crossbeam_epoch::Atomic;
use crossbeam_utils::CachePadded;

use super::slot::Slot;
use super::tags::{tagged, Tags};
use crate::cell::Seen;
use crate::sync::{AtomicUsize, Ordering};

/// The smallest table. Small in loom models so that growth happens after a
/// couple of inserts.
#[cfg(not(turnstile_loom))]
pub(crate) const MIN_CAPACITY: usize = 16;
#[cfg(turnstile_loom)]
pub(crate) const MIN_CAPACITY: usize = 2;

/// The bit of `occupied` that closes a table to inserts (see `close`).
pub(super) const CLOSED: usize = 1 << (usize::BITS - 1);

pub(super) struct Table<K> {
    // Read by every lookup.
    pub(super) slots: Box<[Slot<K>]>,
    /// The slots' tags, for keys that are dear to compare (`super::tags`).
    pub(super) tags: Tags,
    /// The successor while this table is being migrated.
    pub(super) next: Atomic<Table<K>>,
    /// Slots held back in `occupied` for the buckets a migration may copy
    /// in: the live keys counted when this table was made its
    /// predecessor's successor (see "Sizing a successor").
    pub(super) reserved_for_copies: usize,
    // Written by inserts, migrations and sweeps: on a line of their own, so
    // those writes do not evict the fields above from every reader's cache.
    pub(super) counters: CachePadded<TableCounters>,
    /// Which threads copied chunks of this table (loom probes only).
    #[cfg(turnstile_loom)]
    pub(super) copiers: std::sync::Mutex<Vec<loom::thread::ThreadId>>,
}

pub(super) struct TableCounters {
    /// Slots ever filled (live, dead or copied in) or reserved by an insert
    /// about to fill one or by a copy (`reserved_for_copies`), and the
    /// [`CLOSED`] bit. Only a failed reservation takes one back, and the
    /// end of the migration into this table the copies it did not need.
    pub(super) occupied: AtomicUsize,
    /// Buckets copied into this table by its predecessor's migration.
    pub(super) copied: AtomicUsize,
    /// Migration cursor: slots `[0, claimed)` have been handed out.
    pub(super) claimed: AtomicUsize,
    /// Slots whose migration is finished.
    pub(super) migrated: AtomicUsize,
    /// Eviction sweep cursor (wraps).
    pub(super) sweep: AtomicUsize,
}

/// `capacity` EMPTY slots, as zeroed memory that the OS maps on first touch
/// (in huge pages where it can: `super::huge_pages`).
#[cfg(not(turnstile_loom))]
pub(super) fn empty_slots<K>(capacity: usize) -> Box<[Slot<K>]> {
    // SAFETY: all-zero bytes are a valid slot: an `AtomicU64` of 0 (EMPTY)
    // and a key that is `MaybeUninit`.
    let slots = unsafe { zeroed::<Slot<K>>(capacity) };
    let _ = super::huge_pages::advise(
        slots.as_ptr().cast_mut().cast(),
        std::mem::size_of_val(&*slots),
    );
    slots
}

/// `len` values of `T` as zeroed memory from the allocator, which the OS
/// maps lazily for a large allocation: starting a migration does not write
/// the whole successor (nor its tags).
///
/// # Safety
/// All-zero bytes are a valid `T`.
#[cfg(not(turnstile_loom))]
pub(super) unsafe fn zeroed<T>(len: usize) -> Box<[T]> {
    let layout = std::alloc::Layout::array::<T>(len)
        .unwrap_or_else(|_| panic!("{len} table entries do not fit in memory"));
    if layout.size() == 0 {
        // No entries (every `T` here has a size): nothing to allocate.
        debug_assert_eq!(len, 0, "a zero-sized table entry");
        return Vec::new().into_boxed_slice();
    }
    // SAFETY: the layout is not zero-sized (checked above), all-zero bytes
    // are a valid `T` (the caller's contract), and the box frees with the
    // same layout (`Layout::array` is `[T]`'s).
    unsafe {
        let memory = std::alloc::alloc_zeroed(layout);
        if memory.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Box::from_raw(std::ptr::slice_from_raw_parts_mut(memory.cast::<T>(), len))
    }
}

#[cfg(turnstile_loom)]
pub(super) fn empty_slots<K>(capacity: usize) -> Box<[Slot<K>]> {
    (0..capacity).map(|_| Slot::empty()).collect()
}

impl<K> Table<K> {
    /// A table of `capacity` slots that holds back room for
    /// `reserved_for_copies` buckets copied in by a migration.
    pub(super) fn new(capacity: usize, reserved_for_copies: usize) -> Self {
        debug_assert!(reserved_for_copies <= fill_limit(capacity));
        Table {
            slots: empty_slots(capacity),
            tags: Tags::new(capacity, tagged::<K>()),
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
    pub(super) fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// The slot where the probe for `hash` starts. A multiply-shift (Lemire's
    /// "fastrange") maps the hash onto any capacity, so tables need not be
    /// powers of two: it takes the hash's high bits, which ahash mixes as
    /// well as its low ones.
    #[inline]
    pub(super) fn home(&self, hash: u64) -> usize {
        ((u128::from(hash) * self.capacity() as u128) >> 64) as usize
    }

    /// The slot `offset` slots after `index`, wrapping at the end of the
    /// table (`offset` is at most the capacity).
    #[inline]
    pub(super) fn after(&self, index: usize, offset: usize) -> usize {
        let slot = index + offset;
        if slot >= self.capacity() {
            slot - self.capacity()
        } else {
            slot
        }
    }

    /// Slots filled (not EMPTY, frozen or not): what `occupied` counts
    /// once nothing is in flight. A walk over the whole table.
    pub(super) fn filled(&self) -> usize {
        self.slots
            .iter()
            .filter(|slot| !matches!(Seen::of(slot.cell.word()), (Seen::Empty, _)))
            .count()
    }

    /// Slots filled or reserved.
    pub(super) fn occupied(&self) -> usize {
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
    pub(super) fn reserve_slot(&self) -> bool {
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
    pub(super) fn release_slot(&self) {
        self.counters.occupied.fetch_sub(1, Ordering::Relaxed);
    }

    /// Closes the table to inserts: every `reserve_slot` after this fails.
    /// Returns whether this call closed it. Acquire: see `reserve_slot`.
    pub(super) fn close(&self) -> bool {
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
                unsafe { slot.drop_key() };
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
pub(super) const SLOTS_PER_KEY_AT_THE_BOUND: (usize, usize) = (7, 4);

/// The capacity for a table that will hold `live` keys: three slots for
/// every two keys, rounded up to a power of two, so a growing table starts
/// a migration's life between two fifths and four fifths full and grows
/// (at [`fill_limit`]) into a successor twice its size, each key copied
/// about once on its way up. (Growing by a fifth instead would keep every
/// table two thirds full or more, but copies each key five times.) Its
/// fill limit is always above `live` (at least a fifth above), so a
/// successor that holds room for `live` copies still takes inserts. Under
/// loom, three slots a key, as the models' tables were drawn for.
pub(super) fn capacity_for(live: usize) -> usize {
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
pub(super) fn largest_capacity(max_keys: usize) -> usize {
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
pub(super) const fn fill_limit(capacity: usize) -> usize {
    if cfg!(turnstile_loom) {
        capacity / 2
    } else {
        capacity - capacity / 5
    }
}
