//! Counters of rare interleavings, compiled only for the loom models
//! (`--cfg turnstile_loom`). A model that names a race asserts, after loom
//! has explored it, that the race was reached in at least one execution: a
//! model that can pass without reaching its race is a false pass.
//!
//! Not API: the counters are plain `std` atomics (loom does not model them,
//! so they add no branches), bumped on the cold paths where each race shows.

use std::sync::atomic::{AtomicUsize, Ordering};

/// One counter, and when it was last hit.
#[derive(Debug)]
pub struct Probe {
    hits: AtomicUsize,
    last: AtomicUsize,
}

/// Orders every hit of every probe. loom runs one thread at a time, so this
/// is the real order of events within an execution.
static SEQUENCE: AtomicUsize = AtomicUsize::new(0);

impl Probe {
    const fn new() -> Self {
        Probe {
            hits: AtomicUsize::new(0),
            last: AtomicUsize::new(0),
        }
    }

    /// Times the interleaving was reached, over every execution so far.
    pub fn count(&self) -> usize {
        self.hits.load(Ordering::Relaxed)
    }

    /// The [`sequence`] number of the last hit (0 if never hit).
    pub fn last(&self) -> usize {
        self.last.load(Ordering::Relaxed)
    }
}

/// The sequence number of the latest hit of any probe: read it at the start
/// of an execution to tell its hits from earlier executions'.
pub fn sequence() -> usize {
    SEQUENCE.load(Ordering::Relaxed)
}

pub(crate) fn hit(probe: &Probe) {
    probe.hits.fetch_add(1, Ordering::Relaxed);
    let now = SEQUENCE.fetch_add(1, Ordering::Relaxed) + 1;
    probe.last.store(now, Ordering::Relaxed);
}

/// A direct limiter's add met a state that its request overshot (another
/// admission came between its load and its add), and was taken back.
pub static ADD_TAKEN_BACK: Probe = Probe::new();
/// A direct limiter's add met a state below its reading (lowered since
/// its load), and was left in the bucket, which was full.
pub static ADD_LEFT_IN_FULL_BUCKET: Probe = Probe::new();
/// A leased limiter's spend lost its stripe's CAS to another thread of
/// the stripe (a spend or an install).
pub static LEASE_SPEND_RACED: Probe = Probe::new();
/// A leased limiter's take lost the bucket's CAS to another thread, and
/// its stripe's lease size grew.
pub static LEASE_GREW: Probe = Probe::new();
/// A leased limiter's install lost its stripe's CAS to another thread of
/// the stripe.
pub static LEASE_INSTALL_RACED: Probe = Probe::new();
/// A leased limiter's install met a live lease taken in the same tick (by
/// another thread of the stripe) and merged with it.
pub static LEASE_MERGED: Probe = Probe::new();
/// A leased limiter's install met a live lease of another tick, and the
/// smaller of the two was dropped.
pub static LEASE_DROPPED: Probe = Probe::new();
/// A cell's CAS failed because another update landed first.
pub static CAS_RETRY: Probe = Probe::new();
/// A check's update met a tombstone: its key was evicted under it.
pub static UPDATE_MET_TOMBSTONE: Probe = Probe::new();
/// An overflow eviction claimed no victim (its choice was updated or
/// evicted by another thread first).
pub static EVICTION_LOST: Probe = Probe::new();
/// A check's CAS met a cell a migration is copying (or has copied): its
/// bucket moved between the lookup and the update, so the check goes on to
/// the successor.
pub static UPDATE_MET_FROZEN: Probe = Probe::new();
/// An insert met a slot claimed by another insert still writing its key,
/// and waited for it to be published.
pub static INSERT_WAITED_FOR_BUSY_SLOT: Probe = Probe::new();
/// A copy into the successor met a slot claimed by an insert still writing
/// its key, and waited for it to be published.
pub static COPY_WAITED_FOR_BUSY_SLOT: Probe = Probe::new();
/// A migration chunk whose key's `Hash` panicked buried the bucket (still
/// live: a key is hashed before its bucket is marked COPYING).
pub static PANICKED_CHUNK_BURIED: Probe = Probe::new();
/// A check that found no room for its key waited for an insert in flight.
pub static NO_ROOM_WAITED_FOR_INSERT: Probe = Probe::new();
/// A check that found no room for its key found it on looking again: it
/// was inserted meanwhile, and the request is decided on its bucket.
pub static NO_ROOM_FOUND_KEY: Probe = Probe::new();
/// A first request found its key being admitted at the bound by another
/// request (its stripe claimed for the key), and waited for it instead of
/// inserting.
pub static KEY_ADMITTED_BY_ANOTHER: Probe = Probe::new();
/// A check at the bound found its stripe claimed (for its own key, or
/// another key of the stripe) when it tried to claim it, and waited.
pub static CLAIM_TAKEN: Probe = Probe::new();
/// An overflow eviction made for a key chose that key's own bucket, and
/// decided on it instead of evicting it.
pub static EVICTION_SPARED_OWN_KEY: Probe = Probe::new();
/// An overflow eviction found one published bucket in a map with room for
/// two (the other place free, reserved by an insert, or being copied), and
/// evicted nothing.
pub static EVICTION_FOUND_ONE_OF_TWO_PLACES: Probe = Probe::new();
/// An eviction of every idle key (`clear`, `evict_idle`) found chunks of
/// the migration it runs claimed by another thread first, and waited for
/// them before sweeping the successor.
pub static EVICTION_WAITED_FOR_EARLIER_CHUNKS: Probe = Probe::new();
/// A check ran a housekeeping step (its clock reached the tick).
pub static HOUSEKEEPING_RAN: Probe = Probe::new();
/// A thread met a bucket that another thread is copying into the successor
/// (COPYING), and waited for the copy to land.
pub static WAITED_FOR_COPY: Probe = Probe::new();
/// A lookup passed a slot by its tag alone: another key's (`map::raw::tags`).
pub static LOOKUP_SKIPPED_BY_TAG: Probe = Probe::new();
/// A lookup stopped at a slot with no tag that an insert or a copy holds
/// BUSY: the end of its chain, as at an EMPTY slot (`map::raw::tags`).
pub static LOOKUP_STOPPED_AT_A_CLAIM: Probe = Probe::new();
/// A migration's chunk met a slot claimed by an insert still writing its
/// key, and waited for it before copying or freezing it.
pub static MIGRATION_WAITED_FOR_INSERT: Probe = Probe::new();
/// A migration retired its old table (the root swung past it).
pub static TABLE_RETIRED: Probe = Probe::new();
/// A reclaimer found a reader pinned since before a table's retirement, and
/// left the table for a later look.
pub static RECLAIM_WAITED_FOR_READER: Probe = Probe::new();
/// A retired item was freed.
pub static RECLAIM_FREED: Probe = Probe::new();
/// An insert lost its slot's CAS (another insert filled it, or a thread
/// going on to the successor froze it).
pub static INSERT_LOST_SLOT: Probe = Probe::new();
/// An insert going on to the successor froze an empty slot of the old table.
pub static INSERT_FROZE_EMPTY_SLOT: Probe = Probe::new();
/// An insert was refused by a table a migration had closed.
pub static CLOSED_TABLE_REFUSED_INSERT: Probe = Probe::new();
/// A migration's successor was installed by a thread that had not closed
/// the table (it saw the table closed and finished the start).
pub static SUCCESSOR_INSTALLED_BY_HELPER: Probe = Probe::new();
/// A thread waited because every chunk of a migration was claimed.
pub static WAITED_FOR_CLAIMED_CHUNKS: Probe = Probe::new();
/// The root was swung by a thread that did not copy the first chunk.
pub static ROOT_SWUNG_BY_HELPER: Probe = Probe::new();
/// A migration's chunks were copied by two different threads.
pub static CHUNKS_COPIED_BY_TWO_THREADS: Probe = Probe::new();
/// A multi-limit rollback found the limit's state moved since its charge
/// (another check charged or rolled back in between).
pub static MULTI_ROLLBACK_RACED: Probe = Probe::new();
/// A keyed multi-limit rollback found the cell its charge landed on dead:
/// the bucket was reset or evicted since, so it took nothing out.
pub static ROLLBACK_FOUND_BUCKET_DEAD: Probe = Probe::new();
/// A keyed multi-limit rollback found the cell its charge landed on frozen
/// by a migration, and left the charge in the bucket.
pub static ROLLBACK_FOUND_BUCKET_MOVED: Probe = Probe::new();
/// A direct multi-limit charge overlapped a reset, so it will not be
/// rolled back (it cannot tell which bucket it landed on).
pub static CHARGE_OVERLAPPED_RESET: Probe = Probe::new();
/// A direct multi-limit rollback found its limiter reset (or being reset)
/// since its charge, so it took nothing out.
pub static ROLLBACK_AFTER_RESET: Probe = Probe::new();
/// A direct limiter's reset waited for a rollback in flight to land on the
/// bucket it was about to forget.
pub static RESET_WAITED_FOR_ROLLBACK: Probe = Probe::new();
/// A migration ended with its successor holding copies and direct inserts
/// both, in room counted together (the copies' held from the start).
pub static SUCCESSOR_TOOK_COPIES_AND_INSERTS: Probe = Probe::new();
/// A new key looked for room while another new key was doing the same.
pub static CONCURRENT_ADMITS: Probe = Probe::new();
/// Admissions in flight (for [`CONCURRENT_ADMITS`]).
static ADMITTING: AtomicUsize = AtomicUsize::new(0);

/// Marks an admission in flight while it lives.
pub(crate) struct Admitting;

impl Admitting {
    pub(crate) fn enter() -> Self {
        if ADMITTING.fetch_add(1, Ordering::Relaxed) > 0 {
            hit(&CONCURRENT_ADMITS);
        }
        Admitting
    }
}

impl Drop for Admitting {
    fn drop(&mut self) {
        ADMITTING.fetch_sub(1, Ordering::Relaxed);
    }
}
/// A read of a limiter's quota (`crate::live`) found its slot rewritten
/// by a second quota change during the read, and read again.
pub static QUOTA_READ_RETRIED: Probe = Probe::new();
