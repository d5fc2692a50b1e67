//! The tower layer over a `RedisLimiter`: two gateways (two axum servers,
//! each with its own limiter and connection) in front of one real
//! `redis-server`, asked by a real HTTP client over loopback. The quota is
//! the fleet's, not each gateway's, and Redis going away answers by the
//! limiter's failure policy. A fleet's multi-limit (`RedisMulti`) goes
//! behind the same layer.
#![cfg(all(feature = "tower", feature = "redis"))]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::Router;
use http::{HeaderName, StatusCode};
use turnstile_rl::http::{ClientIp, CostExtractor, KeyExtractor, RateLimitLayer};
use turnstile_rl::redis::{FailurePolicy, RedisLimiter, RedisMulti, TimeSource};
use turnstile_rl::{KeyedLimiter, ManualClock, Quota};

use http_server::serve;
use redis_server::{redis_cli, RedisServer};
use turnstile_test_kit::http_server;
use turnstile_test_kit::redis_server;

/// A gateway: one route behind the layer, keyed by `x-api-key`, on its own
/// `RedisLimiter`. Returns its base URL.
async fn gateway(redis: &RedisServer, quota: &str, policy: FailurePolicy) -> String {
    weighted_gateway(redis, quota, policy, None).await
}

/// [`gateway`], with each request's cost read by `cost` when given.
async fn weighted_gateway(
    redis: &RedisServer,
    quota: &str,
    policy: FailurePolicy,
    cost: Option<CostExtractor>,
) -> String {
    let quota: Quota = quota.parse().expect("quota");
    let limiter = RedisLimiter::builder(quota)
        .url(redis.url())
        .timeout(Duration::from_millis(200))
        .failure_policy(policy)
        .build()
        .await
        .expect("limiter");
    let mut layer = RateLimitLayer::builder(Arc::new(limiter))
        .name("fleet")
        .key(api_key());
    if let Some(cost) = cost {
        layer = layer.cost(cost);
    }
    let layer = layer.build().expect("layer");
    serve(Router::new().route("/", get(|| async { "hello" }).layer(layer))).await
}

/// Requests are keyed by their `x-api-key` header.
fn api_key() -> KeyExtractor {
    let peer =
        ClientIp::new().peer_addr_from(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0));
    KeyExtractor::header(HeaderName::from_static("x-api-key")).client_ip(peer)
}

async fn request(url: &str, api_key: &str) -> reqwest::Response {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
        .get(url)
        .header("x-api-key", api_key)
        .send()
        .await
        .expect("send")
}

fn header<'r>(response: &'r reqwest::Response, name: &str) -> Option<&'r str> {
    response
        .headers()
        .get(name)
        .map(|v| v.to_str().expect("ASCII"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_share_one_quota_through_redis() {
    let redis = RedisServer::start().expect("redis-server");
    let a = gateway(&redis, "3/min", FailurePolicy::FailOpen).await;
    let b = gateway(&redis, "3/min", FailurePolicy::FailOpen).await;

    // 3/min for the whole fleet: two from A, one from B, then both refuse.
    for (url, remaining) in [(&a, 2), (&a, 1), (&b, 0)] {
        let response = request(url, "k1").await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            header(&response, "ratelimit-policy"),
            Some("\"fleet\";q=3;w=60")
        );
        let expected = format!("\"fleet\";r={remaining};");
        let rate = header(&response, "ratelimit").expect("RateLimit header");
        assert!(rate.starts_with(&expected), "{rate}");
    }
    for url in [&a, &b] {
        let denied = request(url, "k1").await;
        assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
        // One token per 20 s; the server's clock moved a little since.
        let retry: u64 = header(&denied, "retry-after")
            .expect("Retry-After")
            .parse()
            .expect("delta-seconds");
        assert!((1..=20).contains(&retry), "Retry-After: {retry}");
        assert_eq!(
            header(&denied, "content-type"),
            Some("application/problem+json")
        );
    }
    // Another key has its own bucket, on either gateway.
    assert_eq!(request(&b, "k2").await.status(), StatusCode::OK);
}

/// Redis killed mid-run: each gateway answers by its failure policy. Open
/// and closed know no bucket: `RateLimit-Policy` but no `RateLimit` field
/// (issue 24: fail open used to send `r=0;t=0`, telling a client it
/// admitted to back off). A local fallback's answers describe its own
/// quota and bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_redis_answers_by_the_failure_policy() {
    const POLICY: Option<&str> = Some("\"fleet\";q=1;w=60");
    let mut redis = RedisServer::start().expect("redis-server");
    let open = gateway(&redis, "1/min", FailurePolicy::FailOpen).await;
    let closed = gateway(&redis, "1/min", FailurePolicy::FailClosed).await;
    let local = KeyedLimiter::new("2/min".parse().expect("quota"));
    let local = gateway(&redis, "1/min", FailurePolicy::Local(local)).await;
    // Redis decides: the fleet's state, in full.
    let first = request(&open, "k").await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(header(&first, "ratelimit-policy"), POLICY);
    assert_eq!(header(&first, "ratelimit"), Some("\"fleet\";r=0;t=60"));
    let second = request(&closed, "k").await;
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&second, "ratelimit"), Some("\"fleet\";r=0;t=60"));

    redis.kill();
    // The local fallback admits 2 a minute on its own, then refuses; its
    // answers describe the local quota (one token per 30 s), the limit
    // that decided, in every field (issue 37, item 3: they used to
    // advertise the fleet's q=1 next to the local Retry-After).
    let local_answers = [
        (StatusCode::OK, "\"fleet\";r=1;t=30", None),
        (StatusCode::OK, "\"fleet\";r=0;t=60", None),
        (
            StatusCode::TOO_MANY_REQUESTS,
            "\"fleet\";r=0;t=60",
            Some("30"),
        ),
    ];
    for (local_status, local_rate, local_retry) in local_answers {
        let admitted = request(&open, "fresh").await;
        assert_eq!(admitted.status(), StatusCode::OK);
        assert_eq!(header(&admitted, "ratelimit-policy"), POLICY);
        assert_eq!(header(&admitted, "ratelimit"), None);
        assert_eq!(header(&admitted, "retry-after"), None);

        let refused = request(&closed, "fresh").await;
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(header(&refused, "ratelimit-policy"), POLICY);
        assert_eq!(header(&refused, "ratelimit"), None);
        assert!(header(&refused, "retry-after").is_some());

        let fallback = request(&local, "fresh").await;
        assert_eq!(fallback.status(), local_status);
        assert_eq!(
            header(&fallback, "ratelimit-policy"),
            Some("\"fleet\";q=2;w=60")
        );
        assert_eq!(header(&fallback, "ratelimit"), Some(local_rate));
        assert_eq!(header(&fallback, "retry-after"), local_retry);
    }
}

/// A gateway whose layer is named `search` over a `RedisMulti` of
/// `2/min; 3/h` (client time on `clock`, failing open), keyed by
/// `x-api-key`: its limiter (for the shared metrics), the multi-limit (to
/// change or inspect while serving) and the gateway's base URL.
async fn multi_gateway(
    redis: &RedisServer,
    clock: &ManualClock,
) -> (RedisLimiter, Arc<RedisMulti>, String) {
    let limiter = RedisLimiter::builder("1/s".parse().expect("quota"))
        .url(redis.url())
        .timeout(Duration::from_millis(500))
        .time_source(TimeSource::Client(Arc::new(clock.clone())))
        .failure_policy(FailurePolicy::FailOpen)
        .build()
        .await
        .expect("limiter");
    let multi = Arc::new(
        limiter
            .multi("2/min; 3/h".parse().expect("quotas"))
            .expect("multi"),
    );
    let layer = RateLimitLayer::builder(Arc::clone(&multi))
        .name("search")
        .key(api_key())
        .build()
        .expect("layer");
    let url = serve(Router::new().route("/", get(|| async { "hello" }).layer(layer))).await;
    (limiter, multi, url)
}

/// A fleet's multi-limit behind the layer (issue 24: `RedisMulti` had no
/// `Limiter` impl): the scenario of the local `KeyedMultiLimiter` in
/// `tests/http_layer.rs`, from a real redis-server on a manual clock
/// (client time), with per-minute and per-hour limits so that buckets
/// outlive a slow machine (their expiry runs in Redis's real time). Then
/// Redis is killed, and the limiter's failure policy answers, without a
/// `RateLimit` field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_multi_limit_behind_the_layer_names_the_binding_limit() {
    let mut redis = RedisServer::start().expect("redis-server");
    let clock = ManualClock::starting_at(Duration::from_secs(1_000));
    let (limiter, multi, url) = multi_gateway(&redis, &clock).await;
    let policy = Some("\"search-0\";q=2;w=60, \"search-1\";q=3;w=3600");
    // The first limit's bucket in Redis (a header's key is `key:` and its
    // value): a denied request must not move it.
    let first_key = String::from_utf8(multi.redis_keys(b"key:k1")[0].clone()).expect("UTF-8");
    let first_tat = || redis_cli(redis.port(), &["GET", &first_key]).expect("redis-cli");

    // Two admitted: the first limit (one token per 30 s) binds.
    for rate in ["\"search-0\";r=1;t=30", "\"search-0\";r=0;t=60"] {
        let response = request(&url, "k1").await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(header(&response, "ratelimit-policy"), policy);
        assert_eq!(header(&response, "ratelimit"), Some(rate));
        assert_eq!(header(&response, "retry-after"), None);
    }
    // The first limit, the tightest, is spent: 429 naming it.
    let denied = request(&url, "k1").await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&denied, "ratelimit-policy"), policy);
    assert_eq!(header(&denied, "ratelimit"), Some("\"search-0\";r=0;t=60"));
    assert_eq!(header(&denied, "retry-after"), Some("30"));
    let body: serde_json::Value = denied.json().await.expect("json");
    assert_eq!(body["policy"], "search-0");

    // A minute later the first limit is full again; the second has one
    // token left (one per 20 min), this request takes it, and it binds.
    clock.advance(Duration::from_secs(60));
    let response = request(&url, "k1").await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        header(&response, "ratelimit"),
        Some("\"search-1\";r=0;t=3540")
    );
    let before = first_tat();
    assert!(!before.trim().is_empty(), "no bucket at {first_key}");
    let denied = request(&url, "k1").await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&denied, "ratelimit"),
        Some("\"search-1\";r=0;t=3540")
    );
    assert_eq!(header(&denied, "retry-after"), Some("1140"));
    assert_eq!(first_tat(), before, "the denied request charged limit 0");
    let m = limiter.metrics();
    assert_eq!(
        (m.allowed, m.denied, m.fallback_decisions),
        (3, 2, 0),
        "{m:?}"
    );

    // Redis killed: the limiter's policy (open) admits, and the headers
    // give the policy but no state.
    redis.kill();
    let response = request(&url, "k1").await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(header(&response, "ratelimit-policy"), policy);
    assert_eq!(header(&response, "ratelimit"), None);
    assert_eq!(limiter.metrics().fallback_decisions, 1);
}

/// A fleet's quota changed while the gateway serves (`set_quota` through
/// the `Arc` the layer shares): the next response's `RateLimit-Policy`
/// says the new quota, its `RateLimit` counts against it, and the
/// decisions follow it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_changed_on_a_serving_redis_gateway_shows_on_the_next_response() {
    let redis = RedisServer::start().expect("redis-server");
    let limiter = Arc::new(
        RedisLimiter::builder("3/min".parse().expect("quota"))
            .url(redis.url())
            .timeout(Duration::from_millis(200))
            .build()
            .await
            .expect("limiter"),
    );
    let layer = RateLimitLayer::builder(Arc::clone(&limiter))
        .name("fleet")
        .key(api_key())
        .build()
        .expect("layer");
    let url = serve(Router::new().route("/", get(|| async { "hello" }).layer(layer))).await;

    let response = request(&url, "k1").await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        header(&response, "ratelimit-policy"),
        Some("\"fleet\";q=3;w=60")
    );
    assert_eq!(header(&response, "ratelimit"), Some("\"fleet\";r=2;t=20"));

    // 30 a minute from now on. A change keeps each bucket's state (the
    // time it is full again, see `Quota`'s docs): the 20 s the first
    // request cost under 3/min are 10 tokens of 30/min, so this request
    // leaves 19 (20 on a machine that took over 2 s between the two).
    limiter
        .set_quota("30/min".parse().expect("quota"))
        .expect("set_quota");
    let response = request(&url, "k1").await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        header(&response, "ratelimit-policy"),
        Some("\"fleet\";q=30;w=60")
    );
    let rate = header(&response, "ratelimit").expect("RateLimit");
    let remaining: u64 = rate
        .split(';')
        .find_map(|p| p.strip_prefix("r="))
        .and_then(|r| r.parse().ok())
        .expect("r=");
    assert!((19..=20).contains(&remaining), "{rate} under q=30");

    // Down to 1/min: the bucket is far past one token's worth, so denied.
    limiter
        .set_quota("1/min".parse().expect("quota"))
        .expect("set_quota");
    let response = request(&url, "k1").await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&response, "ratelimit-policy"),
        Some("\"fleet\";q=1;w=60")
    );
    assert!(header(&response, "retry-after").is_some());
}

/// The `q` that `RateLimit-Policy` gives the policy `RateLimit` names, and
/// the `r` beside it: a client checks one against the other.
fn remaining_and_quota(response: &reqwest::Response) -> (u64, u64) {
    let rate = header(response, "ratelimit").expect("RateLimit");
    let (name, params) = rate.split_once(';').expect("name;params");
    let param = |list: &str, key: &str| -> u64 {
        list.split(';')
            .find_map(|p| p.trim().strip_prefix(key))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{key} in {list}"))
    };
    let policy = header(response, "ratelimit-policy").expect("RateLimit-Policy");
    let item = policy
        .split(',')
        .map(str::trim)
        .find(|item| item.starts_with(&format!("{name};")))
        .unwrap_or_else(|| panic!("{name} in {policy}"));
    (param(params, "r="), param(item, "q="))
}

/// A fleet's multi-limit changed while the gateway serves (`set_quotas`
/// through the `Arc` the layer shares, issue 24 item 1 on Redis): the next
/// response's `RateLimit-Policy` lists the new quotas, its `RateLimit`
/// counts the binding limit against them (`r <= q`), and each bucket in
/// Redis kept its state across the change (keyed by the limit's position,
/// not its quota). A change to another number of limits is refused and
/// changes nothing a client sees. Client time on a manual clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_multi_limit_changed_while_serving_shows_on_the_next_response() {
    let redis = RedisServer::start().expect("redis-server");
    let clock = ManualClock::starting_at(Duration::from_secs(1_000));
    let (_limiter, multi, url) = multi_gateway(&redis, &clock).await;
    let first_key = String::from_utf8(multi.redis_keys(b"key:k1")[0].clone()).expect("UTF-8");
    assert!(first_key.ends_with("{key:k1}:0"), "{first_key}");

    let response = request(&url, "k1").await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        header(&response, "ratelimit-policy"),
        Some("\"search-0\";q=2;w=60, \"search-1\";q=3;w=3600")
    );
    assert_eq!(
        header(&response, "ratelimit"),
        Some("\"search-0\";r=1;t=30")
    );
    let tat = redis_cli(redis.port(), &["GET", &first_key]).expect("redis-cli");

    // Doubled while serving. Each bucket keeps its state: limit 0 is full
    // again 30 s from now, which under 4/min (T = 15 s, tau = 60 s) is two
    // tokens owed, so this request leaves 1 (fresh buckets would leave 3);
    // limit 1 owes 20 min, two of 6/h's tokens, and leaves 3.
    multi
        .set_quotas("4/min; 6/h".parse().expect("quotas"))
        .expect("set_quotas");
    assert_eq!(multi.quota_version(), 1);
    assert_eq!(
        redis_cli(redis.port(), &["GET", &first_key]).expect("redis-cli"),
        tat,
        "a change writes nothing to Redis"
    );
    let response = request(&url, "k1").await;
    assert_eq!(response.status(), StatusCode::OK);
    let changed = Some("\"search-0\";q=4;w=60, \"search-1\";q=6;w=3600");
    assert_eq!(header(&response, "ratelimit-policy"), changed);
    assert_eq!(
        header(&response, "ratelimit"),
        Some("\"search-0\";r=1;t=45")
    );
    let (r, q) = remaining_and_quota(&response);
    assert!(r <= q, "r={r} beside q={q}");

    // Another number of limits: refused, and the next response is the same
    // policy at the same state (one more token of limit 0 spent: 30 s).
    assert!(multi.set_quotas("5/min".parse().expect("quota")).is_err());
    assert_eq!(multi.quota_version(), 1);
    assert_eq!(multi.quotas(), "4/min; 6/h".parse().expect("quotas"));
    let response = request(&url, "k1").await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(header(&response, "ratelimit-policy"), changed);
    assert_eq!(
        header(&response, "ratelimit"),
        Some("\"search-0\";r=0;t=60")
    );

    // Down to 1/min on limit 0 (T = tau = 60 s): the 60 s owed are the
    // whole new burst, so denied, told to come back in one T.
    multi
        .set_quotas("1/min; 6/h".parse().expect("quotas"))
        .expect("set_quotas");
    let response = request(&url, "k1").await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&response, "ratelimit-policy"),
        Some("\"search-0\";q=1;w=60, \"search-1\";q=6;w=3600")
    );
    assert_eq!(
        header(&response, "ratelimit"),
        Some("\"search-0\";r=0;t=60")
    );
    assert_eq!(header(&response, "retry-after"), Some("60"));
    let (r, q) = remaining_and_quota(&response);
    assert!(r <= q, "r={r} beside q={q}");
    clock.advance(Duration::from_secs(60));
    let response = request(&url, "k1").await;
    assert_eq!(
        response.status(),
        StatusCode::OK,
        "admitted after the advertised wait"
    );
    assert_eq!(
        header(&response, "ratelimit"),
        Some("\"search-0\";r=0;t=60")
    );
}

/// A cost the fleet's quota can meet but the local fallback's cannot is
/// denied as fail closed denies, and described as fail closed is: the
/// fleet's policy, no `RateLimit` (no local bucket decided it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_above_the_local_burst_is_described_as_fail_closed() {
    let mut redis = RedisServer::start().expect("redis-server");
    let local = KeyedLimiter::new("2/min".parse().expect("quota"));
    let cost = CostExtractor::header(HeaderName::from_static("x-cost"));
    let policy = FailurePolicy::Local(local);
    let url = weighted_gateway(&redis, "10/min", policy, Some(cost)).await;
    redis.kill();
    let send = |cost: &'static str| {
        let url = url.clone();
        async move {
            reqwest::Client::builder()
                .no_proxy()
                .build()
                .expect("client")
                .get(url)
                .header("x-api-key", "k")
                .header("x-cost", cost)
                .send()
                .await
                .expect("send")
        }
    };
    let big = send("5").await;
    assert_eq!(big.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&big, "ratelimit-policy"),
        Some("\"fleet\";q=10;w=60")
    );
    assert_eq!(header(&big, "ratelimit"), None);
    // A cost the local bucket holds is the local limit's, in every field.
    let small = send("1").await;
    assert_eq!(small.status(), StatusCode::OK);
    assert_eq!(
        header(&small, "ratelimit-policy"),
        Some("\"fleet\";q=2;w=60")
    );
    assert_eq!(header(&small, "ratelimit"), Some("\"fleet\";r=1;t=30"));
}
