//! `RedisLimiter::check_each` on a real `redis-server`: requests on several
//! limiters (each its own quota, prefix and key) decided in one script call
//! (counted by Redis itself, in `INFO commandstats`), exactly as each
//! limiter's own checks and peeks; leases spent and taken per limiter; the
//! failure policy for every request when Redis is gone; bad requests
//! refused before anything is sent.
#![cfg(feature = "redis")]

use turnstile_test_kit::keys;
use turnstile_test_kit::redis_server;

use std::sync::Arc;
use std::time::Duration;

use keys::SplitMix;
use redis_server::{redis_cli, RedisServer};
use turnstile_rl::redis::{EachRequest, FailurePolicy, RedisLimitError, RedisLimiter, TimeSource};
use turnstile_rl::{BatchError, CostError, Decision, ManualClock, Quota};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Calls of `command` since the last `CONFIG RESETSTAT`, from `INFO commandstats`.
fn calls(port: u16, command: &str) -> Result<u64, Box<dyn std::error::Error>> {
    let info = redis_cli(port, &["INFO", "commandstats"])?;
    let prefix = format!("cmdstat_{command}:calls=");
    Ok(info
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map(str::parse)
        .transpose()?
        .unwrap_or(0))
}

/// A limiter on `server` to build the others from (its own quota unused).
async fn base(
    server: &RedisServer,
    time: TimeSource,
) -> Result<RedisLimiter, Box<dyn std::error::Error>> {
    Ok(RedisLimiter::builder(Quota::per_second(1)?)
        .url(server.url())
        .prefix("base:")
        .timeout(Duration::from_secs(2))
        .time_source(time)
        .build()
        .await?)
}

fn check<'a>(limiter: &'a RedisLimiter, key: &'a str, cost: u64) -> EachRequest<'a> {
    EachRequest {
        limiter,
        key: key.as_bytes(),
        cost,
        peek: false,
    }
}

/// Random requests over three limits of different quotas (repeated keys,
/// costs, peeks, idle keys as the clock moves on) decide exactly as each
/// limiter's own `check_n` and `peek_n` on a twin limiter under another
/// prefix, figure for figure, one script call per `check_each`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_on_several_limits_decide_as_each_limiter_alone() -> TestResult {
    let server = RedisServer::start()?;
    let clock = ManualClock::starting_at(Duration::from_secs(1_000));
    let time = || TimeSource::Client(Arc::new(clock.clone()));
    let base = base(&server, time()).await?;
    let twins = base_twin(&server, time()).await?;
    let quotas: [Quota; 3] = [
        "2/s burst 5".parse()?,
        "10/min".parse()?,
        "1/s burst 3".parse()?,
    ];
    let mut together = Vec::new();
    let mut alone = Vec::new();
    for (i, q) in quotas.iter().enumerate() {
        together.push(base.with_quota(*q, format!("each{i}:"), None)?);
        alone.push(twins.with_quota(*q, format!("alone{i}:"), None)?);
    }
    let mut rng = SplitMix(36);
    let mut out = Vec::new();
    let (mut admitted, mut refused, mut peeks, mut sent) = (0, 0, 0, 0u64);
    for round in 0..50 {
        clock.advance(Duration::from_millis(match rng.next() % 10 {
            0 => 4_000,
            1..=3 => 0,
            _ => rng.next() % 700,
        }));
        let len = 1 + rng.next() % 8;
        let asked: Vec<(usize, String, u64, bool)> = (0..len)
            .map(|_| {
                let limit = (rng.next() % 3) as usize;
                let burst = quotas[limit].burst_size();
                let key = format!("k{}", rng.next() % 3);
                (
                    limit,
                    key,
                    1 + rng.next() % burst,
                    rng.next().is_multiple_of(5),
                )
            })
            .collect();
        let requests: Vec<EachRequest<'_>> = asked
            .iter()
            .map(|(limit, key, cost, peek)| EachRequest {
                peek: *peek,
                ..check(&together[*limit], key, *cost)
            })
            .collect();
        base.check_each(&requests, &mut out).await?;
        sent += 1;
        assert_eq!(out.len(), requests.len());
        for ((limit, key, cost, peek), got) in asked.iter().zip(&out) {
            let one = if *peek {
                peeks += 1;
                alone[*limit].peek_n(key, *cost).await?
            } else {
                alone[*limit].check_n(key, *cost).await?
            };
            assert_eq!(
                *got, one,
                "round {round}: limit {limit} {key} cost {cost} peek {peek}"
            );
            admitted += u32::from(got.is_allowed() && !peek);
            refused += u32::from(got.is_denied() && !peek);
        }
    }
    assert!(
        admitted > 50 && refused > 50 && peeks > 10,
        "{admitted} / {refused} / {peeks}"
    );
    let m = base.metrics();
    assert_eq!(m.redis_calls, sent, "one call per check_each");
    assert_eq!((m.redis_errors, m.fallback_decisions), (0, 0));
    Ok(())
}

/// A second base limiter, so the twins have their own call path and count.
async fn base_twin(
    server: &RedisServer,
    time: TimeSource,
) -> Result<RedisLimiter, Box<dyn std::error::Error>> {
    base(server, time).await
}

/// Three requests on three limits are one `EVALSHA`, whatever their
/// quotas; and the limiters share one breaker and one set of metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_limits_are_one_round_trip() -> TestResult {
    let server = RedisServer::start()?;
    let port = server.port();
    let base = base(&server, TimeSource::Server).await?;
    let a = base.with_quota("5/s".parse()?, "a:", None)?;
    let b = base.with_quota("100/min".parse()?, "b:", None)?;
    let c = base.with_quota("3/h".parse()?, "c:", None)?;
    let mut out = Vec::new();
    // Load the script (a first call may meet NOSCRIPT).
    base.check_each(&[check(&a, "warm-up", 1)], &mut out)
        .await?;
    assert_eq!(redis_cli(port, &["CONFIG", "RESETSTAT"])?.trim(), "OK");
    let requests = [check(&a, "u", 1), check(&b, "u", 2), check(&c, "u", 3)];
    base.check_each(&requests, &mut out).await?;
    assert_eq!(
        calls(port, "evalsha")?,
        1,
        "one script call for three limits"
    );
    assert_eq!(calls(port, "eval")?, 0);
    let left: Vec<u64> = out.iter().map(Decision::remaining).collect();
    assert_eq!(left, [4, 98, 0]);
    base.check_each(&requests, &mut out).await?;
    let allowed: Vec<bool> = out.iter().map(Decision::is_allowed).collect();
    assert_eq!(allowed, [true, true, false], "each limit decides alone");
    assert_eq!(calls(port, "evalsha")?, 2);
    assert_eq!(
        a.metrics().redis_calls,
        base.metrics().redis_calls,
        "one path"
    );
    Ok(())
}

/// Leases per limiter: the first check of a hot key takes a lease of 100
/// in its one call, the next 99 spend it with no call, and a limiter
/// without leases beside it still asks Redis each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_are_spent_per_limiter_without_a_call() -> TestResult {
    let server = RedisServer::start()?;
    let base = base(&server, TimeSource::Server).await?;
    let hot = base.with_quota("100000/s".parse()?, "hot:", Some(100))?;
    let plain = base.with_quota("100000/s".parse()?, "plain:", None)?;
    let mut out = Vec::new();
    for _ in 0..100 {
        base.check_each(&[check(&hot, "k", 1)], &mut out).await?;
        assert!(out[0].is_allowed());
    }
    let m = base.metrics();
    assert_eq!((m.redis_calls, m.lease_hits), (1, 99));
    for _ in 0..3 {
        base.check_each(&[check(&hot, "k", 1), check(&plain, "k", 1)], &mut out)
            .await?;
    }
    // One new lease for the hot key, and the plain key's three calls.
    assert_eq!(base.metrics().redis_calls, 4);
    assert!(matches!(
        base.with_quota("10/s".parse()?, "small:", Some(11)),
        Err(turnstile_rl::redis::RedisBuildError::Config(_))
    ));
    Ok(())
}

/// Checks of one key that find its lease empty together make one Redis
/// call: the first fetches the next lease, the others wait for it and
/// spend it. Redis is stopped (SIGSTOP) while ten checks pile up, so the
/// fetch is on its way for all of them: one call is sent, not ten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_that_find_a_lease_empty_together_wait_for_one_fetch() -> TestResult {
    let server = RedisServer::start()?;
    let port = server.port();
    let base = Arc::new(
        RedisLimiter::builder(Quota::per_second(1)?)
            .url(server.url())
            .timeout(Duration::from_secs(10))
            .build()
            .await?,
    );
    let hot = Arc::new(base.with_quota("100000/s".parse()?, "hot:", Some(50))?);
    // Load the script (a first call may meet NOSCRIPT).
    base.check_each(&[check(&hot, "warm-up", 1)], &mut Vec::new())
        .await?;
    assert_eq!(redis_cli(port, &["CONFIG", "RESETSTAT"])?.trim(), "OK");
    server.signal("STOP")?;
    let start = Arc::new(tokio::sync::Barrier::new(11));
    let checks: Vec<_> = (0..10)
        .map(|_| {
            let (base, hot, start) = (base.clone(), hot.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                let mut out = Vec::new();
                base.check_each(&[check(&hot, "k", 1)], &mut out)
                    .await
                    .map(|()| out[0].is_allowed())
            })
        })
        .collect();
    start.wait().await;
    // Time for the ten to reach Redis or the wait (microseconds of work);
    // the assertion below holds however many have by then.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sent = base.metrics().redis_calls;
    server.signal("CONT")?;
    assert_eq!(
        sent, 2,
        "the warm-up and one fetch, while ten checks were in flight"
    );
    for check in checks {
        assert!(check.await??, "admitted from the one lease");
    }
    assert_eq!(calls(port, "evalsha")?, 1, "Redis saw one call");
    assert_eq!(base.metrics().lease_hits, 9);
    Ok(())
}

/// Redis gone: every request gets the failure policy's decision, and a
/// peek the local limiter's look, which takes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_redis_cannot_answer_get_the_failure_policy() -> TestResult {
    let mut server = RedisServer::start()?;
    let local = turnstile_rl::KeyedLimiter::builder(Quota::per_hour(2)?).build();
    let base = RedisLimiter::builder(Quota::per_second(1)?)
        .url(server.url())
        .timeout(Duration::from_millis(200))
        .failure_policy(FailurePolicy::Local(local))
        .build()
        .await?;
    let a = base.with_quota("5/h".parse()?, "a:", None)?;
    server.kill();
    let look = EachRequest {
        peek: true,
        ..check(&a, "u", 1)
    };
    let mut out = Vec::new();
    base.check_each(&[look, look, check(&a, "u", 1), look], &mut out)
        .await?;
    assert!(out.iter().all(Decision::is_fallback));
    let left: Vec<u64> = out.iter().map(Decision::remaining).collect();
    assert_eq!(
        left,
        [1, 1, 1, 0],
        "looks take nothing from the local limiter"
    );
    Ok(())
}

/// A limiter on another connection, a cost above its burst, or an empty
/// key: refused, naming the request, with nothing sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_before_anything_is_sent() -> TestResult {
    let server = RedisServer::start()?;
    let base = base(&server, TimeSource::Server).await?;
    let other = base_twin(&server, TimeSource::Server).await?;
    let a = base.with_quota("5/s".parse()?, "a:", None)?;
    let stranger = other.with_quota("5/s".parse()?, "s:", None)?;
    let mut out = Vec::new();
    let err = base
        .check_each(&[check(&a, "u", 1), check(&stranger, "u", 1)], &mut out)
        .await
        .unwrap_err();
    assert_eq!(err, RedisLimitError::OtherConnection { index: 1 });
    assert!(
        err.to_string().contains("another Redis connection"),
        "{err}"
    );
    assert_eq!(
        base.check_each(&[check(&a, "u", 6)], &mut out).await,
        Err(RedisLimitError::Batch(BatchError::Cost {
            index: 0,
            source: CostError::ExceedsCapacity {
                cost: 6,
                capacity: 5
            }
        }))
    );
    assert!(matches!(
        base.check_each(&[check(&a, "u", 1), check(&a, "", 1)], &mut out)
            .await,
        Err(RedisLimitError::BatchKey { index: 1, .. })
    ));
    assert_eq!(base.metrics().redis_calls, 0);
    Ok(())
}
