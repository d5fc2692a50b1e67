//! Adversarial review of tables of any size (commit 402b198): a hash is
//! mapped onto a table by a multiply-shift (`Table::home`), a probe wraps
//! at the end with a subtraction (`Table::after`), the sweep cursor is
//! reduced modulo the capacity, an overflow eviction's window starts at the
//! key's home, and a map's tables stop growing at 7/4 slots per `max_keys`
//! key (`largest_capacity`), so the tables at the bound are not powers of
//! two (175 slots for `max_keys` 100, 22 for 13, 175,005 for 100,003).
//!
//! Each test states what it reached: the odd capacities it saw (through
//! `capacity()`), how many buckets migrations copied (keys count their
//! `Hash` calls: a check, peek or reset hashes its key once, so every other
//! call is a migration's copy, as in `tests/attack_sizing.rs`), how many
//! overflow and idle evictions happened. Every multi-threaded test runs
//! under a watchdog that aborts the process on a hang.
//!
//! Keys count themselves made and dropped: every key must be dropped once
//! when the limiter and its threads are gone. The tests take turns (global
//! counters).

use std::collections::BTreeSet;
use std::hash::{Hash, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use turnstile_rl::__private::HasherSeed as _;
use turnstile_rl::{KeyedLimiter, ManualClock, OverflowPolicy, Quota};

use turnstile_test_kit::keys::SplitMix;
use turnstile_test_kit::watchdog::Watchdog;

static SERIAL: Mutex<()> = Mutex::new(());

static MADE: AtomicUsize = AtomicUsize::new(0);
static DROPPED: AtomicUsize = AtomicUsize::new(0);
static HASHES: AtomicU64 = AtomicU64::new(0);
/// Lookups made by the tests (checks, peeks and resets): one hash each.
static LOOKUPS: AtomicU64 = AtomicU64::new(0);
/// While set, hashing a key whose id is `POISON_MOD - 1` modulo
/// `POISON_MOD` panics.
static POISON: AtomicBool = AtomicBool::new(false);
const POISON_MOD: u64 = 1000;

fn serial() -> std::sync::MutexGuard<'static, ()> {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    POISON.store(false, Ordering::SeqCst);
    guard
}

/// A watchdog for one test: aborts the process if no worker reports
/// progress for 30 s, or if the test runs longer than `limit`. Stops
/// watching when dropped, so that a failed assertion fails its test only.
struct Dog(Watchdog);

impl std::ops::Deref for Dog {
    type Target = Watchdog;
    fn deref(&self) -> &Watchdog {
        &self.0
    }
}

impl Drop for Dog {
    fn drop(&mut self) {
        self.0.finish();
    }
}

fn watchdog(what: &'static str, limit: Duration) -> Dog {
    Dog(Watchdog::start(what, Duration::from_secs(30), limit))
}

fn hash_id<H: Hasher>(id: u64, h: &mut H) {
    HASHES.fetch_add(1, Ordering::Relaxed);
    if POISON.load(Ordering::Relaxed) && id % POISON_MOD == POISON_MOD - 1 {
        panic!("poisoned hash");
    }
    id.hash(h);
}

trait TestKey: Hash + Eq + Clone + Send + Sync + std::fmt::Debug + 'static {
    const NAME: &'static str;
    fn new(id: u64) -> Self;
}

/// A `u64`-sized key: 16-byte slots, four to a cache line.
#[derive(Debug, PartialEq, Eq)]
struct Id(u64);
impl TestKey for Id {
    const NAME: &'static str = "u64";
    fn new(id: u64) -> Self {
        MADE.fetch_add(1, Ordering::Relaxed);
        Id(id)
    }
}
impl Clone for Id {
    fn clone(&self) -> Self {
        Id::new(self.0)
    }
}
impl Drop for Id {
    fn drop(&mut self) {
        DROPPED.fetch_add(1, Ordering::Relaxed);
    }
}
impl Hash for Id {
    fn hash<H: Hasher>(&self, h: &mut H) {
        hash_id(self.0, h);
    }
}

/// A `String` key: 32-byte slots, two to a cache line.
#[derive(Debug, PartialEq, Eq)]
struct Name(String);
impl Name {
    fn id(&self) -> u64 {
        self.0[5..].parse().unwrap()
    }
}
impl TestKey for Name {
    const NAME: &'static str = "String";
    fn new(id: u64) -> Self {
        MADE.fetch_add(1, Ordering::Relaxed);
        Name(format!("name-{id}"))
    }
}
impl Clone for Name {
    fn clone(&self) -> Self {
        Name::new(self.id())
    }
}
impl Drop for Name {
    fn drop(&mut self) {
        DROPPED.fetch_add(1, Ordering::Relaxed);
    }
}
impl Hash for Name {
    fn hash<H: Hasher>(&self, h: &mut H) {
        hash_id(self.id(), h);
    }
}

/// A key whose every instance hashes alike: all keys share one home slot
/// in every table, so their probe chain is the table's filled run from
/// that home, and it wraps at the end of the table whenever the home lies
/// in the last four fifths (each hasher seed puts it elsewhere: over ten
/// seeds, all ten homes in the first fifth has odds of 1 in 10 million).
#[derive(Debug, PartialEq, Eq)]
struct Collide(u64);
impl TestKey for Collide {
    const NAME: &'static str = "colliding";
    fn new(id: u64) -> Self {
        MADE.fetch_add(1, Ordering::Relaxed);
        Collide(id)
    }
}
impl Clone for Collide {
    fn clone(&self) -> Self {
        Collide::new(self.0)
    }
}
impl Drop for Collide {
    fn drop(&mut self) {
        DROPPED.fetch_add(1, Ordering::Relaxed);
    }
}
impl Hash for Collide {
    fn hash<H: Hasher>(&self, h: &mut H) {
        HASHES.fetch_add(1, Ordering::Relaxed);
        0u64.hash(h);
    }
}

type Limiter<K> = KeyedLimiter<K, ManualClock>;

fn limiter<K: TestKey>(
    quota: &str,
    clock: &ManualClock,
    max_keys: usize,
    policy: OverflowPolicy,
    seed: u64,
) -> Limiter<K> {
    KeyedLimiter::builder(quota.parse::<Quota>().unwrap())
        .clock(clock.clone())
        .max_keys(max_keys)
        .overflow(policy)
        .hasher_seed(seed)
        .build()
}

fn check<K: TestKey>(limiter: &Limiter<K>, key: &K) -> turnstile_rl::Decision {
    LOOKUPS.fetch_add(1, Ordering::Relaxed);
    limiter.check(key)
}

fn check_with<K: TestKey>(limiter: &Limiter<K>, key: &K, quota: &Quota) -> turnstile_rl::Decision {
    LOOKUPS.fetch_add(1, Ordering::Relaxed);
    limiter.check_with(key, quota)
}

fn reset<K: TestKey>(limiter: &Limiter<K>, key: &K) -> bool {
    LOOKUPS.fetch_add(1, Ordering::Relaxed);
    limiter.reset(key)
}

fn peek<K: TestKey>(limiter: &Limiter<K>, key: &K) -> turnstile_rl::Decision {
    LOOKUPS.fetch_add(1, Ordering::Relaxed);
    limiter.peek(key)
}

/// Buckets copied by migrations so far: every `Hash` call not made by a
/// lookup of the tests'.
/// Exact once the threads are joined; while they run, lookups counted but
/// not hashed yet make it low by at most one per thread.
fn copies() -> u64 {
    let lookups = LOOKUPS.load(Ordering::SeqCst);
    HASHES.load(Ordering::SeqCst).saturating_sub(lookups)
}

/// Removes every key of `ids` with `reset` and returns how many were
/// there: beside `len`, shows that no bucket was lost or is there twice.
fn count_by_reset<K: TestKey>(
    limiter: &Limiter<K>,
    ids: impl Iterator<Item = u64>,
    dog: &Watchdog,
) -> usize {
    let mut found = 0;
    for (i, id) in ids.enumerate() {
        if reset(limiter, &K::new(id)) {
            found += 1;
        }
        if i % 4096 == 0 {
            dog.tick();
        }
    }
    found
}

/// Waits (up to 2 s) for keys held by exiting threads' epoch garbage.
fn settle() {
    for _ in 0..200 {
        if DROPPED.load(Ordering::SeqCst) >= MADE.load(Ordering::SeqCst) {
            return;
        }
        drop(KeyedLimiter::<u64>::new("1/s".parse::<Quota>().unwrap()));
        thread::sleep(Duration::from_millis(10));
    }
}

fn assert_keys_dropped_once(what: &str) {
    settle();
    let (made, dropped) = (MADE.load(Ordering::SeqCst), DROPPED.load(Ordering::SeqCst));
    assert_eq!(made, dropped, "{what}: keys made vs dropped");
}

/// What the commit says a table holding `live` keys below the bound gets:
/// three slots per two keys, rounded up to a power of two (at least 16).
fn pow2_table(live: usize) -> usize {
    (live + live / 2).max(16).next_power_of_two()
}

/// The table a map of `max_keys` uses once it holds `max_keys` keys:
/// `capacity_for(max_keys)` capped at 7/4 slots per key (at least 16).
fn bound_table(max_keys: usize) -> usize {
    pow2_table(max_keys).min((max_keys * 7 / 4).max(16).max(max_keys + max_keys / 2))
}

/// Records the distinct capacities a thread sees.
struct Seen {
    last: usize,
    all: BTreeSet<usize>,
}
impl Seen {
    fn new() -> Self {
        Seen {
            last: 0,
            all: BTreeSet::new(),
        }
    }
    fn saw(&mut self, capacity: usize) {
        if capacity != self.last {
            self.last = capacity;
            self.all.insert(capacity);
        }
    }
}

fn odd(capacities: &BTreeSet<usize>) -> Vec<usize> {
    capacities
        .iter()
        .copied()
        .filter(|c| !c.is_power_of_two())
        .collect()
}

// ---------------------------------------------------------------------
// 1. The sizes themselves, single-threaded and deterministic.
// ---------------------------------------------------------------------

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
        let found = count_by_reset(&limiter, 0..total + extra, &dog);
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
// 2. Exactness of hot keys while odd tables migrate under them.
// ---------------------------------------------------------------------

const HOT_BURST: u64 = 20;
const HOT_THREADS: u64 = 4;
const PASSES: u64 = 8;

/// Checks per hot-checking thread of hot key `i`: 0 to 7.
fn per_thread(i: u64) -> u64 {
    (i * 7 + 3) % PASSES
}

struct ExactReport {
    copies: u64,
    capacities: BTreeSet<usize>,
    max_len: usize,
    overflow_evictions: u64,
    refusals: u64,
    untracked: u64,
    churned: u64,
}

/// `hot` keys are checked once each by this thread, then `per_thread(i)`
/// more times by each of 4 threads (a key is checked 1 to 29 times in
/// all), on a frozen clock (quota 1/h burst 20), while 2 threads insert
/// and at once reset fresh keys: tombstones, so the table at the bound
/// migrates into one of the same (odd) size again and again. Each hot
/// thread checks in 8 passes and waits, before each, for about one
/// migration's worth of copies, so its checks span at least 8 migrations.
/// Nothing else is live but the churners' one key each, so no hot key may
/// be evicted: each must admit exactly min(checks, 20).
fn exact_at_the_bound<K: TestKey>(
    max_keys: usize,
    hot: u64,
    policy: OverflowPolicy,
    seed: u64,
    dog: &Watchdog,
) -> ExactReport {
    let clock = ManualClock::new();
    let limiter = limiter::<K>(
        &format!("1/h burst {HOT_BURST}"),
        &clock,
        max_keys,
        policy,
        seed,
    );
    let admitted: Vec<AtomicU64> = (0..hot).map(|_| AtomicU64::new(1)).collect();
    for i in 0..hot {
        assert!(check(&limiter, &K::new(i)).is_allowed());
        if i % 4096 == 0 {
            dog.tick();
        }
    }
    let copies_before = copies();
    let stop = AtomicBool::new(false);
    let capacities = Mutex::new(BTreeSet::new());
    let max_len = AtomicUsize::new(0);
    let churned = AtomicU64::new(0);
    // One migration at the bound copies about `hot` buckets.
    let per_pass = (hot / 2).max(1);
    thread::scope(|s| {
        let mut hot_threads = Vec::new();
        for t in 0..HOT_THREADS {
            let (limiter, admitted, dog) = (&limiter, &admitted, dog);
            hot_threads.push(s.spawn(move || {
                let mut rng = SplitMix(t + 77);
                let mut order: Vec<u64> = (0..hot).collect();
                let keys: Vec<K> = (0..hot).map(K::new).collect();
                for pass in 0..PASSES {
                    let start = copies();
                    let waiting = Instant::now();
                    while copies() < start + per_pass && waiting.elapsed() < Duration::from_secs(5)
                    {
                        thread::yield_now();
                    }
                    // A fresh order each pass (Fisher-Yates).
                    for j in (1..order.len()).rev() {
                        let k = (rng.next() % (j as u64 + 1)) as usize;
                        order.swap(j, k);
                    }
                    for (n, &i) in order.iter().enumerate() {
                        if per_thread(i) <= pass {
                            continue;
                        }
                        if check(limiter, &keys[i as usize]).is_allowed() {
                            admitted[i as usize].fetch_add(1, Ordering::Relaxed);
                        }
                        if n % 1024 == 0 {
                            dog.tick();
                        }
                    }
                }
            }));
        }
        for t in 0..2u64 {
            let (limiter, stop, capacities, max_len, churned, dog) =
                (&limiter, &stop, &capacities, &max_len, &churned, dog);
            s.spawn(move || {
                let mut id = (t + 1) << 40;
                let mut seen = Seen::new();
                while !stop.load(Ordering::Relaxed) {
                    id += 1;
                    let key = K::new(id);
                    let _ = check(limiter, &key);
                    max_len.fetch_max(limiter.len(), Ordering::Relaxed);
                    let _ = reset(limiter, &key);
                    seen.saw(limiter.capacity());
                    if id % 256 == 0 {
                        dog.tick();
                    }
                    churned.fetch_add(1, Ordering::Relaxed);
                }
                capacities.lock().unwrap().extend(seen.all);
            });
        }
        for h in hot_threads {
            h.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
    });
    let copied = copies() - copies_before;
    let stats = limiter.stats();
    let expected: Vec<u64> = (0..hot)
        .map(|i| (1 + HOT_THREADS * per_thread(i)).min(HOT_BURST))
        .collect();
    let got: Vec<u64> = admitted.iter().map(|a| a.load(Ordering::Relaxed)).collect();
    let wrong: Vec<(u64, u64, u64)> = (0..hot)
        .filter(|&i| got[i as usize] != expected[i as usize])
        .take(10)
        .map(|i| (i, got[i as usize], expected[i as usize]))
        .collect();
    assert!(
        wrong.is_empty(),
        "max_keys {max_keys}, {policy:?}: hot keys (id, admitted, expected) not exact: {wrong:?}"
    );
    // Every hot key is still there, exhausted or not, and nothing else.
    for i in (0..hot).step_by(((hot / 64) as usize).max(1)) {
        let d = peek(&limiter, &K::new(i));
        let left = HOT_BURST - expected[i as usize];
        assert_eq!(
            d.is_allowed(),
            left > 0,
            "max_keys {max_keys}: hot key {i} peeked"
        );
    }
    let len = limiter.len();
    let found = count_by_reset(&limiter, 0..hot, dog);
    assert_eq!(found as u64, hot, "max_keys {max_keys}: hot keys lost");
    assert_eq!(len as u64, hot, "max_keys {max_keys}: len vs hot keys");
    assert_eq!(limiter.len(), 0);
    let capacities = capacities.into_inner().unwrap();
    drop(limiter);
    ExactReport {
        copies: copied,
        capacities,
        max_len: max_len.load(Ordering::Relaxed),
        overflow_evictions: stats.overflow_evictions,
        refusals: stats.overflow_refusals,
        untracked: stats.overflow_untracked,
        churned: churned.load(Ordering::Relaxed),
    }
}

/// `exact_at_the_bound` `rounds` times, each with its own hasher seed.
fn exact<K: TestKey>(max_keys: usize, hot: u64, policy: OverflowPolicy, rounds: u64) {
    let _serial = serial();
    let dog = watchdog("exact burst at the bound", Duration::from_secs(90));
    for round in 0..rounds {
        exact_round::<K>(max_keys, hot, policy, round, &dog);
    }
    dog.finish();
}

fn exact_round<K: TestKey>(
    max_keys: usize,
    hot: u64,
    policy: OverflowPolicy,
    round: u64,
    dog: &Watchdog,
) {
    let started = Instant::now();
    let seed = (max_keys as u64) << 8 | round;
    let r = exact_at_the_bound::<K>(max_keys, hot, policy, seed, dog);
    let name = format!(
        "exact {} max_keys {max_keys} hot {hot} {policy:?} round {round}",
        K::NAME
    );
    eprintln!(
        "{name}: {} buckets copied (~{} migrations at the bound), capacities {:?}, \
         max len {}, {} churn keys, overflow evictions {}, refusals {}, untracked {}, {:?}",
        r.copies,
        r.copies / hot,
        r.capacities,
        r.max_len,
        r.churned,
        r.overflow_evictions,
        r.refusals,
        r.untracked,
        started.elapsed()
    );
    assert!(r.max_len <= max_keys, "{name}: len {}", r.max_len);
    assert_eq!(
        r.overflow_evictions, 0,
        "{name}: a hot key could be evicted"
    );
    let bound = bound_table(max_keys);
    assert!(!bound.is_power_of_two());
    assert!(
        r.capacities.contains(&bound),
        "{name}: not reached: the odd bound table {bound} never seen in {:?}",
        r.capacities
    );
    assert!(
        r.copies >= PASSES * hot / 2,
        "{name}: not reached: only {} copies",
        r.copies
    );
    assert_keys_dropped_once(&name);
}

/// `max_keys` 13: the bound table is 22 slots (16 while 11 keys or fewer
/// are live): 11 hot keys, the churners' keys fill it to 13 and are
/// refused there (`Deny`).
#[test]
fn exact_burst_at_max_keys_13_deny() {
    exact::<Id>(13, 11, OverflowPolicy::Deny, 40);
}

/// `max_keys` 17: 29 slots, 15 hot keys, `EvictFullest` (never needed).
#[test]
fn exact_burst_at_max_keys_17_evict_fullest() {
    exact::<Id>(17, 15, OverflowPolicy::EvictFullest, 40);
}

/// `max_keys` 100: 175 slots, `String` keys, `AllowUntracked` at 99 live.
#[test]
fn exact_burst_at_max_keys_100_string_allow_untracked() {
    exact::<Name>(100, 99, OverflowPolicy::AllowUntracked, 20);
}

/// `max_keys` 1000: 1750 slots (27 chunks of 64 and one of 22).
#[test]
fn exact_burst_at_max_keys_1000_deny() {
    exact::<Id>(1000, 999, OverflowPolicy::Deny, 10);
}

/// `max_keys` 100,003: 175,005 slots, 90,000 hot keys.
#[test]
fn exact_burst_at_max_keys_100003_evict_fullest() {
    exact::<Id>(100_003, 90_000, OverflowPolicy::EvictFullest, 2);
}

// ---------------------------------------------------------------------
// 3. Floods at tiny and odd bounds, every policy, frozen or moving clock.
// ---------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq)]
enum Time {
    /// The clock never moves: no housekeeping, only inserts migrate.
    Frozen,
    /// Each worker moves it 1 ms every 8 checks (quota 100/s burst 3:
    /// keys go idle; sweeps, cleanup and shrinking migrations run).
    Moving,
}

struct FloodReport {
    capacities: BTreeSet<usize>,
    max_len: usize,
    copies: u64,
    overflow_evictions: u64,
    refusals: u64,
    untracked: u64,
    idle: u64,
    len: usize,
}

/// Strangers a flood draws from: 64 k, or four per place for large
/// bounds; their ids start at `STRANGERS`.
fn space(max_keys: usize) -> u64 {
    (1u64 << 16).max(4 * max_keys as u64)
}

const STRANGERS: u64 = 1 << 32;

/// Regulars a flood draws from: ids below 2 x `max_keys` + 2.
fn regulars(max_keys: usize) -> u64 {
    2 * max_keys as u64 + 2
}

/// `threads` threads check random keys under `policy`: 7 in 8 from 2 x
/// `max_keys` + 2 regulars (every 4th check resets its key), 1 in 8 a
/// stranger from 64 k, reset at once. `len` sampled after every check must stay within
/// `max_keys`; at the end the keys found by reset are exactly `len`.
fn flood<K: TestKey>(
    max_keys: usize,
    threads: u64,
    checks: u64,
    policy: OverflowPolicy,
    time: Time,
    dog: &Watchdog,
) -> FloodReport {
    let clock = ManualClock::new();
    let quota = match time {
        Time::Frozen => "1/h burst 3",
        Time::Moving => "100/s burst 3",
    };
    let limiter = limiter::<K>(quota, &clock, max_keys, policy, max_keys as u64 + 1);
    let copies_before = copies();
    let capacities = Mutex::new(BTreeSet::new());
    let max_len = AtomicUsize::new(0);
    thread::scope(|s| {
        for t in 0..threads {
            let (limiter, capacities, max_len, clock, dog) =
                (&limiter, &capacities, &max_len, &clock, dog);
            s.spawn(move || {
                let mut rng = SplitMix(t * 7919 + max_keys as u64);
                let mut seen = Seen::new();
                for i in 0..checks {
                    // Most checks are of 2 x max_keys + 2 regulars (so
                    // that resets hit live keys under every policy); one
                    // in 8 is of a stranger, reset at once (a dead slot).
                    let stranger = rng.next().is_multiple_of(8);
                    let id = if stranger {
                        STRANGERS + rng.next() % space(max_keys)
                    } else {
                        rng.next() % regulars(max_keys)
                    };
                    let key = K::new(id);
                    let _ = check(limiter, &key);
                    if stranger || i % 4 == 3 {
                        let _ = reset(limiter, &key);
                    }
                    let len = limiter.len();
                    max_len.fetch_max(len, Ordering::Relaxed);
                    seen.saw(limiter.capacity());
                    if time == Time::Moving && i % 8 == 7 {
                        clock.advance(Duration::from_millis(1));
                    }
                    if i % 128 == 0 {
                        dog.tick();
                    }
                }
                capacities.lock().unwrap().extend(seen.all);
            });
        }
    });
    let stats = limiter.stats();
    let len = limiter.len();
    assert!(len <= max_keys, "len {len} above max_keys {max_keys}");
    let ids = (0..regulars(max_keys)).chain(STRANGERS..STRANGERS + space(max_keys));
    let found = count_by_reset(&limiter, ids, dog);
    assert_eq!(
        found, len,
        "max_keys {max_keys} {policy:?} {time:?}: keys found by reset vs len"
    );
    assert_eq!(limiter.len(), 0, "len after resetting every key");
    let copies = copies() - copies_before;
    drop(limiter);
    FloodReport {
        capacities: capacities.into_inner().unwrap(),
        max_len: max_len.load(Ordering::Relaxed),
        copies,
        overflow_evictions: stats.overflow_evictions,
        refusals: stats.overflow_refusals,
        untracked: stats.overflow_untracked,
        idle: stats.idle_evictions,
        len,
    }
}

/// Runs `flood` for each bound, asserts the bound, that the flood reached
/// the bound's table (odd when `bound_table` is), and what the policy did.
fn floods<K: TestKey>(
    what: &'static str,
    sizes: &[usize],
    threads: u64,
    checks: u64,
    policy: OverflowPolicy,
    time: Time,
) {
    let _serial = serial();
    let dog = watchdog(what, Duration::from_secs(120));
    let mut odd_seen = BTreeSet::new();
    let (mut idle, mut overflows) = (0, 0);
    for &m in sizes {
        let started = Instant::now();
        let r = flood::<K>(m, threads, checks, policy, time, &dog);
        let name = format!("{what}: {} max_keys {m} {policy:?} {time:?}", K::NAME);
        eprintln!(
            "{name}: capacities {:?}, max len {}, final len {}, {} copies, overflow evictions {}, \
             refusals {}, untracked {}, idle evictions {}, {:?}",
            r.capacities,
            r.max_len,
            r.len,
            r.copies,
            r.overflow_evictions,
            r.refusals,
            r.untracked,
            r.idle,
            started.elapsed()
        );
        assert!(r.max_len <= m, "{name}: len passed max_keys: {}", r.max_len);
        let bound = bound_table(m);
        // On a moving clock idle keys make room: the bound's table comes
        // only if the flood outruns the sweeps (asserted for the run).
        assert!(
            time == Time::Moving || r.capacities.contains(&bound),
            "{name}: not reached: bound table {bound} not in {:?}",
            r.capacities
        );
        assert!(
            r.capacities.iter().all(|&c| c <= bound.max(16)),
            "{name}: a table beyond the bound's {bound}: {:?}",
            r.capacities
        );
        odd_seen.extend(odd(&r.capacities));
        let overflowed = match policy {
            OverflowPolicy::EvictFullest => r.overflow_evictions,
            OverflowPolicy::Deny => r.refusals,
            _ => r.untracked,
        };
        // On a moving clock, sweeps make room as well (at large bounds,
        // all of it): both are asserted for the run below.
        assert!(
            overflowed + r.idle >= 100,
            "{name}: not reached: only {overflowed} overflows, {} idle evictions",
            r.idle
        );
        idle += r.idle;
        overflows += overflowed;
        // Migrations copied buckets (at `max_keys` 1 a migration copies
        // none: the one place is held by the insert that starts it).
        if m > 1 {
            let least = (5 * m as u64).min(50);
            assert!(
                r.copies >= least,
                "{name}: not reached: {} copies",
                r.copies
            );
        }
        assert_keys_dropped_once(&name);
    }
    dog.finish();
    eprintln!("{what}: odd tables seen {odd_seen:?}, overflows {overflows}, idle evictions {idle}");
    assert!(
        overflows >= 1000,
        "{what}: not reached: {overflows} overflows"
    );
    if time == Time::Moving {
        assert!(idle >= 1000, "{what}: not reached: {idle} idle evictions");
    }
    let expect_odd: BTreeSet<usize> = sizes
        .iter()
        .map(|&m| bound_table(m))
        .filter(|c| !c.is_power_of_two())
        .collect();
    assert!(
        expect_odd.is_subset(&odd_seen) || (time == Time::Moving && !odd_seen.is_empty()),
        "{what}: odd tables {expect_odd:?} not all seen: {odd_seen:?}"
    );
}

/// 11: 16 slots hold 11 copies and take 2 inserts (the tightest
/// successor); 12 and 13: 16 or 21/22 slots by the live count.
const TINY_AND_ODD: [usize; 11] = [1, 2, 3, 5, 7, 11, 12, 13, 17, 100, 1000];

#[test]
fn flood_evict_fullest_frozen_clock() {
    floods::<Id>(
        "flood",
        &TINY_AND_ODD,
        8,
        6_000,
        OverflowPolicy::EvictFullest,
        Time::Frozen,
    );
}

#[test]
fn flood_evict_fullest_moving_clock() {
    floods::<Id>(
        "flood",
        &TINY_AND_ODD,
        8,
        6_000,
        OverflowPolicy::EvictFullest,
        Time::Moving,
    );
}

/// 100,003: the bound table of 175,005 slots comes only after the resets
/// and overflow evictions fill the 131,072 slots' table with dead ones.
#[test]
fn flood_evict_fullest_at_100003() {
    floods::<Id>(
        "flood",
        &[100_003],
        4,
        150_000,
        OverflowPolicy::EvictFullest,
        Time::Frozen,
    );
}

#[test]
fn flood_evict_fullest_string_keys() {
    floods::<Name>(
        "flood",
        &[3, 13, 100, 1000],
        6,
        6_000,
        OverflowPolicy::EvictFullest,
        Time::Frozen,
    );
}

#[test]
fn flood_deny_frozen_and_moving() {
    floods::<Id>(
        "flood",
        &[1, 3, 13, 100],
        6,
        6_000,
        OverflowPolicy::Deny,
        Time::Frozen,
    );
    floods::<Id>(
        "flood",
        &[2, 17, 1000],
        6,
        6_000,
        OverflowPolicy::Deny,
        Time::Moving,
    );
}

#[test]
fn flood_allow_untracked_frozen_and_moving() {
    floods::<Id>(
        "flood",
        &[2, 17, 1000],
        6,
        6_000,
        OverflowPolicy::AllowUntracked,
        Time::Frozen,
    );
    floods::<Name>(
        "flood",
        &[5, 13, 17],
        6,
        6_000,
        OverflowPolicy::AllowUntracked,
        Time::Moving,
    );
}

// ---------------------------------------------------------------------
// 4. The sweep cursor on an odd table.
// ---------------------------------------------------------------------

/// A table at the bound (odd) holds `max_keys - 1` keys, about a fifth of
/// its slots of which go idle (fewer than a quarter: no cleanup migration
/// starts, so only the sweep evicts them). Each 1 ms tick sweeps 256 slots
/// from the cursor, reduced modulo the capacity and wrapped with `after`:
/// after `ceil(capacity / 256) - 1` ticks some idle keys are left (the
/// slots not yet swept), after `ceil(capacity / 256)` none is, whatever the
/// wrap; the busy keys are all there, untouched, after many more laps.
fn sweep_laps(max_keys: usize) {
    let dog = watchdog("sweep laps", Duration::from_secs(60));
    let clock = ManualClock::new();
    let bound = bound_table(max_keys);
    assert!(!bound.is_power_of_two());
    let limiter = limiter::<Id>(
        "1/h burst 5",
        &clock,
        max_keys,
        OverflowPolicy::Deny,
        max_keys as u64 * 3,
    );
    let fast: Quota = "1000/s burst 1".parse().unwrap();
    let live = max_keys as u64 - 1;
    // Below a quarter of the table even with a dead slot or two left by
    // the churn below: no cleanup migration.
    let idle_keys = (bound / 5).min(bound / 4 - 2) as u64;
    // Ids below `idle_keys` go idle at 1 ms; the rest (and the ticker, id
    // `live - 1`) are busy for an hour.
    let is_idle = |id: u64| id < idle_keys;
    for id in 0..live {
        let d = if is_idle(id) {
            check_with(&limiter, &Id::new(id), &fast)
        } else {
            check(&limiter, &Id::new(id))
        };
        assert!(d.is_allowed());
        if id % 4096 == 0 {
            dog.tick();
        }
    }
    // Dead slots until the table at the bound is the root: fresh keys
    // inserted and reset in the one place left (`Deny` keeps the rest).
    let mut churn = 1u64 << 40;
    let mut seen = Seen::new();
    while limiter.capacity() != bound {
        churn += 1;
        assert!(check(&limiter, &Id::new(churn)).is_allowed());
        assert!(reset(&limiter, &Id::new(churn)));
        seen.saw(limiter.capacity());
        assert!(
            churn - (1 << 40) < 10 * bound as u64,
            "the bound table never came"
        );
        if churn.is_multiple_of(4096) {
            dog.tick();
        }
    }
    assert_eq!(limiter.len() as u64, live);
    let ticker = Id::new(live - 1);
    let laps = bound.div_ceil(256);
    clock.advance(Duration::from_millis(2));
    let mut after = Vec::new();
    for _ in 0..laps {
        let _ = check(&limiter, &ticker);
        clock.advance(Duration::from_millis(1));
        after.push(limiter.len() as u64);
        dog.tick();
    }
    let stats = limiter.stats();
    eprintln!(
        "sweep laps, max_keys {max_keys}: table {} (odd), {live} keys of which {idle_keys} idle, \
         {} churn keys to reach it; len after each of {laps} ticks: ..{:?}; idle evictions {}",
        limiter.capacity(),
        churn - (1 << 40),
        &after[after.len().saturating_sub(3)..],
        stats.idle_evictions
    );
    assert_eq!(
        limiter.capacity(),
        bound,
        "a migration ran: the sweep was not alone"
    );
    assert!(
        laps == 1 || after[laps - 2] > live - idle_keys,
        "the idle keys were gone before a whole lap (len {}): no migration was to run",
        after[laps - 2]
    );
    assert_eq!(
        after[laps - 1],
        live - idle_keys,
        "one lap of {laps} ticks of 256 slots did not sweep all {bound} slots"
    );
    assert_eq!(stats.idle_evictions, idle_keys);
    // Many more laps, wrapping at odd places: no busy key goes.
    for _ in 0..5 * laps {
        let _ = check(&limiter, &ticker);
        clock.advance(Duration::from_millis(1));
        dog.tick();
    }
    assert_eq!(limiter.len() as u64, live - idle_keys);
    for id in idle_keys..live - 1 {
        assert_eq!(peek(&limiter, &Id::new(id)).remaining(), 3, "busy key {id}");
    }
    let found = count_by_reset(&limiter, 0..live, &dog);
    assert_eq!(found as u64, live - idle_keys);
    drop(limiter);
    dog.finish();
}

#[test]
fn sweep_laps_an_odd_table_of_1750() {
    let _serial = serial();
    sweep_laps(1000);
    assert_keys_dropped_once("sweep 1750");
}

#[test]
fn sweep_laps_an_odd_table_of_131071() {
    let _serial = serial();
    sweep_laps(74_898);
    assert_keys_dropped_once("sweep 131071");
}

#[test]
fn sweep_laps_an_odd_table_of_22() {
    let _serial = serial();
    sweep_laps(13);
    assert_keys_dropped_once("sweep 22");
}

// ---------------------------------------------------------------------
// 5. evict_idle shrinking odd tables while inserts race it.
// ---------------------------------------------------------------------

/// 16 hot keys (1/h burst 20) checked by 3 threads (one through
/// `check_batch`) all along; 2 threads insert churn keys on a 1 ms quota,
/// `max_keys - 24` per step (the table grows through the fill limit of the
/// power of two below the bound into the bound's odd table: 1750 slots
/// for 1000, 875 for 500); a driver moves the clock 5 ms and calls
/// `evict_idle` 200 times (1 s in all), which shrinks the table, racing
/// the inserts that grow it back to the bound's (odd) table. `Deny`, and
/// room for the hot keys and every churn key of a step: no key is ever
/// refused or evicted for room, so each hot key admits exactly 20.
fn shrink_race(max_keys: usize) {
    let _serial = serial();
    let dog = watchdog("evict_idle race", Duration::from_secs(90));
    let started = Instant::now();
    const HOT: u64 = 16;
    const BURST: u64 = 20;
    let clock = ManualClock::new();
    let limiter = limiter::<Id>(
        &format!("1/h burst {BURST}"),
        &clock,
        max_keys,
        OverflowPolicy::Deny,
        max_keys as u64 + 7,
    );
    let fast: Quota = "1000/s burst 1".parse().unwrap();
    let budget_per_step = max_keys as u64 - HOT - 8;
    let budget = AtomicU64::new(budget_per_step);
    let admitted: Vec<AtomicU64> = (0..HOT).map(|_| AtomicU64::new(0)).collect();
    let stop = AtomicBool::new(false);
    let capacities = Mutex::new(BTreeSet::new());
    let (mut grew, mut shrank, mut evicted) = (0u64, 0u64, 0usize);
    let max_len = AtomicUsize::new(0);
    thread::scope(|s| {
        for t in 0..3u64 {
            let (limiter, admitted, stop, dog) = (&limiter, &admitted, &stop, &dog);
            s.spawn(move || {
                let keys: Vec<Id> = (0..HOT).map(|i| Id::new(1 << 50 | i)).collect();
                let mut rng = SplitMix(t + 5);
                let mut out = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    if t == 0 {
                        let start = (rng.next() % HOT) as usize;
                        let batch: Vec<Id> = (0..4)
                            .map(|j| keys[(start + j * 5) % HOT as usize].clone())
                            .collect();
                        LOOKUPS.fetch_add(batch.len() as u64, Ordering::Relaxed);
                        limiter.check_batch(&batch, &mut out);
                        for (key, d) in batch.iter().zip(&out) {
                            if d.is_allowed() {
                                admitted[(key.0 & 0xff) as usize].fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    } else {
                        let i = (rng.next() % HOT) as usize;
                        if check(limiter, &keys[i]).is_allowed() {
                            admitted[i].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    dog.tick();
                    thread::yield_now();
                }
            });
        }
        for t in 0..2u64 {
            let (limiter, budget, stop, fast, capacities, max_len, dog) =
                (&limiter, &budget, &stop, &fast, &capacities, &max_len, &dog);
            s.spawn(move || {
                let mut id = (t + 1) << 40;
                let mut seen = Seen::new();
                while !stop.load(Ordering::Relaxed) {
                    let spent = budget
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(1));
                    if spent.is_err() {
                        thread::yield_now();
                        continue;
                    }
                    id += 1;
                    let _ = check_with(limiter, &Id::new(id), fast);
                    max_len.fetch_max(limiter.len(), Ordering::Relaxed);
                    seen.saw(limiter.capacity());
                    dog.tick();
                }
                capacities.lock().unwrap().extend(seen.all);
            });
        }
        let mut capacity = limiter.capacity();
        for _ in 0..200 {
            let waiting = Instant::now();
            // All of this step's churn inserted (at most the two in flight
            // survive the eviction, not being idle yet): the table holds
            // up to `max_keys - 6` keys, its growth reached the bound's.
            while budget.load(Ordering::Relaxed) > 0 && waiting.elapsed() < Duration::from_secs(2) {
                thread::yield_now();
            }
            let before = limiter.capacity();
            if before > capacity {
                grew += 1;
            }
            clock.advance(Duration::from_millis(5));
            evicted += limiter.evict_idle();
            capacity = limiter.capacity();
            if capacity < before {
                shrank += 1;
            }
            capacities.lock().unwrap().insert(before);
            budget.store(budget_per_step, Ordering::Relaxed);
        }
        stop.store(true, Ordering::Relaxed);
    });
    let stats = limiter.stats();
    let admitted: Vec<u64> = admitted.iter().map(|a| a.load(Ordering::Relaxed)).collect();
    clock.advance(Duration::from_millis(5));
    limiter.evict_idle();
    assert_eq!(limiter.len() as u64, HOT, "only the hot keys are left");
    clock.advance(Duration::from_secs(365 * 24 * 3600));
    assert_eq!(limiter.evict_idle() as u64, HOT);
    assert_eq!(limiter.len(), 0);
    drop(limiter);
    dog.finish();
    let capacities = capacities.into_inner().unwrap();
    eprintln!(
        "evict_idle race, max_keys {max_keys}: grew {grew}, shrank {shrank}, {evicted} evicted \
         by evict_idle, capacities {capacities:?}, max len {}, refusals {}, overflow evictions {}, \
         admitted per hot key {admitted:?}, {:?}",
        max_len.load(Ordering::Relaxed),
        stats.overflow_refusals,
        stats.overflow_evictions,
        started.elapsed()
    );
    let bound = bound_table(max_keys);
    assert!(
        capacities.contains(&bound),
        "not reached: the odd bound table {bound} not in {capacities:?}"
    );
    assert!(
        grew >= 20 && shrank >= 20,
        "not reached: grew {grew}, shrank {shrank}"
    );
    assert!(max_len.load(Ordering::Relaxed) <= max_keys);
    assert_eq!(stats.overflow_evictions, 0);
    assert_eq!(
        stats.overflow_refusals, 0,
        "a key refused: the room was there"
    );
    assert!(
        admitted.iter().all(|&a| a == BURST),
        "a hot key admitted other than its burst: {admitted:?}"
    );
    assert_keys_dropped_once("evict_idle race");
}

#[test]
fn evict_idle_races_growth_to_the_odd_bound_of_1000() {
    shrink_race(1000);
}

/// 500: the table of 512 slots fills at 410 and grows into 875.
#[test]
fn evict_idle_races_growth_to_the_odd_bound_of_500() {
    shrink_race(500);
}

// ---------------------------------------------------------------------
// 6. A panicking `Hash` in migrations of odd tables.
// ---------------------------------------------------------------------

/// Each round plants one poisoned key, then 4 threads insert fresh keys
/// until a migration has panicked on it (the migrating check panics, the
/// bucket is lost as if evicted, the room held for its copy is given
/// back) or an overflow evicted it. After 150 rounds: `len` within the
/// bound, the keys found by reset are `len`, every key dropped once.
fn poisoned(max_keys: usize) {
    let _serial = serial();
    // The planted panics are expected: keep their messages out of the log.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let planted = info
            .payload()
            .downcast_ref::<&str>()
            .is_some_and(|m| *m == "poisoned hash");
        if !planted {
            hook(info);
        }
    }));
    poisoned_rounds(max_keys);
    let _ = std::panic::take_hook();
}

fn poisoned_rounds(max_keys: usize) {
    let dog = watchdog("poisoned hash", Duration::from_secs(60));
    const ROUNDS: u64 = 150;
    let clock = ManualClock::new();
    let limiter = limiter::<Id>(
        "1/h burst 3",
        &clock,
        max_keys,
        OverflowPolicy::EvictFullest,
        max_keys as u64 + 11,
    );
    let copies_before = copies();
    let panics = AtomicU64::new(0);
    let capacities = Mutex::new(BTreeSet::new());
    for round in 0..ROUNDS {
        let poisoned = round * POISON_MOD + POISON_MOD - 1;
        POISON.store(false, Ordering::SeqCst);
        let _ = check(&limiter, &Id::new(poisoned));
        POISON.store(true, Ordering::SeqCst);
        let stop = AtomicBool::new(false);
        thread::scope(|s| {
            for t in 0..4u64 {
                let (limiter, stop, panics, capacities, dog) =
                    (&limiter, &stop, &panics, &capacities, &dog);
                s.spawn(move || {
                    let mut seen = Seen::new();
                    let mut i = 0;
                    while !stop.load(Ordering::Relaxed) && i < 3 * max_keys as u64 + 200 {
                        i += 1;
                        let id = round * POISON_MOD + (t * 250 + i) % (POISON_MOD - 1);
                        let key = Id::new(id);
                        if catch_unwind(AssertUnwindSafe(|| check(limiter, &key))).is_err() {
                            panics.fetch_add(1, Ordering::Relaxed);
                            stop.store(true, Ordering::Relaxed);
                        }
                        seen.saw(limiter.capacity());
                        assert!(limiter.len() <= max_keys);
                        dog.tick();
                    }
                    capacities.lock().unwrap().extend(seen.all);
                });
            }
        });
    }
    POISON.store(false, Ordering::SeqCst);
    let len = limiter.len();
    assert!(len <= max_keys);
    let found = count_by_reset(&limiter, 0..ROUNDS * POISON_MOD, &dog);
    assert_eq!(found, len, "keys found by reset vs len");
    // The map still works at its bound: a fresh flood reaches it again.
    for id in 0..3 * max_keys as u64 {
        let _ = check(&limiter, &Id::new(1 << 45 | id));
    }
    assert_eq!(limiter.len(), max_keys);
    let copies = copies() - copies_before;
    drop(limiter);
    dog.finish();
    let capacities = capacities.into_inner().unwrap();
    let panics = panics.load(Ordering::Relaxed);
    eprintln!(
        "poisoned hash, max_keys {max_keys}: {panics} panicking migrations caught in {ROUNDS} \
         rounds, {copies} buckets copied, capacities {capacities:?}, len {len}"
    );
    assert!(
        panics >= ROUNDS / 4,
        "not reached: {panics} panicking migrations"
    );
    let bound = bound_table(max_keys);
    assert!(
        capacities.contains(&bound),
        "not reached: odd table {bound} not in {capacities:?}"
    );
    assert_keys_dropped_once("poisoned hash");
}

#[test]
fn poisoned_hash_in_migrations_of_22_slots() {
    poisoned(13);
}

#[test]
fn poisoned_hash_in_migrations_of_175_slots() {
    poisoned(100);
}

// ---------------------------------------------------------------------
// 7. `clear` and batches racing a flood at odd bounds.
// ---------------------------------------------------------------------

/// 4 threads flood a limiter at `max_keys` (frozen clock, `EvictFullest`),
/// two of them through `check_batch` (8 keys a batch: prefetches of home
/// slots on the odd root while it migrates), while a fifth calls `clear`
/// every 0.3 ms: a whole-table migration into a successor sized for the
/// live keys (the bound's odd table) racing the flood's inserts and
/// overflow evictions, then a shrink. `len` within the bound throughout;
/// at the end the keys found by reset are `len`, every key dropped once.
fn clear_race(max_keys: usize) {
    let _serial = serial();
    let dog = watchdog("clear race", Duration::from_secs(60));
    let started = Instant::now();
    let clock = ManualClock::new();
    let limiter = limiter::<Id>(
        "1/h burst 3",
        &clock,
        max_keys,
        OverflowPolicy::EvictFullest,
        max_keys as u64 + 13,
    );
    const CHECKS: u64 = 40_000;
    let capacities = Mutex::new(BTreeSet::new());
    let max_len = AtomicUsize::new(0);
    let done = AtomicU64::new(0);
    // Clears made so far: the flood goes on until there have been 20, so
    // that a slow scheduler cannot leave the race unreached.
    let clears_made = AtomicU64::new(0);
    let (mut cleared, mut clears) = (0usize, 0u64);
    let mut slowest = Duration::ZERO;
    let space = regulars(max_keys) * 2;
    thread::scope(|s| {
        for t in 0..4u64 {
            let (limiter, capacities, max_len, done, clears_made, dog) =
                (&limiter, &capacities, &max_len, &done, &clears_made, &dog);
            s.spawn(move || {
                let mut rng = SplitMix(t + 1000 * max_keys as u64);
                let mut seen = Seen::new();
                let mut out = Vec::new();
                let mut i = 0;
                while i < CHECKS || clears_made.load(Ordering::Relaxed) < 20 {
                    if t < 2 {
                        let batch: Vec<Id> = (0..8).map(|_| Id::new(rng.next() % space)).collect();
                        LOOKUPS.fetch_add(batch.len() as u64, Ordering::Relaxed);
                        limiter.check_batch(&batch, &mut out);
                        assert_eq!(out.len(), batch.len());
                        i += 8;
                    } else {
                        let key = Id::new(rng.next() % space);
                        let _ = check(limiter, &key);
                        if i % 4 == 3 {
                            let _ = reset(limiter, &key);
                        }
                        i += 1;
                    }
                    max_len.fetch_max(limiter.len(), Ordering::Relaxed);
                    seen.saw(limiter.capacity());
                    dog.tick();
                }
                capacities.lock().unwrap().extend(seen.all);
                done.fetch_add(1, Ordering::SeqCst);
            });
        }
        let mut seen = Seen::new();
        while done.load(Ordering::SeqCst) < 4 {
            thread::sleep(Duration::from_micros(300));
            seen.saw(limiter.capacity());
            let took = Instant::now();
            cleared += limiter.clear();
            slowest = slowest.max(took.elapsed());
            clears += 1;
            clears_made.store(clears, Ordering::Relaxed);
            seen.saw(limiter.capacity());
            dog.tick();
        }
        capacities.lock().unwrap().extend(seen.all);
    });
    let stats = limiter.stats();
    let len = limiter.len();
    assert!(len <= max_keys, "len {len} above {max_keys}");
    let found = count_by_reset(&limiter, 0..space, &dog);
    assert_eq!(
        found, len,
        "max_keys {max_keys}: keys found by reset vs len"
    );
    assert_eq!(limiter.len(), 0);
    drop(limiter);
    dog.finish();
    let capacities = capacities.into_inner().unwrap();
    let max_len = max_len.load(Ordering::Relaxed);
    eprintln!(
        "clear race, max_keys {max_keys}: {clears} clears removed {cleared} keys (slowest \
         {slowest:?}), capacities {capacities:?}, max len {max_len}, overflow evictions {}, refusals {}, {:?}",
        stats.overflow_evictions,
        stats.overflow_refusals,
        started.elapsed()
    );
    assert!(max_len <= max_keys, "len passed the bound: {max_len}");
    assert!(
        clears >= 20 && cleared > 0,
        "not reached: {clears} clears, {cleared} keys"
    );
    assert!(
        stats.overflow_evictions >= 100,
        "not reached: {} overflow evictions",
        stats.overflow_evictions
    );
    let bound = bound_table(max_keys);
    assert!(
        capacities.contains(&bound),
        "not reached: odd table {bound} not in {capacities:?}"
    );
    assert_keys_dropped_once("clear race");
}

#[test]
fn clear_and_batches_race_a_flood_at_max_keys_13() {
    clear_race(13);
}

#[test]
fn clear_and_batches_race_a_flood_at_max_keys_100() {
    clear_race(100);
}

#[test]
fn clear_and_batches_race_a_flood_at_max_keys_1000() {
    clear_race(1000);
}

// ---------------------------------------------------------------------
// 8. Keys that all collide: one probe chain, wrapping at odd ends.
// ---------------------------------------------------------------------

/// Hot keys exact while every key shares one home (see `Collide`): each
/// lookup, insert, copy and overflow window walks the one chain across
/// the end of the odd table, ten hasher seeds per bound.
#[test]
fn exact_burst_with_colliding_keys_at_max_keys_13() {
    exact::<Collide>(13, 11, OverflowPolicy::Deny, 10);
}

#[test]
fn exact_burst_with_colliding_keys_at_max_keys_17() {
    exact::<Collide>(17, 15, OverflowPolicy::EvictFullest, 10);
}

#[test]
fn exact_burst_with_colliding_keys_at_max_keys_100() {
    exact::<Collide>(100, 99, OverflowPolicy::AllowUntracked, 10);
}

/// Floods of colliding keys: overflow evictions choose among the chain's
/// first live buckets from the shared home, across the odd end.
#[test]
fn flood_of_colliding_keys_at_odd_bounds() {
    floods::<Collide>(
        "colliding flood",
        &[2, 13, 17, 100],
        4,
        3_000,
        OverflowPolicy::EvictFullest,
        Time::Frozen,
    );
}
