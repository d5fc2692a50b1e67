//! `Engine`: the live rules, swapped whole on reload, and the answer to one
//! `ShouldRateLimit` request.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use turnstile_rl::{Decision, Quota};

use crate::bucket::{quota, Bucket, Outcome};
use crate::config::{Algorithm, ConfigError, ConfigSet, Limit, Unit};
use crate::rules::{push_part, push_path, Match, Rule, Rules};
use crate::settings::Settings;
use crate::stats::{DescriptorStats, ServiceStats};

/// The service's state: settings, the current rules, the metrics.
#[derive(Debug)]
pub struct Engine {
    settings: Settings,
    rules: ArcSwap<Rules>,
    stats: ServiceStats,
    // One reload at a time, so two reloads never both build new buckets
    // from the same previous rules.
    reloading: tokio::sync::Mutex<()>,
    /// The limits Envoy sent in descriptors (`RateLimitDescriptor.limit`),
    /// one per domain and limit, built on first use and kept across reloads
    /// (they are not part of the configuration).
    overrides: RwLock<HashMap<(String, Limit), Arc<Rule>>>,
}

/// Why a request was refused outright (gRPC `INVALID_ARGUMENT`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// `domain` is empty.
    #[error("rate limit domain must not be empty")]
    NoDomain,
    /// `descriptors` is empty.
    #[error("rate limit descriptor list must not be empty")]
    NoDescriptors,
}

/// One descriptor's way through the request.
enum Verdict {
    /// No configured limit (no match, or replaced).
    NoLimit,
    /// `unlimited: true`.
    Unlimited,
    /// Decided by a bucket.
    Decided {
        matched: Match,
        limit: Limit,
        outcome: Outcome,
        /// Over the limit but let through by the descriptor's shadow mode.
        shadowed: bool,
    },
}

impl Engine {
    /// Loads the configuration named in `settings` and builds its buckets.
    pub async fn start(settings: Settings) -> Result<Engine, ConfigError> {
        let stats = ServiceStats::new();
        let config = ConfigSet::load(&settings.config)?;
        let rules = Rules::build(&config, &settings.backend_settings(), &stats, None).await?;
        stats.config_load_success.increment(1);
        Ok(Engine {
            settings,
            rules: ArcSwap::from_pointee(rules),
            stats,
            reloading: tokio::sync::Mutex::new(()),
            overrides: RwLock::default(),
        })
    }

    /// Loads the configuration again. On success the new rules serve, and
    /// every limit whose domain, path and limit did not change keeps its
    /// buckets; on error the previous rules keep serving.
    pub async fn reload(&self) -> Result<(), ConfigError> {
        let _one_at_a_time = self.reloading.lock().await;
        let result = async {
            let config = ConfigSet::load(&self.settings.config)?;
            let previous = self.rules.load_full();
            Rules::build(
                &config,
                &self.settings.backend_settings(),
                &self.stats,
                Some(&previous),
            )
            .await
        }
        .await;
        match result {
            Ok(rules) => {
                self.rules.store(Arc::new(rules));
                self.stats.config_load_success.increment(1);
                Ok(())
            }
            Err(e) => {
                self.stats.config_load_error.increment(1);
                Err(e)
            }
        }
    }

    /// The rules serving now.
    pub fn rules(&self) -> Arc<Rules> {
        self.rules.load_full()
    }

    /// The metrics.
    pub fn stats(&self) -> &ServiceStats {
        &self.stats
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The `/metrics` text.
    pub fn render_metrics(&self) -> String {
        self.stats.render(&self.rules())
    }

    /// Answers one `ShouldRateLimit` request, as envoyproxy/ratelimit does.
    pub async fn should_rate_limit(
        &self,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, RequestError> {
        if request.domain.is_empty() {
            self.stats.should_rate_limit_error.increment(1);
            return Err(RequestError::NoDomain);
        }
        if request.descriptors.is_empty() {
            self.stats.should_rate_limit_error.increment(1);
            return Err(RequestError::NoDescriptors);
        }
        let rules = self.rules.load();
        let mut matches: Vec<Option<Match>> = Vec::with_capacity(request.descriptors.len());
        for descriptor in &request.descriptors {
            matches.push(match &descriptor.limit {
                // Envoy's limit override replaces the configuration's
                // lookup for this descriptor, as in envoyproxy/ratelimit.
                Some(limit) => {
                    self.override_match(&request.domain, descriptor, limit)
                        .await
                }
                None => rules.lookup(&request.domain, &descriptor.entries),
            });
        }
        // `replaces`: a named limit is dropped when another matched limit
        // of the request replaces it.
        let replacing: HashSet<&str> = matches
            .iter()
            .flatten()
            .flat_map(|m| m.rule.replaces.iter().map(String::as_str))
            .collect();
        let replaced: Vec<bool> = matches
            .iter()
            .map(|m| {
                m.as_ref().is_some_and(|m| {
                    m.rule.limit.is_some()
                        && m.rule
                            .name
                            .as_deref()
                            .is_some_and(|n| replacing.contains(n))
                })
            })
            .collect();
        let request_cost = u64::from(request.hits_addend.max(1));
        let mut verdicts = Vec::with_capacity(matches.len());
        for (i, descriptor) in request.descriptors.iter().enumerate() {
            let Some(matched) = matches[i].take().filter(|_| !replaced[i]) else {
                verdicts.push(Verdict::NoLimit);
                continue;
            };
            let (Some(limit), Some(bucket)) = (matched.rule.limit, matched.rule.bucket.clone())
            else {
                verdicts.push(Verdict::Unlimited);
                continue;
            };
            // A descriptor's own hits_addend wins, even 0 (look, take nothing).
            let cost = descriptor
                .hits_addend
                .as_ref()
                .map_or(request_cost, |h| h.value);
            let outcome = bucket.decide(&matched.bucket_key, cost).await;
            let stats = match &matched.stat_path {
                Some(path) => self.stats.descriptor(&matched.rule.domain, path),
                None => matched.rule.stats.clone(),
            };
            let shadowed = !outcome.allowed && matched.rule.shadow_mode;
            self.count(&stats, &limit, &outcome, cost, shadowed);
            verdicts.push(Verdict::Decided {
                matched,
                limit,
                outcome,
                shadowed,
            });
        }
        Ok(self.respond(verdicts))
    }

    /// The match for a descriptor that carries its own limit: one bucket
    /// per list of entries (keys and values), statistics under the
    /// entries' path. An unknown unit, or a limit the backend cannot
    /// serve, is no limit (reported on stderr once per build attempt).
    async fn override_match(
        &self,
        domain: &str,
        descriptor: &RateLimitDescriptor,
        limit: &RateLimitOverride,
    ) -> Option<Match> {
        let limit = Limit {
            requests_per_unit: limit.requests_per_unit,
            unit: Unit::from_proto(limit.unit)?,
            algorithm: Algorithm::Gcra,
        };
        let id = (domain.to_owned(), limit);
        let known = self.overrides.read().ok()?.get(&id).cloned();
        let rule = match known {
            Some(rule) => rule,
            None => {
                let name = format!(
                    "{domain}.override_{}_per_{}",
                    limit.requests_per_unit, limit.unit
                );
                let bucket =
                    match Bucket::build(&limit, &self.settings.backend_settings(), &name).await {
                        Ok(bucket) => Arc::new(bucket),
                        Err(e) => {
                            eprintln!("turnstile-rls: cannot serve the limit override {name}: {e}");
                            return None;
                        }
                    };
                let rule = Arc::new(Rule {
                    domain: domain.to_owned(),
                    path: name.clone(),
                    limit: Some(limit),
                    name: None,
                    replaces: Vec::new(),
                    shadow_mode: false,
                    detailed_metric: false,
                    bucket: Some(bucket),
                    stats: self.stats.descriptor(domain, &name),
                });
                // A racing request may have built one too: the first stays.
                let mut overrides = self.overrides.write().ok()?;
                overrides.entry(id).or_insert(rule).clone()
            }
        };
        let mut bucket_key = String::new();
        let mut path = String::new();
        for entry in &descriptor.entries {
            push_part(&mut bucket_key, &entry.key);
            push_part(&mut bucket_key, &entry.value);
            push_path(&mut path, &entry.key, Some(&entry.value));
        }
        Some(Match {
            rule,
            bucket_key,
            stat_path: Some(path),
        })
    }

    fn count(
        &self,
        stats: &DescriptorStats,
        limit: &Limit,
        outcome: &Outcome,
        cost: u64,
        shadowed: bool,
    ) {
        stats.total_hits.increment(cost);
        if !outcome.allowed {
            stats.over_limit.increment(cost);
            if shadowed {
                stats.shadow_mode.increment(cost);
            }
            return;
        }
        stats.within_limit.increment(cost);
        // envoyproxy/ratelimit's near limit: the hits that took the use
        // past `ratio × limit`.
        let limit = u64::from(limit.requests_per_unit);
        let threshold = (limit as f64 * self.settings.near_limit_ratio).floor() as u64;
        let used = limit.saturating_sub(outcome.remaining());
        if used > threshold {
            stats.near_limit.increment(cost.min(used - threshold));
        }
    }

    fn respond(&self, verdicts: Vec<Verdict>) -> RateLimitResponse {
        let mut response = RateLimitResponse {
            overall_code: Code::Ok as i32,
            ..Default::default()
        };
        for verdict in &verdicts {
            let status = match verdict {
                Verdict::NoLimit => DescriptorStatus {
                    code: Code::Ok as i32,
                    ..Default::default()
                },
                Verdict::Unlimited => DescriptorStatus {
                    code: Code::Ok as i32,
                    limit_remaining: u32::MAX,
                    ..Default::default()
                },
                Verdict::Decided {
                    matched,
                    limit,
                    outcome,
                    shadowed,
                } => {
                    let over = !outcome.allowed && !shadowed;
                    if over {
                        response.overall_code = Code::OverLimit as i32;
                    }
                    DescriptorStatus {
                        code: if over { Code::OverLimit } else { Code::Ok } as i32,
                        current_limit: Some(RateLimit {
                            name: matched.rule.name.clone().unwrap_or_default(),
                            requests_per_unit: limit.requests_per_unit,
                            unit: limit.unit.proto(),
                        }),
                        limit_remaining: if outcome.allowed {
                            u32::try_from(outcome.remaining()).unwrap_or(u32::MAX)
                        } else {
                            0
                        },
                        duration_until_reset: Some(proto_duration(
                            outcome.until_reset(limit.unit.duration()),
                        )),
                        ..Default::default()
                    }
                }
            };
            response.statuses.push(status);
        }
        if self.settings.response_headers {
            response.response_headers_to_add = ietf_headers(&verdicts);
        }
        if self.settings.shadow_mode && response.overall_code == Code::OverLimit as i32 {
            response.overall_code = Code::Ok as i32;
            self.stats.global_shadow_mode.increment(1);
        }
        response
    }
}

/// The IETF `RateLimit-Policy` (every decided limit) and `RateLimit` (the
/// binding one: the first refusal, else the fewest requests left), written
/// by the library's own header code.
fn ietf_headers(verdicts: &[Verdict]) -> Vec<HeaderValue> {
    let mut policies: Vec<(String, Quota, Decision, bool)> = Vec::new();
    for verdict in verdicts {
        if let Verdict::Decided {
            matched,
            limit,
            outcome,
            ..
        } = verdict
        {
            let (Ok(quota), Some(decision)) = (quota(limit), outcome.decision) else {
                continue;
            };
            let name = matched
                .rule
                .name
                .clone()
                .unwrap_or_else(|| matched.rule.path.clone());
            policies.push((name, quota, decision, outcome.allowed));
        }
    }
    let binding = policies
        .iter()
        .position(|p| !p.3)
        .or_else(|| (0..policies.len()).min_by_key(|&i| policies[i].2.remaining()));
    let Some(binding) = binding else {
        return Vec::new();
    };
    let named: Vec<(&str, Quota)> = policies.iter().map(|p| (p.0.as_str(), p.1)).collect();
    // A name that is not printable ASCII cannot be a header: no headers,
    // rather than a wrong one.
    let Ok(headers) =
        turnstile_rl::http::headers::ietf_fields(&named, binding, &policies[binding].2)
    else {
        return Vec::new();
    };
    headers
        .iter()
        .filter_map(|(name, value)| {
            Some(HeaderValue {
                key: name.as_str().to_owned(),
                value: value.to_str().ok()?.to_owned(),
                ..Default::default()
            })
        })
        .collect()
}

fn proto_duration(d: Duration) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: d.subsec_nanos() as i32,
    }
}
