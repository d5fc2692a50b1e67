//! The tower layer behind a real axum server, asked by a real HTTP client
//! over loopback: exact statuses, headers and bodies on a manual clock.
#![cfg(feature = "tower")]

use std::future::{ready, Ready};
use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::http::{HeaderName, StatusCode};
use axum::routing::get;
use axum::Router;
use reqwest::header::HeaderValue;
use turnstile_rl::http::{
    ClientIp, CostExtractor, HttpKey, KeyExtractor, LayerError, Limiter, OnBadKey, OnLimiterError,
    RateLimitLayer,
};
use turnstile_rl::{CostError, KeyedLimiter, KeyedMultiLimiter, ManualClock, MultiDecision, Quota};

use http_server::serve;
use turnstile_test_kit::http_server;

type Manual = KeyedLimiter<HttpKey, ManualClock>;
/// Request headers as (name, raw bytes).
type Headers<'a> = &'a [(&'a str, &'a [u8])];

fn manual(quota: &str) -> (Manual, ManualClock) {
    let clock = ManualClock::new();
    let quota: Quota = quota.parse().expect("quota");
    (
        KeyedLimiter::builder(quota).clock(clock.clone()).build(),
        clock,
    )
}

/// axum gives the peer address as `ConnectInfo`.
fn axum_peer() -> ClientIp {
    ClientIp::new().peer_addr_from(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0))
}

fn api_key() -> KeyExtractor {
    KeyExtractor::header(HeaderName::from_static("x-api-key")).client_ip(axum_peer())
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
}

fn header<'r>(response: &'r reqwest::Response, name: &str) -> Option<&'r str> {
    response
        .headers()
        .get(name)
        .map(|v| v.to_str().expect("ASCII"))
}

async fn get_with(url: &str, headers: &[(&str, &[u8])]) -> reqwest::Response {
    let mut request = client().get(url);
    for (name, value) in headers {
        request = request.header(*name, HeaderValue::from_bytes(value).expect("value"));
    }
    request.send().await.expect("send")
}

fn one_route<L: Limiter>(layer: RateLimitLayer<L>) -> Router {
    Router::new().route("/", get(|| async { "hello" }).layer(layer))
}

#[tokio::test]
async fn allowed_and_denied_answers_carry_exact_headers() {
    let (limiter, clock) = manual("3/min");
    let layer = RateLimitLayer::builder(limiter)
        .name("api")
        .key(api_key())
        .x_ratelimit_headers(true)
        .build()
        .expect("layer");
    let url = serve(one_route(layer)).await;
    let k1: &[(&str, &[u8])] = &[("x-api-key", b"k1")];

    // 3/min: one token per 20 s, a bucket of 3 (60 s).
    for (remaining, reset) in [(2, 20), (1, 40), (0, 60)] {
        let response = get_with(&url, k1).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            header(&response, "ratelimit-policy"),
            Some("\"api\";q=3;w=60")
        );
        let rate = format!("\"api\";r={remaining};t={reset}");
        assert_eq!(header(&response, "ratelimit"), Some(rate.as_str()));
        assert_eq!(header(&response, "x-ratelimit-limit"), Some("3"));
        let remaining = remaining.to_string();
        assert_eq!(
            header(&response, "x-ratelimit-remaining"),
            Some(remaining.as_str())
        );
        let reset = reset.to_string();
        assert_eq!(header(&response, "x-ratelimit-reset"), Some(reset.as_str()));
        assert_eq!(header(&response, "retry-after"), None);
        assert_eq!(response.text().await.expect("body"), "hello");
    }

    let denied = get_with(&url, k1).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&denied, "retry-after"), Some("20"));
    assert_eq!(header(&denied, "ratelimit"), Some("\"api\";r=0;t=60"));
    assert_eq!(
        header(&denied, "ratelimit-policy"),
        Some("\"api\";q=3;w=60")
    );
    assert_eq!(header(&denied, "x-ratelimit-remaining"), Some("0"));
    assert_eq!(
        header(&denied, "content-type"),
        Some("application/problem+json")
    );
    let body: serde_json::Value = denied.json().await.expect("json");
    assert_eq!(
        body,
        serde_json::json!({
            "type": "about:blank",
            "title": "Too Many Requests",
            "status": 429,
            "detail": "rate limit \"api\" exceeded; retry after 20 s",
            "policy": "api",
            "retry_after": 20,
        })
    );

    // Another key has its own bucket.
    let other = get_with(&url, &[("x-api-key", b"k2")]).await;
    assert_eq!(other.status(), StatusCode::OK);
    assert_eq!(header(&other, "ratelimit"), Some("\"api\";r=2;t=20"));

    // Half a second short of the wait: Retry-After rounds up, to 1, not 0.
    clock.advance(Duration::from_millis(19_500));
    let almost = get_with(&url, k1).await;
    assert_eq!(almost.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&almost, "retry-after"), Some("1"));
    assert_eq!(header(&almost, "ratelimit"), Some("\"api\";r=0;t=41"));

    // Waiting exactly what Retry-After said is enough.
    clock.advance(Duration::from_millis(500));
    let again = get_with(&url, k1).await;
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(header(&again, "ratelimit"), Some("\"api\";r=0;t=60"));
}

#[tokio::test]
async fn each_route_has_its_own_layer_and_quota() {
    let (login, _) = manual("5/min");
    let (api, _) = manual("100/min");
    let login = RateLimitLayer::builder(login)
        .name("login")
        .key(KeyExtractor::peer_ip().client_ip(axum_peer()))
        .build()
        .expect("login layer");
    let api = RateLimitLayer::builder(api)
        .name("api")
        .key(api_key())
        .build()
        .expect("api layer");
    let app = Router::new()
        .route("/login", get(|| async { "welcome" }).layer(login))
        .route("/api", get(|| async { "data" }).layer(api))
        .route("/health", get(|| async { "ok" }));
    let url = serve(app).await;

    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(get_with(&format!("{url}/login"), &[]).await.status());
    }
    assert_eq!(statuses[..5], [StatusCode::OK; 5]);
    assert_eq!(statuses[5], StatusCode::TOO_MANY_REQUESTS);

    let api = get_with(&format!("{url}/api"), &[("x-api-key", b"k1")]).await;
    assert_eq!(api.status(), StatusCode::OK);
    assert_eq!(header(&api, "ratelimit-policy"), Some("\"api\";q=100;w=60"));
    assert_eq!(header(&api, "ratelimit"), Some("\"api\";r=99;t=1"));

    let health = get_with(&format!("{url}/health"), &[]).await;
    assert_eq!(health.status(), StatusCode::OK);
    assert_eq!(header(&health, "ratelimit"), None);
}

/// A server keyed by client address, 1 request a minute, trusting `trust`.
async fn by_ip(trust: &str, ipv6_prefix: u8, on_bad_key: OnBadKey) -> String {
    let (limiter, _) = manual("1/min");
    let client_ip = axum_peer()
        .trust([trust.parse().expect("net")])
        .ipv6_prefix(ipv6_prefix);
    let layer = RateLimitLayer::builder(limiter)
        .key(
            KeyExtractor::peer_ip()
                .client_ip(client_ip)
                .on_bad_key(on_bad_key),
        )
        .build()
        .expect("layer");
    serve(one_route(layer)).await
}

async fn status(url: &str, headers: &[(&str, &[u8])]) -> StatusCode {
    get_with(url, headers).await.status()
}

/// Sends the requests in order; each must get its status.
async fn expect_statuses(url: &str, requests: &[(Headers<'_>, StatusCode)]) {
    for (i, (headers, want)) in requests.iter().enumerate() {
        assert_eq!(
            status(url, headers).await,
            *want,
            "request {i}: {headers:?}"
        );
    }
}

#[tokio::test]
async fn forwarded_headers_count_only_from_trusted_proxies() {
    const OK: StatusCode = StatusCode::OK;
    const DENIED: StatusCode = StatusCode::TOO_MANY_REQUESTS;
    let a: &[(&str, &[u8])] = &[("x-forwarded-for", b"198.51.100.1")];
    let b: &[(&str, &[u8])] = &[("x-forwarded-for", b"198.51.100.2")];
    let c: &[(&str, &[u8])] = &[("forwarded", b"for=198.51.100.3;proto=http")];

    // Loopback is a trusted proxy here: each forwarded client has a bucket.
    let trusted = by_ip("127.0.0.0/8", 64, OnBadKey::default()).await;
    assert_eq!(status(&trusted, a).await, OK);
    assert_eq!(status(&trusted, b).await, OK);
    assert_eq!(status(&trusted, c).await, OK);
    assert_eq!(status(&trusted, a).await, DENIED);
    // No header: the proxy's own address.
    assert_eq!(status(&trusted, &[]).await, OK);
    assert_eq!(status(&trusted, &[]).await, DENIED);

    // Loopback is not trusted: the headers are ignored, all is 127.0.0.1.
    let untrusted = by_ip("10.0.0.0/8", 64, OnBadKey::default()).await;
    assert_eq!(status(&untrusted, a).await, OK);
    assert_eq!(status(&untrusted, b).await, DENIED);
    assert_eq!(status(&untrusted, c).await, DENIED);
    assert_eq!(status(&untrusted, &[]).await, DENIED);
}

#[tokio::test]
async fn ipv6_clients_share_a_bucket_per_prefix() {
    const OK: StatusCode = StatusCode::OK;
    const DENIED: StatusCode = StatusCode::TOO_MANY_REQUESTS;
    let xff = |v: &'static [u8]| [("x-forwarded-for", v)];

    let per_64 = by_ip("127.0.0.0/8", 64, OnBadKey::default()).await;
    assert_eq!(status(&per_64, &xff(b"2001:db8:1:2::1")).await, OK);
    // Same /64: the same bucket, whatever the interface id.
    assert_eq!(status(&per_64, &xff(b"2001:db8:1:2:ffff::9")).await, DENIED);
    assert_eq!(
        status(&per_64, &xff(b"[2001:db8:1:2::7]:443")).await,
        DENIED
    );
    // Next /64: its own.
    assert_eq!(status(&per_64, &xff(b"2001:db8:1:3::1")).await, OK);

    let per_128 = by_ip("127.0.0.0/8", 128, OnBadKey::default()).await;
    assert_eq!(status(&per_128, &xff(b"2001:db8:1:2::1")).await, OK);
    assert_eq!(status(&per_128, &xff(b"2001:db8:1:2::2")).await, OK);
    assert_eq!(status(&per_128, &xff(b"2001:db8:1:2::1")).await, DENIED);
}

async fn problem(response: reqwest::Response) -> (StatusCode, serde_json::Value) {
    let status = response.status();
    assert_eq!(
        header(&response, "content-type"),
        Some("application/problem+json")
    );
    (status, response.json().await.expect("json"))
}

#[tokio::test]
async fn bad_keys_are_refused_or_fall_back_never_panic() {
    let (limiter, _) = manual("1/min");
    let layer = RateLimitLayer::builder(limiter)
        .name("api")
        .key(api_key().max_len(64))
        .build()
        .expect("layer");
    let url = serve(one_route(layer)).await;
    let long = [b'k'; 65];
    let cases: [(Headers, &str); 4] = [
        (&[], "missing header \"x-api-key\""),
        (&[("x-api-key", b"   ")], "missing header \"x-api-key\""),
        (
            &[("x-api-key", b"k\xe9y")],
            "header \"x-api-key\" is not visible ASCII text",
        ),
        (
            &[("x-api-key", &long)],
            "header \"x-api-key\" is 65 bytes long, more than the 64 accepted",
        ),
    ];
    for (headers, detail) in cases {
        let (status, body) = problem(get_with(&url, headers).await).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{detail}");
        assert_eq!(body["status"], 400);
        assert_eq!(body["title"], "Bad Request");
        assert_eq!(body["detail"], detail);
    }

    // Fallback: a request without a key counts against its address.
    let (limiter, _) = manual("1/min");
    let layer = RateLimitLayer::builder(limiter)
        .key(api_key().on_bad_key(OnBadKey::PeerIp))
        .build()
        .expect("layer");
    let url = serve(one_route(layer)).await;
    expect_statuses(
        &url,
        &[
            (&[], StatusCode::OK),
            (&[("x-api-key", b"k\xe9y")], StatusCode::TOO_MANY_REQUESTS),
            (&[("x-api-key", b"good")], StatusCode::OK),
        ],
    )
    .await;

    // A garbage forwarded header from a trusted proxy: refused...
    let garbage: &[&[u8]] = &[
        b"not an address",
        b"unknownx",
        b"1.2.3.4:99999",
        b"\xff",
        b",",
    ];
    let strict = by_ip("127.0.0.0/8", 64, OnBadKey::default()).await;
    for value in garbage {
        let (status, body) = problem(get_with(&strict, &[("x-forwarded-for", value)]).await).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{value:?}");
        let detail = body["detail"].as_str().expect("detail");
        assert!(
            detail.starts_with("unreadable x-forwarded-for header"),
            "{detail}"
        );
    }
    let rfc = get_with(&strict, &[("forwarded", b"for=secret")]).await;
    assert_eq!(rfc.status(), StatusCode::BAD_REQUEST);
    // ... or, with the fallback, counted against the proxy's own address.
    let lenient = by_ip("127.0.0.0/8", 64, OnBadKey::PeerIp).await;
    let junk: Headers = &[("x-forwarded-for", b"junk")];
    expect_statuses(
        &lenient,
        &[
            (junk, StatusCode::OK),
            (junk, StatusCode::TOO_MANY_REQUESTS),
            (&[], StatusCode::TOO_MANY_REQUESTS),
        ],
    )
    .await;
}

#[tokio::test]
async fn a_server_without_peer_addresses_gets_500() {
    let (limiter, _) = manual("1/min");
    let layer = RateLimitLayer::builder(limiter)
        .key(KeyExtractor::peer_ip().on_bad_key(OnBadKey::PeerIp))
        .build()
        .expect("layer");
    // Served without connect info, and ClientIp not told where to look.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, one_route(layer)).await });
    let (status, body) = problem(get_with(&url, &[]).await).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    let detail = body["detail"].as_str().expect("detail");
    assert!(detail.contains("cannot see the peer address"), "{detail}");
    // The fix it names is one the user has not already made.
    assert!(
        detail.contains("into_make_service_with_connect_info"),
        "{detail}"
    );
    #[cfg(not(feature = "axum"))]
    assert!(
        detail.contains("enable turnstile's \"axum\" feature"),
        "{detail}"
    );
}

/// A limiter whose store is always down.
struct Down;

#[derive(Debug, thiserror::Error)]
#[error("store unreachable")]
struct StoreDown;

impl Limiter for Down {
    type Error = StoreDown;
    type Future = Ready<Result<MultiDecision, StoreDown>>;

    fn check(&self, _key: &HttpKey) -> Self::Future {
        ready(Err(StoreDown))
    }

    fn check_n(&self, key: &HttpKey, _cost: u64) -> Result<Self::Future, CostError> {
        Ok(self.check(key))
    }

    fn quota(&self) -> Quota {
        Quota::per_minute(10).expect("quota")
    }
}

#[tokio::test]
async fn a_failing_limiter_follows_the_failure_policy() {
    let closed = RateLimitLayer::builder(Down)
        .key(api_key())
        .build()
        .expect("layer");
    let url = serve(one_route(closed)).await;
    let (status, body) = problem(get_with(&url, &[("x-api-key", b"k")]).await).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        body["detail"],
        "rate limiter unavailable: store unreachable"
    );

    let open = RateLimitLayer::builder(Down)
        .key(api_key())
        .on_limiter_error(OnLimiterError::Allow)
        .build()
        .expect("layer");
    let url = serve(one_route(open)).await;
    let response = get_with(&url, &[("x-api-key", b"k")]).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(header(&response, "ratelimit"), None);
    assert_eq!(response.text().await.expect("body"), "hello");
}

#[test]
fn policy_names_that_cannot_be_headers_are_errors() {
    let (limiter, _) = manual("1/min");
    let error = RateLimitLayer::builder(limiter)
        .name("caf\u{e9}")
        .build()
        .expect_err("non-ASCII name");
    assert!(
        matches!(&error, LayerError::BadName { name, character: '\u{e9}' } if name == "caf\u{e9}"),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "the policy name \"caf\u{e9}\" cannot go in a RateLimit header: '\u{e9}' is not printable ASCII"
    );
}

#[derive(Clone)]
struct UserId(String);

/// A stand-in for an authentication layer: `x-user` becomes a `UserId`.
async fn fake_auth(
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    if let Some(user) = request
        .headers()
        .get("x-user")
        .and_then(|v| v.to_str().ok())
    {
        let user = UserId(user.to_owned());
        request.extensions_mut().insert(user);
    }
    next.run(request).await
}

#[tokio::test]
async fn user_ids_from_an_auth_layer_and_custom_keys() {
    let (limiter, _) = manual("1/min");
    let by_user = RateLimitLayer::builder(limiter)
        .key(
            KeyExtractor::extension(|user: &UserId| user.0.clone())
                .on_bad_key(OnBadKey::Reject(StatusCode::UNAUTHORIZED)),
        )
        .build()
        .expect("layer");
    // The auth layer is outside (added last), so it runs first.
    let app = one_route(by_user).layer(axum::middleware::from_fn(fake_auth));
    let url = serve(app).await;
    assert_eq!(status(&url, &[("x-user", b"alice")]).await, StatusCode::OK);
    assert_eq!(status(&url, &[("x-user", b"bob")]).await, StatusCode::OK);
    assert_eq!(
        status(&url, &[("x-user", b"alice")]).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    let (code, body) = problem(get_with(&url, &[]).await).await;
    assert_eq!(code, StatusCode::UNAUTHORIZED);
    let detail = body["detail"].as_str().expect("detail");
    assert!(detail.starts_with("missing extension"), "{detail}");

    // A custom closure: the tenant comes from the query string.
    let (limiter, _) = manual("1/min");
    let by_tenant = RateLimitLayer::builder(limiter)
        .key(KeyExtractor::custom(|parts| {
            match parts.uri.query().and_then(|q| q.strip_prefix("tenant=")) {
                Some(tenant) if !tenant.is_empty() => Ok(HttpKey::new(tenant.to_owned())),
                _ => Err(turnstile_rl::http::KeyError::Rejected("no tenant".into())),
            }
        }))
        .build()
        .expect("layer");
    let url = serve(one_route(by_tenant)).await;
    assert_eq!(
        status(&format!("{url}/?tenant=a"), &[]).await,
        StatusCode::OK
    );
    assert_eq!(
        status(&format!("{url}/?tenant=b"), &[]).await,
        StatusCode::OK
    );
    assert_eq!(
        status(&format!("{url}/?tenant=a"), &[]).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    let (code, body) = problem(get_with(&format!("{url}/?x=1"), &[]).await).await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert_eq!(body["detail"], "no tenant");
}

#[tokio::test]
async fn a_direct_limiter_is_one_budget_and_an_arc_shares_one_across_routes() {
    let clock = ManualClock::new();
    let global = turnstile_rl::DirectLimiter::builder("2/min".parse().expect("quota"))
        .clock(clock)
        .build();
    let layer = RateLimitLayer::builder(global)
        .name("global")
        .key(api_key())
        .build()
        .expect("layer");
    let url = serve(one_route(layer)).await;
    assert_eq!(status(&url, &[("x-api-key", b"a")]).await, StatusCode::OK);
    assert_eq!(status(&url, &[("x-api-key", b"b")]).await, StatusCode::OK);
    let denied = get_with(&url, &[("x-api-key", b"c")]).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&denied, "ratelimit-policy"),
        Some("\"global\";q=2;w=60")
    );
    assert_eq!(header(&denied, "retry-after"), Some("30"));

    let (shared, _) = manual("2/min");
    let shared = std::sync::Arc::new(shared);
    let layer = |name: &str| {
        RateLimitLayer::builder(std::sync::Arc::clone(&shared))
            .name(name)
            .key(api_key())
            .build()
            .expect("layer")
    };
    let app = Router::new()
        .route("/a", get(|| async { "a" }).layer(layer("a")))
        .route("/b", get(|| async { "b" }).layer(layer("b")));
    let url = serve(app).await;
    let k: Headers = &[("x-api-key", b"k")];
    assert_eq!(status(&format!("{url}/a"), k).await, StatusCode::OK);
    assert_eq!(status(&format!("{url}/b"), k).await, StatusCode::OK);
    assert_eq!(
        status(&format!("{url}/a"), k).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        status(&format!("{url}/b"), k).await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// Issue 14, item 1: the default key (client address) under axum's own
/// `into_make_service_with_connect_info`, with no `peer_addr_from` call.
#[cfg(feature = "axum")]
#[tokio::test]
async fn the_default_key_reads_axums_connect_info() {
    let (limiter, _) = manual("1/min");
    let layer = RateLimitLayer::builder(limiter)
        .name("login")
        .build()
        .expect("layer");
    // `serve` runs axum's `into_make_service_with_connect_info::<SocketAddr>()`.
    let url = serve(one_route(layer)).await;
    let first = get_with(&url, &[]).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(header(&first, "ratelimit"), Some("\"login\";r=0;t=60"));
    assert_eq!(status(&url, &[]).await, StatusCode::TOO_MANY_REQUESTS);
}

/// Issue 14, item 1: a global budget needs no peer address at all, even
/// on a server started without connect info.
#[tokio::test]
async fn a_global_key_is_one_budget_without_peer_addresses() {
    let clock = ManualClock::new();
    let global = turnstile_rl::DirectLimiter::builder("2/min".parse().expect("quota"))
        .clock(clock)
        .build();
    let layer = RateLimitLayer::builder(global)
        .name("global")
        .key(KeyExtractor::global())
        .build()
        .expect("layer");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, one_route(layer)).await });
    assert_eq!(status(&url, &[]).await, StatusCode::OK);
    assert_eq!(status(&url, &[("x-api-key", b"b")]).await, StatusCode::OK);
    assert_eq!(status(&url, &[]).await, StatusCode::TOO_MANY_REQUESTS);
}

/// Issue 14, item 3: two stacked layers append their items; the denial's
/// `Retry-After` and body name the policy that denied.
#[tokio::test]
async fn stacked_layers_append_and_the_denial_is_consistent() {
    let (hourly, _) = manual("10/h");
    let (burst, _) = manual("1/min");
    let outer = RateLimitLayer::builder(hourly)
        .name("hourly")
        .key(api_key())
        .x_ratelimit_headers(true)
        .build()
        .expect("outer");
    let inner = RateLimitLayer::builder(burst)
        .name("burst")
        .key(api_key())
        .x_ratelimit_headers(true)
        .build()
        .expect("inner");
    let app = Router::new().route(
        "/",
        get(|| async { "hello" })
            .route_layer(inner)
            .route_layer(outer),
    );
    let url = serve(app).await;
    let k: Headers = &[("x-api-key", b"k")];
    let all = |response: &reqwest::Response, name: &str| -> Vec<String> {
        response
            .headers()
            .get_all(name)
            .iter()
            .map(|v| v.to_str().expect("ASCII").to_owned())
            .collect()
    };

    let allowed = get_with(&url, k).await;
    assert_eq!(allowed.status(), StatusCode::OK);
    assert_eq!(
        all(&allowed, "ratelimit-policy"),
        ["\"burst\";q=1;w=60", "\"hourly\";q=10;w=3600"]
    );
    assert_eq!(
        all(&allowed, "ratelimit"),
        ["\"burst\";r=0;t=60", "\"hourly\";r=9;t=360"]
    );
    // The trio holds the binding policy only: the one with fewer left.
    assert_eq!(header(&allowed, "x-ratelimit-limit"), Some("1"));
    assert_eq!(header(&allowed, "x-ratelimit-remaining"), Some("0"));

    let denied = get_with(&url, k).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        all(&denied, "ratelimit-policy"),
        ["\"burst\";q=1;w=60", "\"hourly\";q=10;w=3600"]
    );
    let rate = all(&denied, "ratelimit");
    assert_eq!(rate[0], "\"burst\";r=0;t=60");
    assert!(rate[1].starts_with("\"hourly\";r="), "{rate:?}");
    assert_eq!(all(&denied, "retry-after"), ["60"]);
    assert_eq!(header(&denied, "x-ratelimit-limit"), Some("1"));
    let (_, body) = problem(denied).await;
    assert_eq!(body["policy"], "burst");
    assert_eq!(body["retry_after"], 60);
}

/// Issue 14, item 4: a closure builds the denial; the layer still adds the
/// rate-limit fields and `Retry-After` from the same decision.
#[tokio::test]
async fn a_custom_denial_response_keeps_the_headers_consistent() {
    let (limiter, _) = manual("1/min");
    let layer = RateLimitLayer::builder(limiter)
        .name("api")
        .key(api_key())
        .on_denied(|denied| {
            let text = format!(
                "{} says wait {} s (limit {})",
                denied.policy(),
                denied.retry_after_secs(),
                denied.decision().limit()
            );
            let mut response = axum::http::Response::new(text.into());
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            response
        })
        .build()
        .expect("layer");
    let url = serve(one_route(layer)).await;
    let k: Headers = &[("x-api-key", b"k")];
    assert_eq!(status(&url, k).await, StatusCode::OK);
    let denied = get_with(&url, k).await;
    assert_eq!(denied.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(&denied, "retry-after"), Some("60"));
    assert_eq!(header(&denied, "ratelimit"), Some("\"api\";r=0;t=60"));
    assert_eq!(
        denied.text().await.expect("body"),
        "api says wait 60 s (limit 1)"
    );
}

/// Issue 14, item 5: with the method router's `route_layer`, a method the
/// route does not take (`405`) never reaches the layer and spends no token;
/// issue 24: with `Router::route_layer` it does.
#[tokio::test]
async fn a_405_spends_no_token_under_route_layer() {
    let (limiter, _) = manual("1/min");
    let layer = RateLimitLayer::builder(limiter)
        .name("login")
        .key(api_key())
        .build()
        .expect("layer");
    let app = Router::new().route(
        "/login",
        axum::routing::post(|| async { "welcome" }).route_layer(layer),
    );
    let url = format!("{}/login", serve(app).await);
    let k = |request: reqwest::RequestBuilder| request.header("x-api-key", "k");
    let wrong = k(client().get(&url)).send().await.expect("send");
    assert_eq!(wrong.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(header(&wrong, "ratelimit"), None);
    let first = k(client().post(&url)).send().await.expect("send");
    assert_eq!(first.status(), StatusCode::OK);
    let second = k(client().post(&url)).send().await.expect("send");
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);

    // axum's `Router::route_layer` wraps each route whole (as the README
    // says): there the 405 passes through the layer and spends the token.
    let (limiter, _) = manual("1/min");
    let layer = RateLimitLayer::builder(limiter)
        .name("all")
        .key(api_key())
        .build()
        .expect("layer");
    let app = Router::new()
        .route("/login", axum::routing::post(|| async { "welcome" }))
        .route_layer(layer);
    let url = format!("{}/login", serve(app).await);
    let wrong = k(client().get(&url)).send().await.expect("send");
    assert_eq!(wrong.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(header(&wrong, "ratelimit"), Some("\"all\";r=0;t=60"));
    let charged = k(client().post(&url)).send().await.expect("send");
    assert_eq!(charged.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// Issue 14, item 6: a `Forwarded` element whose quoted value holds a comma
/// (RFC 7239) names its client; it is not refused as garbage.
#[tokio::test]
async fn forwarded_values_may_quote_commas() {
    let trusted = by_ip("127.0.0.0/8", 64, OnBadKey::default()).await;
    let quoted: Headers = &[("forwarded", b"for=192.0.2.1;host=\"a,b\"")];
    let same: Headers = &[("forwarded", b"for=\"192.0.2.1:8080\";proto=https")];
    let other: Headers = &[(
        "forwarded",
        b"for=192.0.2.43, for=\"[2001:db8:cafe::17]\";by=\"x,y\"",
    )];
    expect_statuses(
        &trusted,
        &[
            (quoted, StatusCode::OK),
            (same, StatusCode::TOO_MANY_REQUESTS),
            (other, StatusCode::OK),
            (other, StatusCode::TOO_MANY_REQUESTS),
        ],
    )
    .await;
}

/// Issue 14, item 8: shadow mode lets a denied request through, with the
/// headers saying what the policy would have done, and no `Retry-After`.
#[tokio::test]
async fn shadow_mode_lets_denied_requests_through() {
    let (limiter, _) = manual("1/min");
    let layer = RateLimitLayer::builder(limiter)
        .name("new")
        .key(api_key())
        .shadow(true)
        .build()
        .expect("layer");
    let url = serve(one_route(layer)).await;
    let k: Headers = &[("x-api-key", b"k")];
    assert_eq!(status(&url, k).await, StatusCode::OK);
    let shadowed = get_with(&url, k).await;
    assert_eq!(shadowed.status(), StatusCode::OK);
    assert_eq!(header(&shadowed, "ratelimit"), Some("\"new\";r=0;t=60"));
    assert_eq!(header(&shadowed, "retry-after"), None);
    assert_eq!(shadowed.text().await.expect("body"), "hello");
}

/// Issue 14, item 7: the README and the `http` module's examples compile
/// in a user's project, which has `axum` but not `http` as a dependency:
/// they name `axum::http`, never `http::` directly.
#[test]
fn user_facing_examples_do_not_name_the_http_crate() {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut files = vec![format!("{root}/README.md")];
    for entry in std::fs::read_dir(format!("{root}/src/http")).expect("src/http") {
        files.push(entry.expect("entry").path().display().to_string());
    }
    for file in files {
        let text = std::fs::read_to_string(&file).expect("readable");
        let markdown = file.ends_with(".md");
        for (n, line) in text.lines().enumerate() {
            let line_start = line.trim_start();
            // In sources, only the doc comments are examples.
            let code = match line_start
                .strip_prefix("//!")
                .or_else(|| line_start.strip_prefix("///"))
            {
                Some(doc) => doc.trim_start(),
                None if markdown => line_start,
                None => continue,
            };
            assert!(
                !code.starts_with("use http::"),
                "{file}:{}: `{}` needs `axum::http`",
                n + 1,
                line.trim()
            );
        }
    }
}

/// Issue 14, item 6 (option): `X-Real-IP` names the client when asked for,
/// and only from a trusted proxy.
#[tokio::test]
async fn x_real_ip_counts_only_when_on_and_from_trusted_proxies() {
    let server = |trust: &'static str| async move {
        let (limiter, _) = manual("1/min");
        let client_ip = axum_peer()
            .trust([trust.parse().expect("net")])
            .x_real_ip(true);
        let layer = RateLimitLayer::builder(limiter)
            .key(KeyExtractor::peer_ip().client_ip(client_ip))
            .build()
            .expect("layer");
        serve(one_route(layer)).await
    };
    let a: Headers = &[
        ("x-real-ip", b"198.51.100.1"),
        ("x-forwarded-for", b"198.51.100.9"),
    ];
    let b: Headers = &[("x-real-ip", b"198.51.100.2")];
    let trusted = server("127.0.0.0/8").await;
    expect_statuses(
        &trusted,
        &[
            (a, StatusCode::OK),
            (b, StatusCode::OK),
            (a, StatusCode::TOO_MANY_REQUESTS),
            (&[("x-forwarded-for", b"198.51.100.3")], StatusCode::OK),
            (&[("x-real-ip", b"junk")], StatusCode::BAD_REQUEST),
        ],
    )
    .await;
    // Loopback is not trusted: the header is ignored, all is 127.0.0.1.
    let untrusted = server("10.0.0.0/8").await;
    expect_statuses(
        &untrusted,
        &[(a, StatusCode::OK), (b, StatusCode::TOO_MANY_REQUESTS)],
    )
    .await;
}

/// One layer, two limits (`2/s burst 2; 3/min`), all or nothing: both
/// policies in `RateLimit-Policy`, the binding one in `RateLimit`, and
/// `Retry-After` and the body naming the one that denied. A request the
/// second limit denies spends nothing of the first.
#[tokio::test]
async fn one_layer_enforces_two_limits_and_names_the_binding_one() {
    let clock = ManualClock::new();
    let limiter =
        KeyedMultiLimiter::<HttpKey, _>::builder("2/s burst 2; 3/min".parse().expect("quotas"))
            .clock(clock.clone())
            .build();
    let layer = RateLimitLayer::builder(limiter)
        .name("search")
        .key(api_key())
        .build()
        .expect("layer");
    let peek_first = {
        let layer = layer.clone();
        // The header key source prefixes the value (`ApiKey` → "key:").
        move || layer.limiter().limits()[0].peek(&HttpKey::from("key:k1"))
    };
    let app = Router::new().route("/", get(|| async { "hello" }).route_layer(layer));
    let url = serve(app).await;
    let k1: &[(&str, &[u8])] = &[("x-api-key", b"k1")];
    let policy = "\"search-0\";q=2;w=1, \"search-1\";q=3;w=60";

    // Two admitted: the first limit (one token per 500 ms) binds.
    for rate in ["\"search-0\";r=1;t=1", "\"search-0\";r=0;t=1"] {
        let response = get_with(&url, k1).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(header(&response, "ratelimit-policy"), Some(policy));
        assert_eq!(header(&response, "ratelimit"), Some(rate));
    }
    // The first limit denies.
    let denied = get_with(&url, k1).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&denied, "ratelimit-policy"), Some(policy));
    assert_eq!(header(&denied, "ratelimit"), Some("\"search-0\";r=0;t=1"));
    assert_eq!(header(&denied, "retry-after"), Some("1"));
    let body: serde_json::Value = denied.json().await.expect("json");
    assert_eq!(body["policy"], "search-0");

    // A second later the first limit is full again; the second has one
    // token left (one per 20 s), this request takes it, and it binds.
    clock.advance(Duration::from_secs(1));
    let response = get_with(&url, k1).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        header(&response, "ratelimit"),
        Some("\"search-1\";r=0;t=59")
    );
    let before = peek_first();
    // k1's own bucket, which this request emptied (a key never seen would
    // show one token left after the peeked request).
    assert_eq!(before.remaining(), 0, "peeked another key's bucket");
    assert!(before.is_allowed());

    // The second limit denies: it binds everywhere, and the first limit
    // kept nothing of the denied request.
    let denied = get_with(&url, k1).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&denied, "ratelimit-policy"), Some(policy));
    assert_eq!(header(&denied, "ratelimit"), Some("\"search-1\";r=0;t=59"));
    assert_eq!(header(&denied, "retry-after"), Some("19"));
    let body: serde_json::Value = denied.json().await.expect("json");
    assert_eq!(body["policy"], "search-1");
    assert_eq!(body["retry_after"], 19);
    assert_eq!(
        peek_first(),
        before,
        "the denied request burnt a token of the first limit"
    );
    // Once the second limit has a token again, requests pass.
    clock.advance(Duration::from_secs(19));
    let response = get_with(&url, k1).await;
    assert_eq!(response.status(), StatusCode::OK);
}

/// Names per policy, and a count that does not match the limiter's.
#[test]
fn policy_names_must_match_the_quotas() {
    let limiter = || KeyedMultiLimiter::<HttpKey>::new("10/s; 100/h".parse().expect("quotas"));
    assert!(RateLimitLayer::builder(limiter())
        .policy_names(["burst", "hourly"])
        .build()
        .is_ok());
    let error = RateLimitLayer::builder(limiter())
        .policy_names(["only-one"])
        .build()
        .expect_err("one name for two quotas");
    assert!(
        error
            .to_string()
            .contains("1 policy name for a limiter of 2 quotas"),
        "{error}"
    );
}

/// `RateLimit-Policy` as (name, q, w) items.
fn policy_items(response: &reqwest::Response) -> Vec<(String, u64, u64)> {
    let value = header(response, "ratelimit-policy").expect("RateLimit-Policy");
    value
        .split(", ")
        .map(|item| {
            let mut parts = item.split(';');
            let name = parts.next().expect("name").to_owned();
            let mut param = |key: &str| -> u64 {
                let part = parts.next().expect("parameter");
                let value = part.strip_prefix(key).expect("key");
                value.parse().expect("integer")
            };
            let q = param("q=");
            let w = param("w=");
            (name, q, w)
        })
        .collect()
}

/// Issue 24, item 3: `q` is what `r` counts down from, for every limiter.
/// A sequence of requests (the clock moving between rounds) against
/// single-limit layers (keyed and direct) and multi-limit layers (keyed
/// and global): on every response, 200 or 429, `r` is at most the `q` of
/// the policy `RateLimit` names, and each item of a multi-limit layer's
/// policy is what a single-limit layer of that quota says.
#[tokio::test]
async fn remaining_never_exceeds_the_advertised_quota() {
    let clock = ManualClock::new();
    let quota = |text: &str| -> Quota { text.parse().expect("quota") };
    let singles = ["10/s burst 20", "30/min", "3/s", "1/min burst 5"];
    // (quota, keyed layer URL, direct layer URL)
    let mut single_urls = Vec::new();
    for text in singles {
        let keyed = KeyedLimiter::<HttpKey>::builder(quota(text))
            .clock(clock.clone())
            .build();
        let direct = turnstile_rl::DirectLimiter::builder(quota(text))
            .clock(clock.clone())
            .build();
        let keyed = RateLimitLayer::builder(keyed).key(api_key()).build();
        let direct = RateLimitLayer::builder(direct).key(api_key()).build();
        single_urls.push((
            text,
            serve(one_route(keyed.expect("layer"))).await,
            serve(one_route(direct.expect("layer"))).await,
        ));
    }
    let keyed_multi =
        KeyedMultiLimiter::<HttpKey, _>::builder("10/s burst 20; 30/min".parse().expect("quotas"))
            .clock(clock.clone())
            .build();
    let global_multi =
        turnstile_rl::MultiLimiter::builder("3/s; 1/min burst 5".parse().expect("quotas"))
            .clock(clock.clone())
            .build();
    let keyed_multi = RateLimitLayer::builder(keyed_multi)
        .name("m")
        .key(api_key());
    let global_multi = RateLimitLayer::builder(global_multi)
        .name("m")
        .key(api_key());
    let multis = [
        (
            ["10/s burst 20", "30/min"],
            serve(one_route(keyed_multi.build().expect("layer"))).await,
        ),
        (
            ["3/s", "1/min burst 5"],
            serve(one_route(global_multi.build().expect("layer"))).await,
        ),
    ];

    // What a single-limit layer advertises for each quota: (q, w).
    let mut advertised = std::collections::HashMap::new();
    let k1: Headers = &[("x-api-key", b"k1")];
    for (text, keyed, direct) in &single_urls {
        let keyed = policy_items(&get_with(keyed, k1).await);
        let direct = policy_items(&get_with(direct, k1).await);
        assert_eq!(keyed, direct, "{text}: keyed and direct disagree");
        assert_eq!(keyed.len(), 1, "{text}");
        advertised.insert(*text, (keyed[0].1, keyed[0].2));
    }
    // The issue's case: the burst, over the time it takes to refill.
    assert_eq!(advertised["10/s burst 20"], (20, 2));
    assert_eq!(advertised["3/s"], (3, 1));

    let urls = single_urls
        .iter()
        .flat_map(|(_, keyed, direct)| [keyed, direct])
        .chain(multis.iter().map(|(_, url)| url));
    let urls: Vec<&String> = urls.collect();
    // Per URL: responses admitted, denied, and the policies that bound.
    let mut seen = vec![(0, 0, std::collections::BTreeSet::new()); urls.len()];
    for round in 0..8 {
        for _ in 0..10 {
            for (i, url) in urls.iter().enumerate() {
                let response = get_with(url, k1).await;
                let items = policy_items(&response);
                let rate = header(&response, "ratelimit").expect("RateLimit");
                let (name, rest) = rate.split_once(";r=").expect("r");
                let remaining: u64 = rest.split(';').next().unwrap().parse().expect("r");
                let (_, q, _) = items
                    .iter()
                    .find(|(item, ..)| item == name)
                    .unwrap_or_else(|| panic!("{rate} names no policy of {items:?}"));
                assert!(
                    remaining <= *q,
                    "round {round}, {url}: {rate} beside {items:?}"
                );
                match response.status() {
                    StatusCode::OK => seen[i].0 += 1,
                    StatusCode::TOO_MANY_REQUESTS => seen[i].1 += 1,
                    other => panic!("{url}: {other}"),
                }
                seen[i].2.insert(name.to_owned());
            }
        }
        clock.advance(Duration::from_millis(300));
    }
    for (url, (admitted, denied, _)) in urls.iter().zip(&seen) {
        assert!(
            *admitted > 0 && *denied > 0,
            "{url}: {admitted} admitted, {denied} denied"
        );
    }

    // Each multi-limit policy item is its single-limit counterpart's.
    for (at, (quotas, url)) in multis.iter().enumerate() {
        let items = policy_items(&get_with(url, k1).await);
        let want: Vec<(String, u64, u64)> = quotas
            .iter()
            .enumerate()
            .map(|(i, text)| {
                let (q, w) = advertised[text];
                (format!("\"m-{i}\""), q, w)
            })
            .collect();
        assert_eq!(items, want, "{quotas:?}");
        let bound = &seen[urls.len() - multis.len() + at].2;
        assert_eq!(bound.len(), 2, "{quotas:?}: only {bound:?} ever bound");
    }
}

/// Issue 24: a trusted proxy that names no client (RFC 7239 `for=unknown`,
/// an obfuscated `for="_hidden"`, `X-Forwarded-For: unknown`). By default
/// the request counts against the proxy's own address, sharing the bucket
/// of the proxy's requests that carry no header, instead of a `400` for
/// every request; `reject_unknown(true)` refuses it with a `400` again.
/// Garbage is a `400` either way.
#[tokio::test]
async fn a_trusted_proxys_unknown_client_counts_against_the_proxy() {
    const OK: StatusCode = StatusCode::OK;
    const DENIED: StatusCode = StatusCode::TOO_MANY_REQUESTS;
    const BAD: StatusCode = StatusCode::BAD_REQUEST;
    let unknown: Headers = &[("forwarded", b"for=unknown")];
    let trusted = by_ip("127.0.0.0/8", 64, OnBadKey::default()).await;
    let first = get_with(&trusted, unknown).await;
    assert_eq!(first.status(), OK);
    assert_eq!(header(&first, "ratelimit"), Some("\"default\";r=0;t=60"));
    expect_statuses(
        &trusted,
        &[
            (&[("x-forwarded-for", b"unknown")], DENIED),
            (&[("forwarded", b"for=\"_hidden\";proto=https")], DENIED),
            (&[("forwarded", b"for=192.0.2.9, for=UNKNOWN")], DENIED),
            (&[], DENIED),
            // A named client keeps its own bucket; garbage is refused.
            (&[("forwarded", b"for=198.51.100.7")], OK),
            (&[("forwarded", b"for=nonsense")], BAD),
            (&[("x-forwarded-for", b"unknown-host")], BAD),
        ],
    )
    .await;

    let (limiter, _) = manual("1/min");
    let client_ip = axum_peer()
        .trust(["127.0.0.0/8".parse().expect("net")])
        .reject_unknown(true);
    let layer = RateLimitLayer::builder(limiter)
        .key(KeyExtractor::peer_ip().client_ip(client_ip))
        .build()
        .expect("layer");
    let strict = serve(one_route(layer)).await;
    let (code, body) = problem(get_with(&strict, unknown).await).await;
    assert_eq!(code, BAD);
    assert_eq!(
        body["detail"],
        "unreadable forwarded header from a trusted proxy: \"for=unknown\" names no client"
    );
    let (code, body) = problem(get_with(&strict, &[("x-forwarded-for", b"unknown")]).await).await;
    assert_eq!(code, BAD);
    assert_eq!(
        body["detail"],
        "unreadable x-forwarded-for header from a trusted proxy: \"unknown\" names no client"
    );
    // Nothing was charged: the proxy's own bucket is untouched.
    assert_eq!(status(&strict, &[]).await, OK);
}

/// `r` of a response's `RateLimit` and the (q, w) of the policy it names.
fn rate_and_policy(response: &reqwest::Response) -> (u64, u64, u64) {
    let rate = header(response, "ratelimit").expect("RateLimit");
    let (name, rest) = rate.split_once(";r=").expect("r");
    let remaining: u64 = rest.split(';').next().unwrap().parse().expect("r");
    let items = policy_items(response);
    let (_, q, w) = items
        .iter()
        .find(|(item, ..)| item == name)
        .unwrap_or_else(|| panic!("{rate} names no policy of {items:?}"));
    assert!(remaining <= *q, "{rate} beside {items:?}");
    (remaining, *q, *w)
}

/// Issue 24, item 1: a quota changed while the layer serves (the limiter
/// shared with the layer through an `Arc`, changed through `&self`)
/// reaches the very next response: its `RateLimit-Policy` advertises the
/// new quota and its `RateLimit` counts down from it, for a keyed, a
/// direct and a keyed multi-limit layer, both ways (larger, then smaller).
#[tokio::test]
async fn a_quota_changed_while_serving_shows_on_the_next_response() {
    let clock = ManualClock::new();
    let keyed = std::sync::Arc::new(
        KeyedLimiter::<HttpKey, _>::builder("5/min".parse().expect("quota"))
            .clock(clock.clone())
            .build(),
    );
    let direct = std::sync::Arc::new(
        turnstile_rl::DirectLimiter::builder("5/min".parse().expect("quota"))
            .clock(clock.clone())
            .build(),
    );
    let multi = std::sync::Arc::new(
        KeyedMultiLimiter::<HttpKey, _>::builder("5/min; 100/h".parse().expect("quotas"))
            .clock(clock.clone())
            .build(),
    );
    fn layer<L: Limiter>(limiter: L) -> RateLimitLayer<L> {
        RateLimitLayer::builder(limiter)
            .name("api")
            .key(api_key())
            .build()
            .expect("layer")
    }
    let keyed_url = serve(one_route(layer(std::sync::Arc::clone(&keyed)))).await;
    let direct_url = serve(one_route(layer(std::sync::Arc::clone(&direct)))).await;
    let multi_url = serve(one_route(
        RateLimitLayer::builder(std::sync::Arc::clone(&multi))
            .policy_names(["api", "hourly"])
            .key(api_key())
            .build()
            .expect("layer"),
    ))
    .await;
    let urls = [&keyed_url, &direct_url, &multi_url];
    let k1: Headers = &[("x-api-key", b"k1")];
    // Every served limiter's quota, through `&self` while the servers run
    // (the multi-limiter's first limit; its hourly one stays).
    let change = |quota: &str| {
        keyed.set_quota(quota.parse().expect("quota"));
        direct.set_quota(quota.parse().expect("quota"));
        let quotas = format!("{quota}; 100/h").parse().expect("quotas");
        multi.set_quotas(quotas).expect("two limits");
    };

    // Before: 5/min, one spent each.
    for url in urls {
        let response = get_with(url, k1).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(rate_and_policy(&response), (4, 5, 60), "{url}");
    }
    // Larger, while serving: 50/min. The spent token stays spent (12 s of
    // the old quota's time is 10 of the new one's).
    change("50/min");
    for url in urls {
        let response = get_with(url, k1).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(rate_and_policy(&response), (39, 50, 60), "{url}");
        assert!(header(&response, "ratelimit-policy")
            .expect("policy")
            .starts_with("\"api\";q=50;w=60"));
    }
    // Smaller: 2/min (T = 30 s, tau = 60 s). The 13.2 s owed stay owed:
    // this admission takes them to 43.2 s (r=0), the next would need
    // 73.2 s: 429 with the new policy.
    change("2/min");
    for url in urls {
        let response = get_with(url, k1).await;
        assert_eq!(response.status(), StatusCode::OK, "{url}");
        assert_eq!(rate_and_policy(&response), (0, 2, 60), "{url}");
        let response = get_with(url, k1).await;
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS, "{url}");
        assert_eq!(rate_and_policy(&response), (0, 2, 60), "{url}");
        // 73.2 s - 60 s tolerated: the next token in 13.2 s, rounded up.
        assert_eq!(header(&response, "retry-after"), Some("14"), "{url}");
        println!(
            "after the change to 2/min, {url}: {} RateLimit-Policy: {} RateLimit: {} Retry-After: {}",
            response.status(),
            header(&response, "ratelimit-policy").unwrap_or("-"),
            header(&response, "ratelimit").unwrap_or("-"),
            header(&response, "retry-after").unwrap_or("-"),
        );
    }
    // And the honoured wait: 13.2 s later, admitted.
    clock.advance(Duration::from_millis(13_200));
    for url in urls {
        assert_eq!(get_with(url, k1).await.status(), StatusCode::OK, "{url}");
    }
}

/// Issue 37, item 1: a request's cost, read by a `CostExtractor`, is
/// charged to every limit of the layer, all or nothing, and `RateLimit`
/// counts what is left after it. A cost above a limit's capacity is a 413
/// naming that limit, without `Retry-After`; a cost of 0 or one that cannot
/// be read is a 400.
#[tokio::test]
async fn weighted_requests_charge_their_cost_to_every_limit() {
    let clock = ManualClock::new();
    // Capacities 20 and 15: the second limit is the smaller.
    let limiter =
        KeyedMultiLimiter::<HttpKey, _>::builder("10/s burst 20; 15/min".parse().expect("quotas"))
            .clock(clock.clone())
            .build();
    let layer = RateLimitLayer::builder(limiter)
        .name("w")
        .key(api_key())
        .cost(CostExtractor::header(HeaderName::from_static("x-cost")))
        .build()
        .expect("layer");
    let peek = {
        let layer = layer.clone();
        move |limit: usize| layer.limiter().limits()[limit].peek(&HttpKey::from("key:k1"))
    };
    let url = serve(one_route(layer)).await;
    let policy = "\"w-0\";q=20;w=2, \"w-1\";q=15;w=60";
    let costing = |cost: &'static [u8]| [("x-api-key", &b"k1"[..]), ("x-cost", cost)];

    // Cost 4: 16 left of the first limit, 11 of the second (one token per
    // 4 s, so full again in 16 s), which binds.
    let response = get_with(&url, &costing(b"4")).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(header(&response, "ratelimit-policy"), Some(policy));
    assert_eq!(header(&response, "ratelimit"), Some("\"w-1\";r=11;t=16"));
    assert_eq!((peek(0).remaining(), peek(1).remaining()), (15, 10));

    // Cost 12: the second limit has 11, so it denies, for the 4 s its
    // twelfth token takes, and the first limit is not charged.
    let denied = get_with(&url, &costing(b"12")).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&denied, "retry-after"), Some("4"));
    assert_eq!(header(&denied, "ratelimit"), Some("\"w-1\";r=11;t=16"));
    let body: serde_json::Value = denied.json().await.expect("json");
    assert_eq!(body["policy"], "w-1");
    assert_eq!((peek(0).remaining(), peek(1).remaining()), (15, 10));
    // Waiting what Retry-After said admits it.
    clock.advance(Duration::from_secs(4));
    let admitted = get_with(&url, &costing(b"12")).await;
    assert_eq!(admitted.status(), StatusCode::OK);
    assert_eq!(header(&admitted, "ratelimit"), Some("\"w-1\";r=0;t=60"));

    // Cost 16: above the second limit's capacity (15), so no wait could
    // admit it: a 413 that names that limit, without Retry-After, and
    // charging nothing.
    let before = (peek(0), peek(1));
    let too_costly = get_with(&url, &costing(b"16")).await;
    assert_eq!(too_costly.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(header(&too_costly, "retry-after"), None);
    assert_eq!(header(&too_costly, "ratelimit"), None);
    assert_eq!(header(&too_costly, "ratelimit-policy"), Some(policy));
    let (_, body) = problem(too_costly).await;
    assert_eq!(
        body,
        serde_json::json!({
            "type": "about:blank",
            "title": "Payload Too Large",
            "status": 413,
            "detail": "a cost of 16 can never be met: policy \"w-1\" admits at most 15 at once",
            "policy": "w-1",
            "cost": 16,
            "capacity": 15,
        })
    );
    assert_eq!((peek(0), peek(1)), before, "a refused cost was charged");

    // Costs that are not costs: 400, naming the problem.
    for (headers, detail) in [
        (&costing(b"0")[..], "a cost of 0 tokens is not a request"),
        (
            &costing(b"lots")[..],
            "header \"x-cost\" is \"lots\", not a whole number of tokens",
        ),
        (
            &[("x-api-key", &b"k1"[..])][..],
            "missing header \"x-cost\": the request's cost",
        ),
    ] {
        let (status, body) = problem(get_with(&url, headers).await).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(body["detail"], detail);
    }

    // A gRPC call above the capacity: RESOURCE_EXHAUSTED, and a negative
    // pushback, which tells gRPC's retry policy never to retry it.
    let mut grpc = costing(b"16").to_vec();
    grpc.push(("content-type", b"application/grpc"));
    let call = get_with(&url, &grpc).await;
    assert_eq!(header(&call, "grpc-status"), Some("8"));
    assert_eq!(header(&call, "grpc-retry-pushback-ms"), Some("-1"));
    assert_eq!(header(&call, "retry-after"), None);
}

/// In shadow mode a cost above the capacity is let through, uncharged and
/// without a `RateLimit` field (no bucket decided it); an extension cost
/// set by an outer layer is read as the header one is.
#[tokio::test]
async fn shadow_mode_lets_a_cost_above_capacity_through_uncharged() {
    #[derive(Clone)]
    struct Items(u64);
    let (limiter, _clock) = manual("5/min");
    let layer = RateLimitLayer::builder(limiter)
        .name("batch")
        .key(api_key())
        .cost(CostExtractor::extension(|items: &Items| items.0))
        .shadow(true)
        .build()
        .expect("layer");
    let app = Router::new()
        .route("/", get(|| async { "hello" }).layer(layer))
        .layer(axum::middleware::from_fn(
            |mut request: axum::extract::Request, next: axum::middleware::Next| async move {
                let items = request
                    .headers()
                    .get("x-items")
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .unwrap_or(1);
                request.extensions_mut().insert(Items(items));
                next.run(request).await
            },
        ));
    let url = serve(app).await;
    let response = get_with(&url, &[("x-api-key", b"k"), ("x-items", b"6")]).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(header(&response, "ratelimit"), None);
    let response = get_with(&url, &[("x-api-key", b"k"), ("x-items", b"3")]).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(header(&response, "ratelimit"), Some("\"batch\";r=2;t=36"));
}
