//! A direct limiter's resets, as its multi-limit rollbacks see them.
//!
//! A direct limiter keeps one cell forever, and a reset writes a full
//! bucket into it: from then on the cell holds a new bucket, which never
//! held the charges made before the reset. A multi-limit check that
//! charged the old bucket and is then denied by a later limit must take
//! nothing out of the new one. The cell's word has no room to
//! tell the two apart, and checking a separate counter before the
//! rollback's CAS is not enough: a reset and a few admissions can bring
//! the cell back to the very state the rollback read, and its CAS then
//! lands on the new bucket. So resets and rollbacks agree through one more
//! word, off the check path:
//!
//! - the *generation* (its high half) counts resets begun and ended: odd
//!   while one is under way, so a bucket's generation is even;
//! - its low half counts rollbacks in flight.
//!
//! A charge reads the generation before and after its CAS; equal and even,
//! the charge landed on that generation's bucket (otherwise a reset
//! overlapped it, and the charge is never rolled back: see `crate::multi`
//! for what that costs). A rollback announces itself in the count and
//! acts only if the generation is still its charge's; a reset begins a
//! generation, waits for the rollbacks it counted (they act on the bucket
//! it is about to forget, and land before it does), writes the cell and
//! ends the generation. Checks never touch this word, and charges and
//! rollbacks never wait for a reset.
//!
//! # Orderings
//!
//! - A charge's first load and a rollback's increment are `Acquire`, and a
//!   reset ends with a `Release` increment: a charge or rollback that sees
//!   a generation lands on the cell after that generation's reset wrote it.
//! - A reset writes the cell after a `Release` fence, and a charge loads
//!   the generation again after an `Acquire` fence: a charge whose CAS read
//!   the reset's write (or a later state) sees the reset begun.
//! - A rollback's decrement is `Release` and a reset's wait loads with
//!   `Acquire`: a rollback the reset waited for landed before its write.
//!
//! The generation wraps after 2^31 resets; a charge held across exactly a
//! multiple of that many is the one case this cannot tell apart.

use crate::sync::{fence, wait_briefly, AtomicU64, Ordering};

/// One generation, in the word.
const GENERATION: u64 = 1 << 32;
/// The rollbacks in flight, in the word.
const IN_FLIGHT: u64 = GENERATION - 1;

/// Resets and rollbacks in flight on one cell (see the module docs).
#[derive(Debug)]
pub(crate) struct Resets {
    word: AtomicU64,
}

/// The generation in `word` (a bucket's when even).
fn generation(word: u64) -> u64 {
    word & !IN_FLIGHT
}

/// Whether a reset is under way.
fn resetting(word: u64) -> bool {
    word & GENERATION != 0
}

impl Resets {
    pub(crate) fn new() -> Self {
        Resets {
            word: AtomicU64::new(0),
        }
    }

    /// Runs `charge` (one CAS loop on the cell) and says which generation's
    /// bucket it landed on, or `None` if a reset overlapped it.
    pub(crate) fn charge<R>(&self, charge: impl FnOnce() -> R) -> (R, Option<u64>) {
        let before = self.word.load(Ordering::Acquire);
        let charged = charge();
        fence(Ordering::Acquire);
        let after = self.word.load(Ordering::Relaxed);
        let same = !resetting(before) && generation(before) == generation(after);
        if !same {
            probe!(CHARGE_OVERLAPPED_RESET);
        }
        (charged, same.then_some(generation(before)))
    }

    /// The generation of the bucket the cell holds now, or `None` while a
    /// reset is under way: read before a direct check's add, whose take
    /// back acts only if it is still current ([`roll_back`](Self::roll_back)).
    #[inline]
    pub(crate) fn generation(&self) -> Option<u64> {
        // Acquire: as a charge's first load.
        let word = self.word.load(Ordering::Acquire);
        (!resetting(word)).then_some(generation(word))
    }

    /// Runs `roll_back` (one CAS loop on the cell) if the cell still holds
    /// the bucket of `charged` (a generation from [`charge`](Self::charge)),
    /// holding off any reset until it has landed. Returns whether it ran.
    pub(crate) fn roll_back(&self, charged: u64, roll_back: impl FnOnce()) -> bool {
        // Gone already: not counted, so a reset under way is not held up by
        // rollbacks that will do nothing.
        if generation(self.word.load(Ordering::Relaxed)) != charged {
            return false;
        }
        let current = generation(self.word.fetch_add(1, Ordering::Acquire)) == charged;
        if current {
            roll_back();
        }
        self.word.fetch_sub(1, Ordering::Release);
        current
    }

    /// Runs `reset` (which writes the cell) as the start of a new bucket:
    /// after any other reset under way, and after the rollbacks in flight
    /// on the old bucket have landed. Bounded: each of those is one CAS
    /// loop, and no rollback that starts later waits or is waited for.
    pub(crate) fn reset<R>(&self, reset: impl FnOnce() -> R) -> R {
        let mut waited = 0;
        let mut word = self.word.load(Ordering::Relaxed);
        loop {
            if resetting(word) {
                wait_briefly(&mut waited);
                word = self.word.load(Ordering::Relaxed);
                continue;
            }
            match self.word.compare_exchange_weak(
                word,
                word.wrapping_add(GENERATION),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(actual) => word = actual,
            }
        }
        while self.word.load(Ordering::Acquire) & IN_FLIGHT != 0 {
            probe!(RESET_WAITED_FOR_ROLLBACK);
            wait_briefly(&mut waited);
        }
        fence(Ordering::Release);
        let reset = reset();
        self.word.fetch_add(GENERATION, Ordering::Release);
        reset
    }
}
