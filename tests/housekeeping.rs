//! Housekeeping keeps its pace whatever one clock reading says (issue 21,
//! item 5): a reading far ahead of the others (a clock jump undone, another
//! core's skewed counter) once set the next step an hour out, and idle keys
//! piled up until the clock caught up with it.

use std::time::Duration;

use turnstile_rl::__private::TICK;
use turnstile_rl::{KeyedLimiter, ManualClock, Quota};

#[test]
fn one_reading_far_ahead_does_not_stop_housekeeping() {
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::<u64, _>::builder(Quota::per_second(1_000).unwrap())
        .clock(clock.clone())
        .build();
    let (spiked, busy) = (u64::MAX, u64::MAX - 1);
    clock.set(Duration::from_secs(3_600));
    let _ = limiter.check(&spiked);
    clock.set(Duration::from_millis(3));
    for key in 0..10_000 {
        let _ = limiter.check(&key);
    }
    // Every key is idle a second later; 10 s of one check a tick.
    for _ in 0..10_000 {
        clock.advance(TICK);
        let _ = limiter.check(&busy);
    }
    let stats = limiter.stats();
    assert!(
        stats.idle_evictions >= 10_000,
        "{} idle evictions",
        stats.idle_evictions
    );
    // The busy key and the one checked an hour ahead (not idle till then).
    assert_eq!(limiter.len(), 2, "keys still tracked");
}
