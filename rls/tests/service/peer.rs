//! envoyproxy/ratelimit's behaviours, on its own test configurations
//! (`tests/peer_config/`, copied with its license): fixed windows with the
//! peer's numbers and statistics, refused hits that count, `hits_addend: 0`,
//! the domain looked up before overrides, `metadata`, `quota_mode`,
//! merged domains and the peer's three response headers. Daily limits, so
//! no window edge falls inside a test in practice.

use crate::support;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::UInt64Value;
use support::{code, descriptor, request, settings, start, stat, status_code, ConfigDir, Harness};
use turnstile_rls::config::{Algorithm, ConfigSet};
use turnstile_rls::Settings;

const BASIC: &str = include_str!("../peer_config/basic_config.yaml");
const METADATA: &str = include_str!("../peer_config/metadata.yaml");
const MERGE_1: &str = include_str!("../peer_config/merge_domain_key1.yaml");
const MERGE_2: &str = include_str!("../peer_config/merge_domain_key2.yaml");
const DOMAIN: &str = "test-domain";
/// 15 a day.
const KEY5: &[(&str, &str)] = &[("key5", "value5")];
/// 1 a day.
const KEY4: &[(&str, &str)] = &[("key4", "anything")];

fn windows(dir: &ConfigDir) -> Settings {
    let mut settings = settings(dir);
    settings.default_algorithm = Algorithm::FixedWindow;
    settings
}

/// One descriptor of `entries` with `hits` (the request's `hits_addend`).
async fn hit(h: &mut Harness, entries: &[(&str, &str)], hits: u32) -> RateLimitResponse {
    let mut req = request(DOMAIN, vec![descriptor(entries)]);
    req.hits_addend = hits;
    h.ask(req).await
}

/// A descriptor's own `hits_addend: 0`: a look.
async fn look(h: &mut Harness, entries: &[(&str, &str)]) -> RateLimitResponse {
    let mut d = descriptor(entries);
    d.hits_addend = Some(UInt64Value { value: 0 });
    h.ask(request(DOMAIN, vec![d])).await
}

#[tokio::test]
async fn refused_hits_count_in_fixed_windows_and_cost_nothing_in_gcra() {
    let dir = ConfigDir::with("basic_config.yaml", BASIC);
    let mut peer = start(windows(&dir)).await;
    // A cost above the limit is over, and counts: the next hit is over too.
    assert_eq!(
        code(hit(&mut peer, KEY5, 16).await.overall_code),
        Code::OverLimit
    );
    assert_eq!(
        code(hit(&mut peer, KEY5, 1).await.overall_code),
        Code::OverLimit
    );

    let mut gcra = start(settings(&dir)).await;
    assert_eq!(
        code(hit(&mut gcra, KEY5, 16).await.overall_code),
        Code::OverLimit
    );
    let next = hit(&mut gcra, KEY5, 1).await;
    assert_eq!(
        code(next.overall_code),
        Code::Ok,
        "GCRA: a refusal costs nothing"
    );
    assert_eq!(next.statuses[0].limit_remaining, 14);
}

#[tokio::test]
async fn stop_cache_key_increment_spares_the_other_descriptors_of_a_refused_request() {
    let dir = ConfigDir::with("basic_config.yaml", BASIC);
    for (stop, key5_left) in [(false, 14), (true, 15)] {
        let mut s = windows(&dir);
        s.stop_cache_key_increment_when_overlimit = stop;
        let mut h = start(s).await;
        let mut over = descriptor(KEY4);
        over.hits_addend = Some(UInt64Value { value: 2 });
        let response = h.ask(request(DOMAIN, vec![descriptor(KEY5), over])).await;
        assert_eq!(code(response.overall_code), Code::OverLimit);
        assert_eq!(
            look(&mut h, KEY5).await.statuses[0].limit_remaining,
            key5_left,
            "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT={stop}"
        );
    }
}

#[tokio::test]
async fn hits_addend_zero_at_the_limit_is_ok_with_nothing_left() {
    let dir = ConfigDir::with("basic_config.yaml", BASIC);
    for settings in [windows(&dir), settings(&dir)] {
        let algorithm = settings.default_algorithm;
        let mut h = start(settings).await;
        assert_eq!(code(hit(&mut h, KEY4, 1).await.overall_code), Code::Ok);
        let at_limit = look(&mut h, KEY4).await;
        assert_eq!(code(at_limit.overall_code), Code::Ok, "{algorithm:?}");
        assert_eq!(at_limit.statuses[0].limit_remaining, 0, "{algorithm:?}");
    }
    // Past the limit (a refused hit counted), a look is over in a window.
    let mut h = start(windows(&dir)).await;
    hit(&mut h, KEY4, 2).await;
    assert_eq!(code(look(&mut h, KEY4).await.overall_code), Code::OverLimit);
}

#[tokio::test]
async fn near_and_over_statistics_split_a_cost_as_the_peer_does() {
    let dir = ConfigDir::with("basic_config.yaml", BASIC);
    for settings in [windows(&dir), settings(&dir)] {
        let mut h = start(settings).await;
        // 15 a day, near past floor(15 × 0.8) = 12: 14 hits, then a cost of 3.
        for _ in 0..14 {
            hit(&mut h, KEY5, 1).await;
        }
        let response = hit(&mut h, KEY5, 3).await;
        assert_eq!(code(response.overall_code), Code::OverLimit);
        let text = h.metrics().await;
        let of = |s| stat(&text, DOMAIN, "key5_value5", s);
        // Hits 13 and 14 near; of the 3, one near (the 15th) and 2 over.
        assert_eq!(of("near_limit"), 3.0);
        assert_eq!(of("over_limit"), 2.0);
        assert_eq!(of("within_limit"), 14.0);
        assert_eq!(of("total_hits"), 17.0);
    }
}

#[tokio::test]
async fn the_domain_is_looked_up_before_a_limit_override() {
    let dir = ConfigDir::with("basic_config.yaml", BASIC);
    let mut h = start(settings(&dir)).await;
    let mut overridden = descriptor(&[("anything", "x")]);
    overridden.limit = Some(RateLimitOverride {
        requests_per_unit: 0,
        unit: 4, // DAY
    });
    let unknown = h
        .ask(request("no-such-domain", vec![overridden.clone()]))
        .await;
    assert_eq!(code(unknown.overall_code), Code::Ok);
    assert!(unknown.statuses[0].current_limit.is_none());
    let known = h.ask(request(DOMAIN, vec![overridden])).await;
    assert_eq!(
        code(known.overall_code),
        Code::OverLimit,
        "the override applies"
    );
}

#[tokio::test]
async fn metadata_is_accepted_and_changes_no_decision() {
    let dir = ConfigDir::with("metadata.yaml", METADATA);
    let mut h = start(settings(&dir)).await;
    let response = hit(&mut h, &[("key2", "v")], 1).await;
    assert_eq!(response.statuses[0].limit_remaining, 19);
}

#[tokio::test]
async fn quota_mode_refuses_only_when_every_quota_descriptor_is_over() {
    let dir = ConfigDir::with(
        "q.yaml",
        "domain: q\ndescriptors:\n  - key: a\n    quota_mode: true\n    rate_limit: { unit: day, requests_per_unit: 1 }\n  - key: b\n    quota_mode: true\n    rate_limit: { unit: day, requests_per_unit: 2 }\n",
    );
    let mut h = start(settings(&dir)).await;
    let both = || {
        request(
            "q",
            vec![descriptor(&[("a", "1")]), descriptor(&[("b", "1")])],
        )
    };
    assert_eq!(code(h.ask(both()).await.overall_code), Code::Ok);
    let one_over = h.ask(both()).await;
    assert_eq!(status_code(&one_over.statuses[0]), Code::OverLimit);
    assert_eq!(code(one_over.overall_code), Code::Ok, "b is still within");
    assert_eq!(code(h.ask(both()).await.overall_code), Code::OverLimit);

    // QUOTA_MODE puts every descriptor in quota mode.
    let dir = ConfigDir::with("basic_config.yaml", BASIC);
    let mut s = settings(&dir);
    s.quota_mode = true;
    let mut h = start(s).await;
    let two = || request(DOMAIN, vec![descriptor(KEY4), descriptor(KEY5)]);
    h.ask(two()).await;
    assert_eq!(code(h.ask(two()).await.overall_code), Code::Ok);
}

#[tokio::test]
async fn merge_domain_config_merges_files_of_one_domain() {
    let dir = ConfigDir::with("merge_domain_key1.yaml", MERGE_1);
    dir.write("merge_domain_key2.yaml", MERGE_2);
    let refused = ConfigSet::load(dir.path(), settings(&dir).load_options())
        .expect_err("refused by default")
        .to_string();
    assert!(refused.contains("duplicate domain"), "{refused}");
    let mut s = settings(&dir);
    s.merge_domain_config = true;
    let mut h = start(s).await;
    let response = h
        .ask(request(
            DOMAIN,
            vec![
                descriptor(&[("key1", "value1")]),
                descriptor(&[("key2", "value2")]),
            ],
        ))
        .await;
    let limits: Vec<u32> = response
        .statuses
        .iter()
        .map(|s| s.current_limit.as_ref().map_or(0, |l| l.requests_per_unit))
        .collect();
    assert_eq!(limits, [10, 20]);
    // The same descriptor in both files is still a duplicate.
    dir.write("merge_domain_key3.yaml", MERGE_2);
    let mut s = settings(&dir);
    s.merge_domain_config = true;
    let error = ConfigSet::load(dir.path(), s.load_options()).expect_err("a duplicate");
    assert!(error.to_string().contains("key2_value2"), "{error}");
}

#[tokio::test]
async fn limit_response_headers_name_the_closest_descriptor() {
    let dir = ConfigDir::with("basic_config.yaml", BASIC);
    let mut s = windows(&dir);
    s.limit_response_headers = true;
    s.limit_remaining_header = "X-Left".into();
    let mut h = start(s).await;
    let headers = |r: &RateLimitResponse| {
        r.response_headers_to_add
            .iter()
            .map(|h| (h.key.clone(), h.value.clone()))
            .collect::<Vec<_>>()
    };
    let first = h
        .ask(request(DOMAIN, vec![descriptor(KEY5), descriptor(KEY4)]))
        .await;
    let reset = first.statuses[1]
        .duration_until_reset
        .expect("a reset")
        .seconds
        .to_string();
    assert_eq!(
        headers(&first),
        [
            ("RateLimit-Limit".into(), "1".into()),
            ("X-Left".into(), "0".into()),
            ("RateLimit-Reset".into(), reset),
        ],
        "key4 has the fewest left"
    );
    let refused = h
        .ask(request(DOMAIN, vec![descriptor(KEY4), descriptor(KEY5)]))
        .await;
    assert_eq!(code(refused.overall_code), Code::OverLimit);
    assert_eq!(headers(&refused)[0].1, "1", "the refusing descriptor, key4");

    // Off by default.
    let mut plain = start(settings(&dir)).await;
    assert!(hit(&mut plain, KEY5, 1)
        .await
        .response_headers_to_add
        .is_empty());
}

#[tokio::test]
async fn fixed_windows_reset_at_the_clock_edge_in_whole_seconds() {
    let dir = ConfigDir::with("basic_config.yaml", BASIC);
    let mut h = start(windows(&dir)).await;
    let response = hit(&mut h, KEY5, 1).await;
    let reset = response.statuses[0].duration_until_reset.expect("a reset");
    assert_eq!(reset.nanos, 0);
    assert!((1..=86_400).contains(&reset.seconds), "{reset:?}");
    assert_eq!(response.statuses[0].limit_remaining, 14);
}
