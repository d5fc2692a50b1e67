//! A new key admitted under the bound (`max_keys`): found, inserted, or
//! refused, with what a full map does as data ([`Full`]).
//!
//! # The rules
//!
//! - **A request whose key is tracked or being inserted is decided on its
//!   key's bucket**, under every policy: a check that finds no room waits
//!   for the inserts in flight of its key's stripe and looks the key up
//!   again before the policy acts (the key may be on its way in, holding
//!   the last place). A policy never refuses, admits untracked, or evicts
//!   for a key that another request is inserting.
//! - **One new key costs at most one eviction.** Only the thread holding
//!   the key's claim on its stripe ([`super::inflight`]) evicts for it,
//!   and only after it has seen no other insert of the stripe in flight and
//!   looked the key up again. Its key's other first requests meet the claim
//!   (in their announcement, or when they try to claim) and wait for it to
//!   end, then find the key. So two first requests of one key at a full
//!   map evict one bucket, not one each; with free places, racers of one
//!   key that found them all held by each other evict nothing.
//! - **An eviction takes its victim's place** (no other thread can take
//!   that room) and never evicts the key's own bucket: the request is
//!   decided on it instead (`evict_one_near`).
//!
//! # Progress
//!
//! Every wait here is for another thread's bounded steps:
//! - for the inserts in flight of a stripe: an insert is in flight from
//!   just before it takes its place until its bucket is published, and
//!   waits for nothing a waiting check holds (the waiting check has dropped
//!   its own mark; a claim holder waits only for the others');
//! - for a stripe's claim: its holder makes at most `ATTEMPTS` eviction
//!   attempts, each bounded, and a thread waiting for another key's claim
//!   holds no mark, so the holder never waits for it. A check waits for at
//!   most `CLAIM_WAITS` claims (of other keys of its stripe, or its own
//!   key's that ended without the key) before it is refused.
//!
//! A forked child has only the forking thread: the marks and claims of the
//! parent's other threads would be waited for forever, so the child's
//! first admission clears them (`InFlight::after_fork`).
//!
//! What the waits cost when a key's code is slow: an insert runs the key's
//! `ToOwned` (a `Clone`) and `Eq` while it is in flight, so a check that
//! finds no room waits for the slow clones of the inserts in flight in its
//! stripe (one of `STRIPES`, 256), and at the bound the first requests of
//! the stripe's other new keys wait behind the claim holder's clone. With
//! 2 ms clones and 16 racers on one key, the racers wait about one clone
//! and are then decided on the key's bucket. (So a key's `Eq`, `ToOwned`
//! and `Drop` must not check the limiter that holds the key: such a check
//! could wait for the insert that runs it.)

use std::borrow::Borrow;
use std::hash::Hash;

use super::inflight::Claim;
use super::{Evicted, Idle, Pinned, Slot};

/// Eviction attempts a claim holder makes before the key is refused. An
/// attempt fails when its victim was updated or taken by another evictor
/// first, or the room was held by inserts still in flight.
const ATTEMPTS: usize = 16;
/// Claims a check waits for before it is refused (of other keys of its
/// stripe, or its own key's that ended without the key): the stripe's
/// claim is held by one key at a time.
const CLAIM_WAITS: usize = 64;

/// What a full map does with a key it has not seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Full {
    /// Evict one bucket near the key, the least informative of at most
    /// `sample` live keys, and take its place.
    Evict { sample: usize },
    /// Keep the key out.
    Refuse,
}

/// How [`Pinned::admit`] dealt with a missing key.
pub(crate) enum Admitted<'p, K> {
    /// This call inserted the key's bucket, its state from `fresh`.
    Inserted(&'p Slot<K>),
    /// The key was there, or was inserted by another thread: decide on it.
    Found(&'p Slot<K>),
    /// No room, and the policy keeps the key out.
    Refused,
}

/// A key's place under `max_keys`, held while its bucket is inserted; given
/// back when dropped (the bucket was not inserted, or a panic unwound).
struct Reservation<'p, 'm, K>(&'p Pinned<'m, K>);

impl<K> Drop for Reservation<'_, '_, K> {
    fn drop(&mut self) {
        self.0.unreserve();
    }
}

impl<'m, K: Hash + Eq> Pinned<'m, K> {
    /// Admits `key`, found absent, under a bound of `max_keys` live keys
    /// (see the module docs for the rules). `make` makes the key to store;
    /// `fresh` is called right before the bucket is published and returns
    /// its first state. Also returns whether a bucket was evicted for it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn admit<Q>(
        &self,
        hash: u64,
        key: &Q,
        make: impl Fn() -> K,
        mut fresh: impl FnMut() -> u64,
        idle: &impl Idle,
        max_keys: usize,
        full: Full,
    ) -> (Admitted<'_, K>, bool)
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        #[cfg(turnstile_loom)]
        let _admitting = crate::probe::Admitting::enter();
        let inflight = &self.raw.inflight;
        inflight.after_fork();
        // The policies that do not evict look twice: once more after the
        // inserts they waited for, which may have given their places back.
        let (mut looks, mut claim_waits) = (0, 0);
        loop {
            // Announced before the place is taken, so a check that finds
            // no room because of it waits for it.
            let (mark, claimed) = inflight.begin(hash);
            if claimed {
                // Another request is admitting this key at the bound.
                drop(mark);
                probe!(KEY_ADMITTED_BY_ANOTHER);
                if let Some(done) = self.after_claim(hash, key, &mut claim_waits) {
                    return done;
                }
            } else if self.try_reserve(max_keys) {
                return (
                    self.insert_reserved(hash, key, &make, &mut fresh, idle),
                    false,
                );
            } else if let Full::Evict { sample } = full {
                match inflight.claim(hash, &mark) {
                    Claim::Held(_claim) => {
                        // The claim ends after the bucket is published (or
                        // the key found, or refused): `_claim` drops last.
                        return self
                            .evict_for(hash, key, &make, &mut fresh, idle, max_keys, sample);
                    }
                    Claim::Taken => {
                        drop(mark);
                        probe!(CLAIM_TAKEN);
                        if let Some(done) = self.after_claim(hash, key, &mut claim_waits) {
                            return done;
                        }
                    }
                }
            } else {
                // No room, and no eviction: our own mark ends first, the
                // wait is for others'.
                drop(mark);
                if inflight.wait_for(hash) {
                    probe!(NO_ROOM_WAITED_FOR_INSERT);
                }
                if let Some(slot) = self.find(hash, key) {
                    probe!(NO_ROOM_FOUND_KEY);
                    return (Admitted::Found(slot), false);
                }
                looks += 1;
                if looks == 2 {
                    return (Admitted::Refused, false);
                }
            }
        }
    }

    /// Waits, holding no mark, for the stripe's claim to end, then looks
    /// the key up: found, or refused after `CLAIM_WAITS` such waits (the
    /// claim was another key's, or its holder ended without the key), or
    /// `None` to try again.
    fn after_claim<Q>(
        &self,
        hash: u64,
        key: &Q,
        claim_waits: &mut usize,
    ) -> Option<(Admitted<'_, K>, bool)>
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        self.raw.inflight.wait_for_claim(hash);
        if let Some(slot) = self.find(hash, key) {
            return Some((Admitted::Found(slot), false));
        }
        *claim_waits += 1;
        (*claim_waits == CLAIM_WAITS).then_some((Admitted::Refused, false))
    }

    /// The claim holder's part: with the key's claim and one mark held,
    /// waits for the stripe's other inserts, looks the key up again, and
    /// takes a free place or evicts one bucket for it.
    #[allow(clippy::too_many_arguments)]
    fn evict_for<Q>(
        &self,
        hash: u64,
        key: &Q,
        make: &impl Fn() -> K,
        fresh: &mut impl FnMut() -> u64,
        idle: &impl Idle,
        max_keys: usize,
        sample: usize,
    ) -> (Admitted<'_, K>, bool)
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        for attempt in 0..ATTEMPTS {
            if self.raw.inflight.wait_for_others(hash) {
                probe!(NO_ROOM_WAITED_FOR_INSERT);
            }
            if let Some(slot) = self.find(hash, key) {
                probe!(NO_ROOM_FOUND_KEY);
                return (Admitted::Found(slot), false);
            }
            // Room for the key: a place given back meanwhile, or the place
            // of the one bucket evicted for it, which no one else can take.
            if self.try_reserve(max_keys) {
                return (self.insert_reserved(hash, key, make, fresh, idle), false);
            }
            match self.evict_one_near(hash, key, sample, attempt) {
                Evicted::Victim => {
                    return (self.insert_reserved(hash, key, make, fresh, idle), true)
                }
                Evicted::OwnKey(slot) => return (Admitted::Found(slot), false),
                Evicted::Nothing => {
                    probe!(EVICTION_LOST);
                    // The victim was taken by another evictor, or the room
                    // is held by an insert in flight: let it finish before
                    // sampling again.
                    crate::sync::yield_now();
                }
            }
        }
        (Admitted::Refused, false)
    }

    /// Inserts the key into the place the caller reserved; gives the place
    /// back if the key was there already (or the key's code panicked).
    fn insert_reserved<Q>(
        &self,
        hash: u64,
        key: &Q,
        make: &impl Fn() -> K,
        fresh: &mut impl FnMut() -> u64,
        idle: &impl Idle,
    ) -> Admitted<'_, K>
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        let reservation = Reservation(self);
        let (slot, inserted) = self.insert(hash, key, make, fresh, idle);
        if inserted {
            std::mem::forget(reservation);
            Admitted::Inserted(slot)
        } else {
            Admitted::Found(slot)
        }
    }
}
