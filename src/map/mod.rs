//! The keyed map: a safe front over the lock-free core in [`raw`].
//!
//! The core's methods are sound only with a guard pinned on the map's own
//! collector; the front makes that the only way to call them: [`Map::pin`]
//! returns a [`Pinned`] view that carries both.

mod pin;
mod raw;

use std::borrow::Borrow;
use std::fmt;
use std::hash::Hash;

use crossbeam_epoch::{Collector, Guard};

use raw::RawMap;
pub use raw::MIGRATION_CHUNK;
pub(crate) use raw::{Idle, Node};

/// A lock-free map from keys to cells that never move.
pub(crate) struct Map<K> {
    raw: RawMap<K>,
    hasher: ahash::RandomState,
    // Declared last: dropped after `raw`, whose drop frees what is left
    // without needing the epoch.
    collector: Collector,
}

impl<K> Map<K> {
    pub(crate) fn new() -> Self {
        Map {
            raw: RawMap::new(),
            hasher: new_hasher(),
            collector: Collector::new(),
        }
    }

    /// Live keys.
    pub(crate) fn len(&self) -> usize {
        self.raw.len()
    }

    /// Pins this map's collector on the current thread.
    #[inline]
    pub(crate) fn pin(&self) -> Pinned<'_, K> {
        Pinned {
            raw: &self.raw,
            guard: pin::pin(&self.collector),
        }
    }

    #[inline]
    pub(crate) fn hash<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.hasher.hash_one(key)
    }
}

/// Random per-map keys: an attacker cannot aim keys at one probe chain.
#[cfg(not(turnstile_loom))]
fn new_hasher() -> ahash::RandomState {
    ahash::RandomState::new()
}

/// loom replays each execution and needs every run to take the same path:
/// fixed keys.
#[cfg(turnstile_loom)]
fn new_hasher() -> ahash::RandomState {
    ahash::RandomState::with_seeds(1, 2, 3, 4)
}

impl<K> fmt::Debug for Map<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Map")
            .field("len", &self.len())
            .field("raw", &self.raw)
            .finish_non_exhaustive()
    }
}

/// A map pinned on the current thread: nodes it returns stay valid while it
/// lives.
pub(crate) struct Pinned<'m, K> {
    raw: &'m RawMap<K>,
    guard: Guard,
}

impl<K: Hash + Eq> Pinned<'_, K> {
    /// The live node for `key`.
    #[inline]
    pub(crate) fn find<Q>(&self, hash: u64, key: &Q) -> Option<&Node<K>>
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        self.raw.find(hash, key, &self.guard)
    }

    /// The live node for `key`, inserting a fresh one (state 0) made by
    /// `make` if there is none; the bool says whether this call inserted it.
    pub(crate) fn insert<Q>(
        &self,
        hash: u64,
        key: &Q,
        make: impl FnOnce() -> K,
        idle: &impl Idle,
    ) -> (&Node<K>, bool)
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        self.raw.insert(hash, key, make, idle, &self.guard)
    }

    /// Reserves room for one more key if fewer than `max` are live.
    pub(crate) fn try_reserve(&self, max: usize) -> bool {
        self.raw.try_reserve(max)
    }

    /// Returns an unused reservation.
    pub(crate) fn unreserve(&self) {
        self.raw.unreserve()
    }

    /// Tombstones the least-informative live key near `hash`.
    pub(crate) fn evict_one_near(&self, hash: u64, sample: usize) -> bool {
        self.raw.evict_one_near(hash, sample, &self.guard)
    }

    /// One step of housekeeping: help a migration along, or sweep `budget`
    /// slots for idle keys and compact the table if it has become sparse.
    /// Returns how many keys the sweep evicted.
    pub(crate) fn maintain(&self, budget: usize, idle: &impl Idle) -> usize {
        let chunks = budget.div_ceil(raw::MIGRATION_CHUNK);
        let evicted = match self.raw.help_migrate(chunks, idle, &self.guard) {
            Some(evicted) => evicted,
            None => {
                let evicted = self.raw.sweep(budget, idle, &self.guard);
                self.raw.compact_if_sparse(&self.guard);
                evicted
            }
        };
        // Push this thread's garbage to the collector and free what is old
        // enough: without it, dropped nodes wait for the epoch's own pace
        // (a few per pin), and a million of them take minutes to go.
        self.guard.flush();
        evicted
    }

    /// Evicts every idle key now and finishes any migration, returning the
    /// number evicted.
    pub(crate) fn evict_all_idle(&self, idle: &impl Idle) -> usize {
        let mut evicted = self.finish_migration(idle);
        let capacity = self.raw.capacity(&self.guard);
        evicted += self.raw.sweep(capacity, idle, &self.guard);
        self.raw.compact_if_sparse(&self.guard);
        evicted += self.finish_migration(idle);
        // Hand this thread's garbage (the dropped nodes, the old table) to
        // the collector now rather than when its local bag fills.
        self.guard.flush();
        evicted
    }

    /// Copies until no migration is under way (waiting for chunks other
    /// threads have claimed, which only this on-demand path ever does).
    fn finish_migration(&self, idle: &impl Idle) -> usize {
        let mut evicted = 0;
        while let Some(n) = self.raw.help_migrate(usize::MAX, idle, &self.guard) {
            evicted += n;
            crate::sync::yield_now();
        }
        evicted
    }

    /// Slots in the current table.
    pub(crate) fn capacity(&self) -> usize {
        self.raw.capacity(&self.guard)
    }
}
