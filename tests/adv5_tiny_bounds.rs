//! Adversary 5: the one-CAS copy of 7e50904 at tiny bounds (`max_keys`
//! 1, 2, 3), where every new key evicts or is refused and migrations that
//! compact the dead slots never stop, raced by resets and `clear`.
//!
//! On a frozen clock a bucket admits at most its burst in its life, and at
//! least its first request (the insert's). Every life ends by a reset, a
//! `clear`, an overflow eviction (all counted in `stats`) or is live at
//! the end, so `lives <= admitted <= burst * lives`, and with a burst of
//! one, `admitted == lives` exactly: an admission on a split or lost
//! bucket, or a life ended twice, breaks it. `len` never passes the bound,
//! and at the end counts each tracked key once.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use turnstile_rl::__private::MigrationChunk as _;
use turnstile_rl::{KeyedLimiter, ManualClock, OverflowPolicy, Quota};
use turnstile_test_kit::keys::SplitMix;
use turnstile_test_kit::within::within;

const KEYS: u64 = 8;
const CHECKERS: u64 = 6;
const RACE: Duration = Duration::from_millis(250);

/// One race of `max_keys`, `policy` and `burst`, with its assertions.
fn race(max_keys: usize, policy: OverflowPolicy, burst: u64) {
    let limiter: KeyedLimiter<u64, ManualClock> =
        KeyedLimiter::builder(format!("1/h burst {burst}").parse::<Quota>().unwrap())
            .clock(ManualClock::new())
            .max_keys(max_keys)
            .overflow(policy)
            .migration_chunk(1)
            .build();
    let admitted = AtomicU64::new(0);
    let over = AtomicUsize::new(0);
    let clears = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let deadline = Instant::now() + RACE;
    std::thread::scope(|s| {
        for thread in 0..CHECKERS {
            let (limiter, admitted, done) = (&limiter, &admitted, &done);
            s.spawn(move || {
                let mut rng = SplitMix(thread + 3);
                while !done.load(Relaxed) {
                    if limiter.check(&(rng.next() % KEYS)).is_allowed() {
                        admitted.fetch_add(1, Relaxed);
                    }
                }
            });
        }
        s.spawn(|| {
            let mut rng = SplitMix(77);
            let mut step = 0u64;
            while Instant::now() < deadline {
                step += 1;
                let _ = limiter.reset(&(rng.next() % KEYS));
                if step.is_multiple_of(16) {
                    let _ = limiter.clear();
                    clears.fetch_add(1, Relaxed);
                }
                let held = limiter.len();
                if held > max_keys {
                    over.fetch_max(held, Relaxed);
                }
            }
            done.store(true, Relaxed);
        });
    });
    let what = format!("max_keys {max_keys}, {policy:?}, burst {burst}");
    assert_eq!(over.load(Relaxed), 0, "{what}: len passed the bound");
    let stats = limiter.stats();
    assert_eq!(
        stats.idle_evictions, 0,
        "{what}: a key went idle on a frozen clock"
    );
    let tracked = (0..KEYS)
        .filter(|key| limiter.peek(key).remaining() < burst - 1 || limiter.peek(key).is_denied())
        .count();
    assert_eq!(
        limiter.len(),
        tracked,
        "{what}: len against the tracked keys"
    );
    let lives = stats.resets + stats.overflow_evictions + limiter.len() as u64;
    let admitted = admitted.into_inner();
    eprintln!(
        "{what}: {admitted} admitted in {lives} lives ({} resets and cleared, {} overflow \
         evictions, {} refusals, {} clears)",
        stats.resets,
        stats.overflow_evictions,
        stats.overflow_refusals,
        clears.load(Relaxed)
    );
    assert!(
        (lives..=burst * lives).contains(&admitted),
        "{what}: {admitted} admitted in {lives} bucket lives"
    );
    assert!(
        lives > 20,
        "{what}: not reached: bucket lives ending under the race"
    );
    if policy == OverflowPolicy::EvictFullest && max_keys < KEYS as usize {
        assert!(
            stats.overflow_evictions > 0,
            "{what}: not reached: an overflow eviction"
        );
    }
}

#[test]
fn tiny_bounds_count_every_bucket_life_once() {
    within(Duration::from_secs(60), "tiny bounds", || {
        for max_keys in [1, 2, 3] {
            for policy in [OverflowPolicy::EvictFullest, OverflowPolicy::Deny] {
                for burst in [1, 3] {
                    race(max_keys, policy, burst);
                }
            }
        }
    });
}
