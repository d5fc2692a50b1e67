//! Every path of the map that frees memory, raced on many threads.
//!
//! `scripts/sanitize.sh` runs
//! `checks_evictions_and_migrations_race_without_losing_memory_safety`
//! again under AddressSanitizer and LeakSanitizer, where a use after free,
//! a double free or a leaked key fails it.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, Ordering::Relaxed};
use std::sync::{Arc, Barrier, LazyLock};
use std::time::Duration;

use turnstile_rl::{KeyedLimiter, ManualClock, OverflowPolicy, Quota};
use turnstile_test_kit::keys::SplitMix;
use turnstile_test_kit::watchdog::Watchdog;

use crate::serial;

const CHECKERS: u64 = 3;
const CHECKS_PER_THREAD: u64 = 60_000;
const KEY_SPACE: u64 = 4_000;
const MAX_KEYS: usize = 256;

fn key(n: u64) -> String {
    format!("client-{n:016x}")
}

/// String keys (so each key owns a heap allocation a sanitizer can
/// watch), a `max_keys` far below the key space (overflow evictions on
/// every few inserts), a clock that moves and `evict_idle` called while
/// checks run (idle eviction and shrinking migrations under readers).
#[test]
fn checks_evictions_and_migrations_race_without_losing_memory_safety() {
    let _serial = serial();
    let quota: Quota = "20/s burst 5".parse().unwrap();
    let clock = ManualClock::new();
    let limiter: KeyedLimiter<String, ManualClock> = KeyedLimiter::builder(quota)
        .clock(clock.clone())
        .max_keys(MAX_KEYS)
        .overflow(OverflowPolicy::EvictFullest)
        .build();
    let start = Barrier::new(CHECKERS as usize + 1);
    let done = AtomicBool::new(false);

    let (allowed, denied) = std::thread::scope(|s| {
        let checkers: Vec<_> = (0..CHECKERS)
            .map(|thread| {
                let (limiter, start) = (&limiter, &start);
                s.spawn(move || {
                    let mut rng = SplitMix(thread);
                    let (mut allowed, mut denied) = (0u64, 0u64);
                    start.wait();
                    for _ in 0..CHECKS_PER_THREAD {
                        // Half the traffic on 64 hot keys (cells updated
                        // in place), half spread over the whole key space
                        // (inserts, overflow evictions, migrations).
                        let n = rng.next();
                        let k = if n & 1 == 0 { n % 64 } else { n % KEY_SPACE };
                        if limiter.check(key(k).as_str()).is_allowed() {
                            allowed += 1;
                        } else {
                            denied += 1;
                        }
                    }
                    (allowed, denied)
                })
            })
            .collect();
        // The housekeeper: time moves in steps of 0..100 ms, and idle keys
        // are dropped (with the table shrunk) while the checks run.
        s.spawn(|| {
            let mut rng = SplitMix(99);
            start.wait();
            while !done.load(Ordering::Relaxed) {
                clock.advance(Duration::from_millis(rng.next() % 100));
                limiter.evict_idle();
                std::thread::yield_now();
            }
        });
        let totals = checkers
            .into_iter()
            .map(|c| c.join().unwrap())
            .fold((0, 0), |(a, d), (a2, d2)| (a + a2, d + d2));
        done.store(true, Ordering::Relaxed);
        totals
    });

    assert_eq!(allowed + denied, CHECKERS * CHECKS_PER_THREAD);
    assert!(
        allowed > 0 && denied > 0,
        "{allowed} allowed, {denied} denied"
    );
    assert!(
        limiter.len() <= MAX_KEYS,
        "{} keys tracked, bound {MAX_KEYS}",
        limiter.len()
    );

    // Once every bucket is full again, all of them go, and the map still
    // decides exactly: a fresh key admits its burst and no more.
    clock.advance(Duration::from_secs(1));
    limiter.evict_idle();
    assert_eq!(limiter.len(), 0);
    let admitted = (0..10)
        .filter(|_| limiter.check("after").is_allowed())
        .count();
    assert_eq!(admitted, 5);
}

// ---------------------------------------------------------------------------
// The pin and its reclaimer (`src/map/pin.rs`) under stress: many threads
// check tiny maps (max_keys 1..3, every overflow policy) while others
// clear, evict and reset, so tables are retired all the time; threads are
// spawned and joined in a loop (records reused); key `Hash` and `Drop` pin
// other limiters (nested pins, pins inside reclamation). Keys carry a heap
// canary checked on every use and poisoned on drop: a key read or dropped
// from a freed table, or dropped twice, trips it (and ASan). At the end
// every key made (new + clones) must be dropped once.

const MAGIC: u64 = 0x5a5a_1234_dead_beef;
const DEAD: u64 = 0x0bad_0bad_0bad_0bad;

static MADE: AtomicU64 = AtomicU64::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);
static BAD: AtomicU64 = AtomicU64::new(0);
static NESTED_IN_DROP: AtomicU64 = AtomicU64::new(0);

static OTHER: LazyLock<KeyedLimiter<u64>> = LazyLock::new(|| {
    KeyedLimiter::builder(Quota::per_second(1_000_000).unwrap())
        .max_keys(2)
        .build()
});

struct Key {
    id: u64,
    canary: Box<AtomicU64>,
    nested: bool,
    stored: bool,
}
static STORED_DROPPED: AtomicU64 = AtomicU64::new(0);

impl Key {
    fn new(id: u64, nested: bool) -> Key {
        MADE.fetch_add(1, Relaxed);
        Key {
            id,
            canary: Box::new(AtomicU64::new(MAGIC)),
            nested,
            stored: false,
        }
    }
    fn check_alive(&self, what: &str) {
        let v = self.canary.load(Relaxed);
        if v != MAGIC {
            BAD.fetch_add(1, Relaxed);
            eprintln!("BAD: {what} on a dead key {} (canary {v:#x})", self.id);
        }
    }
}

impl Clone for Key {
    fn clone(&self) -> Self {
        self.check_alive("clone");
        let mut k = Key::new(self.id, self.nested);
        k.stored = true;
        k
    }
}
impl Hash for Key {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.check_alive("hash");
        if self.nested && self.id.is_multiple_of(7) {
            // A nested pin inside the outer one, on a map that also
            // evicts (max_keys 2): retires its own tables.
            let _ = OTHER.check(&(self.id % 5));
        }
        self.id.hash(h)
    }
}
impl PartialEq for Key {
    fn eq(&self, o: &Self) -> bool {
        self.check_alive("eq");
        o.check_alive("eq");
        self.id == o.id
    }
}
impl Eq for Key {}
impl Drop for Key {
    fn drop(&mut self) {
        let v = self.canary.swap(DEAD, Relaxed);
        if v != MAGIC {
            BAD.fetch_add(1, Relaxed);
            eprintln!("BAD: drop of a dead key {} (canary {v:#x})", self.id);
        }
        DROPPED.fetch_add(1, Relaxed);
        if self.stored {
            STORED_DROPPED.fetch_add(1, Relaxed);
        }
        if self.nested && self.id.is_multiple_of(3) {
            // A pin from inside reclamation (or from an eviction).
            NESTED_IN_DROP.fetch_add(1, Relaxed);
            let _ = OTHER.check(&(self.id % 5));
        }
    }
}

type L = KeyedLimiter<Key, ManualClock>;

fn limiters(clock: &ManualClock) -> Vec<(L, usize)> {
    let mut v = Vec::new();
    for max in 1..=3 {
        for policy in [
            OverflowPolicy::EvictFullest,
            OverflowPolicy::Deny,
            OverflowPolicy::AllowUntracked,
        ] {
            v.push((
                KeyedLimiter::builder(Quota::per_second(1000).unwrap())
                    .clock(clock.clone())
                    .max_keys(max)
                    .overflow(policy)
                    .build(),
                max,
            ));
        }
    }
    v
}

#[test]
fn keys_of_tiny_maps_retired_constantly_are_dropped_exactly_once() {
    let _serial = serial();
    let dog = Watchdog::start(
        "pin_stress",
        Duration::from_secs(30),
        Duration::from_secs(100),
    );
    let clock = ManualClock::new();
    let maps = Arc::new(limiters(&clock));
    let over = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let checks = Arc::new(AtomicU64::new(0));
    const ROUNDS: u64 = 400_000;
    let mut handles = Vec::new();
    for t in 0..8u64 {
        let (maps, over, dog, checks) = (maps.clone(), over.clone(), dog.clone(), checks.clone());
        handles.push(std::thread::spawn(move || {
            let mut x = t.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            for _ in 0..ROUNDS {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let (m, max) = &maps[(x % maps.len() as u64) as usize];
                let key = Key::new((x >> 8) % 6, t % 2 == 0);
                let _ = m.check(&key);
                checks.fetch_add(1, Relaxed);
                if m.len() > *max {
                    over.fetch_add(1, Relaxed);
                }
                dog.tick();
            }
        }));
    }
    // Housekeepers: clear / evict_idle / reset.
    let housekeeping = Arc::new(AtomicU64::new(0));
    for h in 0..2u64 {
        let (maps, stop, clock, dog, hk) = (
            maps.clone(),
            stop.clone(),
            clock.clone(),
            dog.clone(),
            housekeeping.clone(),
        );
        handles.push(std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Relaxed) {
                let (m, _) = &maps[(i as usize) % maps.len()];
                match (i + h) % 3 {
                    0 => {
                        let _ = m.clear();
                    }
                    1 => {
                        clock.advance(Duration::from_millis(5));
                        let _ = m.evict_idle();
                    }
                    _ => {
                        let _ = m.reset(&Key::new(i % 6, true));
                    }
                }
                i += 1;
                hk.fetch_add(1, Relaxed);
                dog.tick();
            }
        }));
    }
    // Thread churn: records taken and given back while tables retire.
    let churned = {
        let (maps, stop, dog) = (maps.clone(), stop.clone(), dog.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Relaxed) && n < 3_000 {
                let maps = maps.clone();
                std::thread::spawn(move || {
                    for k in 0..4 {
                        let (m, _) = &maps[((n + k) as usize) % maps.len()];
                        let _ = m.check(&Key::new((n + k) % 6, true));
                        let _ = m.clear();
                    }
                })
                .join()
                .unwrap();
                n += 1;
                dog.tick();
            }
            n
        })
    };
    for h in handles.drain(..8) {
        h.join().unwrap();
    }
    stop.store(true, Relaxed);
    for h in handles {
        h.join().unwrap();
    }
    let churned = churned.join().unwrap();
    let dropped_before_end = DROPPED.load(Relaxed);
    let stored_before_end = STORED_DROPPED.load(Relaxed);
    assert_eq!(Arc::strong_count(&maps), 1, "all threads joined");
    drop(maps);
    // Drive reclamation of what the dropped maps retired.
    for i in 0..10_000u64 {
        let _ = OTHER.check(&(i % 5));
    }
    dog.finish();
    let (made, dropped) = (MADE.load(Relaxed), DROPPED.load(Relaxed));
    eprintln!(
        "checks {}, housekeeping ops {}, churned threads {churned}, keys made {made}, \
         dropped {dropped} ({dropped_before_end} before the maps were dropped), \
         map-held clones dropped before the maps were dropped {stored_before_end}, nested pins from Drop {}, len>max seen {}, bad {}",
        checks.load(Relaxed),
        housekeeping.load(Relaxed),
        NESTED_IN_DROP.load(Relaxed),
        over.load(Relaxed),
        BAD.load(Relaxed)
    );
    assert_eq!(
        BAD.load(Relaxed),
        0,
        "a key was used or dropped after it died"
    );
    assert_eq!(over.load(Relaxed), 0, "len() exceeded max_keys");
    assert_eq!(made, dropped, "every key made must be dropped exactly once");
}
