//! Groups `keyed/...`: one bucket per key, turnstile against its peers in
//! the same group, so every ratio comes from one run.
//!
//! Subjects (every one on a quanta clock, as turnstile's default is):
//!
//! - `turnstile`: `KeyedLimiter<K>` from `KeyedLimiter::new` (default
//!   `max_keys` of 1,000,000, ahash inside);
//! - `governor (DashMap, std hasher)`: `governor::RateLimiter::keyed`, its
//!   default store (a `DashMap` with `std::hash::RandomState`, SipHash-1-3);
//! - `governor (DashMap, ahash)`: `RateLimiter::dashmap_with_hasher` with
//!   `ahash::RandomState`, the same hasher turnstile uses: the fair peer,
//!   and the denominator of the ratios in `BENCHMARKS.md`;
//! - `DashMap + turnstile GCRA cell`: an off-the-shelf concurrent map
//!   (`DashMap<K, AtomicU64>`, ahash) holding turnstile's own cell, updated
//!   by the same CAS loop around [`turnstile_rl::Gcra::check`]: what our own
//!   map buys over a general-purpose one;
//! - `seed (Mutex<HashMap>)`: the seeds' `SeedTokenBucket`, one lock around
//!   one std `HashMap`;
//! - `floor (pre-sized table, hash + probe + CAS)`: the physical floor of a
//!   keyed check, a table built and sized before timing (no growth, no
//!   eviction, no reclamation), holding each key beside its `AtomicU64`:
//!   one ahash, a linear probe, the quanta clock read and one CAS (a load
//!   when the mode is `denied`).
//!
//! Workloads (the keys are random and generated before anything is timed):
//!
//! - `u64 1 hot key`, `u64 1000 keys`, `u64 1000000 keys`, `String16 1000
//!   keys` (16-byte strings; turnstile and the seed look them up as `&str`
//!   through `Borrow`, governor only takes `&String`): uniform. Every
//!   subject checks each key once first (so every bucket exists before
//!   timing), then the timed loop walks a shuffled copy of the keys, so the
//!   access order is not the insertion order (which would hand a
//!   map that allocates its entries one by one a prefetch-friendly walk).
//! - `u64 zipf(1.0) over 1000000 keys`: every key is inserted first, then
//!   the walk is 1,000,000 draws from Zipf(s = 1) over the keys (rank `r`
//!   drawn with probability proportional to `1/r`; the hottest key takes
//!   about 7% of the traffic), the skew real user traffic has.
//! - `u64 churn (every check a new key)`: a flood of spoofed source
//!   addresses. Nothing is warmed; each check's key is a SplitMix64 mix of
//!   the thread and a counter, computed in the loop (a few arithmetic
//!   instructions, the same for every subject) because no pre-generated
//!   list outlasts criterion's iteration counts. turnstile holds at most its
//!   default 1,000,000 keys and evicts on overflow; governor and the seed
//!   grow without bound (neither evicts by itself), so their figures are
//!   those of maps still growing. No floor: a pre-sized table has nothing
//!   to measure here.
//!
//! Modes:
//!
//! - `allowed`: quota 1 per 15 s with a burst of 1,000,000,000 (T = 15 s,
//!   tau = 475 years, near the most a `u64` of nanoseconds holds): every
//!   check is allowed (no key is checked 1e9 times) and pushes its key's
//!   arrival time 15 s ahead, so no bucket goes idle during warming (a
//!   million inserts take a second or two on a busy machine) or the run,
//!   and every subject does a lookup plus an admitting update. The
//!   extra subject `turnstile (1e9/s: idle keys evicted)` in the uniform
//!   1,000,000-key groups runs a 1e9/s quota instead, under which a key is
//!   idle a nanosecond after its check: housekeeping then sweeps those keys
//!   out as the walk goes and the walk re-inserts them, the churn a real
//!   quota sees on idle users.
//! - `denied`: quota 1 per hour, burst 1; the warming check takes each
//!   key's one token, so every timed check is a denial (a lookup, a clock
//!   read and a load: no write), the path under attack.
//!
//! Threads: `1 thread` times one check with `Bencher::iter`; `N threads`
//! (`available_parallelism`) uses `iter_custom`: each thread waits on a
//! barrier, runs `iters` checks from its own starting point in the walk,
//! and returns its own elapsed time; the sample is the slowest thread's. So
//! the reported time is **wall time per check as each thread sees it while
//! all run at once**, and the group's throughput is declared as
//! `Elements(threads)`, so criterion's `elem/s` is the aggregate checks per
//! second. Spawning the threads is outside the timed region.

use std::hash::{BuildHasher, Hash};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput};
use dashmap::DashMap;
use governor::clock::DefaultClock as GovernorClock;
use governor::state::keyed::DashMapStateStore;
use turnstile_rl::algorithms::Step;
use turnstile_rl::{Clock, Gcra, KeyedLimiter, QuantaClock, Quota};
use turnstile_test_kit::reference::SeedTokenBucket;

use crate::mode::Mode;

use keys::SplitMix;
use turnstile_test_kit::keys;

/// The burst of the `allowed` mode: more checks than any key gets in a run.
const BURST: u32 = 1_000_000_000;

/// The emission interval of the `allowed` mode: long enough that no key
/// goes idle while a million others are warmed.
const INTERVAL: Duration = Duration::from_secs(15);

/// This module's quotas for each [`Mode`].
pub(crate) trait Setup {
    fn quota(self) -> Quota;
    fn governor(self) -> governor::Quota;
    fn seed<K: Hash + Eq>(self) -> SeedTokenBucket<K>;
}

impl Setup for Mode {
    /// Allowed: 1 per [`INTERVAL`], burst [`BURST`]. Denied: 1 per hour,
    /// burst 1.
    fn quota(self) -> Quota {
        match self {
            Mode::Allowed => Quota::with_period(INTERVAL).and_then(|q| q.burst(u64::from(BURST))),
            Mode::Denied => Quota::per_hour(1),
        }
        .expect("a valid quota")
    }

    /// governor's quota, the same as [`Mode::quota`].
    fn governor(self) -> governor::Quota {
        match self {
            Mode::Allowed => {
                let burst = NonZeroU32::new(BURST).expect("non-zero");
                governor::Quota::with_period(INTERVAL)
                    .expect("a non-zero period")
                    .allow_burst(burst)
            }
            Mode::Denied => governor::Quota::per_hour(NonZeroU32::MIN),
        }
    }

    /// The seeds' bucket with the same capacity and rate.
    fn seed<K: Hash + Eq>(self) -> SeedTokenBucket<K> {
        let (capacity, rate) = match self {
            Mode::Allowed => (f64::from(BURST), 1.0 / INTERVAL.as_secs_f64()),
            Mode::Denied => (1.0, 1.0 / 3600.0),
        };
        SeedTokenBucket::new(capacity, rate).expect("a valid capacity and rate")
    }
}

/// A 1e9/s quota with a burst of 1e9: keys go idle a nanosecond after use.
fn idle_quota() -> Quota {
    Quota::per_second(1_000_000_000)
        .and_then(|q| q.burst(1_000_000_000))
        .expect("a valid quota")
}

/// governor's keyed limiter on a `DashMap` with hasher `S`.
pub(crate) type Governor<K, S> = governor::RateLimiter<K, DashMapStateStore<K, S>, GovernorClock>;

/// Something that decides one request for a key of type `K`.
pub(crate) trait Subject<K>: Sync {
    fn check(&self, key: &K) -> bool;
    /// Keys tracked, where the subject can say.
    fn len(&self) -> Option<usize> {
        None
    }
}

impl Subject<u64> for KeyedLimiter<u64> {
    #[inline]
    fn check(&self, key: &u64) -> bool {
        KeyedLimiter::check(self, key).is_allowed()
    }
    fn len(&self) -> Option<usize> {
        Some(KeyedLimiter::len(self))
    }
}

impl Subject<String> for KeyedLimiter<String> {
    #[inline]
    fn check(&self, key: &String) -> bool {
        KeyedLimiter::check(self, key.as_str()).is_allowed()
    }
    fn len(&self) -> Option<usize> {
        Some(KeyedLimiter::len(self))
    }
}

impl<K, S> Subject<K> for Governor<K, S>
where
    K: Hash + Eq + Clone + Send + Sync,
    S: BuildHasher + Clone + Send + Sync,
{
    #[inline]
    fn check(&self, key: &K) -> bool {
        self.check_key(key).is_ok()
    }
    fn len(&self) -> Option<usize> {
        Some(governor::RateLimiter::len(self))
    }
}

impl Subject<u64> for SeedTokenBucket<u64> {
    #[inline]
    fn check(&self, key: &u64) -> bool {
        self.allow_request(key, 1.0)
    }
}

impl Subject<String> for SeedTokenBucket<String> {
    #[inline]
    fn check(&self, key: &String) -> bool {
        self.allow_request(key.as_str(), 1.0)
    }
}

/// GCRA's CAS loop on one cell, as turnstile runs it.
#[inline]
fn update(cell: &AtomicU64, gcra: &Gcra, now: u64) -> bool {
    let mut tat = cell.load(Ordering::Relaxed);
    loop {
        match gcra.check(tat, now, 1) {
            Ok(Step {
                next: Some(next), ..
            }) => match cell.compare_exchange_weak(tat, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(actual) => tat = actual,
            },
            _ => return false,
        }
    }
}

/// A general-purpose concurrent map holding turnstile's cell.
struct DashMapCell<K> {
    map: DashMap<K, AtomicU64, ahash::RandomState>,
    gcra: Gcra,
    clock: QuantaClock,
}

impl<K: Hash + Eq> DashMapCell<K> {
    fn new(quota: &Quota) -> Self {
        DashMapCell {
            map: DashMap::with_hasher(ahash::RandomState::new()),
            gcra: Gcra::new(quota),
            clock: QuantaClock::new(),
        }
    }
}

impl<K: Hash + Eq + Clone + Send + Sync> Subject<K> for DashMapCell<K> {
    #[inline]
    fn check(&self, key: &K) -> bool {
        let now = self.clock.now();
        if let Some(cell) = self.map.get(key) {
            return update(&cell, &self.gcra, now);
        }
        let cell = self
            .map
            .entry(key.clone())
            .or_insert_with(|| AtomicU64::new(0));
        update(&cell, &self.gcra, now)
    }
    fn len(&self) -> Option<usize> {
        Some(self.map.len())
    }
}

/// The keyed floor: a table sized and filled before timing, each key beside
/// its cell; a check is one hash, a linear probe, a clock read and one CAS
/// (or one load when denying).
pub(crate) struct Floor<K> {
    hasher: ahash::RandomState,
    slots: Vec<Option<(K, AtomicU64)>>,
    mask: usize,
    clock: QuantaClock,
    mode: Mode,
}

impl<K: Hash + Eq + Clone> Floor<K> {
    /// A table of at least twice as many slots as `keys`, holding them all.
    pub(crate) fn new(keys: &[K], mode: Mode) -> Self {
        let len = (keys.len() * 2).next_power_of_two();
        let mut slots: Vec<Option<(K, AtomicU64)>> = (0..len).map(|_| None).collect();
        let hasher = ahash::RandomState::new();
        let mask = len - 1;
        for key in keys {
            let mut i = hasher.hash_one(key) as usize & mask;
            loop {
                match &slots[i] {
                    Some((k, _)) if k == key => break,
                    Some(_) => i = (i + 1) & mask,
                    None => {
                        slots[i] = Some((key.clone(), AtomicU64::new(0)));
                        break;
                    }
                }
            }
        }
        Floor {
            hasher,
            slots,
            mask,
            clock: QuantaClock::new(),
            mode,
        }
    }
}

impl<K: Hash + Eq + Sync + Send> Subject<K> for Floor<K> {
    #[inline]
    fn check(&self, key: &K) -> bool {
        let mut i = self.hasher.hash_one(key) as usize & self.mask;
        let cell = loop {
            match &self.slots[i] {
                Some((k, cell)) if k == key => break cell,
                Some(_) => i = (i + 1) & self.mask,
                None => return false,
            }
        };
        let now = self.clock.now();
        let tat = cell.load(Ordering::Relaxed);
        if self.mode == Mode::Denied {
            // Only a key's first check (its warming one) writes.
            if tat > now {
                return false;
            }
            cell.store(now + 3_600_000_000_000, Ordering::Relaxed);
            return true;
        }
        cell.compare_exchange(tat, tat.max(now) + 1, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }
}

/// The keys of one workload: inserted in `keys` order, checked in `walk`
/// order.
pub(crate) struct Workload<K> {
    pub(crate) name: &'static str,
    pub(crate) keys: Vec<K>,
    pub(crate) walk: Vec<K>,
}

impl<K: Clone> Workload<K> {
    /// `n` random keys, walked in a shuffled order.
    pub(crate) fn uniform(name: &'static str, n: usize, make: impl FnMut(u64) -> K) -> Self {
        let mut rng = SplitMix(0x7475_726e_7374_696c);
        let keys = random_keys(&mut rng, n, make);
        let mut walk = keys.clone();
        // Fisher-Yates.
        for i in (1..walk.len()).rev() {
            let j = (rng.next() % (i as u64 + 1)) as usize;
            walk.swap(i, j);
        }
        Workload { name, keys, walk }
    }

    /// `n` random keys, walked by `n` draws from Zipf(1) over them.
    fn zipf(name: &'static str, n: usize, make: impl FnMut(u64) -> K) -> Self {
        let mut rng = SplitMix(0x7a69_7066);
        let keys = random_keys(&mut rng, n, make);
        // The cumulative weights of ranks 1..=n, weight 1/rank.
        let mut cdf = Vec::with_capacity(n);
        let mut total = 0.0;
        for rank in 1..=n {
            total += 1.0 / rank as f64;
            cdf.push(total);
        }
        let walk = (0..n)
            .map(|_| {
                let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64 * total;
                let rank = cdf.partition_point(|&c| c < u).min(n - 1);
                keys[rank].clone()
            })
            .collect();
        Workload { name, keys, walk }
    }
}

fn random_keys<K>(rng: &mut SplitMix, n: usize, mut make: impl FnMut(u64) -> K) -> Vec<K> {
    (0..n).map(|_| make(rng.next())).collect()
}

/// Warms `subject` on every key, then times it on `workload` with `threads`.
/// With `exact`, every key must be tracked after warming, and after the run
/// a check must still take the mode's path (the quota held).
fn run<K: Sync, S: Subject<K>>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    subject: S,
    workload: &Workload<K>,
    (mode, threads, exact): (Mode, usize, bool),
) {
    let allowed = workload.keys.iter().filter(|k| subject.check(k)).count();
    assert_eq!(
        allowed,
        workload.keys.len(),
        "{name}: a warming check was denied"
    );
    if let (true, Some(len)) = (exact, subject.len()) {
        assert_eq!(len, workload.keys.len(), "{name}: not every key is tracked");
    }
    let walk = &workload.walk[..];
    if threads == 1 {
        let mut i = 0;
        group.bench_function(name, |b| {
            b.iter(|| {
                let allowed = subject.check(black_box(&walk[i]));
                i += 1;
                if i == walk.len() {
                    i = 0;
                }
                black_box(allowed)
            })
        });
    } else {
        let subject = &subject;
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                parallel(threads, iters, |t| {
                    let mut i = t * walk.len() / threads;
                    move || {
                        let key = &walk[i];
                        i += 1;
                        if i == walk.len() {
                            i = 0;
                        }
                        subject.check(black_box(key))
                    }
                })
            })
        });
    }
    if exact {
        let expected = mode == Mode::Allowed;
        assert!(
            walk.iter()
                .take(1_000)
                .all(|k| subject.check(k) == expected),
            "{name}: after the run, a check was not {}",
            mode.name()
        );
    }
}

/// `threads` threads, each running its own `check` (made by `make` from
/// the thread's index) `iters` times; the slowest thread's time.
pub(crate) fn parallel<F, C>(threads: usize, iters: u64, make: F) -> Duration
where
    F: Fn(usize) -> C + Sync,
    C: FnMut() -> bool,
{
    let barrier = Barrier::new(threads);
    thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (barrier, make) = (&barrier, &make);
                s.spawn(move || {
                    let mut check = make(t);
                    barrier.wait();
                    let start = Instant::now();
                    for _ in 0..iters {
                        black_box(check());
                    }
                    start.elapsed()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a bench thread panicked"))
            .max()
            .unwrap_or_default()
    })
}

pub(crate) fn threads_label(threads: usize) -> String {
    match threads {
        1 => "1 thread".to_owned(),
        n => format!("{n} threads"),
    }
}

/// One workload's group: every subject on the same keys, mode and threads.
fn group<K>(c: &mut Criterion, workload: &Workload<K>, mode: Mode, threads: usize)
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    KeyedLimiter<K>: Subject<K>,
    SeedTokenBucket<K>: Subject<K>,
{
    let mut group = c.benchmark_group(format!(
        "keyed/{}/{}/{}",
        workload.name,
        mode.name(),
        threads_label(threads)
    ));
    group.throughput(Throughput::Elements(threads as u64));
    let how = (mode, threads, true);
    let turnstile = KeyedLimiter::<K>::new(mode.quota());
    run(&mut group, "turnstile", turnstile, workload, how);
    let governor = governor::RateLimiter::<K, _, _>::keyed(mode.governor());
    run(
        &mut group,
        "governor (DashMap, std hasher)",
        governor,
        workload,
        how,
    );
    let governor_ahash =
        Governor::<K, _>::dashmap_with_hasher(mode.governor(), ahash::RandomState::new());
    run(
        &mut group,
        "governor (DashMap, ahash)",
        governor_ahash,
        workload,
        how,
    );
    let dashmap = DashMapCell::<K>::new(&mode.quota());
    run(
        &mut group,
        "DashMap + turnstile GCRA cell",
        dashmap,
        workload,
        how,
    );
    run(
        &mut group,
        "seed (Mutex<HashMap>)",
        mode.seed::<K>(),
        workload,
        how,
    );
    let floor = Floor::new(&workload.keys, mode);
    let name = "floor (pre-sized table, hash + probe + CAS)";
    run(&mut group, name, floor, workload, how);
    if mode == Mode::Allowed
        && workload.keys.len() >= 1_000_000
        && workload.name.contains("uniform")
    {
        let evicting = KeyedLimiter::<K>::new(idle_quota());
        let name = "turnstile (1e9/s: idle keys evicted)";
        run(&mut group, name, evicting, workload, (mode, threads, false));
    }
    group.finish();
}

/// The churn group: every check a key never seen before.
fn churn(c: &mut Criterion, threads: usize) {
    let mut group = c.benchmark_group(format!(
        "keyed/u64 churn (every check a new key)/allowed/{}",
        threads_label(threads)
    ));
    group.throughput(Throughput::Elements(threads as u64));
    let mode = Mode::Allowed;
    let turnstile = KeyedLimiter::<u64>::new(mode.quota());
    churn_run(&mut group, "turnstile", &turnstile, threads);
    let governor = governor::RateLimiter::<u64, _, _>::keyed(mode.governor());
    churn_run(
        &mut group,
        "governor (DashMap, std hasher)",
        &governor,
        threads,
    );
    let governor_ahash =
        Governor::<u64, _>::dashmap_with_hasher(mode.governor(), ahash::RandomState::new());
    churn_run(
        &mut group,
        "governor (DashMap, ahash)",
        &governor_ahash,
        threads,
    );
    let dashmap = DashMapCell::<u64>::new(&mode.quota());
    churn_run(
        &mut group,
        "DashMap + turnstile GCRA cell",
        &dashmap,
        threads,
    );
    churn_run(
        &mut group,
        "seed (Mutex<HashMap>)",
        &mode.seed::<u64>(),
        threads,
    );
    group.finish();
    assert!(turnstile.len() <= turnstile.max_keys());
}

fn churn_run<S: Subject<u64>>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    subject: &S,
    threads: usize,
) {
    // Each run continues where the last stopped, so no key repeats.
    let next = AtomicU64::new(0);
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let first = next.fetch_add(iters, Ordering::Relaxed);
            parallel(threads, iters, |t| {
                let mut rng = SplitMix(((t as u64) << 48) ^ first);
                move || subject.check(black_box(&rng.next()))
            })
        })
    });
}

/// The `keyed/...` groups: each workload in each mode on 1 thread and on
/// `available_parallelism` threads (if more than one).
pub fn bench(c: &mut Criterion) {
    let parallelism = thread::available_parallelism().map_or(1, usize::from);
    let mut thread_counts = vec![1];
    if parallelism > 1 {
        thread_counts.push(parallelism);
    }

    let u64_workloads = [
        Workload::uniform("u64 1 hot key", 1, |k| k),
        Workload::uniform("u64 1000 keys", 1_000, |k| k),
        Workload::uniform("u64 1000000 keys uniform", 1_000_000, |k| k),
        Workload::zipf("u64 zipf(1.0) over 1000000 keys", 1_000_000, |k| k),
    ];
    let strings = Workload::uniform("String16 1000 keys", 1_000, |k| format!("{k:016x}"));
    assert!(strings.keys.iter().all(|k| k.len() == 16));

    for mode in [Mode::Allowed, Mode::Denied] {
        for &threads in &thread_counts {
            for workload in &u64_workloads {
                group(c, workload, mode, threads);
            }
            group(c, &strings, mode, threads);
        }
    }
    for &threads in &thread_counts {
        churn(c, threads);
    }
}
