//! A key's probe chain in one table: its home slot, then each next slot,
//! wrapping at the end, once around the table (linear probing). Lookups,
//! inserts and copies walk it to its first EMPTY slot; an eviction scans
//! its first lines; a sweep walks a stretch of the table the same way.

use super::slot::Slot;
use super::table::Table;

/// The slots of a table from one index on, in probe order, each once.
pub(super) struct Chain<'t, K> {
    table: &'t Table<K>,
    index: usize,
    left: usize,
}

impl<'t, K> Chain<'t, K> {
    /// The probe chain of the key hashing to `hash`.
    #[inline]
    pub(super) fn new(table: &'t Table<K>, hash: u64) -> Self {
        Chain::from_index(table, table.home(hash))
    }

    /// The slots from `index` on (`index` is below the capacity).
    #[inline]
    pub(super) fn from_index(table: &'t Table<K>, index: usize) -> Self {
        Chain {
            table,
            index,
            left: table.capacity(),
        }
    }
}

impl<'t, K> Iterator for Chain<'t, K> {
    type Item = &'t Slot<K>;

    #[inline]
    fn next(&mut self) -> Option<&'t Slot<K>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let slot = &self.table.slots[self.index];
        self.index = self.table.after(self.index, 1);
        Some(slot)
    }
}
