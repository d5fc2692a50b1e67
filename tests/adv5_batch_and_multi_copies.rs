//! Adversary 5: `check_batch` and multi-limit checks racing the one-CAS
//! copy of 7e50904 (a chunk takes a live bucket straight to COPYING).
//!
//! Hot keys are hammered by batches (or multi-limit checks) on many
//! threads while churn threads insert fresh keys and reset most of them,
//! so the tables migrate all the time under the hot keys, on a frozen
//! clock. A batch must decide every one of its requests on the key's
//! current bucket: each hot key admits exactly its burst. A multi-limit
//! check whose rollback meets its bucket moved leaves the charge in (the
//! documented over-denial), but never admits more than the tightest
//! limit: at most its burst per hot key, and at least the burst less the
//! rollbacks that met a bucket gone.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use turnstile_rl::__private::{rollback_races, MigrationChunk as _};
use turnstile_rl::{KeyedLimiter, KeyedMultiLimiter, ManualClock, Quota, Quotas};
use turnstile_test_kit::keys::SplitMix;
use turnstile_test_kit::within::within;

const HOT_KEYS: u64 = 3;
const HOT_THREADS: u64 = 6;
const CHURN_THREADS: u64 = 2;
const CHURN_PER_ROUND: u64 = 300;
const RACE: Duration = Duration::from_millis(1_200);

/// Runs `hot` on [`HOT_THREADS`] threads and `churn` (a thread's round of
/// fresh keys from `next`, returning how many were lost) on
/// [`CHURN_THREADS`] for [`RACE`]; returns the keys lost.
fn race(
    hot: impl Fn(&mut SplitMix) + Sync,
    churn: impl Fn(std::ops::Range<u64>) -> u64 + Sync,
) -> u64 {
    let done = AtomicBool::new(false);
    let lost = AtomicU64::new(0);
    let deadline = Instant::now() + RACE;
    std::thread::scope(|s| {
        for thread in 0..HOT_THREADS {
            let (hot, done) = (&hot, &done);
            s.spawn(move || {
                let mut rng = SplitMix(thread + 11);
                while !done.load(Relaxed) {
                    hot(&mut rng);
                }
            });
        }
        for thread in 0..CHURN_THREADS {
            let (churn, done, lost) = (&churn, &done, &lost);
            s.spawn(move || {
                let mut next = (thread + 1) << 40;
                while !done.load(Relaxed) {
                    lost.fetch_add(churn(next..next + CHURN_PER_ROUND), Relaxed);
                    next += CHURN_PER_ROUND;
                }
            });
        }
        s.spawn(|| {
            while Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            done.store(true, Relaxed);
        });
    });
    lost.into_inner()
}

#[test]
fn batches_of_hot_keys_across_one_slot_chunk_copies_admit_each_burst_exactly() {
    const BURST: u64 = 5;
    within(Duration::from_secs(60), "batch race", || {
        let limiter: KeyedLimiter<u64, ManualClock> =
            KeyedLimiter::builder(format!("1/h burst {BURST}").parse::<Quota>().unwrap())
                .clock(ManualClock::new())
                .max_keys(1 << 20)
                .migration_chunk(1)
                .build();
        let admitted: Vec<AtomicU64> = (0..HOT_KEYS).map(|_| AtomicU64::new(0)).collect();
        let batches = AtomicU64::new(0);
        let lost = race(
            |rng| {
                let len = 2 + (rng.next() % 7) as usize;
                let keys: Vec<u64> = (0..len).map(|_| rng.next() % HOT_KEYS).collect();
                let mut out = Vec::new();
                limiter.check_batch(&keys, &mut out);
                let mut least = [BURST; HOT_KEYS as usize];
                for (key, decision) in keys.iter().zip(&out) {
                    let i = *key as usize;
                    if decision.is_allowed() {
                        admitted[i].fetch_add(1, Relaxed);
                    }
                    // A batch's decisions of one key never rise: a
                    // later one above an earlier read a stale copy.
                    assert!(
                        decision.remaining() <= least[i],
                        "key {key} rose in a batch"
                    );
                    least[i] = decision.remaining();
                }
                batches.fetch_add(1, Relaxed);
            },
            |round| {
                let keys: Vec<u64> = round.collect();
                let mut out = Vec::new();
                limiter.check_batch(&keys, &mut out);
                let mut lost = out.iter().filter(|d| d.is_denied()).count() as u64;
                // Keep one a round; a reset that finds no key lost it.
                lost += keys[1..].iter().filter(|k| !limiter.reset(*k)).count() as u64;
                lost
            },
        );
        assert_eq!(lost, 0, "churn keys denied fresh, or reset absent");
        for (i, count) in admitted.iter().enumerate() {
            for _ in 0..BURST {
                if limiter.check(&(i as u64)).is_allowed() {
                    count.fetch_add(1, Relaxed);
                }
            }
            assert_eq!(count.load(Relaxed), BURST, "hot key {i}");
        }
        let migrated_keys = limiter.len() as u64 - HOT_KEYS;
        eprintln!(
            "{} batches; {migrated_keys} churn keys kept",
            batches.load(Relaxed)
        );
        assert!(
            batches.load(Relaxed) > 0 && migrated_keys > 100,
            "not reached: batches under churn"
        );
    });
}

#[test]
fn multi_limit_checks_across_copies_never_admit_past_the_tightest_limit() {
    // The tighter limit second: the first is charged, then rolled back
    // when the second denies, on a bucket a migration may be copying.
    const TIGHT: u64 = 4;
    within(Duration::from_secs(60), "multi race", || {
        let quotas: Quotas = format!("1/h burst 7; 1/h burst {TIGHT}").parse().unwrap();
        let limiter: KeyedMultiLimiter<u64, ManualClock> = KeyedMultiLimiter::builder(quotas)
            .clock(ManualClock::new())
            .max_keys(1 << 20)
            .build();
        let admitted: Vec<AtomicU64> = (0..HOT_KEYS).map(|_| AtomicU64::new(0)).collect();
        let (_, gone_before, _) = rollback_races();
        let lost = race(
            |rng| {
                let key = rng.next() % HOT_KEYS;
                if limiter.check(&key).is_allowed() {
                    admitted[key as usize].fetch_add(1, Relaxed);
                }
            },
            |round| {
                let mut lost = 0;
                for key in round.clone() {
                    lost += u64::from(limiter.check(&key).is_denied());
                }
                lost + round.skip(1).filter(|k| !limiter.reset(k)).count() as u64
            },
        );
        assert_eq!(lost, 0, "churn keys denied fresh, or reset absent");
        let (_, gone_after, _) = rollback_races();
        let gone = gone_after - gone_before;
        let mut total = 0;
        for (i, count) in admitted.iter().enumerate() {
            for _ in 0..TIGHT {
                if limiter.check(&(i as u64)).is_allowed() {
                    count.fetch_add(1, Relaxed);
                }
            }
            let a = count.load(Relaxed);
            assert!(
                a <= TIGHT,
                "hot key {i}: {a} admitted past the tightest burst {TIGHT}"
            );
            total += a;
        }
        eprintln!("multi: {total} admitted, {gone} rollbacks met their bucket gone");
        assert!(
            total + gone >= HOT_KEYS * TIGHT,
            "{total} admitted, {gone} rollbacks gone"
        );
        assert!(
            gone > 0,
            "not reached: a rollback meeting its bucket moved by a migration"
        );
    });
}
