//! A key's probe chain in one table: its home slot, then each next slot,
//! wrapping at the end, once around the table (linear probing). Lookups,
//! inserts and copies walk it to its first EMPTY slot; an eviction scans
//! its first lines; a sweep walks a stretch of the table the same way.

use super::slot::Slot;
use super::table::Table;

/// A walk over a table's slots in probe order, each slot at most once.
///
/// Lookups step it by hand ([`slot`](Chain::slot), then
/// [`advance`](Chain::advance) past a slot that is not theirs), so a hit
/// on the home slot computes no next index; scans use it as an iterator.
pub(super) struct Chain<'t, K> {
    table: &'t Table<K>,
    index: usize,
    /// Slots left to visit, the current one included.
    left: usize,
}

impl<'t, K> Chain<'t, K> {
    /// The probe chain of the key hashing to `hash`: the whole table, from
    /// the key's home.
    #[inline]
    pub(super) fn new(table: &'t Table<K>, hash: u64) -> Self {
        Chain::stretch(table, table.home(hash), table.capacity())
    }

    /// `len` slots (at most the table) from `index` (below the capacity).
    #[inline]
    pub(super) fn stretch(table: &'t Table<K>, index: usize, len: usize) -> Self {
        Chain {
            table,
            index,
            left: len.min(table.capacity()),
        }
    }

    /// The slot the walk is at.
    #[inline]
    pub(super) fn slot(&self) -> &'t Slot<K> {
        &self.table.slots[self.index]
    }

    /// The tag of the slot the walk is at (see `super::tags`).
    #[inline]
    pub(super) fn tag(&self) -> u8 {
        self.table.tags.get(self.index)
    }

    /// Tags the slot the walk is at with `hash`'s fingerprint: its
    /// claimer, before it publishes it.
    #[inline]
    pub(super) fn set_tag(&self, hash: u64) {
        self.table.tags.set(self.index, hash)
    }

    /// Moves on to the next slot; false when the walk has visited every
    /// slot it was made for.
    #[inline]
    pub(super) fn advance(&mut self) -> bool {
        self.left -= 1;
        if self.left == 0 {
            return false;
        }
        self.index = self.table.after(self.index, 1);
        true
    }
}

impl<'t, K> Iterator for Chain<'t, K> {
    type Item = &'t Slot<K>;

    #[inline]
    fn next(&mut self) -> Option<&'t Slot<K>> {
        if self.left == 0 {
            return None;
        }
        let slot = self.slot();
        self.left -= 1;
        self.index = self.table.after(self.index, 1);
        Some(slot)
    }

    /// Jumps `n` slots at once (for `step_by` and `skip`).
    #[inline]
    fn nth(&mut self, n: usize) -> Option<&'t Slot<K>> {
        if n >= self.left {
            self.left = 0;
            return None;
        }
        self.left -= n;
        self.index = self.table.after(self.index, n);
        self.next()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The indices a walk visits, in order.
    fn indices<'t>(table: &'t Table<u64>, walk: impl Iterator<Item = &'t Slot<u64>>) -> Vec<usize> {
        walk.map(|slot| {
            table
                .slots
                .iter()
                .position(|s| std::ptr::eq(s, slot))
                .unwrap()
        })
        .collect()
    }

    #[test]
    fn a_walk_wraps_once_around_and_jumps_exactly() {
        let table = Table::<u64>::new(16, 0);
        let all = indices(&table, Chain::stretch(&table, 14, usize::MAX));
        let expected: Vec<usize> = (14..16).chain(0..14).collect();
        assert_eq!(all, expected, "every slot once, from 14, wrapping");
        assert_eq!(
            indices(&table, Chain::stretch(&table, 14, 9).step_by(4)),
            [14, 2, 6]
        );
        assert_eq!(
            indices(&table, Chain::stretch(&table, 15, 5).skip(3)),
            [2, 3]
        );
        assert!(indices(&table, Chain::stretch(&table, 3, 4).skip(4)).is_empty());
        let mut cursor = Chain::stretch(&table, 15, 3);
        let mut visited = vec![indices(&table, [cursor.slot()].into_iter())[0]];
        while cursor.advance() {
            visited.push(indices(&table, [cursor.slot()].into_iter())[0]);
        }
        assert_eq!(visited, [15, 0, 1], "the cursor stops after its stretch");
    }
}
