//! Keys that count themselves, shared by the groups.
//!
//! - [`Id`], [`Name`] and [`Collide`] count into this module's globals:
//!   every key made (`new` or `clone`) and dropped, and every `Hash` call.
//!   A check, peek or reset made through [`check`], [`peek`], [`reset`] or
//!   [`check_with`] hashes its key once and counts a lookup, so every other
//!   `Hash` call is a bucket a migration copied ([`copies`]). Setting
//!   [`POISON`] makes hashing one id in [`POISON_MOD`] panic.
//! - [`Tracked`] owns heap memory and counts into a [`Counts`] of its
//!   test's own.
//!
//! At the end of a test every key must have been dropped exactly once
//! ([`assert_keys_dropped_once`], or `made == dropped` on a [`Counts`]):
//! a key dropped twice, or never, shows there.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread;
use std::time::Duration;

use turnstile_rl::__private::{HasherSeed as _, MigrationChunk as _};
use turnstile_rl::{Decision, KeyedLimiter, ManualClock, OverflowPolicy, Quota};
use turnstile_test_kit::watchdog::Watchdog;

static MADE: AtomicUsize = AtomicUsize::new(0);
static DROPPED: AtomicUsize = AtomicUsize::new(0);
static HASHES: AtomicU64 = AtomicU64::new(0);
/// Lookups made by the tests (checks, peeks and resets): one hash each.
pub static LOOKUPS: AtomicU64 = AtomicU64::new(0);
/// While set, hashing a key whose id is `POISON_MOD - 1` modulo
/// `POISON_MOD` panics.
pub static POISON: AtomicBool = AtomicBool::new(false);
pub const POISON_MOD: u64 = 1000;

fn hash_id<H: Hasher>(id: u64, h: &mut H) {
    HASHES.fetch_add(1, Ordering::Relaxed);
    if POISON.load(Ordering::Relaxed) && id % POISON_MOD == POISON_MOD - 1 {
        panic!("poisoned hash");
    }
    id.hash(h);
}

pub trait TestKey: Hash + Eq + Clone + Send + Sync + std::fmt::Debug + 'static {
    const NAME: &'static str;
    fn new(id: u64) -> Self;
}

/// A `u64`-sized key: 16-byte slots, four to a cache line.
#[derive(Debug, PartialEq, Eq)]
pub struct Id(pub u64);
impl TestKey for Id {
    const NAME: &'static str = "u64";
    fn new(id: u64) -> Self {
        MADE.fetch_add(1, Ordering::SeqCst);
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
        DROPPED.fetch_add(1, Ordering::SeqCst);
    }
}
impl Hash for Id {
    fn hash<H: Hasher>(&self, h: &mut H) {
        hash_id(self.0, h);
    }
}

/// A `String` key: 32-byte slots, two to a cache line (the eviction window
/// is four slots).
#[derive(Debug, PartialEq, Eq)]
pub struct Name(String);
impl Name {
    fn id(&self) -> u64 {
        self.0[5..].parse().unwrap()
    }
}
impl TestKey for Name {
    const NAME: &'static str = "String";
    fn new(id: u64) -> Self {
        MADE.fetch_add(1, Ordering::SeqCst);
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
        DROPPED.fetch_add(1, Ordering::SeqCst);
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
pub struct Collide(u64);
impl TestKey for Collide {
    const NAME: &'static str = "colliding";
    fn new(id: u64) -> Self {
        MADE.fetch_add(1, Ordering::SeqCst);
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
        DROPPED.fetch_add(1, Ordering::SeqCst);
    }
}
impl Hash for Collide {
    fn hash<H: Hasher>(&self, h: &mut H) {
        HASHES.fetch_add(1, Ordering::Relaxed);
        0u64.hash(h);
    }
}

pub type Limiter<K> = KeyedLimiter<K, ManualClock>;

/// A limiter of `quota` on `clock`, bounded at `max_keys` under `policy`,
/// its hasher seeded with `seed`.
pub fn limiter<K: TestKey>(
    quota: &str,
    clock: &ManualClock,
    max_keys: usize,
    policy: OverflowPolicy,
    seed: u64,
) -> Limiter<K> {
    let builder = KeyedLimiter::builder(quota.parse::<Quota>().unwrap())
        .clock(clock.clone())
        .max_keys(max_keys)
        .overflow(policy)
        .hasher_seed(seed);
    builder.test_shape().build()
}

/// The map's shape for a test run: its migration chunk from
/// `TURNSTILE_MIGRATION_CHUNK` when set (see [`migration_chunk`]).
pub trait TestShape {
    /// This builder in the run's shape.
    fn test_shape(self) -> Self;
}

impl<K, C, A> TestShape for turnstile_rl::KeyedLimiterBuilder<K, C, A>
where
    K: Hash + Eq + Send + Sync + 'static,
    C: turnstile_rl::Clock,
    A: turnstile_rl::algorithms::Algorithm,
{
    fn test_shape(self) -> Self {
        match migration_chunk() {
            Some(chunk) => self.migration_chunk(chunk),
            None => self,
        }
    }
}

/// The migration chunk the map's races run at: the library's own unless
/// `TURNSTILE_MIGRATION_CHUNK` says otherwise (at 1, the size loom's
/// models use, a migration's chunks are claimed by many threads at once:
/// `TURNSTILE_MIGRATION_CHUNK=1 cargo test --test map -- growth::`).
pub fn migration_chunk() -> Option<usize> {
    let chunk = std::env::var("TURNSTILE_MIGRATION_CHUNK").ok()?;
    Some(
        chunk
            .parse()
            .expect("TURNSTILE_MIGRATION_CHUNK is a number of slots"),
    )
}

pub fn check<K: TestKey>(limiter: &Limiter<K>, key: &K) -> Decision {
    LOOKUPS.fetch_add(1, Ordering::Relaxed);
    limiter.check(key)
}

pub fn check_with<K: TestKey>(limiter: &Limiter<K>, key: &K, quota: &Quota) -> Decision {
    LOOKUPS.fetch_add(1, Ordering::Relaxed);
    limiter.check_with(key, quota)
}

pub fn reset<K: TestKey>(limiter: &Limiter<K>, key: &K) -> bool {
    LOOKUPS.fetch_add(1, Ordering::Relaxed);
    limiter.reset(key)
}

pub fn peek<K: TestKey>(limiter: &Limiter<K>, key: &K) -> Decision {
    LOOKUPS.fetch_add(1, Ordering::Relaxed);
    limiter.peek(key)
}

/// Buckets copied by migrations so far: every `Hash` call not made by a
/// lookup of the tests'.
/// Exact once the threads are joined; while they run, lookups counted but
/// not hashed yet make it low by at most one per thread.
pub fn copies() -> u64 {
    let lookups = LOOKUPS.load(Ordering::SeqCst);
    HASHES.load(Ordering::SeqCst).saturating_sub(lookups)
}

/// Removes every key of `ids` with `reset` and returns how many were
/// there: beside `len`, shows that no bucket was lost (a copy that found
/// no room in release builds) and none is there twice. Ticks `dog`, if
/// given, every 4,096 keys.
pub fn count_by_reset<K: TestKey>(
    limiter: &Limiter<K>,
    ids: impl Iterator<Item = u64>,
    dog: Option<&Watchdog>,
) -> usize {
    let mut found = 0;
    for (i, id) in ids.enumerate() {
        if reset(limiter, &K::new(id)) {
            found += 1;
        }
        if i % 4096 == 0 {
            if let Some(dog) = dog {
                dog.tick();
            }
        }
    }
    found
}

/// Waits (up to 2 s) for keys held by exiting threads' epoch garbage.
pub fn settle() {
    for _ in 0..200 {
        if DROPPED.load(Ordering::SeqCst) >= MADE.load(Ordering::SeqCst) {
            return;
        }
        drop(KeyedLimiter::<u64>::new("1/s".parse::<Quota>().unwrap()));
        thread::sleep(Duration::from_millis(10));
    }
}

pub fn assert_keys_dropped_once(what: &str) {
    settle();
    let (made, dropped) = (MADE.load(Ordering::SeqCst), DROPPED.load(Ordering::SeqCst));
    eprintln!("{what}: keys made {made}, dropped {dropped}");
    assert_eq!(made, dropped, "{what}: keys made vs dropped");
}

/// Made/dropped counters for one test's keys.
#[derive(Debug)]
pub struct Counts {
    pub made: AtomicUsize,
    pub dropped: AtomicUsize,
}
impl Counts {
    pub const fn new() -> Self {
        Counts {
            made: AtomicUsize::new(0),
            dropped: AtomicUsize::new(0),
        }
    }
    pub fn made(&self) -> usize {
        self.made.load(Ordering::SeqCst)
    }
    pub fn dropped(&self) -> usize {
        self.dropped.load(Ordering::SeqCst)
    }
}

/// Waits (up to 2 s) for keys still held by the epoch garbage of threads
/// that are exiting (their thread-local handles are let go after `scope`
/// returns, and hand their garbage to the collector then) to be dropped.
/// Garbage is freed by later pins of any map: each round drops a map, whose
/// drop pins and flushes. A double drop shows at once as dropped > made.
pub fn settle_counts(counts: &Counts) {
    for _ in 0..200 {
        if counts.dropped() >= counts.made() {
            return;
        }
        drop(KeyedLimiter::<u64>::new(crate::support::hot_quota()));
        thread::sleep(Duration::from_millis(10));
    }
}

/// A key that owns heap memory and counts its drops in its test's
/// [`Counts`].
#[derive(Debug)]
pub struct Tracked {
    pub id: u64,
    name: String,
    counts: &'static Counts,
}
impl Tracked {
    pub fn new(id: u64, counts: &'static Counts) -> Self {
        counts.made.fetch_add(1, Ordering::SeqCst);
        Tracked {
            id,
            name: format!("key-{id}"),
            counts,
        }
    }
}
impl Clone for Tracked {
    fn clone(&self) -> Self {
        Tracked::new(self.id, self.counts)
    }
}
impl Drop for Tracked {
    fn drop(&mut self) {
        self.counts.dropped.fetch_add(1, Ordering::SeqCst);
    }
}
impl PartialEq for Tracked {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id && self.name == other.name
    }
}
impl Eq for Tracked {}
impl Hash for Tracked {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.id.hash(h);
        self.name.hash(h);
    }
}
