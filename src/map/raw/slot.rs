//! A slot: one key's bucket, its [`Cell`] and its key inline.
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

use std::borrow::Borrow;
use std::hash::Hash;
use std::mem::MaybeUninit;

use crate::cell::Cell;
use crate::sync::UnsafeCell;

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
    pub(super) fn empty() -> Self {
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
    pub(super) unsafe fn key_is<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        // SAFETY: the key is initialised and immutable (the caller's
        // contract), and lives as long as the table.
        self.key
            .with(|k| unsafe { (*k).assume_init_ref() }.borrow() == key)
    }

    /// This slot's key (tests that look at a table's keys).
    ///
    /// # Safety
    /// As [`key_is`](Slot::key_is); the key lives as long as the guard.
    #[cfg(test)]
    pub(super) unsafe fn key(&self) -> &K {
        // SAFETY: the caller's contract: initialised, immutable, and alive
        // while `self` is borrowed.
        self.key.with(|k| unsafe { (*k).assume_init_ref() })
    }

    /// This slot's key hashed with `hasher`.
    ///
    /// # Safety
    /// As [`key_is`](Slot::key_is).
    pub(super) unsafe fn hash_with(&self, hasher: &ahash::RandomState) -> u64
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
    pub(super) unsafe fn write_key(&self, key: K) {
        // SAFETY: the caller's contract: this thread alone touches the key.
        self.key.with_mut(|k| unsafe { (*k).write(key) });
    }

    /// Copies `from`'s key into this slot, bit for bit: the successor's
    /// copy of a COPYING bucket's key, which the old table stops owning
    /// when it marks the bucket COPIED.
    ///
    /// # Safety
    /// As [`write_key`](Slot::write_key) for this slot, and as
    /// [`key_is`](Slot::key_is) for `from`.
    pub(super) unsafe fn copy_key(&self, from: &Slot<K>) {
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

    /// Drops the key.
    ///
    /// # Safety
    /// The slot holds a published key that its table owns
    /// ([`Cell::owns_key`]), and no other thread can reach it (`&mut`).
    pub(super) unsafe fn drop_key(&mut self) {
        // SAFETY: the caller's contract: initialised, and ours alone.
        self.key.with_mut(|k| unsafe { (*k).assume_init_drop() });
    }
}
