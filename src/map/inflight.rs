//! Inserts in flight and keys admitted at the bound, by stripes of the
//! hash: what lets a check that found no room for its key wait for an
//! insert of that same key, and what makes one new key cost at most one
//! eviction however many of its first requests race (see `super::bound`).
//!
//! Each stripe is one word:
//!
//! ```text
//! bits 63 ..= 24   the tag of the key that holds the stripe's claim (0: none)
//! bits 23 ..= 0    inserts announced and not yet finished
//! ```
//!
//! Both halves live in one atomic so that every change to either is a
//! read-modify-write of one word: an announcement ([`InFlight::begin`])
//! returns the claim it was made under, and a claim ([`InFlight::claim`])
//! sees the announcements made before it. Their modification order decides
//! every race between the two, with no fence.
//!
//! # Why a wait sees the insert that holds the room
//!
//! An insert announces itself before it reserves its place in `len`, and a
//! reservation is a `Release` read-modify-write of `len`. A check that
//! fails to reserve read `len` with `Acquire`: if what it read counts A's
//! reservation (directly, or through the later read-modify-writes that
//! continue its release sequence), A's announcement happens before the
//! check's look at the stripe. The announcement is taken back (`Release`)
//! only after the bucket is published, so a check that sees the count fall
//! (`Acquire`) then finds the bucket.
//!
//! # Why a claim keeps a key's racers from evicting for it
//!
//! An eviction for key K is made only by the thread holding K's claim on
//! its stripe, after it has seen no other insert of the stripe in flight
//! and looked K up again. Another first request of K either announced
//! itself before the claim (the claim holder waits for it, and then finds
//! K), or after it, and then its announcement returns K's tag and it backs
//! off without inserting, waits for the claim to end and finds K (published
//! before the claim ends, `Release`/`Acquire` on the stripe word).

use crate::sync::{AtomicU64, Ordering};

/// Stripes: two checks wait on each other's unrelated inserts only when
/// their keys share a stripe. A stripe is one 8-byte word, so a map spends
/// two kilobytes on them.
#[cfg(not(turnstile_loom))]
const STRIPES: usize = 256;
/// Two stripes under loom: a model stages its keys in one stripe (to
/// explore the waits) or in two (to explore what the waits do not cover),
/// through `__private::loom_stripe`.
#[cfg(turnstile_loom)]
const STRIPES: usize = 2;

/// Bits of a stripe word that count its inserts in flight: 16 million
/// threads inserting into one stripe at once would overflow into the tag.
const COUNT_BITS: u32 = 24;
const COUNT: u64 = (1 << COUNT_BITS) - 1;

/// A key's tag in its stripe's word: 40 bits of its hash (the low ones; the
/// stripe is chosen by the top ones), never 0. Two keys of one stripe with
/// one tag only wait for each other's admission at the bound.
fn tag(hash: u64) -> u64 {
    (hash | 1) << COUNT_BITS
}

fn count(word: u64) -> u64 {
    word & COUNT
}

fn claimed_by(word: u64) -> u64 {
    word & !COUNT
}

/// The stripe of a key hashing to `hash`: the top bits, which also place
/// a key's home (a multiply-shift of the hash, `Table::home`), so a
/// stripe's keys are neighbours in the table and a check waits for the
/// inserts near its own key, the ones an eviction for it would meet.
pub(crate) fn stripe_index(hash: u64) -> usize {
    (hash >> 56) as usize % STRIPES
}

/// Per stripe, the inserts announced and not yet finished, and the key
/// being admitted at the bound.
pub(crate) struct InFlight {
    stripes: Box<[AtomicU64]>,
    /// The fork (`super::pin::forks`) whose process the stripes' marks
    /// and claims belong to, with [`CLEARING`] set while a forked child's
    /// first admission clears them (see [`InFlight::after_fork`]).
    #[cfg(not(turnstile_loom))]
    forks: std::sync::atomic::AtomicU64,
}

/// Set in `InFlight::forks` while a forked child's first admission clears
/// the stripes.
#[cfg(not(turnstile_loom))]
const CLEARING: u64 = 1 << 63;

/// What claiming a stripe for a key found.
pub(crate) enum Claim<'a> {
    /// The stripe is this caller's until the returned guard drops.
    Held(Claimed<'a>),
    /// Another thread holds the stripe's claim: the caller drops its mark
    /// and waits for that claim to end ([`InFlight::wait_for_claim`]).
    Taken,
}

impl InFlight {
    pub(crate) fn new() -> Self {
        InFlight {
            stripes: (0..STRIPES).map(|_| AtomicU64::new(0)).collect(),
            #[cfg(not(turnstile_loom))]
            forks: std::sync::atomic::AtomicU64::new(super::pin::forks()),
        }
    }

    /// Makes the stripes this process's own: in a forked child, the marks
    /// and claims of the parent's other threads, which the child does not
    /// have, would be waited for forever. The child's first admission
    /// clears every stripe before any of the child's threads announces an
    /// insert (each admission calls this first and waits for the clearing
    /// to end); no mark or claim is the forking thread's own, since it was
    /// not inside an admission when it forked. (The places the parent's
    /// threads had reserved in `len` are given back by the map's own
    /// repair, `map::raw::after_fork`, at the child's first pin, before
    /// this.) One load and a compare otherwise.
    #[inline]
    pub(crate) fn after_fork(&self) {
        #[cfg(not(turnstile_loom))]
        {
            use std::sync::atomic::Ordering as StdOrdering;
            let forks = super::pin::forks();
            // Acquire: pairs with the clearing's Release below.
            if self.forks.load(StdOrdering::Acquire) != forks {
                self.clear_after_fork(forks);
            }
        }
    }

    #[cfg(not(turnstile_loom))]
    #[cold]
    fn clear_after_fork(&self, forks: u64) {
        use std::sync::atomic::Ordering as StdOrdering;
        // Marked with this process's fork count: a clearing that a later
        // fork cut short (its thread gone in the grandchild) is taken over.
        let clearing = forks | CLEARING;
        let mut attempt = 0;
        loop {
            let noted = self.forks.load(StdOrdering::Acquire);
            if noted == forks {
                return;
            }
            if noted != clearing
                && self
                    .forks
                    .compare_exchange(noted, clearing, StdOrdering::Acquire, StdOrdering::Acquire)
                    .is_ok()
            {
                for stripe in self.stripes.iter() {
                    stripe.store(0, Ordering::Relaxed);
                }
                // Release: an admission that sees the new note sees the
                // stripes cleared.
                self.forks.store(forks, StdOrdering::Release);
                return;
            }
            crate::sync::wait_briefly(&mut attempt);
        }
    }

    fn stripe(&self, hash: u64) -> &AtomicU64 {
        &self.stripes[stripe_index(hash)]
    }

    /// Announces an insert of a key hashing to `hash`, until the returned
    /// mark is dropped (after its bucket is published, or its place given
    /// back). Call it before reserving the place. The bool says whether
    /// another thread holds this key's claim (it is admitting the key at
    /// the bound): then the caller must not insert it, but drop the mark,
    /// wait for the claim to end and look the key up again.
    #[inline]
    pub(crate) fn begin(&self, hash: u64) -> (Inserting<'_>, bool) {
        // Relaxed for the count: the reservation that follows (a Release
        // RMW of `len`) is what publishes it (see the module docs). The
        // claim read here is ordered by the word's modification order.
        let stripe = self.stripe(hash);
        let before = stripe.fetch_add(1, Ordering::Relaxed);
        (Inserting(stripe), claimed_by(before) == tag(hash))
    }

    /// Waits until no insert of `hash`'s stripe is in flight. The caller
    /// holds no mark of its own (it would wait for itself). Returns whether
    /// it had to wait.
    pub(crate) fn wait_for(&self, hash: u64) -> bool {
        self.wait_until(hash, |word| count(word) == 0)
    }

    /// Claims `hash`'s stripe for admitting its key at the bound, if no
    /// other key holds it. The caller holds its mark (`mark`), so the claim
    /// sees every announcement before it.
    pub(crate) fn claim<'a>(&'a self, hash: u64, mark: &Inserting<'a>) -> Claim<'a> {
        let stripe = mark.0;
        debug_assert!(std::ptr::eq(stripe, self.stripe(hash)));
        // Acquire on success: the inserts counted in the word are waited
        // for next (`wait_for_others`), through this word.
        let mut word = stripe.load(Ordering::Relaxed);
        loop {
            if claimed_by(word) != 0 {
                return Claim::Taken;
            }
            match stripe.compare_exchange_weak(
                word,
                word | tag(hash),
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    return Claim::Held(Claimed {
                        stripe,
                        tag: tag(hash),
                    })
                }
                Err(actual) => word = actual,
            }
        }
    }

    /// Waits, holding `hash`'s claim and one mark, until no other insert of
    /// the stripe is in flight. Returns whether it had to wait.
    pub(crate) fn wait_for_others(&self, hash: u64) -> bool {
        self.wait_until(hash, |word| count(word) == 1)
    }

    /// Waits, holding no mark, until the claim that `begin` or `claim`
    /// reported ends. Returns whether it had to wait.
    pub(crate) fn wait_for_claim(&self, hash: u64) -> bool {
        let stripe = self.stripe(hash);
        let holder = claimed_by(stripe.load(Ordering::Relaxed));
        self.wait_until(hash, |word| holder == 0 || claimed_by(word) != holder)
    }

    fn wait_until(&self, hash: u64, done: impl Fn(u64) -> bool) -> bool {
        let stripe = self.stripe(hash);
        let (mut attempt, mut waited) = (0, false);
        // Acquire: pairs with the marks' and claims' Release, so the
        // inserts waited for have published their buckets.
        while !done(stripe.load(Ordering::Acquire)) {
            waited = true;
            crate::sync::wait_briefly(&mut attempt);
        }
        waited
    }
}

/// An insert in flight (see [`InFlight::begin`]).
pub(crate) struct Inserting<'a>(&'a AtomicU64);

impl Drop for Inserting<'_> {
    fn drop(&mut self) {
        // Release: a check that sees the count fall sees the bucket.
        self.0.fetch_sub(1, Ordering::Release);
    }
}

/// A stripe's claim, held while its key is admitted at the bound.
pub(crate) struct Claimed<'a> {
    stripe: &'a AtomicU64,
    tag: u64,
}

impl Drop for Claimed<'_> {
    fn drop(&mut self) {
        // Release: a racer of the key that sees the claim end finds the
        // bucket published under it.
        self.stripe.fetch_sub(self.tag, Ordering::Release);
    }
}
