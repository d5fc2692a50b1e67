//! Adversary (adv2): a `DirectLimiter`'s add path (`src/direct.rs`)
//! racing a multi-limit check on the same bucket. A `MultiLimiter`'s
//! limits are `DirectLimiter`s (`limits()`): direct checks of random costs
//! on each limit (adds, take-backs, the CAS loop) race multi-limit checks
//! (charges and rollbacks, `crate::multi`) on the same cells. Neither may
//! let a limit admit more than its quota allows: for each limit, the
//! tokens admitted for good (its direct admissions and the multi-limit
//! admissions) stay within the exact bound for the clock's run, on a
//! frozen clock and on one that moves a step per reading.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use turnstile_rl::{MultiLimiter, Quota, Quotas};
use turnstile_test_kit::watchdog::Watchdog;

mod adv2_kit;
use adv2_kit::{Rng, Ticking};

const THREADS: u64 = 8;

/// One round: eight threads, half checking the multi-limit, half each
/// limit directly, with costs 1 to 8, until `run` ns of the clock (or
/// until each has been denied 200 times on a frozen clock). Tokens
/// admitted for good per limit, and the bound per limit.
fn round(step: u64, run: u64, dog: &Watchdog) -> ([u64; 2], [u64; 2]) {
    let quotas: [Quota; 2] = [
        "1000000/s burst 64".parse().unwrap(),
        "200000/s burst 200".parse().unwrap(),
    ];
    let clock = Ticking::new(1_000_000, step);
    let multi = MultiLimiter::builder(Quotas::new(quotas).unwrap())
        .clock(clock.clone())
        .build();
    let admitted = [AtomicU64::new(0), AtomicU64::new(0)];
    let stop = AtomicBool::new(false);
    let start = Barrier::new(THREADS as usize);
    std::thread::scope(|s| {
        for thread in 0..THREADS {
            let (multi, admitted, clock, stop, start) = (&multi, &admitted, &clock, &stop, &start);
            s.spawn(move || {
                start.wait();
                let mut rng = Rng(thread * 7919 + 1);
                let mut denials = 0;
                while !stop.load(Ordering::Relaxed) {
                    let cost = 1 + rng.below(8);
                    let allowed = match thread % 4 {
                        0 | 1 => {
                            let allowed = multi.check_n(cost).unwrap().is_allowed();
                            if allowed {
                                admitted[0].fetch_add(cost, Ordering::Relaxed);
                                admitted[1].fetch_add(cost, Ordering::Relaxed);
                            }
                            allowed
                        }
                        limit => {
                            let limit = limit as usize - 2;
                            let allowed = multi.limits()[limit].check_n(cost).unwrap().is_allowed();
                            if allowed {
                                admitted[limit].fetch_add(cost, Ordering::Relaxed);
                            }
                            allowed
                        }
                    };
                    denials += u64::from(!allowed);
                    dog.tick();
                    // A frozen clock: each thread until its own denials.
                    if step == 0 && denials >= 200 {
                        return;
                    }
                    if clock.now.load(Ordering::Relaxed) >= run {
                        stop.store(true, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let end = clock.now.load(Ordering::Relaxed);
    let bounds = quotas
        .map(|q| q.burst_size() + (end - 1_000_000) / turnstile_rl::__private::interval_nanos(&q));
    (admitted.map(AtomicU64::into_inner), bounds)
}

fn attack(step: u64) {
    let dog = Watchdog::start(
        "direct adds racing multi-limit checks",
        Duration::from_secs(20),
        Duration::from_secs(200),
    );
    let began = Instant::now();
    let (moved, _, _) = turnstile_rl::__private::rollback_races();
    let retries = turnstile_rl::__private::cas_retries();
    let mut rounds = 0;
    while began.elapsed() < Duration::from_secs(3)
        // On a frozen clock rounds are short and rollbacks rarely race:
        // there the adds' races (CAS retries) are the case.
        || step != 0 && turnstile_rl::__private::rollback_races().0 == moved
        || turnstile_rl::__private::cas_retries() - retries < 1_000
    {
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "rollbacks and adds never raced in {rounds} rounds"
        );
        rounds += 1;
        let (admitted, bounds) = round(step, 2_000_000, &dog);
        for limit in 0..2 {
            assert!(
                admitted[limit] <= bounds[limit],
                "round {rounds}, step {step}: limit {limit} admitted {} tokens, its quota \
                 allows {}",
                admitted[limit],
                bounds[limit]
            );
        }
    }
    dog.finish();
    eprintln!(
        "step {step}: {rounds} rounds within the bounds in {:?}, {} rollbacks raced, {} CAS retries",
        began.elapsed(),
        turnstile_rl::__private::rollback_races().0 - moved,
        turnstile_rl::__private::cas_retries() - retries
    );
}

#[test]
fn on_a_frozen_clock_no_limit_admits_more_than_its_burst() {
    attack(0);
}

#[test]
fn on_a_moving_clock_no_limit_admits_more_than_its_quota() {
    attack(50);
}
