//! The one-CAS copy raced by every operation on the buckets it copies,
//! with exact oracles.
//!
//! Hot keys are hammered by many threads (check, peek, refund) while churn
//! threads insert fresh keys and reset most of them again, so tables grow,
//! compact and shrink all the time under the hot keys. On a clock that
//! moves by less than one emission interval in all, every bucket admits
//! exactly its burst (plus one per successful refund): an update lost in a
//! copy, or a key split into two buckets, admits more. Every churn key
//! that was never reset is tracked at the end, every reset finds its key
//! (a copy that lost a bucket fails one of them), `len` counts every live
//! key once, and `evict_idle` never finds an idle key.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use turnstile_rl::__private::MigrationChunk as _;
use turnstile_rl::{KeyedLimiter, ManualClock, Quota};
use turnstile_test_kit::keys::SplitMix;
use turnstile_test_kit::within::within;

const BURST: u64 = 5;
const HOT_KEYS: u64 = 3;
const HOT_THREADS: u64 = 8;
const CHURN_THREADS: u64 = 3;
const RACE: Duration = Duration::from_millis(1_500);
/// Fresh keys a churn thread inserts per round, of which it keeps
/// [`KEPT_PER_ROUND`] and resets the rest: live keys rise and fall by
/// hundreds, so the root grows and shrinks.
const CHURN_PER_ROUND: u64 = 400;
const KEPT_PER_ROUND: u64 = 2;

fn quota() -> Quota {
    // An hour per request: on a clock that moves by seconds, a bucket
    // admits its burst and nothing more.
    format!("1/h burst {BURST}").parse().unwrap()
}

/// What one race reached and found.
#[derive(Debug, Default)]
struct Reach {
    grew: usize,
    shrank: usize,
    /// Hot checks during which the root's capacity changed.
    checks_across_migrations: u64,
    refunds: u64,
    resets: u64,
    peeks: u64,
}

/// One race: `chunk` slots per migration step; `moving` advances the clock
/// (a millisecond at a time, so housekeeping sweeps and compacts) and calls
/// `evict_idle` (whole-table migrations), otherwise the clock is frozen and
/// hot threads refund too.
fn race(chunk: usize, moving: bool) -> Reach {
    let clock = ManualClock::new();
    let limiter: KeyedLimiter<u64, ManualClock> = KeyedLimiter::builder(quota())
        .clock(clock.clone())
        .max_keys(1 << 20)
        .migration_chunk(chunk)
        .build();
    let admitted: Vec<AtomicU64> = (0..HOT_KEYS).map(|_| AtomicU64::new(0)).collect();
    let refunded: Vec<AtomicU64> = (0..HOT_KEYS).map(|_| AtomicU64::new(0)).collect();
    let kept = Mutex::new(Vec::new());
    let reset_keys = Mutex::new(Vec::new());
    let done = AtomicBool::new(false);
    let across = AtomicU64::new(0);
    let peeks = AtomicU64::new(0);
    let (grew, shrank) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let lost = AtomicU64::new(0);
    let deadline = Instant::now() + RACE;

    std::thread::scope(|s| {
        for thread in 0..HOT_THREADS {
            let (limiter, admitted, refunded) = (&limiter, &admitted, &refunded);
            let (done, across, peeks) = (&done, &across, &peeks);
            s.spawn(move || {
                let mut rng = SplitMix(thread + 1);
                // The least remaining this thread has seen per hot key:
                // with no refunds and less than an interval of clock, a
                // bucket's remaining never rises, so a later read above an
                // earlier one read a stale copy.
                let mut least = vec![BURST; HOT_KEYS as usize];
                while !done.load(Relaxed) {
                    let key = rng.next() % HOT_KEYS;
                    let i = key as usize;
                    let before = limiter.capacity();
                    let decision = match rng.next() % 8 {
                        0 if !moving => {
                            if limiter.refund(&key, 1).unwrap() {
                                refunded[i].fetch_add(1, Relaxed);
                            }
                            continue;
                        }
                        1 => {
                            peeks.fetch_add(1, Relaxed);
                            limiter.peek(&key)
                        }
                        _ => {
                            let decision = limiter.check(&key);
                            if decision.is_allowed() {
                                admitted[i].fetch_add(1, Relaxed);
                            }
                            decision
                        }
                    };
                    if limiter.capacity() != before {
                        across.fetch_add(1, Relaxed);
                    }
                    if moving {
                        let remaining = decision.remaining();
                        assert!(
                            remaining <= least[i],
                            "hot key {key}: remaining {remaining} after {} (a stale bucket)",
                            least[i]
                        );
                        least[i] = remaining;
                    }
                }
            });
        }
        for thread in 0..CHURN_THREADS {
            let (limiter, kept, reset_keys, done, lost) =
                (&limiter, &kept, &reset_keys, &done, &lost);
            let (grew, shrank) = (&grew, &shrank);
            s.spawn(move || {
                let mut next = (thread + 1) << 40;
                let mut last = limiter.capacity();
                // The capacities this thread's own operations leave behind.
                let mut saw = |capacity: usize| {
                    if capacity > last {
                        grew.fetch_add(1, Relaxed);
                    } else if capacity < last {
                        shrank.fetch_add(1, Relaxed);
                    }
                    last = capacity;
                };
                let (mut mine, mut gone) = (Vec::new(), Vec::new());
                while !done.load(Relaxed) {
                    let round: Vec<u64> = (next..next + CHURN_PER_ROUND).collect();
                    next += CHURN_PER_ROUND;
                    for key in &round {
                        // A fresh key: its first request is admitted.
                        if !limiter.check(key).is_allowed() {
                            lost.fetch_add(1, Relaxed);
                        }
                        saw(limiter.capacity());
                    }
                    let (keep, reset) = round.split_at(KEPT_PER_ROUND as usize);
                    mine.extend_from_slice(keep);
                    for key in reset {
                        // Tracked since its check: a false is a lost bucket.
                        if !limiter.reset(key) {
                            lost.fetch_add(1, Relaxed);
                        }
                        saw(limiter.capacity());
                        gone.push(*key);
                    }
                }
                kept.lock().unwrap().extend(mine);
                reset_keys.lock().unwrap().extend(gone);
            });
        }
        // Moves the clock, evicts idle keys (none is idle), and stops the
        // race.
        s.spawn(|| {
            let mut step = 0u64;
            while Instant::now() < deadline {
                step += 1;
                if moving {
                    clock.advance(Duration::from_millis(1));
                    if step.is_multiple_of(64) {
                        assert_eq!(limiter.evict_idle(), 0, "evicted a key that was not idle");
                    }
                }
                std::thread::yield_now();
            }
            done.store(true, Relaxed);
        });
    });
    assert_eq!(
        lost.load(Relaxed),
        0,
        "churn keys lost (denied fresh, or reset absent)"
    );
    assert!(
        clock.elapsed() < Duration::from_secs(3600),
        "the clock moved past an interval: the oracle needs less"
    );

    let kept = kept.into_inner().unwrap();
    let reset_keys = reset_keys.into_inner().unwrap();
    // Every kept key still holds its one admission; every reset key is absent.
    for key in &kept {
        assert_eq!(
            limiter.peek(key).remaining(),
            BURST - 2,
            "kept churn key {key:#x} lost"
        );
    }
    for key in reset_keys.iter().step_by(7) {
        assert_eq!(
            limiter.peek(key).remaining(),
            BURST - 1,
            "reset churn key {key:#x} back"
        );
    }
    assert_eq!(
        limiter.len(),
        kept.len() + HOT_KEYS as usize,
        "len against the live keys"
    );
    // Topped up alone, every hot key admits exactly its burst in all, plus
    // one per refund that gave a token back.
    for (i, count) in admitted.iter().enumerate() {
        for _ in 0..BURST {
            if limiter.check(&(i as u64)).is_allowed() {
                count.fetch_add(1, Relaxed);
            }
        }
        let (a, r) = (count.load(Relaxed), refunded[i].load(Relaxed));
        assert_eq!(a, BURST + r, "hot key {i}: {a} admitted, {r} refunded");
    }
    Reach {
        grew: grew.into_inner(),
        shrank: shrank.into_inner(),
        checks_across_migrations: across.into_inner(),
        refunds: refunded.iter().map(|r| r.load(Relaxed)).sum(),
        resets: reset_keys.len() as u64,
        peeks: peeks.into_inner(),
    }
}

fn assert_reached(reach: &Reach, refunds: bool) {
    eprintln!("{reach:?}");
    assert!(
        reach.grew >= 2 && reach.shrank >= 2,
        "not reached: growth and shrinking: {reach:?}"
    );
    assert!(
        reach.checks_across_migrations > 0,
        "not reached: a hot check across a migration"
    );
    assert!(
        reach.resets > 0 && reach.peeks > 0,
        "not reached: resets and peeks"
    );
    if refunds {
        assert!(reach.refunds > 0, "not reached: a refund");
    }
}

#[test]
fn hot_keys_admit_their_burst_exactly_across_one_slot_chunks_on_a_frozen_clock() {
    let reach = within(Duration::from_secs(60), "race", || race(1, false));
    assert_reached(&reach, true);
}

#[test]
fn hot_keys_admit_their_burst_exactly_across_default_chunks_on_a_moving_clock() {
    let reach = within(Duration::from_secs(60), "race", || race(64, true));
    assert_reached(&reach, false);
}
