//! `turnstile fleet`: N simulated gateways share one quota through Redis
//! (feature `redis`).
//!
//! Each gateway is its own `RedisLimiter` with its own connection, as
//! separate processes would be; they hammer the same users at once and the
//! table shows admitted and denied per user next to the limit
//! `B + elapsed / T`. Without `--redis`, the program starts its own
//! `redis-server` on a free loopback port (and removes it at the end), and
//! can then also stop it to show what each failure policy does while Redis
//! is away, and how the limiter recovers when it returns. A server given
//! with `--redis` is never stopped: that part is skipped.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use turnstile_rl::redis::{BreakerConfig, FailurePolicy, RedisLimiter};
use turnstile_rl::{KeyedLimiter, Quota};

use super::CliError;
use turnstile_test_kit::redis_server::RedisServer;

/// Flags of `turnstile fleet`.
#[derive(Debug, Args)]
pub(crate) struct FleetArgs {
    /// A Redis to use, for example redis://127.0.0.1:6379. Without it, a
    /// redis-server from PATH is started on a free loopback port, and the
    /// failure policies are shown by stopping it.
    #[arg(long, value_name = "URL")]
    redis: Option<String>,
    /// Simulated gateways, each with its own limiter and connection.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=200))]
    gateways: u32,
    /// Users the gateways share.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    users: u32,
    /// The per-user quota, for example "100/min" or "10/s burst 20".
    #[arg(long, default_value = "100/min", value_name = "QUOTA")]
    quota: String,
    /// How long the gateways hammer, in seconds.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=600))]
    seconds: u64,
    /// The Redis call timeout, in milliseconds.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    timeout_ms: u64,
}

/// Runs the demo and prints its tables.
pub(crate) fn run(args: &FleetArgs, out: &mut impl Write) -> Result<(), CliError> {
    let quota: Quota = args.quota.parse()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        match &args.redis {
            Some(url) => {
                share(args, quota, url, out).await?;
                writeln!(
                    out,
                    "\n{url} is not ours to stop: run without --redis to see the failure policies."
                )?;
            }
            None => {
                let mut server = RedisServer::start()?;
                writeln!(out, "started redis-server on {}", server.url())?;
                share(args, quota, &server.url(), out).await?;
                outage(args, quota, &mut server, out).await?;
            }
        }
        Ok(())
    })
}

/// The gateways hammer the users; prints the per-user table.
async fn share(
    args: &FleetArgs,
    quota: Quota,
    url: &str,
    out: &mut impl Write,
) -> Result<(), CliError> {
    let users = args.users as usize;
    let admitted: Arc<Vec<AtomicU64>> = Arc::new((0..users).map(|_| AtomicU64::new(0)).collect());
    let denied: Arc<Vec<AtomicU64>> = Arc::new((0..users).map(|_| AtomicU64::new(0)).collect());
    // A run of its own: buckets of an earlier run do not count.
    let prefix = format!("turnstile-fleet:{}:", std::process::id());
    let mut gateways = Vec::new();
    for _ in 0..args.gateways {
        gateways.push(Arc::new(
            RedisLimiter::builder(quota)
                .url(url)
                .prefix(&prefix)
                .timeout(Duration::from_millis(args.timeout_ms))
                .build()
                .await?,
        ));
    }
    // One question before the gateways start: a Redis that does not answer
    // is an outage to report (exit status 69), not a run of fallbacks.
    if let Some(first) = gateways.first() {
        match first.peek("probe").await {
            Err(turnstile_rl::redis::RedisLimitError::Unavailable(source)) => {
                return Err(CliError::RedisUnavailable {
                    url: url.to_owned(),
                    source,
                });
            }
            other => {
                let _ = other?;
            }
        }
    }
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.seconds);
    let mut tasks = Vec::new();
    for (g, limiter) in gateways.iter().enumerate() {
        let (limiter, admitted, denied) = (
            Arc::clone(limiter),
            Arc::clone(&admitted),
            Arc::clone(&denied),
        );
        tasks.push(tokio::spawn(async move {
            let mut user = g % users;
            while Instant::now() < deadline {
                let decision = limiter.check(format!("user_{user}")).await?;
                let counter = if decision.is_allowed() {
                    &admitted
                } else {
                    &denied
                };
                // Relaxed: plain tallies, read only after every task is joined.
                counter[user].fetch_add(1, Ordering::Relaxed);
                user = (user + 1) % users;
            }
            Ok::<(), turnstile_rl::redis::RedisLimitError>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let elapsed = started.elapsed();
    let interval = gateways
        .first()
        .map_or(quota.emission_interval(), |g| g.emission_interval());
    let limit = quota.burst_size() + (elapsed.as_nanos() / interval.as_nanos().max(1)) as u64;
    writeln!(
        out,
        "\n{} gateways shared {quota} per user for {:.2} s through {url}",
        args.gateways,
        elapsed.as_secs_f64()
    )?;
    writeln!(
        out,
        "{:<12} {:>9} {:>9} {:>22}",
        "user", "admitted", "denied", "limit B + elapsed/T"
    )?;
    for user in 0..users.min(20) {
        writeln!(
            out,
            "{:<12} {:>9} {:>9} {:>22}",
            format!("user_{user}"),
            admitted[user].load(Ordering::Relaxed),
            denied[user].load(Ordering::Relaxed),
            limit
        )?;
    }
    if users > 20 {
        writeln!(out, "({} more users not shown)", users - 20)?;
    }
    let over = admitted
        .iter()
        .filter(|a| a.load(Ordering::Relaxed) > limit)
        .count();
    let (mut calls, mut fallbacks, mut p50, mut p99) = (0, 0, Duration::ZERO, Duration::ZERO);
    for g in &gateways {
        let m = g.metrics();
        calls += m.redis_calls;
        fallbacks += m.fallback_decisions;
        p50 = p50.max(m.latency.p50);
        p99 = p99.max(m.latency.p99);
    }
    writeln!(
        out,
        "users over the limit: {over}; Redis calls: {calls}; fallback decisions: {fallbacks}; \
         round trip (worst gateway) P50 {p50:?}, P99 {p99:?}"
    )?;
    Ok(())
}

/// Stops the server under one limiter per failure policy, then restarts it.
async fn outage(
    args: &FleetArgs,
    quota: Quota,
    server: &mut RedisServer,
    out: &mut impl Write,
) -> Result<(), CliError> {
    let timeout = Duration::from_millis(args.timeout_ms);
    let cool_down = Duration::from_millis(500);
    let gateways = u64::from(args.gateways);
    // The local fallback: the fleet's quota split between the gateways.
    let local_quota = Quota::new(quota.count().div_ceil(gateways).max(1), quota.period())?;
    let policies = [
        FailurePolicy::FailOpen,
        FailurePolicy::FailClosed,
        FailurePolicy::Local(KeyedLimiter::new(local_quota)),
    ];
    writeln!(
        out,
        "\nRedis stopped (SIGKILL) under one gateway, 200 checks of one user per policy \
         (timeout {timeout:?}, breaker opens after 5 failures; local = {local_quota} per gateway):"
    )?;
    writeln!(
        out,
        "{:<12} {:>8} {:>7} {:>9} {:>7} {:>15} {:>9} {:>12} {:>12}",
        "policy",
        "allowed",
        "denied",
        "timeouts",
        "errors",
        "breaker opened",
        "fallback",
        "worst check",
        "recovered in"
    )?;
    for policy in policies {
        let name = policy.name();
        let limiter = RedisLimiter::builder(quota)
            .url(server.url())
            .prefix(format!("turnstile-outage:{name}:"))
            .timeout(timeout)
            .breaker(BreakerConfig {
                failure_threshold: 5,
                cool_down,
            })
            .failure_policy(policy)
            .build()
            .await?;
        let _ = limiter.check("user_0").await?;
        server.kill();
        let before = limiter.metrics();
        let mut worst = Duration::ZERO;
        for _ in 0..200 {
            let started = Instant::now();
            let _ = limiter.check("user_0").await?;
            worst = worst.max(started.elapsed());
        }
        let m = limiter.metrics();
        server.restart()?;
        let restarted = Instant::now();
        let give_up = restarted + Duration::from_secs(30);
        let recovered = loop {
            let decided_by_redis = limiter.metrics().redis_calls;
            let _ = limiter.check("user_0").await?;
            let after = limiter.metrics();
            if after.redis_calls > decided_by_redis
                && after.redis_errors == m.redis_errors
                && after.timeouts == m.timeouts
            {
                break format!("{:.2?}", restarted.elapsed());
            }
            if Instant::now() > give_up {
                break "not yet".to_owned();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        writeln!(
            out,
            "{name:<12} {:>8} {:>7} {:>9} {:>7} {:>15} {:>9} {:>12} {:>12}",
            m.allowed - before.allowed,
            m.denied - before.denied,
            m.timeouts,
            m.redis_errors,
            m.breaker_opened,
            m.fallback_decisions,
            format!("{worst:.2?}"),
            recovered
        )?;
    }
    writeln!(
        out,
        "(recovered in: from the restart to the first decision by Redis again, \
         including the breaker's {cool_down:?} cool-down)"
    )?;
    Ok(())
}
