//! `until_ready` and friends (feature `tokio`) on tokio's paused clock:
//! the limiter reads the same virtual time the sleeps advance, so every
//! wait is exact and the tests take no real time.
#![cfg(feature = "tokio")]

use std::time::Duration;

use tokio::time::Instant;
use turnstile_rl::{Clock, CostError, DirectLimiter, Jitter, KeyedLimiter, Quota};

/// tokio's (paused) time as a turnstile clock.
#[derive(Clone, Copy, Debug)]
struct TokioClock(Instant);

impl TokioClock {
    fn new() -> Self {
        TokioClock(Instant::now())
    }
}

impl Clock for TokioClock {
    fn now(&self) -> u64 {
        u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

fn quota(text: &str) -> Quota {
    text.parse().expect("quota")
}

#[tokio::test(start_paused = true)]
async fn direct_waiters_wake_exactly_when_a_token_is_due() {
    let clock = TokioClock::new();
    let limiter = DirectLimiter::builder(quota("10/s burst 2"))
        .clock(clock)
        .build();
    for expected_ms in [0, 0, 100, 200, 300] {
        let decision = limiter.until_ready().await;
        assert!(decision.is_allowed());
        assert_eq!(clock.0.elapsed(), Duration::from_millis(expected_ms));
    }
    // Two tokens together: the bucket must refill by two (200 ms).
    let decision = limiter.until_n_ready(2).await.expect("cost 2 fits");
    assert!(decision.is_allowed());
    assert_eq!(clock.0.elapsed(), Duration::from_millis(500));
}

#[tokio::test(start_paused = true)]
async fn impossible_costs_fail_at_once_instead_of_waiting_forever() {
    let clock = TokioClock::new();
    let limiter = DirectLimiter::builder(quota("10/s burst 2"))
        .clock(clock)
        .build();
    assert_eq!(
        limiter.until_n_ready(3).await,
        Err(CostError::ExceedsCapacity {
            cost: 3,
            capacity: 2
        })
    );
    assert_eq!(limiter.until_n_ready(0).await, Err(CostError::Zero));
    let keyed = KeyedLimiter::<u64, _>::builder(quota("10/s burst 2"))
        .clock(clock)
        .build();
    assert_eq!(
        keyed.until_n_ready(&1, 3).await,
        Err(CostError::ExceedsCapacity {
            cost: 3,
            capacity: 2
        })
    );
    assert_eq!(clock.0.elapsed(), Duration::ZERO);
    // The refused costs took nothing: the full burst is still there.
    assert_eq!(limiter.check().remaining(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_consumes_nothing() {
    let clock = TokioClock::new();
    let limiter = DirectLimiter::builder(quota("10/s burst 1"))
        .clock(clock)
        .build();
    assert!(limiter.check().is_allowed());
    // A waiter that gives up at 50 ms, while it sleeps for the token due
    // at 100 ms.
    let gave_up = tokio::time::timeout(Duration::from_millis(50), limiter.until_ready()).await;
    assert!(
        gave_up.is_err(),
        "the waiter should still have been waiting"
    );
    // A waiter dropped after its first (denied) poll.
    {
        let mut waiter = Box::pin(limiter.until_n_ready(1));
        assert!(futures_poll_once(waiter.as_mut()).await.is_none());
    }
    // At 100 ms the token is there for someone else: nothing was reserved.
    tokio::time::sleep_until(clock.0 + Duration::from_millis(100)).await;
    let decision = limiter.check();
    assert!(decision.is_allowed(), "{decision:?}");
    assert!(limiter.check().is_denied());
    // The other half: a waiter that takes a token completes in that same
    // poll, so there is no suspended state in which dropping it would
    // lose a token it holds.
    tokio::time::sleep_until(clock.0 + Duration::from_millis(200)).await;
    let mut waiter = Box::pin(limiter.until_ready());
    let polled = futures_poll_once(waiter.as_mut()).await;
    drop(waiter);
    let decision = polled.expect("a waiter with a token due must complete in one poll");
    assert!(decision.is_allowed());
    assert!(limiter.check().is_denied(), "the token went to the waiter");
}

/// Polls a future once; `None` if it is pending.
async fn futures_poll_once<F: std::future::Future + Unpin>(mut f: F) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match std::pin::Pin::new(&mut f).poll(cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        })
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn keyed_waiters_wait_for_their_own_key_only() {
    let clock = TokioClock::new();
    let limiter = KeyedLimiter::<String, _>::builder(quota("1/s"))
        .clock(clock)
        .build();
    assert!(limiter.until_ready("a").await.is_allowed());
    assert!(limiter.until_ready("b").await.is_allowed());
    assert_eq!(clock.0.elapsed(), Duration::ZERO);
    assert!(limiter.until_ready("a").await.is_allowed());
    assert_eq!(clock.0.elapsed(), Duration::from_secs(1));
    let decision = limiter
        .until_n_ready_with_jitter("b", 1, Jitter::NONE)
        .await
        .expect("cost 1");
    assert!(decision.is_allowed());
    // b's token was due at 1 s: no further wait.
    assert_eq!(clock.0.elapsed(), Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn jitter_adds_at_most_its_bound() {
    let clock = TokioClock::new();
    let limiter = DirectLimiter::builder(quota("10/s burst 1"))
        .clock(clock)
        .build();
    let mut waited = Vec::new();
    for _ in 0..20 {
        let start = clock.0.elapsed();
        let decision = limiter
            .until_n_ready_with_jitter(1, Jitter::up_to(Duration::from_millis(50)))
            .await
            .expect("cost 1");
        assert!(decision.is_allowed());
        waited.push(clock.0.elapsed() - start);
    }
    // The first is free; each later one waits for its token (100 ms after
    // the previous grant) plus at most 50 ms of jitter.
    assert_eq!(waited[0], Duration::ZERO);
    for w in &waited[1..] {
        assert!(
            *w >= Duration::from_millis(100) && *w <= Duration::from_millis(150),
            "{w:?}"
        );
    }
    // Not all the same: the jitter is random (20 equal draws out of 50 ms
    // of nanoseconds do not happen).
    assert!(waited[1..].iter().any(|w| *w != waited[1]));
}
