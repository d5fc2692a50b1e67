//! Groups `keyed/u64 inserts (1000000 new keys into a new limiter)/...`
//! and `keyed/String16 inserts (...)`: what a key the limiter has never
//! seen costs while its map grows (issue 38's insert row), turnstile
//! against its peers in one run.
//!
//! One iteration makes a new limiter of the `allowed` mode's quota and
//! checks 1,000,000 keys on it, each once, from one thread: every check
//! inserts, and the map grows from its first table to its millionth key
//! (turnstile's to the table of its default `max_keys`, 1,000,000, so it
//! evicts nothing). The keys are random `u64`s (a SplitMix64 draw, made in
//! the loop) or 16-byte hex `String`s (made before timing, the same million
//! for every fill: each fill's limiter is new), which turnstile and the
//! seed look up as `&str` and governor as `&String`, as in `keyed`. Only
//! the checks are timed: making the limiter and dropping it are not.
//! Throughput is the million keys, so the time per iteration divided by
//! 1,000,000 is the time per new key. Criterion's fewest samples (10), one
//! fill each: a fill takes a quarter to half a second.
//!
//! The memory bench's insert column times one fill per subject, and its
//! first row also pays the process's first touch of memory that later rows
//! reuse; here criterion's warm-up runs whole fills of each subject before
//! its samples.
//!
//! ```text
//! cargo bench --bench turnstile -- inserts
//! ```

use std::hash::Hash;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput};
use turnstile_rl::KeyedLimiter;
use turnstile_test_kit::reference::SeedTokenBucket;

use crate::keyed::{Governor, Setup, Subject};
use crate::mode::Mode;
use turnstile_test_kit::keys::SplitMix;

/// New keys per fill.
const KEYS: u64 = 1_000_000;

/// Where a fill's keys come from.
trait Keys<K> {
    /// Checks key `i` of fill `fill` on `subject`.
    fn check<S: Subject<K>>(&self, subject: &S, fill: u64, i: u64) -> bool;
}

/// `u64` keys drawn in the loop: SplitMix64 of the fill and the index.
struct Draws;

impl Keys<u64> for Draws {
    #[inline]
    fn check<S: Subject<u64>>(&self, subject: &S, fill: u64, i: u64) -> bool {
        subject.check(&SplitMix(fill << 32 | i).next())
    }
}

/// `String` keys made before timing, the same for every fill.
struct Strings(Vec<String>);

impl Keys<String> for Strings {
    #[inline]
    fn check<S: Subject<String>>(&self, subject: &S, _: u64, i: u64) -> bool {
        subject.check(&self.0[i as usize])
    }
}

/// Times fills of new limiters made by `make` with `KEYS` new keys each.
fn fill<K, S: Subject<K>>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    make: impl Fn() -> S,
    keys: &impl Keys<K>,
) {
    let mut fills = 0u64;
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            for _ in 0..iters {
                fills += 1;
                let subject = make();
                let start = Instant::now();
                for i in 0..KEYS {
                    black_box(keys.check(&subject, fills, black_box(i)));
                }
                timed += start.elapsed();
                if let Some(held) = subject.len() {
                    assert_eq!(held as u64, KEYS, "{name}: every key is held once");
                }
                drop(subject);
            }
            timed
        })
    });
}

/// The inserts groups, `u64` and `String` keys, one thread.
pub fn bench(c: &mut Criterion) {
    group(c, "u64", &Draws);
    let mut rng = SplitMix(7);
    let strings = Strings((0..KEYS).map(|_| format!("{:016x}", rng.next())).collect());
    group(c, "String16", &strings);
}

/// One inserts group: every subject filled with `keys` (named `label`).
fn group<K>(c: &mut Criterion, label: &str, keys: &impl Keys<K>)
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    KeyedLimiter<K>: Subject<K>,
    SeedTokenBucket<K>: Subject<K>,
{
    let mode = Mode::Allowed;
    let mut group = c.benchmark_group(format!(
        "keyed/{label} inserts (1000000 new keys into a new limiter)/allowed/1 thread"
    ));
    group.sample_size(10);
    group.throughput(Throughput::Elements(KEYS));
    fill(
        &mut group,
        "turnstile",
        || KeyedLimiter::<K>::new(mode.quota()),
        keys,
    );
    fill(
        &mut group,
        "governor (DashMap, std hasher)",
        || governor::RateLimiter::<K, _, _>::keyed(mode.governor()),
        keys,
    );
    fill(
        &mut group,
        "governor (DashMap, ahash)",
        || Governor::<K, _>::dashmap_with_hasher(mode.governor(), ahash::RandomState::new()),
        keys,
    );
    fill(
        &mut group,
        "seed (Mutex<HashMap>)",
        || mode.seed::<K>(),
        keys,
    );
    group.finish();
}
