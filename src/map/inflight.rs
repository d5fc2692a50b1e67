//! Inserts in flight, counted by stripes of the hash: what lets a check that
//! found no room for its key wait for an insert of that same key which holds
//! a place in `len` but has not published its bucket yet.
//!
//! Without it, at `max_keys` a check of key K that misses K (thread A has
//! reserved the last place for K and is still moving the key in) sees the
//! map full and applies the overflow policy to K itself: refuses a key that
//! fits, admits it untracked, or evicts K's own fresh bucket. With it, the
//! check that finds no room waits until no insert of its stripe is in
//! flight, then looks K up again (see `KeyedLimiter::admit`).
//!
//! # Why the wait sees the insert that holds the room
//!
//! An insert announces itself ([`InFlight::begin`]) before it reserves its
//! place in `len`, and a reservation is a `Release` read-modify-write of
//! `len`. A check that fails to reserve read `len` with `Acquire`: if what
//! it read counts A's reservation (directly, or through the later
//! read-modify-writes that continue its release sequence), A's announcement
//! happens before the check's look at the stripe. The announcement is taken
//! back (`Release`) only after the bucket is published, so a check that sees
//! the stripe empty (`Acquire`) then finds the bucket.

use crate::sync::{AtomicUsize, Ordering};

/// Stripes: two checks wait on each other's unrelated inserts only when
/// their keys share a stripe. A stripe is one counter (4 to 8 bytes), so
/// a map spends a kilobyte or two on them.
#[cfg(not(turnstile_loom))]
const STRIPES: usize = 256;
/// One stripe under loom: every model's keys share it, so each model
/// explores the wait.
#[cfg(turnstile_loom)]
const STRIPES: usize = 1;

/// Per stripe, the inserts announced and not yet finished.
pub(crate) struct InFlight {
    stripes: Box<[AtomicUsize]>,
}

impl InFlight {
    pub(crate) fn new() -> Self {
        InFlight {
            stripes: (0..STRIPES).map(|_| AtomicUsize::new(0)).collect(),
        }
    }

    fn stripe(&self, hash: u64) -> &AtomicUsize {
        // The top bits, which also place a key's home (a multiply-shift
        // of the hash, `Table::home`): a stripe's keys are neighbours in
        // the table, so a check waits for the inserts near its own key,
        // the ones an eviction for it would meet.
        &self.stripes[(hash >> 56) as usize % STRIPES]
    }

    /// Announces an insert of a key hashing to `hash`, until the returned
    /// mark is dropped (after its bucket is published, or its place given
    /// back). Call it before reserving the place.
    #[inline]
    pub(crate) fn begin(&self, hash: u64) -> Inserting<'_> {
        // Relaxed: the reservation that follows (a Release RMW of `len`)
        // is what publishes it (see the module docs).
        let stripe = self.stripe(hash);
        stripe.fetch_add(1, Ordering::Relaxed);
        Inserting(stripe)
    }

    /// Waits until no insert of `hash`'s stripe is in flight. The caller
    /// holds no mark of its own (it would wait for itself). Returns whether
    /// it had to wait.
    pub(crate) fn wait_for(&self, hash: u64) -> bool {
        let stripe = self.stripe(hash);
        let (mut attempt, mut waited) = (0, false);
        // Acquire: pairs with the mark's Release, so the inserts waited for
        // have published their buckets.
        while stripe.load(Ordering::Acquire) != 0 {
            waited = true;
            crate::sync::wait_briefly(&mut attempt);
        }
        waited
    }
}

/// An insert in flight (see [`InFlight::begin`]).
pub(crate) struct Inserting<'a>(&'a AtomicUsize);

impl Drop for Inserting<'_> {
    fn drop(&mut self) {
        // Release: a check that sees the stripe drop sees the bucket.
        self.0.fetch_sub(1, Ordering::Release);
    }
}
