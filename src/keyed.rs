//! `KeyedLimiter`: one bucket per key, in a lock-free map that bounds its
//! own memory and forgets idle keys by itself.
//!
//! # Eviction, and what runs when
//!
//! No background thread: housekeeping runs a little at a time on the
//! callers' threads, as moka does.
//!
//! - **Idle keys are forgotten losslessly.** A bucket whose state is idle
//!   (GCRA: `TAT <= now`, a full bucket) decides every future request
//!   exactly as a missing one does, so removing it changes nothing. The
//!   evictor claims the cell with a CAS to the tombstone; an update that
//!   meets the tombstone goes back to the map and starts a fresh bucket,
//!   so no update is ever applied to a cell being removed.
//! - **Every [`TICK`] of clock time**, the first `check` that notices it
//!   sweeps [`SWEEP_SLOTS`] slots of the table for idle keys (or, while the
//!   table is being resized, copies that many slots instead). Every other
//!   `check` pays one relaxed load of the next tick's time. After a
//!   burst of keys goes idle, a table of `S` slots is swept in
//!   `S / SWEEP_SLOTS` ticks of traffic, from any single user, and the map
//!   returns to within a few kilobytes of its baseline
//!   (`tests/map/memory.rs` measures it for a million idle `u64` keys).
//! - **When the table is mostly dead weight or far larger than the keys it
//!   holds need** (the thresholds are `compact_if_sparse`'s, in the source's
//!   `map::raw::migrate`), the sweep starts a migration to a table sized
//!   for those keys (`capacity_for` in `map::raw::table`), so memory
//!   follows the keys down as well as up. Inserts trigger the same
//!   migration when the table is full to its fill limit (`fill_limit`
//!   there), and each insert that meets a migration copies one chunk of it
//!   (`MIGRATION_CHUNK` slots, in `map::raw`).
//! - **On demand**, [`KeyedLimiter::evict_idle`] sweeps everything at once.
//! - **At `max_keys`**, a new key is admitted according to the
//!   [`OverflowPolicy`]; the default evicts (one bucket per new key), among
//!   the live keys on the lines the new key's lookup has just read (its
//!   home cache line and the next, `EVICTION_LINES` in `map::raw::evict`; never
//!   fewer than two keys when the table holds two), the bucket closest to full:
//!   it carries the least information, and under a flood of random keys it
//!   is one of the flood's own single-request keys, not a busy user's.
//!
//! # Memory given back
//!
//! Buckets and keys live inline in the table: an eviction frees nothing by
//! itself, it marks the slot dead, and the next migration leaves dead slots
//! behind. A retired table (with the keys of its dead slots) is freed by the
//! thread whose migration chunk retires it, as soon as that thread's pin
//! ends and no other thread's pin may hold the table, not at the next
//! housekeeping tick, so it is freed within a bounded number of checks even
//! on a clock that never moves. Dropping a limiter frees everything it
//! holds: at once if no other thread is inside an operation on any
//! turnstile limiter at that moment; otherwise within a bounded
//! number of operations of any thread on any limiter (every limiter retires to one
//! reclaimer, and a thread that is not inside an operation, however long
//! it sleeps, holds nothing back: see `map::pin`).
//!
//! # Progress
//!
//! Lookups and updates of existing keys take no lock and allocate nothing:
//! a CAS on a cell fails only because another update, an eviction or a
//! migration's copy succeeded. Every loop in the map is bounded (a probe
//! visits each slot of a table at most once, a slot changes state a
//! handful of times, a migration's successor always has a free slot for
//! each bucket it receives: see `map::raw`), except the waits below.
//!
//! - An insert claims its slot before it moves its key in, then publishes
//!   it: two steps with no allocation, no lock and no code of the key's in
//!   between. An insert, a copy or a migration that meets a slot in that
//!   state waits for those two steps (the slot may hold its own key); a
//!   lookup passes over it. So a thread the OS deschedules between them
//!   holds up only the inserts and copies whose probe crosses that one
//!   slot, until it runs again.
//! - A live bucket is copied into the successor by the migration chunk
//!   that holds its slot: its COPYING mark, then a few steps with no code
//!   of the key's (its hash was taken before the mark). A lookup or insert
//!   that meets its key COPYING waits for them. A copier the OS deschedules
//!   there holds up only the checks of that one key (and the end of that
//!   migration).
//! - At `max_keys`, a check that finds no room for its key waits for the
//!   inserts in flight among the keys that share its key's stripe (one of
//!   `STRIPES`, by hash, in `map::inflight`), then looks its key up again
//!   before the overflow policy acts: the key may be on its way in. Under
//!   `EvictFullest` only one request of a key, the one holding the key's
//!   claim on its stripe, evicts for it; the key's other first requests
//!   wait for that claim and then find the key. So one new key costs at
//!   most one eviction however many of its first requests race. These
//!   waits are for other threads' bounded steps, and a waiting check holds
//!   nothing they wait for; the argument, and what a slow `Clone` or `Eq`
//!   costs here, is in `map::bound`. (So a key's `Eq`, `ToOwned` and
//!   `Drop` must not check the limiter that holds the key: such a check
//!   could wait for the insert that runs it.)
//! - An insert that finds the new table of a migration already full to its
//!   fill limit,
//!   while the old table's last chunks are claimed by a thread that the OS
//!   has descheduled, yields until that thread finishes its chunk (at most
//!   `MIGRATION_CHUNK` slots). [`KeyedLimiter::evict_idle`] likewise waits
//!   for claimed chunks.
//! - At `max_keys` under [`OverflowPolicy::EvictFullest`], a new key takes
//!   over the place of the one bucket it evicts (no other thread can take
//!   that room), so each new key evicts at most one bucket. It is refused
//!   only if `ATTEMPTS` tries in a row (a constant of `map::bound`) find no
//!   bucket they can evict (each victim updated or evicted by another
//!   thread first, or the room held by inserts still in flight), or after
//!   waiting for `CLAIM_WAITS` admissions of other keys of its stripe; it
//!   yields between attempts. An eviction made for a key never evicts that
//!   key's own bucket: the request is decided on it instead.
//!
//! # Batches
//!
//! [`KeyedLimiter::check_batch`] and [`KeyedLimiter::check_batch_n`] decide
//! a slice of keys in one call: one clock read and one pin for the batch,
//! every key hashed and its home slot prefetched (`LANES` keys at a time,
//! in `keyed::batch`), then each key decided in slice order through the
//! same code as a single check while the home slot of the key
//! `PREFETCH_DISTANCE` places ahead is prefetched, so the keys' cache
//! misses overlap. Prefetches are
//! hints and change no state: the decisions are exactly those of checking
//! the keys one by one in order at the batch's reading (repeats charged in
//! order; inserts, idle eviction and `max_keys` as single checks do them).
//! The one refinement: an insert reads the clock again, as a single
//! check's does (see "Clocks and eviction"), and the keys after it are
//! decided at that later reading, so time never runs backwards within a
//! batch. Bad costs and mismatched lengths are a [`BatchError`] that
//! decides nothing.
//!
//! [`BatchError`]: crate::BatchError
//!
//! # Clocks and eviction
//!
//! A check reads the clock before it looks its key up; another thread with
//! a later reading may evict the key as idle in between (its bucket was
//! full at that reading). A check that then starts a fresh bucket reads the
//! clock again right before it publishes the new bucket, after the probe
//! that found the key absent, and decides at the later of its two
//! readings; if the key's chain changes in between, the publication fails
//! and the next attempt reads again. So the fresh bucket never starts
//! before the eviction's reading: eviction loses nothing however late the
//! first reading is. What remains is the clock's
//! own disagreement between threads (for [`QuantaClock`](crate::QuantaClock),
//! TSC skew between cores): a reading `d` behind the evictor's can admit
//! at most `d / T` more requests than the quota, once.

// check_batch: many keys per call, their cache misses overlapped.
mod batch;
// peek, reset, refund, set_quota and stats: the operations beside `check`.
mod ops;

use std::borrow::Borrow;
use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;

use crate::algorithms::{Algorithm, FromQuota, Gcra};
use crate::cell::{Cell, Charge, Gone, Outcome};
use crate::clock::{Clock, DefaultClock};
use crate::decision::Decision;
use crate::error::{CostError, QuotaError};
use crate::live::Live;
use crate::map::{Admitted, Full, Map, Pinned, Slot};
use crate::quota::Quota;
use crate::stats::{Counters, Event};
use crate::sync::{AtomicU64, Ordering};

/// Clock time between two housekeeping steps.
pub const TICK: std::time::Duration = std::time::Duration::from_millis(1);
/// [`TICK`] in the clock's nanoseconds, as the check compares it.
const TICK_NANOS: u64 = TICK.as_nanos() as u64;
/// How far beyond a check's reading the tick time may be before the check
/// takes it for a reading ahead of its own and pulls it back (see `tick`):
/// two ticks, so that a reading taken a little before another's (a thread
/// descheduled between its clock read and its check) is not mistaken for
/// one.
const AHEAD: u64 = 2 * TICK_NANOS;
/// Slots one housekeeping step sweeps (or copies): a few microseconds of
/// work, taken by one caller once per [`TICK`].
pub const SWEEP_SLOTS: usize = 256;
/// The most live keys compared to choose a victim when the limiter is full
/// (they are found on the lines a new key's lookup read: see
/// `evict_one_near`).
pub(crate) const OVERFLOW_SAMPLE: usize = 8;
/// The default bound on live keys. What it costs in memory (a table sized
/// by `capacity_for` in `map::raw::table`, each slot a key beside its 8-byte
/// cell) is measured in `BENCHMARKS.md`.
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// What a check did on its key's bucket, in a few words that stay in
/// registers: the CAS loop's outcome, the reading it was decided at, the
/// cell it landed on, and whether the overflow policy refused it. The
/// [`Decision`] is built from it at the end ([`decision`](Checked::decision)),
/// and a multi-limit check takes the admission from it
/// ([`charge`](Checked::charge)).
#[derive(Clone, Copy)]
pub(crate) struct Checked<'p> {
    outcome: Outcome,
    now: u64,
    /// The tracked bucket decided on; `None` for a request decided without
    /// one (untracked, or refused by the overflow policy).
    cell: Option<&'p Cell>,
    refused: bool,
}

impl<'p> Checked<'p> {
    /// The answer for a request of `cost` that `algorithm` decided.
    #[inline]
    pub(crate) fn decision(self, algorithm: &impl Algorithm, cost: u64) -> Decision {
        if self.refused {
            return self.refusal(algorithm, cost);
        }
        self.outcome.decision(algorithm, self.now, cost)
    }

    /// Out of line: a select between two decisions built the common one
    /// on the stack.
    #[cold]
    #[inline(never)]
    fn refusal(self, algorithm: &impl Algorithm, cost: u64) -> Decision {
        self.outcome.decision(algorithm, self.now, cost).refused()
    }

    /// The admission this check made on a tracked bucket, and its cell:
    /// what a multi-limit rollback takes out again.
    #[inline]
    pub(crate) fn charge(self) -> Option<(Charge, &'p Cell)> {
        self.outcome.charge(self.now).zip(self.cell)
    }
}

/// How `admit` dealt with a missing key.
enum Admission<'p, K> {
    /// Inserted, with this request decided on its fresh bucket (and the
    /// admission it made there, if it admitted), in this slot.
    Inserted(Decision, Option<Charge>, &'p Slot<K>),
    /// Another thread inserted it first: decide on its bucket.
    Found(&'p Slot<K>),
    /// The overflow policy keeps it out; decide at this reading.
    Refused(u64),
}

/// What a full limiter (at `max_keys` live keys, none idle) does with a key
/// it has not seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OverflowPolicy {
    /// Forget the bucket closest to full among the keys next to the new one
    /// in the table (see "Eviction" in the module docs), and admit
    /// the new key. Memory stays bounded under a flood of random keys while
    /// keys in real use keep their state. The forgotten key, if it comes
    /// back, starts with a full bucket: the one place where turnstile trades
    /// exactness for bounded memory.
    ///
    /// A forgotten bucket's slot is reclaimed by the next migration, and the
    /// retired table is freed once no pin may hold it, so a flood also holds
    /// the tables no thread may free yet: little while every thread runs,
    /// more when threads outnumber cores and one is descheduled in the
    /// middle of a check, which holds back the tables retired meanwhile
    /// until it runs again.
    #[default]
    EvictFullest,
    /// Deny new keys until room is made (fail closed).
    Deny,
    /// Allow new keys without tracking them (fail open): each such request
    /// is decided as the first of a full bucket.
    AllowUntracked,
}

/// One bucket per key: lock-free, bounded, self-evicting.
///
/// Keys live inline in the map's table, each beside its bucket's 8-byte
/// cell, so a lookup reads one cache line; the table has a quarter more
/// slots than keys to two and a half times as many (`capacity_for` and
/// `SLOTS_PER_KEY_AT_THE_BOUND` in the map's source). Small keys
/// (integers, IP addresses, tuples of them, `String`, whose text is on the
/// heap) suit it; for a key type of many bytes, key
/// the limiter by a `Box`, an `Arc` or a digest of it instead.
///
/// ```
/// use turnstile_rl::{KeyedLimiter, Quota};
///
/// let limiter = KeyedLimiter::<String>::new(Quota::per_minute(100)?);
/// // Lookups borrow: checking a `&str` allocates nothing for a known key.
/// assert!(limiter.check("user_42").is_allowed());
/// assert_eq!(limiter.check("user_42").remaining(), 98);
/// assert_eq!(limiter.check("user_7").remaining(), 99);
/// assert_eq!(limiter.len(), 2);
/// # Ok::<(), turnstile_rl::QuotaError>(())
/// ```
pub struct KeyedLimiter<K, C: Clock = DefaultClock, A: Algorithm = Gcra> {
    map: Map<K>,
    /// Read whole once per check, changed by `set_quota` (`crate::live`).
    algorithm: Live<A>,
    clock: C,
    max_keys: usize,
    overflow: OverflowPolicy,
    /// Clock time of the next housekeeping step.
    next_tick: AtomicU64,
    /// Evictions and overflows, counted on their own (cold) paths.
    counters: Counters,
}

impl<K> KeyedLimiter<K>
where
    K: Hash + Eq + Send + Sync + 'static,
{
    /// A GCRA limiter for `quota` per key, on the default clock, with
    /// [`DEFAULT_MAX_KEYS`] and [`OverflowPolicy::EvictFullest`].
    pub fn new(quota: Quota) -> Self {
        Self::builder(quota).build()
    }

    /// A builder to choose the clock, the bound and the overflow policy.
    pub fn builder(quota: Quota) -> KeyedLimiterBuilder<K> {
        KeyedLimiterBuilder {
            quota,
            algorithm: Gcra::new(&quota),
            clock: DefaultClock::new(),
            max_keys: DEFAULT_MAX_KEYS,
            overflow: OverflowPolicy::default(),
            hasher_seed: None,
            migration_chunk: None,
            keys: PhantomData,
        }
    }
}

impl<K, C, A> KeyedLimiter<K, C, A>
where
    K: Hash + Eq + Send + Sync + 'static,
    C: Clock,
    A: Algorithm,
{
    /// Decides one request of cost 1 for `key`.
    #[inline]
    pub fn check<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // Cost 1 is always valid: every algorithm's limit is at least 1.
        self.decide(key, 1, &self.algorithm.load())
    }

    /// Decides one request of cost `n` for `key`: all `n` tokens or none. An
    /// error, not a denial, when `n` is 0 or above the burst.
    #[inline]
    pub fn check_n<Q>(&self, key: &Q, n: u64) -> Result<Decision, CostError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let algorithm = self.algorithm.load();
        algorithm.check_cost(n)?;
        Ok(self.decide(key, n, &algorithm))
    }

    /// Keys currently tracked (live buckets; idle ones count until evicted).
    pub fn len(&self) -> usize {
        self.map.held()
    }

    /// Whether no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets every idle key now (they would decide exactly as missing
    /// keys do) and shrinks the table to fit. Returns how many were
    /// forgotten. Not needed for bounded memory: housekeeping does this a
    /// little at a time by itself.
    ///
    /// Every key idle when it starts and not checked meanwhile is gone when
    /// it returns, whatever inserts race it: it migrates the table whole,
    /// deciding every slot itself, so for a moment it holds a second table
    /// the size of the first (then shrinks to fit the keys left).
    pub fn evict_idle(&self) -> usize {
        let now = self.clock.now();
        let algorithm = self.algorithm.load();
        let idle = |state| algorithm.is_idle(state, now);
        let evicted = self.map.pin().evict_all(&idle);
        self.counters.add(Event::IdleEvictions, evicted as u64);
        evicted
    }

    /// Slots in the map's current table (for memory accounting).
    pub fn capacity(&self) -> usize {
        self.map.pin().capacity()
    }

    /// Asserts that the map's count of filled slots is exact: for the loom
    /// models, once every thread is joined.
    #[cfg(turnstile_loom)]
    #[doc(hidden)]
    pub fn assert_quiescent_accounting(&self) {
        self.map.pin().assert_quiescent_accounting();
    }

    /// The most keys this limiter tracks at once.
    pub fn max_keys(&self) -> usize {
        self.max_keys
    }

    /// The clock this limiter reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The algorithm this limiter runs now, a copy: a quota change
    /// replaces it (for a GCRA limiter, [`Gcra::quota`] gives its quota
    /// back).
    pub fn algorithm(&self) -> A {
        self.algorithm.load()
    }

    /// A number that moves whenever the quota changes (0 until the first
    /// [`set_quota`](KeyedLimiter::set_quota)): what the HTTP layer
    /// compares to know its `RateLimit-Policy` is current.
    pub fn quota_version(&self) -> u64 {
        self.algorithm.version()
    }

    /// Decides at `algorithm`: the limiter's own, read once for the whole
    /// check, a per-call GCRA quota (`check_with`), or the last limit's
    /// of a multi-limit check. Housekeeping judges idleness by it too: for
    /// GCRA that is `TAT <= now` whatever the quota, and a window limiter's
    /// algorithm is never replaced.
    #[inline]
    pub(crate) fn decide<Q, D>(&self, key: &Q, cost: u64, algorithm: &D) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        D: Algorithm,
    {
        let hash = self.map.hash(key);
        let map = self.map.pin();
        // The admission record is dropped: inlined, it costs nothing.
        self.check_pinned(&map, hash, key, cost, algorithm)
            .decision(algorithm, cost)
    }

    /// This limiter's map, pinned: a multi-limit check holds it from its
    /// first charge to its last rollback, so the slots its charges landed
    /// on are not freed (nor reused for other buckets) in between.
    pub(crate) fn pin(&self) -> Pinned<'_, K> {
        self.map.pin()
    }

    /// A check of cost `n` at the quota `gcra` (`n` already checked against
    /// it) for `key`, on `map` (this limiter's, pinned by the caller), that
    /// also reports the admission it made and the cell it made it on: one
    /// limit's charge of a multi-limit check, which holds the pin until its
    /// rollbacks are done (see `crate::multi`). The same path as `check`.
    #[inline]
    pub(crate) fn charge<'p, Q>(
        &self,
        map: &'p Pinned<'_, K>,
        gcra: &Gcra,
        key: &Q,
        n: u64,
    ) -> (Decision, Option<(Charge, &'p Cell)>)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let checked = self.check_pinned(map, self.map.hash(key), key, n, gcra);
        (checked.decision(gcra, n), checked.charge())
    }

    /// The one check path, for every single check and each limit of a
    /// multi-limit check: looks `key` (whose hash is `hash`) up in `map`,
    /// reads the clock, runs a housekeeping step if one is due, and decides
    /// the request on the key's bucket (inserting it if absent).
    ///
    /// Always inlined, with `decide_found`: what it returns then stays in
    /// registers, and the parts the caller drops are never built. Called
    /// out of line (as a multi-limit check's second call site made it),
    /// the charge record went through the stack and was read back wider
    /// than it was written, a failed store forwarding that cost a
    /// one-limit multi-limit check a third of its time (BENCHMARKS.md).
    #[inline(always)]
    fn check_pinned<'p, Q, D>(
        &self,
        map: &'p Pinned<'_, K>,
        hash: u64,
        key: &Q,
        cost: u64,
        algorithm: &D,
    ) -> Checked<'p>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        D: Algorithm,
    {
        let found = map.find(hash, key);
        // The clock is read after the lookup, not before: a clock read
        // behind the previous check's CAS (a locked instruction) waits for
        // it, and the lookup behind the clock read then cannot overlap the
        // previous check's cache miss. At a million keys that serialized
        // every miss (BENCHMARKS.md, "The clock read after the lookup").
        let mut now = self.clock.now();
        let idle = move |state| algorithm.is_idle(state, now);
        self.tick(map, now, &idle);
        self.decide_found(map, hash, key, found, &mut now, cost, algorithm, &idle)
    }

    /// Runs a housekeeping step if one is due at `now`: what every check
    /// does first.
    ///
    /// Due when `now` reaches the tick time, or when the tick time is more
    /// than [`AHEAD`] beyond `now`: each step sets it a tick past its own
    /// reading, so only a reading ahead of this one (a clock that jumped
    /// back, another core's skewed counter, one bad read) can have put it
    /// there. Without the second test, one reading an hour ahead stopped
    /// housekeeping for an hour. With it, such a reading
    /// postpones housekeeping by at most `AHEAD`, and costs one extra step
    /// when the other readings pull the tick time back: not a step per
    /// check, since the step sets the tick time from the reading that
    /// pulled it back.
    #[inline]
    fn tick(&self, map: &Pinned<'_, K>, now: u64, idle: &impl Fn(u64) -> bool) {
        // Relaxed: the tick time guards no other data; a stale read only
        // delays or repeats a housekeeping step, and the CAS picks one caller.
        let due = self.next_tick.load(Ordering::Relaxed);
        if now >= due || due - now > AHEAD {
            self.housekeep(map, due, now, idle);
        }
    }

    /// Decides one request for `key` after its first lookup, which found
    /// `found`: a live bucket is updated in place; an absent key is
    /// inserted (`admit`) or refused; a bucket evicted or moved since the
    /// lookup is looked up again. Reports the admission it made on a
    /// tracked bucket, and the cell, for a multi-limit rollback.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn decide_found<'p, Q, D>(
        &self,
        map: &'p Pinned<'_, K>,
        hash: u64,
        key: &Q,
        mut found: Option<&'p Slot<K>>,
        now: &mut u64,
        cost: u64,
        algorithm: &D,
        idle: &impl Fn(u64) -> bool,
    ) -> Checked<'p>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        D: Algorithm,
    {
        loop {
            let slot = match found {
                Some(slot) => slot,
                None => match self.admit(map, hash, key, now, cost, algorithm, idle) {
                    // Decided on the fresh state 0 at `*now`, the reading
                    // `admit` leaves there; the decision is made again from
                    // the outcome, as on every path, by the same pure
                    // function.
                    Admission::Inserted(decided, charge, slot) => {
                        let outcome = Outcome::new(0, charge.map(|c| c.after));
                        let now = charge.map_or(*now, |c| c.now);
                        debug_assert_eq!(outcome.decision(algorithm, now, cost), decided);
                        return Checked {
                            outcome,
                            now,
                            cell: Some(&slot.cell),
                            refused: false,
                        };
                    }
                    Admission::Found(slot) => slot,
                    // Untracked or refused: nothing was charged.
                    Admission::Refused(now) => {
                        let refused = self.overflow_refuses();
                        let fresh = algorithm.admit(0, now, cost);
                        return Checked {
                            outcome: Outcome::new(0, fresh),
                            now,
                            cell: None,
                            refused,
                        };
                    }
                },
            };
            match slot.cell.update(algorithm, *now, cost) {
                Ok(outcome) => {
                    return Checked {
                        outcome,
                        now: *now,
                        cell: Some(&slot.cell),
                        refused: false,
                    }
                }
                // Evicted under our feet: the key is absent now; look again.
                Err(Gone::Dead) => {
                    probe!(UPDATE_MET_TOMBSTONE);
                }
                // Frozen by a migration: look again, and the lookup finds
                // the bucket in the successor (copying it there if needed).
                Err(Gone::Moved) => {}
            }
            found = map.find(hash, key);
        }
    }

    /// Finds room for a key that is not in the map, and inserts it with
    /// this request already decided on its fresh bucket (the rules at the
    /// bound are `map::bound`'s).
    ///
    /// The fresh bucket is decided at a clock reading taken right before
    /// the bucket is published, after the probe that found the key absent:
    /// `now` was read before the lookup, and the key may have been evicted
    /// since by a thread with a later reading (its bucket was full at that
    /// reading). Deciding at the older `now` would start the fresh bucket in
    /// the past and admit more than the quota allows. That reading is left
    /// in `now`, so a batch decides its next keys at it.
    #[cold]
    #[allow(clippy::too_many_arguments)]
    fn admit<'p, Q, D>(
        &self,
        map: &'p Pinned<'_, K>,
        hash: u64,
        key: &Q,
        now: &mut u64,
        cost: u64,
        algorithm: &D,
        idle: &impl Fn(u64) -> bool,
    ) -> Admission<'p, K>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        D: Algorithm,
    {
        let full = match self.overflow {
            OverflowPolicy::EvictFullest => Full::Evict {
                sample: OVERFLOW_SAMPLE,
            },
            OverflowPolicy::Deny | OverflowPolicy::AllowUntracked => Full::Refuse,
        };
        let mut decided = None;
        let fresh_state = || {
            *now = (*now).max(self.clock.now());
            let now = *now;
            let step = algorithm.decide(0, now, cost);
            let charge = step.next.map(|after| Charge { now, after });
            decided = Some((step.decision, charge));
            step.next.unwrap_or(0)
        };
        let (admitted, evicted) = map.admit(
            hash,
            key,
            || key.to_owned(),
            fresh_state,
            idle,
            self.max_keys,
            full,
        );
        if evicted {
            self.counters.add(Event::OverflowEviction, 1);
        }
        match (admitted, decided) {
            (Admitted::Inserted(slot), Some((decision, charge))) => {
                Admission::Inserted(decision, charge, slot)
            }
            (Admitted::Inserted(slot) | Admitted::Found(slot), _) => Admission::Found(slot),
            (Admitted::Refused, _) => Admission::Refused(*now),
        }
    }

    /// Counts a request the overflow policy kept out of the map, and says
    /// whether it is refused (otherwise it is decided as the first of a
    /// full bucket, untracked).
    #[cold]
    fn overflow_refuses(&self) -> bool {
        match self.overflow {
            OverflowPolicy::AllowUntracked => {
                self.counters.add(Event::OverflowUntracked, 1);
                false
            }
            OverflowPolicy::EvictFullest | OverflowPolicy::Deny => {
                self.counters.add(Event::OverflowRefusal, 1);
                true
            }
        }
    }

    #[cold]
    fn housekeep(&self, map: &Pinned<'_, K>, due: u64, now: u64, idle: &impl Fn(u64) -> bool) {
        if self
            .next_tick
            .compare_exchange(
                due,
                now.saturating_add(TICK_NANOS),
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_ok()
        {
            let evicted = map.maintain(SWEEP_SLOTS, idle);
            self.counters.add(Event::IdleEvictions, evicted as u64);
        }
    }
}

impl<K, C> KeyedLimiter<K, C, Gcra>
where
    K: Hash + Eq + Send + Sync + 'static,
    C: Clock,
{
    /// Decides one request for `key` under `quota` instead of the limiter's
    /// own: for tiered plans, where each caller's quota comes with its key.
    ///
    /// Keep one quota per key: the state is a GCRA arrival time, which each
    /// quota reads in its own terms (switching a key to a larger quota
    /// carries its backlog over, which is what an upgrade should do).
    ///
    /// ```
    /// use turnstile_rl::{KeyedLimiter, Quota};
    ///
    /// let free: Quota = "10/min".parse()?;
    /// let gold: Quota = "1000/min".parse()?;
    /// let limiter = KeyedLimiter::<String>::new(free);
    /// assert_eq!(limiter.check_with("gold-customer", &gold).remaining(), 999);
    /// assert_eq!(limiter.check("free-customer").remaining(), 9);
    /// # Ok::<(), turnstile_rl::QuotaError>(())
    /// ```
    #[inline]
    pub fn check_with<Q>(&self, key: &Q, quota: &Quota) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // Cost 1 is within every quota's burst.
        self.decide(key, 1, &Gcra::new(quota))
    }

    /// [`check_with`](KeyedLimiter::check_with) for a request of cost `n`:
    /// an error, not a denial, when `n` is 0 or above that quota's burst.
    pub fn check_n_with<Q>(&self, key: &Q, quota: &Quota, n: u64) -> Result<Decision, CostError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let gcra = Gcra::new(quota);
        gcra.check_cost(n)?;
        Ok(self.decide(key, n, &gcra))
    }
}

impl<K, C: Clock, A: Algorithm + fmt::Debug> fmt::Debug for KeyedLimiter<K, C, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedLimiter")
            .field("algorithm", &self.algorithm)
            .field("map", &self.map)
            .field("max_keys", &self.max_keys)
            .field("overflow", &self.overflow)
            .finish_non_exhaustive()
    }
}

/// Builds a [`KeyedLimiter`]: `KeyedLimiter::builder(quota)`.
pub struct KeyedLimiterBuilder<K, C = DefaultClock, A = Gcra> {
    /// The quota given to `builder`, kept for
    /// [`algorithm_for`](KeyedLimiterBuilder::algorithm_for).
    quota: Quota,
    algorithm: A,
    clock: C,
    max_keys: usize,
    overflow: OverflowPolicy,
    hasher_seed: Option<u64>,
    migration_chunk: Option<usize>,
    keys: PhantomData<fn() -> K>,
}

impl<K, C, A> KeyedLimiterBuilder<K, C, A>
where
    K: Hash + Eq + Send + Sync + 'static,
    C: Clock,
    A: Algorithm,
{
    /// Reads time from `clock` (a [`ManualClock`](crate::ManualClock) in tests).
    pub fn clock<C2: Clock>(self, clock: C2) -> KeyedLimiterBuilder<K, C2, A> {
        KeyedLimiterBuilder {
            quota: self.quota,
            algorithm: self.algorithm,
            clock,
            max_keys: self.max_keys,
            overflow: self.overflow,
            hasher_seed: self.hasher_seed,
            migration_chunk: self.migration_chunk,
            keys: PhantomData,
        }
    }

    /// Runs the algorithm `A2` configured by the builder's quota instead of
    /// the quota's GCRA; [`QuotaError::DoesNotFit`] when `A2` cannot hold
    /// the quota (a window's limit or period out of its bounds).
    ///
    /// ```
    /// use turnstile_rl::algorithms::{FixedWindow, SlidingWindow};
    /// use turnstile_rl::{KeyedLimiter, Quota, QuotaError};
    ///
    /// let limiter = KeyedLimiter::<String>::builder("100/min".parse()?)
    ///     .algorithm_for::<FixedWindow>()?
    ///     .max_keys(10_000)
    ///     .build();
    /// assert!(limiter.check("alice").is_allowed());
    ///
    /// // A sliding window counts at most 65,534 requests per window.
    /// let huge = Quota::per_minute(SlidingWindow::MAX_LIMIT + 1)?;
    /// let refused = KeyedLimiter::<String>::builder(huge).algorithm_for::<SlidingWindow>();
    /// assert!(matches!(refused, Err(QuotaError::DoesNotFit { .. })));
    /// # Ok::<(), QuotaError>(())
    /// ```
    pub fn algorithm_for<A2: FromQuota>(self) -> Result<KeyedLimiterBuilder<K, C, A2>, QuotaError> {
        let algorithm = A2::from_quota(&self.quota)?;
        Ok(self.algorithm(algorithm))
    }

    /// Runs `algorithm` (for example a
    /// [`FixedWindow`](crate::algorithms::FixedWindow) built for another
    /// quota) instead of the quota's GCRA; see
    /// [`algorithm_for`](KeyedLimiterBuilder::algorithm_for) to build it
    /// from the builder's own quota.
    pub fn algorithm<A2: Algorithm>(self, algorithm: A2) -> KeyedLimiterBuilder<K, C, A2> {
        KeyedLimiterBuilder {
            quota: self.quota,
            algorithm,
            clock: self.clock,
            max_keys: self.max_keys,
            overflow: self.overflow,
            hasher_seed: self.hasher_seed,
            migration_chunk: self.migration_chunk,
            keys: PhantomData,
        }
    }

    /// Tracks at most `max_keys` keys at once (at least 1: a limiter must
    /// hold the key it is deciding, so 0 is taken as 1).
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys.max(1);
        self
    }

    /// What to do with a new key when `max_keys` are tracked.
    pub fn overflow(mut self, policy: OverflowPolicy) -> Self {
        self.overflow = policy;
        self
    }

    /// For tests only: hash keys with fixed keys from `seed` instead of
    /// random ones, so that two limiters fed the same requests choose the
    /// same eviction victims and decide alike (the batch model test and
    /// fuzz target compare `check_batch` with one-by-one checks this way).
    /// Never in production: fixed keys let an attacker aim keys at one
    /// probe chain. (Reached through `__private::HasherSeed`.)
    pub(crate) fn with_hasher_seed(mut self, seed: u64) -> Self {
        self.hasher_seed = Some(seed);
        self
    }

    /// For tests only: migrations copy `chunk` slots at a time instead of
    /// `MIGRATION_CHUNK` (in `map::raw`), so the map's stress tests also
    /// run at the chunk size loom's models use. (Reached through
    /// `__private::MigrationChunk`.)
    pub(crate) fn with_migration_chunk(mut self, chunk: usize) -> Self {
        self.migration_chunk = Some(chunk);
        self
    }

    /// The limiter.
    pub fn build(self) -> KeyedLimiter<K, C, A> {
        let map = match self.hasher_seed {
            None => Map::new(self.max_keys),
            Some(seed) => Map::seeded(seed, self.max_keys),
        };
        KeyedLimiter {
            map: match self.migration_chunk {
                None => map,
                Some(chunk) => map.with_migration_chunk(chunk),
            },
            algorithm: Live::new(self.algorithm),
            clock: self.clock,
            max_keys: self.max_keys,
            overflow: self.overflow,
            next_tick: AtomicU64::new(TICK_NANOS),
            counters: Counters::default(),
        }
    }
}

impl<K, C: fmt::Debug, A: fmt::Debug> fmt::Debug for KeyedLimiterBuilder<K, C, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedLimiterBuilder")
            .field("algorithm", &self.algorithm)
            .field("clock", &self.clock)
            .field("max_keys", &self.max_keys)
            .field("overflow", &self.overflow)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use std::time::Duration;

    #[test]
    fn a_window_built_from_the_builders_quota_decides_like_one_given_by_value() {
        use crate::algorithms::FixedWindow;
        // "burst 7" is ignored by a window: both take 5 per 2 s.
        let quota: Quota = "5/2s burst 7".parse().unwrap();
        let clock = ManualClock::new();
        let by_name = KeyedLimiter::<u32>::builder(quota)
            .clock(clock.clone())
            .algorithm_for::<FixedWindow>()
            .unwrap()
            .build();
        let by_value = KeyedLimiter::<u32>::builder(quota)
            .clock(clock.clone())
            .algorithm(FixedWindow::new(&quota).unwrap())
            .build();
        for step_ms in [0, 300, 900, 1_700, 2_100, 3_999, 4_000] {
            clock.set(Duration::from_millis(step_ms));
            for key in 0..3 {
                for _ in 0..3 {
                    assert_eq!(by_name.check(&key), by_value.check(&key), "{step_ms} ms");
                }
            }
        }
    }

    #[test]
    fn a_quota_above_a_windows_limit_is_a_typed_error_not_a_panic() {
        use crate::algorithms::{FixedWindow, SlidingWindow};
        let huge = Quota::per_hour(FixedWindow::MAX_LIMIT + 1).unwrap();
        let err = KeyedLimiter::<u32>::builder(huge)
            .algorithm_for::<FixedWindow>()
            .unwrap_err();
        assert!(
            matches!(
                err,
                QuotaError::DoesNotFit {
                    algorithm: "fixed window",
                    ..
                }
            ),
            "{err}"
        );
        let at_the_limit = Quota::per_hour(FixedWindow::MAX_LIMIT).unwrap();
        assert!(KeyedLimiter::<u32>::builder(at_the_limit)
            .algorithm_for::<FixedWindow>()
            .is_ok());
        let err = KeyedLimiter::<u32>::builder(huge)
            .algorithm_for::<SlidingWindow>()
            .unwrap_err();
        assert!(
            matches!(
                err,
                QuotaError::DoesNotFit {
                    algorithm: "sliding window",
                    ..
                }
            ),
            "{err}"
        );
        // GCRA holds every quota.
        assert!(KeyedLimiter::<u32>::builder(huge)
            .algorithm_for::<Gcra>()
            .is_ok());
    }

    fn limiter<K: Hash + Eq + Send + Sync + 'static>(
        quota: &str,
    ) -> (KeyedLimiter<K, ManualClock>, ManualClock) {
        let clock = ManualClock::new();
        let limiter = KeyedLimiter::builder(quota.parse().unwrap())
            .clock(clock.clone())
            .build();
        (limiter, clock)
    }

    #[test]
    fn each_key_has_its_own_bucket() {
        let (limiter, clock) = limiter::<u64>("2/s burst 5");
        for key in 0..100u64 {
            let admitted = (0..7).filter(|_| limiter.check(&key).is_allowed()).count();
            assert_eq!(admitted, 5, "key {key}");
        }
        assert_eq!(limiter.len(), 100);
        clock.advance(Duration::from_millis(1_100));
        let admitted = (0..3).filter(|_| limiter.check(&7).is_allowed()).count();
        assert_eq!(admitted, 2);
    }

    #[test]
    fn string_keys_are_looked_up_by_str() {
        let (limiter, _) = limiter::<String>("3/min");
        assert_eq!(limiter.check("user_42").remaining(), 2);
        assert_eq!(limiter.check(&"user_42".to_string()).remaining(), 1);
        assert_eq!(limiter.check("user_42").remaining(), 0);
        assert!(limiter.check("user_42").is_denied());
        assert!(limiter.check("").is_allowed());
        assert_eq!(limiter.len(), 2);
    }

    #[test]
    fn tuple_and_ip_keys() {
        use std::net::{IpAddr, Ipv4Addr};
        let (by_route, _) = limiter::<(&'static str, u32)>("1/s");
        assert!(by_route.check(&("/login", 7)).is_allowed());
        assert!(by_route.check(&("/login", 7)).is_denied());
        assert!(by_route.check(&("/api", 7)).is_allowed());
        let (by_ip, _) = limiter::<IpAddr>("1/s");
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        assert!(by_ip.check(&ip).is_allowed());
        assert!(by_ip.check(&ip).is_denied());
    }

    #[test]
    fn cost_errors_and_per_call_quotas() {
        let (limiter, _) = limiter::<u64>("10/s");
        assert_eq!(limiter.check_n(&1, 0), Err(CostError::Zero));
        assert_eq!(
            limiter.check_n(&1, 11),
            Err(CostError::ExceedsCapacity {
                cost: 11,
                capacity: 10
            })
        );
        assert_eq!(limiter.len(), 0, "an error changes nothing");
        let gold: Quota = "100/s".parse().unwrap();
        assert_eq!(limiter.check_n_with(&1, &gold, 50).unwrap().remaining(), 50);
        assert_eq!(limiter.check_with(&1, &gold).remaining(), 49);
        assert!(limiter.check_n_with(&2, &gold, 101).is_err());
    }

    #[test]
    fn growth_keeps_every_bucket() {
        let (limiter, _) = limiter::<u64>("1/min");
        for key in 0..50_000u64 {
            assert!(limiter.check(&key).is_allowed());
        }
        for key in 0..50_000u64 {
            assert!(
                limiter.check(&key).is_denied(),
                "key {key} forgot its state"
            );
        }
        assert_eq!(limiter.len(), 50_000);
        // Grown: a table is at most four fifths full.
        assert!(limiter.capacity() >= 50_000 * 5 / 4);
    }

    #[test]
    fn evict_idle_is_lossless_and_shrinks() {
        let (limiter, clock) = limiter::<u64>("1/s burst 2");
        for key in 0..10_000u64 {
            let _ = limiter.check(&key);
        }
        let grown = limiter.capacity();
        // Key 0 stays busy; everyone else goes idle at their TAT, 1 s.
        clock.set(Duration::from_secs(1));
        assert_eq!(limiter.check(&0).remaining(), 1);
        assert_eq!(limiter.check(&0).remaining(), 0);
        // Housekeeping may have swept a few already; evict_idle takes the rest.
        let before = limiter.len();
        assert!(before > 1);
        assert_eq!(limiter.evict_idle(), before - 1);
        assert_eq!(limiter.len(), 1);
        assert!(
            limiter.capacity() < grown / 100,
            "{} vs {grown}",
            limiter.capacity()
        );
        assert!(limiter.check(&0).is_denied(), "the busy key kept its state");
        assert_eq!(
            limiter.check(&1).remaining(),
            1,
            "an evicted key is a full one"
        );
    }

    #[test]
    fn idle_keys_go_away_without_being_asked() {
        let (limiter, clock) = limiter::<u64>("10/s");
        for key in 0..100_000u64 {
            let _ = limiter.check(&key);
        }
        let grown = limiter.capacity();
        clock.advance(Duration::from_secs(1));
        // Traffic from one user: each tick of clock time, a bit of housekeeping.
        let mut checks = 0;
        while limiter.len() > 1 || limiter.capacity() > 64 {
            clock.advance(TICK);
            let _ = limiter.check(&u64::MAX);
            checks += 1;
            assert!(
                checks < 100_000,
                "len {} capacity {} {:?}",
                limiter.len(),
                limiter.capacity(),
                limiter.map
            );
        }
        assert!(
            limiter.capacity() <= 64,
            "{grown} slots shrank to {}",
            limiter.capacity()
        );
    }

    #[test]
    fn overflow_policies() {
        let clock = ManualClock::new();
        let quota: Quota = "1/min".parse().unwrap();
        let deny = KeyedLimiter::builder(quota)
            .clock(clock.clone())
            .max_keys(2)
            .overflow(OverflowPolicy::Deny)
            .build();
        assert!(deny.check(&1u64).is_allowed());
        assert!(deny.check(&2).is_allowed());
        let refused = deny.check(&3);
        assert!(refused.is_denied());
        assert_eq!(refused.retry_after(), Some(Duration::from_secs(60)));
        assert_eq!(deny.len(), 2);

        let open = KeyedLimiter::builder(quota)
            .clock(clock.clone())
            .max_keys(1)
            .overflow(OverflowPolicy::AllowUntracked)
            .build();
        assert!(open.check(&1u64).is_allowed());
        assert!(open.check(&2).is_allowed());
        assert!(open.check(&2).is_allowed(), "untracked: never remembered");
        assert_eq!(open.len(), 1);

        let evict = KeyedLimiter::builder(quota)
            .clock(clock)
            .max_keys(1)
            .build();
        assert!(evict.check(&1u64).is_allowed());
        assert!(evict.check(&2).is_allowed());
        assert_eq!(evict.len(), 1);
        assert!(evict.check(&2).is_denied(), "the newcomer is tracked");
    }

    /// Many threads, a frozen clock, many keys each hit far past its burst:
    /// every key admits exactly its burst, and the CAS loop really raced.
    #[test]
    fn stress_exact_burst_under_contention() {
        const THREADS: usize = 4;
        const KEYS: u64 = 2_000;
        const BURST: u64 = 50;
        let retries = crate::cell::cas_retries;
        let before = retries();
        // Collisions need two threads on one cell at once, which the OS
        // scheduler decides; rounds repeat (each one exact) until one raced.
        for round in 0.. {
            let limiter = KeyedLimiter::builder(Quota::per_hour(1).unwrap().burst(BURST).unwrap())
                .clock(ManualClock::new())
                .build();
            let start = std::sync::Barrier::new(THREADS);
            let admitted: Vec<Vec<u64>> = std::thread::scope(|s| {
                let workers: Vec<_> = (0..THREADS)
                    .map(|_| {
                        let (limiter, start) = (&limiter, &start);
                        s.spawn(move || {
                            let mut admitted = vec![0u64; KEYS as usize];
                            start.wait();
                            // Every thread walks the keys in the same order,
                            // so they meet on the same cells (and on the
                            // same inserts and migrations).
                            for _ in 0..BURST * 2 {
                                for key in 0..KEYS {
                                    if limiter.check(&key).is_allowed() {
                                        admitted[key as usize] += 1;
                                    }
                                }
                            }
                            admitted
                        })
                    })
                    .collect();
                workers.into_iter().map(|w| w.join().unwrap()).collect()
            });
            for key in 0..KEYS as usize {
                let total: u64 = admitted.iter().map(|a| a[key]).sum();
                assert_eq!(total, BURST, "key {key} in round {round}");
            }
            assert_eq!(limiter.len(), KEYS as usize);
            if retries() > before {
                break;
            }
            assert!(
                round < 50,
                "50 rounds and the threads never collided on a cell"
            );
        }
    }
}

#[cfg(test)]
mod bounds {
    /// Shared by `&` or `Arc` across threads: a compile-time check.
    #[test]
    fn limiters_are_send_and_sync() {
        fn shareable<T: Send + Sync>() {}
        shareable::<super::KeyedLimiter<String>>();
        shareable::<super::KeyedLimiter<u64, crate::clock::ManualClock>>();
    }
}
