//! Group `limiters/...`: many keyed limiters used in turn from one thread
//! (issue 22's cliff: a server with three routes of three limits each holds
//! nine maps, and every worker thread checks them all).
//!
//! Each subject holds `n` limiters (1, 9 or 16) of the `allowed` mode's
//! quota, each warmed on the same 1,000 random `u64` keys; check `i` goes to
//! limiter `i mod n` with the `i`-th key of the shuffled walk (1,000 is
//! prime to 9 and 16, so every limiter sees every key). One thread; time
//! per check. The peer is governor on a `DashMap` with ahash, whose state is
//! plain memory and has no per-thread bookkeeping to miss.

use std::hint::black_box;

use criterion::{Criterion, Throughput};
use turnstile_rl::KeyedLimiter;

use crate::keyed::{Governor, Setup, Subject, Workload};
use crate::mode::Mode;

/// Limiter counts: one, one past the 8 handles a thread used to cache, and
/// twice that.
const COUNTS: [usize; 3] = [1, 9, 16];

/// Times `limiters` used in turn on `workload`, after every limiter has
/// checked every key once.
fn run<S: Subject<u64>>(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    limiters: &[S],
    workload: &Workload<u64>,
) {
    for limiter in limiters {
        for key in &workload.keys {
            assert!(limiter.check(key), "{name}: a warming check was denied");
        }
    }
    let walk = &workload.walk[..];
    let (mut i, mut l) = (0, 0);
    group.bench_function(name, |b| {
        b.iter(|| {
            let allowed = limiters[l].check(black_box(&walk[i]));
            i += 1;
            if i == walk.len() {
                i = 0;
            }
            l += 1;
            if l == limiters.len() {
                l = 0;
            }
            black_box(allowed)
        })
    });
}

/// The `limiters/...` group.
pub fn bench(c: &mut Criterion) {
    let mode = Mode::Allowed;
    let workload = Workload::uniform("u64 1000 keys each", 1_000, |k| k);
    let mut group = c.benchmark_group(format!(
        "limiters/{}/{}/1 thread",
        workload.name,
        mode.name()
    ));
    group.throughput(Throughput::Elements(1));
    for n in COUNTS {
        let limiters: Vec<_> = (0..n)
            .map(|_| KeyedLimiter::<u64>::new(mode.quota()))
            .collect();
        run(
            &mut group,
            &format!("turnstile, {n} in turn"),
            &limiters,
            &workload,
        );
    }
    for n in [1, 16] {
        let limiters: Vec<_> = (0..n)
            .map(|_| {
                Governor::<u64, _>::dashmap_with_hasher(mode.governor(), ahash::RandomState::new())
            })
            .collect();
        let name = format!("governor (DashMap, ahash), {n} in turn");
        run(&mut group, &name, &limiters, &workload);
    }
    group.finish();
}
