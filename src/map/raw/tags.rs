//! A table's tags: four bits a slot, for keys that are dear to compare.
//!
//! A `String` key is compared by reading its bytes, another cache line,
//! whenever a probe meets a foreign key of the same length: a new key's
//! lookup at four fifths full passed several such keys, and paid a miss
//! for each (`BENCHMARKS.md`). So a map of keys that own heap memory
//! ([`tagged`]) keeps beside its slots one nibble a slot: 0 until the
//! slot's claimer (an insert, or a migration's copy) writes its key's
//! [`fingerprint`], after it wrote the key and before it publishes the
//! slot. A probe reads a slot's word and key only where the tag is 0 or
//! its own fingerprint, and skips the others (about 93 % of foreign keys,
//! computed from the fifteen tags' odds: 1 is twice as likely as the rest).
//! Keys compared inline (`u64`, addresses, arrays) keep no tags: their
//! comparison costs nothing the tag would save, and each tag is memory.
//!
//! # Why a lookup may stop at a tag of 0
//!
//! A slot's tag is 0 while it is EMPTY (frozen or not) and while a claimer
//! holds it BUSY before its tag store. A key `k` is never published past a
//! slot that is BUSY on `k`'s chain: an insert or a copy that meets a BUSY
//! slot waits for it to be published before it goes on, and a slot never
//! becomes BUSY again. So a lookup that meets a tag of 0 has seen the end
//! of `k`'s chain in this table, as at an EMPTY slot. If `k` was published
//! before the lookup began, the tags `k`'s insert read (or the words it
//! waited on, published after their tags) come before the lookup's reads
//! of the same tags, which then cannot read 0 (read-read coherence): the
//! orderings can stay `Relaxed`, the word's `Release` publish coming after
//! the tag store. A forked child's repair tags every slot it orphans
//! (`super::after_fork`): an orphan is no longer BUSY, and keys inserted
//! later may lie past it.

use crate::sync::{AtomicU8, Ordering};

/// Whether a map of `K` keeps tags: for keys that own heap memory (which
/// need dropping). Under loom every key is tagged, so the models run the
/// tags' protocol.
#[inline(always)]
pub(super) const fn tagged<K>() -> bool {
    cfg!(turnstile_loom) || std::mem::needs_drop::<K>()
}

/// A key's tag, 1 to 15: four low bits of its hash (the home index takes
/// the high bits), never 0.
#[inline(always)]
pub(super) fn fingerprint(hash: u64) -> u8 {
    (hash as u8 & 0xF).max(1)
}

/// The tags of one table: two slots a byte (none for untagged keys).
pub(super) struct Tags(Box<[AtomicU8]>);

impl Tags {
    /// Tags for `capacity` slots, all 0; none unless `tagged`.
    pub(super) fn new(capacity: usize, tagged: bool) -> Self {
        let bytes = if tagged { capacity.div_ceil(2) } else { 0 };
        Tags(zeroed(bytes))
    }

    /// The tag of slot `index` (0: not written yet).
    #[inline(always)]
    pub(super) fn get(&self, index: usize) -> u8 {
        let byte = self.0[index / 2].load(Ordering::Relaxed);
        (byte >> shift(index)) & 0xF
    }

    /// Tags slot `index` with `hash`'s fingerprint: its claimer, before it
    /// publishes the slot (whose `Release` store orders this one). An OR,
    /// since the other half of the byte is another slot's, which its own
    /// claimer may be tagging.
    #[inline(always)]
    pub(super) fn set(&self, index: usize, hash: u64) {
        self.0[index / 2].fetch_or(fingerprint(hash) << shift(index), Ordering::Relaxed);
    }

    /// Tags slot `index` with any tag, unless it has one: a slot a forked
    /// child's repair orphaned.
    #[cfg(not(turnstile_loom))]
    pub(super) fn set_any(&self, index: usize) {
        if self.get(index) == 0 {
            self.set(index, 1);
        }
    }
}

/// Where slot `index`'s nibble sits in its byte.
#[inline(always)]
fn shift(index: usize) -> u32 {
    (index as u32 & 1) * 4
}

/// `bytes` zero bytes, as zeroed memory the OS maps lazily.
#[cfg(not(turnstile_loom))]
fn zeroed(bytes: usize) -> Box<[AtomicU8]> {
    // SAFETY: all-zero bytes are valid `AtomicU8`s (0: not tagged).
    unsafe { super::table::zeroed(bytes) }
}

#[cfg(turnstile_loom)]
fn zeroed(bytes: usize) -> Box<[AtomicU8]> {
    (0..bytes).map(|_| AtomicU8::new(0)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neighbours_share_a_byte_and_keep_their_own_tags() {
        let tags = Tags::new(5, true);
        assert_eq!(tags.0.len(), 3);
        assert!((0..5).all(|i| tags.get(i) == 0));
        tags.set(1, 0xAB);
        tags.set(2, 0x10);
        assert_eq!(tags.get(0), 0);
        assert_eq!(tags.get(1), 0xB);
        assert_eq!(tags.get(2), 1, "a hash whose low four bits are 0 tags 1");
        tags.set(0, 0x7);
        assert_eq!((tags.get(0), tags.get(1)), (7, 0xB));
        tags.set_any(3);
        tags.set_any(0);
        assert_eq!((tags.get(3), tags.get(0)), (1, 7), "an existing tag stays");
        assert_eq!(Tags::new(1 << 20, false).0.len(), 0);
        assert!((1..=15).contains(&fingerprint(u64::MAX)));
    }
}
