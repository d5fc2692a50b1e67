//! `Engine`: the live rules, swapped whole on reload, and the answer to one
//! `ShouldRateLimit` request.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

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
use crate::config::{ConfigError, ConfigSet, Limit, Unit};
use crate::over_limit_cache::OverLimitCache;
use crate::redis_gcra::{Asked, RedisGcra};
use crate::redis_windows::{RedisWindowSettings, RedisWindows};
use crate::rules::{
    push_part, push_path, push_window_part, window_key_start, Buckets, Match, Rule, Rules,
};
use crate::settings::{BackendName, BackendSettings, Settings};
use crate::stats::{DescriptorStats, ServiceStats};
use crate::window::{WindowCount, WindowCounters, WindowHit};

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
    /// Every fixed-window limit's counts (kept across reloads, as the
    /// peer's are in Redis).
    windows: Windows,
    /// With `--backend redis`, the one connection and breaker of every
    /// GCRA limit.
    redis: Option<RedisGcra>,
    /// The local over-limit cache the Redis limits share, if on (for its
    /// statistics).
    local_cache: Option<Arc<OverLimitCache>>,
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
    /// Decided by a bucket or a window.
    Decided {
        matched: Match,
        limit: Limit,
        figures: Figures,
        /// Over the limit but let through by the descriptor's shadow mode.
        shadowed: bool,
    },
}

/// A decided descriptor's numbers, in envoyproxy/ratelimit's terms.
struct Figures {
    /// Over the limit.
    over: bool,
    /// `limit_remaining`.
    remaining: u32,
    /// `duration_until_reset`; `None` for a cost above the limit itself,
    /// which no wait lets through (so no wait is advised).
    until_reset: Option<Duration>,
    /// The use of the limit before and after this request's hits (the
    /// peer's `limitBeforeIncrease` and `limitAfterIncrease`), which its
    /// near and over statistics are counted from.
    before: u64,
    after: u64,
    /// GCRA's decision, for the IETF headers.
    decision: Option<Decision>,
    /// Answered by the local over-limit cache (`LOCAL_CACHE_SIZE_IN_BYTES`).
    cached: bool,
}

impl Figures {
    /// A fixed window's figures, as the peer's `GetResponseDescriptorStatus`.
    fn window(limit: &Limit, count: WindowCount) -> Figures {
        let rpu = u64::from(limit.requests_per_unit);
        let over = count.after > rpu;
        Figures {
            over,
            remaining: if over { 0 } else { (rpu - count.after) as u32 },
            until_reset: Some(count.until_reset),
            before: count.before,
            after: count.after,
            decision: None,
            cached: count.cached,
        }
    }

    /// A GCRA bucket's figures: its use is the part of the bucket spent.
    /// A look (no hits) is never over, as a peer's window at its limit is not.
    fn gcra(limit: &Limit, outcome: &Outcome, hits: u64) -> Figures {
        let rpu = u64::from(limit.requests_per_unit);
        let left = outcome.remaining();
        let over = hits > 0 && !outcome.allowed;
        let (before, after) = if over {
            let used = rpu.saturating_sub(left);
            (used, used.saturating_add(hits))
        } else {
            let used = rpu.saturating_sub(left);
            (used.saturating_sub(hits), used)
        };
        Figures {
            over,
            remaining: if over {
                0
            } else {
                u32::try_from(left).unwrap_or(u32::MAX)
            },
            until_reset: match outcome.cached {
                // The cached refusal's own end, not its decision's (older) wait.
                Some(until) => Some(until.saturating_duration_since(Instant::now())),
                None => (hits <= rpu).then(|| outcome.until_reset(limit.unit.duration())),
            },
            before,
            after,
            decision: outcome.decision,
            cached: outcome.cached.is_some(),
        }
    }
}

/// `config`'s rules, with the bucket of every limit of `previous` whose
/// site and limit are unchanged (so a reload keeps their state) and new
/// ones built for the others, in Redis through `redis` if given, else here
/// with up to `max_keys` keys each.
fn build_rules(
    config: &ConfigSet,
    (redis, max_keys): (Option<&RedisGcra>, usize),
    stats: &ServiceStats,
    previous: Option<&Rules>,
) -> Result<Rules, ConfigError> {
    let mut buckets = Buckets::new();
    for site in Rules::limit_sites(config) {
        let bucket =
            match previous.and_then(|p| p.bucket_at(&site.site, &site.limit)) {
                Some(bucket) => bucket,
                None => {
                    let id = format!("{}.{}", site.site.0, site.path);
                    Arc::new(Bucket::build(&site.limit, redis, max_keys, &id).map_err(
                        |message| ConfigError::Unservable {
                            path: site.file.clone(),
                            domain: site.site.0.clone(),
                            descriptor: site.path.clone(),
                            message,
                        },
                    )?)
                }
            };
        buckets.insert(site.site, bucket);
    }
    Rules::build(config, stats, &buckets)
}

/// Where fixed windows are counted.
#[derive(Debug)]
enum Windows {
    Local(WindowCounters),
    Redis(RedisWindows),
}

/// How one descriptor will be decided, once all are known.
enum Step {
    Done(Verdict),
    Window(Match, Limit, u64),
    /// In this process, or (a [`Bucket::Redis`]) with the request's other
    /// Redis descriptors in one call.
    Bucket(Match, Limit, u64, Arc<Bucket>),
}

impl Engine {
    /// Loads the configuration named in `settings` and builds its buckets.
    pub async fn start(settings: Settings) -> Result<Engine, ConfigError> {
        let stats = ServiceStats::new();
        let unservable = |message: String| ConfigError::Unservable {
            path: settings.config.clone(),
            domain: String::new(),
            descriptor: String::new(),
            message,
        };
        // The peer's over-limit cache saves Redis calls: in-process
        // backends decide here already.
        let cache = match settings.backend {
            BackendName::Redis => {
                OverLimitCache::new(settings.local_cache_size_in_bytes).map(Arc::new)
            }
            BackendName::Memory => None,
        };
        let redis = match settings.backend_settings() {
            BackendSettings::Redis(redis) => Some(
                RedisGcra::new(&redis, cache.clone())
                    .await
                    .map_err(unservable)?,
            ),
            BackendSettings::InProcess { .. } => None,
        };
        let windows = match settings.backend_settings() {
            BackendSettings::InProcess { max_keys } => {
                Windows::Local(WindowCounters::new(max_keys))
            }
            BackendSettings::Redis(settings_redis) => Windows::Redis(RedisWindows::new(
                RedisWindowSettings {
                    prefix: settings.cache_key_prefix.clone(),
                    jitter_max_secs: settings.expiration_jitter_max_seconds,
                    policy: settings_redis.failure_policy,
                    max_keys: settings_redis.max_keys,
                    cache: cache.clone(),
                },
                redis
                    .as_ref()
                    .map(RedisGcra::shared)
                    .ok_or_else(|| unservable("a Redis backend without its limiter".into()))?,
            )),
        };
        let config = ConfigSet::load(&settings.config, settings.load_options())?;
        let rules = build_rules(&config, (redis.as_ref(), settings.max_keys), &stats, None)?;
        stats.config_load_success.increment(1);
        Ok(Engine {
            settings,
            rules: ArcSwap::from_pointee(rules),
            stats,
            reloading: tokio::sync::Mutex::new(()),
            overrides: RwLock::default(),
            windows,
            redis,
            local_cache: cache,
        })
    }

    /// Loads the configuration again. On success the new rules serve, and
    /// every limit whose domain, path and limit did not change keeps its
    /// buckets; on error the previous rules keep serving.
    pub async fn reload(&self) -> Result<(), ConfigError> {
        let _one_at_a_time = self.reloading.lock().await;
        let result = ConfigSet::load(&self.settings.config, self.settings.load_options()).and_then(
            |config| {
                build_rules(
                    &config,
                    (self.redis.as_ref(), self.settings.max_keys),
                    &self.stats,
                    Some(&self.rules.load_full()),
                )
            },
        );
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

    /// The Redis counters and latency of every GCRA limit (one connection
    /// and breaker for the service), with `--backend redis`.
    pub fn redis_metrics(&self) -> Option<turnstile_rl::redis::MetricsSnapshot> {
        self.redis.as_ref().map(RedisGcra::metrics)
    }

    /// The `/metrics` text.
    pub fn render_metrics(&self) -> String {
        let limits: Vec<(String, Arc<Bucket>)> = self
            .rules()
            .rules()
            .into_iter()
            .filter_map(|r| Some((format!("{}.{}", r.domain, r.path), r.bucket.clone()?)))
            .collect();
        if let Some(cache) = &self.local_cache {
            self.stats.local_cache(&cache.stats());
        }
        self.stats.render(&limits, self.redis_metrics())
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
        // The domain first, as envoyproxy/ratelimit: an unknown domain has
        // no limits, not even the ones Envoy sends in descriptors.
        let known_domain = rules.has_domain(&request.domain);
        if !known_domain {
            self.stats
                .domain_not_found(&request.domain)
                .increment(request.descriptors.len() as u64);
        }
        let mut matches: Vec<Option<Match>> = Vec::with_capacity(request.descriptors.len());
        for descriptor in &request.descriptors {
            matches.push(match &descriptor.limit {
                _ if !known_domain => None,
                // Envoy's limit override replaces the configuration's
                // lookup for this descriptor, as in envoyproxy/ratelimit.
                Some(limit) => self.override_match(&request.domain, descriptor, limit),
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
        let request_hits = u64::from(request.hits_addend.max(1));
        let mut steps = Vec::with_capacity(matches.len());
        let mut window_hits = Vec::new();
        for (i, descriptor) in request.descriptors.iter().enumerate() {
            let Some(matched) = matches[i].take().filter(|_| !replaced[i]) else {
                steps.push(Step::Done(Verdict::NoLimit));
                continue;
            };
            let (Some(limit), Some(bucket)) = (matched.rule.limit, matched.rule.bucket.clone())
            else {
                steps.push(Step::Done(Verdict::Unlimited));
                continue;
            };
            // A descriptor's own hits_addend wins, even 0 (look, take nothing).
            let hits = descriptor
                .hits_addend
                .as_ref()
                .map_or(request_hits, |h| h.value);
            if matches!(*bucket, Bucket::Window) {
                window_hits.push(WindowHit {
                    key: matched.window_key.clone(),
                    length: limit.unit.duration().as_secs(),
                    hits,
                    limit: u64::from(limit.requests_per_unit),
                });
                steps.push(Step::Window(matched, limit, hits));
            } else {
                steps.push(Step::Bucket(matched, limit, hits, bucket));
            }
        }
        // Every window of the request at once, as the peer's one pipeline,
        // and every GCRA descriptor in Redis in one script call, both in
        // flight together.
        let stop = self.settings.stop_cache_key_increment_when_overlimit;
        let redis_asked: Vec<Asked<'_>> = steps
            .iter()
            .filter_map(|step| match step {
                Step::Bucket(matched, _, hits, bucket) => match &**bucket {
                    Bucket::Redis(b) => Some((b, matched.bucket_key.as_str(), *hits)),
                    _ => None,
                },
                _ => None,
            })
            .collect();
        let gcra = async {
            match &self.redis {
                Some(redis) => redis.decide(&redis_asked).await,
                None => Vec::new(),
            }
        };
        let windows = async {
            match &self.windows {
                Windows::Local(counters) => counters.count(&window_hits, stop),
                Windows::Redis(redis) => redis.count(&window_hits, stop).await,
            }
        };
        let (redis_outcomes, counts) = tokio::join!(gcra, windows);
        let mut counts = counts.into_iter();
        let mut redis_outcomes = redis_outcomes.into_iter();
        let mut verdicts = Vec::with_capacity(steps.len());
        for step in steps {
            let (matched, limit, hits, figures) = match step {
                Step::Done(verdict) => {
                    verdicts.push(verdict);
                    continue;
                }
                Step::Window(matched, limit, hits) => {
                    let Some(count) = counts.next() else {
                        verdicts.push(Verdict::NoLimit);
                        continue;
                    };
                    (matched, limit, hits, Figures::window(&limit, count))
                }
                Step::Bucket(matched, limit, hits, bucket) => {
                    let outcome = match *bucket {
                        Bucket::Redis(_) => redis_outcomes.next().unwrap_or_else(Outcome::refused),
                        _ => bucket.decide(&matched.bucket_key, hits),
                    };
                    (matched, limit, hits, Figures::gcra(&limit, &outcome, hits))
                }
            };
            let stats = match &matched.stat_path {
                Some(path) => self.stats.descriptor(&matched.rule.domain, path),
                None => matched.rule.stats.clone(),
            };
            let shadowed = figures.over && matched.rule.shadow_mode;
            self.count(&stats, &limit, &figures, hits, shadowed);
            verdicts.push(Verdict::Decided {
                matched,
                limit,
                figures,
                shadowed,
            });
        }
        Ok(self.respond(verdicts))
    }

    /// The match for a descriptor that carries its own limit: one bucket
    /// per list of entries (keys and values), statistics under the
    /// entries' path. An unknown unit, or a limit the backend cannot
    /// serve, is no limit (reported on stderr once per build attempt).
    fn override_match(
        &self,
        domain: &str,
        descriptor: &RateLimitDescriptor,
        limit: &RateLimitOverride,
    ) -> Option<Match> {
        let limit = Limit {
            requests_per_unit: limit.requests_per_unit,
            unit: Unit::from_proto(limit.unit)?,
            algorithm: self.settings.default_algorithm,
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
                let bucket = match Bucket::build(
                    &limit,
                    self.redis.as_ref(),
                    self.settings.max_keys,
                    &name,
                ) {
                    Ok(bucket) => Arc::new(bucket),
                    Err(e) => {
                        tracing::warn!(limit = %name, error = %e, "cannot serve a limit override: no limit applied");
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
                    quota_mode: false,
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
        let mut window_key = window_key_start(domain);
        for entry in &descriptor.entries {
            push_part(&mut bucket_key, &entry.key);
            push_part(&mut bucket_key, &entry.value);
            push_path(&mut path, &entry.key, Some(&entry.value));
            push_window_part(&mut window_key, &entry.key, &entry.value);
        }
        Some(Match {
            rule,
            bucket_key,
            stat_path: Some(path),
            window_key,
        })
    }

    /// envoyproxy/ratelimit's statistics (`base_limiter.go`): over and
    /// near limit hits worked out from the use before and after the hits,
    /// so a cost that is partly over counts partly in each.
    fn count(
        &self,
        stats: &DescriptorStats,
        limit: &Limit,
        figures: &Figures,
        hits: u64,
        shadowed: bool,
    ) {
        let rpu = u64::from(limit.requests_per_unit);
        // float32 as in the peer, so the thresholds agree at every ratio.
        let near = (rpu as f32 * self.settings.near_limit_ratio as f32).floor() as u64;
        let (before, after) = (figures.before, figures.after);
        stats.total_hits.increment(hits);
        if figures.cached {
            stats.over_limit_with_local_cache.increment(hits);
        }
        if figures.over {
            if before >= rpu {
                stats.over_limit.increment(hits);
            } else {
                stats.over_limit.increment(after - rpu);
                stats.near_limit.increment(rpu - near.max(before));
            }
            if shadowed {
                stats
                    .shadow_mode
                    .increment(if before >= rpu { hits } else { after - rpu });
            }
            return;
        }
        if after > near {
            stats
                .near_limit
                .increment(if before >= near { hits } else { after - near });
        }
        stats.within_limit.increment(hits);
    }

    /// The answer, as envoyproxy/ratelimit's `shouldRateLimitWorker`:
    /// over when a descriptor not in quota mode is over, or when every
    /// quota-mode descriptor is.
    fn respond(&self, verdicts: Vec<Verdict>) -> RateLimitResponse {
        let mut response = RateLimitResponse::default();
        let (mut refused, mut quota_total, mut quota_over) = (0, 0, 0);
        // The peer's header descriptor: the last refusal, else the fewest left.
        let mut closest: Option<usize> = None;
        for verdict in &verdicts {
            let status = match verdict {
                Verdict::NoLimit => {
                    quota_total += usize::from(self.settings.quota_mode);
                    DescriptorStatus {
                        code: Code::Ok as i32,
                        ..Default::default()
                    }
                }
                Verdict::Unlimited => DescriptorStatus {
                    code: Code::Ok as i32,
                    limit_remaining: u32::MAX,
                    ..Default::default()
                },
                Verdict::Decided {
                    matched,
                    limit,
                    figures,
                    shadowed,
                } => {
                    let over = figures.over && !shadowed;
                    let quota = self.settings.quota_mode || matched.rule.quota_mode;
                    quota_total += usize::from(quota);
                    match (over, quota) {
                        (true, true) => quota_over += 1,
                        (true, false) => {
                            refused += 1;
                            closest = Some(response.statuses.len());
                        }
                        _ => {}
                    }
                    let fewer =
                        |at: usize| figures.remaining < response.statuses[at].limit_remaining;
                    if (quota || !over) && closest.is_none_or(fewer) {
                        closest = Some(response.statuses.len());
                    }
                    DescriptorStatus {
                        code: if over { Code::OverLimit } else { Code::Ok } as i32,
                        current_limit: Some(RateLimit {
                            name: matched.rule.name.clone().unwrap_or_default(),
                            requests_per_unit: limit.requests_per_unit,
                            unit: limit.unit.proto(),
                        }),
                        limit_remaining: figures.remaining,
                        duration_until_reset: figures.until_reset.map(proto_duration),
                        ..Default::default()
                    }
                }
            };
            response.statuses.push(status);
        }
        let over = refused > 0 || (quota_total > 0 && quota_total == quota_over);
        response.overall_code = if over { Code::OverLimit } else { Code::Ok } as i32;
        if self.settings.response_headers {
            response.response_headers_to_add = ietf_headers(&verdicts);
        }
        if let Some(at) = closest.filter(|_| self.settings.limit_response_headers) {
            let status = &response.statuses[at];
            let header = |key: &str, value: String| HeaderValue {
                key: key.to_owned(),
                value,
                ..Default::default()
            };
            let limit = status
                .current_limit
                .as_ref()
                .map_or(0, |l| l.requests_per_unit);
            let trio = [
                header(&self.settings.limit_limit_header, limit.to_string()),
                header(
                    &self.settings.limit_remaining_header,
                    status.limit_remaining.to_string(),
                ),
            ];
            response.response_headers_to_add.extend(trio);
            // No reset for a cost no wait lets through.
            if let Some(d) = &status.duration_until_reset {
                let reset = d.seconds + i64::from(d.nanos > 0);
                response
                    .response_headers_to_add
                    .push(header(&self.settings.limit_reset_header, reset.to_string()));
            }
        }
        if self.settings.shadow_mode && over {
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
    let mut policies: Vec<(String, Quota, Decision, &Figures)> = Vec::new();
    for verdict in verdicts {
        if let Verdict::Decided {
            matched,
            limit,
            figures,
            ..
        } = verdict
        {
            let (Ok(quota), Some(decision)) = (quota(limit), figures.decision) else {
                continue;
            };
            let name = matched
                .rule
                .name
                .clone()
                .unwrap_or_else(|| matched.rule.path.clone());
            policies.push((name, quota, decision, figures));
        }
    }
    let binding = policies
        .iter()
        .position(|p| p.3.over)
        .or_else(|| (0..policies.len()).min_by_key(|&i| policies[i].3.remaining));
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
    let figures = policies[binding].3;
    headers
        .iter()
        .filter_map(|(name, value)| {
            let mut value = value.to_str().ok()?.to_owned();
            if name == "ratelimit" {
                // The status's own figures, so header and status agree: the
                // library writes the decision's, whose reset is the time
                // until the bucket is full, not the status's wait.
                value = binding_field(&value, figures);
            }
            Some(HeaderValue {
                key: name.as_str().to_owned(),
                value,
                ..Default::default()
            })
        })
        .collect()
}

/// The `RateLimit` field `"name";r=R[;t=T]` from the status's figures,
/// keeping the library's quoted name (its structured-field string, whose
/// `\"` and `\\` escapes may hide a `"` or `;`).
fn binding_field(library_field: &str, figures: &Figures) -> String {
    let mut end = library_field.len();
    let mut escaped = false;
    for (i, c) in library_field.char_indices().skip(1) {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => {
                end = i + 1;
                break;
            }
            _ => {}
        }
    }
    let name = &library_field[..end];
    let mut field = format!("{name};r={}", figures.remaining);
    if let Some(wait) = figures.until_reset {
        let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        field.push_str(&format!(";t={secs}"));
    }
    field
}

fn proto_duration(d: Duration) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: d.subsec_nanos() as i32,
    }
}
