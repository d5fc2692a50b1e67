//! Batch checks on a [`KeyedLimiter`]: many keys per call, with their cache
//! misses overlapped.
//!
//! At a million keys a single check spends most of its time waiting for
//! memory: its key's slot (which holds the bucket) is a cache miss, and the
//! next check cannot start its miss early because the clock read between
//! them serialises the loop. A batch reads the clock once, pins the map
//! once, and then, [`LANES`] keys at a time:
//!
//! 1. hashes every key;
//! 2. decides the keys in slice order, each through the same code as
//!    [`check_n`](KeyedLimiter::check_n), while asking the CPU to fetch the
//!    home slot of the key [`PREFETCH_DISTANCE`] places ahead, so that
//!    several keys' misses are in flight at once.
//!
//! The prefetches are hints (`core::arch` on x86_64 and aarch64, nothing
//! elsewhere): they change no state, so the decisions are exactly those of
//! checking the keys one by one in slice order at the batch's clock
//! reading, missing keys inserted, idle keys evicted and `max_keys`
//! applied in the same order (a key twice in a batch is charged twice).
//!
//! One refinement of "the batch's reading": inserting a missing key reads
//! the clock again, exactly as a single check's insert does (a key evicted
//! by a thread with a later reading must not restart in the past), and the
//! rest of the batch is decided at that later reading, so time never runs
//! backwards within a batch. On a clock that does not move during the
//! batch (a `ManualClock`, as in the tests) every key is decided at one
//! reading.

use std::borrow::Borrow;
use std::hash::Hash;

use super::KeyedLimiter;
use crate::algorithms::Algorithm;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::BatchError;

/// Keys hashed and prefetched together: their hashes live on the stack.
const LANES: usize = 32;

/// How many keys ahead of the one being decided a batch fetches the home
/// slot of, chosen by measurement (`BENCHMARKS.md`, group `batch/distance`).
pub(crate) const PREFETCH_DISTANCE: usize = 8;

impl<K, C, A> KeyedLimiter<K, C, A>
where
    K: Hash + Eq + Send + Sync + 'static,
    C: Clock,
    A: Algorithm,
{
    /// Decides one request of cost 1 for each of `keys`, in order, into
    /// `out` (cleared first; reuse it across batches and it allocates only
    /// when a batch is longer than any before). One clock read for the
    /// whole batch; the decisions are exactly those of calling
    /// [`check`](KeyedLimiter::check) on each key in slice order at that
    /// reading, a repeated key charged once per occurrence (inserting a new
    /// key reads the clock again, as a single check does, and the keys
    /// after it are decided at that reading: see [the module
    /// docs](crate::keyed#batches)).
    ///
    /// For servers that handle requests in batches (datagrams from
    /// `recvmmsg`, a batch of log events per tenant, a queue consumer): at
    /// a million keys the cache misses of a batch's keys overlap, where
    /// single checks wait for each in turn.
    ///
    /// ```
    /// use turnstile_rl::KeyedLimiter;
    ///
    /// let limiter = KeyedLimiter::<u64>::new("2/s".parse()?);
    /// let mut decisions = Vec::new();
    /// limiter.check_batch(&[7, 8, 7, 7], &mut decisions);
    /// let allowed: Vec<bool> = decisions.iter().map(|d| d.is_allowed()).collect();
    /// assert_eq!(allowed, [true, true, true, false]);
    /// # Ok::<(), turnstile_rl::QuotaError>(())
    /// ```
    pub fn check_batch<Q>(&self, keys: &[Q], out: &mut Vec<Decision>)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K>,
    {
        // Cost 1 is always valid: every algorithm's limit is at least 1.
        self.batch(&self.algorithm.load(), keys, |_| 1, out, PREFETCH_DISTANCE);
    }

    /// [`check_batch`](KeyedLimiter::check_batch) with a cost per key: the
    /// decisions of [`check_n`](KeyedLimiter::check_n) on each pair in
    /// order. An error, with nothing decided and no bucket changed, when
    /// the lengths differ or a cost is 0 or above the burst.
    ///
    /// ```
    /// use turnstile_rl::{BatchError, CostError, KeyedLimiter};
    ///
    /// let limiter = KeyedLimiter::<u64>::new("10/s".parse()?);
    /// let mut decisions = Vec::new();
    /// limiter.check_batch_n(&[1, 2], &[6, 1], &mut decisions)?;
    /// assert_eq!(decisions[0].remaining(), 4);
    /// assert!(matches!(
    ///     limiter.check_batch_n(&[1, 2], &[5, 0], &mut decisions),
    ///     Err(BatchError::Cost { index: 1, source: CostError::Zero })
    /// ));
    /// assert_eq!(
    ///     limiter.check_batch_n(&[1], &[1, 1], &mut decisions),
    ///     Err(BatchError::LengthMismatch { keys: 1, costs: 2 })
    /// );
    /// assert_eq!(limiter.peek(&1).remaining(), 3, "the errors changed nothing");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_batch_n<Q>(
        &self,
        keys: &[Q],
        costs: &[u64],
        out: &mut Vec<Decision>,
    ) -> Result<(), BatchError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K>,
    {
        // One quota for the whole batch: the one its costs were checked at.
        let algorithm = self.algorithm.load();
        BatchError::check(keys.len(), costs, |cost| algorithm.check_cost(cost))?;
        self.batch(&algorithm, keys, |i| costs[i], out, PREFETCH_DISTANCE);
        Ok(())
    }

    /// [`check_batch`](KeyedLimiter::check_batch) with another prefetch
    /// distance (0: no prefetching at all). For the benchmark that chose
    /// [`PREFETCH_DISTANCE`]; the decisions are the same at any distance.
    /// (Reached through `__private::check_batch_at_distance`.)
    pub(crate) fn check_batch_at_distance<Q>(
        &self,
        keys: &[Q],
        out: &mut Vec<Decision>,
        distance: usize,
    ) where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K>,
    {
        self.batch(&self.algorithm.load(), keys, |_| 1, out, distance);
    }

    /// The batch loop at `algorithm`, the limiter's quota read once for
    /// the batch; every `cost(i)` is valid for it.
    #[inline]
    fn batch<Q>(
        &self,
        algorithm: &A,
        keys: &[Q],
        cost: impl Fn(usize) -> u64,
        out: &mut Vec<Decision>,
        distance: usize,
    ) where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K>,
    {
        out.clear();
        match keys {
            [] => return,
            // One key: a single check, with nothing to overlap.
            [key] => {
                out.push(self.decide(key, cost(0), algorithm));
                return;
            }
            _ => {}
        }
        out.reserve(keys.len());
        // What a check does before its lookup, once: the clock read, the
        // pin and the housekeeping step (which the first of the one-by-one
        // checks would run, at this same reading).
        let mut now = self.clock.now();
        let map = self.map.pin();
        let idle = move |state| algorithm.is_idle(state, now);
        self.tick(&map, now, &idle);
        let distance = distance.min(LANES);
        let mut hashes = [0u64; LANES];
        for (lane, chunk) in keys.chunks(LANES).enumerate() {
            let first = lane * LANES;
            for (hash, key) in hashes.iter_mut().zip(chunk) {
                *hash = self.map.hash(key);
            }
            let hashes = &hashes[..chunk.len()];
            for &hash in hashes.iter().take(distance) {
                map.prefetch_slot(hash);
            }
            for (i, (key, &hash)) in chunk.iter().zip(hashes).enumerate() {
                if let Some(&ahead) = hashes.get(i + distance).filter(|_| distance > 0) {
                    map.prefetch_slot(ahead);
                }
                let cost = cost(first + i);
                // At the batch's reading; an insert reads the clock again
                // and leaves that later reading in `now`, so time never
                // runs backwards within a batch.
                let found = map.find(hash, key);
                let checked =
                    self.decide_found(&map, hash, key, found, &mut now, cost, algorithm, &idle);
                out.push(checked.decision(algorithm, cost));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::clock::ManualClock;
    use crate::keyed::KeyedLimiter;
    use crate::quota::Quota;

    /// Every distance, including none and more than a lane, decides alike.
    #[test]
    fn the_prefetch_distance_changes_no_decision() {
        let keys: Vec<u64> = (0..300).map(|i| i % 97).collect();
        let mut expected = None;
        for distance in [0, 1, 8, 31, 32, 1_000] {
            let limiter = KeyedLimiter::builder(Quota::per_hour(1).unwrap().burst(3).unwrap())
                .clock(ManualClock::new())
                .with_hasher_seed(5)
                .build();
            let mut out = Vec::new();
            limiter.check_batch_at_distance(&keys, &mut out, distance);
            assert_eq!(out.len(), keys.len());
            let allowed: Vec<bool> = out.iter().map(|d| d.is_allowed()).collect();
            // 97 keys, each seen 3 or 4 times: the first 3 of each pass.
            assert_eq!(allowed.iter().filter(|&&a| a).count(), 97 * 3);
            match &expected {
                None => expected = Some(out),
                Some(e) => assert_eq!(e, &out, "distance {distance}"),
            }
        }
    }
}
