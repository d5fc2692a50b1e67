//! Keys that misbehave: a `Clone`, `Eq` or `Hash` that panics (in a check,
//! in an insert's probe, or inside a migration that other threads are
//! copying), an `Eq` that lies, and a `Drop` that uses another limiter.
//! A key's trait impls are the user's code, run inside the map's protocol:
//! whatever they do, `len` stays exact (no reservation kept, no bucket
//! lost or placed twice), every key is dropped exactly once, and nothing
//! is undefined behaviour.

use std::collections::BTreeSet;
use std::hash::{Hash, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex};
use std::thread;
use std::time::Duration;

use turnstile_rl::__private::HasherSeed as _;
use turnstile_rl::{KeyedLimiter, ManualClock, OverflowPolicy, Quota};
use turnstile_test_kit::keys::SplitMix;
use turnstile_test_kit::within::within;

use crate::keys::{
    assert_keys_dropped_once, check, copies, count_by_reset, limiter, settle_counts, Counts, Id,
    TestKey, POISON, POISON_MOD,
};
use crate::serial;
use crate::support::{bound_table, watchdog, Seen};

// ---------------------------------------------------------------------------
// A panicking `Clone` or `Eq` gives back the place `admit` reserved under
// `max_keys` (a guard given back on unwind, `Reservation` in
// `src/keyed.rs`). Without it `len()` counted keys that did not exist,
// and at `max_keys` the limiter refused every fresh key forever.

static ARMED: AtomicBool = AtomicBool::new(false);

#[derive(PartialEq, Eq)]
struct Bomb(u64);
impl Hash for Bomb {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.0.hash(h)
    }
}
impl Clone for Bomb {
    fn clone(&self) -> Self {
        if ARMED.load(Ordering::Relaxed) {
            panic!("hostile clone");
        }
        Bomb(self.0)
    }
}

fn panicking_clones(policy: OverflowPolicy) -> (usize, bool) {
    let _serial = serial();
    let clock = ManualClock::new();
    let limiter: KeyedLimiter<Bomb, ManualClock> =
        KeyedLimiter::builder("10/s".parse::<Quota>().unwrap())
            .clock(clock.clone())
            .max_keys(4)
            .overflow(policy)
            .build();
    std::panic::set_hook(Box::new(|_| {}));
    ARMED.store(true, Ordering::Relaxed);
    for i in 0..4 {
        let r = catch_unwind(AssertUnwindSafe(|| limiter.check(&Bomb(i))));
        assert!(r.is_err(), "clone should have panicked");
    }
    ARMED.store(false, Ordering::Relaxed);
    let _ = std::panic::take_hook();
    // No key was ever stored; an hour later every one would be idle anyway.
    clock.advance(std::time::Duration::from_secs(3600));
    let evicted = limiter.evict_idle();
    assert_eq!(evicted, 0);
    let len = limiter.len();
    let tracked = limiter.check(&Bomb(1000)).is_allowed();
    // AllowUntracked admits untracked: see whether the key became tracked.
    let tracked = tracked && limiter.len() > len;
    (len, tracked)
}

/// `len` is 0 after the panics and a fresh key is admitted (before the
/// fix: `len` 4 and every fresh key refused, forever).
#[test]
fn a_panicking_clone_gives_its_reservation_back_deny() {
    let (len, admitted) = panicking_clones(OverflowPolicy::Deny);
    assert_eq!(len, 0, "len() counts {len} keys that were never stored");
    assert!(admitted, "fresh key refused: limiter permanently full");
}

/// The same with the default policy (before the fix: nothing live to
/// evict, so every fresh key was refused after 16 attempts).
#[test]
fn a_panicking_clone_gives_its_reservation_back_evict_fullest() {
    let (len, admitted) = panicking_clones(OverflowPolicy::EvictFullest);
    assert_eq!(len, 0, "len() counts {len} keys that were never stored");
    assert!(admitted, "fresh key refused: limiter permanently full");
}

thread_local! {
    static EQ_CALLS_UNTIL_PANIC: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Keys with one shared hash, whose `Eq` panics on its Nth call when armed.
#[derive(Clone)]
struct Touchy(u64);
impl Hash for Touchy {
    fn hash<H: Hasher>(&self, h: &mut H) {
        0u8.hash(h)
    }
}
impl PartialEq for Touchy {
    fn eq(&self, o: &Self) -> bool {
        let left = EQ_CALLS_UNTIL_PANIC.with(|c| c.get());
        if left > 0 {
            EQ_CALLS_UNTIL_PANIC.with(|c| c.set(left - 1));
            if left == 1 {
                panic!("hostile eq");
            }
        }
        self.0 == o.0
    }
}
impl Eq for Touchy {}

/// The same through `Eq` (it leaked too): the lookup compares the new key with
/// the 3 keys on its chain, `admit` reserves, and the insert's probe
/// compares again; a panic there (4th call) used to keep the reservation,
/// and with `max_keys` 4 the limiter was full with 3 keys, for good.
#[test]
fn a_panicking_eq_in_the_insert_probe_gives_its_reservation_back() {
    let _serial = serial();
    let limiter: KeyedLimiter<Touchy, ManualClock> =
        KeyedLimiter::builder("10/s".parse::<Quota>().unwrap())
            .clock(ManualClock::new())
            .max_keys(4)
            .overflow(OverflowPolicy::Deny)
            .build();
    for i in 0..3 {
        assert!(limiter.check(&Touchy(i)).is_allowed());
    }
    std::panic::set_hook(Box::new(|_| {}));
    EQ_CALLS_UNTIL_PANIC.with(|c| c.set(4));
    let r = catch_unwind(AssertUnwindSafe(|| limiter.check(&Touchy(100))));
    EQ_CALLS_UNTIL_PANIC.with(|c| c.set(0));
    let _ = std::panic::take_hook();
    assert!(r.is_err(), "eq should have panicked");
    assert_eq!(limiter.len(), 3, "len() counts a key that was never stored");
    assert!(
        limiter.check(&Touchy(200)).is_allowed(),
        "4th key refused at max_keys 4"
    );
}

// ---------------------------------------------------------------------------
// A key whose `Drop` uses another limiter.

/// A key whose `Drop` uses another turnstile limiter.
#[derive(Clone, Debug)]
struct Chatty(u64);

static OTHER: LazyLock<KeyedLimiter<u64>> =
    LazyLock::new(|| KeyedLimiter::new("1000/s".parse().unwrap()));
static DROPS_THAT_CHECKED: AtomicUsize = AtomicUsize::new(0);

impl Drop for Chatty {
    fn drop(&mut self) {
        let _ = OTHER.check(&(self.0 % 64));
        DROPS_THAT_CHECKED.fetch_add(1, Ordering::Relaxed);
    }
}
impl PartialEq for Chatty {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}
impl Eq for Chatty {}
impl Hash for Chatty {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state)
    }
}

/// Keys are dropped by epoch collection, which may run inside a
/// pin of any map; a key's `Drop` that pins another map must not panic.
#[test]
fn a_key_whose_drop_checks_another_limiter_does_not_panic() {
    let _serial = serial();
    let limiter = KeyedLimiter::builder("1/s".parse::<Quota>().unwrap())
        .max_keys(100)
        .build();
    // Several other limiters in use on this thread too, so handle caching
    // and its evictions are exercised as well.
    let others: Vec<KeyedLimiter<u64>> = (0..10)
        .map(|_| KeyedLimiter::new("1/s".parse().unwrap()))
        .collect();
    let before = DROPS_THAT_CHECKED.load(Ordering::Relaxed);
    for i in 0..100_000u64 {
        let _ = limiter.check(&Chatty(i));
        let _ = others[(i % 10) as usize].check(&i);
    }
    drop(limiter);
    assert!(DROPS_THAT_CHECKED.load(Ordering::Relaxed) - before >= 100_000);
}

// ---------------------------------------------------------------------------
// A `Hash` that panics inside a migration, while readers check the buckets
// it cannot hash (still live: a chunk hashes a key before its COPYING
// mark).

thread_local! {
    /// This thread's `Hash` of a stored key panics (the migrating thread).
    static PANIC_IN_HASH: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}
static PANIC_COUNTS: Counts = Counts::new();
thread_local! {
    /// This thread's `Eq` panics (the migrating thread, `place_copy`).
    static PANIC_IN_EQ: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}
/// Which of the two hostile impls `panicking_migrations` arms on the migrating thread.
static ARM_EQ: AtomicBool = AtomicBool::new(false);
static HASHES_PANICKED: AtomicUsize = AtomicUsize::new(0);

/// Every key hashes alike (one long probe chain), so a copy compares its key
/// with many others; `Eq` is slow, so a copy by a reader takes a while.
#[derive(Debug)]
struct Hostile(u64);
impl Hostile {
    fn new(id: u64) -> Self {
        PANIC_COUNTS.made.fetch_add(1, Ordering::SeqCst);
        Hostile(id)
    }
}
impl Clone for Hostile {
    fn clone(&self) -> Self {
        Hostile::new(self.0)
    }
}
impl Drop for Hostile {
    fn drop(&mut self) {
        PANIC_COUNTS.dropped.fetch_add(1, Ordering::SeqCst);
    }
}
impl PartialEq for Hostile {
    fn eq(&self, other: &Self) -> bool {
        if PANIC_IN_EQ.with(|p| p.get()) {
            HASHES_PANICKED.fetch_add(1, Ordering::Relaxed);
            panic!("hostile eq");
        }
        for _ in 0..200 {
            std::hint::spin_loop();
        }
        self.0 == other.0
    }
}
impl Eq for Hostile {}
impl Hash for Hostile {
    fn hash<H: Hasher>(&self, h: &mut H) {
        if PANIC_IN_HASH.with(|p| p.get()) {
            HASHES_PANICKED.fetch_add(1, Ordering::Relaxed);
            panic!("hostile hash");
        }
        0u64.hash(h);
    }
}

/// Readers check 24 keys; one thread, whose `Hash` panics, keeps making the
/// map migrate (resets make a quarter of the table dead, then `evict_idle`
/// compacts and copies). Its chunks bury the buckets they cannot hash, while
/// readers update those buckets (the burial's CAS then reads again).
/// Every key made must still be dropped exactly once, and `len` must end at 0.
#[test]
fn a_panicking_hash_in_a_migration_racing_readers_keeps_len_and_drops_exact() {
    let _serial = serial();
    ARM_EQ.store(false, Ordering::Relaxed);
    let (panics, len_before, evicted, len_after) = panicking_migrations(4);
    assert!(
        panics > 100,
        "the race was not reached: {panics} panicking migrations"
    );
    assert_eq!(
        len_after, 0,
        "len drifted: {len_after} after evicting everything"
    );
    assert_eq!(evicted, len_before, "evicted vs len");
    assert_eq!(
        PANIC_COUNTS.made(),
        PANIC_COUNTS.dropped(),
        "keys made vs dropped"
    );
}

/// The same panicking migrations with no concurrent
/// reader (the migrating thread puts the keys back itself, its hash
/// disarmed). Nobody updates a bucket while its chunk hashes it, so the
/// bury-on-panic path alone is exercised: it must keep `len` and drops exact.
#[test]
fn a_panicking_hash_in_a_migration_without_readers_keeps_len_and_drops_exact() {
    let _serial = serial();
    ARM_EQ.store(false, Ordering::Relaxed);
    let made = PANIC_COUNTS.made();
    let dropped = PANIC_COUNTS.dropped();
    let (panics, len_before, evicted, len_after) = panicking_migrations(0);
    assert!(
        panics > 100,
        "the race was not reached: {panics} panicking migrations"
    );
    assert_eq!(
        len_after, 0,
        "len drifted: {len_after} after evicting everything"
    );
    assert_eq!(evicted, len_before, "evicted vs len");
    assert_eq!(
        PANIC_COUNTS.made() - made,
        PANIC_COUNTS.dropped() - dropped,
        "keys made vs dropped"
    );
}

/// The same with the migrating thread's `Eq` armed to panic. It
/// used to run in `place_copy` (comparing the successor's keys) and reach
/// the same bury path; copies now compare no keys, so it never runs there.
#[test]
fn a_keys_eq_never_runs_inside_a_migration() {
    let _serial = serial();
    ARM_EQ.store(true, Ordering::Relaxed);
    let made = PANIC_COUNTS.made();
    let dropped = PANIC_COUNTS.dropped();
    let (panics, len_before, evicted, len_after) = panicking_migrations(4);
    ARM_EQ.store(false, Ordering::Relaxed);
    // Copies compare no keys any more (the one copier is chosen by a CAS
    // before anything is published), so a key's `Eq` never runs inside a
    // migration: none may panic there.
    assert_eq!(panics, 0, "a key's Eq ran inside a migration");
    assert_eq!(
        len_after, 0,
        "len drifted: {len_after} after evicting everything"
    );
    assert_eq!(evicted, len_before, "evicted vs len");
    assert_eq!(
        PANIC_COUNTS.made() - made,
        PANIC_COUNTS.dropped() - dropped,
        "keys made vs dropped"
    );
}

fn panicking_migrations(readers: u64) -> (usize, usize, usize, usize) {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let outcome = catch_unwind(|| {
        within(Duration::from_secs(120), "panicking hash", move || {
            let clock = ManualClock::new();
            let limiter: KeyedLimiter<Hostile, ManualClock> =
                KeyedLimiter::builder("1/h burst 1000000".parse::<Quota>().unwrap())
                    .clock(clock.clone())
                    .build();
            const N: u64 = 24;
            let keys: Vec<Hostile> = (0..N).map(Hostile::new).collect();
            let stop = AtomicBool::new(false);
            let panics = AtomicUsize::new(0);
            thread::scope(|s| {
                for t in 0..readers {
                    let (limiter, keys, stop) = (&limiter, &keys, &stop);
                    s.spawn(move || {
                        let mut rng = SplitMix(t + 31);
                        while !stop.load(Ordering::Relaxed) {
                            let key = &keys[(rng.next() % N) as usize];
                            let _ = catch_unwind(AssertUnwindSafe(|| limiter.check(key)));
                        }
                    });
                }
                let mut rng = SplitMix(5);
                for _ in 0..3_000 {
                    // Kill some keys (readers put them back), then migrate
                    // with a panicking hash.
                    for _ in 0..6 {
                        limiter.reset(&keys[(rng.next() % N) as usize]);
                    }
                    if ARM_EQ.load(Ordering::Relaxed) {
                        PANIC_IN_EQ.with(|p| p.set(true));
                    } else {
                        PANIC_IN_HASH.with(|p| p.set(true));
                    }
                    if catch_unwind(AssertUnwindSafe(|| limiter.evict_idle())).is_err() {
                        panics.fetch_add(1, Ordering::Relaxed);
                    }
                    PANIC_IN_HASH.with(|p| p.set(false));
                    PANIC_IN_EQ.with(|p| p.set(false));
                    // Let the readers run (2 cores, 5 threads).
                    thread::sleep(Duration::from_micros(200));
                    if readers == 0 {
                        for key in &keys {
                            let _ = limiter.check(key);
                        }
                    }
                }
                stop.store(true, Ordering::Relaxed);
            });
            let len_before = limiter.len();
            clock.advance(Duration::from_secs(100 * 365 * 24 * 3600));
            let evicted = limiter.evict_idle();
            let len_after = limiter.len();
            drop(keys);
            drop(limiter);
            (
                panics.load(Ordering::Relaxed),
                len_before,
                evicted,
                len_after,
            )
        })
    });
    std::panic::set_hook(previous);
    let (panics, len_before, evicted, len_after) = outcome.unwrap();
    settle_counts(&PANIC_COUNTS);
    eprintln!(
        "panicking hash: {panics} migrations panicked ({} hashes), len before {len_before}, evicted {evicted}, len after {len_after}; made {} dropped {}",
        HASHES_PANICKED.load(Ordering::Relaxed),
        PANIC_COUNTS.made(),
        PANIC_COUNTS.dropped()
    );
    (panics, len_before, evicted, len_after)
}

// A bury racing a reader's copy of the same bucket is modelled in
// `loom-tests`: `a_panicking_hash_never_splits_a_key`.

// ---------------------------------------------------------------------------
// A `Hash` that panics inside migrations of tight and odd tables: the
// migrating check panics, the bucket is lost (as if evicted), and the room
// held for its copy must be given back exactly, or the next tables fill
// early (migrating in a loop) or overfill.

/// A key whose `Hash` panics, met by a migration of a tight table
/// (`max_keys` 10, 4 threads): the migrating check panics, the bucket is
/// lost (as if evicted), and the room held for its copy must be given back
/// exactly, or the next tables fill early (migrating in a loop) or
/// overfill. Every round plants one poisoned key and inserts fresh keys
/// until a migration has panicked on it or an overflow evicted it.
#[test]
fn a_panicking_hash_in_tight_migrations_keeps_len_exact() {
    let _serial = serial();
    const MAX_KEYS: usize = 10;
    const ROUNDS: u64 = 100;
    let (panics_caught, copies_made, len) =
        within(Duration::from_secs(50), "poisoned hash", || {
            let limiter: KeyedLimiter<Id, ManualClock> =
                KeyedLimiter::builder("1/h burst 3".parse::<Quota>().unwrap())
                    .clock(ManualClock::new())
                    .max_keys(MAX_KEYS)
                    .overflow(OverflowPolicy::EvictFullest)
                    .hasher_seed(9)
                    .build();
            let copies_before = copies();
            let panics_caught = AtomicU64::new(0);
            for round in 0..ROUNDS {
                let poisoned = round * POISON_MOD + POISON_MOD - 1;
                POISON.store(false, Ordering::SeqCst);
                let _ = check(&limiter, &Id::new(poisoned));
                POISON.store(true, Ordering::SeqCst);
                let stop = AtomicBool::new(false);
                thread::scope(|s| {
                    for t in 0..4u64 {
                        let (limiter, stop, panics_caught) = (&limiter, &stop, &panics_caught);
                        s.spawn(move || {
                            let mut i = 0;
                            while !stop.load(Ordering::Relaxed) && i < 500 {
                                i += 1;
                                let id = round * POISON_MOD + (t * 200 + i) % (POISON_MOD - 1);
                                let key = Id::new(id);
                                let r = catch_unwind(AssertUnwindSafe(|| check(limiter, &key)));
                                if r.is_err() {
                                    panics_caught.fetch_add(1, Ordering::Relaxed);
                                    stop.store(true, Ordering::Relaxed);
                                }
                                assert!(limiter.len() <= MAX_KEYS);
                            }
                        });
                    }
                });
            }
            POISON.store(false, Ordering::SeqCst);
            let len = limiter.len();
            let found = count_by_reset(&limiter, 0..ROUNDS * POISON_MOD, None);
            assert_eq!(found, len, "keys found by reset vs len");
            let copies_made = copies() - copies_before;
            drop(limiter);
            (panics_caught.load(Ordering::Relaxed), copies_made, len)
        });
    eprintln!(
        "poisoned hash: {panics_caught} panicking migrations caught in {ROUNDS} rounds, \
         {copies_made} buckets copied, len at the end {len}"
    );
    assert!(
        panics_caught >= ROUNDS / 4,
        "not reached: {panics_caught} panicking migrations"
    );
    assert_keys_dropped_once("poisoned hash");
}

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
    let found = count_by_reset(&limiter, 0..ROUNDS * POISON_MOD, Some(&dog));
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
fn a_panicking_hash_in_migrations_of_22_slots_keeps_len_exact() {
    poisoned(13);
}

#[test]
fn a_panicking_hash_in_migrations_of_175_slots_keeps_len_exact() {
    poisoned(100);
}

// ---------------------------------------------------------------------------
// An inconsistent `Eq` and a copy placed twice. `place_copy` trusted `Eq`
// to recognise a copy another thread placed; an `Eq` that is inconsistent
// (a logic error, which std's maps contain without undefined behaviour)
// made two threads both place a copy of one frozen bucket: two live
// buckets for one key, each owning the same key bytes.

/// Holds this thread until the replay's `stage` reaches `at_least`: the
/// gate through which each replay's `Hash` and `Eq` force their
/// interleaving. A stage that never comes fails the test
/// instead of hanging it.
fn wait_for(stage: &AtomicUsize, at_least: usize) {
    let start = std::time::Instant::now();
    while stage.load(Ordering::SeqCst) < at_least {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "stage {at_least} never came"
        );
        thread::yield_now();
    }
}

static LIAR_COUNTS: Counts = Counts::new();
/// 0: idle; 1: the migrating thread froze LIAR_TARGET and is in its `Hash`;
/// 2: the reader has copied LIAR_TARGET itself.
static LIAR_STAGE: AtomicUsize = AtomicUsize::new(0);
const LIAR_TARGET: u64 = 3;
thread_local! {
    /// On this thread `Eq` says no to everything (the migrating thread).
    static LIES: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

#[derive(Debug)]
struct Liar {
    id: u64,
}
impl Liar {
    fn new(id: u64) -> Self {
        LIAR_COUNTS.made.fetch_add(1, Ordering::SeqCst);
        Liar { id }
    }
}
impl Clone for Liar {
    fn clone(&self) -> Self {
        Liar::new(self.id)
    }
}
impl Drop for Liar {
    fn drop(&mut self) {
        LIAR_COUNTS.dropped.fetch_add(1, Ordering::SeqCst);
    }
}
impl PartialEq for Liar {
    fn eq(&self, other: &Self) -> bool {
        !LIES.with(|l| l.get()) && self.id == other.id
    }
}
impl Eq for Liar {}
impl Hash for Liar {
    fn hash<H: Hasher>(&self, h: &mut H) {
        if self.id == LIAR_TARGET && LIES.with(|l| l.get()) {
            // `migrate_slot` froze the target and hashes it: let the reader
            // copy it first.
            LIAR_STAGE.store(1, Ordering::SeqCst);
            wait_for(&LIAR_STAGE, 2);
        }
        0u64.hash(h);
    }
}

/// The interleaving this replays, as it was before the fix (copies now
/// compare no keys, and only the thread that won COPYING places one): the
/// migrating thread C freezes the target (`migrate_slot`)
/// and is held in its `Hash`; reader R's check meets the frozen bucket,
/// copies it (`copy_frozen` → `place_copy` → New) and marks it COPIED; C
/// goes on to `place_copy`, whose `Eq` does not recognise R's copy, and
/// places a second one (New; its `mark_copied` fails silently). The
/// successor then holds two live buckets for the target, both owning its
/// key: `len` is one short (it wraps below 0 once both are evicted) and
/// the key is dropped twice (a double free for a key with heap memory).
/// With a consistent `Eq` this cannot happen; with an inconsistent one it
/// must not be undefined behaviour (std's maps contain such logic errors).
#[test]
fn an_inconsistent_eq_never_makes_two_copies_of_one_bucket() {
    let _serial = serial();
    LIAR_STAGE.store(0, Ordering::SeqCst);
    let (len_before, evicted, len_end) = within(Duration::from_secs(60), "inconsistent Eq", || {
        let clock = ManualClock::new();
        let limiter: KeyedLimiter<Liar, ManualClock> =
            KeyedLimiter::builder("1/h burst 5".parse::<Quota>().unwrap())
                .clock(clock.clone())
                .hasher_seed(1)
                .build();
        // Fills the smallest table (16 slots) to its fill limit (13), so
        // that the next new key starts a migration.
        for id in 0..13 {
            assert!(limiter.check(&Liar::new(id)).is_allowed());
        }
        assert_eq!(limiter.capacity(), 16);
        let len_before = limiter.len();
        thread::scope(|s| {
            s.spawn(|| {
                wait_for(&LIAR_STAGE, 1);
                assert!(limiter.check(&Liar::new(LIAR_TARGET)).is_allowed());
                LIAR_STAGE.store(2, Ordering::SeqCst);
            });
            LIES.with(|l| l.set(true));
            let _ = limiter.check(&Liar::new(100));
            LIES.with(|l| l.set(false));
        });
        assert!(limiter.capacity() > 16, "the migration did not finish");
        clock.advance(Duration::from_secs(100 * 3600));
        let evicted = limiter.evict_idle();
        let len_end = limiter.len();
        drop(limiter);
        (len_before, evicted, len_end)
    });
    settle_counts(&LIAR_COUNTS);
    eprintln!(
        "inconsistent Eq replay: len before {len_before}, evict_idle evicted {evicted}, len then {len_end}; keys made {} dropped {}",
        LIAR_COUNTS.made(),
        LIAR_COUNTS.dropped()
    );
    assert!(
        LIAR_COUNTS.dropped() <= LIAR_COUNTS.made(),
        "a key was dropped twice: made {} dropped {}",
        LIAR_COUNTS.made(),
        LIAR_COUNTS.dropped()
    );
    assert_eq!(len_end, 0, "len drifted");
}
