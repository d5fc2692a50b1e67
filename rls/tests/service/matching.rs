//! envoyproxy/ratelimit's matching rules, over a real gRPC client on
//! loopback: a value beats no value, nested descriptors, the deepest match
//! only, `replaces`, `unlimited`, wildcards, and no match at all.

use crate::support;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use support::{descriptor, request, settings, start, status_code, ConfigDir};

const RULES: &str = r#"
domain: m
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 2 }
  - key: user
    value: vip
    rate_limit: { unit: hour, requests_per_unit: 5 }
  - key: api
    rate_limit: { name: api_default, unit: hour, requests_per_unit: 3 }
    descriptors:
      - key: method
        value: POST
        rate_limit: { unit: hour, requests_per_unit: 1 }
      - key: method
        rate_limit: { unit: hour, requests_per_unit: 4 }
  - key: partner
    rate_limit:
      unit: hour
      requests_per_unit: 10
      replaces: [{ name: api_default }]
  - key: path
    value: /healthz
    rate_limit: { unlimited: true }
  - key: file
    value: "img/*"
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: tier
    value: "*"
    share_threshold: true
    rate_limit: { unit: hour, requests_per_unit: 2 }
  - key: team
    descriptors:
      - key: member
        rate_limit: { unit: hour, requests_per_unit: 1 }
"#;

async fn harness() -> (ConfigDir, support::Harness) {
    let dir = ConfigDir::with("m.yaml", RULES);
    let harness = start(settings(&dir)).await;
    (dir, harness)
}

#[tokio::test]
async fn a_value_match_beats_the_key_alone_and_each_value_has_its_own_bucket() {
    let (_dir, mut h) = harness().await;
    assert_eq!(
        h.admitted("m", &[("user", "alice")], 4).await,
        2,
        "the default: 2 an hour"
    );
    assert_eq!(
        h.admitted("m", &[("user", "bob")], 4).await,
        2,
        "bob has his own bucket"
    );
    assert_eq!(
        h.admitted("m", &[("user", "vip")], 7).await,
        5,
        "the value match: 5 an hour"
    );
}

#[tokio::test]
async fn nested_descriptors_take_the_limit_where_the_last_entry_lands() {
    let (_dir, mut h) = harness().await;
    let post = [("api", "k1"), ("method", "POST")];
    assert_eq!(h.admitted("m", &post, 3).await, 1, "api + method=POST");
    let get = [("api", "k1"), ("method", "GET")];
    assert_eq!(h.admitted("m", &get, 6).await, 4, "api + any other method");
    assert_eq!(h.admitted("m", &[("api", "k1")], 5).await, 3, "api alone");

    // Deeper than the configuration: no limit applies (not the parent's).
    let deeper = [("api", "k2"), ("method", "GET"), ("extra", "x")];
    let response = h.ask(request("m", vec![descriptor(&deeper)])).await;
    assert_eq!(support::code(response.overall_code), Code::Ok);
    assert_eq!(response.statuses[0].current_limit, None);
    // Shorter than the configuration: `team` has no limit of its own.
    let response = h
        .ask(request("m", vec![descriptor(&[("team", "t")])]))
        .await;
    assert_eq!(response.statuses[0].current_limit, None);
    let member = [("team", "t"), ("member", "m1")];
    assert_eq!(h.admitted("m", &member, 2).await, 1, "team + member");
}

#[tokio::test]
async fn no_match_is_ok_without_a_limit() {
    let (_dir, mut h) = harness().await;
    for (domain, entries) in [
        ("m", [("unknown", "x")]),
        ("other_domain", [("user", "alice")]),
    ] {
        let response = h.ask(request(domain, vec![descriptor(&entries)])).await;
        assert_eq!(support::code(response.overall_code), Code::Ok);
        assert_eq!(response.statuses.len(), 1);
        assert_eq!(status_code(&response.statuses[0]), Code::Ok);
        assert_eq!(response.statuses[0].current_limit, None);
        assert_eq!(response.statuses[0].limit_remaining, 0);
    }
}

#[tokio::test]
async fn replaces_drops_the_named_limit_when_both_match() {
    let (_dir, mut h) = harness().await;
    let both = || {
        request(
            "m",
            vec![
                descriptor(&[("api", "k3")]),
                descriptor(&[("partner", "p")]),
            ],
        )
    };
    for _ in 0..5 {
        let response = h.ask(both()).await;
        assert_eq!(
            support::code(response.overall_code),
            Code::Ok,
            "api_default would refuse the 4th"
        );
        assert_eq!(response.statuses[0].current_limit, None, "replaced");
        let partner = response.statuses[1]
            .current_limit
            .as_ref()
            .expect("the partner limit");
        assert_eq!(partner.requests_per_unit, 10);
    }
    // Alone, the api limit is still there, and was not charged meanwhile.
    assert_eq!(h.admitted("m", &[("api", "k3")], 4).await, 3);
}

#[tokio::test]
async fn unlimited_is_always_ok_with_everything_remaining() {
    let (_dir, mut h) = harness().await;
    for _ in 0..20 {
        let response = h
            .ask(request("m", vec![descriptor(&[("path", "/healthz")])]))
            .await;
        assert_eq!(support::code(response.overall_code), Code::Ok);
        assert_eq!(response.statuses[0].limit_remaining, u32::MAX);
        assert_eq!(response.statuses[0].current_limit, None);
    }
}

#[tokio::test]
async fn a_wildcard_matches_by_prefix_with_a_bucket_per_value() {
    let (_dir, mut h) = harness().await;
    assert_eq!(h.admitted("m", &[("file", "img/a.png")], 2).await, 1);
    assert_eq!(
        h.admitted("m", &[("file", "img/b.png")], 2).await,
        1,
        "its own bucket"
    );
    assert_eq!(
        h.admitted("m", &[("file", "doc/a.pdf")], 3).await,
        3,
        "no match"
    );
}

#[tokio::test]
async fn one_refused_descriptor_refuses_the_request_and_each_status_is_reported() {
    let (_dir, mut h) = harness().await;
    let both = || {
        request(
            "m",
            vec![
                descriptor(&[("user", "carol")]),
                descriptor(&[("user", "vip")]),
            ],
        )
    };
    let first = h.ask(both()).await;
    assert_eq!(support::code(first.overall_code), Code::Ok);
    let limit = first.statuses[0].current_limit.as_ref().expect("a limit");
    assert_eq!((limit.requests_per_unit, limit.unit), (2, 3), "2 per HOUR");
    assert_eq!(first.statuses[0].limit_remaining, 1);
    assert_eq!(first.statuses[1].limit_remaining, 4);
    let reset = first.statuses[0].duration_until_reset.expect("a reset");
    assert!(reset.seconds > 0 && reset.seconds <= 3_600, "{reset:?}");

    h.ask(both()).await;
    let third = h.ask(both()).await;
    assert_eq!(support::code(third.overall_code), Code::OverLimit);
    assert_eq!(status_code(&third.statuses[0]), Code::OverLimit);
    assert_eq!(third.statuses[0].limit_remaining, 0);
    // GCRA: the next request passes after one emission interval (30 min).
    let wait = third.statuses[0].duration_until_reset.expect("a wait");
    assert!(wait.seconds > 0 && wait.seconds <= 1_800, "{wait:?}");
    assert_eq!(
        status_code(&third.statuses[1]),
        Code::Ok,
        "vip still has room"
    );
}

#[tokio::test]
async fn a_request_without_domain_or_descriptors_is_invalid() {
    let (_dir, mut h) = harness().await;
    let no_domain = h
        .client
        .should_rate_limit(request("", vec![descriptor(&[("user", "a")])]))
        .await
        .expect_err("no domain");
    assert_eq!(no_domain.code(), tonic::Code::InvalidArgument);
    assert!(
        no_domain.message().contains("domain"),
        "{}",
        no_domain.message()
    );
    let none = h
        .client
        .should_rate_limit(request("m", vec![]))
        .await
        .expect_err("no descriptors");
    assert_eq!(none.code(), tonic::Code::InvalidArgument);
}

#[tokio::test]
async fn a_descriptors_own_limit_overrides_the_configuration() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    let (_dir, mut h) = harness().await;
    let with_limit = |entries: &[(&str, &str)], requests_per_unit| {
        let mut d = descriptor(entries);
        d.limit = Some(RateLimitOverride {
            requests_per_unit,
            unit: 3, // HOUR
        });
        request("m", vec![d])
    };
    let mut codes = Vec::new();
    for _ in 0..3 {
        // Not configured at all: the override alone limits it.
        codes.push(support::code(
            h.ask(with_limit(&[("tenant", "t1")], 2)).await.overall_code,
        ));
    }
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::OverLimit]);
    // The vip value would allow 5; its override allows 1.
    let first = h.ask(with_limit(&[("user", "vip")], 1)).await;
    assert_eq!(
        first.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit),
        Some(1)
    );
    let second = h.ask(with_limit(&[("user", "vip")], 1)).await;
    assert_eq!(support::code(second.overall_code), Code::OverLimit);
}

#[tokio::test]
async fn share_threshold_gives_every_wildcard_value_one_bucket() {
    let (_dir, mut h) = harness().await;
    assert_eq!(h.admitted("m", &[("tier", "gold")], 1).await, 1);
    assert_eq!(
        h.admitted("m", &[("tier", "silver")], 2).await,
        1,
        "one left, shared"
    );
    // Composite keys are matched as strings, as in envoyproxy/ratelimit:
    // `tier_x_...` fits `tier_*` too; whatever the text, no panic.
    let response = h
        .ask(request("m", vec![descriptor(&[("tier_x", "\u{e9}")])]))
        .await;
    assert_eq!(support::code(response.overall_code), Code::OverLimit);
}
