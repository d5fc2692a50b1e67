//! Group `keyed/u64 inserts (1000000 new keys into a new limiter)/...`:
//! what a key the limiter has never seen costs while its map grows (issue
//! 38's insert row), turnstile against its peers in one run.
//!
//! One iteration makes a new limiter of the `allowed` mode's quota and
//! checks 1,000,000 random `u64` keys on it, each once, from one thread:
//! every check inserts, and the map grows from its first table to its
//! millionth key (turnstile's to the table of its default `max_keys`,
//! 1,000,000, so it evicts nothing). Only the checks are timed: making the
//! limiter and dropping it are not. Throughput is the million keys, so the
//! time per iteration divided by 1,000,000 is the time per new key.
//! Criterion's fewest samples (10), one fill each: a fill takes a quarter
//! of a second.
//!
//! The memory bench's insert column times one fill per subject, and its
//! first row also pays the process's first touch of memory that later rows
//! reuse; here criterion's warm-up runs whole fills of each subject before
//! its samples.
//!
//! ```text
//! cargo bench --bench turnstile -- inserts
//! ```

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput};
use turnstile_rl::KeyedLimiter;

use crate::keyed::{Governor, Setup, Subject};
use crate::mode::Mode;
use turnstile_test_kit::keys::SplitMix;

/// New keys per fill.
const KEYS: u64 = 1_000_000;

/// Times fills of new limiters made by `make`.
fn fill<S: Subject<u64>>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    make: impl Fn() -> S,
) {
    let mut fills = 0u64;
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            for _ in 0..iters {
                fills += 1;
                let subject = make();
                let mut rng = SplitMix(fills);
                let start = Instant::now();
                for _ in 0..KEYS {
                    black_box(subject.check(black_box(&rng.next())));
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

/// The inserts group, one thread.
pub fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group(
        "keyed/u64 inserts (1000000 new keys into a new limiter)/allowed/1 thread",
    );
    group.sample_size(10);
    group.throughput(Throughput::Elements(KEYS));
    let mode = Mode::Allowed;
    fill(&mut group, "turnstile", || {
        KeyedLimiter::<u64>::new(mode.quota())
    });
    fill(&mut group, "governor (DashMap, std hasher)", || {
        governor::RateLimiter::<u64, _, _>::keyed(mode.governor())
    });
    fill(&mut group, "governor (DashMap, ahash)", || {
        Governor::<u64, _>::dashmap_with_hasher(mode.governor(), ahash::RandomState::new())
    });
    fill(&mut group, "seed (Mutex<HashMap>)", || mode.seed::<u64>());
    group.finish();
}
