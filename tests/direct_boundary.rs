//! A direct limiter held at its boundary by two threads admits what an
//! exact limiter admits: its add path (`src/direct.rs`, "Near the
//! boundary") leaves the last tokens to the CAS loop. Before, racing adds
//! overshot the bucket and each take-back kept its check's duration of
//! debt: two threads on a 1,000,000/s bucket admitted 77 to 81 % of it.

use std::time::{Duration, Instant};

use turnstile_rl::{Clock, DirectLimiter, Quota};

mod adv2_kit;
use adv2_kit::Ticking;

const STEP: u64 = 100;

/// Two threads check one bucket (1 per µs, burst 64) until the clock has
/// passed 20 ms (about 200,000 readings, each a tenth of a token); then the
/// clock stops and the bucket is drained. An exact limiter that never sat
/// idle admitted its burst and one token per microsecond of the clock:
/// never more, and here not less, by more than the token the clock's
/// first reading may have cost.
#[test]
fn two_threads_at_the_boundary_admit_the_whole_rate() {
    const T: u64 = 1_000;
    const BURST: u64 = 64;
    const RUN: u64 = 20_000_000;
    let quota = Quota::with_period(Duration::from_nanos(T))
        .and_then(|q| q.burst(BURST))
        .expect("a valid quota");
    let deadline = Instant::now() + Duration::from_secs(60);
    // Until a round has raced for the last tokens: 1,000 CASes lost to the
    // other thread's admissions (where the adds of the old path overshot
    // and were taken back, a round lost a sixth of the rate).
    loop {
        let clock = Ticking::new(0, STEP);
        let limiter = DirectLimiter::builder(quota).clock(clock.clone()).build();
        let retries = turnstile_rl::__private::cas_retries();
        let barrier = std::sync::Barrier::new(2);
        let admitted: u64 = std::thread::scope(|s| {
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        let mut admitted = 0;
                        while clock.now() < RUN {
                            admitted += u64::from(limiter.check().is_allowed());
                        }
                        admitted
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).sum()
        });
        clock.freeze();
        let end = clock.now();
        let drained = std::iter::from_fn(|| limiter.check().is_allowed().then_some(())).count();
        let total = admitted + drained as u64;
        let exact = BURST + end / T;
        assert!(
            total <= exact,
            "{total} admitted, more than the {exact} the quota allows"
        );
        assert!(
            total + 1 >= exact,
            "{total} admitted by the end of {end} ns where an exact limiter admits {exact}"
        );
        if turnstile_rl::__private::cas_retries() - retries >= 1_000 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the two threads never raced for a token in 60 s"
        );
    }
}
