//! The sizes of the map's tables: tables fill to four fifths, successors
//! get three slots per two live keys and hold room for their copies in
//! `occupied` (`reserved_for_copies`), and a map's tables stop growing at
//! 7/4 slots per `max_keys` key (`largest_capacity`), so the tables at the
//! bound are not powers of two (175 slots for `max_keys` 100, 22 for 13,
//! 175,005 for 100,003).
//!
//! The tightest successors the sizing makes: at `max_keys` 10 a table of
//! 16 slots fills at 13, holds 10 for copies and takes 3 direct inserts
//! per migration, so with 8 threads inserting at once most inserts meet a
//! successor full of reserved room while its predecessor is still being
//! copied. A copy that found no room would fail a `debug_assert!` (debug
//! builds) or lose a bucket (release: `len` and the per-key reset count
//! disagree); `occupied` drifting up would make tables migrate over and
//! over (a hang, which the watchdog turns into a failure; migrations per
//! insert are counted); drifting down would overfill a table (a copy with
//! no room, again).
//!
//! Migrations of a table into one of the same size do not show in
//! `capacity()`, so keys count their `Hash` calls (`keys::copies`): a
//! lookup hashes its key once (asserted by `hashing_counts_lookups_exactly`),
//! and a migration hashes each bucket it copies. Run these in a debug build
//! too (the `debug_assert!`s).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use turnstile_rl::__private::HasherSeed as _;
use turnstile_rl::{KeyedLimiter, ManualClock, OverflowPolicy, Quota};
use turnstile_test_kit::keys::SplitMix;
use turnstile_test_kit::within::within;

use crate::keys::{
    assert_keys_dropped_once, check, copies, count_by_reset, limiter, reset, Id, Name, TestKey,
};
use crate::serial;
use crate::support::{bound_table, watchdog, Seen};

/// The counting of copies is exact: with no migration, every hash is a
/// lookup's.
#[test]
fn hashing_counts_lookups_exactly() {
    let _serial = serial();
    let base = copies();
    let limiter: KeyedLimiter<Id, ManualClock> =
        KeyedLimiter::builder("1/h burst 3".parse::<Quota>().unwrap())
            .clock(ManualClock::new())
            .build();
    for i in 0..200 {
        let _ = check(&limiter, &Id::new(i % 12));
    }
    assert_eq!(limiter.capacity(), 16);
    assert_eq!(
        copies() - base,
        0,
        "hashes beyond lookups with no migration"
    );
    // The 13th key fills the table to its limit; the 14th migrates it,
    // copying the 13.
    let _ = check(&limiter, &Id::new(12));
    let _ = check(&limiter, &Id::new(13));
    assert_eq!(limiter.capacity(), 32);
    assert_eq!(copies() - base, 13, "copies of one migration");
    drop(limiter);
    assert_keys_dropped_once("hashing");
}

/// A flood of fresh keys (3 x `max_keys` + 400, frozen clock,
/// `EvictFullest`) takes every map to its bound's table, and no further:
/// the largest capacity ever seen is exactly `bound_table(max_keys)`, the
/// last table is that one (migrations at the bound go to a table of the
/// same size), `len` never passes `max_keys`, and the keys found by reset
/// are exactly `len`. Sizes around the cap: 74,898 (7/4 of it, 131,071,
/// is just below 2^17) and 74,899 (just above: the cap is never used);
/// 12 is the smallest `max_keys` whose bound table is not a power of two.
#[test]
fn bound_tables_reach_their_documented_sizes() {
    let _serial = serial();
    let dog = watchdog("bound table sizes", Duration::from_secs(90));
    let started = Instant::now();
    let sizes = [
        1usize, 2, 3, 5, 7, 9, 10, 11, 12, 13, 17, 100, 1000, 74_898, 74_899, 100_003,
    ];
    let mut odd_reached = Vec::new();
    for &m in &sizes {
        let expect = bound_table(m);
        let clock = ManualClock::new();
        let limiter = limiter::<Id>(
            "1/h burst 3",
            &clock,
            m,
            OverflowPolicy::EvictFullest,
            m as u64,
        );
        let copies_before = copies();
        let mut seen = Seen::new();
        let total = 3 * m as u64 + 400;
        for id in 0..total {
            assert!(check(&limiter, &Id::new(id)).is_allowed(), "a fresh key");
            seen.saw(limiter.capacity());
            let len = limiter.len();
            assert!(len <= m, "max_keys {m}: len {len}");
            if id % 1024 == 0 {
                dog.tick();
            }
        }
        let stats = limiter.stats();
        let biggest = *seen.all.iter().max().unwrap();
        let copied = copies() - copies_before;
        eprintln!(
            "max_keys {m}: capacities {:?}, expected bound table {expect}, {} overflow evictions, {copied} buckets copied",
            if seen.all.len() > 12 { vec![biggest] } else { seen.all.iter().copied().collect() },
            stats.overflow_evictions
        );
        assert_eq!(biggest, expect, "max_keys {m}: largest table");
        assert_eq!(limiter.capacity(), expect, "max_keys {m}: final table");
        assert_eq!(limiter.len(), m, "max_keys {m}: len after the flood");
        assert_eq!(stats.overflow_evictions, total - m as u64, "max_keys {m}");
        assert_eq!(stats.overflow_refusals, 0, "max_keys {m}: refusals");
        // At least two migrations at the bound: each copies about `m`.
        if m > 1 {
            assert!(
                copied >= 2 * m as u64,
                "max_keys {m}: not reached: only {copied} copies"
            );
        }
        // At the bound, a migration copies the `m - 1` keys live beside the
        // inserting key's place and leaves room for about
        // `fill_limit - m` more inserts: so `extra` overflow inserts cost
        // at most (extra / room + 2) migrations' copies. More would mean
        // the bound's table migrates early (`occupied` drifting up).
        let (before, extra) = (copies(), 2 * m as u64 + 400);
        for id in total..total + extra {
            assert!(check(&limiter, &Id::new(id)).is_allowed(), "a fresh key");
            if id % 1024 == 0 {
                dog.tick();
            }
        }
        let at_bound = copies() - before;
        let room = (expect - expect / 5 - m) as u64;
        let most = (extra / room + 2) * m as u64;
        eprintln!(
            "max_keys {m}: at the bound, {extra} overflow inserts copied {at_bound} buckets ({:.2} a key; at most {most} allowed, room {room} a migration)",
            at_bound as f64 / extra as f64
        );
        assert!(
            at_bound <= most,
            "max_keys {m}: {at_bound} copies for {extra} inserts at the bound, above {most}"
        );
        assert_eq!(
            limiter.capacity(),
            expect,
            "max_keys {m}: table at the bound"
        );
        let found = count_by_reset(&limiter, 0..total + extra, Some(&dog));
        assert_eq!(found, m, "max_keys {m}: keys found by reset vs len");
        assert_eq!(limiter.len(), 0);
        if !expect.is_power_of_two() {
            odd_reached.push(expect);
        }
        drop(limiter);
    }
    dog.finish();
    eprintln!(
        "bound tables: odd tables reached {odd_reached:?} in {:?}",
        started.elapsed()
    );
    assert_eq!(
        odd_reached,
        [21, 22, 29, 175, 1750, 131_071, 175_005],
        "odd bound tables reached"
    );
    assert_keys_dropped_once("bound tables");
}

// ---------------------------------------------------------------------
// Tight successors: little room left beside the copies.

pub(crate) struct Tight {
    inserts: u64,
    pub(crate) copies: u64,
    overflow: u64,
    refusals: u64,
    max_len: usize,
    capacities: Vec<usize>,
}

/// `threads` threads check fresh keys (ids from a space of 64 k, so nearly
/// every check inserts) into a limiter of `max_keys` under `EvictFullest`,
/// on a frozen clock (housekeeping never runs: only inserts migrate), with
/// a reset every 8th check (dead slots, and buckets that die between a
/// migration's count and its copy). At the end the keys found by reset
/// must be exactly `len`.
pub(crate) fn tight_race<K: TestKey>(max_keys: usize, threads: u64, checks: u64) -> Tight {
    let clock = ManualClock::new();
    let limiter: KeyedLimiter<K, ManualClock> =
        KeyedLimiter::builder("1/h burst 3".parse::<Quota>().unwrap())
            .clock(clock.clone())
            .max_keys(max_keys)
            .overflow(OverflowPolicy::EvictFullest)
            .hasher_seed(max_keys as u64)
            .build();
    const SPACE: u64 = 1 << 16;
    let copies_before = copies();
    let max_len = AtomicUsize::new(0);
    let capacities = Mutex::new(Vec::new());
    thread::scope(|s| {
        for t in 0..threads {
            let (limiter, max_len, capacities) = (&limiter, &max_len, &capacities);
            s.spawn(move || {
                let mut rng = SplitMix(t * 7919 + max_keys as u64);
                let mut seen = Vec::new();
                for i in 0..checks {
                    let key = K::new(rng.next() % SPACE);
                    let _ = check(limiter, &key);
                    if i % 8 == 7 {
                        let _ = reset(limiter, &key);
                    }
                    max_len.fetch_max(limiter.len(), Ordering::Relaxed);
                    let capacity = limiter.capacity();
                    if !seen.contains(&capacity) {
                        seen.push(capacity);
                    }
                }
                capacities.lock().unwrap().extend(seen);
            });
        }
    });
    let stats = limiter.stats();
    let len = limiter.len();
    assert!(len <= max_keys, "len {len} above max_keys {max_keys}");
    let found = count_by_reset(&limiter, 0..SPACE, None);
    assert_eq!(found, len, "keys found by reset vs len");
    assert_eq!(limiter.len(), 0, "len after resetting every key");
    let mut capacities = capacities.into_inner().unwrap();
    capacities.sort_unstable();
    capacities.dedup();
    drop(limiter);
    Tight {
        inserts: stats.overflow_evictions + max_keys as u64,
        copies: copies() - copies_before,
        overflow: stats.overflow_evictions,
        refusals: stats.overflow_refusals,
        max_len: max_len.load(Ordering::Relaxed),
        capacities,
    }
}

fn tight<K: TestKey>(max_keys: usize, threads: u64, checks: u64) {
    let _serial = serial();
    let name = format!("tight {} max_keys {max_keys}", K::NAME);
    let r = within(Duration::from_secs(50), "tight successors", move || {
        tight_race::<K>(max_keys, threads, checks)
    });
    // A migration at max_keys copies at most max_keys buckets and makes
    // room for at least one insert: so at least copies / max_keys of them.
    let migrations_at_least = r.copies / max_keys as u64;
    eprintln!(
        "{name}: {threads} threads, ~{} inserts, {} overflow evictions, {} refusals, \
         {} buckets copied (>= {migrations_at_least} migrations, {:.2} copies per insert), \
         max len {}, capacities {:?}",
        r.inserts,
        r.overflow,
        r.refusals,
        r.copies,
        r.copies as f64 / r.inserts as f64,
        r.max_len,
        r.capacities
    );
    assert!(
        r.max_len <= max_keys,
        "{name}: len passed max_keys: {}",
        r.max_len
    );
    assert!(
        r.overflow >= threads * checks / 4,
        "{name}: not reached: only {} overflow evictions",
        r.overflow
    );
    assert!(
        migrations_at_least >= 200,
        "{name}: not reached: only {} buckets copied",
        r.copies
    );
    assert_keys_dropped_once(&name);
}

/// `max_keys` 10: tables of 16 slots, 10 held for copies, 3 direct inserts
/// per migration; 8 threads at once.
#[test]
fn tight_successors_lose_no_bucket_at_max_keys_10_u64() {
    tight::<Id>(10, 8, 6_000);
}

#[test]
fn tight_successors_lose_no_bucket_at_max_keys_10_string() {
    tight::<Name>(10, 8, 6_000);
}

/// `max_keys` 21: 32 slots, fill limit 26, 5 spare.
#[test]
fn tight_successors_lose_no_bucket_at_max_keys_21_u64() {
    tight::<Id>(21, 8, 6_000);
}

/// `max_keys` 170: 256 slots (four chunks, copied by several threads),
/// fill limit 205, 35 spare.
#[test]
fn tight_successors_lose_no_bucket_at_max_keys_170_string() {
    tight::<Name>(170, 6, 10_000);
}

/// `max_keys` 1, 2 and 3 under `EvictFullest` with 8 threads: every
/// insert evicts, evictors race for the same one or two victims, and
/// every 13th insert or so migrates the table.
#[test]
fn max_keys_1_2_and_3_stay_within_the_bound_in_the_smallest_table() {
    for max_keys in 1..=3 {
        let _serial = serial();
        let r = within(Duration::from_secs(40), "tiny max_keys", move || {
            tight_race::<Id>(max_keys, 8, 3_000)
        });
        eprintln!(
            "tiny max_keys {max_keys}: {} overflow evictions, {} refusals, {} copies, max len {}, capacities {:?}",
            r.overflow, r.refusals, r.copies, r.max_len, r.capacities
        );
        assert!(
            r.max_len <= max_keys,
            "len passed max_keys {max_keys}: {}",
            r.max_len
        );
        assert!(
            r.overflow >= 3_000,
            "not reached: {} overflow evictions",
            r.overflow
        );
        // Tables of 16 slots take at most 13 inserts each (at max_keys 1
        // a migration copies nothing: the one place in `len` is held by
        // the insert that starts it, its victim already dead).
        assert_eq!(r.capacities, [16], "tables other than the smallest");
        assert!(
            r.overflow / 13 >= 200,
            "not reached: {} overflow evictions, so few migrations",
            r.overflow
        );
        if max_keys > 1 {
            assert!(r.copies >= 100, "not reached: {} copies", r.copies);
        }
        assert_keys_dropped_once(&format!("tiny max_keys {max_keys}"));
    }
}
