//! Peek, refund, reset and several limits per key on a real `redis-server`:
//! the same decisions as the local limiters, figure for figure, on a shared
//! manual clock (client time).
#![cfg(feature = "redis")]

use turnstile_test_kit::redis_server;

use std::sync::Arc;
use std::time::Duration;

use redis_server::{redis_cli, RedisServer};
use turnstile_rl::redis::{
    BreakerConfig, BreakerState, FailurePolicy, RedisBuildError, RedisLimitError, RedisLimiter,
    RedisMulti, TimeSource,
};
use turnstile_rl::{CostError, DirectLimiter, KeyedMultiLimiter, ManualClock, Quota, Quotas};

type TestResult = Result<(), Box<dyn std::error::Error>>;

async fn limiter(
    server: &RedisServer,
    quota: &str,
    clock: &ManualClock,
    prefix: &str,
) -> Result<RedisLimiter, Box<dyn std::error::Error>> {
    Ok(RedisLimiter::builder(quota.parse()?)
        .url(server.url())
        .prefix(prefix)
        .timeout(Duration::from_secs(2))
        .time_source(TimeSource::Client(Arc::new(clock.clone())))
        .build()
        .await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peek_refund_reset_decide_as_the_local_limiter() -> TestResult {
    let server = RedisServer::start()?;
    // Intervals in whole microseconds, so Redis and local round alike; the
    // clock starts well after 0, as a real one does.
    let clock = ManualClock::starting_at(Duration::from_secs(1_000));
    let quota: Quota = "2/s burst 5".parse()?;
    let redis = limiter(&server, "2/s burst 5", &clock, "ops:").await?;
    let local = DirectLimiter::builder(quota).clock(clock.clone()).build();
    let steps: &[(&str, u64, u64)] = &[
        ("peek", 0, 1),
        ("check", 0, 3),
        ("peek", 0, 2),
        ("peek", 0, 3),
        ("refund", 0, 2),
        ("peek", 0, 1),
        ("check", 0, 4),
        ("refund", 700, 5),
        ("check", 0, 5),
        ("peek", 250, 1),
        ("reset", 0, 1),
        ("peek", 0, 5),
        ("refund", 0, 1),
        ("check", 3_000, 1),
        ("refund", 0, 1),
        ("peek", 0, 5),
    ];
    for (i, &(op, advance_ms, n)) in steps.iter().enumerate() {
        clock.advance(Duration::from_millis(advance_ms));
        match op {
            "peek" => assert_eq!(redis.peek_n("k", n).await?, local.peek_n(n)?, "step {i}"),
            "check" => assert_eq!(redis.check_n("k", n).await?, local.check_n(n)?, "step {i}"),
            "refund" => assert_eq!(redis.refund("k", n).await?, local.refund(n)?, "step {i}"),
            _ => {
                assert!(redis.reset("k").await?, "step {i}");
                assert!(local.reset(), "step {i}");
            }
        }
    }
    // A refund back to full deletes the key: a full bucket costs Redis nothing.
    assert_eq!(redis_cli(server.port(), &["EXISTS", "ops:k"])?.trim(), "0");
    assert!(!redis.reset("k").await?, "nothing left to delete");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_limits_in_one_call_decide_as_the_local_limiter() -> TestResult {
    let server = RedisServer::start()?;
    let clock = ManualClock::starting_at(Duration::from_secs(1_000));
    let text = "4/s burst 6; 20/min; 50/h burst 30";
    let quotas: Quotas = text.parse()?;
    let base = limiter(&server, "1/s", &clock, "multi:").await?;
    let redis = base.multi(quotas.clone())?;
    let local = KeyedMultiLimiter::<String, _>::builder(quotas)
        .clock(clock.clone())
        .build();
    let mut admitted = 0;
    // Bursts every 700 ms for a minute and a half: every limit binds at
    // some point; every decision equal, figure and binding limit alike.
    for step in 0..130u64 {
        clock.advance(Duration::from_millis(700));
        let n = 1 + step % 3;
        for _ in 0..4 {
            let (r, l) = (redis.check_n("u", n).await?, local.check_n("u", n)?);
            assert_eq!(r, l, "step {step}");
            admitted += u64::from(r.is_allowed());
            let (r, l) = (redis.peek_n("u", 1).await?, local.peek_n("u", 1)?);
            assert_eq!(r, l, "peek at step {step}");
        }
        if step % 17 == 0 {
            assert_eq!(
                redis.refund("u", n).await?,
                local.refund("u", n)?,
                "step {step}"
            );
        }
    }
    assert!(admitted > 20, "{admitted}");
    assert!(redis.reset("u").await?);
    assert!(local.reset("u"));
    assert_eq!(redis.check("u").await?, local.check("u"));

    // All of a key's buckets share one hash slot, tagged on the key; each
    // is named by its limit's position alone (not its quota), so it
    // outlives a change of quota.
    assert_eq!(
        redis.redis_keys(b"u"),
        [&b"multi:{u}:0"[..], b"multi:{u}:1", b"multi:{u}:2"]
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_multi_check_charges_no_limit() -> TestResult {
    let server = RedisServer::start()?;
    let clock = ManualClock::starting_at(Duration::from_secs(1_000));
    let base = limiter(&server, "1/s", &clock, "deny:").await?;
    let redis = base.multi("10/s burst 10; 3/h".parse()?)?;
    for _ in 0..3 {
        assert!(redis.check("k").await?.is_allowed());
    }
    let before = redis.peek_n("k", 1).await?;
    let d = redis.check("k").await?;
    assert!(d.is_denied());
    assert_eq!(d.binding(), 1);
    assert_eq!(d.decision().limit(), 3);
    let keys = redis.redis_keys(b"k");
    let first = String::from_utf8(keys[0].clone())?;
    // The first limit holds the three admitted tokens only (TAT = now + 3T).
    let tat: u64 = redis_cli(server.port(), &["GET", &first])?.trim().parse()?;
    assert_eq!(tat, 1_000_000_000 + 3 * 100_000);
    assert_eq!(redis.peek_n("k", 1).await?, before);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_typed_error() -> TestResult {
    let server = RedisServer::start()?;
    let clock = ManualClock::starting_at(Duration::from_secs(1_000));
    let redis = limiter(&server, "10/s", &clock, "bad:").await?;
    assert_eq!(redis.peek_n("k", 0).await, Err(CostError::Zero.into()));
    assert_eq!(
        redis.refund("k", 11).await,
        Err(CostError::RefundAboveCapacity {
            refund: 11,
            capacity: 10
        }
        .into())
    );
    let one = RedisLimiter::builder("10/s".parse()?)
        .lease(1)
        .build()
        .await
        .expect_err("a lease of 1");
    assert_eq!(
        one.to_string(),
        "invalid Redis limiter setting: a lease of 1 token: it must be 2 to the burst (10)"
    );
    assert_eq!(redis.reset("").await, Err(RedisLimitError::EmptyKey));
    let multi = redis.multi("10/s; 5/min".parse()?)?;
    assert_eq!(
        multi.check_n("k", 6).await,
        Err(CostError::ExceedsCapacity {
            cost: 6,
            capacity: 5
        }
        .into())
    );
    assert_eq!(multi.refund("", 1).await, Err(RedisLimitError::EmptyKey));
    assert_eq!(
        multi.refund("k", 0).await,
        Err(CostError::ZeroRefund.into())
    );
    assert!(
        redis.multi("2000000/s".parse()?).is_err(),
        "finer than a microsecond"
    );
    Ok(())
}

/// Issue 37, item 2: a `RedisMulti` from its quotas alone, with the
/// settings of a limiter's builder (URL, prefix, timeout, breaker, failure
/// policy, time source), and no single quota it never uses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_limit_is_built_from_its_quotas_alone() -> TestResult {
    let mut server = RedisServer::start()?;
    let clock = ManualClock::starting_at(Duration::from_secs(1_000));
    let multi = RedisMulti::builder("3/s; 5/min".parse()?)
        .url(server.url())
        .prefix("alone:")
        .timeout(Duration::from_secs(2))
        .breaker(BreakerConfig {
            failure_threshold: 1,
            cool_down: Duration::from_secs(600),
        })
        .failure_policy(FailurePolicy::FailClosed)
        .time_source(TimeSource::Client(Arc::new(clock.clone())))
        .build()
        .await?;
    assert_eq!(multi.quotas(), "3/s; 5/min".parse::<Quotas>()?);
    assert!(matches!(multi.failure_policy(), FailurePolicy::FailClosed));
    // All or nothing, on the client clock: three pass, the first limit
    // binds; a second later two more pass and the second limit binds.
    let admitted = |decisions: &[bool]| decisions.iter().filter(|&&d| d).count();
    let mut first = Vec::new();
    for _ in 0..4 {
        first.push(multi.check("k").await?.is_allowed());
    }
    assert_eq!(admitted(&first), 3);
    clock.advance(Duration::from_secs(1));
    let mut second = Vec::new();
    for _ in 0..3 {
        second.push(multi.check("k").await?.is_allowed());
    }
    assert_eq!(admitted(&second), 2);
    let denied = multi.check("k").await?;
    assert_eq!(denied.binding(), 1);
    // Under the prefix given, one Redis key per limit.
    for limit in ["alone:{k}:0", "alone:{k}:1"] {
        assert_eq!(redis_cli(server.port(), &["EXISTS", limit])?.trim(), "1");
    }
    assert_eq!(multi.metrics().redis_calls, 8);
    // The failure policy and breaker given: Redis gone, a check is a
    // fallback denial, and one failure opens the breaker.
    server.kill();
    let fallback = multi.check("other").await?;
    assert!(fallback.decision().is_fallback() && fallback.is_denied());
    assert!(matches!(multi.breaker_state(), BreakerState::Open));
    assert!(multi.last_error().is_some());

    // The builder's checks: a zero timeout, a quota the script cannot hold.
    let zero = RedisMulti::builder("3/s; 5/min".parse()?)
        .timeout(Duration::ZERO)
        .build()
        .await;
    assert!(matches!(zero, Err(RedisBuildError::Config(_))), "{zero:?}");
    let fine = RedisMulti::builder("3/s; 2000000/s".parse()?).build().await;
    assert!(
        matches!(fine, Err(RedisBuildError::Unrepresentable { .. })),
        "{fine:?}"
    );
    Ok(())
}
