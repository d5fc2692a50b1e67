//! The service's metrics, in the Prometheus text format: per descriptor,
//! envoyproxy/ratelimit's statistics; per service, its configuration loads;
//! per limit, the engine's gauges.
//!
//! Names follow envoyproxy/ratelimit's default Prometheus mapping of its
//! `ratelimit.service.rate_limit.DOMAIN.KEY_VALUE.STAT` statistics:
//! `ratelimit_service_rate_limit_{total_hits,over_limit,near_limit,within_limit,shadow_mode,over_limit_with_local_cache}`,
//! labelled `domain` and `descriptor` (the `KEY_VALUE` path, for example
//! `key_value.key`). Counts are hits (a request's cost), as there.

use std::sync::Arc;

use metrics::{Counter, Key, Label, Metadata, Recorder};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};

use turnstile_rl::redis::MetricsSnapshot;

use crate::bucket::Bucket;

const TARGET: &str = "turnstile_rls";

/// One service's metrics: its own recorder, so several services can live
/// in one process (the tests), and nothing is installed globally.
#[derive(Clone)]
pub struct ServiceStats {
    recorder: Arc<PrometheusRecorder>,
    /// `ratelimit_service_config_load_success`.
    pub config_load_success: Counter,
    /// `ratelimit_service_config_load_error`.
    pub config_load_error: Counter,
    /// `ratelimit_service_global_shadow_mode`: answers the global shadow
    /// mode turned from over the limit to OK.
    pub global_shadow_mode: Counter,
    /// `ratelimit_service_should_rate_limit_error{err_type="service_error"}`:
    /// requests refused as invalid (no domain, no descriptors).
    pub should_rate_limit_error: Counter,
}

impl std::fmt::Debug for ServiceStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceStats").finish_non_exhaustive()
    }
}

/// The counters of one descriptor path.
#[derive(Clone, Debug)]
pub struct DescriptorStats {
    /// Every hit.
    pub total_hits: Counter,
    /// Hits over the limit (shadow mode included).
    pub over_limit: Counter,
    /// Allowed hits past the near-limit ratio.
    pub near_limit: Counter,
    /// Allowed hits.
    pub within_limit: Counter,
    /// Hits over the limit that shadow mode let through.
    pub shadow_mode: Counter,
    /// Hits answered over the limit by the local over-limit cache, with
    /// no Redis call (also counted in `over_limit`, as the peer counts them).
    pub over_limit_with_local_cache: Counter,
}

impl Default for ServiceStats {
    fn default() -> Self {
        Self::new()
    }
}

impl ServiceStats {
    /// A fresh set of metrics.
    pub fn new() -> ServiceStats {
        let recorder = Arc::new(PrometheusBuilder::new().build_recorder());
        let service = |name: &'static str| counter(&recorder, name, Vec::new());
        ServiceStats {
            config_load_success: service("ratelimit_service_config_load_success"),
            config_load_error: service("ratelimit_service_config_load_error"),
            global_shadow_mode: service("ratelimit_service_global_shadow_mode"),
            // The peer's mapping labels its `call.should_rate_limit.*`
            // counters by error type; an invalid request is its
            // `service_error` (its `redis_error` has no counterpart: a
            // Redis failure is answered by the failure policy here).
            should_rate_limit_error: counter(
                &recorder,
                "ratelimit_service_should_rate_limit_error",
                vec![Label::new("err_type", "service_error")],
            ),
            recorder,
        }
    }

    /// The counters of `path` under `domain` (registered once; the same
    /// handles on every call).
    pub fn descriptor(&self, domain: &str, path: &str) -> DescriptorStats {
        let labels = || {
            vec![
                Label::new("domain", domain.to_owned()),
                Label::new("descriptor", path.to_owned()),
            ]
        };
        let c = |name| counter(&self.recorder, name, labels());
        DescriptorStats {
            total_hits: c("ratelimit_service_rate_limit_total_hits"),
            over_limit: c("ratelimit_service_rate_limit_over_limit"),
            near_limit: c("ratelimit_service_rate_limit_near_limit"),
            within_limit: c("ratelimit_service_rate_limit_within_limit"),
            shadow_mode: c("ratelimit_service_rate_limit_shadow_mode"),
            over_limit_with_local_cache: c(
                "ratelimit_service_rate_limit_over_limit_with_local_cache",
            ),
        }
    }

    /// `ratelimit_service_rate_limit_domain_not_found{domain}`: descriptors
    /// of requests naming a domain no file configures, as the peer's
    /// `rate_limit.DOMAIN.domain_not_found` counts them (one per descriptor:
    /// it looks each up).
    pub fn domain_not_found(&self, domain: &str) -> Counter {
        counter(
            &self.recorder,
            "ratelimit_service_rate_limit_domain_not_found",
            vec![Label::new("domain", domain.to_owned())],
        )
    }

    /// The local over-limit cache's statistics under the peer's names
    /// (`ratelimit.localcache.*` through the statsd exporter's default
    /// mapping): `ratelimit_localcache_{hitCount,missCount,lookupCount,expiredCount,entryCount}`.
    pub fn local_cache(&self, s: &crate::over_limit_cache::CacheStats) {
        for (name, value) in [
            ("ratelimit_localcache_hitCount", s.hits),
            ("ratelimit_localcache_missCount", s.misses),
            ("ratelimit_localcache_lookupCount", s.hits + s.misses),
            ("ratelimit_localcache_expiredCount", s.expired),
            ("ratelimit_localcache_entryCount", s.entries),
        ] {
            let key = Key::from_parts(name, Vec::<Label>::new());
            self.recorder
                .register_gauge(&key, &metadata())
                .set(value as f64);
        }
    }

    /// The text of `/metrics`: the counters, the gauges of `limits` (each
    /// named `domain.path`) read now, and the service's Redis figures.
    pub fn render(
        &self,
        limits: &[(String, Arc<Bucket>)],
        redis: Option<MetricsSnapshot>,
    ) -> String {
        for (name, bucket) in limits {
            if let Some(stats) = bucket.stats() {
                // The engine's own export, into this service's recorder.
                metrics::with_local_recorder(&*self.recorder, || stats.record(name));
            }
        }
        if let Some(m) = redis {
            self.redis_gauges(&m);
        }
        self.recorder.handle().render()
    }

    /// Every GCRA limit's Redis calls together: they share one connection
    /// and breaker, so one series each, with no `limiter` label.
    fn redis_gauges(&self, m: &MetricsSnapshot) {
        let labels = Vec::new;
        for (metric, value) in [
            ("turnstile_redis_calls_total", m.redis_calls),
            ("turnstile_redis_errors_total", m.redis_errors),
            ("turnstile_redis_timeouts_total", m.timeouts),
            (
                "turnstile_redis_fallback_decisions_total",
                m.fallback_decisions,
            ),
            ("turnstile_redis_breaker_opened_total", m.breaker_opened),
        ] {
            counter(&self.recorder, metric, labels()).absolute(value);
        }
        let key = Key::from_parts("turnstile_redis_call_p99_seconds", labels());
        self.recorder
            .register_gauge(&key, &metadata())
            .set(m.latency.p99.as_secs_f64());
    }
}

fn metadata() -> Metadata<'static> {
    Metadata::new(TARGET, metrics::Level::INFO, Some(TARGET))
}

fn counter(recorder: &PrometheusRecorder, name: &'static str, labels: Vec<Label>) -> Counter {
    recorder.register_counter(&Key::from_parts(name, labels), &metadata())
}
