//! The YAML file model, checked while it is read: each rule below fails
//! inside deserialization, so its error carries the line and the field.

use std::collections::HashSet;
use std::fmt;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::error::ConfigError;

/// One file: a domain and its descriptor tree.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(try_from = "RawDomain")]
pub struct DomainConfig {
    /// The domain Envoy names in each request (`RateLimitRequest.domain`).
    pub domain: String,
    /// The top level of the descriptor tree.
    pub descriptors: Vec<DescriptorConfig>,
}

impl DomainConfig {
    /// Parses one file's text; `path` only names it in errors.
    pub fn parse(path: &Path, text: &str) -> Result<DomainConfig, ConfigError> {
        let de = serde_norway::Deserializer::from_str(text);
        serde_path_to_error::deserialize(de).map_err(|e| ConfigError::yaml(path, e))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDomain {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Siblings,
}

impl TryFrom<RawDomain> for DomainConfig {
    type Error = String;
    fn try_from(raw: RawDomain) -> Result<Self, String> {
        if raw.domain.is_empty() {
            return Err(
                "the file has no `domain` (or an empty one): each file must name its domain".into(),
            );
        }
        Ok(DomainConfig {
            domain: raw.domain,
            descriptors: raw.descriptors.0,
        })
    }
}

/// One node of the descriptor tree.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(try_from = "RawDescriptor")]
pub struct DescriptorConfig {
    /// The entry's key (required).
    pub key: String,
    /// The entry's value: `None` matches any value of the key (a value
    /// match wins over it). A value with `*` is a wildcard.
    pub value: Option<String>,
    /// The limit applied when a request's descriptor ends here.
    pub rate_limit: Option<RateLimitConfig>,
    /// Deeper entries.
    pub descriptors: Vec<DescriptorConfig>,
    /// Count and report, never refuse.
    pub shadow_mode: bool,
    /// Metrics per request value, not rolled up into this node.
    pub detailed_metric: bool,
    /// The request's value in the metric name where this node has none.
    pub value_to_metric: bool,
    /// Every value matching this wildcard shares one bucket.
    pub share_threshold: bool,
    /// Over this limit refuses the request only when every quota-mode
    /// descriptor of it is over (envoyproxy/ratelimit's `quota_mode`).
    pub quota_mode: bool,
}

impl DescriptorConfig {
    /// envoyproxy/ratelimit's lookup key: `key` or `key_value`.
    pub fn composite_key(&self) -> String {
        match &self.value {
            Some(value) => format!("{}_{value}", self.key),
            None => self.key.clone(),
        }
    }
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a descriptor mapping: `key`, an optional `value`, and a `rate_limit` or nested `descriptors`"
)]
struct RawDescriptor {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    rate_limit: Option<RateLimitConfig>,
    #[serde(default)]
    descriptors: Siblings,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    detailed_metric: bool,
    #[serde(default)]
    value_to_metric: bool,
    #[serde(default)]
    share_threshold: bool,
    #[serde(default)]
    quota_mode: bool,
    // Accepted as envoyproxy/ratelimit accepts it; it only feeds the
    // peer's RESPONSE_DYNAMIC_METADATA, which is not served, so it changes
    // no decision.
    #[serde(default)]
    #[allow(dead_code)]
    metadata: Option<serde_norway::Value>,
}

impl TryFrom<RawDescriptor> for DescriptorConfig {
    type Error = String;
    fn try_from(raw: RawDescriptor) -> Result<Self, String> {
        if raw.key.is_empty() {
            return Err("descriptor has an empty or missing `key`".into());
        }
        // An empty value is no value, as in envoyproxy/ratelimit.
        let value = raw.value.filter(|v| !v.is_empty());
        if raw.share_threshold && !value.as_deref().is_some_and(|v| v.contains('*')) {
            return Err(format!(
                "descriptor `{}`: `share_threshold` needs a wildcard value (one containing `*`)",
                raw.key
            ));
        }
        Ok(DescriptorConfig {
            key: raw.key,
            value,
            rate_limit: raw.rate_limit,
            descriptors: raw.descriptors.0,
            shadow_mode: raw.shadow_mode,
            detailed_metric: raw.detailed_metric,
            value_to_metric: raw.value_to_metric,
            share_threshold: raw.share_threshold,
            quota_mode: raw.quota_mode,
        })
    }
}

/// A list of sibling descriptors, no two with the same key and value.
/// Checked element by element, so a duplicate's error points at it.
#[derive(Default)]
struct Siblings(Vec<DescriptorConfig>);

impl<'de> Deserialize<'de> for Siblings {
    fn deserialize<D: serde::Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Siblings;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of descriptors")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Siblings, A::Error> {
                let mut seen = HashSet::new();
                let mut list = Vec::new();
                while let Some(descriptor) = seq.next_element::<DescriptorConfig>()? {
                    let key = descriptor.composite_key();
                    if !seen.insert(key.clone()) {
                        return Err(serde::de::Error::custom(format!(
                            "duplicate descriptor `{key}`: two siblings with the same key and value"
                        )));
                    }
                    list.push(descriptor);
                }
                Ok(Siblings(list))
            }
        }
        de.deserialize_seq(Visitor)
    }
}

/// A `rate_limit` block.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(try_from = "RawRateLimit")]
pub struct RateLimitConfig {
    /// The limit itself, or `None` for `unlimited: true`.
    pub limit: Option<Limit>,
    /// The name other limits' `replaces` refer to.
    pub name: Option<String>,
    /// The names of the limits this one replaces when both match.
    pub replaces: Vec<String>,
    /// The `algorithm` the file names, if any ([`Limit::algorithm`] is
    /// GCRA until [`ConfigSet::load`](super::ConfigSet::load) applies the
    /// service's default to the limits that name none).
    pub algorithm: Option<Algorithm>,
}

/// `requests_per_unit` per `unit`, decided by `algorithm`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Limit {
    /// Requests per unit (`0` refuses every request, as in envoyproxy/ratelimit).
    pub requests_per_unit: u32,
    /// The unit.
    pub unit: Unit,
    /// How the requests are spread (turnstile's extension; GCRA unless set).
    pub algorithm: Algorithm,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a rate_limit mapping: `unit` and `requests_per_unit`, or `unlimited: true`"
)]
struct RawRateLimit {
    #[serde(default)]
    unit: Option<Unit>,
    #[serde(default)]
    requests_per_unit: Option<u32>,
    #[serde(default)]
    unlimited: bool,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    replaces: Vec<Replaces>,
    #[serde(default)]
    algorithm: Option<Algorithm>,
}

/// One `replaces` entry.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Replaces {
    /// The name of the replaced limit.
    #[serde(default)]
    pub name: String,
}

impl TryFrom<RawRateLimit> for RateLimitConfig {
    type Error = String;
    fn try_from(raw: RawRateLimit) -> Result<Self, String> {
        let name = raw.name.filter(|n| !n.is_empty());
        let limit = match (raw.unlimited, raw.unit, raw.requests_per_unit) {
            (true, Some(_), _) => {
                return Err("`unit` must not be set when `unlimited` is true".into())
            }
            (true, None, _) => None,
            (false, None, _) => {
                return Err("`unit` is missing: one of second, minute, hour, day, week, month, year (or `unlimited: true`)".into())
            }
            (false, Some(unit), rpu) => Some(Limit {
                // envoyproxy/ratelimit reads a missing count as 0.
                requests_per_unit: rpu.unwrap_or(0),
                unit,
                algorithm: raw.algorithm.unwrap_or_default(),
            }),
        };
        let mut replaces = Vec::with_capacity(raw.replaces.len());
        for entry in raw.replaces {
            if entry.name.is_empty() {
                return Err("a `replaces` entry has no `name`".into());
            }
            if Some(&entry.name) == name.as_ref() {
                return Err(format!(
                    "`replaces` names `{}`, this limit's own name",
                    entry.name
                ));
            }
            replaces.push(entry.name);
        }
        Ok(RateLimitConfig {
            limit,
            name,
            replaces,
            algorithm: raw.algorithm,
        })
    }
}

/// A limit's time unit (the proto's `RateLimit.Unit`; months are 30
/// days and years 365, as in envoyproxy/ratelimit).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    /// One second.
    Second,
    /// One minute.
    Minute,
    /// One hour.
    Hour,
    /// One day.
    Day,
    /// Seven days.
    Week,
    /// Thirty days.
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// The unit's length.
    pub fn duration(self) -> Duration {
        let secs = match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        };
        Duration::from_secs(secs)
    }

    /// The proto enum's value (`RateLimitResponse.RateLimit.Unit`).
    pub fn proto(self) -> i32 {
        use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as P;
        (match self {
            Unit::Second => P::Second,
            Unit::Minute => P::Minute,
            Unit::Hour => P::Hour,
            Unit::Day => P::Day,
            Unit::Week => P::Week,
            Unit::Month => P::Month,
            Unit::Year => P::Year,
        }) as i32
    }

    /// The unit of a proto enum value, if it is a known one.
    pub fn from_proto(value: i32) -> Option<Unit> {
        [
            Unit::Second,
            Unit::Minute,
            Unit::Hour,
            Unit::Day,
            Unit::Week,
            Unit::Month,
            Unit::Year,
        ]
        .into_iter()
        .find(|u| u.proto() == value)
    }

    /// The unit's name in the configuration.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl<'de> Deserialize<'de> for Unit {
    fn deserialize<D: serde::Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        let text = String::deserialize(de)?;
        // Case-insensitive, as envoyproxy/ratelimit upper-cases it.
        Ok(match text.to_ascii_lowercase().as_str() {
            "second" => Unit::Second,
            "minute" => Unit::Minute,
            "hour" => Unit::Hour,
            "day" => Unit::Day,
            "week" => Unit::Week,
            "month" => Unit::Month,
            "year" => Unit::Year,
            _ => {
                return Err(serde::de::Error::custom(format!(
                    "invalid rate limit unit `{text}`: expected second, minute, hour, day, week, month or year"
                )))
            }
        })
    }
}

/// How a limit spreads its requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// GCRA (the default): a bucket of `requests_per_unit` that refills
    /// evenly, one request every `unit / requests_per_unit`.
    #[default]
    Gcra,
    /// envoyproxy/ratelimit's fixed window: `requests_per_unit` per
    /// window aligned to the Unix clock, counted as the peer counts
    /// (in-process backend only).
    #[value(name = "fixed_window")]
    FixedWindow,
}
