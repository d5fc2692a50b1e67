//! Groups `batch/...`: `KeyedLimiter::check_batch` beside one-key-at-a-time
//! loops over the same keys, so every ratio comes from one run.
//!
//! Each group is one key count (`u64 1000 keys`, `u64 1000000 keys`,
//! uniform random keys, every key inserted before timing, walked in a
//! shuffled order as in `keyed.rs`) and one batch size (1, 8, 32, 256); one
//! iteration decides the next `batch` keys of the walk, and the throughput
//! is `Elements(batch)`, so criterion's `elem/s` is keys per second and the
//! time per key is the iteration time divided by the batch size. Rows:
//!
//! - `turnstile check_batch`: one call per batch (one clock read);
//! - `turnstile check loop`: `check` on each key (a clock read each);
//! - `governor (DashMap, ahash) loop`: `check_key` on each key, the fair
//!   peer of `keyed.rs`;
//! - `floor loop (pre-sized table, hash + probe + CAS)`: the keyed floor of
//!   `keyed.rs` on each key (a clock read each).
//!
//! The mode is `allowed` (1 per 15 s, burst 1e9: every check admits and
//! writes). Group `batch/distance/...` times `check_batch` of 32 keys at
//! 1,000,000 keys for each prefetch distance (0: no prefetch at all), the
//! measurement behind the batch's prefetch distance (`PREFETCH_DISTANCE`
//! in `src/keyed/batch.rs`).

use std::hint::black_box;

use criterion::{Criterion, Throughput};
use turnstile_rl::{Decision, KeyedLimiter};

use crate::keyed::{Floor, Governor, Setup, Subject, Workload};
use crate::mode::Mode;

const BATCHES: [usize; 4] = [1, 8, 32, 256];
const DISTANCES: [usize; 7] = [0, 1, 2, 4, 8, 16, 32];

/// The next `n` keys of the walk (from the start again when fewer are left).
fn next<'w, K>(walk: &'w [K], at: &mut usize, n: usize) -> &'w [K] {
    if *at + n > walk.len() {
        *at = 0;
    }
    let keys = &walk[*at..*at + n];
    *at += n;
    keys
}

pub fn bench(c: &mut Criterion) {
    let mode = Mode::Allowed;
    for (n, name) in [(1_000, "u64 1000 keys"), (1_000_000, "u64 1000000 keys")] {
        let workload = Workload::uniform(name, n, |k| k);
        let walk = &workload.walk[..];
        let turnstile = KeyedLimiter::<u64>::new(mode.quota());
        let governor =
            Governor::<u64, _>::dashmap_with_hasher(mode.governor(), ahash::RandomState::new());
        let floor = Floor::new(&workload.keys, mode);
        for key in &workload.keys {
            assert!(turnstile.check(key).is_allowed());
            assert!(Subject::check(&governor, key));
            assert!(floor.check(key));
        }
        assert_eq!(turnstile.len(), n);
        for batch in BATCHES {
            let mut group = c.benchmark_group(format!("batch/{name}/batch {batch}"));
            group.throughput(Throughput::Elements(batch as u64));
            let mut out: Vec<Decision> = Vec::with_capacity(batch);
            let mut at = 0;
            group.bench_function("turnstile check_batch", |b| {
                b.iter(|| {
                    turnstile.check_batch(black_box(next(walk, &mut at, batch)), &mut out);
                    black_box(out.last().map(Decision::is_allowed))
                })
            });
            group.bench_function("turnstile check loop", |b| {
                b.iter(|| {
                    for key in next(walk, &mut at, batch) {
                        black_box(turnstile.check(black_box(key)).is_allowed());
                    }
                })
            });
            group.bench_function("governor (DashMap, ahash) loop", |b| {
                b.iter(|| {
                    for key in next(walk, &mut at, batch) {
                        black_box(Subject::check(&governor, black_box(key)));
                    }
                })
            });
            group.bench_function("floor loop (pre-sized table, hash + probe + CAS)", |b| {
                b.iter(|| {
                    for key in next(walk, &mut at, batch) {
                        black_box(floor.check(black_box(key)));
                    }
                })
            });
            group.finish();
            assert!(out.iter().all(Decision::is_allowed), "{name}: a denial");
        }
        if n == 1_000_000 {
            let batch = 32;
            let mut group = c.benchmark_group(format!("batch/distance/{name}/batch {batch}"));
            group.throughput(Throughput::Elements(batch as u64));
            let mut out: Vec<Decision> = Vec::with_capacity(batch);
            let mut at = 0;
            for distance in DISTANCES {
                group.bench_function(format!("distance {distance}"), |b| {
                    b.iter(|| {
                        let keys = black_box(next(walk, &mut at, batch));
                        ::turnstile_rl::__private::check_batch_at_distance(
                            &turnstile, keys, &mut out, distance,
                        );
                        black_box(out.last().map(Decision::is_allowed))
                    })
                });
            }
            group.finish();
        }
        assert_eq!(turnstile.len(), n, "{name}: every key stayed tracked");
    }
}
