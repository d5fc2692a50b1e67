//! Adversary (adv2): `DirectLimiter`'s add path (`src/direct.rs`, "Near
//! the boundary") with costs above 1 and more threads than cores. An
//! admission is made with an add only when it leaves room for
//! `ADD_ROOM` (32) more tokens of cost 1; a request of cost `n` that
//! races others of cost `n` overshoots once more than 32 tokens are taken
//! between its load and its add, which with `n >= 32` is one racing add.
//! Each overshoot is taken back keeping its check's duration of debt.
//!
//! The harness is tests/direct_boundary.rs's: a clock that moves a fixed
//! step per reading, so time passes only as fast as checks are made. An
//! exact limiter that never sat idle admits its burst plus one token per
//! interval of the clock, never more; here every check is of cost `n`,
//! so an exact limiter admits that less at most `n - 1` (the tail it
//! cannot spend whole).

use std::time::{Duration, Instant};

use turnstile_rl::{Clock, DirectLimiter, Quota};
use turnstile_test_kit::watchdog::Watchdog;

mod adv2_kit;
use adv2_kit::Ticking;

const STEP: u64 = 100;

/// One round: `threads` threads check `cost` each until the clock passes
/// `run` ns, then the clock stops and the bucket is drained with the same
/// cost. Returns (tokens admitted, the exact limiter's admissions for the
/// clock's end, CAS retries the round made).
fn round(quota: Quota, threads: usize, cost: u64, run: u64, dog: &Watchdog) -> (u64, u64, u64) {
    let clock = Ticking::new(0, STEP);
    let limiter = DirectLimiter::builder(quota).clock(clock.clone()).build();
    let retries = turnstile_rl::__private::cas_retries();
    let barrier = std::sync::Barrier::new(threads);
    let admitted: u64 = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    let mut admitted = 0;
                    while clock.now() < run {
                        if limiter.check_n(cost).unwrap().is_allowed() {
                            admitted += cost;
                        }
                        dog.tick();
                    }
                    admitted
                })
            })
            .collect();
        workers.into_iter().map(|t| t.join().unwrap()).sum()
    });
    clock.freeze();
    let end = clock.now();
    let mut drained = 0;
    while limiter.check_n(cost).unwrap().is_allowed() {
        drained += cost;
    }
    let t = turnstile_rl::__private::interval_nanos(&quota);
    let exact = quota.burst_size() + end / t;
    (
        admitted + drained,
        exact,
        turnstile_rl::__private::cas_retries() - retries,
    )
}

/// Runs rounds for at least `least` and until they made `races` CAS
/// retries (the boundary was raced); the worst share of the exact
/// admissions a round reached, and never above the exact bound.
fn worst_share(quota: &str, threads: usize, cost: u64, least: Duration) -> f64 {
    const RUN: u64 = 20_000_000;
    let quota: Quota = quota.parse().unwrap();
    let dog = Watchdog::start(
        "threads at a direct limiter's boundary",
        Duration::from_secs(20),
        Duration::from_secs(200),
    );
    let began = Instant::now();
    let (mut worst, mut raced, mut rounds) = (f64::MAX, 0, 0);
    while began.elapsed() < least || raced < 1_000 {
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "{threads} threads never raced for the boundary in {rounds} rounds"
        );
        let (total, exact, retries) = round(quota, threads, cost, RUN, &dog);
        assert!(total <= exact, "{total} admitted, above the exact {exact}");
        raced += retries;
        rounds += 1;
        worst = worst.min(total as f64 / (exact - (cost - 1)) as f64);
    }
    dog.finish();
    eprintln!(
        "{quota} cost {cost}, {threads} threads: {rounds} rounds, worst {:.1} % of the exact \
         limiter's admissions",
        worst * 100.0
    );
    worst
}

/// What held: cost 1, eight threads on two cores, burst 64.
#[test]
fn eight_threads_of_cost_one_admit_the_whole_rate() {
    let worst = worst_share("1000000/s burst 64", 8, 1, Duration::from_secs(2));
    assert!(worst >= 0.99, "{:.1} %", worst * 100.0);
}

/// What held too: costs of 40 on a bucket of 1,000 at 1 per µs, two
/// threads. The room of 32 cost-1 tokens is less than one racing request,
/// but a bucket held at its boundary never has room for an add anyway
/// (each request is admitted as soon as its 40 tokens are due), so the
/// overshoot zone (72 to 80 tokens left) is crossed once per drain.
#[test]
fn two_threads_of_cost_forty_admit_the_whole_rate() {
    let worst = worst_share("1000000/s burst 1000", 2, 40, Duration::from_secs(2));
    assert!(worst >= 0.99, "{:.1} %", worst * 100.0);
}
