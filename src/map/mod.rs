//! The keyed map: a safe front over the lock-free core in [`raw`].
//!
//! The core's methods are sound only under a pin of the current thread
//! (see [`pin`]: a retired table is freed only once every pin that may
//! hold it has ended), and each takes the pin's guard, which only
//! `pin::pin` makes. The front carries both: [`Map::pin`] returns a
//! [`Pinned`] view of the map and its guard.

mod bound;
mod inflight;
mod pin;
mod raw;

use std::borrow::Borrow;
use std::fmt;
use std::hash::Hash;

use crate::cell::{Cell, Gone};
pub(crate) use bound::{Admitted, Full};
use raw::RawMap;
pub(crate) use raw::{Evicted, Idle, Slot};

/// A lock-free map from keys to cells (see [`raw`] for the layout).
///
/// Its retired tables, with the keys they still own, wait for the pins
/// that may hold them and may be dropped after the map, on any thread:
/// every constructor asks for `K: Send + 'static`.
pub(crate) struct Map<K> {
    raw: RawMap<K>,
}

// Only the constructors ask for `K: Send + 'static` (see `Map`): a map
// that exists was built with it.
impl<K: Send + 'static> Map<K> {
    /// A map sized for at most `max_keys` live keys.
    pub(crate) fn new(max_keys: usize) -> Self {
        Map::with_hasher(new_hasher(), max_keys)
    }

    fn with_hasher(hasher: ahash::RandomState, max_keys: usize) -> Self {
        Map {
            raw: RawMap::new(hasher, max_keys),
        }
    }

    /// A map whose hasher has fixed keys from `seed`: two such maps fed the
    /// same requests make the same choices (tests only; see
    /// `KeyedLimiterBuilder::hasher_seed`).
    pub(crate) fn seeded(seed: u64, max_keys: usize) -> Self {
        Map::with_hasher(
            ahash::RandomState::with_seeds(seed, !seed, seed.rotate_left(32), 1),
            max_keys,
        )
    }
}

impl<K> Map<K> {
    /// This map with migrations copying `chunk` slots at a time (at
    /// least one) instead of `MIGRATION_CHUNK`: for tests that run the
    /// map's races at the chunk size loom uses.
    pub(crate) fn with_migration_chunk(mut self, chunk: usize) -> Self {
        self.raw.chunk = chunk.max(1);
        self
    }

    /// Keys held: every bucket not dead, idle ones included until a
    /// sweep, a migration or an eviction takes them out.
    pub(crate) fn held(&self) -> usize {
        self.raw.held()
    }

    /// Pins the current thread, for reading this map's size only: no
    /// repair after a fork (see [`Map::pin`]).
    #[inline(always)]
    fn pin_to_measure(&self) -> Pinned<'_, K> {
        Pinned {
            raw: &self.raw,
            guard: pin::pin(),
        }
    }

    #[inline]
    pub(crate) fn hash<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.raw.hash(key)
    }
}

impl<K: Hash + Eq> Map<K> {
    /// Pins the current thread, for this map. In a forked child, the first
    /// pin repairs what the parent's other threads left half done (see
    /// `raw::after_fork`; no fork under loom). Always inlined: it is on
    /// every check's path, and out of line it cost 16 instructions a check
    /// (callgrind, `examples/instructions hits`).
    #[inline(always)]
    pub(crate) fn pin(&self) -> Pinned<'_, K> {
        #[cfg(not(turnstile_loom))]
        self.raw.after_fork();
        self.pin_to_measure()
    }
}

impl<K> Drop for Map<K> {
    fn drop(&mut self) {
        // `raw` frees its current table by itself; what it retired before
        // waits for its readers. Free it now if none holds it; otherwise
        // the next unpins of any thread free it. Not while unwinding, as
        // an unpin does not: freeing runs keys' `Drop` (other maps' too),
        // and a second panic would abort the process.
        if !std::thread::panicking() {
            pin::reclaim_if_pending();
        }
    }
}

/// What this process's fork repairs did (see `__private::fork_repairs`).
#[cfg(not(turnstile_loom))]
pub(crate) fn fork_repairs() -> [u64; 4] {
    raw::fork_repairs()
}

/// The stripe `key` falls in, in every map under loom (whose hasher keys
/// are fixed): what a model reads to stage its keys in one stripe or two.
#[cfg(turnstile_loom)]
pub(crate) fn loom_stripe<Q: Hash + ?Sized>(key: &Q) -> usize {
    inflight::stripe_index(new_hasher().hash_one(key))
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
            .field("held", &self.held())
            .field("capacity", &self.pin_to_measure().capacity())
            .finish_non_exhaustive()
    }
}

/// A map pinned on the current thread: slots it returns stay valid while it
/// lives.
pub(crate) struct Pinned<'m, K> {
    raw: &'m RawMap<K>,
    guard: pin::Guard,
}

impl<K> Pinned<'_, K> {
    /// Returns an unused reservation.
    pub(crate) fn unreserve(&self) {
        self.raw.unreserve()
    }

    /// Slots in the current table.
    pub(crate) fn capacity(&self) -> usize {
        self.raw.capacity(&self.guard)
    }

    /// See [`RawMap::assert_quiescent_accounting`].
    #[cfg(turnstile_loom)]
    pub(crate) fn assert_quiescent_accounting(&self) {
        self.raw.assert_quiescent_accounting(&self.guard);
    }

    /// Starts fetching the home slot of `hash` into the cache (a hint for
    /// batch lookups: changes nothing).
    #[inline]
    pub(crate) fn prefetch_slot(&self, hash: u64) {
        self.raw.prefetch_slot(hash, &self.guard)
    }
}

impl<K: Hash + Eq> Pinned<'_, K> {
    /// The live bucket for `key`.
    #[inline]
    pub(crate) fn find<Q>(&self, hash: u64, key: &Q) -> Option<&Slot<K>>
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        self.raw.find(hash, key, &self.guard)
    }

    /// The live bucket for `key`, inserting a fresh one (its key made by
    /// `make`) holding what `state` returns right before it is published, if there
    /// is none; the bool says whether this call inserted it. The caller
    /// holds a reservation for the key (from
    /// [`try_reserve`](Self::try_reserve) or
    /// [`evict_one_near`](Self::evict_one_near)) and gives it back with
    /// [`unreserve`](Self::unreserve) if the key was there already.
    pub(crate) fn insert<Q>(
        &self,
        hash: u64,
        key: &Q,
        make: impl FnOnce() -> K,
        state: impl FnMut() -> u64,
        idle: &impl Idle,
    ) -> (&Slot<K>, bool)
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        self.raw.insert(hash, key, make, state, idle, &self.guard)
    }

    /// Reserves room for one more key if fewer than `max` are live.
    pub(crate) fn try_reserve(&self, max: usize) -> bool {
        self.raw.try_reserve(max)
    }

    /// Runs `op` on `key`'s live bucket, looking the key up again whenever
    /// its bucket moved to a successor table under `op`; `None` if the key
    /// is absent or its bucket died first (see [`RawMap::on_bucket`]).
    pub(crate) fn on_bucket<Q, T>(
        &self,
        hash: u64,
        key: &Q,
        op: impl FnMut(&Cell) -> Result<T, Gone>,
    ) -> Option<T>
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        self.raw.on_bucket(hash, key, &self.guard, op)
    }

    /// Tombstones the live bucket for `key`, whatever its state.
    pub(crate) fn remove<Q>(&self, hash: u64, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        self.raw.remove(hash, key, &self.guard)
    }

    /// Tombstones the least-informative live key near `hash` to make room
    /// for `key` (never `key`'s own bucket, which it returns instead); on
    /// [`Evicted::Victim`] the caller holds its place as a reservation.
    pub(crate) fn evict_one_near<Q>(
        &self,
        hash: u64,
        key: &Q,
        sample: usize,
        attempt: usize,
    ) -> Evicted<'_, K>
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        self.raw
            .evict_one_near(hash, key, sample, attempt, &self.guard)
    }

    /// One step of housekeeping: help a migration along, or sweep `budget`
    /// slots for idle keys and compact the table if it has become sparse.
    /// Returns how many keys the sweep evicted.
    pub(crate) fn maintain(&self, budget: usize, idle: &impl Idle) -> usize {
        probe!(HOUSEKEEPING_RAN);
        let chunks = budget.div_ceil(self.raw.chunk);
        match self.raw.help_migrate(chunks, idle, &self.guard) {
            Some(evicted) => evicted,
            None => {
                let evicted = self.raw.sweep(budget, idle, &self.guard);
                self.raw.compact_if_sparse(&self.guard);
                evicted
            }
        }
    }

    /// Evicts every bucket whose state `which` accepts (idle ones for
    /// `evict_idle`, all for `clear`) and finishes any migration, returning
    /// the number evicted. Every bucket accepted when it starts, and not
    /// updated meanwhile, is gone when it returns, however inserts and
    /// migrations race it (see `RawMap::evict_idle_migrating`).
    pub(crate) fn evict_all(&self, which: &impl Idle) -> usize {
        let mut evicted = 0;
        loop {
            evicted += self.finish_migration(which);
            if let Some(n) = self.raw.evict_idle_migrating(which, &self.guard) {
                evicted += n;
                break;
            }
        }
        self.raw.compact_if_sparse(&self.guard);
        evicted += self.finish_migration(which);
        evicted
    }

    /// Copies until no migration is under way (waiting for chunks other
    /// threads have claimed, which only this on-demand path ever does).
    fn finish_migration(&self, idle: &impl Idle) -> usize {
        let mut evicted = 0;
        while let Some(n) = self.raw.help_migrate(usize::MAX, idle, &self.guard) {
            evicted += n;
            // Every chunk is claimed: wait for the claimers to finish theirs.
            crate::sync::yield_now();
        }
        evicted
    }
}

/// Small enough for Miri (the README's test command runs them under it).
#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithms::Gcra;

    fn never_idle(_: u64) -> bool {
        false
    }

    fn insert(map: &Map<String>, key: &str) -> u64 {
        let pinned = map.pin();
        let hash = map.hash(key);
        assert!(pinned.try_reserve(usize::MAX));
        let (slot, inserted) = pinned.insert(hash, key, || key.to_owned(), || 0, &never_idle);
        if !inserted {
            pinned.unreserve();
        }
        slot.cell.state().unwrap()
    }

    #[test]
    fn insert_find_and_grow_keep_every_bucket() {
        let map = Map::<String>::new(crate::keyed::DEFAULT_MAX_KEYS);
        let keys: Vec<String> = (0..40).map(|i| format!("key-{i}")).collect();
        for key in &keys {
            assert_eq!(insert(&map, key), 0);
        }
        // Growth froze and copied every bucket: every key is found, by &str.
        let pinned = map.pin();
        for key in &keys {
            assert!(pinned.find(map.hash(key.as_str()), key.as_str()).is_some());
        }
        assert!(pinned.find(map.hash("absent"), "absent").is_none());
        assert_eq!(map.held(), 40);
        // Grown: a table is at most four fifths full.
        assert!(pinned.capacity() >= 40 * 5 / 4);
    }

    #[test]
    fn idle_buckets_are_left_behind_by_migration_and_freed() {
        let map = Map::<String>::new(crate::keyed::DEFAULT_MAX_KEYS);
        for i in 0..30 {
            insert(&map, &format!("k{i}"));
        }
        let gcra = Gcra::new(&"1/s".parse().unwrap());
        // Give one key some state so it is not idle at time 0.
        {
            let pinned = map.pin();
            let slot = pinned.find(map.hash("k7"), "k7").unwrap();
            assert!(slot.cell.update(&gcra, 0, 1).unwrap().is_allowed());
        }
        let idle = |state: u64| state == 0;
        let evicted = map.pin().evict_all(&idle);
        assert_eq!(evicted, 29);
        assert_eq!(map.held(), 1);
        let pinned = map.pin();
        assert!(pinned.find(map.hash("k3"), "k3").is_none());
        let kept = pinned.find(map.hash("k7"), "k7").unwrap();
        assert_eq!(kept.cell.state(), Ok(1_000_000_000));
        assert!(pinned.capacity() <= 64, "{}", pinned.capacity());
    }

    #[test]
    fn overflow_eviction_picks_the_smallest_state() {
        let map = Map::<String>::new(crate::keyed::DEFAULT_MAX_KEYS);
        insert(&map, "a");
        insert(&map, "b");
        let gcra = Gcra::new(&"1/s burst 5".parse().unwrap());
        let pinned = map.pin();
        let a = pinned.find(map.hash("a"), "a").unwrap();
        for _ in 0..3 {
            let _ = a.cell.update(&gcra, 0, 1);
        }
        assert!(matches!(
            pinned.evict_one_near(map.hash("a"), "c", 8, 0),
            Evicted::Victim
        ));
        assert!(
            pinned.find(map.hash("b"), "b").is_none(),
            "b had the smaller TAT"
        );
        assert!(pinned.find(map.hash("a"), "a").is_some());
        // The evicted key's place is the caller's reservation now.
        assert_eq!(map.held(), 2);
        pinned.unreserve();
        assert_eq!(map.held(), 1);
    }

    #[test]
    fn two_threads_insert_and_update_one_key() {
        let map = Map::<String>::new(crate::keyed::DEFAULT_MAX_KEYS);
        let gcra = Gcra::new(&"1/h burst 10".parse().unwrap());
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for i in 0..20 {
                        let key = format!("k{}", i % 5);
                        let pinned = map.pin();
                        let hash = map.hash(key.as_str());
                        let slot = match pinned.find(hash, key.as_str()) {
                            Some(slot) => slot,
                            None => {
                                assert!(pinned.try_reserve(usize::MAX));
                                let (slot, inserted) = pinned.insert(
                                    hash,
                                    key.as_str(),
                                    || key.clone(),
                                    || 0,
                                    &never_idle,
                                );
                                if !inserted {
                                    pinned.unreserve();
                                }
                                slot
                            }
                        };
                        assert!(slot.cell.update(&gcra, 0, 1).unwrap().is_allowed());
                    }
                });
            }
        });
        assert_eq!(map.held(), 5);
        let pinned = map.pin();
        for i in 0..5 {
            let key = format!("k{i}");
            let slot = pinned.find(map.hash(key.as_str()), key.as_str()).unwrap();
            // Each key took 8 updates (2 threads x 4): TAT = 8 intervals.
            assert_eq!(slot.cell.state(), Ok(8 * 3_600_000_000_000));
        }
    }
}
