//! Eviction: idle keys swept and left behind by migrations, every idle
//! key at once (`clear`), and one bucket evicted near a new key's home
//! when the map is at its bound.

use std::borrow::Borrow;
use std::hash::Hash;

use super::chain::Chain;
use super::prefetch::prefetch;
use super::slot::Slot;
use super::RawMap;
use crate::cell::Seen;
use crate::map::pin::Guard;
use crate::sync::Ordering;

/// Slots per 64-byte cache line (at least one).
const fn slots_per_line<K>() -> usize {
    let size = std::mem::size_of::<Slot<K>>();
    if size >= 64 {
        1
    } else {
        64 / size
    }
}

/// Cache lines, from a new key's home slot on, among whose live buckets an
/// eviction for it chooses its victim (`evict_one_near`): the home line
/// and the next, which its lookup has just read.
const EVICTION_LINES: usize = 2;

/// What a caller wants done with idle cells met during a migration or a sweep.
pub(crate) trait Idle {
    /// Whether `state` may be forgotten without changing any decision.
    fn is_idle(&self, state: u64) -> bool;
}

impl<F: Fn(u64) -> bool> Idle for F {
    fn is_idle(&self, state: u64) -> bool {
        self(state)
    }
}

/// What `evict_one_near` did to make room for a key.
pub(crate) enum Evicted<'g, K> {
    /// Evicted a bucket: its place is the caller's reservation.
    Victim,
    /// The bucket it would have evicted is the key's own: the key is
    /// tracked, in this slot.
    OwnKey(&'g Slot<K>),
    /// Evicted nothing (no candidate, or it changed first).
    Nothing,
}

impl<K: Hash + Eq> RawMap<K> {
    /// Evicts every idle bucket of the root by migrating it whole, this
    /// thread deciding every slot. Returns how many it evicted, or `None`
    /// if another thread's migration of the root had claimed every chunk
    /// (the caller finishes that migration and calls again).
    ///
    /// A sweep of the root cannot be exact while inserts may start a
    /// migration: its chunks freeze and copy buckets before the sweep
    /// reaches them. So this closes the root itself (no other migration
    /// can start until the successor becomes the root, which waits for
    /// this thread's chunks) and claims every chunk left. Chunks claimed by
    /// others before that are waited for, then the successor, which holds
    /// what they copied and every key inserted since, is swept whole; then
    /// this thread migrates its own chunks, evicting their idle buckets
    /// instead of copying them. The caller has finished any migration that
    /// was under way.
    pub(crate) fn evict_idle_migrating(&self, idle: &impl Idle, guard: &Guard) -> Option<usize> {
        let root = self.root.load(Ordering::Acquire, guard);
        let next = self.start_migration(root, guard);
        // SAFETY: as in `find`.
        let (t, n) = unsafe { (root.deref(), next.deref()) };
        let start = t
            .counters
            .claimed
            .fetch_add(t.capacity(), Ordering::Relaxed);
        if start >= t.capacity() {
            return None;
        }
        if start > 0 {
            // Another thread started this migration and copies its first
            // chunks with its own idle test: wait for them to land.
            probe!(EVICTION_WAITED_FOR_EARLIER_CHUNKS);
            // Acquire: their copies are in the successor before the sweep.
            while t.counters.migrated.load(Ordering::Acquire) < start {
                crate::sync::yield_now();
            }
        }
        let mut evicted = n
            .slots
            .iter()
            .filter(|slot| self.sweep_slot(slot, idle))
            .count();
        evicted += self.migrate_range(root, next, start..t.capacity(), idle, guard);
        Some(evicted)
    }

    /// Tombstones the bucket in `slot` if its state is idle; counts it out
    /// of `len`.
    pub(super) fn claim_if_idle(&self, slot: &Slot<K>, idle: &impl Idle) -> bool {
        let claimed = slot.cell.try_claim(|state| idle.is_idle(state));
        if claimed {
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
        claimed
    }

    /// Sweeps up to `budget` slots of the root for idle cells and tombstones
    /// them (their slots are reclaimed by the next migration). Returns how
    /// many it evicted.
    pub(crate) fn sweep(&self, budget: usize, idle: &impl Idle, guard: &Guard) -> usize {
        let root = self.root.load(Ordering::Acquire, guard);
        // SAFETY: as in `find`.
        let t = unsafe { root.deref() };
        let start = t.counters.sweep.fetch_add(budget, Ordering::Relaxed) % t.capacity();
        Chain::stretch(t, start, budget)
            .filter(|slot| self.sweep_slot(slot, idle))
            .count()
    }

    /// Tombstones the bucket in `slot` if it is live, unfrozen and idle;
    /// counts it out of `len`.
    pub(super) fn sweep_slot(&self, slot: &Slot<K>, idle: &impl Idle) -> bool {
        matches!(Seen::of(slot.cell.word()), (Seen::Live(_), false))
            && self.claim_if_idle(slot, idle)
    }

    /// Tombstones the live bucket with the smallest state (for GCRA, the
    /// bucket closest to full) among the live buckets of a window from
    /// `hash` on (at most `sample` of them), in the successor during a migration (every bucket
    /// copied so far and every key inserted since is there) and in the
    /// root (whose frozen buckets can no longer be claimed), to make room
    /// for `key`. At least two candidates are compared whenever the map
    /// holds two, so a busy key is never chosen merely for being alone in
    /// its neighbourhood or in the map: when both tables show one bucket
    /// (the other place free, or held by a bucket not yet published),
    /// nothing is evicted, and the caller tries again. States
    /// are read in place; the one key compared is the chosen victim's,
    /// because an eviction made for `key` must never evict `key`: if the
    /// victim is `key`'s own bucket, the key is tracked after all and that
    /// bucket is returned instead.
    ///
    /// The scan reads a window of [`EVICTION_LINES`] cache lines' worth of
    /// slots from the key's home in each table, doubled on each `attempt`
    /// of the caller's: the lines the key's own lookup has just read (it
    /// found the key absent there), so choosing costs no new miss, and the
    /// key's insert then probes the same lines. Only when the windows hold
    /// fewer than two live buckets does it go on past them, until two are
    /// found. (Going past the successor's window whenever it alone held
    /// fewer than two made an eviction during a migration read hundreds of
    /// slots of a successor still filling up.)
    ///
    /// On [`Evicted::Victim`] the evicted key's place in `len` passes to
    /// the caller, who holds it as a reservation: `len` does not change,
    /// and no other thread can take the room this call made.
    pub(crate) fn evict_one_near<'g, Q>(
        &self,
        hash: u64,
        key: &Q,
        sample: usize,
        attempt: usize,
        guard: &'g Guard,
    ) -> Evicted<'g, K>
    where
        K: Borrow<Q>,
        Q: ?Sized + Eq,
    {
        let want = sample.max(2);
        let window = (EVICTION_LINES * slots_per_line::<K>())
            .checked_shl(attempt.min(32) as u32)
            .unwrap_or(usize::MAX);
        let mut candidates = Candidates {
            best: None,
            seen: 0,
        };
        let root = self.root.load(Ordering::Acquire, guard);
        // SAFETY: as in `find`.
        let next = unsafe { root.deref() }.next.load(Ordering::Acquire, guard);
        // SAFETY: as in `find`; a null `next` (no migration) is `None`.
        let tables = [next, root].map(|table| unsafe { table.as_ref() });
        for t in tables.into_iter().flatten() {
            if candidates.seen >= want {
                break;
            }
            // The window's lines are independent loads: ask for them all
            // at once, so their misses overlap instead of queueing.
            for slot in Chain::new(t, hash)
                .take(window)
                .step_by(slots_per_line::<K>())
            {
                prefetch(std::ptr::from_ref(slot).cast());
            }
            for slot in Chain::new(t, hash).take(window) {
                candidates.consider(slot);
                if candidates.seen >= want {
                    break;
                }
            }
        }
        // Fewer than two live buckets in the windows (a successor still
        // filling up, a stretch of the root a migration has frozen): go on
        // past them until two are in hand.
        for t in tables.into_iter().flatten() {
            for slot in Chain::new(t, hash).skip(window) {
                if candidates.seen >= 2 {
                    break;
                }
                candidates.consider(slot);
            }
        }
        // Fewer than two: both tables, whole, hold at most one published
        // bucket. Evicting it would compare it with nothing, and a drained
        // key evicted that way comes back with a full burst. Unless one
        // key is all the map may hold, a second place exists: free (an
        // insert that found its key already there gave its place back
        // after this caller's reservation failed), or held by a bucket on
        // its way in (an insert's, or one a migration is copying). Either
        // way the caller tries again: it reserves the free place, or waits
        // for inserts in flight and samples again (and in the end refuses
        // the new key rather than evict that way).
        if candidates.seen < 2 && self.max_keys >= 2 {
            probe!(EVICTION_FOUND_ONE_OF_TWO_PLACES);
            return Evicted::Nothing;
        }
        let Some((slot, state)) = candidates.best else {
            return Evicted::Nothing;
        };
        // Not reached through `map::bound`, whose evictor looked its key up
        // after every other insert of the stripe had ended, and no insert
        // of its key starts while it holds the key's claim; kept because an
        // eviction must never forget the key it makes room for.
        // SAFETY: the word was live when read: the key is published, and
        // `guard` keeps the table alive.
        if unsafe { slot.key_is(key) } {
            probe!(EVICTION_SPARED_OWN_KEY);
            return Evicted::OwnKey(slot);
        }
        // Lost to an update or another evictor: the caller samples again.
        if slot.cell.try_claim(|now| now == state) {
            Evicted::Victim
        } else {
            Evicted::Nothing
        }
    }
}

/// The live buckets an eviction has looked at, and the fullest of them.
struct Candidates<'t, K> {
    /// The bucket with the smallest state, and that state.
    best: Option<(&'t Slot<K>, u64)>,
    seen: usize,
}

impl<'t, K> Candidates<'t, K> {
    /// Counts `slot` if it holds a live, unfrozen bucket (frozen ones can
    /// no longer be claimed), and keeps it if it is the fullest yet.
    fn consider(&mut self, slot: &'t Slot<K>) {
        let (Seen::Live(state), false) = Seen::of(slot.cell.word()) else {
            return;
        };
        self.seen += 1;
        if self.best.is_none_or(|(_, best)| state < best) {
            self.best = Some((slot, state));
        }
    }
}
