//! A slot's life: the transitions of its [`Cell`]'s word that inserts,
//! copies and migrations make. The word's values are in `crate::cell`,
//! whose CAS loop (the bucket's) is the one other writer. A slot only
//! moves forward through them:
//!
//! ```text
//! EMPTY ──claim──▶ BUSY ──publish──▶ live ──claim──▶ TOMBSTONE ──freeze──▶ TOMBSTONE|FROZEN
//!   │                                  │
//!   └─freeze─▶ EMPTY|FROZEN            ├─copy (a migration's chunk)─▶ COPYING ──placed──▶ COPIED|FROZEN
//!              (never filled)          │                                 │
//!                                      │                                 └─▶ TOMBSTONE|FROZEN (no room,
//!                                      │                                     which the sizing rules out)
//!                                      └─bury─▶ TOMBSTONE|FROZEN (its key's Hash panicked
//!                                               in the migration that would copy it)
//! ```
//!
//! - **BUSY** lasts a few instructions: the claimer has already built its
//!   key, so it only moves it into the slot and publishes the word. A
//!   lookup passes over a BUSY slot (a key not yet published is not yet
//!   there); an insert, a copy and a migration wait for it to be published,
//!   because it may hold their key. **COPYING** likewise lasts a few steps
//!   with no code of the key's (the chunk hashed the key while the bucket
//!   was still live): a thread that meets it waits for COPIED.
//! - **A live word is never frozen.** The chunk that migrates a slot takes
//!   a live bucket straight to COPYING, one CAS: that CAS fails if an
//!   update landed since the chunk read the word (the chunk reads it again
//!   and retries), and every update after it fails on COPYING. So the
//!   state copied is the bucket's last, and one thread, decided before
//!   anything is published, copies it.
//! - **Probe chains.** A slot never becomes EMPTY again, and inserts only
//!   fill the first EMPTY slot of a key's probe sequence. So if a probe
//!   from a key's home reaches an EMPTY slot without meeting the key, the
//!   key is not in this table. (Nor past a slot BUSY on its chain: an
//!   insert or a copy waits for a BUSY slot to be published before it
//!   goes on. Lookups in a tagged map rely on it: `super::tags`.)
//! - **One live bucket per key.** An insert publishes a key only after
//!   probing its whole chain in every table (old before new) without
//!   finding it live; a bucket is copied once, by the thread that won its
//!   COPYING; and an insert that goes on to the successor freezes the
//!   EMPTY slot that ended its chain, so no insert of the same key can land
//!   behind it in the old table.

use crate::cell::{live, Cell, Seen, BUSY, COPIED, COPYING, EMPTY, FROZEN, TOMBSTONE};
use crate::sync::Ordering;

impl Cell {
    /// The word, with `Acquire`: a reader that sees a published word may
    /// read the slot's key next.
    #[inline]
    pub(crate) fn word(&self) -> u64 {
        self.word.load(Ordering::Acquire)
    }

    /// EMPTY → BUSY: this thread may write the slot's key. Acquire on
    /// failure: the caller reads the winner's key once it is published.
    #[inline]
    pub(crate) fn claim_empty(&self) -> bool {
        self.word
            .compare_exchange(EMPTY, BUSY, Ordering::Relaxed, Ordering::Acquire)
            .is_ok()
    }

    /// BUSY → live `state`: publishes the key written since
    /// [`claim_empty`](Cell::claim_empty). Only the claimer writes a BUSY
    /// word (everyone else waits for it), so this is a store.
    #[inline]
    pub(crate) fn publish(&self, state: u64) {
        self.word.store(live(state), Ordering::Release);
    }

    /// EMPTY → EMPTY|FROZEN: the slot will never be filled. False if it
    /// was not EMPTY.
    pub(crate) fn freeze_empty(&self) -> bool {
        self.word
            .compare_exchange(EMPTY, FROZEN, Ordering::Relaxed, Ordering::Acquire)
            .is_ok()
    }

    /// `word` → `word`|FROZEN: no CAS of an update, claim or insert lands
    /// on the cell after this. False if the word was not `word` any more.
    pub(crate) fn freeze(&self, word: u64) -> bool {
        debug_assert!(
            matches!(Seen::of(word), (Seen::Empty | Seen::Dead, false)),
            "only an empty or dead slot is frozen"
        );
        self.word
            .compare_exchange(word, word | FROZEN, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Live `state` → COPYING: this thread, and no other, copies the
    /// bucket to the successor, and no update lands on it any more. False
    /// if the word was not live `state` any more (an update, an eviction or
    /// a reset came first). Deciding the copier before anything is
    /// published is what keeps one owner per key: no second copy can ever
    /// be placed. Only the thread that holds the slot's migration chunk
    /// calls it, after hashing the key. AcqRel, as the freeze it replaced:
    /// Acquire, so the key the copier reads next is visible whichever
    /// update's word the CAS met (each continues the publish's release
    /// sequence); Release costs nothing more on a read-modify-write.
    pub(crate) fn start_copy(&self, state: u64) -> bool {
        self.word
            .compare_exchange(live(state), COPYING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// COPYING → frozen COPIED: the copy in the successor is published (its
    /// key included), so the successor owns the key now. Only the copier
    /// writes a COPYING word, so this is a store. Release: a reader that
    /// sees COPIED reads the copy next.
    pub(crate) fn finish_copy(&self) {
        self.word.store(COPIED | FROZEN, Ordering::Release);
    }

    /// COPYING → frozen TOMBSTONE: the copier found no room for the bucket
    /// (impossible by the sizing of successors; see `map::raw`).
    pub(crate) fn abandon_copy(&self) {
        self.word.store(TOMBSTONE | FROZEN, Ordering::Relaxed);
    }

    /// Live `state` → frozen TOMBSTONE: a bucket whose key's `Hash`
    /// panicked in the migration chunk that held its slot, so it cannot be
    /// copied. False if the word was not live `state` any more. Relaxed:
    /// a tombstone publishes nothing, and no one reads the key after it.
    pub(crate) fn bury(&self, state: u64) -> bool {
        self.word
            .compare_exchange(
                live(state),
                TOMBSTONE | FROZEN,
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// BUSY → COPIED|FROZEN: a slot whose claimer vanished in a fork
    /// before publishing it (`super::after_fork`). Its key may be half
    /// written, so the slot must own none; every walk passes over this
    /// word. Only the repairing thread touches the map then: a store.
    #[cfg(not(turnstile_loom))]
    pub(crate) fn orphan(&self) {
        self.word.store(COPIED | FROZEN, Ordering::Relaxed);
    }

    /// Whether the table that holds this cell owns its key: the key was
    /// published and did not move to a successor. For dropping a table
    /// (`&mut` access: no other thread is left).
    pub(crate) fn owns_key(&mut self) -> bool {
        let (seen, _) = Seen::of(self.word());
        matches!(seen, Seen::Live(_) | Seen::Dead)
    }
}

#[cfg(test)]
mod tests {
    use crate::algorithms::Gcra;
    use crate::cell::{Cell, Gone, Seen};

    #[test]
    fn a_cell_being_copied_refuses_writes_and_has_one_copier() {
        let gcra = Gcra::new(&"1/s burst 5".parse().unwrap());
        let cell = Cell::new(0);
        let _ = cell.update(&gcra, 0, 1);
        let state = cell.state().unwrap();
        assert_eq!(state, 1_000_000_000);
        assert!(!cell.start_copy(state + 1), "a stale state is not copied");
        assert!(cell.start_copy(state));
        assert!(!cell.start_copy(state), "one copier");
        assert_eq!(Seen::of(cell.word()), (Seen::Copying, true));
        assert_eq!(cell.update(&gcra, 0, 1), Err(Gone::Moved));
        assert_eq!(cell.claim(|_| true), Err(Gone::Moved));
        assert_eq!(cell.modify(|_| Some(7)), Err(Gone::Moved));
        assert_eq!(cell.state(), Err(Gone::Moved));
        assert!(!cell.bury(state), "a bucket being copied is not buried");
        cell.finish_copy();
        assert_eq!(Seen::of(cell.word()), (Seen::Copied, true));
        assert_eq!(cell.state(), Err(Gone::Moved));
    }

    #[test]
    fn a_bucket_whose_hash_panicked_is_buried_from_its_last_state() {
        let gcra = Gcra::new(&"1/s burst 5".parse().unwrap());
        let cell = Cell::new(0);
        let _ = cell.update(&gcra, 0, 1);
        let state = cell.state().unwrap();
        let _ = cell.update(&gcra, 0, 1);
        assert!(!cell.bury(state), "an update landed since");
        assert!(cell.bury(cell.state().unwrap()));
        assert_eq!(Seen::of(cell.word()), (Seen::Dead, true));
        assert_eq!(cell.update(&gcra, 0, 1), Err(Gone::Dead));
    }
}
