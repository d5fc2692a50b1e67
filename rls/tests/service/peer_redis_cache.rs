//! envoyproxy/ratelimit's `test/redis/fixed_cache_impl_test.go` replayed
//! over gRPC on a real `redis-server`. The peer's tests give its cache a
//! mock Redis whose `INCRBY` answers a count; here the key (the peer's own
//! key: `domain_key_value_` and the window's start) is set to that count
//! less the request's hits before the request, so Redis answers the same
//! count, and the answer and the statistics are the peer's. The limits
//! the peer builds in code are in [`RULES`].
//!
//! A key of a second's window is set for this second and the next, so a
//! second's edge between setting and asking changes nothing.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::support;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;
use support::{descriptor, request, sample, settings, start, ConfigDir, Harness};
use turnstile_rls::config::Algorithm;
use turnstile_rls::settings::BackendName;
use turnstile_test_kit::redis_server::{redis_cli, RedisServer};

/// The limits of the peer's tests, as a file.
const RULES: &str = r#"
domain: domain
descriptors:
  - { key: key, value: value, rate_limit: { unit: second, requests_per_unit: 10 } }
  - key: key2
    value: value2
    descriptors:
      - { key: subkey2, value: subvalue2, rate_limit: { unit: minute, requests_per_unit: 10 } }
  - key: key3
    value: value3
    rate_limit: { unit: hour, requests_per_unit: 10 }
    descriptors:
      - { key: subkey3, value: subvalue3, rate_limit: { unit: day, requests_per_unit: 10 } }
  - { key: key4, value: value4, rate_limit: { unit: hour, requests_per_unit: 15 } }
  - { key: key5, value: value5, rate_limit: { unit: second, requests_per_unit: 20 } }
  - { key: key6, value: value6, rate_limit: { unit: second, requests_per_unit: 8 } }
  - { key: key7, value: value7, rate_limit: { unit: second, requests_per_unit: 20 } }
  - { key: key8, value: value8, rate_limit: { unit: second, requests_per_unit: 20 } }
  - { key: key9, value: value9, rate_limit: { unit: second, requests_per_unit: 20 } }
  - { key: key10, value: value10, rate_limit: { unit: second, requests_per_unit: 10 } }
"#;

/// [`RULES`] with key4 in shadow mode (`TestOverLimitWithLocalCacheShadowRule`).
const SHADOW_RULES: &str = r#"
domain: domain
descriptors:
  - { key: key4, value: value4, shadow_mode: true, rate_limit: { unit: hour, requests_per_unit: 15 } }
"#;

/// `TestOverLimitWithStopCacheKeyIncrementWhenOverlimitConfig`'s limits.
const STOP_RULES: &str = r#"
domain: domain
descriptors:
  - { key: key4, value: value4, rate_limit: { unit: hour, requests_per_unit: 15 } }
  - { key: key5, value: value5, rate_limit: { unit: hour, requests_per_unit: 14 } }
"#;

/// A service on `rules` with fixed windows on a Redis of its own.
struct Peer {
    h: Harness,
    redis: RedisServer,
    _dir: ConfigDir,
}

impl Peer {
    async fn start(rules: &str, change: impl FnOnce(&mut turnstile_rls::Settings)) -> Peer {
        let redis = RedisServer::start().expect("redis-server (scripts/test.sh installs it)");
        let dir = ConfigDir::with("domain.yaml", rules);
        let mut s = settings(&dir);
        s.backend = BackendName::Redis;
        s.redis_url = redis.url();
        s.default_algorithm = Algorithm::FixedWindow;
        // The peer's cache in these tests has no jitter, and its mock never
        // times out.
        s.expiration_jitter_max_seconds = 0;
        s.redis_timeout_ms = 5_000;
        change(&mut s);
        Peer {
            h: start(s).await,
            redis,
            _dir: dir,
        }
    }

    /// The peer's mock `INCRBY` of `entries`' key answering `count` for
    /// `hits`: the key holds `count - hits` before the request.
    fn incrby_answers(&self, entries: &str, unit_secs: u64, hits: u64, count: u64) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_secs();
        let start = now / unit_secs * unit_secs;
        let value = (count - hits).to_string();
        // This window, and the next when it is a second's.
        let next = (unit_secs == 1).then_some(start + 1);
        for window in std::iter::once(start).chain(next) {
            let key = format!("domain_{entries}{window}");
            redis_cli(self.redis.port(), &["SET", &key, &value]).expect("SET");
        }
    }

    /// The peer's four statistics of `descriptor`:
    /// (total_hits, over_limit, near_limit, within_limit).
    async fn stats(&self, descriptor: &str) -> [u64; 4] {
        let text = self.h.metrics().await;
        ["total_hits", "over_limit", "near_limit", "within_limit"].map(|stat| {
            let name = format!(
                "ratelimit_service_rate_limit_{stat}{{domain=\"domain\",descriptor=\"{descriptor}\"}}"
            );
            sample(&text, &name).unwrap_or(0.0) as u64
        })
    }

    /// The peer's `testLocalCacheStats`: the local cache's (hit, miss,
    /// lookup, expired, entry) counts.
    async fn local_cache(&self) -> [u64; 5] {
        let text = self.h.metrics().await;
        [
            "hitCount",
            "missCount",
            "lookupCount",
            "expiredCount",
            "entryCount",
        ]
        .map(|stat| sample(&text, &format!("ratelimit_localcache_{stat}")).unwrap_or(0.0) as u64)
    }

    /// A statistic of `descriptor` beyond the four.
    async fn stat(&self, descriptor: &str, stat: &str) -> u64 {
        let name = format!(
            "ratelimit_service_rate_limit_{stat}{{domain=\"domain\",descriptor=\"{descriptor}\"}}"
        );
        sample(&self.h.metrics().await, &name).unwrap_or(0.0) as u64
    }

    /// The statuses of `req`, each reset checked against the peer's
    /// `CalculateReset` (whole seconds to the window's edge, 1 for a
    /// second's) and then left out for comparison.
    async fn statuses(&mut self, req: RateLimitRequest) -> Vec<DescriptorStatus> {
        let response = self.h.ask(req).await;
        response
            .statuses
            .into_iter()
            .map(|mut status| {
                if let Some(limit) = &status.current_limit {
                    let reset = status.duration_until_reset.take().expect("a reset");
                    assert_eq!(reset.nanos, 0);
                    let unit = unit_secs(Unit::try_from(limit.unit).expect("a unit"));
                    assert!((1..=unit as i64).contains(&reset.seconds), "{reset:?}");
                    if unit == 1 {
                        assert_eq!(reset.seconds, 1);
                    }
                }
                status
            })
            .collect()
    }
}

fn unit_secs(unit: Unit) -> u64 {
    match unit {
        Unit::Second => 1,
        Unit::Minute => 60,
        Unit::Hour => 3_600,
        Unit::Day => 86_400,
        other => panic!("the peer's tests use no {other:?}"),
    }
}

/// A status as the peer's test writes it (its reset left out).
fn status(code: Code, limit: Option<(u32, Unit)>, remaining: u32) -> DescriptorStatus {
    DescriptorStatus {
        code: code as i32,
        current_limit: limit.map(|(rpu, unit)| RateLimit {
            requests_per_unit: rpu,
            unit: unit as i32,
            ..Default::default()
        }),
        limit_remaining: remaining,
        ..Default::default()
    }
}

/// The peer's `NewRateLimitRequest` of one descriptor per `entries`.
fn peer_request(descriptors: &[&[(&str, &str)]], hits: u32) -> RateLimitRequest {
    let mut req = request(
        "domain",
        descriptors.iter().map(|d| descriptor(d)).collect(),
    );
    req.hits_addend = hits;
    req
}

/// The peer's `NewRateLimitRequestWithPerDescriptorHitsAddend`.
fn per_descriptor_hits(descriptors: &[&[(&str, &str)]], hits: &[u64]) -> RateLimitRequest {
    let mut req = peer_request(descriptors, 1);
    for (d, h) in req.descriptors.iter_mut().zip(hits) {
        d.hits_addend = Some(UInt64Value { value: *h });
    }
    req
}

use Code::{Ok as OK, OverLimit as OVER};

/// `TestRedis`'s `WithoutPerSecondRedis` (its `WithPerSecondRedis` needs a
/// second Redis, which this service does not have).
#[tokio::test]
async fn test_redis_without_per_second_redis() {
    let mut p = Peer::start(RULES, |_| {}).await;
    p.incrby_answers("key_value_", 1, 1, 5);
    let got = p.statuses(peer_request(&[&[("key", "value")]], 1)).await;
    assert_eq!(got, [status(OK, Some((10, Unit::Second)), 5)]);
    assert_eq!(p.stats("key_value").await, [1, 0, 0, 1]);

    // A descriptor with no limit and `hits_addend` 0, and one over.
    p.incrby_answers("key2_value2_subkey2_subvalue2_", 60, 1, 11);
    let req = per_descriptor_hits(
        &[
            &[("key2", "value2")],
            &[("key2", "value2"), ("subkey2", "subvalue2")],
        ],
        &[0, 1],
    );
    let got = p.statuses(req).await;
    assert_eq!(
        got,
        [
            status(OK, None, 0),
            status(OVER, Some((10, Unit::Minute)), 0)
        ]
    );
    assert_eq!(p.stats("key2_value2.subkey2_subvalue2").await, [1, 1, 0, 0]);

    // `hits_addend` 0 on a key already over: over, and counts nothing.
    p.incrby_answers("key3_value3_", 3_600, 0, 11);
    p.incrby_answers("key3_value3_subkey3_subvalue3_", 86_400, 1, 13);
    let req = per_descriptor_hits(
        &[
            &[("key3", "value3")],
            &[("key3", "value3"), ("subkey3", "subvalue3")],
        ],
        &[0, 1],
    );
    let got = p.statuses(req).await;
    assert_eq!(
        got,
        [
            status(OVER, Some((10, Unit::Hour)), 0),
            status(OVER, Some((10, Unit::Day)), 0)
        ]
    );
    assert_eq!(p.stats("key3_value3").await, [0, 0, 0, 0]);
    assert_eq!(p.stats("key3_value3.subkey3_subvalue3").await, [1, 1, 0, 0]);
}

/// `TestNearLimit`: near and over statistics, hits of 1 then costs that
/// cross the near-limit threshold and the limit.
#[tokio::test]
async fn test_near_limit() {
    let mut p = Peer::start(RULES, |_| {}).await;
    let key4: &[(&str, &str)] = &[("key4", "value4")];
    let hour = Some((15, Unit::Hour));
    // Under the near-limit ratio, at it (still OK), then over: near only
    // counts until the limit is passed.
    for (count, expected, stats) in [
        (11, status(OK, hour, 4), [1, 0, 0, 1]),
        (13, status(OK, hour, 2), [2, 0, 1, 2]),
        (16, status(OVER, hour, 0), [3, 1, 1, 2]),
    ] {
        p.incrby_answers("key4_value4_", 3_600, 1, count);
        assert_eq!(
            p.statuses(peer_request(&[key4], 1)).await,
            [expected],
            "count {count}"
        );
        assert_eq!(p.stats("key4_value4").await, stats, "count {count}");
    }

    // Costs above 1, each key of a second's window: (key, limit, cost,
    // count after, code, remaining, [total, over, near, within]).
    let second = |rpu| Some((rpu, Unit::Second));
    for (key, rpu, hits, count, code, remaining, stats) in [
        // All under the limit and the near-limit threshold.
        ("key5", 20, 3, 5, OK, 15, [3, 0, 0, 3]),
        // All under the limit, some past the threshold.
        ("key6", 8, 2, 7, OK, 1, [2, 0, 1, 2]),
        // All under the limit, all past the threshold.
        ("key7", 20, 3, 19, OK, 1, [3, 0, 3, 3]),
        // Some over the limit, all past the threshold.
        ("key8", 20, 3, 22, OVER, 0, [3, 2, 1, 0]),
        // Some in each of the three.
        ("key9", 20, 7, 22, OVER, 0, [7, 2, 4, 0]),
        // All over the limit.
        ("key10", 10, 3, 30, OVER, 0, [3, 3, 0, 0]),
    ] {
        let value = key.replace("key", "value");
        p.incrby_answers(&format!("{key}_{value}_"), 1, hits.into(), count);
        let got = p.statuses(peer_request(&[&[(key, &value)]], hits)).await;
        assert_eq!(got, [status(code, second(rpu), remaining)], "{key}");
        assert_eq!(p.stats(&format!("{key}_{value}")).await, stats, "{key}");
    }
}

/// `TestRedisWithJitter`: a key expires after its window plus a random
/// part of up to EXPIRATION_JITTER_MAX_SECONDS (the peer's mock draws 100,
/// so its `EXPIRE` is 101 s; here any of 1..=3,601 s).
#[tokio::test]
async fn test_redis_with_jitter() {
    let mut p = Peer::start(RULES, |s| s.expiration_jitter_max_seconds = 3_600).await;
    p.incrby_answers("key_value_", 1, 1, 5);
    let got = p.statuses(peer_request(&[&[("key", "value")]], 1)).await;
    assert_eq!(got, [status(OK, Some((10, Unit::Second)), 5)]);
    assert_eq!(p.stats("key_value").await, [1, 0, 0, 1]);
    let keys = redis_cli(p.redis.port(), &["KEYS", "domain_key_value_*"]).expect("KEYS");
    let ttls: Vec<i64> = keys
        .lines()
        .map(|k| {
            redis_cli(p.redis.port(), &["TTL", k])
                .expect("TTL")
                .trim()
                .parse()
                .expect("a TTL")
        })
        .collect();
    // One of the two seeded windows was counted (and given an expiry).
    assert!(ttls.iter().any(|t| (1..=3_601).contains(t)), "{ttls:?}");
}

/// `TestOverLimitWithLocalCache` (and, with `shadow`,
/// `TestOverLimitWithLocalCacheShadowRule`): once Redis says a key is over,
/// the next hit is answered from the local cache with no `INCRBY`.
async fn over_limit_with_local_cache(shadow: bool) {
    let rules = if shadow { SHADOW_RULES } else { RULES };
    let mut p = Peer::start(rules, |s| s.local_cache_size_in_bytes = 100).await;
    let key4: &[(&str, &str)] = &[("key4", "value4")];
    let hour = Some((15, Unit::Hour));
    // Shadow mode answers OK where the limit is over.
    let over = if shadow { OK } else { OVER };
    // Each step is followed by one of the peer's `TestLocalCacheStats*`
    // cases: the cache's (hit, miss, lookup, expired, entry) counts.
    for (count, expected, stats, cached, shadowed, local) in [
        (
            Some(11),
            status(OK, hour, 4),
            [1, 0, 0, 1],
            0,
            0,
            [0, 1, 1, 0, 0],
        ),
        (
            Some(13),
            status(OK, hour, 2),
            [2, 0, 1, 2],
            0,
            0,
            [0, 2, 2, 0, 0],
        ),
        (
            Some(16),
            status(over, hour, 0),
            [3, 1, 1, 2],
            0,
            1,
            [0, 3, 3, 0, 1],
        ),
        // No INCRBY: the local cache answers.
        (
            None,
            status(over, hour, 0),
            [4, 2, 1, 2],
            1,
            2,
            [1, 3, 4, 0, 1],
        ),
    ] {
        if let Some(count) = count {
            p.incrby_answers("key4_value4_", 3_600, 1, count);
        }
        assert_eq!(
            p.statuses(peer_request(&[key4], 1)).await,
            [expected],
            "{count:?}"
        );
        assert_eq!(p.stats("key4_value4").await, stats, "{count:?}");
        let with_cache = p.stat("key4_value4", "over_limit_with_local_cache").await;
        assert_eq!(with_cache, cached, "{count:?}");
        if shadow {
            assert_eq!(
                p.stat("key4_value4", "shadow_mode").await,
                shadowed,
                "{count:?}"
            );
        }
        assert_eq!(p.local_cache().await, local, "{count:?}");
    }
    // The cache answered: Redis still holds the count of the third request.
    let key = redis_cli(p.redis.port(), &["KEYS", "domain_key4_value4_*"]).expect("KEYS");
    let count = redis_cli(p.redis.port(), &["GET", key.trim()]).expect("GET");
    assert_eq!(count.trim(), "16");
}

#[tokio::test]
async fn test_over_limit_with_local_cache() {
    over_limit_with_local_cache(false).await;
}

#[tokio::test]
async fn test_over_limit_with_local_cache_shadow_rule() {
    over_limit_with_local_cache(true).await;
}

/// `TestOverLimitWithStopCacheKeyIncrementWhenOverlimitConfig`: with the
/// setting, a request one of whose keys would go over charges only the
/// keys that would; the others are answered (and counted in the
/// statistics) as if charged.
#[tokio::test]
async fn test_over_limit_with_stop_cache_key_increment_when_overlimit_config() {
    let mut p = Peer::start(STOP_RULES, |s| {
        s.stop_cache_key_increment_when_overlimit = true;
        s.local_cache_size_in_bytes = 100;
    })
    .await;
    let both: [&[(&str, &str)]; 2] = [&[("key4", "value4")], &[("key5", "value5")]];
    p.incrby_answers("key4_value4_", 3_600, 0, 10);
    p.incrby_answers("key5_value5_", 3_600, 0, 10);
    let (h15, h14) = (Some((15, Unit::Hour)), Some((14, Unit::Hour)));
    for (hits, expected, stats4, stats5, local) in [
        (
            1,
            [status(OK, h15, 4), status(OK, h14, 3)],
            [1, 0, 0, 1],
            [1, 0, 0, 1],
            [0, 2, 2, 0, 0],
        ),
        (
            2,
            [status(OK, h15, 2), status(OK, h14, 1)],
            [3, 0, 1, 3],
            [3, 0, 2, 3],
            [0, 4, 4, 0, 0],
        ),
        // key5 would go over: only it is charged.
        (
            2,
            [status(OK, h15, 2), status(OVER, h14, 0)],
            [5, 0, 2, 5],
            [5, 1, 3, 3],
            [0, 6, 6, 0, 1],
        ),
    ] {
        let got = p.statuses(per_descriptor_hits(&both, &[hits, hits])).await;
        assert_eq!(got, expected, "{stats4:?}");
        assert_eq!(p.stats("key4_value4").await, stats4);
        assert_eq!(p.stats("key5_value5").await, stats5);
        assert_eq!(
            p.local_cache().await,
            local,
            "the peer's TestLocalCacheStats*"
        );
    }
    let count = |key: &str| {
        let keys = redis_cli(p.redis.port(), &["KEYS", key]).expect("KEYS");
        redis_cli(p.redis.port(), &["GET", keys.trim()])
            .expect("GET")
            .trim()
            .to_owned()
    };
    assert_eq!(count("domain_key4_value4_*"), "13", "key4 not charged");
    assert_eq!(count("domain_key5_value5_*"), "15");
}
