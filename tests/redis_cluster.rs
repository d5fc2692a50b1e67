//! A real 3-master Redis Cluster, started by the test: one script call per
//! key, so keys spread over the shards and decisions stay exact.
#![cfg(feature = "redis")]

use turnstile_test_kit::redis_server;

use std::sync::Arc;
use std::time::Duration;

use redis_server::{db_size, RedisCluster};
use turnstile_rl::redis::{HashTag, RedisLimiter, TimeSource};
use turnstile_rl::{KeyedLimiter, ManualClock, Quota};

const KEYS: usize = 300;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_spread_over_three_masters_and_decisions_stay_exact(
) -> Result<(), Box<dyn std::error::Error>> {
    let cluster = RedisCluster::start()?;
    let quota = Quota::per_second(2)?.burst(5)?;
    let clock = ManualClock::starting_at(Duration::from_secs(1_000));
    let remote = RedisLimiter::builder(quota)
        .cluster(cluster.urls())
        .prefix("c:")
        .timeout(Duration::from_secs(2))
        .time_source(TimeSource::Client(Arc::new(clock.clone())))
        .build()
        .await?;
    let local = KeyedLimiter::<String, _>::builder(quota)
        .clock(clock.clone())
        .build();
    // The tutorials' first worked example on every key: 7 at once, then 3
    // after 1.1 s.
    let mut admitted = 0;
    for (advance, requests) in [(0, 7), (1_100, 3)] {
        clock.advance(Duration::from_millis(advance));
        for k in 0..KEYS {
            let key = format!("user_{k}");
            for _ in 0..requests {
                let (r, l) = (remote.check(&key).await?, local.check(key.as_str()));
                assert_eq!(r, l, "{key} at {:?}", clock.elapsed());
                admitted += u32::from(r.is_allowed());
            }
        }
    }
    assert_eq!(admitted, 7 * KEYS as u32);
    let per_master: Vec<u64> = cluster
        .ports()
        .into_iter()
        .map(db_size)
        .collect::<Result<_, _>>()?;
    assert_eq!(
        per_master.iter().sum::<u64>(),
        KEYS as u64,
        "{per_master:?}"
    );
    assert!(
        per_master.iter().all(|&n| n > 50),
        "keys did not spread: {per_master:?}"
    );
    let m = remote.metrics();
    assert_eq!(
        (m.redis_errors, m.timeouts, m.fallback_decisions),
        (0, 0, 0)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_hash_tag_keeps_every_bucket_on_one_master_with_server_time(
) -> Result<(), Box<dyn std::error::Error>> {
    let cluster = RedisCluster::start()?;
    let remote = RedisLimiter::builder(Quota::per_minute(1)?.burst(3)?)
        .cluster(cluster.urls())
        .prefix("t:")
        .hash_tag(HashTag::Fixed("tenant_9".into()))
        .timeout(Duration::from_secs(2))
        .build()
        .await?;
    for k in 0..30 {
        let key = format!("user_{k}");
        let mut allowed = 0;
        for _ in 0..5 {
            allowed += u32::from(remote.check(&key).await?.is_allowed());
        }
        assert_eq!(allowed, 3, "{key}");
    }
    let mut per_master: Vec<u64> = cluster
        .ports()
        .into_iter()
        .map(db_size)
        .collect::<Result<_, _>>()?;
    per_master.sort_unstable();
    assert_eq!(per_master, [0, 0, 30]);
    Ok(())
}

/// Several limits per key on the Cluster: each key's buckets share its hash
/// slot (no CROSSSLOT), keys still spread over the masters, and every
/// decision, binding limit included, is the local multi-limiter's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_limits_per_key_run_in_one_slot_on_the_cluster(
) -> Result<(), Box<dyn std::error::Error>> {
    let cluster = RedisCluster::start()?;
    let clock = ManualClock::starting_at(Duration::from_secs(1_000));
    let quotas: turnstile_rl::Quotas = "2/s burst 5; 6/min".parse()?;
    let remote = RedisLimiter::builder(Quota::per_second(1)?)
        .cluster(cluster.urls())
        .prefix("m:")
        .timeout(Duration::from_secs(2))
        .time_source(TimeSource::Client(Arc::new(clock.clone())))
        .build()
        .await?;
    let remote = remote.multi(quotas.clone())?;
    let local = turnstile_rl::KeyedMultiLimiter::<String, _>::builder(quotas)
        .clock(clock.clone())
        .build();
    let mut admitted = 0;
    for (advance, requests) in [(0, 7), (1_100, 3), (30_000, 3)] {
        clock.advance(Duration::from_millis(advance));
        for k in 0..100 {
            let key = format!("user_{k}");
            for _ in 0..requests {
                let (r, l) = (remote.check(&key).await?, local.check(key.as_str()));
                assert_eq!(r, l, "{key} at {:?}", clock.elapsed());
                admitted += u32::from(r.is_allowed());
            }
        }
    }
    // 5 at once; at 1.1 s the minute's sixth token (its burst); at 31.1 s
    // three more, one per 10 s of the minute's refill.
    assert_eq!(admitted, 9 * 100);
    let per_master: Vec<u64> = cluster
        .ports()
        .into_iter()
        .map(db_size)
        .collect::<Result<_, _>>()?;
    assert_eq!(per_master.iter().sum::<u64>(), 2 * 100, "{per_master:?}");
    assert!(per_master.iter().all(|&n| n > 0), "{per_master:?}");
    Ok(())
}

/// A caller's own commands on a Cluster (`RedisLimiter::query_each`): a
/// pipeline whose keys span slots is refused, one pipeline per slot
/// (`redis::slot`) is answered, each reply in its pipeline's place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callers_pipelines_one_per_slot_run_on_the_cluster(
) -> Result<(), Box<dyn std::error::Error>> {
    use turnstile_rl::redis::slot;
    let cluster = RedisCluster::start()?;
    let limiter = RedisLimiter::builder(Quota::per_second(1)?)
        .cluster(cluster.urls())
        .timeout(Duration::from_secs(2))
        .build()
        .await?;
    assert!(limiter.is_cluster());
    let keys = ["foo", "bar"];
    assert_ne!(slot(b"foo"), slot(b"bar"), "two slots");
    let mut both = redis::pipe();
    for key in keys {
        both.incr(key, 1);
    }
    let crossed = limiter.query::<(u64, u64)>(&both).await;
    assert!(
        crossed.is_err(),
        "keys of two slots in one pipeline: {crossed:?}"
    );
    let pipes: Vec<redis::Pipeline> = keys
        .iter()
        .zip([2, 5])
        .map(|(key, by)| {
            let mut pipe = redis::pipe();
            pipe.incr(*key, by);
            pipe
        })
        .collect();
    let replies: Vec<(u64,)> = limiter.query_each(&pipes).await?;
    assert_eq!(replies, vec![(2,), (5,)]);
    Ok(())
}
