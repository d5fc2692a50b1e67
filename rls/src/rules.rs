//! `Rules`: the configuration compiled into a lookup tree per domain, each
//! limit holding its buckets, and the lookup itself.
//!
//! The lookup is envoyproxy/ratelimit's `GetLimit`: a request descriptor's
//! entries walk the tree from the domain's top level, one level per entry.
//! At each level `key_value` is tried first, then the level's wildcards
//! (values with `*`) in file order, then `key` alone (a default for any
//! value). A limit applies only if it sits on the node the **last** entry
//! reached: a descriptor longer or shorter than the configured path gets
//! no limit, and the walk stops early when a node has no children.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;

use crate::bucket::Bucket;
use crate::config::{ConfigError, ConfigSet, DescriptorConfig, Limit};
use crate::stats::{DescriptorStats, ServiceStats};

/// Every domain's compiled tree.
#[derive(Debug, Default)]
pub struct Rules {
    domains: HashMap<String, Domain>,
}

/// One domain's tree, and what its lookups must build: a request is not
/// charged for a fixed window's cache key or a detailed statistics path
/// its domain never uses.
#[derive(Debug, Default)]
struct Domain {
    root: Node,
    /// Some limit of the domain is a fixed window.
    has_windows: bool,
    /// Some limit of the domain has `detailed_metric`.
    has_detailed: bool,
}

/// One configured limit (a node with a `rate_limit` block).
#[derive(Debug)]
pub struct Rule {
    /// The domain.
    pub domain: String,
    /// The node's path under the domain, as envoyproxy/ratelimit names its
    /// statistics: `key_value.key` (a node without a value is its key).
    pub path: String,
    /// The limit, or `None` for `unlimited`.
    pub limit: Option<Limit>,
    /// `rate_limit.name`.
    pub name: Option<String>,
    /// `rate_limit.replaces`.
    pub replaces: Vec<String>,
    /// `shadow_mode`.
    pub shadow_mode: bool,
    /// `detailed_metric`.
    pub detailed_metric: bool,
    /// `quota_mode`.
    pub quota_mode: bool,
    /// The buckets (`None` for `unlimited`).
    pub bucket: Option<Arc<Bucket>>,
    /// The counters of [`path`](Rule::path).
    pub stats: DescriptorStats,
}

#[derive(Debug, Default)]
struct Node {
    /// Children by composite key (`key` or `key_value`).
    children: HashMap<String, Node>,
    /// The children whose value has a `*`, in file order.
    wildcards: Vec<Wildcard>,
    rule: Option<Arc<Rule>>,
    value_to_metric: bool,
    share_threshold: bool,
}

#[derive(Debug)]
struct Wildcard {
    composite: String,
    /// The configured value (the pattern), for metrics and shared buckets.
    value: String,
    parts: Vec<String>,
}

impl Wildcard {
    fn new(composite: &str, value: &str) -> Wildcard {
        Wildcard {
            composite: composite.to_owned(),
            value: value.to_owned(),
            parts: composite.split('*').map(str::to_owned).collect(),
        }
    }

    /// envoyproxy/ratelimit's `wildcardMatch`: the parts in order, the first
    /// a prefix and the last a suffix.
    fn matches(&self, text: &str) -> bool {
        let (first, last) = match (self.parts.first(), self.parts.last()) {
            (Some(f), Some(l)) if self.parts.len() >= 2 => (f, l),
            _ => return self.composite == text,
        };
        // Both ends checked before slicing, so the cuts fall on character
        // boundaries whatever the request sends.
        if text.len() < first.len() + last.len()
            || !text.starts_with(first.as_str())
            || !text.ends_with(last.as_str())
        {
            return false;
        }
        let mut rest = &text[first.len()..text.len() - last.len()];
        for middle in &self.parts[1..self.parts.len() - 1] {
            match rest.find(middle.as_str()) {
                Some(at) => rest = &rest[at + middle.len()..],
                None => return false,
            }
        }
        true
    }
}

/// What a request descriptor matched.
#[derive(Debug)]
pub struct Match {
    /// The limit.
    pub rule: Arc<Rule>,
    /// The bucket's key within the limit: the entries' values (a shared
    /// wildcard's pattern in place of the value).
    pub bucket_key: String,
    /// The statistics' path when it is not the rule's own
    /// (`detailed_metric`, `value_to_metric`).
    pub stat_path: Option<String>,
    /// envoyproxy/ratelimit's cache key without its window:
    /// `domain_key1_value1_key2_value2_` (a shared wildcard's pattern in
    /// place of the value), for fixed windows.
    pub window_key: String,
}

/// Where a limit sits: its domain and the composite keys (`key` or
/// `key_value`) from the domain's top level down to it. Keys, not the
/// dotted path: keys and values may hold dots.
pub type Site = (String, Vec<String>);

/// A configured limit and where it sits, for the backend to build its
/// buckets before [`Rules::build`].
#[derive(Clone, Debug)]
pub struct LimitSite {
    /// The file that configures it.
    pub file: PathBuf,
    /// Its domain and trail.
    pub site: Site,
    /// The dotted path (`key_value.key`), for names and errors.
    pub path: String,
    /// The limit.
    pub limit: Limit,
}

/// The buckets of a configuration's limits, by site.
pub type Buckets = HashMap<Site, Arc<Bucket>>;

impl Rules {
    /// Every limit `config` configures (not `unlimited` ones), in file order.
    pub fn limit_sites(config: &ConfigSet) -> Vec<LimitSite> {
        fn walk(
            file: &Path,
            domain: &str,
            descriptors: &[DescriptorConfig],
            prefix: &str,
            trail: &[String],
            out: &mut Vec<LimitSite>,
        ) {
            for descriptor in descriptors {
                let composite = descriptor.composite_key();
                let path = join_path(prefix, &composite);
                let mut here = trail.to_vec();
                here.push(composite);
                if let Some(limit) = descriptor.rate_limit.as_ref().and_then(|r| r.limit) {
                    out.push(LimitSite {
                        file: file.to_path_buf(),
                        site: (domain.to_owned(), here.clone()),
                        path: path.clone(),
                        limit,
                    });
                }
                walk(file, domain, &descriptor.descriptors, &path, &here, out);
            }
        }
        let mut out = Vec::new();
        for (file, domain) in &config.domains {
            walk(file, &domain.domain, &domain.descriptors, "", &[], &mut out);
        }
        out
    }

    /// Compiles `config` with the `buckets` built for its
    /// [`limit_sites`](Rules::limit_sites): plain data, no I/O.
    pub fn build(
        config: &ConfigSet,
        stats: &ServiceStats,
        buckets: &Buckets,
    ) -> Result<Rules, ConfigError> {
        let mut domains = HashMap::new();
        for (file, domain) in &config.domains {
            let mut root = Node::default();
            let builder = Builder {
                file,
                domain: &domain.domain,
                stats,
                buckets,
            };
            builder.children(&mut root, &domain.descriptors, "", &[])?;
            let mut rules = Vec::new();
            root.collect(&mut rules);
            domains.insert(
                domain.domain.clone(),
                Domain {
                    root,
                    has_windows: rules.iter().any(|r| {
                        r.limit
                            .is_some_and(|l| l.algorithm == crate::config::Algorithm::FixedWindow)
                    }),
                    has_detailed: rules.iter().any(|r| r.detailed_metric),
                },
            );
        }
        Ok(Rules { domains })
    }

    /// The bucket of the limit at `site`, if it is `limit` exactly (a
    /// reload keeps it, and so its state).
    pub fn bucket_at(&self, site: &Site, limit: &Limit) -> Option<Arc<Bucket>> {
        let mut node = &self.domains.get(&site.0)?.root;
        for part in &site.1 {
            node = node.children.get(part)?;
        }
        let rule = node.rule.as_ref()?;
        (rule.limit.as_ref() == Some(limit))
            .then(|| rule.bucket.clone())
            .flatten()
    }

    /// The limit for one request descriptor of `domain`, if any.
    pub fn lookup(&self, domain: &str, entries: &[Entry]) -> Option<Match> {
        let tree = self.domains.get(domain)?;
        let mut node = &tree.root;
        let mut found = None;
        let mut detailed = String::new();
        let mut valued = String::new();
        let mut bucket_key = String::new();
        let mut window_key = if tree.has_windows {
            window_key_start(domain)
        } else {
            String::new()
        };
        let mut composite = String::new();
        for (i, entry) in entries.iter().enumerate() {
            composite.clear();
            composite.push_str(&entry.key);
            composite.push('_');
            composite.push_str(&entry.value);
            let mut next = node.children.get(composite.as_str());
            let mut wildcard = None;
            if next.is_none() {
                if let Some(w) = node.wildcards.iter().find(|w| w.matches(&composite)) {
                    next = node.children.get(&w.composite);
                    wildcard = Some(w);
                }
            }
            let by_value = next.is_some();
            if next.is_none() {
                next = node.children.get(&entry.key);
            }
            let Some(child) = next else { break };
            // The value that names this level in the bucket key and the
            // metrics: a shared wildcard is one bucket, whatever the value.
            let shared = wildcard
                .filter(|_| child.share_threshold)
                .map(|w| w.value.as_str());
            push_part(&mut bucket_key, shared.unwrap_or(&entry.value));
            if tree.has_windows {
                push_window_part(&mut window_key, &entry.key, shared.unwrap_or(&entry.value));
            }
            let metric_value = match (wildcard, shared) {
                (_, Some(pattern)) => Some(pattern),
                (Some(_), None) if child.value_to_metric => Some(entry.value.as_str()),
                (Some(w), None) => Some(w.value.as_str()),
                (None, _) if by_value || child.value_to_metric => Some(entry.value.as_str()),
                (None, _) => None,
            };
            push_path(&mut valued, &entry.key, metric_value);
            if tree.has_detailed {
                push_path(
                    &mut detailed,
                    &entry.key,
                    shared.or(Some(entry.value.as_str())),
                );
            }
            if i + 1 == entries.len() {
                found = child.rule.clone();
            }
            if child.children.is_empty() {
                break;
            }
            node = child;
        }
        let rule = found?;
        let stat_path = if rule.detailed_metric {
            Some(detailed)
        } else {
            Some(valued).filter(|p| *p != rule.path)
        };
        Some(Match {
            rule,
            bucket_key,
            stat_path,
            window_key,
        })
    }

    /// Whether `domain` is configured.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// Every configured limit, for the gauges.
    pub fn rules(&self) -> Vec<Arc<Rule>> {
        let mut out = Vec::new();
        for domain in self.domains.values() {
            domain.root.collect(&mut out);
        }
        out
    }

    /// The configured domains.
    pub fn domains(&self) -> impl Iterator<Item = &str> {
        self.domains.keys().map(String::as_str)
    }
}

impl Node {
    /// This node's limit and every one below it.
    fn collect(&self, out: &mut Vec<Arc<Rule>>) {
        out.extend(self.rule.clone());
        for child in self.children.values() {
            child.collect(out);
        }
    }
}

/// Appends a value to a bucket key, length-prefixed so that no two lists
/// of values make the same key (`{len}:{value}`, the length in decimal,
/// written without the formatting machinery: this runs per request).
pub(crate) fn push_part(key: &mut String, value: &str) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut len = value.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (len % 10) as u8;
        len /= 10;
        if len == 0 {
            break;
        }
    }
    for &d in &digits[at..] {
        key.push(char::from(d));
    }
    key.push(':');
    key.push_str(value);
}

/// The start of envoyproxy/ratelimit's cache key: `domain_`.
pub(crate) fn window_key_start(domain: &str) -> String {
    format!("{domain}_")
}

/// Appends one entry to envoyproxy/ratelimit's cache key: `key_value_`.
pub(crate) fn push_window_part(key: &mut String, entry_key: &str, value: &str) {
    key.push_str(entry_key);
    key.push('_');
    key.push_str(value);
    key.push('_');
}

/// Appends `key` or `key_value` to a dotted statistics path.
pub(crate) fn push_path(path: &mut String, key: &str, value: Option<&str>) {
    if !path.is_empty() {
        path.push('.');
    }
    path.push_str(key);
    if let Some(value) = value.filter(|v| !v.is_empty()) {
        path.push('_');
        path.push_str(value);
    }
}

fn join_path(prefix: &str, composite: &str) -> String {
    if prefix.is_empty() {
        composite.to_owned()
    } else {
        format!("{prefix}.{composite}")
    }
}

struct Builder<'a> {
    file: &'a Path,
    domain: &'a str,
    stats: &'a ServiceStats,
    buckets: &'a Buckets,
}

impl Builder<'_> {
    /// Compiles `descriptors` into `node`'s children; `prefix` is the
    /// node's path (empty at the top).
    fn children(
        &self,
        node: &mut Node,
        descriptors: &[DescriptorConfig],
        prefix: &str,
        trail: &[String],
    ) -> Result<(), ConfigError> {
        for descriptor in descriptors {
            let composite = descriptor.composite_key();
            let path = join_path(prefix, &composite);
            let mut child = Node {
                value_to_metric: descriptor.value_to_metric,
                share_threshold: descriptor.share_threshold,
                ..Node::default()
            };
            let mut here = trail.to_vec();
            here.push(composite.clone());
            if let Some(rate_limit) = &descriptor.rate_limit {
                child.rule = Some(Arc::new(self.rule(
                    descriptor,
                    rate_limit,
                    &path,
                    here.clone(),
                )?));
            }
            self.children(&mut child, &descriptor.descriptors, &path, &here)?;
            if let Some(value) = descriptor.value.as_deref().filter(|v| v.contains('*')) {
                node.wildcards.push(Wildcard::new(&composite, value));
            }
            node.children.insert(composite, child);
        }
        Ok(())
    }

    fn rule(
        &self,
        descriptor: &DescriptorConfig,
        rate_limit: &crate::config::RateLimitConfig,
        path: &str,
        trail: Vec<String>,
    ) -> Result<Rule, ConfigError> {
        let bucket = match &rate_limit.limit {
            None => None,
            Some(_) => Some(
                self.buckets
                    .get(&(self.domain.to_owned(), trail))
                    .cloned()
                    .ok_or_else(|| ConfigError::Unservable {
                        path: self.file.to_path_buf(),
                        domain: self.domain.to_owned(),
                        descriptor: path.to_owned(),
                        message: "no bucket was built for this limit".into(),
                    })?,
            ),
        };
        Ok(Rule {
            domain: self.domain.to_owned(),
            path: path.to_owned(),
            limit: rate_limit.limit,
            name: rate_limit.name.clone(),
            replaces: rate_limit.replaces.clone(),
            shadow_mode: descriptor.shadow_mode,
            detailed_metric: descriptor.detailed_metric,
            quota_mode: descriptor.quota_mode,
            bucket,
            stats: self.stats.descriptor(self.domain, path),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_match_as_in_envoyproxy_ratelimit() {
        let trailing = Wildcard::new("path_/api/*", "/api/*");
        assert!(trailing.matches("path_/api/"));
        assert!(trailing.matches("path_/api/users/7"));
        assert!(!trailing.matches("path_/apx/users"));
        let middle = Wildcard::new("path_/a/*/b/*.json", "/a/*/b/*.json");
        assert!(middle.matches("path_/a/x/b/y.json"));
        assert!(middle.matches("path_/a//b/.json"));
        assert!(!middle.matches("path_/a/x/c/y.json"));
        assert!(
            !middle.matches("path_/a/b.json"),
            "the prefix and suffix may not overlap"
        );
        // Multi-byte characters next to the cuts: no panic, no match.
        assert!(!middle.matches("path_/a/\u{e9}\u{e9}.jso\u{e9}"));
        assert!(!trailing.matches("path_/ap\u{e9}"));
    }

    #[test]
    fn bucket_keys_of_different_value_lists_differ() {
        let key = |values: &[&str]| {
            let mut key = String::new();
            for v in values {
                push_part(&mut key, v);
            }
            key
        };
        assert_ne!(key(&["a|b", "c"]), key(&["a", "b|c"]));
        assert_ne!(key(&["1:a", ""]), key(&["1", "a"]));
        assert_eq!(key(&["alice"]), "5:alice");
        // The keys Redis holds are unchanged by writing the length by hand.
        for len in [0, 9, 10, 99, 100, 12_345] {
            let value = "v".repeat(len);
            assert_eq!(key(&[&value]), format!("{len}:{value}"));
        }
    }
}
