//! What the answers carry beyond matching: costs (`hits_addend`), shadow
//! mode (per descriptor and global), the IETF headers, fixed windows,
//! `requests_per_unit: 0`, and the metrics an operator reads.

use crate::support;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::google::protobuf::UInt64Value;
use support::{descriptor, request, sample, settings, start, status_code, ConfigDir};

const RULES: &str = r#"
domain: a
descriptors:
  - key: user
    rate_limit: { name: per_user, unit: hour, requests_per_unit: 5 }
  - key: trial
    shadow_mode: true
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: window
    rate_limit: { unit: hour, requests_per_unit: 3, algorithm: fixed_window }
  - key: closed
    rate_limit: { unit: hour, requests_per_unit: 0 }
  - key: small
    rate_limit: { unit: hour, requests_per_unit: 3 }
"#;

#[tokio::test]
async fn hits_addend_is_the_cost_and_zero_means_one() {
    let dir = ConfigDir::with("a.yaml", RULES);
    let mut h = start(settings(&dir)).await;
    let mut costly = request("a", vec![descriptor(&[("user", "u1")])]);
    costly.hits_addend = 2;
    let first = h.ask(costly.clone()).await;
    assert_eq!(first.statuses[0].limit_remaining, 3);
    let second = h.ask(costly.clone()).await;
    assert_eq!(second.statuses[0].limit_remaining, 1);
    let third = h.ask(costly.clone()).await;
    assert_eq!(
        support::code(third.overall_code),
        Code::OverLimit,
        "2 do not fit in 1"
    );
    // hits_addend 0 is 1: the last token.
    let one = h
        .ask(request("a", vec![descriptor(&[("user", "u1")])]))
        .await;
    assert_eq!(support::code(one.overall_code), Code::Ok);
    assert_eq!(one.statuses[0].limit_remaining, 0);

    // Above the limit itself: over, and nothing taken.
    let mut huge = request("a", vec![descriptor(&[("user", "u2")])]);
    huge.hits_addend = 6;
    assert_eq!(
        support::code(h.ask(huge).await.overall_code),
        Code::OverLimit
    );
    assert_eq!(
        h.admitted("a", &[("user", "u2")], 6).await,
        5,
        "u2 untouched"
    );
}

#[tokio::test]
async fn a_descriptors_own_hits_addend_wins_and_zero_only_looks() {
    let dir = ConfigDir::with("a.yaml", RULES);
    let mut h = start(settings(&dir)).await;
    let mut look = descriptor(&[("user", "u3")]);
    look.hits_addend = Some(UInt64Value { value: 0 });
    for _ in 0..10 {
        let response = h.ask(request("a", vec![look.clone()])).await;
        assert_eq!(support::code(response.overall_code), Code::Ok);
        assert_eq!(
            response.statuses[0].limit_remaining, 5,
            "looking takes nothing"
        );
    }
    let mut four = descriptor(&[("user", "u3")]);
    four.hits_addend = Some(UInt64Value { value: 4 });
    let mut req = request("a", vec![four]);
    req.hits_addend = 1; // the descriptor's own value wins
    assert_eq!(h.ask(req).await.statuses[0].limit_remaining, 1);
}

#[tokio::test]
async fn shadow_mode_counts_but_never_refuses() {
    let dir = ConfigDir::with("a.yaml", RULES);
    let mut h = start(settings(&dir)).await;
    for _ in 0..3 {
        let response = h
            .ask(request("a", vec![descriptor(&[("trial", "t")])]))
            .await;
        assert_eq!(support::code(response.overall_code), Code::Ok);
        assert_eq!(status_code(&response.statuses[0]), Code::Ok);
    }
    let text = h.metrics().await;
    let series = |stat: &str| support::stat(&text, "a", "trial", stat);
    assert_eq!(series("total_hits"), 3.0);
    assert_eq!(series("over_limit"), 2.0);
    assert_eq!(series("shadow_mode"), 2.0);
    assert_eq!(series("within_limit"), 1.0);
}

#[tokio::test]
async fn global_shadow_mode_turns_the_overall_code_to_ok() {
    let dir = ConfigDir::with("a.yaml", RULES);
    let mut settings = settings(&dir);
    settings.shadow_mode = true;
    let mut h = start(settings).await;
    let response = h
        .ask(request("a", vec![descriptor(&[("closed", "x")])]))
        .await;
    assert_eq!(support::code(response.overall_code), Code::Ok);
    assert_eq!(
        status_code(&response.statuses[0]),
        Code::OverLimit,
        "the descriptor still says why"
    );
    let text = h.metrics().await;
    assert_eq!(
        sample(&text, "ratelimit_service_global_shadow_mode"),
        Some(1.0),
        "{text}"
    );
}

#[tokio::test]
async fn zero_requests_per_unit_refuses_everything() {
    let dir = ConfigDir::with("a.yaml", RULES);
    let mut h = start(settings(&dir)).await;
    assert_eq!(h.admitted("a", &[("closed", "x")], 3).await, 0);
}

#[tokio::test]
async fn fixed_window_is_offered_per_descriptor() {
    let dir = ConfigDir::with("a.yaml", RULES);
    let mut h = start(settings(&dir)).await;
    assert_eq!(h.admitted("a", &[("window", "w")], 5).await, 3);
    let response = h
        .ask(request("a", vec![descriptor(&[("window", "w")])]))
        .await;
    assert_eq!(support::code(response.overall_code), Code::OverLimit);
    // A fixed window's wait is the window's edge: within the hour.
    let wait = response.statuses[0].duration_until_reset.expect("a wait");
    assert!(wait.seconds <= 3_600, "{wait:?}");
}

#[tokio::test]
async fn the_ietf_headers_are_added_when_enabled() {
    let dir = ConfigDir::with("a.yaml", RULES);
    let mut settings = settings(&dir);
    settings.response_headers = true;
    let mut h = start(settings).await;
    let response = h
        .ask(request(
            "a",
            vec![
                descriptor(&[("user", "u4")]),
                descriptor(&[("small", "s4")]),
            ],
        ))
        .await;
    let header = |name: &str| {
        response
            .response_headers_to_add
            .iter()
            .find(|h| h.key == name)
            .map(|h| h.value.clone())
            .unwrap_or_else(|| panic!("{name} in {:?}", response.response_headers_to_add))
    };
    assert_eq!(
        header("ratelimit-policy"),
        "\"per_user\";q=5;w=3600, \"small\";q=3;w=3600"
    );
    // The binding limit is the one with the fewest left: small's 2.
    assert!(header("ratelimit").starts_with("\"small\";r=2;t="));

    // Off by default.
    let dir = ConfigDir::with("a.yaml", RULES);
    let mut plain = start(support::settings(&dir)).await;
    let response = plain
        .ask(request("a", vec![descriptor(&[("user", "u4")])]))
        .await;
    assert!(response.response_headers_to_add.is_empty());
}

#[tokio::test]
async fn metrics_count_hits_near_and_over_the_limit_and_the_engine() {
    let dir = ConfigDir::with("a.yaml", RULES);
    let mut h = start(settings(&dir)).await;
    // 7 hits on a limit of 5 (near limit past 80 %: the 5th hit).
    assert_eq!(h.admitted("a", &[("user", "u5")], 7).await, 5);
    let text = h.metrics().await;
    let series = |stat: &str| support::stat(&text, "a", "user", stat);
    assert_eq!(series("total_hits"), 7.0);
    assert_eq!(series("over_limit"), 2.0);
    assert_eq!(series("within_limit"), 5.0);
    assert_eq!(series("near_limit"), 1.0);
    assert_eq!(
        sample(&text, "turnstile_keys_held{limiter=\"a.user\"}"),
        Some(1.0),
        "the engine's gauges:\n{text}"
    );
    assert_eq!(
        sample(&text, "ratelimit_service_config_load_success"),
        Some(1.0)
    );
}

#[tokio::test]
async fn the_grpc_health_service_reports_serving() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let dir = ConfigDir::with("a.yaml", RULES);
    let h = start(settings(&dir)).await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", h.service.grpc_addr))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut health = HealthClient::new(channel);
    // "ratelimit": envoyproxy/ratelimit's name, which probes written for it ask.
    for service in [
        "",
        "envoy.service.ratelimit.v3.RateLimitService",
        "ratelimit",
    ] {
        let answer = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap_or_else(|e| panic!("health of {service:?}: {e}"));
        assert_eq!(
            answer.get_ref().status,
            ServingStatus::Serving as i32,
            "{service:?}"
        );
    }
    let unknown = health
        .check(HealthCheckRequest {
            service: "no-such-service".into(),
        })
        .await
        .expect_err("an unknown name is not served");
    assert_eq!(unknown.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn status_and_header_say_the_same_and_an_impossible_cost_gets_no_wait() {
    let dir = ConfigDir::with("a.yaml", RULES);
    let mut settings = settings(&dir);
    settings.response_headers = true;
    settings.limit_response_headers = true;
    let mut h = start(settings).await;
    let field = |r: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse,
                 name: &str| {
        r.response_headers_to_add
            .iter()
            .find(|h| h.key.eq_ignore_ascii_case(name))
            .map(|h| h.value.clone())
    };
    // A cost of 6 on 5 an hour can never pass: over, nothing left, no wait.
    let mut huge = request("a", vec![descriptor(&[("user", "u9")])]);
    huge.hits_addend = 6;
    let never = h.ask(huge).await;
    assert_eq!(support::code(never.overall_code), Code::OverLimit);
    assert_eq!(never.statuses[0].limit_remaining, 0);
    assert_eq!(never.statuses[0].duration_until_reset, None);
    assert_eq!(
        field(&never, "ratelimit").as_deref(),
        Some("\"per_user\";r=0")
    );
    assert_eq!(field(&never, "RateLimit-Reset"), None);

    // A plain refusal: the header's t is the status's wait, rounded up.
    assert_eq!(h.admitted("a", &[("user", "u10")], 5).await, 5);
    let refused = h
        .ask(request("a", vec![descriptor(&[("user", "u10")])]))
        .await;
    let wait = refused.statuses[0].duration_until_reset.expect("a wait");
    let secs = wait.seconds + i64::from(wait.nanos > 0);
    assert_eq!(
        field(&refused, "ratelimit"),
        Some(format!("\"per_user\";r=0;t={secs}"))
    );
    assert_eq!(field(&refused, "RateLimit-Reset"), Some(secs.to_string()));
}
