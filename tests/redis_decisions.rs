//! Exact decisions from a real `redis-server`: the seed scenarios (the
//! tutorials' worked examples, see `turnstile_test_kit::reference`) give the
//! same admitted counts and the same `Decision` figures as the local GCRA;
//! the script's contract (PEXPIRE, NOSCRIPT, keys, hash tags); bad input.
#![cfg(feature = "redis")]

use turnstile_test_kit::redis_server;

use std::sync::Arc;
use std::time::Duration;

use redis_server::{redis_cli, RedisServer};
use turnstile_rl::redis::{
    HashTag, RedisBuildError, RedisLimitError, RedisLimiter, RedisLimiterBuilder, TimeSource,
    MAX_KEY_BYTES,
};
use turnstile_rl::{CostError, DirectLimiter, ManualClock, Quota};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A builder for `server`, under its own prefix so tests never share
/// buckets, with a timeout no loaded machine reaches.
fn on(server: &RedisServer, quota: Quota, prefix: &str) -> RedisLimiterBuilder {
    RedisLimiter::builder(quota)
        .url(server.url())
        .prefix(prefix)
        .timeout(Duration::from_secs(2))
}

/// A limiter on `server` running on `clock` (client time).
async fn on_clock(
    server: &RedisServer,
    quota: Quota,
    clock: &ManualClock,
    prefix: &str,
) -> Result<RedisLimiter, RedisBuildError> {
    on(server, quota, prefix)
        .time_source(TimeSource::Client(Arc::new(clock.clone())))
        .build()
        .await
}

/// A limiter on `server` on the server's clock.
async fn on_server(
    server: &RedisServer,
    quota: Quota,
    prefix: &str,
) -> Result<RedisLimiter, RedisBuildError> {
    on(server, quota, prefix).build().await
}

/// Runs `(advance_ms, requests)` steps on Redis and on a local
/// `DirectLimiter` with the same clock: every decision must be equal,
/// figure for figure. Returns the admitted count.
async fn same_as_local(
    quota: Quota,
    steps: &[(u64, u32)],
    prefix: &str,
) -> Result<u32, Box<dyn std::error::Error>> {
    let server = RedisServer::start()?;
    // Start the clock away from 0, as a real clock would be.
    let clock = ManualClock::starting_at(Duration::from_secs(1_000));
    let remote = on_clock(&server, quota, &clock, prefix).await?;
    let local = DirectLimiter::builder(quota).clock(clock.clone()).build();
    let mut admitted = 0;
    for &(advance, requests) in steps {
        clock.advance(ms(advance));
        for _ in 0..requests {
            let (r, l) = (remote.check("user_42").await?, local.check());
            assert_eq!(r, l, "at {:?}", clock.elapsed());
            admitted += u32::from(r.is_allowed());
        }
    }
    let m = remote.metrics();
    assert_eq!(
        (m.redis_errors, m.timeouts, m.fallback_decisions),
        (0, 0, 0)
    );
    Ok(admitted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_5_at_2_per_second_seven_requests_give_5_then_after_1_1_s_two_more() -> TestResult
{
    let quota = Quota::per_second(2)?.burst(5)?;
    assert_eq!(same_as_local(quota, &[(0, 7)], "seed-a:").await?, 5);
    assert_eq!(
        same_as_local(quota, &[(0, 7), (1_100, 3)], "seed-b:").await?,
        7
    );
    assert_eq!(
        same_as_local(quota, &[(0, 7), (1_500, 4)], "seed-c:").await?,
        8
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_100_per_minute_150_at_59_9_s_and_150_at_60_1_s_admits_100() -> TestResult {
    let quota = Quota::per_minute(100)?;
    let admitted = same_as_local(quota, &[(59_900, 150), (200, 150)], "seed-d:").await?;
    assert_eq!(admitted, 100);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn costs_and_retry_after_match_the_local_gcra() -> TestResult {
    let server = RedisServer::start()?;
    let clock = ManualClock::starting_at(Duration::from_secs(50));
    let quota = Quota::per_second(2)?.burst(5)?;
    let remote = on_clock(&server, quota, &clock, "costs:").await?;
    let local = DirectLimiter::builder(quota).clock(clock.clone()).build();
    for (advance, cost) in [
        (0, 3),
        (0, 3),
        (0, 2),
        (400, 1),
        (100, 1),
        (2_000, 5),
        (10, 1),
    ] {
        clock.advance(ms(advance));
        assert_eq!(
            remote.check_n("k", cost).await?,
            local.check_n(cost)?,
            "cost {cost}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_time_burst_then_denial_and_pexpire_to_the_reset_time() -> TestResult {
    let server = RedisServer::start()?;
    // 1 per minute, burst 5: nothing refills during the test.
    let limiter = on_server(&server, Quota::per_minute(1)?.burst(5)?, "srv:").await?;
    let mut allowed = 0;
    for _ in 0..7 {
        allowed += u32::from(limiter.check("u").await?.is_allowed());
    }
    assert_eq!(allowed, 5);
    let denied = limiter.check("u").await?;
    let retry = denied.retry_after().unwrap_or_default();
    assert!(
        retry > Duration::from_secs(59) && retry <= Duration::from_secs(60),
        "{retry:?}"
    );
    // The key expires when the bucket is full again: 5 minutes.
    let pttl: i64 = redis_cli(server.port(), &["PTTL", "srv:u"])?
        .trim()
        .parse()?;
    assert!((299_000..=300_000).contains(&pttl), "PTTL {pttl}");
    let tat: u64 = redis_cli(server.port(), &["GET", "srv:u"])?
        .trim()
        .parse()?;
    assert!(
        tat > 1_600_000_000_000_000,
        "TAT {tat} is microseconds since the epoch"
    );
    let m = limiter.metrics();
    assert_eq!((m.allowed, m.denied, m.redis_calls), (5, 3, 8));
    assert!(m.latency.count == 8 && m.latency.p50 > Duration::ZERO);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_script_is_reloaded_after_script_flush() -> TestResult {
    let server = RedisServer::start()?;
    let limiter = on_server(&server, Quota::per_minute(10)?, "flush:").await?;
    assert_eq!(limiter.check("a").await?.remaining(), 9);
    assert_eq!(redis_cli(server.port(), &["SCRIPT", "FLUSH"])?.trim(), "OK");
    assert_eq!(limiter.check("a").await?.remaining(), 8);
    assert_eq!(limiter.metrics().redis_errors, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_binary_safe_and_prefixed_and_hash_tagged() -> TestResult {
    let server = RedisServer::start()?;
    let quota = Quota::per_minute(3)?;
    let build = |tag| {
        RedisLimiter::builder(quota)
            .url(server.url())
            .prefix("p:")
            .hash_tag(tag)
            .build()
    };
    let plain = build(HashTag::None).await?;
    let binary = [0u8, 255, b'\r', b'\n', b' ', 0];
    assert_eq!(plain.check(binary).await?.remaining(), 2);
    // A different byte string is a different bucket.
    assert_eq!(plain.check(&binary[..5]).await?.remaining(), 2);
    assert_eq!(plain.check(binary).await?.remaining(), 1);
    let huge = vec![b'x'; MAX_KEY_BYTES];
    assert_eq!(plain.check(&huge).await?.remaining(), 2);
    assert_eq!(plain.redis_key(b"u"), b"p:u");
    assert_eq!(build(HashTag::Key).await?.redis_key(b"u"), b"p:{u}");
    let fixed = build(HashTag::Fixed("team".into())).await?;
    assert_eq!(fixed.redis_key(b"u"), b"p:{team}u");
    assert_eq!(fixed.check("u").await?.remaining(), 2);
    assert_eq!(
        redis_cli(server.port(), &["EXISTS", "p:{team}u"])?.trim(),
        "1"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_typed_errors_and_sends_nothing() -> TestResult {
    let server = RedisServer::start()?;
    let limiter = on_server(&server, Quota::per_minute(10)?, "bad:").await?;
    assert_eq!(limiter.check("").await, Err(RedisLimitError::EmptyKey));
    let too_long = vec![b'x'; MAX_KEY_BYTES + 1];
    assert_eq!(
        limiter.check(&too_long).await,
        Err(RedisLimitError::KeyTooLong {
            len: MAX_KEY_BYTES + 1,
            max: MAX_KEY_BYTES
        })
    );
    assert_eq!(limiter.check_n("k", 0).await, Err(CostError::Zero.into()));
    assert_eq!(
        limiter.check_n("k", 11).await,
        Err(CostError::ExceedsCapacity {
            cost: 11,
            capacity: 10
        }
        .into())
    );
    assert_eq!(limiter.metrics().redis_calls, 0);

    // Quotas the script cannot hold, and settings that cannot work.
    let build = |quota: Quota| RedisLimiter::builder(quota).url(server.url()).build();
    let too_fine = build(Quota::per_second(2_000_000)?).await;
    assert!(
        matches!(too_fine, Err(RedisBuildError::Unrepresentable { .. })),
        "{too_fine:?}"
    );
    let too_long = build(Quota::per_hour(1)?.burst(2_000_000)?).await;
    assert!(
        matches!(too_long, Err(RedisBuildError::Unrepresentable { .. })),
        "{too_long:?}"
    );
    let quota = Quota::per_minute(10)?;
    let settings = [
        RedisLimiter::builder(quota).timeout(Duration::ZERO),
        RedisLimiter::builder(quota).lease(1),
        RedisLimiter::builder(quota).lease(11),
        RedisLimiter::builder(quota).hash_tag(HashTag::Fixed("a}b".into())),
        RedisLimiter::builder(quota).cluster(Vec::<String>::new()),
    ];
    for builder in settings {
        let result = builder.build().await;
        assert!(
            matches!(result, Err(RedisBuildError::Config(_))),
            "{result:?}"
        );
    }
    let bad_url = RedisLimiter::builder(quota).url("not a url").build().await;
    assert!(
        matches!(bad_url, Err(RedisBuildError::Connect(_))),
        "{bad_url:?}"
    );

    // A client clock past what the script holds exactly.
    let far = ManualClock::starting_at(Duration::from_secs(1 << 33));
    let limiter = on_clock(&server, quota, &far, "far:").await?;
    assert!(matches!(
        limiter.check("k").await,
        Err(RedisLimitError::ClockOutOfRange { .. })
    ));
    Ok(())
}

/// A small deterministic generator (xorshift64*), so a failure replays.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_costs_and_times_decide_exactly_as_the_local_gcra_on_the_rounded_interval(
) -> TestResult {
    let server = RedisServer::start()?;
    // Intervals that are and are not whole microseconds (3/s: 333,333.3 µs).
    let quotas = [
        "2/s burst 5",
        "3/s",
        "100/min",
        "7/1500ms burst 3",
        "1000/s burst 50",
    ];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for (i, text) in quotas.iter().enumerate() {
        let quota: Quota = text.parse()?;
        let clock = ManualClock::starting_at(Duration::from_secs(1_000));
        let remote = on_clock(&server, quota, &clock, &format!("random-{i}:")).await?;
        // The script runs T rounded up to whole µs: the local twin does too.
        let rounded = Quota::with_period(remote.emission_interval())?.burst(quota.burst_size())?;
        let local = DirectLimiter::builder(rounded).clock(clock.clone()).build();
        let t = remote.emission_interval().as_micros() as u64;
        let mut allowed = 0;
        for step in 0..500 {
            // Mostly small steps around T, sometimes none, sometimes long.
            clock.advance(Duration::from_micros(match rng.below(10) {
                0..=3 => 0,
                4..=8 => rng.below(2 * t),
                _ => rng.below(20 * t),
            }));
            let cost = 1 + rng.below(quota.burst_size());
            let (r, l) = (remote.check_n("k", cost).await?, local.check_n(cost)?);
            assert_eq!(
                r,
                l,
                "{text}, step {step}, cost {cost}, at {:?}",
                clock.elapsed()
            );
            allowed += u32::from(r.is_allowed());
        }
        // Both answers were exercised, many times.
        assert!(
            (50..450).contains(&allowed),
            "{text}: {allowed} of 500 allowed"
        );
    }
    Ok(())
}
