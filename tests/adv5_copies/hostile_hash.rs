//! Keys whose `Hash` misbehaves inside the migration chunks that copy
//! them (the chunk hashes a key while its bucket is still live, then takes
//! it to COPYING with one CAS, and buries the bucket if the hash
//! panicked).
//!
//! Hot keys are hammered by many threads while churn threads insert and
//! reset keys (migrations all the time). On a churn thread a hot key's
//! `Hash` only ever runs in a migration chunk (churn threads never look a
//! hot key up), and there it panics, sleeps, checks the same key again
//! from inside `hash` (an update landing between the hash and the COPYING
//! CAS), or peeks at another hot key. Oracles: a hot key whose hash never
//! panicked admits exactly its burst; one buried `p` times admits at most
//! `(p + 1)` bursts; `len` counts each live key once (a split key counts
//! twice); every key made is dropped exactly once; nothing hangs.

use std::cell::Cell;
use std::hash::{Hash, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Once, OnceLock, Weak};
use std::time::{Duration, Instant};

use turnstile_rl::__private::MigrationChunk as _;
use turnstile_rl::{KeyedLimiter, ManualClock, Quota};
use turnstile_test_kit::keys::SplitMix;
use turnstile_test_kit::within::within;

const BURST: u64 = 4;
const HOT_KEYS: u64 = 3;
const HOT_THREADS: u64 = 6;
const CHURN_THREADS: u64 = 3;
const CHURN_PER_ROUND: u64 = 300;
const KEPT_PER_ROUND: u64 = 2;
const RACE: Duration = Duration::from_millis(1_200);
const PANIC_MESSAGE: &str = "adv5: a hot key's hash panics in a migration chunk";

type Limiter = KeyedLimiter<Key, ManualClock>;

/// What one race's keys share: counts of keys made and dropped, of what
/// their hashes did, and the limiter their hashes use.
#[derive(Default)]
struct Shared {
    made: AtomicU64,
    dropped: AtomicU64,
    /// Per hot key: hashes that panicked in a chunk (each buries a bucket).
    panics: [AtomicU64; HOT_KEYS as usize],
    /// Per hot key: admissions, the re-entrant checks' included.
    admitted: [AtomicU64; HOT_KEYS as usize],
    reentered: AtomicU64,
    slept: AtomicU64,
    limiter: OnceLock<Weak<Limiter>>,
}

struct Key {
    id: u64,
    shared: Arc<Shared>,
}

impl Key {
    fn new(id: u64, shared: &Arc<Shared>) -> Self {
        shared.made.fetch_add(1, Relaxed);
        Key {
            id,
            shared: shared.clone(),
        }
    }
}

impl Clone for Key {
    fn clone(&self) -> Self {
        Key::new(self.id, &self.shared)
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        self.shared.dropped.fetch_add(1, Relaxed);
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}
impl Eq for Key {}

thread_local! {
    /// Set on churn threads: a hot key's hash there is a chunk's.
    static CHURN: Cell<bool> = const { Cell::new(false) };
    /// Set while a hostile hash runs, so that its own re-entrant lookups
    /// hash plainly.
    static IN_HASH: Cell<bool> = const { Cell::new(false) };
    static RNG: Cell<u64> = const { Cell::new(0) };
}

/// Clears [`IN_HASH`] when the hash ends, unwinding or not.
struct Inside;
impl Drop for Inside {
    fn drop(&mut self) {
        IN_HASH.with(|c| c.set(false));
    }
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.id.hash(h);
        let hostile = self.id < HOT_KEYS && CHURN.with(Cell::get) && !IN_HASH.with(Cell::get);
        if !hostile {
            return;
        }
        IN_HASH.with(|c| c.set(true));
        let _inside = Inside;
        let roll = RNG.with(|r| {
            let mut rng = SplitMix(r.get());
            let n = rng.next();
            r.set(rng.0);
            n
        });
        let shared = &self.shared;
        let i = self.id as usize;
        match roll % 8 {
            0 => {
                shared.panics[i].fetch_add(1, Relaxed);
                panic!("{PANIC_MESSAGE}");
            }
            1 => {
                // A slow hash: updates land on the live bucket meanwhile,
                // and the chunk's COPYING CAS must fail and read again.
                shared.slept.fetch_add(1, Relaxed);
                std::thread::sleep(Duration::from_micros(50));
            }
            2 | 3 => {
                let limiter = shared.limiter.get().and_then(Weak::upgrade);
                if let Some(limiter) = limiter {
                    shared.reentered.fetch_add(1, Relaxed);
                    if limiter.check(self).is_allowed() {
                        shared.admitted[i].fetch_add(1, Relaxed);
                    }
                    let other = Key::new((self.id + 1) % HOT_KEYS, shared);
                    let _ = limiter.peek(&other);
                }
            }
            _ => {}
        }
    }
}

/// Silences this file's own panics (hundreds per race); others print.
fn quiet_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let ours = info
                .payload()
                .downcast_ref::<String>()
                .is_some_and(|m| m == PANIC_MESSAGE);
            if !ours {
                default(info);
            }
        }));
    });
}

#[derive(Debug)]
struct Reach {
    panics: u64,
    reentered: u64,
    slept: u64,
    churn_panicked: u64,
}

fn race(chunk: usize) -> Reach {
    quiet_panics();
    let shared = Arc::new(Shared::default());
    let limiter: Arc<Limiter> = Arc::new(
        KeyedLimiter::builder(format!("1/h burst {BURST}").parse::<Quota>().unwrap())
            .clock(ManualClock::new())
            .max_keys(1 << 20)
            .migration_chunk(chunk)
            .build(),
    );
    let _ = shared.limiter.set(Arc::downgrade(&limiter));
    let done = AtomicBool::new(false);
    let kept = Mutex::new(Vec::new());
    let unknown = Mutex::new(Vec::new());
    let churn_panicked = AtomicU64::new(0);
    let lost = AtomicU64::new(0);
    let deadline = Instant::now() + RACE;

    std::thread::scope(|s| {
        for thread in 0..HOT_THREADS {
            let (limiter, shared, done) = (&limiter, &shared, &done);
            s.spawn(move || {
                let mut rng = SplitMix(thread + 7);
                let keys: Vec<Key> = (0..HOT_KEYS).map(|id| Key::new(id, shared)).collect();
                while !done.load(Relaxed) {
                    let i = (rng.next() % HOT_KEYS) as usize;
                    if limiter.check(&keys[i]).is_allowed() {
                        shared.admitted[i].fetch_add(1, Relaxed);
                    }
                }
            });
        }
        for thread in 0..CHURN_THREADS {
            let (limiter, shared, done) = (&limiter, &shared, &done);
            let (kept, unknown, churn_panicked, lost) = (&kept, &unknown, &churn_panicked, &lost);
            s.spawn(move || {
                CHURN.with(|c| c.set(true));
                RNG.with(|r| r.set(thread + 100));
                let mut next = (thread + 1) << 40;
                let (mut mine, mut unsure) = (Vec::new(), Vec::new());
                while !done.load(Relaxed) {
                    let round: Vec<u64> = (next..next + CHURN_PER_ROUND).collect();
                    next += CHURN_PER_ROUND;
                    let mut sure = Vec::new();
                    for &id in &round {
                        let key = Key::new(id, shared);
                        // A hot key's panic in the chunk this check copied
                        // comes out here: the churn key's fate is unknown.
                        match catch_unwind(AssertUnwindSafe(|| limiter.check(&key))) {
                            Ok(decision) if decision.is_allowed() => sure.push(id),
                            Ok(_) => {
                                lost.fetch_add(1, Relaxed);
                            }
                            Err(_) => {
                                churn_panicked.fetch_add(1, Relaxed);
                                unsure.push(id);
                            }
                        }
                    }
                    let keep = sure.len().min(KEPT_PER_ROUND as usize);
                    mine.extend_from_slice(&sure[..keep]);
                    for &id in &sure[keep..] {
                        let key = Key::new(id, shared);
                        match catch_unwind(AssertUnwindSafe(|| limiter.reset(&key))) {
                            Ok(true) => {}
                            Ok(false) => {
                                lost.fetch_add(1, Relaxed);
                            }
                            Err(_) => {
                                churn_panicked.fetch_add(1, Relaxed);
                                unsure.push(id);
                            }
                        }
                    }
                }
                CHURN.with(|c| c.set(false));
                kept.lock().unwrap().extend(mine);
                unknown.lock().unwrap().extend(unsure);
            });
        }
        s.spawn(|| {
            while Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            done.store(true, Relaxed);
        });
    });
    assert_eq!(
        lost.load(Relaxed),
        0,
        "churn keys denied fresh or reset absent"
    );

    // Unknown churn keys (their check or reset unwound) are forgotten, so
    // that `len` has one answer.
    for &id in unknown.lock().unwrap().iter() {
        let _ = limiter.reset(&Key::new(id, &shared));
    }
    let kept = kept.into_inner().unwrap();
    for &id in &kept {
        let remaining = limiter.peek(&Key::new(id, &shared)).remaining();
        assert_eq!(remaining, BURST - 2, "kept churn key {id:#x} lost");
    }
    let hot_tracked = (0..HOT_KEYS)
        .filter(|&id| limiter.peek(&Key::new(id, &shared)).remaining() < BURST - 1)
        .count();
    assert_eq!(
        limiter.len(),
        kept.len() + hot_tracked,
        "len against the live keys: a key split into two buckets counts twice"
    );
    for id in 0..HOT_KEYS {
        let i = id as usize;
        let key = Key::new(id, &shared);
        for _ in 0..BURST {
            if limiter.check(&key).is_allowed() {
                shared.admitted[i].fetch_add(1, Relaxed);
            }
        }
        let (a, p) = (
            shared.admitted[i].load(Relaxed),
            shared.panics[i].load(Relaxed),
        );
        if p == 0 {
            assert_eq!(a, BURST, "hot key {id}, never buried: {a} admitted");
        } else {
            assert!(
                (BURST..=BURST * (p + 1)).contains(&a),
                "hot key {id}, buried {p} times: {a} admitted"
            );
        }
    }
    let reach = Reach {
        panics: shared.panics.iter().map(|p| p.load(Relaxed)).sum(),
        reentered: shared.reentered.load(Relaxed),
        slept: shared.slept.load(Relaxed),
        churn_panicked: churn_panicked.load(Relaxed),
    };
    drop(limiter);
    // Retired tables are freed by later unpins (`map::pin`): pin and unpin
    // until they are.
    let settle = Instant::now();
    while shared.dropped.load(Relaxed) < shared.made.load(Relaxed)
        && settle.elapsed() < Duration::from_secs(5)
    {
        let _ = KeyedLimiter::<u64>::new(Quota::per_second(1).unwrap()).check(&0);
        std::thread::sleep(Duration::from_millis(5));
    }
    let (made, dropped) = (shared.made.load(Relaxed), shared.dropped.load(Relaxed));
    assert_eq!(made, dropped, "keys made against keys dropped");
    reach
}

fn assert_reached(reach: &Reach) {
    eprintln!("{reach:?}");
    assert!(reach.panics > 0, "not reached: a hash panicking in a chunk");
    assert!(
        reach.churn_panicked > 0,
        "not reached: a panic out of a chunk"
    );
    assert!(
        reach.reentered > 0,
        "not reached: a re-entrant check in a chunk"
    );
    assert!(reach.slept > 0, "not reached: a slow hash in a chunk");
}

#[test]
fn hostile_hashes_in_one_slot_chunks_never_split_lose_or_double_drop_a_key() {
    let reach = within(Duration::from_secs(60), "race", || race(1));
    assert_reached(&reach);
}
