//! Memory per key, measured by a counting global allocator (heap bytes the
//! program holds, not RSS), for turnstile and its peers; then the peak under
//! a flood of random keys.
//!
//! ```text
//! cargo bench --bench memory
//! ```
//!
//! 1. **Bytes per key at 1,000,000 live keys**: live heap bytes after one
//!    check of each of 1,000,000 distinct keys, minus the live bytes before
//!    the limiter was created, divided by 1,000,000. The figure therefore
//!    includes the limiter's own fixed cost (for turnstile, its pin
//!    records; for governor, its shards), the owned keys (a `String` key's
//!    16-byte heap buffer as well as its 24-byte header) and the map's slack
//!    at that size (a power-of-two table is between half and fully used).
//!    Retired tables turnstile has not yet freed (old tables from growing)
//!    counts too: it is memory the process holds. The keys are produced one
//!    at a time into a reused buffer, so the input is not counted. Quota: 1
//!    per hour, so no key goes idle while the others are inserted
//!    (turnstile's housekeeping would otherwise forget it).
//! 2. **Peak under a flood**: 10,000,000 random `u64` keys, one check each,
//!    as fast as one thread goes, quota `100/min burst 10` (a key stays
//!    non-idle for 600 ms, so the flood's keys are mostly live when the
//!    bound is reached). turnstile with `max_keys(100_000)`; governor has no
//!    bound (its `retain_recent` is not called, as nothing in governor calls
//!    it by itself), so its figure is that of holding all 10,000,000 keys.
//! 3. **The curve**: bytes per key as in 1, for `u64` keys and for 16-byte
//!    `String` keys, at key counts from 100,000 to 2,000,000, turnstile
//!    (with `max_keys` at the count) beside governor: a power-of-two table
//!    (either map's) is fuller or emptier depending on where the count
//!    falls, so one point alone says little.

use std::fmt::Write as _;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use turnstile_rl::{KeyedLimiter, Quota};
use turnstile_test_kit::reference::SeedTokenBucket;

use turnstile_test_kit::heap;

/// The kit's counting allocator: heap bytes held, and a pause at one allocation.
#[global_allocator]
static HEAP: heap::Counting = heap::Counting;

use heap::{live, mib};
use keys::SplitMix;
use turnstile_test_kit::keys;

const KEYS: usize = 1_000_000;
const FLOOD: u64 = 10_000_000;
const FLOOD_MAX_KEYS: usize = 100_000;

/// Writes `k` as 16 hex digits into `buf` (reused, so the input is not
/// counted) and hands the 16-byte key to `f`.
fn with_hex<R>(buf: &std::cell::RefCell<String>, k: u64, f: impl FnOnce(&String) -> R) -> R {
    let mut buf = buf.borrow_mut();
    buf.clear();
    write!(buf, "{k:016x}").expect("writing to a String");
    f(&buf)
}

/// A row of the per-key table: a limiter made by `make`, fed `KEYS` keys
/// produced by `check` (which gets the limiter and the key's random number).
/// `slots` reports the table size where the limiter can say.
fn per_key<L>(
    name: &str,
    make: impl FnOnce() -> L,
    check: impl Fn(&L, u64) -> bool,
    slots: impl Fn(&L) -> Option<usize>,
) -> String {
    let (bytes, elapsed, slots) = bytes_for(KEYS, make, check, slots);
    let slots = slots.map_or_else(
        || "-".to_owned(),
        |n| format!("{n} ({:.2} full)", KEYS as f64 / n as f64),
    );
    format!(
        "| {name} | {:.1} | {:.1} | {:.0} | {slots} |",
        bytes as f64 / KEYS as f64,
        mib(bytes),
        elapsed.as_nanos() as f64 / KEYS as f64,
    )
}

/// Live bytes held after `keys` checks of distinct keys, the time they
/// took, and the table size where the limiter can say.
fn bytes_for<L>(
    keys: usize,
    make: impl FnOnce() -> L,
    check: impl Fn(&L, u64) -> bool,
    slots: impl Fn(&L) -> Option<usize>,
) -> (usize, Duration, Option<usize>) {
    let baseline = live();
    let limiter = make();
    let mut rng = SplitMix(1);
    let start = Instant::now();
    for _ in 0..keys {
        assert!(check(&limiter, rng.next()), "a check was denied");
    }
    let elapsed = start.elapsed();
    let bytes = live() - baseline;
    let slots = slots(&limiter);
    drop(limiter);
    (bytes, elapsed, slots)
}

/// Peak live bytes above the baseline while `FLOOD` random keys go through
/// the limiter `make` builds, and the time it took.
fn flood<L>(make: impl FnOnce() -> L, check: impl Fn(&L, u64)) -> (usize, usize, Duration) {
    let baseline = live();
    heap::reset_peak();
    let limiter = make();
    let mut rng = SplitMix(42);
    let start = Instant::now();
    for _ in 0..FLOOD {
        check(&limiter, rng.next());
    }
    let elapsed = start.elapsed();
    let peak = heap::peak() - baseline;
    let end = live() - baseline;
    drop(limiter);
    (peak, end, elapsed)
}

fn main() {
    // `cargo bench` passes `--bench` (and any filter): nothing to choose here.
    let hour = Quota::per_hour(1).expect("a valid quota");
    let governor_hour = governor::Quota::per_hour(NonZeroU32::MIN);
    // The String rows format each key into a buffer the row owns, then hand
    // a borrowed `&str` (turnstile, seed) or `&String` (governor) to the
    // limiter: only the copy the limiter keeps is counted.
    let mut rows = Vec::new();
    rows.push(per_key(
        "turnstile `KeyedLimiter<u64>`",
        || KeyedLimiter::<u64>::new(hour),
        |l, k| l.check(&k).is_allowed(),
        |l| Some(l.capacity()),
    ));
    rows.push(per_key(
        "turnstile `KeyedLimiter<String>` (16-byte keys)",
        || {
            (
                KeyedLimiter::<String>::new(hour),
                std::cell::RefCell::new(String::new()),
            )
        },
        |(l, buf), k| with_hex(buf, k, |key| l.check(key.as_str()).is_allowed()),
        |(l, _)| Some(l.capacity()),
    ));
    rows.push(per_key(
        "governor keyed, DashMap std hasher, `u64`",
        || governor::RateLimiter::<u64, _, _>::keyed(governor_hour),
        |l, k| l.check_key(&k).is_ok(),
        |_| None,
    ));
    rows.push(per_key(
        "governor keyed, DashMap std hasher, `String` (16-byte keys)",
        || {
            (
                governor::RateLimiter::<String, _, _>::keyed(governor_hour),
                std::cell::RefCell::new(String::new()),
            )
        },
        |(l, buf), k| with_hex(buf, k, |key| l.check_key(key).is_ok()),
        |_| None,
    ));
    rows.push(per_key(
        "seed `SeedTokenBucket<u64>` (Mutex<HashMap>)",
        || SeedTokenBucket::<u64>::new(1.0, 1.0 / 3600.0).expect("valid"),
        |l, k| l.allow_request(&k, 1.0),
        |_| None,
    ));
    rows.push(per_key(
        "seed `SeedTokenBucket<String>` (16-byte keys)",
        || {
            (
                SeedTokenBucket::<String>::new(1.0, 1.0 / 3600.0).expect("valid"),
                std::cell::RefCell::new(String::new()),
            )
        },
        |(l, buf), k| with_hex(buf, k, |key| l.allow_request(key.as_str(), 1.0)),
        |_| None,
    ));

    println!("## Bytes per key at {KEYS} live keys (counting allocator)\n");
    println!("| limiter | bytes/key | total MiB | ns/insert (1 thread, incl. key formatting) | turnstile slots |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for row in &rows {
        println!("{row}");
    }

    let flood_quota: Quota = "100/min burst 10".parse().expect("a valid quota");
    let governor_flood = governor::Quota::per_minute(NonZeroU32::new(100).expect("non-zero"))
        .allow_burst(NonZeroU32::new(10).expect("non-zero"));
    let turnstile = flood(
        || {
            KeyedLimiter::<u64>::builder(flood_quota)
                .max_keys(FLOOD_MAX_KEYS)
                .build()
        },
        |l, k| {
            let _ = l.check(&k);
            debug_assert!(l.len() <= FLOOD_MAX_KEYS);
        },
    );
    let governor = flood(
        || governor::RateLimiter::<u64, _, _>::keyed(governor_flood),
        |l, k| {
            let _ = l.check_key(&k);
        },
    );

    println!("\n## Peak heap during a flood of {FLOOD} random u64 keys (one thread)\n");
    println!("| limiter | peak MiB | MiB at the end | time |");
    println!("| --- | ---: | ---: | ---: |");
    println!(
        "| turnstile `max_keys({FLOOD_MAX_KEYS})` | {:.1} | {:.1} | {:.1} s |",
        mib(turnstile.0),
        mib(turnstile.1),
        turnstile.2.as_secs_f64()
    );
    println!(
        "| governor keyed (DashMap, std hasher), unbounded | {:.1} | {:.1} | {:.1} s |",
        mib(governor.0),
        mib(governor.1),
        governor.2.as_secs_f64()
    );

    println!("\n## Bytes per key from 100,000 to 2,000,000 keys (`u64`, and 16-byte `String`)\n");
    println!("| keys | turnstile `u64` | turnstile slots | governor `u64` (DashMap, std hasher) | turnstile `String` | governor `String` |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: |");
    for keys in [
        100_000, 200_000, 300_000, 500_000, 700_000, 1_000_000, 1_500_000, 2_000_000,
    ] {
        let (ours, _, slots) = bytes_for(
            keys,
            || KeyedLimiter::<u64>::builder(hour).max_keys(keys).build(),
            |l, k| l.check(&k).is_allowed(),
            |l| Some(l.capacity()),
        );
        let (theirs, _, _) = bytes_for(
            keys,
            || governor::RateLimiter::<u64, _, _>::keyed(governor_hour),
            |l, k| l.check_key(&k).is_ok(),
            |_| None,
        );
        let (ours_string, _, _) = bytes_for(
            keys,
            || {
                (
                    KeyedLimiter::<String>::builder(hour).max_keys(keys).build(),
                    std::cell::RefCell::new(String::new()),
                )
            },
            |(l, buf), k| with_hex(buf, k, |key| l.check(key.as_str()).is_allowed()),
            |_| None,
        );
        let (theirs_string, _, _) = bytes_for(
            keys,
            || {
                (
                    governor::RateLimiter::<String, _, _>::keyed(governor_hour),
                    std::cell::RefCell::new(String::new()),
                )
            },
            |(l, buf), k| with_hex(buf, k, |key| l.check_key(key).is_ok()),
            |_| None,
        );
        let per = |bytes: usize| bytes as f64 / keys as f64;
        println!(
            "| {keys} | {:.1} | {} | {:.1} | {:.1} | {:.1} |",
            per(ours),
            slots.unwrap_or(0),
            per(theirs),
            per(ours_string),
            per(theirs_string)
        );
    }
}
