//! Bad configuration: each mistake is an error naming the file, the line
//! and the field, and the command exits with it instead of serving.

use crate::support;

use support::ConfigDir;
use turnstile_rls::config::{ConfigError, ConfigSet, LoadOptions};

/// Loads one file holding `yaml`; the error's text.
fn error_of(yaml: &str) -> (ConfigError, String) {
    let dir = ConfigDir::with("bad.yaml", yaml);
    let error = ConfigSet::load(dir.path(), LoadOptions::default()).expect_err("refused");
    let text = error.to_string();
    assert!(text.contains("bad.yaml"), "names the file: {text}");
    (error, text)
}

#[test]
fn an_unknown_unit_names_line_and_field() {
    let (error, text) = error_of("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 3\n");
    assert_eq!(error.line(), Some(5), "{text}");
    assert!(text.contains("descriptors[0].rate_limit.unit"), "{text}");
    assert!(
        text.contains("invalid rate limit unit `fortnight`"),
        "{text}"
    );
}

/// A `rate_limit` that is not a mapping says what one looks like, not
/// the name of a type inside the service (`expected struct RawRateLimit`).
#[test]
fn a_rate_limit_that_is_not_a_mapping_says_what_one_is() {
    let (_, text) = error_of("domain: d\ndescriptors:\n  - key: a\n    rate_limit: 10/s\n");
    assert!(text.contains("descriptors[0].rate_limit"), "{text}");
    assert!(
        text.contains("a rate_limit mapping: `unit` and `requests_per_unit`"),
        "{text}"
    );
    assert!(!text.contains("RawRateLimit"), "{text}");
}

#[test]
fn an_unknown_key_is_refused_as_in_envoyproxy_ratelimit() {
    let (error, text) = error_of("domain: d\ndescriptors:\n  - key: a\n    colour: red\n");
    assert_eq!(error.line(), Some(4), "{text}");
    assert!(text.contains("descriptors[0].colour"), "{text}");
    assert!(text.contains("unknown field `colour`"), "{text}");
}

#[test]
fn a_limit_needs_a_unit_unless_unlimited_and_not_both() {
    let (_, text) = error_of(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      requests_per_unit: 3\n",
    );
    assert!(text.contains("`unit` is missing"), "{text}");
    let (_, text) = error_of("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unlimited: true\n      unit: second\n");
    assert!(
        text.contains("`unit` must not be set when `unlimited` is true"),
        "{text}"
    );
}

#[test]
fn replaces_needs_a_name_other_than_its_own() {
    let (_, text) = error_of("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      name: x\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: x\n");
    assert!(text.contains("this limit's own name"), "{text}");
    let (_, text) = error_of("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - {}\n");
    assert!(text.contains("has no `name`"), "{text}");
}

#[test]
fn duplicates_empty_keys_and_missing_domains_are_refused() {
    let (_, text) =
        error_of("domain: d\ndescriptors:\n  - key: a\n    value: v\n  - key: a\n    value: v\n");
    assert!(text.contains("duplicate descriptor `a_v`"), "{text}");
    let (_, text) = error_of("domain: d\ndescriptors:\n  - value: v\n");
    assert!(text.contains("empty or missing `key`"), "{text}");
    let (_, text) = error_of("descriptors: []\n");
    assert!(text.contains("no `domain`"), "{text}");
    let (_, text) = error_of("domain: [unclosed\n");
    assert!(text.contains("line"), "{text}");
}

#[test]
fn two_files_of_one_domain_are_refused() {
    let dir = ConfigDir::with("a.yaml", "domain: d\n");
    dir.write("b.yaml", "domain: d\n");
    let text = ConfigSet::load(dir.path(), LoadOptions::default())
        .expect_err("refused")
        .to_string();
    assert!(
        text.contains("b.yaml") && text.contains("duplicate domain `d`") && text.contains("a.yaml"),
        "{text}"
    );
}

#[test]
fn the_command_exits_with_the_error_instead_of_serving() {
    let dir = ConfigDir::with(
        "bad.yaml",
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n",
    );
    let output = support::command(&dir).output().expect("run turnstile-rls");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("bad.yaml:line 5"), "{stderr}");
    assert!(
        stderr.contains("descriptors[0].rate_limit.unit"),
        "{stderr}"
    );
}
