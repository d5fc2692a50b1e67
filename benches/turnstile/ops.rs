//! Group `ops` (its row names avoid "direct" and "keyed", so the
//! `-- direct` and `-- keyed` filters keep meaning their own groups): the operations beside `check`, each beside the check it
//! extends, in one group so the ratios come from one run. One thread, one
//! hot key (or one bucket), every check admitted (T = 1 ns, burst one
//! second's worth, so a check never outruns the refill):
//!
//! - `bucket check` / `bucket peek`: a `DirectLimiter` check, and a peek
//!   (a clock read and a load, no write);
//! - `bucket check + refund`: a check and a refund of its token (two CAS);
//! - `per-key ...`: the same on a `KeyedLimiter<u64>` holding 1,000 keys;
//! - `per-key multi, 1 limit` / `per-key multi, 2 limits`: a
//!   `KeyedMultiLimiter` with one limit, and with two (one more lookup and
//!   CAS in a second map).

use std::hint::black_box;

use criterion::{Criterion, Throughput};
use turnstile_rl::{DirectLimiter, KeyedLimiter, KeyedMultiLimiter, Quota, Quotas};

/// 1e9 per second, burst 1e9 (T = 1 ns, tau = 1 s): always admitted.
fn open_per_second() -> Quota {
    Quota::per_second(1_000_000_000)
        .and_then(|q| q.burst(1_000_000_000))
        .expect("a valid quota")
}

/// 60e9 per minute, burst 60e9: the same rate, a second limit's bucket.
fn open_per_minute() -> Quota {
    Quota::per_minute(60_000_000_000)
        .and_then(|q| q.burst(60_000_000_000))
        .expect("a valid quota")
}

const KEYS: u64 = 1_000;
const HOT: u64 = 7;

pub fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("ops");
    group.throughput(Throughput::Elements(1));

    let direct = DirectLimiter::new(open_per_second());
    group.bench_function("bucket check", |b| b.iter(|| black_box(direct.check())));
    group.bench_function("bucket peek", |b| b.iter(|| black_box(direct.peek())));
    group.bench_function("bucket check + refund", |b| {
        b.iter(|| black_box((direct.check(), direct.refund(1))))
    });

    let keyed = KeyedLimiter::<u64>::new(open_per_second());
    for key in 0..KEYS {
        let _ = keyed.check(&key);
    }
    group.bench_function("per-key check", |b| b.iter(|| black_box(keyed.check(&HOT))));
    group.bench_function("per-key peek", |b| b.iter(|| black_box(keyed.peek(&HOT))));
    group.bench_function("per-key check + refund", |b| {
        b.iter(|| black_box((keyed.check(&HOT), keyed.refund(&HOT, 1))))
    });

    let one = KeyedMultiLimiter::<u64>::new(Quotas::from(open_per_second()));
    let two = KeyedMultiLimiter::<u64>::new(
        Quotas::new([open_per_second(), open_per_minute()]).expect("two quotas"),
    );
    for key in 0..KEYS {
        let _ = one.check(&key);
        let _ = two.check(&key);
    }
    group.bench_function("per-key multi, 1 limit", |b| {
        b.iter(|| black_box(one.check(&HOT)))
    });
    group.bench_function("per-key multi, 2 limits", |b| {
        b.iter(|| black_box(two.check(&HOT)))
    });
    group.finish();
}
