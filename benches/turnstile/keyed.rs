//! Groups `keyed/...`: one bucket per key, the cost of a check on a key that
//! is already tracked, turnstile against its peers in the same group.
//!
//! Subjects (every one on its own default clock):
//!
//! - `turnstile`: `KeyedLimiter<K>` from `KeyedLimiter::new` (quanta clock,
//!   default `max_keys` of 1,000,000, ahash inside);
//! - `governor (DashMap, std hasher)`: `governor::RateLimiter::keyed`, its
//!   default store (a `DashMap` with `std::hash::RandomState`, SipHash-1-3);
//! - `governor (DashMap, ahash)`: `RateLimiter::dashmap_with_hasher` with
//!   `ahash::RandomState`, the same hasher turnstile uses: the fair peer,
//!   and the denominator of the ratios in `BENCHMARKS.md`;
//! - `seed (Mutex<HashMap>)`: the seeds' `SeedTokenBucket`, one lock around
//!   one std `HashMap`.
//!
//! Workloads: 1 hot key, 1,000 keys and 1,000,000 keys of `u64`, and 1,000
//! keys of 16-byte `String`s (turnstile and the seed look them up as `&str`
//! through `Borrow`; governor only takes `&String`). The keys are random and
//! generated before anything is timed; every subject checks each key once
//! first (so every bucket exists before timing), then the timed loop walks a
//! shuffled copy of the keys with an index, so the access order is not the
//! insertion order (which would hand turnstile's separately allocated nodes
//! a prefetch-friendly walk).
//!
//! Threads: `1 thread` times one check with `Bencher::iter`. `2 threads`
//! (the machine's `available_parallelism`) uses `iter_custom`: each thread
//! waits on a barrier, runs `iters` checks from its own starting point in
//! the walk, and returns its own elapsed time; the sample is the slowest
//! thread's. So the reported time is **wall time per check as each thread
//! sees it while all run at once**, and the group's throughput is declared
//! as `Elements(threads)`, so criterion's `elem/s` is the aggregate checks
//! per second. Spawning the threads is outside the timed region.
//!
//! Quota: 1 per second with a burst of 4,000,000,000 (T = 1 s, tau = 4e9 s)
//! for turnstile and governor, and the seed's bucket of 4e9 tokens refilled
//! at 1 per second. Every check in a run is allowed (no key is checked 4e9
//! times), and each check pushes the key's arrival time a second ahead, so
//! no bucket becomes idle during the run: turnstile's housekeeping, which
//! forgets idle (full) buckets, has nothing to evict, and every subject does
//! a lookup plus an admitting update. The extra subject `turnstile (1e9/s:
//! idle keys evicted)` in the 1,000,000-key groups runs the direct group's
//! 1e9/s quota instead, under which a key is idle a nanosecond after its
//! check: housekeeping then sweeps those keys out as the walk goes and the
//! walk re-inserts them, the churn a real quota sees on idle users.

use std::hash::{BuildHasher, Hash};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput};
use governor::clock::DefaultClock as GovernorClock;
use governor::state::keyed::DashMapStateStore;
use turnstile::reference::SeedTokenBucket;
use turnstile::{KeyedLimiter, Quota};

/// The burst of every subject: more checks than any key gets in a run.
const BURST: u32 = 4_000_000_000;

/// turnstile's quota: 1 per second, burst [`BURST`].
fn quota() -> Quota {
    Quota::per_second(1)
        .and_then(|q| q.burst(u64::from(BURST)))
        .expect("a valid quota")
}

/// The direct group's quota (1e9 per second, burst 1e9): keys go idle at once.
fn idle_quota() -> Quota {
    Quota::per_second(1_000_000_000)
        .and_then(|q| q.burst(1_000_000_000))
        .expect("a valid quota")
}

/// governor's quota, the same as [`quota`].
fn governor_quota() -> governor::Quota {
    let one = NonZeroU32::MIN;
    let burst = NonZeroU32::new(BURST).expect("non-zero");
    governor::Quota::per_second(one).allow_burst(burst)
}

/// The seeds' bucket with the same capacity and rate.
fn seed<K: Hash + Eq>() -> SeedTokenBucket<K> {
    SeedTokenBucket::new(f64::from(BURST), 1.0).expect("a valid capacity and rate")
}

/// governor's keyed limiter on a `DashMap` with hasher `S`.
type Governor<K, S> = governor::RateLimiter<K, DashMapStateStore<K, S>, GovernorClock>;

/// Something that decides one request for a key of type `K`.
trait Subject<K>: Sync {
    fn check(&self, key: &K) -> bool;
    /// Keys tracked, where the subject can say.
    fn len(&self) -> Option<usize>;
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
    fn len(&self) -> Option<usize> {
        None
    }
}

impl Subject<String> for SeedTokenBucket<String> {
    #[inline]
    fn check(&self, key: &String) -> bool {
        self.allow_request(key.as_str(), 1.0)
    }
    fn len(&self) -> Option<usize> {
        None
    }
}

#[path = "../../tests/support/keys.rs"]
mod keys;
use keys::SplitMix;

/// The keys of one workload: inserted in `keys` order, checked in `walk`
/// order (the same keys, shuffled).
struct Workload<K> {
    name: &'static str,
    keys: Vec<K>,
    walk: Vec<K>,
}

impl<K: Clone> Workload<K> {
    fn new(name: &'static str, n: usize, mut make: impl FnMut(u64) -> K) -> Self {
        let mut rng = SplitMix(0x7475_726e_7374_696c);
        let keys: Vec<K> = (0..n).map(|_| make(rng.next())).collect();
        let mut walk = keys.clone();
        // Fisher-Yates.
        for i in (1..walk.len()).rev() {
            let j = (rng.next() % (i as u64 + 1)) as usize;
            walk.swap(i, j);
        }
        Workload { name, keys, walk }
    }
}

/// Warms `subject` on every key, then times it on `workload` with `threads`.
/// With `exact`, every key must still be tracked after warming, and checks
/// must still be allowed after the run (the quota held).
fn run<K: Sync, S: Subject<K>>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    subject: S,
    workload: &Workload<K>,
    threads: usize,
    exact: bool,
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
        group.bench_function(name, |b| {
            b.iter_custom(|iters| parallel(&subject, walk, threads, iters))
        });
    }
    if exact {
        assert!(
            walk.iter().take(1_000).all(|k| subject.check(k)),
            "{name}: denials after the run (the quota is too small for it)"
        );
    }
}

/// `threads` threads, each doing `iters` checks from its own point in
/// `walk`; the slowest thread's time.
fn parallel<K: Sync, S: Subject<K>>(
    subject: &S,
    walk: &[K],
    threads: usize,
    iters: u64,
) -> Duration {
    let barrier = Barrier::new(threads);
    thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || {
                    let mut i = t * walk.len() / threads;
                    barrier.wait();
                    let start = Instant::now();
                    for _ in 0..iters {
                        black_box(subject.check(black_box(&walk[i])));
                        i += 1;
                        if i == walk.len() {
                            i = 0;
                        }
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

fn threads_label(threads: usize) -> String {
    match threads {
        1 => "1 thread".to_owned(),
        n => format!("{n} threads"),
    }
}

/// One workload's group: every subject on the same keys and thread count.
fn group<K>(c: &mut Criterion, workload: &Workload<K>, threads: usize)
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    KeyedLimiter<K>: Subject<K>,
    SeedTokenBucket<K>: Subject<K>,
{
    let mut group = c.benchmark_group(format!(
        "keyed/{}/{}",
        workload.name,
        threads_label(threads)
    ));
    group.throughput(Throughput::Elements(threads as u64));
    let turnstile = KeyedLimiter::<K>::new(quota());
    run(&mut group, "turnstile", turnstile, workload, threads, true);
    let governor = governor::RateLimiter::<K, _, _>::keyed(governor_quota());
    run(
        &mut group,
        "governor (DashMap, std hasher)",
        governor,
        workload,
        threads,
        true,
    );
    let governor_ahash =
        Governor::<K, _>::dashmap_with_hasher(governor_quota(), ahash::RandomState::new());
    run(
        &mut group,
        "governor (DashMap, ahash)",
        governor_ahash,
        workload,
        threads,
        true,
    );
    run(
        &mut group,
        "seed (Mutex<HashMap>)",
        seed::<K>(),
        workload,
        threads,
        true,
    );
    if workload.keys.len() >= 1_000_000 {
        let evicting = KeyedLimiter::<K>::new(idle_quota());
        let name = "turnstile (1e9/s: idle keys evicted)";
        run(&mut group, name, evicting, workload, threads, false);
    }
    group.finish();
}

/// The `keyed/...` groups: each workload on 1 thread and on
/// `available_parallelism` threads (if more than one).
pub fn bench(c: &mut Criterion) {
    let parallelism = thread::available_parallelism().map_or(1, usize::from);
    let mut thread_counts = vec![1];
    if parallelism > 1 {
        thread_counts.push(parallelism.min(2));
    }

    let u64_workloads = [
        Workload::new("u64 1 hot key", 1, |k| k),
        Workload::new("u64 1000 keys", 1_000, |k| k),
        Workload::new("u64 1000000 keys", 1_000_000, |k| k),
    ];
    let strings = Workload::new("String16 1000 keys", 1_000, |k| format!("{k:016x}"));
    assert!(strings.keys.iter().all(|k| k.len() == 16));

    for workload in &u64_workloads {
        for &threads in &thread_counts {
            group(c, workload, threads);
        }
    }
    for &threads in &thread_counts {
        group(c, &strings, threads);
    }
}
