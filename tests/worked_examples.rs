//! The worked examples of the rate-limiting tutorials this project started
//! from (see `turnstile_test_kit::reference`), exact, on a manual clock, with
//! every figure of every `Decision` checked: replayed on turnstile's limiters
//! and on the tutorials' own `f64` token bucket.
//!
//! Capacity 5 refilled at 2/s is `Quota::per_second(2)?.burst(5)?`: one token
//! every `T = 500 ms`, tolerance `tau = B * T = 2.5 s`.

use std::time::Duration;

use turnstile_rl::{Decision, DirectLimiter, ManualClock, Quota, QuotaError};
use turnstile_test_kit::reference::SeedTokenBucket;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn capacity_5_at_2_per_second() -> Result<(DirectLimiter<ManualClock>, ManualClock), QuotaError> {
    let clock = ManualClock::new();
    let quota = Quota::per_second(2)?.burst(5)?;
    Ok((
        DirectLimiter::builder(quota).clock(clock.clone()).build(),
        clock,
    ))
}

/// Checks an allowed decision's figures.
#[track_caller]
fn assert_allowed(d: Decision, remaining: u64, reset_after: Duration) {
    assert!(d.is_allowed(), "{d:?}");
    assert_eq!(d.retry_after(), None, "{d:?}");
    assert_eq!(d.remaining(), remaining, "{d:?}");
    assert_eq!(d.reset_after(), reset_after, "{d:?}");
    assert_eq!(d.limit(), 5, "{d:?}");
}

/// Checks a denied decision's figures: nothing remains.
#[track_caller]
fn assert_denied(d: Decision, retry_after: Duration, reset_after: Duration) {
    assert!(d.is_denied(), "{d:?}");
    assert_eq!(d.retry_after(), Some(retry_after), "{d:?}");
    assert_eq!(d.remaining(), 0, "{d:?}");
    assert_eq!(d.reset_after(), reset_after, "{d:?}");
    assert_eq!(d.limit(), 5, "{d:?}");
}

/// Seven immediate requests: five pass, then the bucket is empty, the next
/// token is 500 ms away and the bucket is full again in 2.5 s.
fn burst_of_seven(limiter: &DirectLimiter<ManualClock>) {
    for k in 1..=5 {
        assert_allowed(limiter.check(), 5 - k, ms(500 * k));
    }
    for _ in 6..=7 {
        assert_denied(limiter.check(), ms(500), ms(2_500));
    }
}

#[test]
fn capacity_5_refill_2_per_second_seven_immediate_requests_give_5_allowed_2_denied(
) -> Result<(), QuotaError> {
    let (limiter, _clock) = capacity_5_at_2_per_second()?;
    burst_of_seven(&limiter);
    Ok(())
}

#[test]
fn after_1_1_seconds_two_more_pass_and_the_third_is_denied() -> Result<(), QuotaError> {
    let (limiter, clock) = capacity_5_at_2_per_second()?;
    burst_of_seven(&limiter);
    clock.advance(ms(1_100));
    // 2.2 tokens: TAT was 2.5 s, now 1.1 s, backlog 1.4 s.
    assert_allowed(limiter.check(), 1, ms(1_900)); // 1.2 tokens left
    assert_allowed(limiter.check(), 0, ms(2_400)); // 0.2 tokens left
                                                   // 0.8 token short at 2/s: 400 ms.
    assert_denied(limiter.check(), ms(400), ms(2_400));
    Ok(())
}

#[test]
fn after_1_5_seconds_instead_three_pass() -> Result<(), QuotaError> {
    let (limiter, clock) = capacity_5_at_2_per_second()?;
    burst_of_seven(&limiter);
    clock.advance(ms(1_500));
    assert_allowed(limiter.check(), 2, ms(1_500));
    assert_allowed(limiter.check(), 1, ms(2_000));
    assert_allowed(limiter.check(), 0, ms(2_500));
    assert_denied(limiter.check(), ms(500), ms(2_500));
    Ok(())
}

#[test]
fn retry_after_is_exact_the_denied_request_passes_then_and_not_a_nanosecond_before(
) -> Result<(), Box<dyn std::error::Error>> {
    let (limiter, clock) = capacity_5_at_2_per_second()?;
    burst_of_seven(&limiter);
    clock.advance(ms(1_100));
    assert_eq!(limiter.check_n(2)?.remaining(), 0);
    let retry = limiter.check().retry_after().unwrap_or_default();
    assert_eq!(retry, ms(400));
    clock.advance(retry - Duration::from_nanos(1));
    assert!(limiter.check().is_denied());
    clock.advance(Duration::from_nanos(1));
    assert_allowed(limiter.check(), 0, ms(2_500));
    Ok(())
}

#[test]
fn the_tutorials_f64_token_bucket_makes_the_same_decisions(
) -> Result<(), Box<dyn std::error::Error>> {
    let (limiter, clock) = capacity_5_at_2_per_second()?;
    let seed = SeedTokenBucket::<String, _>::with_clock(5.0, 2.0, clock.clone())?;
    for (advance, requests) in [(0, 7), (1_100, 3), (400, 2), (10_000, 6)] {
        clock.advance(ms(advance));
        for _ in 0..requests {
            assert_eq!(
                limiter.check().is_allowed(),
                seed.allow_request("user_42", 1.0),
                "at {:?}",
                clock.elapsed()
            );
        }
    }
    Ok(())
}

/// Limit 100/min: 150 requests at 59.9 s and 150 at 60.1 s. A fixed window
/// admits 200 (the counter restarts at 60 s); GCRA admits 100.
#[test]
fn limit_100_per_minute_150_at_59_9_s_and_150_at_60_1_s_admit_100() -> Result<(), QuotaError> {
    let clock = ManualClock::starting_at(ms(59_900));
    let limiter = DirectLimiter::builder(Quota::per_minute(100)?)
        .clock(clock.clone())
        .build();
    let first = (0..150).filter(|_| limiter.check().is_allowed()).count();
    clock.set(ms(60_100));
    let second: Vec<Decision> = (0..150).map(|_| limiter.check()).collect();
    let second_allowed = second.iter().filter(|d| d.is_allowed()).count();
    assert_eq!((first, second_allowed), (100, 0));
    // T = 600 ms; TAT = 59.9 s + 60 s = 119.9 s; 0.2 s later the backlog is
    // 59.8 s, so the next token is 400 ms away.
    let last = second[149];
    assert_eq!(last.retry_after(), Some(ms(400)));
    assert_eq!(last.reset_after(), ms(59_800));
    assert_eq!((last.remaining(), last.limit()), (0, 100));
    Ok(())
}
