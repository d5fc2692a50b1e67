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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_window_needs_the_in_process_backend() {
    let redis = RedisServer::start().expect("redis-server");
    let dir = ConfigDir::with(
        "r.yaml",
        "domain: r\ndescriptors:\n  - key: w\n    rate_limit: { unit: hour, requests_per_unit: 3, algorithm: fixed_window }\n",
    );
    let mut settings = settings(&dir);
    settings.backend = BackendName::Redis;
    settings.redis_url = redis.url();
    let error = turnstile_rls::start(settings).await.expect_err("refused");
    assert!(error.to_string().contains("in-process backend"), "{error}");
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
