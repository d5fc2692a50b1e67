//! envoyproxy/ratelimit's own tests, replayed against this service over
//! gRPC: `test/config/config_test.go` on the peer's YAML files, copied
//! unchanged into `tests/peer_config/` (Apache-2.0, its LICENSE there).
//! Each test is named after the peer's test function (`TestBasicConfig` is
//! `test_basic_config`) or `t.Run` case, so a reader can put them side by
//! side.
//!
//! The peer's config tests call `GetLimit` and read the limit it returns;
//! here the same descriptor is sent as a request, and the limit is the
//! status's `current_limit` (none where the peer's is `nil`). The peer's
//! `Stats.Key` (`test-domain.key1_value1.subkey1`) is the `domain` and
//! `descriptor` labels of the `ratelimit_service_rate_limit_total_hits`
//! series the hit counted in. The peer's algorithm (fixed windows) serves
//! every file, as its default does.

use std::collections::HashMap;
use std::path::PathBuf;

use crate::support;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, RateLimit};
use support::{descriptor, request, sample, start, status_code, ConfigDir, Harness};
use turnstile_rls::config::{Algorithm, ConfigSet};
use turnstile_rls::Settings;

const DOMAIN: &str = "test-domain";

/// The peer's file `name`, as copied.
fn peer_file(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/peer_config")
        .join(name)
}

/// A directory holding copies of the peer's `files` (a name twice is
/// copied twice, the second under a `again_` prefix).
fn peer_dir(files: &[&str]) -> ConfigDir {
    let dir = ConfigDir::new();
    for file in files {
        let text = std::fs::read_to_string(peer_file(file)).expect("a peer file");
        let name = if dir.path().join(file).exists() {
            format!("again_{file}")
        } else {
            (*file).to_owned()
        };
        dir.write(&name, &text);
    }
    dir
}

/// Settings for `dir` with the peer's defaults: fixed windows.
fn peer_settings(dir: &ConfigDir) -> Settings {
    let mut settings = support::settings(dir);
    settings.default_algorithm = Algorithm::FixedWindow;
    settings
}

/// A service on the peer's `files`, and its directory (kept alive).
pub(crate) struct Peer {
    pub(crate) h: Harness,
    _dir: ConfigDir,
}

/// What one hit of a descriptor found: the peer's `GetLimit` result seen
/// over gRPC.
#[derive(Debug)]
pub(crate) struct Found {
    code: Code,
    limit: Option<RateLimit>,
    remaining: u32,
    /// `duration_until_reset`, in whole seconds (a fixed window's edge).
    reset: i64,
    /// The peer's `Stats.Key`: `domain.descriptor` of the series the hit
    /// counted in, if any.
    stats_key: Option<String>,
}

impl Found {
    pub(crate) fn limit(&self) -> (u32, Unit) {
        let limit = self.limit.as_ref().expect("a limit");
        (
            limit.requests_per_unit,
            Unit::try_from(limit.unit).expect("a unit"),
        )
    }

    pub(crate) fn stats_key(&self) -> &str {
        self.stats_key
            .as_deref()
            .expect("counted under a stats key")
    }
}

const TOTAL_HITS: &str = "ratelimit_service_rate_limit_total_hits{domain=\"";

/// Every `total_hits` series of a metrics text, as `domain.descriptor`.
fn total_hits(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(TOTAL_HITS)?;
            let (labels, value) = rest.rsplit_once("} ")?;
            let (domain, path) = labels.split_once("\",descriptor=\"")?;
            let path = path.strip_suffix('"')?;
            Some((format!("{domain}.{path}"), value.trim().parse().ok()?))
        })
        .collect()
}

impl Peer {
    /// A service on one file holding `yaml` (the peer's configurations
    /// built in code, written as files).
    pub(crate) async fn serve_yaml(yaml: &str) -> Peer {
        let dir = ConfigDir::with("inline.yaml", yaml);
        Peer {
            h: start(peer_settings(&dir)).await,
            _dir: dir,
        }
    }

    async fn serve(files: &[&str]) -> Peer {
        Peer::serve_with(files, |_| {}).await
    }

    async fn serve_with(files: &[&str], change: impl FnOnce(&mut Settings)) -> Peer {
        let dir = peer_dir(files);
        let mut settings = peer_settings(&dir);
        change(&mut settings);
        Peer {
            h: start(settings).await,
            _dir: dir,
        }
    }

    /// `descriptor` of `domain` sent once with `hits`; what it found.
    async fn send(&mut self, domain: &str, descriptor: RateLimitDescriptor, hits: u32) -> Found {
        let before = total_hits(&self.h.metrics().await);
        let mut req = request(domain, vec![descriptor]);
        req.hits_addend = hits;
        let response = self.h.ask(req).await;
        let after = total_hits(&self.h.metrics().await);
        let counted: Vec<String> = after
            .into_iter()
            .filter(|(key, n)| *n > before.get(key).copied().unwrap_or(0.0))
            .map(|(key, _)| key)
            .collect();
        assert!(counted.len() <= 1, "one series per hit: {counted:?}");
        let status = &response.statuses[0];
        Found {
            code: status_code(status),
            limit: status.current_limit.clone(),
            remaining: status.limit_remaining,
            reset: status.duration_until_reset.map_or(0, |d| d.seconds),
            stats_key: counted.into_iter().next(),
        }
    }

    /// One hit of `entries` in `domain`.
    pub(crate) async fn get(&mut self, domain: &str, entries: &[(&str, &str)]) -> Found {
        self.send(domain, descriptor(entries), 1).await
    }

    /// One hit of `entries` in `test-domain`.
    async fn hit(&mut self, entries: &[(&str, &str)]) -> Found {
        self.get(DOMAIN, entries).await
    }

    /// One hit of each of `sends`, in order, within one fixed window: a
    /// window's count restarts at the clock's edge, so a sequence an edge
    /// fell inside (its last reset later than its first) is sent again.
    async fn in_one_window(&mut self, sends: &[&[(&str, &str)]]) -> Vec<Found> {
        for _ in 0..3 {
            let mut found = Vec::with_capacity(sends.len());
            for entries in sends {
                found.push(self.hit(entries).await);
            }
            if found.last().map(|f| f.reset) <= found.first().map(|f| f.reset) {
                return found;
            }
        }
        panic!("three window edges in three tries of {sends:?}");
    }

    /// Asserts `entries` find no limit (the peer's `GetLimit` is nil).
    async fn assert_no_limit(&mut self, domain: &str, entries: &[(&str, &str)]) {
        let found = self.get(domain, entries).await;
        assert_eq!(found.code, Code::Ok, "{entries:?}");
        assert!(found.limit.is_none(), "{entries:?}: {found:?}");
        assert!(found.stats_key.is_none(), "{entries:?}: {found:?}");
    }

    /// Asserts `entries` find `rpu` a `unit`, counted under `stats_key`.
    async fn assert_limit(
        &mut self,
        entries: &[(&str, &str)],
        rpu: u32,
        unit: Unit,
        stats_key: &str,
    ) {
        let found = self.hit(entries).await;
        assert_eq!(found.limit(), (rpu, unit), "{entries:?}");
        assert_eq!(found.stats_key(), stats_key, "{entries:?}");
    }

    /// `ratelimit_service_rate_limit_STAT` of `key` (`domain.descriptor`).
    pub(crate) async fn stat(&self, key: &str, stat: &str) -> f64 {
        let (domain, path) = key.split_once('.').expect("domain.descriptor");
        let text = self.h.metrics().await;
        let name = format!(
            "ratelimit_service_rate_limit_{stat}{{domain=\"{domain}\",descriptor=\"{path}\"}}"
        );
        sample(&text, &name).unwrap_or(0.0)
    }
}

/// The peer's `domain_not_found` count of `domain`.
async fn domain_not_found(h: &Harness, domain: &str) -> f64 {
    let name = format!("ratelimit_service_rate_limit_domain_not_found{{domain=\"{domain}\"}}");
    sample(&h.metrics().await, &name).unwrap_or(0.0)
}

#[tokio::test]
async fn test_basic_config() {
    let mut p = Peer::serve(&["basic_config.yaml"]).await;
    assert_eq!(domain_not_found(&p.h, "foo_domain").await, 0.0);
    p.assert_no_limit("foo_domain", &[]).await;
    assert_eq!(domain_not_found(&p.h, "foo_domain").await, 1.0);
    p.assert_no_limit(DOMAIN, &[]).await;
    assert_eq!(domain_not_found(&p.h, DOMAIN).await, 0.0);

    p.assert_no_limit(DOMAIN, &[("key1", "something")]).await;
    p.assert_no_limit(DOMAIN, &[("key1", "value1")]).await;
    p.assert_no_limit(DOMAIN, &[("key2", "value2"), ("subkey", "subvalue")])
        .await;
    p.assert_no_limit(DOMAIN, &[("key5", "value5"), ("subkey5", "subvalue")])
        .await;

    let (second, minute) = (Unit::Second, Unit::Minute);
    p.assert_limit(
        &[("key1", "value1"), ("subkey1", "something")],
        5,
        second,
        "test-domain.key1_value1.subkey1",
    )
    .await;
    p.assert_limit(
        &[("key1", "value1"), ("subkey1", "subvalue1")],
        10,
        second,
        "test-domain.key1_value1.subkey1_subvalue1",
    )
    .await;
    p.assert_limit(&[("key2", "something")], 20, minute, "test-domain.key2")
        .await;
    p.assert_limit(&[("key2", "value2")], 30, minute, "test-domain.key2_value2")
        .await;
    p.assert_no_limit(DOMAIN, &[("key2", "value3")]).await;

    let key3 = p.hit(&[("key3", "foo")]).await;
    assert_eq!(key3.limit(), (1, Unit::Hour));
    assert_eq!(
        key3.limit.as_ref().map(|l| l.name.as_str()),
        Some(""),
        "no name provided in config"
    );
    assert_eq!(key3.stats_key(), "test-domain.key3");
    let key4 = p.hit(&[("key4", "foo")]).await;
    assert_eq!(key4.limit(), (1, Unit::Day));
    assert_eq!(
        key4.limit.as_ref().map(|l| l.name.as_str()),
        Some("key4_rate_limit")
    );
    assert_eq!(key4.stats_key(), "test-domain.key4");

    // Unlimited: the peer's service answers OK with 2^32 - 1 left and no
    // limit, and passes nothing to its cache (so counts nothing).
    let key6 = p.hit(&[("key6", "foo")]).await;
    assert_eq!(key6.code, Code::Ok);
    assert_eq!(key6.remaining, u32::MAX);
    assert!(key6.limit.is_none());

    // detailed_metric: the value is in the statistics' key.
    p.assert_limit(
        &[("key7", "unspecified_value")],
        70,
        minute,
        "test-domain.key7_unspecified_value",
    )
    .await;
    p.assert_limit(
        &[("key7", "another_value")],
        70,
        minute,
        "test-domain.key7_another_value",
    )
    .await;
}

#[tokio::test]
async fn test_domain_merge() {
    let mut p = Peer::serve_with(&["merge_domain_key1.yaml", "merge_domain_key2.yaml"], |s| {
        s.merge_domain_config = true;
    })
    .await;
    p.assert_no_limit("foo_domain", &[]).await;
    p.assert_no_limit(DOMAIN, &[]).await;
    assert_eq!(p.hit(&[("key1", "value1")]).await.limit().0, 10);
    assert_eq!(p.hit(&[("key2", "value2")]).await.limit().0, 20);
}

fn with_override(entries: &[(&str, &str)], rpu: u32, unit: RateLimitUnit) -> RateLimitDescriptor {
    let mut d = descriptor(entries);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: rpu,
        unit: unit as i32,
    });
    d
}

#[tokio::test]
async fn test_config_limit_override() {
    let mut p = Peer::serve(&["basic_config.yaml"]).await;
    // No matching domain: no limit, the override notwithstanding.
    let unknown = p
        .send("foo_domain", with_override(&[], 10, RateLimitUnit::Day), 1)
        .await;
    assert!(unknown.limit.is_none(), "{unknown:?}");
    assert!(unknown.stats_key.is_none(), "{unknown:?}");

    let something = [("key1", "value1"), ("subkey1", "something")];
    let first = p
        .send(DOMAIN, with_override(&something, 10, RateLimitUnit::Day), 1)
        .await;
    assert_eq!(first.limit(), (10, Unit::Day));
    assert_eq!(first.limit.as_ref().map(|l| l.name.as_str()), Some(""));
    assert_eq!(
        first.stats_key(),
        "test-domain.key1_value1.subkey1_something"
    );

    // A change in the override's value does not erase the statistics.
    let changed = p
        .send(
            DOMAIN,
            with_override(&something, 42, RateLimitUnit::Hour),
            1,
        )
        .await;
    assert_eq!(changed.limit(), (42, Unit::Hour));
    assert_eq!(
        changed.stats_key(),
        "test-domain.key1_value1.subkey1_something"
    );
    assert_eq!(
        p.stat("test-domain.key1_value1.subkey1_something", "total_hits")
            .await,
        2.0
    );

    // A different value counts apart.
    let other = [("key1", "value1"), ("subkey1", "something_else")];
    let other = p
        .send(DOMAIN, with_override(&other, 42, RateLimitUnit::Hour), 1)
        .await;
    assert_eq!(other.limit(), (42, Unit::Hour));
    assert_eq!(
        other.stats_key(),
        "test-domain.key1_value1.subkey1_something_else"
    );
    assert_eq!(
        p.stat(
            "test-domain.key1_value1.subkey1_something_else",
            "total_hits"
        )
        .await,
        1.0
    );
}

/// Loading the peer's `files` (with `merge`) is refused; the error's text,
/// which names the file that is wrong (`culprit`), as the peer's does.
fn refused(files: &[&str], merge: bool, culprit: &str) -> String {
    let dir = peer_dir(files);
    let mut settings = peer_settings(&dir);
    settings.merge_domain_config = merge;
    let error = ConfigSet::load(dir.path(), settings.load_options())
        .expect_err("the peer refuses this configuration")
        .to_string();
    assert!(error.contains(culprit), "names {culprit}: {error}");
    error
}

/// Asserts the error of loading the peer's file `file` alone says each of
/// `meaning` (the peer's message, in this service's words).
fn assert_refused(file: &str, meaning: &[&str]) {
    let error = refused(&[file], false, file);
    for part in meaning {
        assert!(error.contains(part), "{file}: says {part:?}: {error}");
    }
}

#[test]
fn test_empty_domain() {
    // The peer: "config file cannot have empty domain".
    assert_refused(
        "empty_domain.yaml",
        &["empty_domain.yaml: (root): the file has no `domain` (or an empty one)"],
    );
}

#[test]
fn test_duplicate_domain() {
    // The peer: "duplicate domain 'test-domain' in config file".
    let error = refused(
        &["basic_config.yaml", "duplicate_domain.yaml"],
        false,
        "duplicate_domain.yaml",
    );
    assert!(error.contains("duplicate domain"), "{error}");
    assert!(error.contains("test-domain"), "{error}");
}

#[test]
fn test_empty_key() {
    // The peer: "descriptor has empty key".
    assert_refused("empty_key.yaml", &["an empty or missing `key`"]);
}

#[test]
fn test_duplicate_key() {
    // The peer: "duplicate descriptor composite key 'test-domain.key1_value1'".
    assert_refused("duplicate_key.yaml", &["duplicate", "key1_value1"]);
}

#[test]
fn test_duplicate_key_domain_merge() {
    // The peer: "duplicate descriptor composite key 'test-domain.key1_value1'",
    // the same file loaded twice with MERGE_DOMAIN_CONFIG.
    let error = refused(
        &["merge_domain_key1.yaml", "merge_domain_key1.yaml"],
        true,
        "merge_domain_key1.yaml",
    );
    assert!(error.contains("duplicate descriptor"), "{error}");
    assert!(error.contains("key1_value1"), "{error}");
}

#[test]
fn test_bad_limit_unit() {
    // The peer: "invalid rate limit unit 'foo'".
    assert_refused("bad_limit_unit.yaml", &["invalid rate limit unit", "foo"]);
}

#[test]
fn test_replaces_self() {
    // The peer: "replaces should not contain name of same descriptor".
    assert_refused(
        "replaces_self.yaml",
        &["`replaces` names `self`, this limit's own name"],
    );
}

#[test]
fn test_replaces_empty() {
    // The peer: "should not have an empty replaces entry".
    assert_refused("replaces_empty.yaml", &["a `replaces` entry has no `name`"]);
}

#[test]
fn test_bad_yaml() {
    // The peer: "error loading config file: yaml: line 2: found unexpected
    // end of stream".
    assert_refused("bad_yaml.yaml", &["line 2", "unexpected end of stream"]);
}

#[test]
fn test_misspelled_key() {
    // The peer: "config error, unknown key 'ratelimit'", then
    // "config error, unknown key 'requestsperunit'".
    assert_refused("misspelled_key.yaml", &["unknown field", "ratelimit"]);
    assert_refused(
        "misspelled_key2.yaml",
        &["unknown field", "requestsperunit"],
    );
}

#[test]
fn test_non_string_key() {
    // The peer: "config error, key is not of type string: 0.25".
    assert_refused("non_string_key.yaml", &["unknown field `0.25`"]);
}

#[test]
fn test_non_map_list() {
    // The peer: "config error, yaml file contains list of type other than
    // map: a".
    // Here the list's first item, not a mapping, says what one is (and not
    // the name of a type inside the service).
    let error = refused(&["non_map_list.yaml"], false, "non_map_list.yaml");
    assert!(
        error.contains("descriptors[0]: invalid type: string \"a\", expected a descriptor mapping"),
        "{error}"
    );
    assert!(!error.contains("Raw"), "{error}");
}

#[test]
fn test_unlimited_with_rate_limit_unit() {
    // The peer: "should not specify rate limit unit when unlimited".
    assert_refused(
        "unlimited_with_unit.yaml",
        &["`unit` must not be set when `unlimited` is true"],
    );
}

/// One request of `entries` costing `hits`; whether shadow mode let an
/// over-limit answer through (the peer's `ShadowMode`), by the answer and
/// by the `shadow_mode` statistic of `stats_key`.
async fn shadowed(p: &mut Peer, entries: &[(&str, &str)], hits: u32, stats_key: &str) -> bool {
    let found = p.send(DOMAIN, descriptor(entries), hits).await;
    assert_eq!(found.stats_key(), stats_key);
    let counted = p.stat(stats_key, "shadow_mode").await > 0.0;
    assert_eq!(found.code == Code::Ok, counted, "{found:?}");
    counted
}

#[tokio::test]
async fn test_shadow_mode_config() {
    let mut p = Peer::serve(&["shadowmode_config.yaml"]).await;
    // Each limit asked for one more than it allows, in one request (so in
    // one window).
    let sub = [("key1", "value1"), ("subkey1", "something")];
    assert_eq!(p.hit(&sub).await.limit(), (5, Unit::Second));
    assert!(!shadowed(&mut p, &sub, 6, "test-domain.key1_value1.subkey1").await);

    let subvalue = [("key1", "value1"), ("subkey1", "subvalue1")];
    assert_eq!(p.hit(&subvalue).await.limit(), (10, Unit::Second));
    assert!(
        shadowed(
            &mut p,
            &subvalue,
            11,
            "test-domain.key1_value1.subkey1_subvalue1"
        )
        .await
    );

    assert_eq!(
        p.hit(&[("key2", "something")]).await.limit(),
        (20, Unit::Minute)
    );
    assert!(shadowed(&mut p, &[("key2", "something")], 21, "test-domain.key2").await);

    assert_eq!(
        p.hit(&[("key2", "value2")]).await.limit(),
        (30, Unit::Minute)
    );
    assert!(!shadowed(&mut p, &[("key2", "value2")], 31, "test-domain.key2_value2").await);
}

#[tokio::test]
async fn test_wildcard_config() {
    let mut p = Peer::serve(&["wildcard.yaml"]).await;
    let minute = Unit::Minute;
    // Baseline: a key without a value matches any value, one statistic.
    p.assert_limit(&[("noVal", "foo1")], 20, minute, "test-domain.noVal")
        .await;
    p.assert_limit(&[("noVal", "foo2")], 20, minute, "test-domain.noVal")
        .await;

    // Matches several values, with the pattern in the statistics' key.
    p.assert_limit(&[("wild", "foo1")], 20, minute, "test-domain.wild_foo*")
        .await;
    p.assert_limit(&[("wild", "foo2")], 20, minute, "test-domain.wild_foo*")
        .await;
    p.assert_limit(
        &[("nestedWild", "val1"), ("wild", "goo2")],
        20,
        minute,
        "test-domain.nestedWild_val1.wild_goo*",
    )
    .await;

    p.assert_no_limit(DOMAIN, &[("wild", "bar")]).await;
    // A value without a wildcard does not match eagerly.
    p.assert_no_limit(DOMAIN, &[("noWild", "foo1")]).await;

    // A middle wildcard, the empty middle included.
    p.assert_limit(
        &[("midWild", "barab")],
        20,
        minute,
        "test-domain.midWild_bar*b",
    )
    .await;
    p.assert_limit(
        &[("midWild", "bar123b")],
        20,
        minute,
        "test-domain.midWild_bar*b",
    )
    .await;
    p.assert_limit(
        &[("midWild", "barb")],
        20,
        minute,
        "test-domain.midWild_bar*b",
    )
    .await;
    p.assert_no_limit(DOMAIN, &[("midWild", "bara")]).await;
    p.assert_no_limit(DOMAIN, &[("midWild", "xbarb")]).await;

    // Several wildcards, in order.
    p.assert_limit(
        &[("multiWild", "foo123bar456baz")],
        10,
        minute,
        "test-domain.multiWild_foo*bar*baz",
    )
    .await;
    p.assert_limit(
        &[("multiWild", "foobarbaz")],
        10,
        minute,
        "test-domain.multiWild_foo*bar*baz",
    )
    .await;
    p.assert_no_limit(DOMAIN, &[("multiWild", "foo123baz")])
        .await;
    p.assert_no_limit(DOMAIN, &[("multiWild", "bar456baz")])
        .await;
}

/// `TestShareThreshold`'s `t.Run` cases, on one service as there. The
/// peer's `ShareThresholdKeyPattern` is observable as one bucket: values
/// matching a shared wildcard spend one count.
mod test_share_threshold {
    use super::*;

    async fn share_threshold() -> Peer {
        Peer::serve(&["share_threshold.yaml"]).await
    }

    /// Hits `key` with each of `values`; asserts one limit of `rpu` a
    /// minute, one bucket (each hit leaves one fewer), and `stats_key` for
    /// all.
    async fn assert_shared(p: &mut Peer, key: &str, values: &[&str], rpu: u32, stats_key: &str) {
        let sends: Vec<[(&str, &str); 1]> = values.iter().map(|v| [(key, *v)]).collect();
        let sends: Vec<&[(&str, &str)]> = sends.iter().map(|s| &s[..]).collect();
        let found = p.in_one_window(&sends).await;
        let first = found[0].remaining;
        for (i, (found, value)) in found.iter().zip(values).enumerate() {
            assert_eq!(found.limit(), (rpu, Unit::Minute), "{value}");
            assert_eq!(
                found.remaining + i as u32,
                first,
                "{value}: one shared bucket"
            );
            assert_eq!(found.stats_key(), stats_key, "{value}");
        }
    }

    #[tokio::test]
    async fn basic_share_threshold() {
        let mut p = share_threshold().await;
        let values = ["files/a.pdf", "files/b.csv", "files/c.txt"];
        assert_shared(&mut p, "files", &values, 100, "test-domain.files_files/*").await;
    }

    #[tokio::test]
    async fn share_threshold_with_metrics() {
        let mut p = share_threshold().await;
        // share_threshold wins over value_to_metric and detailed_metric.
        let route = p.hit(&[("route", "api/v1"), ("method", "GET")]).await;
        assert_eq!(route.limit(), (60, Unit::Minute));
        assert_eq!(route.stats_key(), "test-domain.route_api/*.method");
        let service = p.hit(&[("service", "svc/user"), ("endpoint", "get")]).await;
        assert_eq!(service.limit(), (80, Unit::Minute));
        assert_eq!(
            service.stats_key(),
            "test-domain.service_svc/*.endpoint_get"
        );
    }

    #[tokio::test]
    async fn nested_wildcards() {
        let mut p = share_threshold().await;
        let nested = p
            .hit(&[("nested", "parent"), ("files", "nested/file1.txt")])
            .await;
        assert_eq!(nested.limit(), (200, Unit::Minute));
        assert_eq!(
            nested.stats_key(),
            "test-domain.nested_parent.files_nested/*"
        );

        let two: &[(&str, &str)] = &[("files", "top/file1.txt"), ("files", "nested/file1.txt")];
        let again: &[(&str, &str)] = &[("files", "top/x"), ("files", "nested/y")];
        let found = p.in_one_window(&[two, again]).await;
        assert_eq!(found[0].limit(), (300, Unit::Minute));
        assert_eq!(
            found[0].stats_key(),
            "test-domain.files_top/*.files_nested/*"
        );
        // Both levels shared: other values spend the same bucket.
        assert_eq!(found[1].remaining + 1, found[0].remaining);

        // The parent shares, the child (a wildcard without share_threshold)
        // keeps the original behaviour: its pattern in the statistics' key,
        // a bucket per value.
        let mixed: &[(&str, &str)] =
            &[("path", "path/foo"), ("file", "file/doc1"), ("type", "pdf")];
        let other_file: &[(&str, &str)] =
            &[("path", "path/bar"), ("file", "file/doc2"), ("type", "pdf")];
        let same_file: &[(&str, &str)] =
            &[("path", "path/bar"), ("file", "file/doc1"), ("type", "pdf")];
        let found = p.in_one_window(&[mixed, other_file, same_file]).await;
        assert_eq!(found[0].limit(), (120, Unit::Minute));
        assert_eq!(
            found[0].stats_key(),
            "test-domain.path_path/*.file_file/*.type"
        );
        assert_eq!(
            found[1].remaining, found[0].remaining,
            "file/doc2 has its own bucket"
        );
        assert_eq!(
            found[2].remaining + 1,
            found[0].remaining,
            "path/* is shared"
        );

        let both = p
            .hit(&[
                ("user", "user/alice"),
                ("resource", "res/file1"),
                ("action", "read"),
            ])
            .await;
        assert_eq!(both.limit(), (150, Unit::Minute));
        assert_eq!(
            both.stats_key(),
            "test-domain.user_user/*.resource_res/*.action"
        );
    }

    #[tokio::test]
    async fn explicit_value_precedence_over_wildcard() {
        let mut p = share_threshold().await;
        let test1 = p.hit(&[("file", "test1")]).await;
        assert_eq!(test1.limit(), (50, Unit::Minute), "test1's own limit");
        assert_eq!(test1.stats_key(), "test-domain.file_test1");
        assert_eq!(test1.remaining, 49);
        let values = ["test2", "test23", "test123"];
        assert_shared(&mut p, "file", &values, 100, "test-domain.file_test*").await;
        assert_eq!(p.stat("test-domain.file_test*", "total_hits").await, 3.0);
        assert_eq!(p.stat("test-domain.file_test1", "total_hits").await, 1.0);
    }

    #[tokio::test]
    async fn share_threshold_with_middle_wildcard() {
        let mut p = share_threshold().await;
        let values = ["/api/v1", "/api-beta-v1", "/apiXYZv1"];
        assert_shared(
            &mut p,
            "midpath",
            &values,
            100,
            "test-domain.midpath_/api*v1",
        )
        .await;
        p.assert_no_limit(DOMAIN, &[("midpath", "/api/v2")]).await;
    }

    #[tokio::test]
    async fn share_threshold_with_multi_wildcard() {
        let mut p = share_threshold().await;
        let values = ["svcAepBrpc", "svcXXXepYYYrpc", "svceprpc"];
        assert_shared(
            &mut p,
            "multiroute",
            &values,
            50,
            "test-domain.multiroute_svc*ep*rpc",
        )
        .await;
        p.assert_no_limit(DOMAIN, &[("multiroute", "svcABCrpc")])
            .await;
    }

    #[tokio::test]
    async fn share_threshold_priority_over_value_to_metric_with_middle_wildcard() {
        let mut p = share_threshold().await;
        assert_shared(
            &mut p,
            "midroute",
            &["/api/v2", "/api-beta-v2"],
            80,
            "test-domain.midroute_/api*v2",
        )
        .await;
    }

    #[tokio::test]
    async fn share_threshold_with_nested_middle_wildcards() {
        let mut p = share_threshold().await;
        let first: &[(&str, &str)] = &[("tenant", "t1prod"), ("resource", "resAv2")];
        let second: &[(&str, &str)] = &[("tenant", "t99prod"), ("resource", "resBBBv2")];
        let found = p.in_one_window(&[first, second]).await;
        assert_eq!(found[0].limit(), (60, Unit::Minute));
        assert_eq!(
            found[0].stats_key(),
            "test-domain.tenant_t*prod.resource_res*v2"
        );
        assert_eq!(found[1].stats_key(), found[0].stats_key());
        assert_eq!(
            found[1].remaining + 1,
            found[0].remaining,
            "one shared bucket"
        );
    }
}

#[tokio::test]
async fn test_metadata() {
    let mut p = Peer::serve(&["metadata.yaml"]).await;
    p.assert_no_limit(DOMAIN, &[]).await;
    p.assert_limit(
        &[("key1", "value1"), ("subkey1", "something")],
        5,
        Unit::Second,
        "test-domain.key1_value1.subkey1",
    )
    .await;
    p.assert_limit(
        &[("key2", "something")],
        20,
        Unit::Minute,
        "test-domain.key2",
    )
    .await;
    // The peer's `rl.Metadata` (`name: service_1`, `service_with_quota`)
    // is returned only as Envoy's dynamic metadata under its
    // RESPONSE_DYNAMIC_METADATA, which this service does not serve
    // (README, "Not supported"): the field loads and changes no decision.
}
