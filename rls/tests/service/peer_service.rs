//! envoyproxy/ratelimit's `test/service/ratelimit_test.go` replayed over
//! gRPC. The peer's tests give its service a mock configuration and a mock
//! cache that answers given statuses; here the limits are a file and the
//! statuses are reached for real: each descriptor the peer's mock answers
//! over its limit has been spent to its limit first (and one the mock
//! answers OK with nothing left, to one below), in this process with the
//! peer's fixed windows. The peer's settings are its environment variables.
//!
//! Where a mock answers what the real peer would not (a status without its
//! limit for a descriptor that has one), the test asserts what the peer's
//! service, given its own cache, answers, and says so.

use crate::support;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use support::{descriptor, request, sample, start, ConfigDir, Harness};
use turnstile_rls::Settings;

use Code::{Ok as OK, OverLimit as OVER};

/// `different-domain` of the peer's `TestService` and others.
const DIFFERENT: &str = r#"
domain: different-domain
descriptors:
  - key: foo
    value: bar
    rate_limit: { name: key_name, unit: minute, requests_per_unit: 10 }
"#;

/// `test-domain`, where nothing matches `hello`.
const TEST_DOMAIN: &str = r#"
domain: test-domain
descriptors:
  - key: other
    rate_limit: { unit: minute, requests_per_unit: 1 }
"#;

/// The peer's `quota-domain` limits (`regular_limit` 5 a minute,
/// `quota_limit` 3 a minute in quota mode, `quota_limit_1` and
/// `quota_limit_2` both in quota mode).
const QUOTA: &str = r#"
domain: quota-domain
descriptors:
  - { key: regular, value: limit, rate_limit: { unit: minute, requests_per_unit: 5 } }
  - { key: quota, value: limit, quota_mode: true, rate_limit: { unit: minute, requests_per_unit: 3 } }
  - { key: quota1, value: limit, quota_mode: true, rate_limit: { unit: minute, requests_per_unit: 5 } }
  - { key: quota2, value: limit, quota_mode: true, rate_limit: { unit: minute, requests_per_unit: 3 } }
  - { key: foo, value: bar, rate_limit: { unit: minute, requests_per_unit: 10 } }
  - { key: hello, value: world, rate_limit: { unit: minute, requests_per_unit: 5 } }
"#;

type Entries<'a> = &'a [(&'a str, &'a str)];

/// The settings of the peer's variables `vars` on `dir`.
fn peer_settings(dir: &ConfigDir, vars: &[(&str, &str)]) -> Settings {
    let vars: Vec<(&str, String)> = vars.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
    let config = dir.path().display().to_string();
    support::peer_env_settings(&vars, &["--config", &config, "--watch-interval-ms", "0"])
}

fn files(files: &[(&str, &str)]) -> ConfigDir {
    let dir = ConfigDir::new();
    for (name, yaml) in files {
        dir.write(name, yaml);
    }
    dir
}

/// The peer's `NewRateLimitRequest`, one hit.
fn peer_request(domain: &str, descriptors: &[Entries<'_>]) -> RateLimitRequest {
    let mut req = request(domain, descriptors.iter().map(|d| descriptor(d)).collect());
    req.hits_addend = 1;
    req
}

/// A status as the peer's tests write it: no reset (the peer's mock cache
/// leaves it out; the real one's is checked apart and then removed).
fn status(code: Code, limit: Option<(u32, Unit, &str)>, remaining: u32) -> DescriptorStatus {
    DescriptorStatus {
        code: code as i32,
        current_limit: limit.map(|(rpu, unit, name)| RateLimit {
            name: name.into(),
            requests_per_unit: rpu,
            unit: unit as i32,
        }),
        limit_remaining: remaining,
        ..Default::default()
    }
}

fn response(
    code: Code,
    statuses: Vec<DescriptorStatus>,
    headers: &[(&str, String)],
) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: code as i32,
        statuses,
        response_headers_to_add: headers
            .iter()
            .map(|(k, v)| HeaderValue {
                key: (*k).into(),
                value: v.clone(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// The whole seconds to the minute's edge a status says, then the status
/// without them (as the peer's tests compare).
fn take_reset(status: &mut DescriptorStatus) -> Option<i64> {
    let reset = status.duration_until_reset.take()?;
    assert_eq!(reset.nanos, 0);
    Some(reset.seconds)
}

/// On a fresh service of `settings`, spends each `(entries, hits)` of
/// `spend` in `domain`, then sends `req`: the service and its answer, the
/// resets taken out. Again if a minute's edge fell between (a reset grew).
async fn after_spending(
    settings: &Settings,
    domain: &str,
    spend: &[(Entries<'_>, u32)],
    req: RateLimitRequest,
) -> (Harness, RateLimitResponse, Vec<Option<i64>>) {
    'attempt: for _ in 0..3 {
        let mut h = start(settings.clone()).await;
        let mut first_reset = None;
        for (entries, hits) in spend {
            let mut pre = peer_request(domain, &[entries]);
            pre.hits_addend = *hits;
            let mut answer = h.ask(pre).await;
            first_reset = first_reset.or(take_reset(&mut answer.statuses[0]));
        }
        let mut answer = h.ask(req.clone()).await;
        let resets: Vec<Option<i64>> = answer.statuses.iter_mut().map(take_reset).collect();
        if resets
            .iter()
            .flatten()
            .any(|r| Some(*r) > first_reset && first_reset.is_some())
        {
            continue 'attempt;
        }
        return (h, answer, resets);
    }
    panic!("a minute's edge in each of three tries");
}

/// Spends 10 hits of `foo_bar` (`foo=bar`: its limit), then sends `req`, again if a
/// minute's edge fell between (a new window is empty; spent again, it is
/// over however many hits the edge cost): the answer, resets taken out.
async fn spend_and_ask(
    h: &mut Harness,
    foo_bar: Entries<'_>,
    req: RateLimitRequest,
) -> RateLimitResponse {
    for _ in 0..3 {
        let mut spend = peer_request("different-domain", &[foo_bar]);
        spend.hits_addend = 10;
        let spent = take_reset(&mut h.ask(spend).await.statuses[0]);
        let mut answer = h.ask(req.clone()).await;
        let resets: Vec<Option<i64>> = answer.statuses.iter_mut().map(take_reset).collect();
        if !resets.iter().flatten().any(|r| Some(*r) > spent) {
            return answer;
        }
    }
    panic!("a minute's edge in each of three tries");
}

async fn counter(h: &Harness, name: &str) -> u64 {
    sample(&h.metrics().await, name).unwrap_or(0.0) as u64
}

const MINUTE: Unit = Unit::Minute;

#[tokio::test]
async fn test_service() {
    let dir = files(&[("test.yaml", TEST_DOMAIN), ("different.yaml", DIFFERENT)]);
    let settings = peer_settings(&dir, &[]);
    let hello: Entries<'_> = &[("hello", "world")];
    let foo_bar: Entries<'_> = &[("foo", "bar")];
    let (mut h, answer, _) = after_spending(
        &settings,
        "test-domain",
        &[],
        peer_request("test-domain", &[hello]),
    )
    .await;
    assert_eq!(answer, response(OK, vec![status(OK, None, 0)], &[]));

    // A reload, then a request over its limit.
    h.service.engine.reload().await.expect("a reload");
    let key_name = Some((10, MINUTE, "key_name"));
    let answer = spend_and_ask(
        &mut h,
        foo_bar,
        peer_request("different-domain", &[foo_bar, hello]),
    )
    .await;
    assert_eq!(
        answer,
        response(
            OVER,
            vec![status(OVER, key_name, 0), status(OK, None, 0)],
            &[]
        )
    );

    // A load that fails keeps the configuration serving; the order of the
    // descriptors changes nothing (the peer's mock swaps its limits).
    dir.write(
        "broken.yaml",
        "domain: broken\ndescriptors:\n  - value: no key\n",
    );
    h.service.engine.reload().await.expect_err("a bad file");
    let answer = spend_and_ask(
        &mut h,
        foo_bar,
        peer_request("different-domain", &[hello, foo_bar]),
    )
    .await;
    assert_eq!(
        answer,
        response(
            OVER,
            vec![status(OK, None, 0), status(OVER, key_name, 0)],
            &[]
        )
    );

    assert_eq!(
        counter(&h, "ratelimit_service_config_load_success").await,
        2
    );
    assert_eq!(counter(&h, "ratelimit_service_config_load_error").await, 1);
    assert_eq!(counter(&h, "ratelimit_service_global_shadow_mode").await, 0);
}

#[tokio::test]
async fn test_service_global_shadow_mode() {
    let dir = files(&[("different.yaml", DIFFERENT)]);
    let settings = peer_settings(&dir, &[("SHADOW_MODE", "true")]);
    let (hello, foo_bar): (Entries<'_>, Entries<'_>) = (&[("hello", "world")], &[("foo", "bar")]);
    let (h, answer, _) = after_spending(
        &settings,
        "different-domain",
        &[(foo_bar, 10)],
        peer_request("different-domain", &[foo_bar, hello]),
    )
    .await;
    h.service.engine.reload().await.expect("a reload");
    // OK overall, the descriptor's status still OVER_LIMIT.
    let key_name = Some((10, MINUTE, "key_name"));
    assert_eq!(
        answer,
        response(
            OK,
            vec![status(OVER, key_name, 0), status(OK, None, 0)],
            &[]
        )
    );
    assert_eq!(counter(&h, "ratelimit_service_global_shadow_mode").await, 1);
    assert_eq!(
        counter(&h, "ratelimit_service_config_load_success").await,
        2
    );
    assert_eq!(counter(&h, "ratelimit_service_config_load_error").await, 0);
}

/// `different-domain` with both descriptors' limits in shadow mode, or
/// only foo's.
fn shadow_rules(hello_shadow: bool) -> String {
    format!(
        "domain: different-domain\ndescriptors:\n  - {{ key: foo, value: bar, shadow_mode: true, rate_limit: {{ unit: minute, requests_per_unit: 10 }} }}\n  - {{ key: hello, value: world, shadow_mode: {hello_shadow}, rate_limit: {{ unit: minute, requests_per_unit: 10 }} }}\n"
    )
}

#[tokio::test]
async fn test_rule_shadow_mode() {
    let dir = files(&[("different.yaml", &shadow_rules(true))]);
    let settings = peer_settings(&dir, &[]);
    let (hello, foo_bar): (Entries<'_>, Entries<'_>) = (&[("hello", "world")], &[("foo", "bar")]);
    let (h, answer, _) = after_spending(
        &settings,
        "different-domain",
        &[(foo_bar, 10), (hello, 10)],
        peer_request("different-domain", &[foo_bar, hello]),
    )
    .await;
    // Both over, both in shadow mode: OK. (The peer's mock answers the
    // second status without its limit; its real cache sends the limit.)
    let limit = Some((10, MINUTE, ""));
    assert_eq!(
        answer,
        response(OK, vec![status(OK, limit, 0), status(OK, limit, 0)], &[])
    );
    assert_eq!(counter(&h, "ratelimit_service_global_shadow_mode").await, 0);
}

#[tokio::test]
async fn test_mixed_rule_shadow_mode() {
    let dir = files(&[("different.yaml", &shadow_rules(false))]);
    let settings = peer_settings(&dir, &[]);
    let (hello, foo_bar): (Entries<'_>, Entries<'_>) = (&[("hello", "world")], &[("foo", "bar")]);
    let (h, answer, _) = after_spending(
        &settings,
        "different-domain",
        &[(foo_bar, 10), (hello, 10)],
        peer_request("different-domain", &[foo_bar, hello]),
    )
    .await;
    // As above, the second status with its limit.
    let limit = Some((10, MINUTE, ""));
    assert_eq!(
        answer,
        response(
            OVER,
            vec![status(OK, limit, 0), status(OVER, limit, 0)],
            &[]
        )
    );
    assert_eq!(counter(&h, "ratelimit_service_global_shadow_mode").await, 0);
}

/// The peer's headers test with `vars`: the limit, remaining and reset of
/// the refusing descriptor (the peer's mock clock gives 58 s; here the
/// status's own whole seconds to the minute's edge).
async fn ratelimit_headers(vars: &[(&str, &str)], names: [&str; 3]) {
    let dir = files(&[("different.yaml", DIFFERENT)]);
    let settings = peer_settings(&dir, vars);
    let (hello, foo_bar): (Entries<'_>, Entries<'_>) = (&[("hello", "world")], &[("foo", "bar")]);
    let (_h, answer, resets) = after_spending(
        &settings,
        "different-domain",
        &[(foo_bar, 10)],
        peer_request("different-domain", &[foo_bar, hello]),
    )
    .await;
    let reset = resets[0].expect("a reset").to_string();
    let key_name = Some((10, MINUTE, "key_name"));
    let headers = [
        (names[0], "10".to_owned()),
        (names[1], "0".to_owned()),
        (names[2], reset),
    ];
    assert_eq!(
        answer,
        response(
            OVER,
            vec![status(OVER, key_name, 0), status(OK, None, 0)],
            &headers
        )
    );
}

#[tokio::test]
async fn test_service_with_custom_ratelimit_headers() {
    let vars = [
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ("LIMIT_LIMIT_HEADER", "A-Ratelimit-Limit"),
        ("LIMIT_REMAINING_HEADER", "A-Ratelimit-Remaining"),
        ("LIMIT_RESET_HEADER", "A-Ratelimit-Reset"),
    ];
    ratelimit_headers(
        &vars,
        [
            "A-Ratelimit-Limit",
            "A-Ratelimit-Remaining",
            "A-Ratelimit-Reset",
        ],
    )
    .await;
}

#[tokio::test]
async fn test_service_with_default_ratelimit_headers() {
    let vars = [("LIMIT_RESPONSE_HEADERS_ENABLED", "true")];
    ratelimit_headers(
        &vars,
        ["RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"],
    )
    .await;
}

/// An invalid request: refused with the peer's message, counted as the
/// peer's `call.should_rate_limit.service_error`. The peer's gRPC code is
/// UNKNOWN (a plain Go error); here INVALID_ARGUMENT, which says what is
/// wrong (README, migration).
async fn refused(req: RateLimitRequest, message: &str) {
    let dir = files(&[("test.yaml", TEST_DOMAIN)]);
    let mut h = start(peer_settings(&dir, &[])).await;
    let error = h.client.should_rate_limit(req).await.expect_err("refused");
    assert_eq!(error.message(), message);
    assert_eq!(error.code(), tonic::Code::InvalidArgument);
    let name = "ratelimit_service_should_rate_limit_error{err_type=\"service_error\"}";
    assert_eq!(counter(&h, name).await, 1);
}

#[tokio::test]
async fn test_empty_domain() {
    refused(
        peer_request("", &[&[("hello", "world")]]),
        "rate limit domain must not be empty",
    )
    .await;
}

#[tokio::test]
async fn test_empty_descriptors() {
    refused(
        peer_request("test-domain", &[]),
        "rate limit descriptor list must not be empty",
    )
    .await;
}

#[tokio::test]
async fn test_unlimited() {
    let rules = "domain: some-domain\ndescriptors:\n  - { key: foo, value: bar, rate_limit: { unit: minute, requests_per_unit: 10 } }\n  - { key: baz, value: qux, rate_limit: { unlimited: true } }\n";
    let dir = files(&[("some.yaml", rules)]);
    let settings = peer_settings(&dir, &[]);
    let descriptors: [Entries<'_>; 3] =
        [&[("foo", "bar")], &[("hello", "world")], &[("baz", "qux")]];
    let (_h, answer, _) = after_spending(
        &settings,
        "some-domain",
        &[],
        peer_request("some-domain", &descriptors),
    )
    .await;
    let statuses = vec![
        status(OK, Some((10, MINUTE, "")), 9),
        status(OK, None, 0),
        status(OK, None, u32::MAX),
    ];
    assert_eq!(answer, response(OK, statuses, &[]));
}

#[tokio::test]
async fn test_service_health_status() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let dir = files(&[("test.yaml", TEST_DOMAIN)]);
    let h = start(peer_settings(&dir, &[])).await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", h.service.grpc_addr))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let answer = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: "ratelimit".into(),
        })
        .await
        .expect("the peer's health service name");
    assert_eq!(answer.into_inner().status, ServingStatus::Serving as i32);
}

/// A `quota-domain` case: with the peer's `vars`, `spend` first, then the
/// peer's request of `descriptors`; the answer expected.
async fn quota_case(
    vars: &[(&str, &str)],
    spend: &[(Entries<'_>, u32)],
    descriptors: &[Entries<'_>],
    expected: RateLimitResponse,
) -> Harness {
    let dir = files(&[("quota.yaml", QUOTA)]);
    let settings = peer_settings(&dir, vars);
    let req = peer_request("quota-domain", descriptors);
    let (h, answer, _) = after_spending(&settings, "quota-domain", spend, req).await;
    assert_eq!(answer, expected);
    h
}

const REGULAR: Entries<'static> = &[("regular", "limit")];
const QUOTA_D: Entries<'static> = &[("quota", "limit")];
const QUOTA1: Entries<'static> = &[("quota1", "limit")];
const QUOTA2: Entries<'static> = &[("quota2", "limit")];

#[tokio::test]
async fn test_service_global_quota_mode() {
    let (foo_bar, hello): (Entries<'_>, Entries<'_>) = (&[("foo", "bar")], &[("hello", "world")]);
    let statuses = vec![
        status(OVER, Some((10, MINUTE, "")), 0),
        status(OVER, Some((5, MINUTE, "")), 0),
    ];
    // All quota limits over: OVER_LIMIT.
    quota_case(
        &[("QUOTA_MODE", "true")],
        &[(foo_bar, 10), (hello, 5)],
        &[foo_bar, hello],
        response(OVER, statuses, &[]),
    )
    .await;
}

#[tokio::test]
async fn test_service_per_descriptor_quota_mode() {
    let statuses = vec![
        status(OVER, Some((5, MINUTE, "")), 0),
        status(OK, Some((3, MINUTE, "")), 0),
    ];
    // The regular limit refuses, whatever the quota one says.
    quota_case(
        &[],
        &[(REGULAR, 5), (QUOTA_D, 2)],
        &[REGULAR, QUOTA_D],
        response(OVER, statuses, &[]),
    )
    .await;
}

#[tokio::test]
async fn test_service_mixed_per_descriptor_modes() {
    let statuses = vec![
        status(OK, Some((5, MINUTE, "")), 0),
        status(OVER, Some((3, MINUTE, "")), 0),
    ];
    // Every quota limit (the one) over: OVER_LIMIT.
    quota_case(
        &[],
        &[(REGULAR, 4), (QUOTA_D, 3)],
        &[REGULAR, QUOTA_D],
        response(OVER, statuses, &[]),
    )
    .await;
}

#[tokio::test]
async fn test_service_mixed_per_descriptor_modes_under_limit() {
    let statuses = vec![
        status(OK, Some((5, MINUTE, "")), 0),
        status(OK, Some((3, MINUTE, "")), 0),
    ];
    quota_case(
        &[],
        &[(REGULAR, 4), (QUOTA_D, 2)],
        &[REGULAR, QUOTA_D],
        response(OK, statuses, &[]),
    )
    .await;
}

#[tokio::test]
async fn test_service_quota_mode_only_all_over_the_limit() {
    let statuses = vec![
        status(OVER, Some((5, MINUTE, "")), 0),
        status(OVER, Some((3, MINUTE, "")), 0),
    ];
    quota_case(
        &[],
        &[(QUOTA1, 5), (QUOTA2, 3)],
        &[QUOTA1, QUOTA2],
        response(OVER, statuses, &[]),
    )
    .await;
}

#[tokio::test]
async fn test_service_quota_mode_only_some_over_the_limit() {
    let statuses = vec![
        status(OVER, Some((5, MINUTE, "")), 0),
        status(OK, Some((3, MINUTE, "")), 0),
    ];
    // Only some quota limits over: OK.
    quota_case(
        &[],
        &[(QUOTA1, 5), (QUOTA2, 2)],
        &[QUOTA1, QUOTA2],
        response(OK, statuses, &[]),
    )
    .await;
}

#[tokio::test]
async fn test_service_quota_mode_with_shadow_mode() {
    let statuses = vec![
        status(OVER, Some((5, MINUTE, "")), 0),
        status(OVER, Some((3, MINUTE, "")), 0),
    ];
    // Global shadow mode makes everything OK, and is counted.
    let h = quota_case(
        &[("SHADOW_MODE", "true")],
        &[(QUOTA1, 5), (QUOTA2, 3)],
        &[QUOTA1, QUOTA2],
        response(OK, statuses, &[]),
    )
    .await;
    assert_eq!(counter(&h, "ratelimit_service_global_shadow_mode").await, 1);
}

#[tokio::test]
async fn test_service_mixed_mode_with_shadow_mode() {
    let statuses = vec![
        status(OVER, Some((5, MINUTE, "")), 0),
        status(OVER, Some((3, MINUTE, "")), 0),
    ];
    let h = quota_case(
        &[("SHADOW_MODE", "true")],
        &[(REGULAR, 5), (QUOTA_D, 3)],
        &[REGULAR, QUOTA_D],
        response(OK, statuses, &[]),
    )
    .await;
    assert_eq!(counter(&h, "ratelimit_service_global_shadow_mode").await, 1);
}
