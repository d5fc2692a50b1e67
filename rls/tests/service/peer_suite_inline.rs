//! The rest of envoyproxy/ratelimit's `test/config/config_test.go`: the
//! cases whose configuration the peer builds in code (`YamlRoot`
//! literals), written here as the YAML they stand for, replayed over gRPC
//! as `peer_suite.rs` replays the file cases: the peer's `Stats.Key` is
//! the series a hit counts in. The peer's `FullKey` (its debug logs' name)
//! has no counterpart to observe; its assertions that `FullKey` equals
//! `Stats.Key` are left out.

use crate::peer_suite::Peer;

/// The peer's `Stats.Key` of one hit of `entries` in `domain`, on a
/// service of `yaml`.
async fn stats_key(yaml: &str, domain: &str, entries: &[(&str, &str)]) -> String {
    let mut p = Peer::serve_yaml(yaml).await;
    p.get(domain, entries).await.stats_key().to_owned()
}

/// `TestDetailedMetric`'s `t.Run` cases.
mod test_detailed_metric {
    use super::stats_key;

    fn nested(top_detailed: bool, leaf_detailed: bool) -> String {
        format!(
            "domain: nested\ndescriptors:\n  - key: key-1\n    detailed_metric: {top_detailed}\n    rate_limit: {{ requests_per_unit: 100, unit: minute }}\n    descriptors:\n      - key: key-2\n        detailed_metric: {leaf_detailed}\n        rate_limit: {{ requests_per_unit: 5, unit: minute }}\n"
        )
    }

    const REALISTIC: &str = r#"
domain: nested
descriptors:
  - { key: key_1, detailed_metric: true, rate_limit: { requests_per_unit: 500, unit: minute } }
  - { key: key_1, value: some-value-for-key-1, rate_limit: { requests_per_unit: 500, unit: minute } }
  - key: key_2
    detailed_metric: true
    rate_limit: { requests_per_unit: 5000, unit: minute }
    descriptors:
      - { key: key_3, detailed_metric: true }
      - { key: key_3, value: requested-key3-value, detailed_metric: true, rate_limit: { requests_per_unit: 5, unit: minute } }
  - key: key_2
    value: specific-id
    detailed_metric: true
    rate_limit: { requests_per_unit: 50000, unit: minute }
    descriptors:
      - { key: key_3, detailed_metric: true }
      - { key: key_3, value: requested-key3-value, detailed_metric: true, rate_limit: { requests_per_unit: 100, unit: minute } }
"#;

    #[tokio::test]
    async fn nested_with_no_values_but_request_only_top_level_key() {
        let key = stats_key(&nested(true, false), "nested", &[("key-1", "value-1")]).await;
        assert_eq!(key, "nested.key-1_value-1");
    }

    #[tokio::test]
    async fn nested_with_no_values_but_request_only_top_level_key_with_no_detailed_metric() {
        let key = stats_key(&nested(false, false), "nested", &[("key-1", "value-1")]).await;
        assert_eq!(key, "nested.key-1");
    }

    #[tokio::test]
    async fn nested_with_no_values_and_request_fully_nested_descriptors() {
        let entries = [("key-1", "value-1"), ("key-2", "value-2")];
        let key = stats_key(&nested(true, true), "nested", &entries).await;
        assert_eq!(key, "nested.key-1_value-1.key-2_value-2");
    }

    #[tokio::test]
    async fn nested_with_no_values_and_request_fully_nested_descriptors_with_no_detailed_metric() {
        let entries = [("key-1", "value-1"), ("key-2", "value-2")];
        let key = stats_key(&nested(false, false), "nested", &entries).await;
        assert_eq!(key, "nested.key-1.key-2");
    }

    #[tokio::test]
    async fn test_nested_descriptors_with_simple_request() {
        let key = stats_key(REALISTIC, "nested", &[("key_1", "value-for-key-1")]).await;
        assert_eq!(key, "nested.key_1_value-for-key-1");
    }

    #[tokio::test]
    async fn test_nested_only_second_descriptor_request_not_nested() {
        let key = stats_key(REALISTIC, "nested", &[("key_2", "key-2-value")]).await;
        assert_eq!(key, "nested.key_2_key-2-value");
    }

    #[tokio::test]
    async fn test_nested_descriptors_with_nested_request() {
        let entries = [("key_2", "key-2-value"), ("key_3", "requested-key3-value")];
        let key = stats_key(REALISTIC, "nested", &entries).await;
        assert_eq!(key, "nested.key_2_key-2-value.key_3_requested-key3-value");
    }
}

/// route (value_to_metric) > http_method (value_to_metric) > subject_id,
/// 60 a minute, in `domain`; `leaf` is more of subject_id's fields.
fn route_method_subject(domain: &str, leaf: &str) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: route\n    value_to_metric: true\n    descriptors:\n      - key: http_method\n        value_to_metric: true\n        descriptors:\n          - {{ key: subject_id, {leaf}rate_limit: {{ requests_per_unit: 60, unit: minute }} }}\n"
    )
}

const DRAW_GET_123: [(&str, &str); 3] = [
    ("route", "draw"),
    ("http_method", "GET"),
    ("subject_id", "123"),
];

#[tokio::test]
async fn test_value_to_metric_uses_runtime_values_in_stats() {
    let mut p = Peer::serve_yaml(&route_method_subject("domain", "")).await;
    let found = p.get("domain", &DRAW_GET_123).await;
    assert_eq!(
        found.stats_key(),
        "domain.route_draw.http_method_GET.subject_id"
    );
    assert_eq!(p.stat(found.stats_key(), "total_hits").await, 1.0);
    assert_eq!(p.stat(found.stats_key(), "within_limit").await, 1.0);
}

#[tokio::test]
async fn test_value_to_metric_default_key_includes_value_at_that_level() {
    let yaml = "domain: d\ndescriptors:\n  - key: k1\n    value_to_metric: true\n    descriptors:\n      - { key: k2, rate_limit: { requests_per_unit: 1, unit: second } }\n";
    assert_eq!(
        stats_key(yaml, "d", &[("k1", "A"), ("k2", "foo")]).await,
        "d.k1_A.k2"
    );
}

#[tokio::test]
async fn test_value_to_metric_mid_level_only() {
    let yaml = "domain: d\ndescriptors:\n  - key: k1\n    descriptors:\n      - key: k2\n        value_to_metric: true\n        descriptors:\n          - { key: k3, rate_limit: { requests_per_unit: 1, unit: second } }\n";
    let key = stats_key(yaml, "d", &[("k1", "X"), ("k2", "Y"), ("k3", "Z")]).await;
    assert_eq!(key, "d.k1.k2_Y.k3");
}

#[tokio::test]
async fn test_value_to_metric_no_flag_unchanged() {
    let yaml = "domain: d\ndescriptors:\n  - key: k1\n    descriptors:\n      - { key: k2, rate_limit: { requests_per_unit: 1, unit: second } }\n";
    assert_eq!(
        stats_key(yaml, "d", &[("k1", "X"), ("k2", "Y")]).await,
        "d.k1.k2"
    );
}

#[tokio::test]
async fn test_value_to_metric_does_not_override_detailed_metric() {
    let mut p = Peer::serve_yaml(&route_method_subject("domain", "detailed_metric: true, ")).await;
    let found = p.get("domain", &DRAW_GET_123).await;
    assert_eq!(
        found.stats_key(),
        "domain.route_draw.http_method_GET.subject_id_123"
    );
    assert_eq!(p.stat(found.stats_key(), "total_hits").await, 1.0);
}

#[tokio::test]
async fn test_value_to_metric_with_configured_values() {
    let yaml = r#"
domain: test-domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value: GET
        value_to_metric: true
        descriptors:
          - { key: subject_id, rate_limit: { requests_per_unit: 60, unit: minute } }
      - key: http_method
        value: POST
        value_to_metric: true
        descriptors:
          - { key: subject_id, rate_limit: { requests_per_unit: 30, unit: minute } }
"#;
    let mut p = Peer::serve_yaml(yaml).await;
    let get = p
        .get(
            "test-domain",
            &[
                ("route", "api"),
                ("http_method", "GET"),
                ("subject_id", "user123"),
            ],
        )
        .await;
    assert_eq!(get.limit().0, 60);
    assert_eq!(
        get.stats_key(),
        "test-domain.route_api.http_method_GET.subject_id"
    );
    let post = p
        .get(
            "test-domain",
            &[
                ("route", "api"),
                ("http_method", "POST"),
                ("subject_id", "user456"),
            ],
        )
        .await;
    assert_eq!(post.limit().0, 30);
    assert_eq!(
        post.stats_key(),
        "test-domain.route_api.http_method_POST.subject_id"
    );
    assert_eq!(p.stat(post.stats_key(), "total_hits").await, 1.0);
}

#[tokio::test]
async fn test_value_to_metric_with_wildcard() {
    let yaml = r#"
domain: domain
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - { key: resource, rate_limit: { requests_per_unit: 100, unit: minute } }
"#;
    let mut p = Peer::serve_yaml(yaml).await;
    let alice = p
        .get(
            "domain",
            &[
                ("user", "alice"),
                ("action", "readfile"),
                ("resource", "documents"),
            ],
        )
        .await;
    assert_eq!(alice.limit().0, 100);
    assert_eq!(
        alice.stats_key(),
        "domain.user_alice.action_readfile.resource"
    );
    let bob = p
        .get(
            "domain",
            &[
                ("user", "bob"),
                ("action", "readdata"),
                ("resource", "database"),
            ],
        )
        .await;
    assert_eq!(bob.stats_key(), "domain.user_bob.action_readdata.resource");
    assert_eq!(p.stat(bob.stats_key(), "total_hits").await, 1.0);
}

#[tokio::test]
async fn test_value_to_metric_with_empty_value() {
    let mut p = Peer::serve_yaml(&route_method_subject("domain", "")).await;
    // An empty value adds no underscore.
    for (route, method, expected) in [
        ("", "GET", "domain.route.http_method_GET.subject_id"),
        ("draw", "", "domain.route_draw.http_method.subject_id"),
        ("", "", "domain.route.http_method.subject_id"),
    ] {
        let found = p
            .get(
                "domain",
                &[
                    ("route", route),
                    ("http_method", method),
                    ("subject_id", "123"),
                ],
            )
            .await;
        assert_eq!(found.stats_key(), expected);
    }
    assert_eq!(
        p.stat("domain.route.http_method.subject_id", "total_hits")
            .await,
        1.0
    );
    assert_eq!(
        p.stat("domain.route.http_method.subject_id", "within_limit")
            .await,
        1.0
    );
}

#[tokio::test]
async fn test_value_to_metric_full_key_matches_stats_key() {
    let api_get = [
        ("route", "api"),
        ("http_method", "GET"),
        ("subject_id", "user123"),
    ];
    let key = stats_key(
        &route_method_subject("test-domain", ""),
        "test-domain",
        &api_get,
    )
    .await;
    assert_eq!(key, "test-domain.route_api.http_method_GET.subject_id");
    // Without value_to_metric, and with detailed_metric: the peer asserts
    // only that FullKey is Stats.Key; these are the keys its rules give.
    let plain = "domain: test-domain-2\ndescriptors:\n  - key: route\n    descriptors:\n      - key: http_method\n        descriptors:\n          - { key: subject_id, rate_limit: { requests_per_unit: 60, unit: minute } }\n";
    assert_eq!(
        stats_key(plain, "test-domain-2", &api_get).await,
        "test-domain-2.route.http_method.subject_id"
    );
    let detailed = plain.replace("test-domain-2", "test-domain-3").replace(
        "{ key: subject_id,",
        "{ key: subject_id, detailed_metric: true,",
    );
    let key = stats_key(&detailed, "test-domain-3", &api_get).await;
    assert_eq!(
        key,
        "test-domain-3.route_api.http_method_GET.subject_id_user123"
    );
}

/// `TestWildcardStatsBehavior`'s `t.Run` cases.
mod test_wildcard_stats_behavior {
    use super::stats_key;

    /// `wild: {value}` with `flags`, 20 a minute.
    fn wild(value: &str, flags: &str) -> String {
        format!("domain: test-domain\ndescriptors:\n  - {{ key: wild, value: \"{value}\", {flags}rate_limit: {{ requests_per_unit: 20, unit: minute }} }}\n")
    }

    const FOO1: &[(&str, &str)] = &[("wild", "foo1")];

    #[tokio::test]
    async fn no_flags_preserves_original_behavior_with_wildcard_pattern() {
        assert_eq!(
            stats_key(&wild("foo*", ""), "test-domain", FOO1).await,
            "test-domain.wild_foo*"
        );
    }

    #[tokio::test]
    async fn value_to_metric_uses_runtime_value() {
        let yaml = wild("foo*", "value_to_metric: true, ");
        assert_eq!(
            stats_key(&yaml, "test-domain", FOO1).await,
            "test-domain.wild_foo1"
        );
    }

    #[tokio::test]
    async fn share_threshold_uses_wildcard_pattern_with_star() {
        let yaml = wild("foo*", "share_threshold: true, ");
        assert_eq!(
            stats_key(&yaml, "test-domain", FOO1).await,
            "test-domain.wild_foo*"
        );
    }

    #[tokio::test]
    async fn share_threshold_with_value_to_metric_share_threshold_takes_priority() {
        let yaml = wild("foo*", "share_threshold: true, value_to_metric: true, ");
        assert_eq!(
            stats_key(&yaml, "test-domain", FOO1).await,
            "test-domain.wild_foo*"
        );
    }

    #[tokio::test]
    async fn value_to_metric_in_other_descriptor_wildcard_pattern_preserved() {
        let yaml = "domain: test-domain\ndescriptors:\n  - key: wild\n    value: \"foo*\"\n    descriptors:\n      - key: other\n        value_to_metric: true\n        descriptors:\n          - { key: limit, rate_limit: { requests_per_unit: 20, unit: minute } }\n";
        let entries = [("wild", "foo1"), ("other", "bar"), ("limit", "X")];
        assert_eq!(
            stats_key(yaml, "test-domain", &entries).await,
            "test-domain.wild_foo*.other_bar.limit"
        );
    }

    #[tokio::test]
    async fn middle_trailing_wildcard_no_flags_preserves_wildcard_pattern_in_stats_key() {
        let yaml = wild("foo*bar*", "");
        let first = stats_key(&yaml, "test-domain", &[("wild", "foo123bar456")]).await;
        assert_eq!(first, "test-domain.wild_foo*bar*");
        assert_eq!(
            stats_key(&yaml, "test-domain", &[("wild", "fooXbarY")]).await,
            first
        );
    }

    #[tokio::test]
    async fn middle_trailing_wildcard_value_to_metric_uses_runtime_value() {
        let yaml = wild("foo*bar*", "value_to_metric: true, ");
        let key = stats_key(&yaml, "test-domain", &[("wild", "foo123bar456")]).await;
        assert_eq!(key, "test-domain.wild_foo123bar456");
    }
}
