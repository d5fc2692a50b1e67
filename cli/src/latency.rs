//! `turnstile latency`: per-check latency of every algorithm, measured the
//! way the seeds' benchmark table reports it (mean and percentiles of one
//! evaluation), on one thread and on all cores.
//!
//! Each check runs between two `quanta::Clock::raw()` reads, converted with
//! `delta_as_nanos` outside the timed span. That timing has a cost of its
//! own (one read is inside every sample), so it is measured and printed as
//! its own row and left in the others: readers can judge it, nothing is
//! subtracted.

use std::cell::RefCell;
use std::hint::black_box;
use std::io::Write;
use std::num::NonZeroUsize;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use turnstile_rl::{Decision, KeyedLimiter, QuantaClock, Quota};
use turnstile_test_kit::reference::SeedTokenBucket;

use super::limiter::Algorithm;
use super::CliError;

/// The most checks per row: every sample is kept (8 bytes each) to sort
/// for the percentiles, so this bounds memory at 160 MB.
const MAX_CHECKS: u64 = 20_000_000;

/// The most threads a run may start.
const MAX_THREADS: u64 = 1_024;

/// The smallest quota count used, whatever `--checks` says.
const MIN_QUOTA_COUNT: u64 = 1_000_000;

/// Keys of the many-keys keyed rows.
const MANY_KEYS: u64 = 1_000;

/// Keys of the million-keys keyed rows.
const MILLION_KEYS: u64 = 1_000_000;

/// The emission interval of the keyed rows' quota (whose burst is the
/// row's count): far longer than any run, so a key never goes idle between
/// its checks. A per-second quota would let a key checked every few
/// microseconds go idle (full) in between, and turnstile would then evict
/// and re-insert it on every visit: the cost of churn, not of a check.
const KEYED_INTERVAL: Duration = Duration::from_secs(3600);

/// The keyed rows visit key `i * WALK_STRIDE mod n` at check `i`: coprime
/// with both key counts, so every key is visited, and large, so the walk is
/// not the insertion order (which would hand a map that allocates its
/// entries one by one, in order, a prefetch-friendly walk).
const WALK_STRIDE: u64 = 654_321;

/// Flags of `turnstile latency` (and of `turnstile` without a subcommand).
#[derive(Debug, Args)]
pub(crate) struct LatencyArgs {
    /// Checks per row, split evenly across the row's threads (at most
    /// 20,000,000: every sample is kept to compute the percentiles).
    #[arg(long, default_value_t = 1_000_000, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..=MAX_CHECKS))]
    pub(crate) checks: u64,
    /// Threads for the multi-threaded rows [default: all cores, from
    /// std::thread::available_parallelism]. Rows on one thread always run.
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..=MAX_THREADS))]
    pub(crate) threads: Option<u64>,
    /// Measure only this algorithm (repeat the flag for several); all of
    /// them when omitted. The timing-overhead row always runs.
    #[arg(long = "algorithm", value_enum, value_name = "NAME")]
    pub(crate) algorithms: Vec<Bench>,
}

/// The rows that can be measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Bench {
    /// GCRA, `DirectLimiter` on the quanta clock.
    Gcra,
    /// GCRA, `KeyedLimiter<u64>`, every check on one key.
    GcraKeyed,
    /// GCRA, `KeyedLimiter<u64>`, checks spread over 1,000 keys.
    #[value(name = "gcra-keyed-1000")]
    GcraKeyed1000,
    /// GCRA, `KeyedLimiter<u64>`, checks spread over 1,000,000 keys.
    #[value(name = "gcra-keyed-1000000")]
    GcraKeyedMillion,
    /// governor's direct limiter (feature `peers`).
    GovernorDirect,
    /// governor's keyed limiter (DashMap, ahash) on 1,000 keys (feature
    /// `peers`).
    #[value(name = "governor-keyed-1000")]
    GovernorKeyed1000,
    /// governor's keyed limiter (DashMap, ahash) on 1,000,000 keys (feature
    /// `peers`).
    #[value(name = "governor-keyed-1000000")]
    GovernorKeyedMillion,
    /// GCRA, `KeyedLimiter<u64>::check_batch` over 1,000 keys, in batches
    /// of 1, 8, 32 and 256 (one row each, figures per key).
    #[value(name = "gcra-batch-1000")]
    GcraBatch1000,
    /// GCRA, `KeyedLimiter<u64>::check_batch` over 1,000,000 keys, in
    /// batches of 1, 8, 32 and 256 (one row each, figures per key).
    #[value(name = "gcra-batch-1000000")]
    GcraBatchMillion,
    /// Fixed window (`DirectLimiter::builder(quota).algorithm_for`).
    FixedWindow,
    /// Sliding-window counter (`DirectLimiter::builder(quota).algorithm_for`).
    SlidingWindow,
    /// Sliding log (a `Mutex` around the log).
    SlidingLog,
    /// The seeds' f64 token bucket (`SeedTokenBucket`, `Mutex<HashMap>`).
    SeedBucket,
}

impl Bench {
    /// Every row, in table order.
    const ALL: [Bench; 13] = [
        Bench::Gcra,
        Bench::GovernorDirect,
        Bench::GcraKeyed,
        Bench::GcraKeyed1000,
        Bench::GovernorKeyed1000,
        Bench::GcraBatch1000,
        Bench::GcraKeyedMillion,
        Bench::GovernorKeyedMillion,
        Bench::GcraBatchMillion,
        Bench::FixedWindow,
        Bench::SlidingWindow,
        Bench::SlidingLog,
        Bench::SeedBucket,
    ];

    /// The row label.
    fn label(self) -> &'static str {
        match self {
            Bench::Gcra => "GCRA DirectLimiter",
            Bench::GcraKeyed => "GCRA KeyedLimiter<u64>, 1 key",
            Bench::GcraKeyed1000 => "GCRA KeyedLimiter<u64>, 1,000 keys",
            Bench::GcraKeyedMillion => "GCRA KeyedLimiter<u64>, 1M keys",
            Bench::GovernorDirect => "governor direct",
            Bench::GovernorKeyed1000 => "governor keyed (ahash), 1,000 keys",
            Bench::GovernorKeyedMillion => "governor keyed (ahash), 1M keys",
            Bench::GcraBatch1000 => "GCRA check_batch 1,000 keys",
            Bench::GcraBatchMillion => "GCRA check_batch 1M keys",
            Bench::FixedWindow => "fixed window",
            Bench::SlidingWindow => "sliding-window counter",
            Bench::SlidingLog => "sliding log (Mutex)",
            Bench::SeedBucket => "seed f64 bucket (Mutex<HashMap>)",
        }
    }

    /// The algorithm of a one-bucket row the limiter factory builds.
    fn algorithm(self) -> Option<Algorithm> {
        match self {
            Bench::Gcra => Some(Algorithm::Gcra),
            Bench::FixedWindow => Some(Algorithm::FixedWindow),
            Bench::SlidingWindow => Some(Algorithm::SlidingWindow),
            Bench::SlidingLog => Some(Algorithm::SlidingLog),
            _ => None,
        }
    }

    /// The keys a keyed row spreads its checks over.
    fn keys(self) -> u64 {
        match self {
            Bench::GcraKeyedMillion | Bench::GovernorKeyedMillion | Bench::GcraBatchMillion => {
                MILLION_KEYS
            }
            _ => MANY_KEYS,
        }
    }

    /// The quota count per second this row runs with: large enough that
    /// most checks pass, within what the algorithm can hold.
    fn quota_count(self, checks: u64) -> u64 {
        let count = checks.max(MIN_QUOTA_COUNT);
        match self.algorithm().and_then(Algorithm::max_limit) {
            Some(max) => count.min(max),
            None => count,
        }
    }
}

/// The batch sizes of the `check_batch` rows.
const BATCH_SIZES: [u64; 4] = [1, 8, 32, 256];

/// Label of the timing-overhead row.
const OVERHEAD_LABEL: &str = "empty measurement (2 raw reads)";

/// The seeds' illustrative figures (`003_*.txt`, Ryzen 7 5800X), in ns:
/// label, mean, P50, P95, P99.
const SEED_FIGURES: [(&str, f64, u64, u64, u64); 2] = [
    ("Python 3.11 (Lock)", 1_442.0, 1_250, 2_100, 4_800),
    ("Go 1.21 (Mutex)", 84.0, 60, 140, 310),
];

/// What one row measured.
#[derive(Clone, Copy, Debug)]
struct Stats {
    /// Checks measured.
    checks: u64,
    /// Checks that were allowed.
    allowed: u64,
    /// Mean nanoseconds per check (timing included).
    mean: f64,
    /// Nearest-rank percentiles, in nanoseconds: P50, P95, P99, P99.9.
    percentiles: [u64; 4],
    /// The slowest check, in nanoseconds (a preempted thread shows here,
    /// and in the mean, long before it reaches P99.9).
    max: u64,
    /// Wall-clock time from the threads' start to the last one's end.
    wall: Duration,
}

/// The percentiles reported, as fractions.
const PERCENTILES: [f64; 4] = [0.50, 0.95, 0.99, 0.999];

/// Runs `checks` calls of `check(i)` (for `i` in `0..checks`) on `threads`
/// threads started together, timing each call.
fn measure<F>(threads: usize, checks: u64, check: F) -> Stats
where
    F: Fn(u64) -> bool + Sync,
{
    measure_counted(threads, checks, |i| u64::from(check(i)))
}

/// [`measure`] for calls that each decide several checks: `call(i)`
/// returns how many it allowed.
fn measure_counted<F>(threads: usize, checks: u64, check: F) -> Stats
where
    F: Fn(u64) -> u64 + Sync,
{
    let clock = quanta::Clock::new();
    let start = Barrier::new(threads + 1);
    let threads_u64 = threads as u64;
    let (per_thread, extra) = (checks / threads_u64, checks % threads_u64);
    let (mut samples, allowed, wall) = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads_u64)
            .map(|t| {
                // Thread t runs indexes [first, first + count).
                let first = t * per_thread + t.min(extra);
                let count = per_thread + u64::from(t < extra);
                let (clock, start, check) = (&clock, &start, &check);
                scope.spawn(move || {
                    let mut samples = Vec::with_capacity(count as usize);
                    let mut allowed = 0u64;
                    start.wait();
                    for i in first..first + count {
                        let begin = clock.raw();
                        let pass = black_box(check(black_box(i)));
                        let end = clock.raw();
                        samples.push(clock.delta_as_nanos(begin, end));
                        allowed += pass;
                    }
                    (samples, allowed)
                })
            })
            .collect();
        start.wait();
        let began = Instant::now();
        let mut samples = Vec::with_capacity(checks as usize);
        let mut allowed = 0;
        for handle in handles {
            // A check never panics; if one did, say so rather than hide it.
            let (part, pass) = handle.join().expect("a measuring thread panicked");
            samples.extend_from_slice(&part);
            allowed += pass;
        }
        (samples, allowed, began.elapsed())
    });
    samples.sort_unstable();
    let n = samples.len().max(1);
    let total: u128 = samples.iter().map(|&s| u128::from(s)).sum();
    let percentiles = PERCENTILES.map(|p| {
        // Nearest rank: the smallest sample with at least p of them at or below it.
        let rank = ((p * n as f64).ceil() as usize).clamp(1, n);
        samples.get(rank - 1).copied().unwrap_or(0)
    });
    Stats {
        checks,
        allowed,
        mean: total as f64 / n as f64,
        percentiles,
        max: samples.last().copied().unwrap_or(0),
        wall,
    }
}

/// Builds the limiter of `bench`, fills its bucket(s) and measures it.
fn run_bench(bench: Bench, threads: usize, checks: u64) -> Result<Stats, String> {
    let count = bench.quota_count(checks);
    let quota = Quota::per_second(count).map_err(|e| e.to_string())?;
    if let Some(algorithm) = bench.algorithm() {
        let limiter = algorithm
            .build(quota, QuantaClock::new())
            .map_err(|e| e.to_string())?;
        let _ = limiter.check();
        return Ok(measure(threads, checks, |_| limiter.check().is_allowed()));
    }
    Ok(match bench {
        Bench::GcraKeyed => {
            let limiter = KeyedLimiter::<u64>::new(keyed_quota(count)?);
            let _ = limiter.check(&0);
            measure(threads, checks, |_| limiter.check(&0).is_allowed())
        }
        Bench::GcraKeyed1000 | Bench::GcraKeyedMillion => {
            let keys = shuffled_keys(bench.keys());
            let limiter = KeyedLimiter::<u64>::builder(keyed_quota(count)?)
                .max_keys(keys.len())
                .build();
            for key in &keys {
                let _ = limiter.check(key);
            }
            measure(threads, checks, |i| {
                limiter.check(&walk(&keys, i)).is_allowed()
            })
        }
        Bench::GovernorDirect | Bench::GovernorKeyed1000 | Bench::GovernorKeyedMillion => {
            peers::run(bench, threads, checks, count)?
        }
        Bench::GcraBatch1000 | Bench::GcraBatchMillion => {
            return Err("a batch row is measured by run_rows, one row per size".to_owned())
        }
        Bench::Gcra | Bench::FixedWindow | Bench::SlidingWindow | Bench::SlidingLog => {
            return Err("a one-bucket row is built by the limiter factory, above".to_owned())
        }
        Bench::SeedBucket => {
            let rate = count as f64;
            let bucket = SeedTokenBucket::<u64>::new(rate, rate).map_err(|e| e.to_string())?;
            let _ = bucket.allow_request(&0, 1.0);
            measure(threads, checks, |_| bucket.allow_request(&0, 1.0))
        }
    })
}

/// The rows of `bench`: one, or one per batch size for the `check_batch`
/// rows (a limiter filled once, measured at every size).
fn run_rows(bench: Bench, threads: usize, checks: u64) -> Result<Vec<(String, Stats)>, String> {
    if !matches!(bench, Bench::GcraBatch1000 | Bench::GcraBatchMillion) {
        return Ok(vec![(
            bench.label().to_owned(),
            run_bench(bench, threads, checks)?,
        )]);
    }
    let keys = shuffled_keys(bench.keys());
    let limiter = KeyedLimiter::<u64>::builder(keyed_quota(bench.quota_count(checks))?)
        .max_keys(keys.len())
        .build();
    for key in &keys {
        let _ = limiter.check(key);
    }
    std::thread_local! {
        /// Each thread's batch of keys and its decisions, reused.
        static BUFFERS: RefCell<(Vec<u64>, Vec<Decision>)> = const {
            RefCell::new((Vec::new(), Vec::new()))
        };
    }
    Ok(BATCH_SIZES
        .iter()
        .map(|&size| {
            // Call `b` decides checks `b * size ..` of the same walk as the
            // keyed rows, one call per thread at least.
            let batches = (checks / size).max(threads as u64);
            let stats = measure_counted(threads, batches, |b| {
                BUFFERS.with(|buffers| {
                    let (batch, out) = &mut *buffers.borrow_mut();
                    batch.clear();
                    batch.extend((b * size..(b + 1) * size).map(|i| walk(&keys, i)));
                    limiter.check_batch(&batch[..], out);
                    out.iter().filter(|d| d.is_allowed()).count() as u64
                })
            });
            let label = format!("{}, b={size}", bench.label());
            (label, per_key(stats, size))
        })
        .collect())
}

/// A batch row's figures per key: each sample (one batch) divided by the
/// batch size.
fn per_key(stats: Stats, size: u64) -> Stats {
    Stats {
        checks: stats.checks * size,
        allowed: stats.allowed,
        mean: stats.mean / size as f64,
        percentiles: stats.percentiles.map(|ns| ns / size),
        max: stats.max / size,
        wall: stats.wall,
    }
}

/// `n` distinct keys in a random order, so a walk over them is not the
/// insertion order.
fn shuffled_keys(n: u64) -> Vec<u64> {
    let mut state = 0x7475_726e_7374_696c_u64;
    let mut next = move || {
        // SplitMix64.
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut keys: Vec<u64> = (0..n).collect();
    for i in (1..keys.len()).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        keys.swap(i, j);
    }
    keys
}

/// The keyed rows' quota: `count` per [`KEYED_INTERVAL`], burst `count`.
fn keyed_quota(count: u64) -> Result<Quota, String> {
    Quota::with_period(KEYED_INTERVAL)
        .and_then(|q| q.burst(count))
        .map_err(|e| e.to_string())
}

/// The key of check `i` in a keyed row.
#[inline]
fn walk(keys: &[u64], i: u64) -> u64 {
    keys[(i.wrapping_mul(WALK_STRIDE) % keys.len() as u64) as usize]
}

/// The governor rows, with feature `peers`.
#[cfg(feature = "peers")]
mod peers {
    use std::num::NonZeroU32;

    use super::{measure, shuffled_keys, walk, Bench, Stats, KEYED_INTERVAL};

    /// Measures a governor row: `count` per second, burst `count`.
    pub(super) fn run(
        bench: Bench,
        threads: usize,
        checks: u64,
        count: u64,
    ) -> Result<Stats, String> {
        let rate = u32::try_from(count)
            .ok()
            .and_then(NonZeroU32::new)
            .ok_or_else(|| format!("governor takes a quota count of 1 to {}", u32::MAX))?;
        if bench == Bench::GovernorDirect {
            let limiter = governor::RateLimiter::direct(governor::Quota::per_second(rate));
            let _ = limiter.check();
            return Ok(measure(threads, checks, |_| limiter.check().is_ok()));
        }
        let keys = shuffled_keys(bench.keys());
        let quota = governor::Quota::with_period(KEYED_INTERVAL)
            .ok_or("a zero period")?
            .allow_burst(rate);
        let limiter = governor::RateLimiter::dashmap_with_hasher(quota, ahash::RandomState::new());
        for key in &keys {
            let _ = limiter.check_key(key);
        }
        Ok(measure(threads, checks, |i| {
            limiter.check_key(&walk(&keys, i)).is_ok()
        }))
    }
}

/// Without feature `peers`, the governor rows say how to get them.
#[cfg(not(feature = "peers"))]
mod peers {
    use super::{Bench, Stats};

    pub(super) fn run(_: Bench, _: usize, _: u64, _: u64) -> Result<Stats, String> {
        Err("build with --features peers for governor's rows".to_owned())
    }
}

/// The CPU's model name from `/proc/cpuinfo`, if there is one.
fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(key, _)| key.trim() == "model name")
        .map(|(_, value)| value.trim().to_owned())
}

/// The 1-minute load average from `/proc/loadavg`, if there is one: other
/// work on the machine is the first thing that skews these figures.
fn load_average() -> Option<String> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_whitespace().next().map(str::to_owned)
}

/// `1234567` as `1,234,567`.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Column widths shared by the header and the rows.
const LABEL_WIDTH: usize = 34;

/// Prints the header of a results table.
fn header(out: &mut impl Write) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<LABEL_WIDTH$} {:>3} {:>8} {:>9} {:>7} {:>7} {:>7} {:>7} {:>9} {:>9} {:>9}",
        "row",
        "thr",
        "allowed",
        "mean",
        "p50",
        "p95",
        "p99",
        "p99.9",
        "max",
        "wall ms",
        "Mchecks/s"
    )
}

/// Prints one row of results.
fn row(out: &mut impl Write, label: &str, threads: usize, s: &Stats) -> std::io::Result<()> {
    let [p50, p95, p99, p999] = s.percentiles;
    let wall = s.wall.as_secs_f64();
    let rate = if wall > 0.0 {
        format!("{:.1}", s.checks as f64 / wall / 1e6)
    } else {
        "-".to_owned()
    };
    writeln!(
        out,
        "{label:<LABEL_WIDTH$} {threads:>3} {:>7.1}% {:>9.1} {p50:>7} {p95:>7} {p99:>7} {p999:>7} {:>9} {:>9.1} {rate:>9}",
        100.0 * s.allowed as f64 / s.checks.max(1) as f64,
        s.mean,
        s.max,
        wall * 1e3,
    )
}

/// Runs the latency table.
pub(crate) fn run(args: &LatencyArgs, out: &mut impl Write) -> Result<(), CliError> {
    let cores = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
    let many = match args.threads {
        Some(n) => usize::try_from(n)?,
        None => cores,
    };
    if (many as u64) > args.checks {
        return Err(CliError::FewerChecksThanThreads {
            checks: args.checks,
            threads: many,
        });
    }
    let benches: Vec<Bench> = if args.algorithms.is_empty() {
        Bench::ALL.to_vec()
    } else {
        Bench::ALL
            .into_iter()
            .filter(|b| args.algorithms.contains(b))
            .collect()
    };
    let mut thread_counts = vec![1];
    if many > 1 {
        thread_counts.push(many);
    }

    writeln!(
        out,
        "Latency per check: {} checks per row (split across the row's threads), one key unless noted,",
        grouped(args.checks)
    )?;
    writeln!(out, "buckets filled before timing; times in ns")?;
    writeln!(
        out,
        "machine: {}, {cores} cores (std::thread::available_parallelism), {} build",
        cpu_model().unwrap_or_else(|| "unknown CPU (no /proc/cpuinfo)".to_owned()),
        if cfg!(debug_assertions) {
            "DEBUG (not representative: use --release)"
        } else {
            "release"
        }
    )?;
    if let Some(load) = load_average() {
        writeln!(
            out,
            "load average (1 min) at start: {load}; with other work running, threads take turns \
             (max ~ one scheduler slice)"
        )?;
        writeln!(
            out,
            "and the multi-thread rows show little contention: compare their Mchecks/s"
        )?;
    }
    writeln!(
        out,
        "timing: each check between two quanta::Clock::raw() reads (delta_as_nanos); the first row"
    )?;
    writeln!(
        out,
        "is two reads back to back, a cost inside every row's figures, shown and not subtracted"
    )?;
    for &threads in &thread_counts {
        writeln!(out)?;
        header(out)?;
        let overhead = measure(threads, args.checks, |_| true);
        row(out, OVERHEAD_LABEL, threads, &overhead)?;
        for &bench in &benches {
            match run_rows(bench, threads, args.checks) {
                Ok(rows) => {
                    for (label, stats) in rows {
                        row(out, &label, threads, &stats)?;
                    }
                }
                Err(reason) => writeln!(out, "{:<LABEL_WIDTH$} n/a: {reason}", bench.label())?,
            }
        }
    }
    writeln!(out)?;
    writeln!(
        out,
        "Quotas (per second, burst = count; chosen so most checks pass):"
    )?;
    let count = Bench::Gcra.quota_count(args.checks);
    writeln!(
        out,
        "  {}/s for GCRA, sliding log, seed bucket (capacity and refill {})",
        count, count
    )?;
    writeln!(
        out,
        "  keyed rows: 1 per hour, burst {count} per key, so no key goes idle (and is evicted) between its checks"
    )?;
    writeln!(
        out,
        "  check_batch rows (b = keys per batch): each sample is one batch of the keyed rows' walk, shown"
    )?;
    writeln!(
        out,
        "  per key (the batch's time / b, one clock read per batch); compare with the keyed rows above"
    )?;
    writeln!(
        out,
        "  {}/s for the fixed window (its count is packed in 24 bits)",
        Bench::FixedWindow.quota_count(args.checks)
    )?;
    writeln!(
        out,
        "  {}/s for the sliding-window counter: its counts are packed in 16 bits and its window",
        Bench::SlidingWindow.quota_count(args.checks)
    )?;
    writeln!(
        out,
        "  must be >= 0.735 s, so at these rates most of its checks are denials (which skip the CAS)"
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "seed (illustrative, Ryzen 7 5800X): 003_*.txt, 1,000,000 token-bucket evaluations, thread"
    )?;
    writeln!(
        out,
        "count not stated; the post says it was generated with AI tools and calls these figures"
    )?;
    writeln!(
        out,
        "\"demonstration data\": quoted for scale, not measured here and not on this machine"
    )?;
    writeln!(
        out,
        "{:<LABEL_WIDTH$} {:>3} {:>8} {:>9} {:>7} {:>7} {:>7} {:>7}",
        "row", "thr", "", "mean", "p50", "p95", "p99", "p99.9"
    )?;
    for (label, mean, p50, p95, p99) in SEED_FIGURES {
        writeln!(
            out,
            "{label:<LABEL_WIDTH$} {:>3} {:>8} {mean:>9.1} {p50:>7} {p95:>7} {p99:>7} {:>7}",
            "?", "", "-"
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_runs_on_one_and_two_threads() {
        for bench in Bench::ALL {
            if matches!(bench, Bench::GcraBatch1000 | Bench::GcraBatchMillion) {
                continue; // below
            }
            for threads in [1, 2] {
                let stats = match run_bench(bench, threads, 1_000) {
                    Ok(stats) => stats,
                    Err(reason) if !cfg!(feature = "peers") && reason.contains("peers") => continue,
                    Err(reason) => panic!("{bench:?}: {reason}"),
                };
                assert_eq!(stats.checks, 1_000, "{bench:?}");
                assert!(stats.allowed <= 1_000, "{bench:?}");
                let [p50, p95, p99, p999] = stats.percentiles;
                assert!(p50 <= p95 && p95 <= p99 && p99 <= p999, "{bench:?}");
            }
        }
    }

    #[test]
    fn generous_quotas_let_most_checks_pass() {
        for bench in [Bench::Gcra, Bench::GcraKeyed1000, Bench::SeedBucket] {
            let stats = run_bench(bench, 1, 10_000).unwrap();
            assert_eq!(stats.allowed, 10_000, "{bench:?}");
        }
    }

    #[test]
    fn batch_rows_run_every_size_and_allow_every_key() {
        for threads in [1, 2] {
            let rows = run_rows(Bench::GcraBatch1000, threads, 2_048).unwrap();
            let sizes: Vec<String> = rows.iter().map(|(label, _)| label.clone()).collect();
            assert_eq!(sizes.len(), BATCH_SIZES.len());
            for ((label, stats), size) in rows.iter().zip(BATCH_SIZES) {
                assert!(label.ends_with(&format!("b={size}")), "{label}");
                assert!(label.len() <= LABEL_WIDTH, "{label}");
                assert_eq!(stats.checks, 2_048, "{label}: whole batches");
                assert_eq!(stats.allowed, stats.checks, "{label}");
                let [p50, p95, p99, p999] = stats.percentiles;
                assert!(p50 <= p95 && p95 <= p99 && p99 <= p999, "{label}");
            }
        }
        let rows = run_rows(Bench::GcraBatchMillion, 1, 512).unwrap();
        assert_eq!(rows.len(), BATCH_SIZES.len());
        assert!(rows.iter().all(|(_, s)| s.allowed == s.checks));
    }

    #[test]
    fn checks_are_split_across_threads_without_loss() {
        let stats = measure(3, 10, |i| i % 2 == 0);
        assert_eq!((stats.checks, stats.allowed), (10, 5));
    }

    #[test]
    fn keyed_walks_visit_every_key() {
        for n in [MANY_KEYS, MILLION_KEYS] {
            let keys: Vec<u64> = (0..n).collect();
            let mut seen = vec![false; n as usize];
            for i in 0..n {
                seen[walk(&keys, i) as usize] = true;
            }
            assert!(seen.iter().all(|&s| s), "{n} keys");
        }
    }

    #[test]
    fn numbers_are_grouped_by_thousands() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1_000), "1,000");
        assert_eq!(grouped(1_000_000), "1,000,000");
    }

    #[test]
    fn more_threads_than_checks_is_an_error() {
        let args = LatencyArgs {
            checks: 2,
            threads: Some(3),
            algorithms: vec![Bench::Gcra],
        };
        let message = run(&args, &mut Vec::new()).unwrap_err().to_string();
        assert!(message.contains("fewer than"), "{message}");
    }
}
