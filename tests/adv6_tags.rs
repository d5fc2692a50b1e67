//! Adversary 6's stress of the keyed map's four-bit tags (53f625f: a map
//! whose keys need dropping keeps a nibble a slot, written by the slot's
//! claimer before it publishes; a lookup skips slots tagged with another
//! fingerprint and stops at a tag of 0, even at a claimed slot).
//!
//! Keys own a drop counter (so they are tagged) and hash as their `id`
//! alone, and the limiter's hasher is seeded, so the test computes each
//! key's hash: it picks groups of keys that share a home (the same top
//! fourteen bits) with fingerprints equal and different, whose chains are long and
//! whose tags collide.
//!
//! - [`exact_first_checks_on_shared_homes`]: eight threads make the first
//!   checks of the same new colliding keys (single checks, batches, peeks)
//!   while churn threads grow and shrink the table and sweep it: a frozen
//!   clock admits exactly `min(checks, burst)` a key, `len` counts each key
//!   once, every key made is dropped once.
//! - [`tiny_bounds_on_shared_homes`]: the same keys under `max_keys` 1, 2,
//!   3 and 8 with every overflow policy: the bound holds, a key denied room
//!   (Deny) never admits more than its burst, drops are exact.
//! - [`published_keys_are_found_while_their_home_fills`]: keys exhausted
//!   and marked ready must be found by `peek` (a lookup alone; a check's
//!   insert would mask one that stopped too early) while writers claim
//!   the slots right behind them on the same home.
//! - [`multi_limits_admit_the_strictest_burst_on_tagged_keys`] (a
//!   `KeyedMultiLimiter<String>`): under the same first-check race and
//!   churn, it admits exactly the strictest burst a key.
//! - [`lying_hashes_stay_safe`]: keys whose `Hash` changes between calls
//!   (their tag, home and fingerprint lie): answers may be wrong, but no
//!   key is dropped twice or leaked, and nothing hangs.
//!
//! Each race is bounded by time (under 5 s for the binary) and asserts the
//! cases it names were reached; `within` fails a hang.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use turnstile_rl::__private::{HasherSeed as _, MigrationChunk as _};
use turnstile_rl::{KeyedLimiter, KeyedMultiLimiter, ManualClock, OverflowPolicy, Quota, Quotas};
use turnstile_test_kit::keys::SplitMix;
use turnstile_test_kit::within::within;

const SEED: u64 = 0xAD6_7A65;
const BURST: u64 = 3;
const GROUP: usize = 24;
const GROUPS: usize = 2_000;
const HOT_THREADS: usize = 8;
const CHURN_THREADS: usize = 2;

/// Made and dropped keys, and the lies told by liars' hashes.
#[derive(Default)]
struct Counts {
    made: AtomicU64,
    dropped: AtomicU64,
    lies: AtomicU64,
}

struct Key {
    id: u64,
    /// A liar's hash adds a changing salt one call in four.
    liar: bool,
    counts: Arc<Counts>,
}

impl Key {
    fn new(id: u64, counts: &Arc<Counts>) -> Self {
        counts.made.fetch_add(1, Relaxed);
        Key {
            id,
            liar: false,
            counts: counts.clone(),
        }
    }
}

impl Clone for Key {
    fn clone(&self) -> Self {
        let mut key = Key::new(self.id, &self.counts);
        key.liar = self.liar;
        key
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        self.counts.dropped.fetch_add(1, Relaxed);
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}
impl Eq for Key {}

impl Hash for Key {
    fn hash<H: Hasher>(&self, h: &mut H) {
        if self.liar {
            let lies = self.counts.lies.fetch_add(1, Relaxed);
            if lies.is_multiple_of(4) {
                (self.id ^ lies.wrapping_mul(0x9E37_79B9)).hash(h);
                return;
            }
        }
        self.id.hash(h);
    }
}

type Limiter = KeyedLimiter<Key, ManualClock>;

/// Every key made was dropped once, once the limiter is gone. Retired
/// tables are freed by later unpins (`map::pin`): pin and unpin until they
/// are (a leak fails after 5 s; a double drop at once).
fn assert_dropped_once(counts: &Counts) {
    let settle = Instant::now();
    while counts.dropped.load(Relaxed) < counts.made.load(Relaxed)
        && settle.elapsed() < Duration::from_secs(5)
    {
        let _ = KeyedLimiter::<u64>::new(Quota::per_second(1).unwrap()).check(&0);
        std::thread::sleep(Duration::from_millis(2));
    }
    let (made, dropped) = (counts.made.load(Relaxed), counts.dropped.load(Relaxed));
    assert_eq!(made, dropped, "keys made against keys dropped");
}

/// The hash the limiter's map (seeded with `SEED`) gives `id`'s key.
fn hash_of(id: u64) -> u64 {
    ahash::RandomState::with_seeds(SEED, !SEED, SEED.rotate_left(32), 1).hash_one(id)
}

/// `GROUPS` groups of `GROUP` ids, each group's hashes sharing their top
/// fourteen bits (one home in tables up to 16384 slots), and how many pairs in a
/// group share a fingerprint (the low four bits, 0 read as 1).
fn colliding_groups() -> (Vec<Vec<u64>>, usize) {
    static GROUPS_ONCE: OnceLock<(Vec<Vec<u64>>, usize)> = OnceLock::new();
    GROUPS_ONCE.get_or_init(pick_groups).clone()
}

fn pick_groups() -> (Vec<Vec<u64>>, usize) {
    let mut by_home: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut groups = Vec::new();
    for id in 1u64 << 40.. {
        let ids = by_home.entry(hash_of(id) >> 50).or_default();
        ids.push(id);
        if ids.len() == GROUP {
            groups.push(std::mem::take(ids));
            if groups.len() == GROUPS {
                break;
            }
        }
    }
    let fingerprint = |id: u64| (hash_of(id) & 0xF).max(1);
    let same_fingerprint = groups
        .iter()
        .map(|g| {
            let mut seen = [0usize; 16];
            g.iter().for_each(|&id| seen[fingerprint(id) as usize] += 1);
            seen.iter().filter(|&&n| n > 1).count()
        })
        .sum();
    (groups, same_fingerprint)
}

fn limiter(max_keys: usize, overflow: OverflowPolicy, chunk: usize) -> Limiter {
    KeyedLimiter::builder(format!("1/h burst {BURST}").parse::<Quota>().unwrap())
        .clock(ManualClock::new())
        .max_keys(max_keys)
        .overflow(overflow)
        .hasher_seed(SEED)
        .migration_chunk(chunk)
        .build()
}

/// Churn: keys inserted in rounds and reset (the table grows and
/// shrinks), sweeps now and then. Returns the capacities it saw change.
fn churn(limiter: &Limiter, counts: &Arc<Counts>, done: &AtomicBool, thread: u64) -> u64 {
    let mut next = (thread + 1) << 56;
    let mut changes = 0;
    let mut capacity = limiter.capacity();
    let mut round = 0u64;
    while !done.load(Relaxed) {
        let ids: Vec<u64> = (next..next + 200).collect();
        next += 200;
        for &id in &ids {
            let _ = limiter.check(&Key::new(id, counts));
        }
        for &id in &ids {
            let _ = limiter.reset(&Key::new(id, counts));
        }
        round += 1;
        if round.is_multiple_of(3) {
            let _ = limiter.evict_idle();
        }
        if limiter.capacity() != capacity {
            capacity = limiter.capacity();
            changes += 1;
        }
    }
    changes
}

#[derive(Debug, Default)]
struct Reach {
    keys_checked: usize,
    contended_first_checks: u64,
    capacity_changes: u64,
    same_fingerprint_pairs: usize,
}

/// Hot threads walk the groups in the same order, each checking every key
/// of a group `BURST + 1` times (some by batches, with peeks between),
/// while churn runs; per key, checks and admissions are counted.
fn exact_race(chunk: usize, race: Duration) -> Reach {
    let (groups, same_fingerprint_pairs) = colliding_groups();
    let counts = Arc::new(Counts::default());
    let limiter = limiter(1 << 20, OverflowPolicy::EvictFullest, chunk);
    let keys = groups.iter().flatten().count();
    let checks: Vec<AtomicU64> = (0..keys).map(|_| AtomicU64::new(0)).collect();
    let admitted: Vec<AtomicU64> = (0..keys).map(|_| AtomicU64::new(0)).collect();
    let first_by = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let deadline = Instant::now() + race;
    let mut capacity_changes = 0;
    std::thread::scope(|s| {
        let churners: Vec<_> = (0..CHURN_THREADS as u64)
            .map(|t| {
                let (limiter, counts, done) = (&limiter, &counts, &done);
                s.spawn(move || churn(limiter, counts, done, t))
            })
            .collect();
        let hot: Vec<_> = (0..HOT_THREADS)
            .map(|thread| {
                let (limiter, counts, groups) = (&limiter, &counts, &groups);
                let (checks, admitted, first_by) = (&checks, &admitted, &first_by);
                s.spawn(move || {
                    let mut rng = SplitMix(thread as u64 + 1);
                    let mut out = Vec::new();
                    for (g, ids) in groups.iter().enumerate() {
                        if Instant::now() > deadline {
                            break;
                        }
                        let keys: Vec<Key> = ids.iter().map(|&id| Key::new(id, counts)).collect();
                        for _ in 0..=BURST {
                            if thread % 2 == 1 {
                                limiter.check_batch(&keys, &mut out);
                                for (i, decision) in out.iter().enumerate() {
                                    checks[g * GROUP + i].fetch_add(1, Relaxed);
                                    admitted[g * GROUP + i]
                                        .fetch_add(decision.is_allowed() as u64, Relaxed);
                                }
                                continue;
                            }
                            let start = (rng.next() % GROUP as u64) as usize;
                            for k in 0..GROUP {
                                let i = (start + k) % GROUP;
                                let _ = limiter.peek(&keys[(i + 1) % GROUP]);
                                let allowed = limiter.check(&keys[i]).is_allowed();
                                if checks[g * GROUP + i].fetch_add(1, Relaxed) < HOT_THREADS as u64
                                {
                                    first_by.fetch_add(1, Relaxed);
                                }
                                admitted[g * GROUP + i].fetch_add(allowed as u64, Relaxed);
                            }
                        }
                    }
                })
            })
            .collect();
        for h in hot {
            h.join().unwrap();
        }
        done.store(true, Relaxed);
        for c in churners {
            capacity_changes += c.join().unwrap();
        }
    });
    let mut keys_checked = 0;
    for (i, (c, a)) in checks.iter().zip(&admitted).enumerate() {
        let (c, a) = (c.load(Relaxed), a.load(Relaxed));
        assert_eq!(a, c.min(BURST), "key {i}: {c} checks admitted {a}");
        keys_checked += (c > 0) as usize;
    }
    assert_eq!(limiter.len(), keys_checked, "one bucket a key");
    drop(limiter);
    assert_dropped_once(&counts);
    Reach {
        keys_checked,
        contended_first_checks: first_by.load(Relaxed),
        capacity_changes,
        same_fingerprint_pairs,
    }
}

#[test]
fn exact_first_checks_on_shared_homes() {
    let reach = within(Duration::from_secs(60), "adv6 exact race", || {
        let mut total = Reach::default();
        for chunk in [1, 64] {
            let reach = exact_race(chunk, Duration::from_millis(500));
            total.keys_checked += reach.keys_checked;
            total.contended_first_checks += reach.contended_first_checks;
            total.capacity_changes += reach.capacity_changes;
            total.same_fingerprint_pairs = reach.same_fingerprint_pairs;
        }
        total
    });
    eprintln!("adv6 exact: {reach:?}");
    assert!(reach.keys_checked >= 2 * GROUP, "{reach:?}");
    assert!(reach.contended_first_checks > 0, "{reach:?}");
    assert!(reach.capacity_changes >= 4, "{reach:?}");
    assert!(reach.same_fingerprint_pairs >= GROUPS, "{reach:?}");
}

/// Hot threads check one colliding group's keys under a tiny bound while
/// churn inserts and resets; returns the checks made.
fn tiny_race(max_keys: usize, overflow: OverflowPolicy, race: Duration) -> u64 {
    let (groups, _) = colliding_groups();
    let ids = &groups[0];
    let counts = Arc::new(Counts::default());
    let limiter = limiter(max_keys, overflow, 1);
    let admitted: Vec<AtomicU64> = (0..GROUP).map(|_| AtomicU64::new(0)).collect();
    let total = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let churner = s.spawn(|| churn(&limiter, &counts, &done, 0));
        let hot: Vec<_> = (0..HOT_THREADS)
            .map(|thread| {
                let (limiter, counts, admitted, total) = (&limiter, &counts, &admitted, &total);
                s.spawn(move || {
                    let mut rng = SplitMix(thread as u64 + 11);
                    let keys: Vec<Key> = ids.iter().map(|&id| Key::new(id, counts)).collect();
                    let deadline = Instant::now() + race;
                    while Instant::now() < deadline {
                        let i = (rng.next() % GROUP as u64) as usize;
                        if limiter.check(&keys[i]).is_allowed() {
                            admitted[i].fetch_add(1, Relaxed);
                        }
                        total.fetch_add(1, Relaxed);
                    }
                })
            })
            .collect();
        for h in hot {
            h.join().unwrap();
        }
        done.store(true, Relaxed);
        churner.join().unwrap();
    });
    assert!(limiter.len() <= max_keys, "{} > {max_keys}", limiter.len());
    if overflow == OverflowPolicy::Deny {
        // Hot keys are never reset or evicted: each has at most one
        // bucket, ever, and admits at most its burst.
        for (i, a) in admitted.iter().enumerate() {
            assert!(a.load(Relaxed) <= BURST, "key {i} admitted {a:?}");
        }
    }
    drop(limiter);
    assert_dropped_once(&counts);
    total.load(Relaxed)
}

#[test]
fn tiny_bounds_on_shared_homes() {
    let checks = within(Duration::from_secs(60), "adv6 tiny bounds", || {
        let mut checks = 0;
        for max_keys in [1, 2, 3, 8] {
            checks += tiny_race(max_keys, OverflowPolicy::Deny, Duration::from_millis(150));
        }
        checks += tiny_race(3, OverflowPolicy::EvictFullest, Duration::from_millis(200));
        checks += tiny_race(
            2,
            OverflowPolicy::AllowUntracked,
            Duration::from_millis(200),
        );
        checks
    });
    assert!(checks > 1_000, "{checks} checks");
}

#[test]
fn lying_hashes_stay_safe() {
    let lies = within(Duration::from_secs(60), "adv6 liars", || {
        let (groups, _) = colliding_groups();
        let counts = Arc::new(Counts::default());
        let limiter = limiter(1 << 20, OverflowPolicy::EvictFullest, 1);
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            let churner = s.spawn(|| churn(&limiter, &counts, &done, 0));
            let hot: Vec<_> = (0..HOT_THREADS)
                .map(|thread| {
                    let (limiter, counts, groups) = (&limiter, &counts, &groups);
                    s.spawn(move || {
                        let deadline = Instant::now() + Duration::from_millis(500);
                        let mut out = Vec::new();
                        for ids in groups.iter().cycle() {
                            if Instant::now() > deadline {
                                break;
                            }
                            let keys: Vec<Key> = ids
                                .iter()
                                .map(|&id| {
                                    let mut key = Key::new(id, counts);
                                    key.liar = true;
                                    key
                                })
                                .collect();
                            for key in &keys {
                                let _ = limiter.check(key);
                                let _ = limiter.peek(key);
                                if thread % 3 == 0 {
                                    let _ = limiter.reset(key);
                                }
                            }
                            limiter.check_batch(&keys, &mut out);
                        }
                    })
                })
                .collect();
            for h in hot {
                h.join().unwrap();
            }
            done.store(true, Relaxed);
            churner.join().unwrap();
        });
        let _ = limiter.clear();
        drop(limiter);
        assert_dropped_once(&counts);
        counts.lies.load(Relaxed)
    });
    assert!(lies > 10_000, "{lies} lying hashes");
}

/// Writers exhaust the colliding keys one by one (each key's burst spent
/// by `BURST` checks, then marked ready with `Release`), so the next
/// writers claim slots of the same home right behind keys already
/// published, while readers `peek` and `reset`-free-look at ready keys
/// (`peek` goes through `find` alone: a `check`'s insert would mask a
/// lookup that stopped too early). A ready key must be found: its peek is
/// denied. Churn migrates the table under both. Returns (peeks of ready
/// keys, keys readied).
fn visibility_race(chunk: usize, race: Duration) -> (u64, usize) {
    let (groups, _) = colliding_groups();
    let ids: Vec<u64> = groups.iter().flatten().copied().collect();
    let counts = Arc::new(Counts::default());
    let limiter = limiter(1 << 20, OverflowPolicy::EvictFullest, chunk);
    let ready: Vec<AtomicBool> = ids.iter().map(|_| AtomicBool::new(false)).collect();
    let next = AtomicU64::new(0);
    let readied = AtomicU64::new(0);
    let peeks = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let deadline = Instant::now() + race;
    std::thread::scope(|s| {
        let churner = s.spawn(|| churn(&limiter, &counts, &done, 0));
        let writers: Vec<_> = (0..HOT_THREADS / 2)
            .map(|_| {
                let (limiter, counts, ids, ready) = (&limiter, &counts, &ids, &ready);
                let (next, readied) = (&next, &readied);
                s.spawn(move || {
                    while Instant::now() < deadline {
                        let i = next.fetch_add(1, Relaxed) as usize;
                        let Some(&id) = ids.get(i) else { break };
                        let key = Key::new(id, counts);
                        for _ in 0..BURST {
                            assert!(limiter.check(&key).is_allowed(), "a new key's burst");
                        }
                        ready[i].store(true, std::sync::atomic::Ordering::Release);
                        readied.fetch_add(1, Relaxed);
                    }
                })
            })
            .collect();
        let readers: Vec<_> = (0..HOT_THREADS / 2)
            .map(|thread| {
                let (limiter, counts, ids, ready) = (&limiter, &counts, &ids, &ready);
                let (next, peeks) = (&next, &peeks);
                s.spawn(move || {
                    let mut rng = SplitMix(thread as u64 + 21);
                    // Until the writers stop: the race is with their claims.
                    while Instant::now() < deadline && (next.load(Relaxed) as usize) < ids.len() {
                        // A key among the last few handed out: its
                        // neighbours on the chain are being claimed.
                        let front = (next.load(Relaxed) as usize).min(ids.len());
                        let back = (rng.next() % 32) as usize + 1;
                        let Some(i) = front.checked_sub(back) else {
                            continue;
                        };
                        if !ready[i].load(std::sync::atomic::Ordering::Acquire) {
                            continue;
                        }
                        let key = Key::new(ids[i], counts);
                        assert!(
                            !limiter.peek(&key).is_allowed(),
                            "key {i} was published and exhausted, yet its lookup missed it"
                        );
                        peeks.fetch_add(1, Relaxed);
                    }
                })
            })
            .collect();
        for h in writers.into_iter().chain(readers) {
            h.join().unwrap();
        }
        done.store(true, Relaxed);
        churner.join().unwrap();
    });
    let readied = readied.load(Relaxed) as usize;
    assert_eq!(limiter.len(), readied, "one bucket a key");
    drop(limiter);
    assert_dropped_once(&counts);
    (peeks.load(Relaxed), readied)
}

#[test]
fn published_keys_are_found_while_their_home_fills() {
    let (peeks, readied) = within(Duration::from_secs(60), "adv6 visibility", || {
        let (a, b) = visibility_race(1, Duration::from_millis(350));
        let (c, d) = visibility_race(64, Duration::from_millis(350));
        (a + c, b + d)
    });
    eprintln!("adv6 visibility: {peeks} peeks of {readied} ready keys");
    assert!(
        peeks > 10_000 && readied > 2 * GROUP,
        "{peeks} peeks, {readied} keys"
    );
}

/// A multi-limit keyed limiter (one map a limit, `String` keys, tagged):
/// eight threads make the first checks of the same new keys, with peeks,
/// while a churn thread checks and resets its own keys and sweeps (every
/// map migrates). On a frozen clock each key admits exactly the strictest
/// burst. Returns (keys checked by every thread, churn rounds).
fn multi_race(race: Duration) -> (u64, u64) {
    let quotas: Quotas = "1/h burst 5; 1/h burst 3".parse().unwrap();
    let limiter = KeyedMultiLimiter::<String, _>::builder(quotas)
        .clock(ManualClock::new())
        .build();
    const KEYS: usize = 1 << 16;
    let admitted: Vec<AtomicU64> = (0..KEYS).map(|_| AtomicU64::new(0)).collect();
    let checks: Vec<AtomicU64> = (0..KEYS).map(|_| AtomicU64::new(0)).collect();
    let done = AtomicBool::new(false);
    let rounds = AtomicU64::new(0);
    let deadline = Instant::now() + race;
    std::thread::scope(|s| {
        let churner = s.spawn(|| {
            let mut next = 0u64;
            while !done.load(Relaxed) {
                let keys: Vec<String> = (next..next + 300).map(|i| format!("churn {i}")).collect();
                next += 300;
                for k in &keys {
                    let _ = limiter.check(k);
                }
                for k in &keys {
                    let _ = limiter.reset(k);
                }
                if rounds.fetch_add(1, Relaxed).is_multiple_of(3) {
                    let _ = limiter.evict_idle();
                }
            }
        });
        let hot: Vec<_> = (0..HOT_THREADS)
            .map(|thread| {
                let (limiter, admitted, checks) = (&limiter, &admitted, &checks);
                s.spawn(move || {
                    for first in (0..KEYS).step_by(16) {
                        if Instant::now() > deadline {
                            break;
                        }
                        for _ in 0..4 {
                            for k in 0..16 {
                                let i = first + (k + thread) % 16;
                                let key = format!("hot key {i}");
                                let _ = limiter.peek(key.as_str());
                                let allowed = limiter.check(key.as_str()).is_allowed();
                                checks[i].fetch_add(1, Relaxed);
                                admitted[i].fetch_add(allowed as u64, Relaxed);
                            }
                        }
                    }
                })
            })
            .collect();
        for h in hot {
            h.join().unwrap();
        }
        done.store(true, Relaxed);
        churner.join().unwrap();
    });
    let mut keys = 0;
    for (i, (c, a)) in checks.iter().zip(&admitted).enumerate() {
        let (c, a) = (c.load(Relaxed), a.load(Relaxed));
        assert_eq!(a, c.min(3), "hot key {i}: {c} checks admitted {a}");
        keys += (c == 4 * HOT_THREADS as u64) as u64;
    }
    (keys, rounds.load(Relaxed))
}

#[test]
fn multi_limits_admit_the_strictest_burst_on_tagged_keys() {
    let (keys, rounds) = within(Duration::from_secs(60), "adv6 multi", || {
        multi_race(Duration::from_millis(400))
    });
    eprintln!("adv6 multi: {keys} keys checked by every thread, {rounds} churn rounds");
    assert!(
        keys > 100 && rounds > 3,
        "{keys} keys, {rounds} churn rounds"
    );
}
