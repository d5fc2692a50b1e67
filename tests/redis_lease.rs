//! Leases against a real Redis: the error bound (at most gateways × (k − 1)
//! extra admissions in a window, and it is reached), the calls saved, and
//! the round-trip cost per check. Run with `--nocapture` to see the
//! figures; timings are printed, never asserted.
#![cfg(feature = "redis")]

use turnstile_test_kit::redis_server;

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis_server::RedisServer;
use turnstile_rl::redis::{RedisLimiter, TimeSource};
use turnstile_rl::{ManualClock, Quota};

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_exceed_the_quota_by_at_most_gateways_times_k_minus_1_per_window() -> TestResult {
    const GATEWAYS: u64 = 4;
    const K: u64 = 10;
    const BURST: u64 = 100;
    let server = RedisServer::start()?;
    let quota = Quota::per_minute(BURST)?;
    let clock = ManualClock::starting_at(Duration::from_secs(1_000));
    let mut gateways = Vec::new();
    for _ in 0..GATEWAYS {
        gateways.push(
            RedisLimiter::builder(quota)
                .url(server.url())
                .prefix("lease:")
                .lease(K)
                // Leases outlive the test's virtual minute.
                .lease_ttl(Duration::from_secs(60))
                .time_source(TimeSource::Client(Arc::new(clock.clone())))
                .build()
                .await?,
        );
    }
    // Before the window: each gateway admits one request and keeps k - 1.
    // Its decision counts what Redis has left plus what it keeps.
    for (i, g) in (1..).zip(&gateways) {
        assert_eq!(g.check("u").await?.remaining(), BURST - i * K + (K - 1));
    }
    // The window starts once the Redis bucket is full again.
    clock.advance(Duration::from_secs(60));
    let mut admitted = 0;
    for _ in 0..BURST {
        for g in &gateways {
            admitted += u64::from(g.check("u").await?.is_allowed());
        }
    }
    // The worst case is reached, and not exceeded.
    assert_eq!(admitted, BURST + GATEWAYS * (K - 1));
    // Without leases the same window admits exactly the burst.
    let plain = RedisLimiter::builder(quota)
        .url(server.url())
        .prefix("plain:")
        .time_source(TimeSource::Client(Arc::new(clock.clone())))
        .build()
        .await?;
    let mut plain_admitted = 0;
    for _ in 0..BURST * GATEWAYS {
        plain_admitted += u64::from(plain.check("u").await?.is_allowed());
    }
    assert_eq!(plain_admitted, BURST);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_of_10_cut_redis_calls_tenfold_and_the_round_trip_cost() -> TestResult {
    const ADMISSIONS: u64 = 10_000;
    const ROUND_TRIPS: u64 = 20_000;
    let server = RedisServer::start()?;
    // Never binds during the run: every check is admitted.
    let quota = Quota::per_second(100_000)?.burst(10_000)?;
    // A generous timeout: on 2 loaded cores a descheduled process must not
    // turn into fallbacks that spoil the counts.
    let builder = |prefix: &str| {
        RedisLimiter::builder(quota)
            .url(server.url())
            .prefix(prefix)
            .timeout(Duration::from_secs(2))
    };

    // Leases that cannot expire mid-run, so the count of calls is exact.
    let leased = builder("k10:")
        .lease(10)
        .lease_ttl(Duration::from_secs(60))
        .build()
        .await?;
    for _ in 0..ADMISSIONS {
        assert!(leased.check("u").await?.is_allowed());
    }
    let m = leased.metrics();
    assert_eq!(m.redis_calls + m.lease_hits, ADMISSIONS);
    assert_eq!(
        m.redis_calls,
        ADMISSIONS / 10,
        "{m:?} {:?}",
        leased.last_error()
    );

    let plain = builder("k1:").build().await?;
    let started = Instant::now();
    for _ in 0..ROUND_TRIPS {
        let _ = plain.check("u").await?;
    }
    let wall = started.elapsed();
    let p = plain.metrics();
    assert_eq!(p.redis_calls, ROUND_TRIPS, "{p:?} {:?}", plain.last_error());
    println!(
        "round trip per check on loopback ({ROUND_TRIPS} sequential checks): \
         P50 {:?}, P95 {:?}, P99 {:?}, max {:?}; {:.0} checks/s",
        p.latency.p50,
        p.latency.p95,
        p.latency.p99,
        p.latency.max,
        ROUND_TRIPS as f64 / wall.as_secs_f64()
    );
    println!(
        "leases: {ADMISSIONS} admissions took {} Redis calls with k = 10 ({} lease hits), \
         against {ADMISSIONS} without",
        m.redis_calls, m.lease_hits
    );
    Ok(())
}
