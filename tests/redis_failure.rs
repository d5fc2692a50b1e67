//! Redis failing under the limiter: killed mid-run, restarted on the same
//! port, paused with SIGSTOP. Each failure policy does what it says within
//! the timeout, the breaker opens (and then costs no timeouts), and the
//! limiter recovers by itself. Multi-limits and operations (peek, refund,
//! reset) go through the same breaker, policy and metrics.
#![cfg(feature = "redis")]

use turnstile_test_kit::redis_server;

use std::time::{Duration, Instant};

use redis_server::RedisServer;
use turnstile_rl::redis::{
    BreakerConfig, BreakerState, FailurePolicy, RedisCallError, RedisLimitError, RedisLimiter,
};
use turnstile_rl::{KeyedLimiter, Quota};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const TIMEOUT: Duration = Duration::from_millis(100);
const COOL_DOWN: Duration = Duration::from_millis(300);
/// A check that fails must return within the timeout plus this (a loaded
/// 2-core machine schedules late).
const SLACK: Duration = Duration::from_millis(400);

/// A cool-down that outlasts a test: once open, the breaker stays open (a
/// probe would wait a timeout and blur what is measured).
const NO_PROBE: Duration = Duration::from_secs(600);

async fn limiter(
    server: &RedisServer,
    policy: FailurePolicy,
) -> Result<RedisLimiter, Box<dyn std::error::Error>> {
    limiter_cooling(server, policy, COOL_DOWN).await
}

async fn limiter_cooling(
    server: &RedisServer,
    policy: FailurePolicy,
    cool_down: Duration,
) -> Result<RedisLimiter, Box<dyn std::error::Error>> {
    Ok(RedisLimiter::builder(Quota::per_minute(1)?.burst(3)?)
        .url(server.url())
        .timeout(TIMEOUT)
        .breaker(BreakerConfig {
            failure_threshold: 3,
            cool_down,
        })
        .failure_policy(policy)
        .build()
        .await?)
}

/// Checks `key` `count` times; returns the admitted count, and asserts each
/// check returned within the timeout (plus slack).
async fn timed_checks(
    limiter: &RedisLimiter,
    key: &str,
    count: u32,
) -> Result<u32, Box<dyn std::error::Error>> {
    let mut allowed = 0;
    for _ in 0..count {
        let started = Instant::now();
        allowed += u32::from(limiter.check(key).await?.is_allowed());
        let took = started.elapsed();
        assert!(took <= TIMEOUT + SLACK, "a check took {took:?}");
    }
    Ok(allowed)
}

/// Whether `error` is a call that was sent and failed (Redis killed: a
/// refused connection or a timeout), not one the open breaker held back.
fn a_failed_call(error: Option<&RedisCallError>) -> bool {
    matches!(
        error,
        Some(
            RedisCallError::Timeout
                | RedisCallError::ConnectionRefused(_)
                | RedisCallError::Redis(_)
        )
    )
}

/// Kills the server mid-run, checks what `policy` answers, restarts it on
/// the same port and waits for recovery. Returns the checks admitted while
/// Redis was down (out of 20).
async fn outage(policy: FailurePolicy) -> Result<u32, Box<dyn std::error::Error>> {
    let mut server = RedisServer::start()?;
    let limiter = limiter(&server, policy).await?;
    // Redis decides: burst 3, so 3 of 5 pass.
    assert_eq!(timed_checks(&limiter, "u", 5).await?, 3);
    assert_eq!(limiter.breaker_state(), BreakerState::Closed);

    server.kill();
    let down = timed_checks(&limiter, "v", 20).await?;
    let m = limiter.metrics();
    assert_eq!(limiter.breaker_state(), BreakerState::Open);
    assert_eq!(m.breaker_opened, 1);
    // 3 failed calls opened the breaker; the other 17 never called Redis.
    assert_eq!(m.redis_errors + m.timeouts, 3, "{m:?}");
    assert_eq!(m.fallback_decisions, 20);
    assert!(
        a_failed_call(limiter.last_error().as_ref()),
        "{:?}",
        limiter.last_error()
    );

    // An open breaker costs no timeout: 1,000 checks in far less than one.
    let started = Instant::now();
    for _ in 0..1_000 {
        let _ = limiter.check("w").await?;
    }
    assert!(
        started.elapsed() < TIMEOUT,
        "open breaker took {:?}",
        started.elapsed()
    );

    server.restart()?;
    // After the cool-down one probe goes through, succeeds, and closes it.
    tokio::time::sleep(COOL_DOWN).await;
    let recovered_by = Instant::now() + Duration::from_secs(10);
    while limiter.breaker_state() != BreakerState::Closed {
        assert!(
            Instant::now() < recovered_by,
            "no recovery: {:?}",
            limiter.last_error()
        );
        let _ = limiter.check("probe").await?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The restarted server is empty: a fresh bucket of 3 decided by Redis.
    let before = limiter.metrics().fallback_decisions;
    assert_eq!(timed_checks(&limiter, "u", 5).await?, 3);
    let m = limiter.metrics();
    assert_eq!(m.fallback_decisions, before);
    assert!(m.breaker_closed >= 1 && m.breaker_half_opened >= 1, "{m:?}");
    Ok(down)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_redis_with_fail_open_allows_everything_single_or_multi() -> TestResult {
    assert_eq!(outage(FailurePolicy::FailOpen).await?, 20);
    assert_eq!(multi_outage(FailurePolicy::FailOpen).await?, 20);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_redis_with_fail_closed_denies_everything_single_or_multi() -> TestResult {
    assert_eq!(outage(FailurePolicy::FailClosed).await?, 0);
    assert_eq!(multi_outage(FailurePolicy::FailClosed).await?, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_redis_with_a_local_fallback_enforces_the_local_quota_single_or_multi() -> TestResult
{
    // The local quota: 2 per minute per key on this gateway.
    let local = || Ok::<_, turnstile_rl::QuotaError>(KeyedLimiter::new(Quota::per_minute(2)?));
    assert_eq!(outage(FailurePolicy::Local(local()?)).await?, 2);
    assert_eq!(multi_outage(FailurePolicy::Local(local()?)).await?, 2);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_says_when_to_retry() -> TestResult {
    let mut server = RedisServer::start()?;
    let limiter = limiter(&server, FailurePolicy::FailClosed).await?;
    server.kill();
    let d = limiter.check("u").await?;
    assert!(d.is_denied());
    assert!(d.retry_after().unwrap_or_default() >= TIMEOUT);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_gives_timeouts_not_hangs() -> TestResult {
    let server = RedisServer::start()?;
    let limiter = limiter(&server, FailurePolicy::FailClosed).await?;
    assert_eq!(timed_checks(&limiter, "u", 1).await?, 1);
    server.signal("STOP")?;
    // Each check returns within the timeout; 3 of them open the breaker.
    let allowed = timed_checks(&limiter, "u", 10).await;
    server.signal("CONT")?;
    assert_eq!(allowed?, 0);
    let m = limiter.metrics();
    assert_eq!(m.timeouts, 3, "{m:?}");
    assert_eq!(m.breaker_opened, 1);
    // Continued: the limiter recovers by itself after the cool-down.
    tokio::time::sleep(COOL_DOWN).await;
    let recovered_by = Instant::now() + Duration::from_secs(10);
    while limiter.breaker_state() != BreakerState::Closed {
        let _ = limiter.check("probe").await?;
        assert!(
            Instant::now() < recovered_by,
            "no recovery: {:?}",
            limiter.last_error()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A timeout is not a rollback: the 3 calls that timed out were sent,
    // and the paused server ran them when continued. The 10 denials cost
    // tokens all the same; the bucket never admitted more than its burst.
    let mut allowed = 1;
    for _ in 0..5 {
        allowed += u32::from(limiter.check("u").await?.is_allowed());
    }
    assert!(allowed <= 3, "{allowed} admitted with burst 3");
    assert!(limiter.check("fresh").await?.is_allowed());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limiter_built_while_redis_is_down_uses_its_policy_then_redis() -> TestResult {
    let mut server = RedisServer::start()?;
    server.kill();
    let limiter = limiter(&server, FailurePolicy::FailClosed).await?;
    assert_eq!(timed_checks(&limiter, "u", 5).await?, 0);
    server.restart()?;
    tokio::time::sleep(COOL_DOWN).await;
    let recovered_by = Instant::now() + Duration::from_secs(10);
    while !limiter.check("u").await?.is_allowed() {
        assert!(
            Instant::now() < recovered_by,
            "no recovery: {:?}",
            limiter.last_error()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_fallback_denies_a_cost_only_the_fleet_quota_can_meet() -> TestResult {
    let mut server = RedisServer::start()?;
    // The fleet's burst is 3, the local one 2: a cost of 3 is valid, and
    // while Redis is away it is denied rather than an error.
    let local = KeyedLimiter::new(Quota::per_minute(2)?);
    let limiter = limiter(&server, FailurePolicy::Local(local)).await?;
    server.kill();
    let d = limiter.check_n("u", 3).await?;
    assert!(d.is_denied(), "{d:?}");
    assert!(limiter.check_n("u", 2).await?.is_allowed());
    assert_eq!(limiter.metrics().fallback_decisions, 2);
    Ok(())
}

/// A multi-limit (issue 24: it had no policy, breaker or metrics) with
/// Redis killed mid-run: every check is the failure policy's, marked as a
/// fallback, within the timeout; 3 failed calls open the shared breaker,
/// after which checks return without calling Redis. Returns the checks
/// admitted while Redis was down (out of 20).
async fn multi_outage(policy: FailurePolicy) -> Result<u32, Box<dyn std::error::Error>> {
    let mut server = RedisServer::start()?;
    let limiter = limiter_cooling(&server, policy, NO_PROBE).await?;
    // The first limit is the tightest: burst 3, so 3 of 5 pass.
    let multi = limiter.multi("1/min burst 3; 10/h".parse()?)?;
    let mut allowed = 0;
    for _ in 0..5 {
        let d = multi.check("u").await?;
        assert!(!d.decision().is_fallback(), "{d:?}");
        allowed += u32::from(d.is_allowed());
    }
    assert_eq!(allowed, 3);
    let before = limiter.metrics();
    assert_eq!((before.redis_calls, before.fallback_decisions), (5, 0));

    server.kill();
    let mut down = 0;
    for _ in 0..20 {
        let started = Instant::now();
        let d = multi.check("v").await?;
        let took = started.elapsed();
        assert!(took <= TIMEOUT + SLACK, "a multi check took {took:?}");
        assert!(d.decision().is_fallback(), "{d:?}");
        down += u32::from(d.is_allowed());
    }
    assert_eq!(limiter.breaker_state(), BreakerState::Open);
    let m = limiter.metrics();
    assert_eq!(m.breaker_opened, 1);
    // 3 failed calls opened the breaker; the other 17 never called Redis.
    assert_eq!(m.redis_calls, 5 + 3, "{m:?}");
    assert_eq!(m.redis_errors + m.timeouts, 3, "{m:?}");
    assert_eq!(m.breaker_rejections, 17, "{m:?}");
    assert_eq!(m.fallback_decisions, 20, "{m:?}");
    assert_eq!(m.allowed + m.denied, 5 + 20, "{m:?}");

    // With the breaker open, 100 multi checks take less than one timeout.
    let started = Instant::now();
    for _ in 0..100 {
        assert!(multi.check("w").await?.decision().is_fallback());
    }
    let took = started.elapsed();
    assert!(
        took < TIMEOUT,
        "100 checks with the breaker open took {took:?}"
    );
    assert_eq!(limiter.breaker_state(), BreakerState::Open);
    let m = limiter.metrics();
    assert_eq!((m.redis_calls, m.breaker_rejections), (8, 117), "{m:?}");
    Ok(down)
}

/// Peek, refund and reset take the breaker too (issue 24: each waited the
/// timeout with it open). Redis killed: the first three fail, each within
/// the timeout and with the typed reason, and open the breaker; then every
/// operation, single or multi, says `BreakerOpen` without calling Redis.
/// Operations are not checks: no failure policy, no decision counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_go_through_the_breaker() -> TestResult {
    let mut server = RedisServer::start()?;
    let limiter = limiter_cooling(&server, FailurePolicy::FailOpen, NO_PROBE).await?;
    let multi = limiter.multi("1/min burst 3; 10/h".parse()?)?;
    assert!(limiter.check("u").await?.is_allowed());
    assert!(multi.refund("u", 1).await.is_ok());

    server.kill();
    let unanswered = |result: Result<(), RedisLimitError>| match result {
        Err(RedisLimitError::Unavailable(error)) => error,
        other => panic!("expected Unavailable, got {other:?}"),
    };
    for op in 0..3 {
        let started = Instant::now();
        let result = match op {
            0 => limiter.peek("u").await.map(drop),
            1 => limiter.refund("u", 1).await.map(drop),
            _ => multi.reset("u").await.map(drop),
        };
        let took = started.elapsed();
        assert!(took <= TIMEOUT + SLACK, "operation {op} took {took:?}");
        let error = unanswered(result);
        assert!(a_failed_call(Some(&error)), "{error:?}");
    }
    assert_eq!(limiter.breaker_state(), BreakerState::Open);
    let opened = limiter.metrics();
    assert_eq!(opened.breaker_opened, 1, "{opened:?}");
    assert_eq!(opened.redis_errors + opened.timeouts, 3, "{opened:?}");

    // Six operations with the breaker open: less than one timeout in all
    // (the old path waited a whole timeout for each).
    let started = Instant::now();
    let results = [
        limiter.peek("u").await.map(drop),
        limiter.refund("u", 1).await.map(drop),
        limiter.reset("u").await.map(drop),
        multi.peek_n("u", 1).await.map(drop),
        multi.refund("u", 1).await.map(drop),
        multi.reset("u").await.map(drop),
    ];
    let took = started.elapsed();
    assert!(
        took < TIMEOUT,
        "6 operations with the breaker open took {took:?}"
    );
    for result in results {
        let error = unanswered(result);
        assert!(
            matches!(error, RedisCallError::BreakerOpen { retry_in } if retry_in > Duration::ZERO),
            "{error:?}"
        );
    }
    let m = limiter.metrics();
    assert_eq!(m.redis_calls, opened.redis_calls, "{m:?}");
    assert_eq!(m.breaker_rejections, 6, "{m:?}");
    // Operations are not decisions: only the one check before the kill.
    assert_eq!(
        (m.allowed, m.denied, m.fallback_decisions),
        (1, 0, 0),
        "{m:?}"
    );
    // The last error is the failure that opened the breaker, not a rejection.
    assert!(
        a_failed_call(limiter.last_error().as_ref()),
        "{:?}",
        limiter.last_error()
    );
    Ok(())
}

/// Issue 37, item 4: with nothing listening, a call fails at once as a
/// refused connection, not as a timeout (the timeout here is a minute: a
/// call that waited for it would end as `Timeout`, which fails the test,
/// rather than by the clock). Every failure reads the same, each counts
/// toward the breaker, and an operation's error says so too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_is_not_running_refuses_at_once() -> TestResult {
    let port = redis_server::free_port()?;
    let build = |threshold| {
        RedisLimiter::builder(Quota::per_minute(1).expect("quota"))
            .url(format!("redis://127.0.0.1:{port}"))
            .timeout(Duration::from_secs(60))
            .breaker(BreakerConfig {
                failure_threshold: threshold,
                cool_down: NO_PROBE,
            })
            .build()
    };
    let limiter = build(3).await?;
    for i in 0..3 {
        let decision = limiter.check("k").await?;
        assert!(decision.is_fallback(), "check {i}");
        assert!(
            matches!(
                limiter.last_error(),
                Some(RedisCallError::ConnectionRefused(_))
            ),
            "check {i}: {:?}",
            limiter.last_error()
        );
    }
    let m = limiter.metrics();
    assert_eq!((m.redis_errors, m.timeouts), (3, 0), "{m:?}");
    assert_eq!(limiter.breaker_state(), BreakerState::Open);
    let error = limiter.last_error().expect("an error").to_string();
    assert!(
        error.starts_with("Redis refused the connection (is it running at that address?)"),
        "{error}"
    );

    let operations = build(100).await?;
    assert!(
        matches!(
            operations.peek("k").await,
            Err(RedisLimitError::Unavailable(
                RedisCallError::ConnectionRefused(_)
            ))
        ),
        "{:?}",
        operations.peek("k").await
    );
    Ok(())
}

/// A pipeline of the caller's own (`RedisLimiter::query`) goes through the
/// limiter's connection, breaker and metrics: it counts as a call, its
/// failures open the breaker its checks use, and the open breaker refuses
/// it at once, and refuses the checks too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callers_pipeline_shares_the_breaker_with_checks() -> TestResult {
    let mut server = RedisServer::start()?;
    let limiter = limiter_cooling(&server, FailurePolicy::FailOpen, NO_PROBE).await?;
    let mut pipe = redis::pipe();
    pipe.incr("windows:a", 2).expire("windows:a", 60).ignore();
    let (count,): (u64,) = limiter.query(&pipe).await?;
    assert_eq!(count, 2);
    let (count,): (u64,) = limiter.query(&pipe).await?;
    assert_eq!(count, 4, "the same key, counted on");
    assert_eq!(limiter.metrics().redis_calls, 2);
    server.kill();
    for _ in 0..3 {
        let failed = limiter.query::<(u64,)>(&pipe).await;
        assert!(failed.is_err(), "Redis is gone: {failed:?}");
    }
    assert_eq!(limiter.breaker_state(), BreakerState::Open);
    let refused = limiter.query::<(u64,)>(&pipe).await;
    assert!(
        matches!(refused, Err(RedisCallError::BreakerOpen { .. })),
        "{refused:?}"
    );
    let decision = limiter.check("k").await?;
    assert!(
        decision.is_fallback(),
        "the checks meet the same open breaker"
    );
    assert!(limiter.metrics().breaker_rejections >= 2);
    Ok(())
}

/// Several pipelines sent together (`RedisLimiter::query_each`, one per
/// Cluster slot) are one send to the breaker, as a batch of checks is:
/// with a threshold of 3, one failed send of three pipelines does not
/// open it; three failed sends do. Each pipeline still counts as a call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelines_sent_together_are_one_send_to_the_breaker() -> TestResult {
    let mut server = RedisServer::start()?;
    let limiter = limiter_cooling(&server, FailurePolicy::FailOpen, NO_PROBE).await?;
    let pipes: Vec<redis::Pipeline> = ["a", "b", "c"]
        .iter()
        .map(|key| {
            let mut pipe = redis::pipe();
            pipe.incr(*key, 1);
            pipe
        })
        .collect();
    let replies: Vec<(u64,)> = limiter.query_each(&pipes).await?;
    assert_eq!(replies, vec![(1,), (1,), (1,)]);
    assert_eq!(limiter.metrics().redis_calls, 3);
    server.kill();
    let failed = limiter.query_each::<(u64,)>(&pipes).await;
    assert!(failed.is_err(), "Redis is gone: {failed:?}");
    assert_eq!(
        limiter.breaker_state(),
        BreakerState::Closed,
        "one failed send, not three"
    );
    for _ in 0..2 {
        let failed = limiter.query_each::<(u64,)>(&pipes).await;
        assert!(failed.is_err(), "Redis is gone: {failed:?}");
    }
    assert_eq!(limiter.breaker_state(), BreakerState::Open);
    Ok(())
}
