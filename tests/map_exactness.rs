//! Exactness where the map is under the most strain: at `max_keys`, where a
//! key's first requests race its own insert, and while `clear` or
//! `evict_idle` races a migration that starts during its sweep.
//!
//! Each test asserts that it reached its race, and fails (rather than
//! hangs) within seconds if a wait never ends.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use turnstile_rl::{KeyedLimiter, ManualClock, OverflowPolicy, Quota};

use turnstile_test_kit::within::within;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where the replay of a first request held inside its own insert is.
static STAGE: AtomicUsize = AtomicUsize::new(0);
/// Whether the held insert's clone was let go by the other check's end
/// (and not by its time limit).
static RELEASED_BY_PEER: AtomicBool = AtomicBool::new(false);

/// A key whose first clone (the one `check` makes to store it: thread A is
/// then inside its insert, holding the key's place under `max_keys` but
/// not yet published) waits there until the other check is done, or for
/// at most 300 ms, so the other check of the same key runs inside that
/// window.
#[derive(PartialEq, Eq, Debug)]
struct Held(u64);

impl Hash for Held {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.0.hash(h)
    }
}

impl Clone for Held {
    fn clone(&self) -> Self {
        if STAGE
            .compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            let start = Instant::now();
            while STAGE.load(Ordering::SeqCst) < 2 {
                if start.elapsed() > Duration::from_millis(300) {
                    RELEASED_BY_PEER.store(false, Ordering::SeqCst);
                    return Held(self.0);
                }
                thread::yield_now();
            }
            RELEASED_BY_PEER.store(true, Ordering::SeqCst);
        }
        Held(self.0)
    }
}

/// Two first requests of one key at `max_keys(1)`, burst 2: the second
/// arrives while the first holds the only place and is moving the key in.
/// Both must be decided on the key's one bucket: both admitted, the
/// second with nothing left, and a third request denied. Before the fix the
/// second request saw the map full and applied the overflow policy to its
/// own key: refused under `EvictFullest` and `Deny` (the key fits), and
/// admitted untracked under `AllowUntracked` (three admissions of a burst
/// of two).
fn first_requests_share_one_bucket(policy: OverflowPolicy) {
    let _serial = serial();
    STAGE.store(0, Ordering::SeqCst);
    let limiter = Arc::new(
        KeyedLimiter::<Held>::builder("1/h burst 2".parse::<Quota>().unwrap())
            .clock(ManualClock::new())
            .max_keys(1)
            .overflow(policy)
            .build(),
    );
    let (first, second) = within(Duration::from_secs(10), "two first requests", move || {
        let held = Arc::clone(&limiter);
        let first = thread::spawn(move || held.check(&Held(7)));
        // The first check is inside its insert, holding the one place.
        while STAGE.load(Ordering::SeqCst) < 1 {
            thread::yield_now();
        }
        let second = limiter.check(&Held(7));
        // Reached: the second check began while the first one's insert was
        // held, and the hold ended only when the second check was done.
        STAGE.store(2, Ordering::SeqCst);
        let first = first.join().unwrap();
        let third = limiter.check(&Held(7));
        assert!(
            third.is_denied(),
            "{policy:?}: a third request of a burst of 2"
        );
        assert_eq!(limiter.len(), 1);
        (first, second)
    });
    assert!(first.is_allowed(), "{policy:?}: {first:?}");
    assert!(
        second.is_allowed(),
        "{policy:?}: the second request was not decided on its key's bucket: {second:?}"
    );
    assert_eq!(first.remaining() + second.remaining(), 1, "{policy:?}");
}

#[test]
fn first_requests_at_max_keys_share_one_bucket_evict_fullest() {
    first_requests_share_one_bucket(OverflowPolicy::EvictFullest);
}

#[test]
fn first_requests_at_max_keys_share_one_bucket_deny() {
    first_requests_share_one_bucket(OverflowPolicy::Deny);
}

#[test]
fn first_requests_at_max_keys_share_one_bucket_allow_untracked() {
    first_requests_share_one_bucket(OverflowPolicy::AllowUntracked);
}

/// The same race left to the scheduler, with the key published: two
/// threads released together (spinning, not parked) on the first requests
/// of one new key per round, burst 1, `max_keys(1)`, a frozen clock. Before
/// the fix `EvictFullest` could evict the key's own fresh bucket for it and
/// admit both. Reached: the rounds whose two checks overlapped in time are
/// counted, and a good share must.
#[test]
fn racing_first_requests_at_max_keys_admit_once() {
    let _serial = serial();
    const ROUNDS: u64 = 20_000;
    within(Duration::from_secs(60), "racing first requests", || {
        let limiter = KeyedLimiter::<u64>::builder("1/h".parse::<Quota>().unwrap())
            .clock(ManualClock::new())
            .max_keys(1)
            .build();
        // The round both threads are released into, and the rounds the
        // other thread has finished.
        let go = AtomicU64::new(0);
        let done = AtomicU64::new(0);
        let check = |round: u64| {
            let start = Instant::now();
            let allowed = limiter.check(&round).is_allowed();
            (allowed, start, Instant::now())
        };
        let (mut overlapped, mut twice) = (0, 0);
        thread::scope(|s| {
            let other = s.spawn(|| {
                let mut seen = Vec::with_capacity(ROUNDS as usize);
                for round in 1..=ROUNDS {
                    while go.load(Ordering::Acquire) < round {
                        std::hint::spin_loop();
                    }
                    seen.push(check(round));
                    done.store(round, Ordering::Release);
                }
                seen
            });
            let mut mine = Vec::with_capacity(ROUNDS as usize);
            for round in 1..=ROUNDS {
                go.store(round, Ordering::Release);
                mine.push(check(round));
                while done.load(Ordering::Acquire) < round {
                    std::hint::spin_loop();
                }
            }
            for (a, b) in mine.iter().zip(other.join().unwrap()) {
                if a.1 < b.2 && b.1 < a.2 {
                    overlapped += 1;
                }
                if a.0 && b.0 {
                    twice += 1;
                }
            }
        });
        assert_eq!(
            twice, 0,
            "a burst of 1 admitted twice in {twice} of {ROUNDS} rounds"
        );
        assert!(
            overlapped > ROUNDS / 10,
            "only {overlapped} of {ROUNDS} rounds raced"
        );
    });
}

/// Keys one short of the map's next migration, every one spent, and the
/// housekeeping sweep's cursor placed so the whole-table sweep of `clear`
/// (before the fix) reached the table's first slots last. Fresh keys
/// inserted while `clear` runs start a migration, whose first chunks freeze
/// and copy those first slots' buckets before the sweep reaches them.
/// Every spent key live when `clear` began, and untouched since, must be
/// gone when it returns (a check of it admitted); before the fix, the
/// copied ones kept their state. (`evict_idle` runs the same code.)
#[test]
fn clear_forgets_every_key_through_a_migration_started_during_it() {
    let _serial = serial();
    let quota: Quota = "1/h".parse().unwrap();
    let mut reached = 0;
    for round in 0..5 {
        let clock = ManualClock::new();
        let limiter = KeyedLimiter::<u64>::builder(quota)
            .clock(clock.clone())
            .build();
        // A table of 2^20 slots, whose migration has ended: every key is
        // in it and none is dead, so the next one starts a migration at
        // half full.
        let mut spent = 0u64;
        while limiter.capacity() < 1 << 20 || limiter.len() < 1 << 18 {
            assert!(limiter.check(&spent).is_allowed());
            spent += 1;
        }
        let capacity = limiter.capacity();
        assert_eq!(capacity, 1 << 20);
        while limiter.len() < capacity / 2 - 1 {
            assert!(limiter.check(&spent).is_allowed());
            spent += 1;
        }
        // Each tick's housekeeping sweeps 256 slots from the cursor: 64
        // ticks put it 16,384 slots in, past the 200 chunks of 64 slots
        // the fresh keys below copy. The tick key fills the table to half.
        for _ in 0..64 {
            clock.advance(Duration::from_millis(1));
            let _ = limiter.check(&u64::MAX);
        }
        assert_eq!(limiter.len(), capacity / 2);
        let limiter = Arc::new(limiter);
        let clearing = Arc::new(AtomicBool::new(false));
        let inserted_while_clearing = Arc::new(AtomicUsize::new(0));
        let barrier = Arc::new(Barrier::new(2));
        let inserter = {
            let (limiter, clearing, inserted, barrier) = (
                Arc::clone(&limiter),
                Arc::clone(&clearing),
                Arc::clone(&inserted_while_clearing),
                Arc::clone(&barrier),
            );
            thread::spawn(move || {
                barrier.wait();
                for fresh in 0..200u64 {
                    let _ = limiter.check(&(u64::MAX / 2 + fresh));
                    if clearing.load(Ordering::SeqCst) {
                        inserted.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        };
        let cleared = Arc::clone(&limiter);
        within(Duration::from_secs(30), "clear()", move || {
            clearing.store(true, Ordering::SeqCst);
            barrier.wait();
            cleared.clear();
            clearing.store(false, Ordering::SeqCst);
        });
        inserter.join().unwrap();
        let kept = (0..spent)
            .filter(|key| limiter.check(key).is_denied())
            .count();
        assert_eq!(
            kept, 0,
            "round {round}: spent keys kept their state through clear()"
        );
        // The first fresh key starts the migration (the table is half
        // full), so any fresh key checked while `clear` ran means the
        // migration started during it.
        if inserted_while_clearing.load(Ordering::SeqCst) > 0 {
            reached += 1;
        }
    }
    assert!(reached > 0, "no round migrated while clear() ran");
}
