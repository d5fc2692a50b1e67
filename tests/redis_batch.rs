//! `RedisLimiter::check_batch` on a real `redis-server` (and a real 3-master
//! Cluster): the decisions of checking the keys one by one, one round trip
//! per batch (counted by Redis itself, in `INFO commandstats`), the failure
//! policy for every key when Redis is gone, and bad batches refused before
//! anything is sent.
#![cfg(feature = "redis")]

use turnstile_test_kit::keys;
use turnstile_test_kit::redis_server;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use keys::SplitMix;
use redis_server::{db_size, redis_cli, RedisCluster, RedisServer};
use turnstile_rl::redis::{
    BreakerConfig, FailurePolicy, HashTag, RedisLimitError, RedisLimiter, RedisLimiterBuilder,
    TimeSource, MAX_KEY_BYTES,
};
use turnstile_rl::{BatchError, CostError, Decision, KeyedLimiter, ManualClock, Quota};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A builder for `server` under `prefix`, with a timeout no loaded machine
/// reaches.
fn on(server: &RedisServer, quota: Quota, prefix: &str) -> RedisLimiterBuilder {
    RedisLimiter::builder(quota)
        .url(server.url())
        .prefix(prefix)
        .timeout(Duration::from_secs(2))
}

/// What `INFO commandstats` says of `command` on the server at `port`:
/// calls made since the last `CONFIG RESETSTAT` (0 if never called).
fn calls(port: u16, command: &str) -> Result<u64, Box<dyn std::error::Error>> {
    let info = redis_cli(port, &["INFO", "commandstats"])?;
    let prefix = format!("cmdstat_{command}:calls=");
    for line in info.lines() {
        if let Some(rest) = line.strip_prefix(&prefix) {
            let count = rest.split(',').next().unwrap_or_default();
            return Ok(count.parse()?);
        }
    }
    Ok(0)
}

fn reset_stats(port: u16) -> TestResult {
    assert_eq!(redis_cli(port, &["CONFIG", "RESETSTAT"])?.trim(), "OK");
    Ok(())
}

/// A random batch: `len` keys drawn from `names` (so repeats are common),
/// and costs of 1 to `burst`.
fn random_batch(rng: &mut SplitMix, names: u64, len: u64, burst: u64) -> (Vec<String>, Vec<u64>) {
    (0..len)
        .map(|_| {
            let key = format!("user_{}", rng.next() % names);
            (key, 1 + rng.next() % burst)
        })
        .unzip()
}

fn allowed(decisions: &[Decision]) -> Vec<bool> {
    decisions.iter().map(Decision::is_allowed).collect()
}

/// Random batches (repeated keys, costs, idle keys as the clock moves on)
/// decide exactly as the same requests one by one, both on Redis (single
/// checks under another prefix) and on a local `KeyedLimiter`, figure for
/// figure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_batches_decide_as_checks_one_by_one() -> TestResult {
    let server = RedisServer::start()?;
    let quota: Quota = "2/s burst 5".parse()?;
    let clock = ManualClock::starting_at(Duration::from_secs(1_000));
    let client = || TimeSource::Client(Arc::new(clock.clone()));
    let batched = on(&server, quota, "batch:")
        .time_source(client())
        .build()
        .await?;
    let single = on(&server, quota, "single:")
        .time_source(client())
        .build()
        .await?;
    let local = KeyedLimiter::<String, _>::builder(quota)
        .clock(clock.clone())
        .build();
    let mut rng = SplitMix(16);
    let mut out = Vec::new();
    let (mut admitted, mut refused, mut entries) = (0, 0, 0);
    for round in 0..60 {
        // Mostly small steps; now and then long enough for every key to
        // refill (idle buckets are as good as missing ones).
        let advance = match rng.next() % 10 {
            0 => 3_000,
            1..=3 => 0,
            _ => rng.next() % 700,
        };
        clock.advance(Duration::from_millis(advance));
        let len = 1 + rng.next() % 40;
        let (keys, mut costs) = random_batch(&mut rng, 6, len, quota.burst_size());
        if round % 3 == 0 {
            batched.check_batch(&keys, &mut out).await?;
            costs.fill(1);
        } else {
            batched.check_batch_n(&keys, &costs, &mut out).await?;
        }
        assert_eq!(out.len(), keys.len());
        for ((key, &n), &got) in keys.iter().zip(&costs).zip(&out) {
            let one = single.check_n(key, n).await?;
            let here = local.check_n(key.as_str(), n)?;
            assert_eq!(got, one, "round {round}: {key} cost {n}");
            assert_eq!(got, here, "round {round}: {key} cost {n}");
            admitted += u32::from(got.is_allowed());
            refused += u32::from(got.is_denied());
        }
        entries += keys.len();
    }
    // The case named above was reached: long batches with both outcomes.
    assert!(admitted > 100 && refused > 100, "{admitted} / {refused}");
    let m = batched.metrics();
    assert_eq!(m.redis_calls, 60, "one call per batch");
    assert_eq!((m.allowed + m.denied) as usize, entries);
    assert_eq!(
        (m.redis_errors, m.timeouts, m.fallback_decisions),
        (0, 0, 0)
    );
    Ok(())
}

/// On the server's clock: a key named several times is charged each time,
/// in slice order, and costs are all or nothing per request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_keys_are_charged_in_order_on_server_time() -> TestResult {
    let server = RedisServer::start()?;
    let limiter = on(&server, Quota::per_hour(1)?.burst(3)?, "srv:")
        .build()
        .await?;
    let mut out = Vec::new();
    limiter
        .check_batch(&["a", "a", "a", "b", "a"], &mut out)
        .await?;
    assert_eq!(allowed(&out), [true, true, true, true, false]);
    let left: Vec<u64> = out.iter().map(Decision::remaining).collect();
    assert_eq!(left, [2, 1, 0, 2, 0]);
    assert!(out[4]
        .retry_after()
        .is_some_and(|r| r > Duration::from_secs(3_000)));
    // Cost 2 twice: the second request does not fit in the one token left,
    // and takes nothing (the cost-1 request after it still fits).
    limiter
        .check_batch_n(&["c", "c", "c"], &[2, 2, 1], &mut out)
        .await?;
    assert_eq!(allowed(&out), [true, false, true]);
    assert_eq!(out[2].remaining(), 0);
    Ok(())
}

/// One batch is one round trip: Redis itself counts a single `EVALSHA` for
/// a batch of 256 requests over 100 keys, and every one of those keys was
/// written by it. After `SCRIPT FLUSH` the batch reloads the script, as a
/// single check does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_batch_is_one_round_trip() -> TestResult {
    let server = RedisServer::start()?;
    let port = server.port();
    let limiter = on(&server, Quota::per_hour(1)?.burst(2)?, "rt:")
        .build()
        .await?;
    // Load the script (a first call may meet NOSCRIPT).
    assert!(limiter.check("warm-up").await?.is_allowed());
    reset_stats(port)?;
    let keys: Vec<String> = (0..256).map(|i| format!("k{}", i % 100)).collect();
    let mut out = Vec::new();
    limiter.check_batch(&keys, &mut out).await?;
    assert_eq!(calls(port, "evalsha")?, 1, "one script call for the batch");
    for other in ["eval", "script|load"] {
        assert_eq!(calls(port, other)?, 0, "{other}");
    }
    // Every key reached Redis in that one call: 100 buckets (and the
    // warm-up's), and each key admitted exactly its burst of 2 (keys
    // k0..k55 appear 3 times, the others twice).
    assert_eq!(db_size(port)?, 101);
    assert_eq!(out.iter().filter(|d| d.is_allowed()).count(), 200);
    assert_eq!(out.iter().filter(|d| d.is_denied()).count(), 56);
    assert_eq!(limiter.metrics().redis_calls, 2);

    // The script is gone: the batch meets NOSCRIPT, loads it and runs once.
    assert_eq!(redis_cli(port, &["SCRIPT", "FLUSH"])?.trim(), "OK");
    reset_stats(port)?;
    limiter.check_batch(&["x", "x", "x"], &mut out).await?;
    assert_eq!(allowed(&out), [true, true, false]);
    assert_eq!(calls(port, "script|load")?, 1);
    assert_eq!(db_size(port)?, 102);
    let m = limiter.metrics();
    assert_eq!(
        (m.redis_calls, m.redis_errors, m.fallback_decisions),
        (3, 0, 0)
    );
    Ok(())
}

/// Redis stops between two batches: every key of the next batch gets the
/// failure policy's decision (one failed call), and once the breaker is
/// open, a batch makes no call at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_redis_cannot_answer_gets_the_failure_policy_for_every_key() -> TestResult {
    let quota = Quota::per_hour(1)?.burst(2)?;
    let keys = ["a", "b", "a", "c", "a", "b"];
    let costs = [1, 2, 1, 1, 1, 1];
    let local_quota = Quota::per_hour(1)?.burst(3)?;
    let policies = [
        FailurePolicy::FailClosed,
        FailurePolicy::FailOpen,
        FailurePolicy::Local(KeyedLimiter::new(local_quota)),
    ];
    for policy in policies {
        let name = policy.name();
        let mut server = RedisServer::start()?;
        let limiter = on(&server, quota, "down:")
            .timeout(Duration::from_millis(500))
            .breaker(BreakerConfig {
                failure_threshold: 1,
                cool_down: Duration::from_secs(3_600),
            })
            .failure_policy(policy)
            .build()
            .await?;
        let mut out = Vec::new();
        limiter.check_batch_n(&keys, &costs, &mut out).await?;
        assert_eq!(allowed(&out), [true, true, true, true, false, false]);
        server.kill();

        limiter.check_batch_n(&keys, &costs, &mut out).await?;
        let m = limiter.metrics();
        assert_eq!(m.redis_calls, 2, "{name}: one failed call for the batch");
        assert_eq!(m.redis_errors + m.timeouts, 1, "{name}");
        assert_eq!(m.fallback_decisions, 6, "{name}: every key");
        match name {
            "fail-closed" => {
                assert!(out.iter().all(|d| d.is_denied()), "{name}: {out:?}");
                assert!(out
                    .iter()
                    .all(|d| d.retry_after().is_some_and(|r| r > Duration::ZERO)));
            }
            "fail-open" => assert!(out.iter().all(|d| d.is_allowed()), "{name}: {out:?}"),
            _ => {
                // The local limiter, key by key in slice order.
                let reference = KeyedLimiter::<Vec<u8>>::new(local_quota);
                for ((key, &n), got) in keys.iter().zip(&costs).zip(&out) {
                    let want = reference.check_n(key.as_bytes(), n)?;
                    assert_eq!(
                        (got.is_allowed(), got.remaining()),
                        (want.is_allowed(), want.remaining()),
                        "{name}: {key}"
                    );
                }
                assert_eq!(allowed(&out), [true, true, true, true, true, true]);
            }
        }

        // The breaker opened: the next batch is decided without a call.
        let before = limiter.metrics();
        limiter.check_batch(&keys, &mut out).await?;
        let after = limiter.metrics();
        assert_eq!(after.redis_calls, before.redis_calls, "{name}");
        assert_eq!(after.fallback_decisions, before.fallback_decisions + 6);
        assert_eq!(out.len(), keys.len());
    }
    Ok(())
}

/// With leases on, a batch spends a key's leased tokens first, as checks
/// do, and sends only the rest to Redis, asking for just their cost: a
/// batch takes no new lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_spends_leases_and_takes_none() -> TestResult {
    let server = RedisServer::start()?;
    let limiter = on(&server, Quota::per_hour(1)?.burst(20)?, "lease:")
        .lease(5)
        .build()
        .await?;
    // A check takes 5 tokens from Redis: its own and 4 kept here.
    assert!(limiter.check("a").await?.is_allowed());
    let mut out = Vec::new();
    limiter.check_batch(&["a"; 5], &mut out).await?;
    assert!(out.iter().all(|d| d.is_allowed()));
    let m = limiter.metrics();
    assert_eq!((m.lease_hits, m.redis_calls), (4, 2), "4 leased, 1 sent");
    // The batch kept nothing: the next check goes to Redis (and leases).
    assert!(limiter.check("a").await?.is_allowed());
    assert_eq!(limiter.metrics().redis_calls, 3);
    // A batch its leases decide entirely makes no call.
    limiter.check_batch(&["a", "a"], &mut out).await?;
    let m = limiter.metrics();
    assert_eq!((m.lease_hits, m.redis_calls), (6, 3));
    // Redis gave out 5 + 1 + 5 tokens of 20: 9 left, 8 after one more.
    assert_eq!(limiter.peek("a").await?.remaining(), 8);
    Ok(())
}

/// Bad batches are refused with the error and index of the first bad
/// entry, deciding nothing and sending nothing; an empty batch is no call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_batches_are_refused_before_anything_is_sent() -> TestResult {
    let server = RedisServer::start()?;
    let limiter = on(&server, Quota::per_minute(5)?, "bad:").build().await?;
    let mut out = Vec::new();
    assert_eq!(
        limiter.check_batch_n(&["a"], &[1, 1], &mut out).await,
        Err(RedisLimitError::Batch(BatchError::LengthMismatch {
            keys: 1,
            costs: 2
        }))
    );
    assert_eq!(
        limiter
            .check_batch_n(&["a", "b", "c"], &[1, 1, 0], &mut out)
            .await,
        Err(RedisLimitError::Batch(BatchError::Cost {
            index: 2,
            source: CostError::Zero
        }))
    );
    assert_eq!(
        limiter.check_batch_n(&["a", "b"], &[6, 1], &mut out).await,
        Err(RedisLimitError::Batch(BatchError::Cost {
            index: 0,
            source: CostError::ExceedsCapacity {
                cost: 6,
                capacity: 5
            }
        }))
    );
    let long = vec![b'x'; MAX_KEY_BYTES + 1];
    let keys: [&[u8]; 3] = [b"a", b"", &long];
    let err = limiter.check_batch(&keys, &mut out).await.unwrap_err();
    assert_eq!(
        err,
        RedisLimitError::BatchKey {
            index: 1,
            source: Box::new(RedisLimitError::EmptyKey)
        }
    );
    assert!(err.to_string().contains("key 1 of the batch"), "{err}");
    let err = limiter.check_batch(&keys[2..], &mut out).await.unwrap_err();
    assert!(
        matches!(&err, RedisLimitError::BatchKey { index: 0, source }
            if matches!(**source, RedisLimitError::KeyTooLong { .. })),
        "{err:?}"
    );
    // A failed batch leaves the caller's decisions alone.
    limiter.check_batch(&["a"], &mut out).await?;
    let before = out.clone();
    assert!(limiter.check_batch(&["b", ""], &mut out).await.is_err());
    assert_eq!(out, before);
    limiter.check_batch::<&str>(&[], &mut out).await?;
    assert!(out.is_empty());
    let m = limiter.metrics();
    assert_eq!((m.redis_calls, m.allowed + m.denied), (1, 1));
    assert_eq!(db_size(server.port())?, 1, "only the one good batch wrote");
    Ok(())
}

/// On a 3-master Cluster a batch is one script call per hash slot, all
/// counted by the masters themselves, with the decisions of the keys one by
/// one; with every key on one slot, one call for the whole batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_batch_is_one_call_per_slot_and_decides_as_one_by_one() -> TestResult {
    let cluster = RedisCluster::start()?;
    let ports = cluster.ports();
    let quota: Quota = "2/s burst 5".parse()?;
    let clock = ManualClock::starting_at(Duration::from_secs(1_000));
    let build = |prefix: &str, tag: HashTag| {
        RedisLimiter::builder(quota)
            .cluster(cluster.urls())
            .prefix(prefix)
            .hash_tag(tag)
            .timeout(Duration::from_secs(2))
            .time_source(TimeSource::Client(Arc::new(clock.clone())))
            .build()
    };
    let spread = build("c:", HashTag::None).await?;
    let local = KeyedLimiter::<String, _>::builder(quota)
        .clock(clock.clone())
        .build();
    let mut rng = SplitMix(7);
    let (keys, costs) = random_batch(&mut rng, 24, 80, 3);
    let slots: HashSet<u64> = keys
        .iter()
        .collect::<HashSet<_>>()
        .into_iter()
        .map(|key| {
            let redis_key = String::from_utf8(spread.redis_key(key.as_bytes()))?;
            Ok(redis_cli(ports[0], &["CLUSTER", "KEYSLOT", &redis_key])?
                .trim()
                .parse()?)
        })
        .collect::<Result<_, Box<dyn std::error::Error>>>()?;
    assert!(slots.len() > 10, "{} slots", slots.len());
    let mut out = Vec::new();
    for round in 0..2 {
        // Round 0 also loads the script on every master; round 1 is counted.
        for &port in &ports {
            reset_stats(port)?;
        }
        let before = spread.metrics().redis_calls;
        spread.check_batch_n(&keys, &costs, &mut out).await?;
        for ((key, &n), &got) in keys.iter().zip(&costs).zip(&out) {
            assert_eq!(got, local.check_n(key.as_str(), n)?, "round {round}: {key}");
        }
        assert_eq!(spread.metrics().redis_calls - before, slots.len() as u64);
        clock.advance(Duration::from_millis(700));
    }
    let per_master: Vec<u64> = ports
        .iter()
        .map(|&port| calls(port, "evalsha"))
        .collect::<Result<_, _>>()?;
    assert_eq!(per_master.iter().sum::<u64>(), slots.len() as u64);
    assert!(
        per_master.iter().all(|&n| n > 0),
        "every master got its part: {per_master:?}"
    );
    assert!(out.iter().any(|d| d.is_denied()) && out.iter().any(|d| d.is_allowed()));
    let m = spread.metrics();
    assert_eq!(
        (m.redis_errors, m.timeouts, m.fallback_decisions),
        (0, 0, 0)
    );

    // Every bucket on one slot: one call for the whole batch.
    let tagged = build("t:", HashTag::Fixed("tenant".into())).await?;
    tagged.check_batch(&keys, &mut out).await?;
    for &port in &ports {
        reset_stats(port)?;
    }
    tagged.check_batch(&keys, &mut out).await?;
    let per_master: HashMap<u16, u64> = ports
        .iter()
        .map(|&port| Ok((port, calls(port, "evalsha")?)))
        .collect::<Result<_, Box<dyn std::error::Error>>>()?;
    assert_eq!(per_master.values().sum::<u64>(), 1, "{per_master:?}");
    assert_eq!(tagged.metrics().redis_calls, 2);
    Ok(())
}

/// Not a test: the time of one batch against the same checks one by one,
/// printed (`cargo test --features redis --test redis_batch -- --ignored
/// --nocapture`). Nothing is asserted on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "prints figures; run by hand"]
async fn print_batch_and_one_by_one_times() -> TestResult {
    let server = RedisServer::start()?;
    let limiter = on(&server, Quota::per_hour(1)?.burst(1_000_000)?, "time:")
        .build()
        .await?;
    let mut out = Vec::new();
    for size in [1usize, 8, 32, 256] {
        let keys: Vec<String> = (0..size).map(|i| format!("k{i}")).collect();
        let rounds = 200;
        let (mut batch, mut single) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            let started = std::time::Instant::now();
            limiter.check_batch(&keys, &mut out).await?;
            batch.push(started.elapsed());
            let started = std::time::Instant::now();
            for key in &keys {
                let _ = limiter.check(key).await?;
            }
            single.push(started.elapsed());
        }
        batch.sort_unstable();
        single.sort_unstable();
        println!(
            "batch of {size:>3}: median {:>9.1?} in one call, {:>9.1?} one by one ({:.1?} per key batched)",
            batch[rounds / 2],
            single[rounds / 2],
            batch[rounds / 2] / size as u32,
        );
    }
    Ok(())
}
