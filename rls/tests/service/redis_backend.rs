//! The Redis backend: instances of the service share each limit through a
//! real `redis-server` started by the test, and when it is killed mid-run
//! each failure policy answers as configured.

use crate::support;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use support::{settings, start, ConfigDir, Harness};
use turnstile_rls::config::Algorithm;
use turnstile_rls::redis_health::{RedisEvent, RedisHealth};
use turnstile_rls::settings::{BackendName, FailurePolicyName};
use turnstile_test_kit::redis_server::{redis_cli, RedisServer};

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

/// Fixed windows on `redis` with the service's default timeout, failing
/// by `policy`.
async fn windows_failing(
    dir: &ConfigDir,
    redis: &RedisServer,
    policy: FailurePolicyName,
) -> Harness {
    let mut settings = settings(dir);
    settings.backend = BackendName::Redis;
    settings.redis_url = redis.url();
    settings.default_algorithm = turnstile_rls::config::Algorithm::FixedWindow;
    settings.redis_failure_policy = policy;
    start(settings).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_windows_with_redis_killed_fail_closed_refuse() {
    let mut redis = RedisServer::start().expect("redis-server");
    let dir = ConfigDir::with("basic_config.yaml", PEER_BASIC);
    let mut h = windows_failing(&dir, &redis, FailurePolicyName::Closed).await;
    let key5 = &[("key5", "value5")];
    assert_eq!(h.admitted("test-domain", key5, 1).await, 1, "Redis decides");
    redis.kill();
    assert_eq!(h.admitted("test-domain", key5, 2).await, 0);
}

/// Fixed windows go through the service's one Redis limiter: with Redis
/// gone, their failed pipelines are counted there and open the breaker
/// that GCRA limits use, which then refuses them at once. (Before, the
/// windows had a connection of their own, with no breaker: every request
/// waited for its timeout, and the service's Redis metrics saw nothing.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_windows_and_gcra_share_one_breaker() {
    let mut redis = RedisServer::start().expect("redis-server");
    let dir = ConfigDir::with("basic_config.yaml", PEER_BASIC);
    let mut h = windows_failing(&dir, &redis, FailurePolicyName::Open).await;
    let key5 = &[("key5", "value5")];
    assert_eq!(h.admitted("test-domain", key5, 1).await, 1, "Redis decides");
    let before = redis_metrics(&h);
    assert!(
        before.redis_calls >= 1,
        "the window's pipeline was a call of the service's limiter"
    );
    redis.kill();
    // Fail open: every request passes, decided by the policy.
    assert_eq!(h.admitted("test-domain", key5, 10).await, 10);
    let after = redis_metrics(&h);
    assert!(
        after.redis_errors + after.timeouts > before.redis_errors + before.timeouts,
        "the failed pipelines were counted: {after:?}"
    );
    assert!(
        after.breaker_opened >= 1,
        "the windows' failures opened the breaker: {after:?}"
    );
    assert!(
        after.breaker_rejections >= 1,
        "the open breaker refused a window's pipeline: {after:?}"
    );
}

/// The service's Redis metrics (one path for every GCRA limit).
fn redis_metrics(h: &Harness) -> turnstile_rl::redis::MetricsSnapshot {
    h.service.engine.redis_metrics().expect("the Redis backend")
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

const THREE_LIMITS: &str = r#"
domain: r
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 3 }
  - key: ip
    rate_limit: { unit: day, requests_per_unit: 100 }
  - key: path
    rate_limit: { unit: day, requests_per_unit: 5 }
"#;

/// Calls of `command` Redis counted since the last `CONFIG RESETSTAT`.
fn redis_calls(redis: &RedisServer, command: &str) -> u64 {
    let info = redis_cli(redis.port(), &["INFO", "commandstats"]).expect("redis-cli");
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("a count"))
}

fn reset_redis_stats(redis: &RedisServer) {
    let ok = redis_cli(redis.port(), &["CONFIG", "RESETSTAT"]).expect("redis-cli");
    assert_eq!(ok.trim(), "OK");
}

/// A request of three GCRA descriptors, each under its own limit, is one
/// Redis call (one `EVALSHA`, counted by Redis itself), and each
/// descriptor is still decided by its own limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_descriptors_are_one_redis_call() {
    let redis = RedisServer::start().expect("redis-server");
    let dir = ConfigDir::with("r.yaml", THREE_LIMITS);
    let mut h = on_redis(&dir, &redis, FailurePolicyName::Closed).await;
    let three = || {
        support::request(
            "r",
            vec![
                support::descriptor(&[("user", "u")]),
                support::descriptor(&[("ip", "10.0.0.1")]),
                support::descriptor(&[("path", "/a")]),
            ],
        )
    };
    // Load the script (a first call may meet NOSCRIPT).
    h.ask(three()).await;
    reset_redis_stats(&redis);
    for _ in 0..4 {
        h.ask(three()).await;
    }
    assert_eq!(redis_calls(&redis, "evalsha"), 4, "one call per request");
    assert_eq!(redis_calls(&redis, "eval"), 0);
    let response = h.ask(three()).await;
    let codes: Vec<Code> = response.statuses.iter().map(support::status_code).collect();
    assert_eq!(codes, [Code::OverLimit, Code::Ok, Code::OverLimit]);
    let left: Vec<u32> = response
        .statuses
        .iter()
        .map(|s| s.limit_remaining)
        .collect();
    assert_eq!(left, [0, 94, 0]);
    assert_eq!(redis_calls(&redis, "evalsha"), 5);
    let m = redis_metrics(&h);
    assert_eq!(
        (m.redis_calls, m.fallback_decisions),
        (6, 0),
        "one path, no fallback"
    );
}

/// A domain `r` with one limit on `user`: `rate_limit` as YAML.
fn user_limit(rate_limit: &str) -> ConfigDir {
    let yaml = format!("domain: r\ndescriptors:\n  - key: user\n    rate_limit: {rate_limit}\n");
    ConfigDir::with("r.yaml", &yaml)
}

/// An instance on `redis` with `--redis-lease lease`, and a timeout no
/// loaded machine reaches (so no decision falls to the policy).
fn leased(dir: &ConfigDir, redis: &RedisServer, lease: u64) -> turnstile_rls::Settings {
    let mut s = settings(dir);
    s.backend = BackendName::Redis;
    s.redis_url = redis.url();
    s.redis_lease = lease;
    s.redis_timeout_ms = 5_000;
    s
}

/// With `--redis-lease 100` a hot key costs one Redis call per 100
/// decisions: 1,000 decisions are at most 20 calls (0.02 a decision), and
/// every one is admitted, since the limit is far above them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_of_100_make_a_hot_key_one_call_per_lease() {
    let redis = RedisServer::start().expect("redis-server");
    let dir = user_limit("{ unit: second, requests_per_unit: 100000 }");
    let mut h = start(leased(&dir, &redis, 100)).await;
    reset_redis_stats(&redis);
    assert_eq!(h.admitted("r", &[("user", "hot")], 1_000).await, 1_000);
    let calls = redis_calls(&redis, "evalsha") + redis_calls(&redis, "eval");
    assert!(calls >= 10, "the leases came from Redis: {calls}");
    assert!(
        calls as f64 / 1_000.0 <= 0.02,
        "{calls} calls for 1,000 decisions"
    );
    assert_eq!(
        redis_metrics(&h).lease_hits,
        1_000 - redis_metrics(&h).redis_calls
    );
}

/// Leases bound what a fleet over-admits: two instances with leases of 5
/// on a limit of 10 an hour admit at most 10 + 2 x (5 - 1) in the hour,
/// and at least the 10 the limit gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_instances_admit_at_most_the_limit_plus_their_leases() {
    let redis = RedisServer::start().expect("redis-server");
    let dir = user_limit("{ unit: hour, requests_per_unit: 10 }");
    let mut a = start(leased(&dir, &redis, 5)).await;
    let mut b = start(leased(&dir, &redis, 5)).await;
    let mut admitted = 0;
    for _ in 0..10 {
        admitted += a.admitted("r", &[("user", "u")], 2).await;
        admitted += b.admitted("r", &[("user", "u")], 2).await;
    }
    assert!((10..=18).contains(&admitted), "{admitted}");
}

/// An instance on `redis` with the peer's over-limit cache on.
fn cached(dir: &ConfigDir, redis: &RedisServer, algorithm: Algorithm) -> turnstile_rls::Settings {
    let mut s = leased(dir, redis, 0);
    s.local_cache_size_in_bytes = 1 << 20;
    s.default_algorithm = algorithm;
    s
}

/// Six hits on a limit of 3.
const THREE_THEN_OVER: [Code; 6] = [
    Code::Ok,
    Code::Ok,
    Code::Ok,
    Code::OverLimit,
    Code::OverLimit,
    Code::OverLimit,
];

/// The cache's statistic for `r`'s `user` limit.
async fn cached_hits(h: &Harness) -> f64 {
    support::stat(
        &h.metrics().await,
        "r",
        "user",
        "over_limit_with_local_cache",
    )
}

/// `LOCAL_CACHE_SIZE_IN_BYTES` with fixed windows: once Redis counts a key
/// over its limit, the next hits of that window are answered over the
/// limit here, with no Redis call and no count there (as the peer's cache
/// does), and counted in `over_limit` and `over_limit_with_local_cache`;
/// another key still goes to Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_over_limit_cache_answers_a_window_over_its_limit_without_redis() {
    let redis = RedisServer::start().expect("redis-server");
    let dir = user_limit("{ unit: day, requests_per_unit: 3 }");
    let mut h = start(cached(&dir, &redis, Algorithm::FixedWindow)).await;
    reset_redis_stats(&redis);
    let codes = h.codes("r", &[("user", "u")], 6).await;
    assert_eq!(codes, THREE_THEN_OVER);
    assert_eq!(
        redis_calls(&redis, "incrby"),
        4,
        "the last two hits made no call"
    );
    let mut conn = redis_client(&redis).await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    let key = format!("r_user_u_{}", now / 86_400 * 86_400);
    let count: u64 = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .expect("GET");
    assert_eq!(
        count, 4,
        "cached hits are not counted in Redis, as the peer's"
    );
    assert_eq!(cached_hits(&h).await, 2.0);
    assert_eq!(
        support::stat(&h.metrics().await, "r", "user", "over_limit"),
        3.0
    );
    assert_eq!(h.admitted("r", &[("user", "other")], 1).await, 1);
    assert_eq!(redis_calls(&redis, "incrby"), 5);
}

/// `LOCAL_CACHE_SIZE_IN_BYTES` with GCRA: a key Redis refused one hit is
/// refused here until its `retry_after`, with no call; the answer still
/// says how long until it passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_over_limit_cache_answers_a_refused_gcra_key_without_redis() {
    let redis = RedisServer::start().expect("redis-server");
    let dir = user_limit("{ unit: hour, requests_per_unit: 3 }");
    let mut h = start(cached(&dir, &redis, Algorithm::Gcra)).await;
    // Load the script (a first call may meet NOSCRIPT).
    assert_eq!(h.admitted("r", &[("user", "warm-up")], 1).await, 1);
    reset_redis_stats(&redis);
    let codes = h.codes("r", &[("user", "u")], 6).await;
    assert_eq!(codes, THREE_THEN_OVER);
    assert_eq!(
        redis_calls(&redis, "evalsha"),
        4,
        "the last two refusals made no call"
    );
    assert_eq!(cached_hits(&h).await, 2.0);
    let response = h
        .ask(support::request(
            "r",
            vec![support::descriptor(&[("user", "u")])],
        ))
        .await;
    let wait = response.statuses[0]
        .duration_until_reset
        .as_ref()
        .expect("a refusal says when");
    assert!(
        (1_000..=1_200).contains(&wait.seconds),
        "about 20 minutes: {wait:?}"
    );
    assert_eq!(redis_calls(&redis, "evalsha"), 4);
}

/// The cache is off unless `LOCAL_CACHE_SIZE_IN_BYTES` says a size, as the
/// peer's: read under the peer's name, 0 by default.
#[test]
fn the_over_limit_cache_is_the_peers_variable_and_off_by_default() {
    let read = |vars: &[(&str, &str)]| {
        turnstile_rls::Settings::parse_with_peer_env(["turnstile-rls"], |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        })
        .expect("settings")
        .local_cache_size_in_bytes
    };
    assert_eq!(read(&[]), 0);
    assert_eq!(read(&[("LOCAL_CACHE_SIZE_IN_BYTES", "1000")]), 1000);
}
