//! `Live<A>`: the parameters of a limiter's algorithm (for GCRA, the
//! emission interval, the tolerance and the burst), read whole by every
//! check and replaced through `&self` by `set_quota`, with no lock on the
//! reading side.
//!
//! # The protocol: two slots and a counter
//!
//! ```text
//! current = c           slot c & 1: the parameters of change c, whole
//!                       slot (c+1) & 1: free, or being written by change c+1
//! ```
//!
//! - **A change** (writers take turns through a mutex; a change is rare and
//!   off the check path) writes the *free* slot: its `seq` goes odd, the
//!   words are stored, its `seq` goes even again; then `current` moves to
//!   `c + 1`, publishing the slot whole.
//! - **A read** loads `current`, then reads the slot it names as a seqlock
//!   reader does: `seq`, the words, `seq` again. Equal and even: the words
//!   are one change's, never a mix of two.
//!
//! A read retries only when two changes land during it (the second one
//! writes the slot the read loaded `current` for): each retry means a
//! change completed, so a read never waits for a writer, and a writer
//! descheduled halfway through its slot holds up no check (it writes the
//! slot no reader is sent to). The loom model `live.rs` in `loom-tests/`
//! reaches that double change and asserts no read ever mixes two quotas.
//!
//! # Orderings
//!
//! The seqlock argument (Boehm, "Can seqlocks get along with programming
//! language memory models?"): the writer's odd `seq` store is followed by a
//! release fence, the reader's word loads by an acquire fence. A read that
//! saw any word of a write therefore sees that write's odd `seq` (or later)
//! on its second `seq` load, which then differs from its first. `current`
//! is stored with release after the slot's last store and loaded with
//! acquire, so a read sent to a slot sees at least the change that
//! published it.
//!
//! # Why this and not the alternatives
//!
//! A pointer to the parameters, swapped and retired through an epoch, costs
//! a dependent load per check and a pin the direct limiter does not hold. A
//! single seqlock costs the same as this, but a writer descheduled while
//! its `seq` is odd stalls every check until it runs again. The cost here
//! is two loads and a compare beside the parameters the check read anyway
//! (`benches/` A/B in the commit that added it).

use std::marker::PhantomData;

use crate::algorithms::sealed::{Sealed, WORDS};
use crate::sync::{fence, AtomicU64, Mutex, Ordering};

/// One of the two copies of the parameters.
#[derive(Debug)]
struct Slot {
    /// Odd while a change writes `words`; bumped by two per change.
    seq: AtomicU64,
    words: [AtomicU64; WORDS],
}

impl Slot {
    fn new(words: [u64; WORDS]) -> Self {
        Slot {
            seq: AtomicU64::new(0),
            words: words.map(AtomicU64::new),
        }
    }
}

/// An algorithm's parameters that can change while checks read them.
pub(crate) struct Live<A> {
    /// Invariant: how many changes completed; slot `current & 1` holds the
    /// parameters of the latest one, whole (its `seq` even).
    current: AtomicU64,
    slots: [Slot; 2],
    /// Changes take turns: the next change's slot is the one no reader is
    /// sent to only if one change runs at a time.
    writer: Mutex<()>,
    algorithm: PhantomData<fn() -> A>,
}

impl<A: Sealed> Live<A> {
    pub(crate) fn new(algorithm: A) -> Self {
        let words = algorithm.to_words();
        Live {
            current: AtomicU64::new(0),
            slots: [Slot::new(words), Slot::new(words)],
            writer: Mutex::new(()),
            algorithm: PhantomData,
        }
    }

    /// The parameters of one change, whole: the latest one completed when
    /// the read began, or a later one.
    #[inline]
    pub(crate) fn load(&self) -> A {
        loop {
            // Acquire: pairs with the Release store that published the slot.
            let current = self.current.load(Ordering::Acquire);
            let slot = &self.slots[(current & 1) as usize];
            // Acquire: the words read next are at least this seq's.
            let seq = slot.seq.load(Ordering::Acquire);
            // Relaxed: the fence and the second seq load below tell a torn
            // read from a whole one.
            let words = [
                slot.words[0].load(Ordering::Relaxed),
                slot.words[1].load(Ordering::Relaxed),
                slot.words[2].load(Ordering::Relaxed),
            ];
            // Acquire fence: a word stored after a writer's Release fence,
            // if read above, makes that writer's odd seq visible below.
            fence(Ordering::Acquire);
            // Relaxed: ordered after the word loads by the fence.
            if seq & 1 == 0 && slot.seq.load(Ordering::Relaxed) == seq {
                return A::from_words(words);
            }
            // Two changes landed during this read: the slot is being (or
            // was) rewritten. `current` has moved on; read again.
            probe!(QUOTA_READ_RETRIED);
            crate::sync::spin_loop();
        }
    }

    /// Replaces the parameters: reads that begin after this returns see
    /// `algorithm` (or a later change).
    pub(crate) fn store(&self, algorithm: A) {
        // Nothing in the critical section panics; a poisoned lock is still
        // a turn.
        let _turn = self
            .writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Relaxed: the mutex orders this against the previous change.
        let next = self.current.load(Ordering::Relaxed).wrapping_add(1);
        let slot = &self.slots[(next & 1) as usize];
        // Relaxed: only writers store seq, and they take turns.
        let seq = slot.seq.load(Ordering::Relaxed);
        slot.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        // Release fence: a reader that reads any word below sees the odd
        // seq on its second load (see the module docs).
        fence(Ordering::Release);
        for (word, value) in slot.words.iter().zip(algorithm.to_words()) {
            // Relaxed: published by the seq and `current` stores below.
            word.store(value, Ordering::Relaxed);
        }
        // Release: the words before it are seen with the even seq.
        slot.seq.store(seq.wrapping_add(2), Ordering::Release);
        // Release: a reader sent to this slot sees it whole.
        self.current.store(next, Ordering::Release);
    }

    /// How many changes completed: a number that moves whenever the
    /// parameters may have changed (read it before the parameters, and a
    /// value it shows is at least as new as this number).
    #[inline]
    pub(crate) fn version(&self) -> u64 {
        // Acquire: parameters loaded after it are at least this change's.
        self.current.load(Ordering::Acquire)
    }
}

impl<A: Sealed + std::fmt::Debug> std::fmt::Debug for Live<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.load().fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithms::Gcra;
    use crate::quota::Quota;

    fn gcra(text: &str) -> Gcra {
        Gcra::new(&text.parse::<Quota>().unwrap())
    }

    #[test]
    fn a_change_is_read_whole_and_moves_the_version() {
        let live = Live::new(gcra("10/s"));
        assert_eq!((live.load(), live.version()), (gcra("10/s"), 0));
        live.store(gcra("3/min burst 7"));
        assert_eq!((live.load(), live.version()), (gcra("3/min burst 7"), 1));
        live.store(gcra("1/h"));
        assert_eq!((live.load(), live.version()), (gcra("1/h"), 2));
    }

    /// Readers racing changes between two quotas whose every word differs
    /// only ever see one of them whole. Small enough for Miri
    /// (scripts/miri.sh runs it).
    #[test]
    fn readers_racing_changes_never_see_a_mix() {
        let (a, b) = (gcra("10/s"), gcra("7/min burst 3"));
        let live = Live::new(a);
        let rounds = if cfg!(miri) { 20 } else { 20_000 };
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for _ in 0..rounds {
                        let seen = live.load();
                        assert!(seen == a || seen == b, "a torn read: {seen:?}");
                    }
                });
            }
            s.spawn(|| {
                for i in 0..rounds {
                    live.store(if i % 2 == 0 { b } else { a });
                }
            });
        });
        assert_eq!(live.version(), rounds);
    }
}
