//! Adversary (adv2): what a `LeasedLimiter`'s decisions say. The module
//! docs (`src/leased.rs`, "What a check costs") say a decision served
//! from a lease reports, as `remaining`, this stripe's view: what the
//! caller may still spend, overstated by what other stripes took since
//! its last take, never understated. These tests hold it to that on a
//! frozen clock, where nothing refills and the count is exact. (The docs
//! said "what this caller may still spend" until the adversary's test
//! below showed 8 reported where 6 could be spent.)

use std::time::Duration;

use turnstile_rl::leased::MAX_STRIPES;
use turnstile_rl::{DirectLimiter, LeasedLimiter, ManualClock, Quota};

/// Cost-1 checks this thread gets admitted, back to back, until the first
/// denial (bounded: the burst is small).
fn admitted_until_denied(check: impl Fn() -> bool) -> u64 {
    let mut admitted = 0;
    while check() {
        admitted += 1;
        assert!(admitted <= 1_000, "a frozen clock never ran dry");
    }
    admitted
}

/// The reference: on a `DirectLimiter` and a frozen clock, a caller left
/// alone gets exactly the `remaining` its last decision reported.
#[test]
fn a_direct_decisions_remaining_is_what_a_lone_caller_then_gets() {
    let quota: Quota = "1000/s burst 10".parse().unwrap();
    let limiter = DirectLimiter::builder(quota)
        .clock(ManualClock::starting_at(Duration::from_secs(1)))
        .build();
    let _ = limiter.check_n(3).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| while limiter.check_n(2).unwrap().is_allowed() {});
    });
    let decision = limiter.check();
    let reported = if decision.is_allowed() {
        decision.remaining()
    } else {
        0
    };
    assert_eq!(
        admitted_until_denied(|| limiter.check().is_allowed()),
        reported
    );
}

/// Thread A takes a lease of 8 from a bucket of 10 (frozen clock);
/// thread B, on another stripe, takes the last 2 and stops. A, now alone,
/// is told `remaining() == 8` by its next admission, and can spend the 6
/// its lease still holds: the figure is the bucket's headroom *as of A's
/// take* plus A's lease, high by exactly the 2 B took since (and its
/// `reset_after` low by their 2 ms). An estimate, as the docs say; never
/// below what the caller gets.
#[test]
fn a_leased_decisions_remaining_is_high_by_what_other_stripes_took() {
    let quota: Quota = "1000/s burst 10".parse().unwrap();
    let limiter = LeasedLimiter::builder(quota)
        .clock(ManualClock::starting_at(Duration::from_secs(1)))
        .max_lease(8)
        .lease_ttl(Duration::from_secs(60))
        // Two threads of this process land on two stripes.
        .stripes(MAX_STRIPES)
        .adaptive(false)
        .build()
        .unwrap();
    // A (this thread): a lease of 8, one spent, 7 left in its stripe.
    let first = limiter.check();
    assert!(first.is_allowed());
    assert_eq!(first.remaining(), 9, "bucket 2 + lease 7: right so far");
    // B (its own stripe) takes the bucket's last 2 tokens and stops.
    let taken_by_b = std::thread::scope(|s| {
        s.spawn(|| admitted_until_denied(|| limiter.check().is_allowed()))
            .join()
            .unwrap()
    });
    assert_eq!(taken_by_b, 2, "B found the two tokens A's lease left");
    // A alone again: one more admission, from its lease.
    let decision = limiter.check();
    assert!(decision.is_allowed());
    let then = admitted_until_denied(|| limiter.check().is_allowed());
    assert_eq!(
        (decision.remaining(), decision.reset_after()),
        (then + taken_by_b, Duration::from_millis(10 - taken_by_b)),
        "remaining {} and reset_after {:?} reported; this caller alone then got {then} \
         on a frozen clock after B took {taken_by_b}",
        decision.remaining(),
        decision.reset_after()
    );
}
