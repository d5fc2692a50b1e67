//! The Redis backend: instances of the service share each limit through a
//! real `redis-server` started by the test, and when it is killed mid-run
//! each failure policy answers as configured.

use crate::support;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use support::{settings, start, ConfigDir, Harness};
use turnstile_rls::bucket::Bucket;
use turnstile_rls::redis_health::{RedisEvent, RedisHealth};
use turnstile_rls::settings::{BackendName, FailurePolicyName};
use turnstile_test_kit::redis_server::RedisServer;

const RULES: &str = r#"
domain: r
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 3 }
"#;

async fn on_redis(dir: &ConfigDir, redis: &RedisServer, policy: FailurePolicyName) -> Harness {
    let mut settings = settings(dir);
    settings.backend = BackendName::Redis;
    settings.redis_url = redis.url();
    settings.redis_failure_policy = policy;
    start(settings).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_each_limit_through_redis() {
    let redis = RedisServer::start().expect("redis-server (scripts/test.sh installs it)");
    let dir = ConfigDir::with("r.yaml", RULES);
    let mut a = on_redis(&dir, &redis, FailurePolicyName::Open).await;
    let mut b = on_redis(&dir, &redis, FailurePolicyName::Open).await;
    assert_eq!(a.admitted("r", &[("user", "u")], 2).await, 2);
    assert_eq!(
        b.admitted("r", &[("user", "u")], 3).await,
        1,
        "one left of the shared 3"
    );
    assert_eq!(a.admitted("r", &[("user", "u")], 1).await, 0);
    assert_eq!(
        b.admitted("r", &[("user", "other")], 4).await,
        3,
        "another value, another bucket"
    );
}

const PEER_BASIC: &str = include_str!("../peer_config/basic_config.yaml");

/// Fixed windows on `redis`, the peer's keys (no prefix) and no jitter.
async fn windows_on_redis(dir: &ConfigDir, redis: &RedisServer, stop: bool) -> Harness {
    let mut settings = settings(dir);
    settings.backend = BackendName::Redis;
    settings.redis_url = redis.url();
    settings.default_algorithm = turnstile_rls::config::Algorithm::FixedWindow;
    settings.expiration_jitter_max_seconds = 0;
    settings.stop_cache_key_increment_when_overlimit = stop;
    // Exact counts: no loaded-machine timeout may hand a call to the policy.
    settings.redis_timeout_ms = 5_000;
    start(settings).await
}

/// The peer's key of `entries` in today's window (a day: no edge falls
/// inside a test in practice).
fn peer_key(entries: &str) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    format!("test-domain_{entries}{}", now / 86_400 * 86_400)
}

async fn redis_client(redis: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis.url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the test's Redis")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_windows_in_redis_are_the_peers_keys_counts_and_expiry() {
    let redis = RedisServer::start().expect("redis-server");
    let dir = ConfigDir::with("basic_config.yaml", PEER_BASIC);
    let mut a = windows_on_redis(&dir, &redis, false).await;
    let mut b = windows_on_redis(&dir, &redis, false).await;
    let key5 = &[("key5", "value5")]; // 15 a day
    assert_eq!(a.admitted("test-domain", key5, 2).await, 2);
    assert_eq!(
        b.admitted("test-domain", key5, 14).await,
        13,
        "the fleet shares 15"
    );
    let mut conn = redis_client(&redis).await;
    let key = peer_key("key5_value5_");
    let count: u64 = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .expect("GET");
    assert_eq!(count, 16, "the refused hit counted, as the peer's INCRBY");
    let ttl: i64 = redis::cmd("TTL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .expect("TTL");
    assert!((86_390..=86_400).contains(&ttl), "a day's expiry: {ttl}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_cache_key_increment_in_redis_spares_the_other_descriptors() {
    use envoy_types::pb::google::protobuf::UInt64Value;
    let redis = RedisServer::start().expect("redis-server");
    let dir = ConfigDir::with("basic_config.yaml", PEER_BASIC);
    let mut h = windows_on_redis(&dir, &redis, true).await;
    let mut over = support::descriptor(&[("key4", "x")]); // 1 a day
    over.hits_addend = Some(UInt64Value { value: 2 });
    let response = h
        .ask(support::request(
            "test-domain",
            vec![support::descriptor(&[("key5", "value5")]), over],
        ))
        .await;
    assert_eq!(support::code(response.overall_code), Code::OverLimit);
    let mut conn = redis_client(&redis).await;
    let spared: u64 = redis::cmd("GET")
        .arg(peer_key("key5_value5_"))
        .query_async(&mut conn)
        .await
        .expect("GET");
    let charged: u64 = redis::cmd("GET")
        .arg(peer_key("key4_x_"))
        .query_async(&mut conn)
        .await
        .expect("GET");
    assert_eq!((spared, charged), (0, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_windows_with_redis_killed_fail_closed_refuse() {
    let mut redis = RedisServer::start().expect("redis-server");
    let dir = ConfigDir::with("basic_config.yaml", PEER_BASIC);
    let mut settings = settings(&dir);
    settings.backend = BackendName::Redis;
    settings.redis_url = redis.url();
    settings.default_algorithm = turnstile_rls::config::Algorithm::FixedWindow;
    settings.redis_failure_policy = FailurePolicyName::Closed;
    let mut h = start(settings).await;
    let key5 = &[("key5", "value5")];
    assert_eq!(h.admitted("test-domain", key5, 1).await, 1, "Redis decides");
    redis.kill();
    assert_eq!(h.admitted("test-domain", key5, 2).await, 0);
}

/// The Redis limit's metrics.
fn redis_metrics(h: &Harness) -> turnstile_rl::redis::MetricsSnapshot {
    let rules = h.service.engine.rules().rules();
    rules
        .iter()
        .find_map(|r| match r.bucket.as_deref() {
            Some(Bucket::Redis(l)) => Some(l.metrics()),
            _ => None,
        })
        .expect("a Redis limit")
}

/// Spends one of the 3, kills Redis, then sends 4 more.
async fn codes_after_a_kill(policy: FailurePolicyName) -> Vec<Code> {
    let mut redis = RedisServer::start().expect("redis-server");
    let dir = ConfigDir::with("r.yaml", RULES);
    let mut h = on_redis(&dir, &redis, policy).await;
    assert_eq!(
        h.admitted("r", &[("user", "u")], 1).await,
        1,
        "Redis decides"
    );
    let mut health = RedisHealth::default();
    assert!(health.observe(redis_metrics(&h)).is_empty(), "healthy");
    redis.kill();
    let codes = h.codes("r", &[("user", "u")], 4).await;
    let events = health.observe(redis_metrics(&h));
    assert_eq!(events.first(), Some(&RedisEvent::Lost), "{events:?}");
    codes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_killed_fail_open_allows() {
    assert_eq!(
        codes_after_a_kill(FailurePolicyName::Open).await,
        [Code::Ok; 4]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_killed_fail_closed_refuses() {
    assert_eq!(
        codes_after_a_kill(FailurePolicyName::Closed).await,
        [Code::OverLimit; 4]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_killed_local_decides_with_the_same_quota_here() {
    // The local limiter starts empty: 3 of the 4 pass.
    assert_eq!(
        codes_after_a_kill(FailurePolicyName::Local).await,
        [Code::Ok, Code::Ok, Code::Ok, Code::OverLimit]
    );
}
