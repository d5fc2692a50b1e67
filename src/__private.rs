//! Not API: what the crate's own tests, benches and fuzz targets need to
//! see of its internals. Hidden from the docs, and free to change in any
//! release; nothing here is covered by semantic versioning.

use std::borrow::Borrow;
use std::hash::Hash;

use crate::algorithms::Algorithm;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::keyed::{KeyedLimiter, KeyedLimiterBuilder};
use crate::quota::Quota;

/// Clock time between two housekeeping steps of a keyed limiter.
pub const TICK: std::time::Duration = crate::keyed::TICK;

/// Multi-limit rollbacks that raced since the process started, by how:
/// `(moved, gone, after_reset)`: the limit's state had moved since the
/// charge; the keyed bucket was dead or frozen; a reset of the direct
/// bucket came in between. What the stress tests read to know they
/// reached their races.
pub fn rollback_races() -> (u64, u64, u64) {
    let races = &crate::multi::charge::RACES;
    (races.moved.sum(), races.gone.sum(), races.after_reset.sum())
}

/// What forked children's repairs did in this process
/// (`map::raw::after_fork`): `(maps, migrations, orphans, copies)`: maps
/// repaired, migrations under way at the fork that a repair finished,
/// slots a vanished thread held BUSY, and copies a vanished copier left
/// COPYING. What the fork tests read to know they reached the repair's
/// cases. Counted per process: a child starts from its parent's counts.
#[cfg(not(turnstile_loom))]
pub fn fork_repairs() -> (u64, u64, u64, u64) {
    let [maps, migrations, orphans, copies] = crate::map::fork_repairs();
    (maps, migrations, orphans, copies)
}

/// The stripe of inserts in flight that `key` falls in, in every keyed
/// limiter under loom (whose hasher keys are fixed): a model stages keys
/// in one stripe, or in two, with it.
#[cfg(turnstile_loom)]
pub fn loom_stripe<Q: Hash + ?Sized>(key: &Q) -> usize {
    crate::map::loom_stripe(key)
}

/// CAS retries taken by every cell of this process so far (what
/// `Stats::process_cas_retries` reports), for benches that measure
/// contention on a limiter with no `stats()` of its own.
pub fn cas_retries() -> u64 {
    crate::cell::cas_retries()
}

/// CASes that one leased limiter's checks lost so far (on its stripes or
/// its bucket): what its stress tests read to know they raced, whatever
/// else the process runs.
pub fn lease_races<C: Clock>(limiter: &crate::LeasedLimiter<C>) -> u64 {
    limiter.races()
}

/// A quota's emission interval `T`, in nanoseconds.
pub fn interval_nanos(quota: &Quota) -> u64 {
    quota.interval_nanos()
}

/// A quota's period, in nanoseconds.
pub fn period_nanos(quota: &Quota) -> u64 {
    quota.period_nanos()
}

/// A quota's tolerance `tau = B * T`, in nanoseconds.
pub fn tolerance_nanos(quota: &Quota) -> u64 {
    quota.tolerance_nanos()
}

/// Fixed hasher keys for a keyed limiter, so that two limiters fed the same
/// requests make the same choices (which bucket an overflow evicts): what
/// the model tests compare a batch against.
pub trait HasherSeed {
    /// This builder with the hasher keyed from `seed`.
    fn hasher_seed(self, seed: u64) -> Self;
}

impl<K, C, A> HasherSeed for KeyedLimiterBuilder<K, C, A>
where
    K: Hash + Eq + Send + Sync + 'static,
    C: Clock,
    A: Algorithm,
{
    fn hasher_seed(self, seed: u64) -> Self {
        self.with_hasher_seed(seed)
    }
}

/// `check_batch` with another prefetch distance (0: no prefetching), for
/// the benchmark that chose the default.
pub fn check_batch_at_distance<K, C, A, Q>(
    limiter: &KeyedLimiter<K, C, A>,
    keys: &[Q],
    out: &mut Vec<Decision>,
    distance: usize,
) where
    K: Hash + Eq + Send + Sync + 'static + Borrow<Q>,
    C: Clock,
    A: Algorithm,
    Q: Hash + Eq + ToOwned<Owned = K>,
{
    limiter.check_batch_at_distance(keys, out, distance);
}

/// Migrations that copy `chunk` slots at a time (at least 1) instead of
/// the map's 64: the map's stress tests run at loom's chunk size of 1 too
/// (`TURNSTILE_MIGRATION_CHUNK` in `tests/map`).
pub trait MigrationChunk {
    /// This builder with migrations copying `chunk` slots at a time.
    fn migration_chunk(self, chunk: usize) -> Self;
}

impl<K, C, A> MigrationChunk for KeyedLimiterBuilder<K, C, A>
where
    K: Hash + Eq + Send + Sync + 'static,
    C: Clock,
    A: Algorithm,
{
    fn migration_chunk(self, chunk: usize) -> Self {
        self.with_migration_chunk(chunk)
    }
}
