//! turnstile's benchmarks: one criterion entry, one submodule per subject
//! (`direct`: one bucket; `keyed`: one bucket per key), each putting
//! turnstile and its peers in one group so the ratios come from one run on
//! one machine. `BENCHMARKS.md` holds the figures of one full run.
//!
//! ```text
//! cargo bench --bench turnstile                       # everything
//! cargo bench --bench turnstile -- direct             # the direct groups
//! cargo bench --bench turnstile -- keyed              # the keyed groups
//! cargo bench --bench turnstile -- inserts            # 1,000,000 new keys into a new limiter
//! cargo bench --bench turnstile -- contended          # one bucket, two threads
//! cargo bench --bench turnstile -- limiters           # 1, 9, 16 limiters in turn
//! cargo bench --bench turnstile -- ops                # peek, refund, multi-limit
//! cargo bench --bench turnstile -- batch              # check_batch vs per-key loops
//! cargo bench --bench turnstile -- --warm-up-time 1 --measurement-time 3
//! ```
//!
//! Cargo finds this entry as `benches/turnstile/main.rs` (the layout for a
//! bench with modules), so the submodules are not taken for benches of
//! their own, as `benches/direct.rs` would be.

use criterion::{criterion_group, criterion_main};

mod batch;
mod contended;
mod direct;
mod inserts;
mod keyed;
mod limiters;
mod mode;
mod ops;

criterion_group!(
    benches,
    direct::bench,
    contended::bench,
    keyed::bench,
    inserts::bench,
    limiters::bench,
    ops::bench,
    batch::bench
);
criterion_main!(benches);
