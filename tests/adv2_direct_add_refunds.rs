//! Adversary (adv2): a `DirectLimiter`'s add path (`src/direct.rs`) racing
//! refunds, resets and quota changes. Six threads check costs 1 to 8
//! (adds, take-backs, the CAS loop), one refunds, and one resets now and
//! then or switches the burst between 64 and 8 (same interval). A refund
//! gives back at most its `n` tokens and a reset at most the burst (two
//! on a moving clock, see `round`), so the tokens admitted stay within
//! the exact bound (for the larger burst) plus the tokens refunded (by
//! refunds that said they gave something) plus that per reset.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use turnstile_rl::{DirectLimiter, Quota};
use turnstile_test_kit::watchdog::Watchdog;

mod adv2_kit;
use adv2_kit::{Rng, Ticking};

const THREADS: u64 = 8;
const START: u64 = 1_000_000;

/// One round; (admitted, bound, resets that found the bucket in use).
fn round(step: u64, run: u64, change_quota: bool, strict: bool, dog: &Watchdog) -> (u64, u64, u64) {
    let quota: Quota = "1000000/s burst 64".parse().unwrap();
    let clock = Ticking::new(START, step);
    let limiter = DirectLimiter::builder(quota).clock(clock.clone()).build();
    let admitted = AtomicU64::new(0);
    let refunded = AtomicU64::new(0);
    let resets = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let start = Barrier::new(THREADS as usize);
    std::thread::scope(|s| {
        for thread in 0..THREADS {
            let (limiter, admitted, refunded, resets, clock, stop, start) = (
                &limiter, &admitted, &refunded, &resets, &clock, &stop, &start,
            );
            s.spawn(move || {
                let mut rng = Rng(thread * 7919 + 1);
                let mut denials = 0;
                start.wait();
                while !stop.load(Ordering::Relaxed) {
                    match thread {
                        0 => {
                            let n = 1 + rng.below(4);
                            if limiter.refund(n).unwrap() {
                                refunded.fetch_add(n, Ordering::Relaxed);
                            }
                        }
                        1 if change_quota => {
                            let burst = [64, 8][rng.below(2) as usize];
                            let quota = Quota::per_second(1_000_000).and_then(|q| q.burst(burst));
                            limiter.set_quota(quota.unwrap());
                        }
                        1 => {
                            // Paced by an environment lookup (a lock and an
                            // allocation) each turn: the pace at which the
                            // lead below reproduced.
                            let _ = std::env::var_os("ADV2_PACE");
                            if rng.below(16) == 0 && limiter.reset() {
                                resets.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        _ => {
                            let cost = 1 + rng.below(8);
                            if limiter.check_n(cost).unwrap().is_allowed() {
                                admitted.fetch_add(cost, Ordering::Relaxed);
                            } else {
                                denials += 1;
                            }
                        }
                    }
                    dog.tick();
                    let done = if step == 0 {
                        denials >= 200
                    } else {
                        clock.now.load(Ordering::Relaxed) >= run
                    };
                    if done {
                        stop.store(true, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let end = clock.now.load(Ordering::Relaxed);
    let resets = resets.into_inner();
    // A frozen clock: one burst per reset. A moving one: two, because a
    // check whose reading predates a reset and whose CAS (or add) lands
    // after it can meet a full bucket at its old reading, and fresh
    // readings then meet another: the exact limiter's own worst case for
    // a check in flight across a reset. (`strict`: one burst, the lead
    // that `a_moving_clock_with_resets_admits_one_burst_per_reset` keeps.)
    let per_reset = if step == 0 || strict { 64 } else { 128 };
    let bound = 64 + per_reset * resets + (end - START) / 1_000 + refunded.into_inner();
    (admitted.into_inner(), bound, resets)
}

fn attack(step: u64, change_quota: bool, strict: bool) {
    let dog = Watchdog::start(
        "direct adds racing refunds and resets",
        Duration::from_secs(20),
        Duration::from_secs(200),
    );
    let began = Instant::now();
    let retries = turnstile_rl::__private::cas_retries();
    let (mut rounds, mut reset_rounds) = (0, 0);
    while began.elapsed() < Duration::from_secs(3)
        || turnstile_rl::__private::cas_retries() - retries < 1_000
        || reset_rounds == 0
    {
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "adds never raced refunds and resets in {rounds} rounds"
        );
        rounds += 1;
        let (admitted, bound, resets) = round(step, START + 2_000_000, change_quota, strict, &dog);
        reset_rounds += u64::from(resets > 0 || change_quota);
        assert!(
            admitted <= bound,
            "round {rounds}, step {step}: {admitted} tokens admitted, at most {bound} allowed"
        );
    }
    dog.finish();
    eprintln!(
        "step {step}: {rounds} rounds ({reset_rounds} with resets) within the bound, {} CAS retries",
        turnstile_rl::__private::cas_retries() - retries
    );
}

#[test]
fn on_a_frozen_clock_refunds_and_resets_give_back_no_more_than_they_say() {
    attack(0, false, false);
}

#[test]
fn on_a_moving_clock_quota_changes_admit_no_more_than_the_larger_burst() {
    attack(50, true, false);
}

#[test]
fn on_a_moving_clock_refunds_and_resets_give_back_no_more_than_they_say() {
    attack(50, false, false);
}

/// A lead, not a proven defect: on the moving clock, with one burst per
/// reset, rounds admitted 1 to 9 tokens more (4 of 8 runs of 3 s, about
/// one round in 1,000 with resets; every failing round had 3 to 6
/// resets and no refund). Never at burst 32, where no check adds
/// (`ADD_ROOM`), in 14 runs, nor on a frozen clock in 10. Either the
/// add path's longer window (clock read, load, add, take-back, reload)
/// makes a check in flight across a reset likelier, which the exact
/// limiter also allows, or an add or take-back crosses a reset.
#[test]
#[ignore = "adv2 lead: over one burst per reset with adds on a moving clock; see the report"]
fn a_moving_clock_with_resets_admits_one_burst_per_reset() {
    attack(50, false, true);
}
