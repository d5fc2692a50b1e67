//! GCRA limits in Redis: one connection, one circuit breaker and one set of
//! Redis metrics for the whole service, and every GCRA descriptor of a
//! request decided in **one** script call
//! ([`RedisLimiter::check_each`]): a request with N descriptors is one
//! round trip, not N.
//!
//! Each configured limit is a [`RedisBucket`]: a [`RedisLimiter`] made
//! with [`RedisLimiter::with_quota`] from the service's one
//! ([`RedisGcra`]), so it shares that limiter's call path, with its own
//! quota, key prefix and, with `--redis-lease`, its own leases. Each
//! descriptor is decided on its own, as in process: one over its limit
//! does not undo another's hits.

use std::sync::Arc;
use std::time::Instant;

use turnstile_rl::redis::{EachRequest, FailurePolicy, MetricsSnapshot, RedisLimiter};
use turnstile_rl::{KeyedLimiter, Quota};

use crate::bucket::{decide_local, Outcome};
use crate::over_limit_cache::{OverLimit, OverLimitCache};
use crate::settings::{FailurePolicyName, RedisSettings, RedisType};

/// The service's Redis for GCRA limits: the limiter every limit's is made
/// from, whose call path they all share.
#[derive(Debug)]
pub struct RedisGcra {
    base: Arc<RedisLimiter>,
    settings: RedisSettings,
    /// `LOCAL_CACHE_SIZE_IN_BYTES`: keys Redis refused, until when.
    cache: Option<Arc<OverLimitCache>>,
}

/// One GCRA limit in Redis.
#[derive(Debug)]
pub struct RedisBucket {
    limiter: RedisLimiter,
    burst: u64,
    /// `--redis-failure-policy local`: this limit's quota in this process,
    /// deciding what Redis could not.
    local: Option<KeyedLimiter<String>>,
}

/// One descriptor for [`RedisGcra::decide`]: its limit, its bucket key,
/// its hits (0: a look).
pub type Asked<'a> = (&'a RedisBucket, &'a str, u64);

impl RedisGcra {
    /// The service's limiter on `settings.url`, connected on first use (so
    /// the service starts while Redis is down); a Cluster is connected
    /// now, to learn its slots, and must be up.
    pub async fn new(
        settings: &RedisSettings,
        cache: Option<Arc<OverLimitCache>>,
    ) -> Result<RedisGcra, String> {
        // The service's one path has no quota of its own: this one is
        // never checked. `local` decides per limit (RedisBucket::local),
        // from the decisions this path marks as fallbacks.
        let policy = match settings.failure_policy {
            FailurePolicyName::Open | FailurePolicyName::Local => FailurePolicy::FailOpen,
            FailurePolicyName::Closed => FailurePolicy::FailClosed,
        };
        let builder = RedisLimiter::builder(Quota::per_second(1).map_err(|e| e.to_string())?);
        let builder = match settings.redis_type {
            RedisType::Single => builder.url(settings.url.clone()),
            RedisType::Cluster => builder.cluster(settings.cluster_nodes()),
        };
        let base = builder
            .prefix(settings.prefix.clone())
            .timeout(settings.timeout)
            .failure_policy(policy)
            .build()
            .await
            .map_err(|e| format!("cannot use Redis at {}: {e}", settings.url))?;
        Ok(RedisGcra {
            base: Arc::new(base),
            settings: settings.clone(),
            cache,
        })
    }

    /// The bucket of a limit of `quota`, its keys under `id` (the limit's
    /// `domain.path`); leased by `--redis-lease` when its burst allows a
    /// lease of at least 2 (a lease is capped at the burst).
    pub fn bucket(&self, quota: Quota, id: &str) -> Result<RedisBucket, String> {
        let burst = quota.burst_size();
        let lease = Some(self.settings.lease.min(burst)).filter(|&k| k >= 2);
        let limiter = self
            .base
            .with_quota(quota, format!("{}{id}:", self.settings.prefix), lease)
            .map_err(|e| format!("cannot build the Redis limiter: {e}"))?;
        let local = (self.settings.failure_policy == FailurePolicyName::Local).then(|| {
            KeyedLimiter::builder(quota)
                .max_keys(self.settings.max_keys)
                .build()
        });
        Ok(RedisBucket {
            limiter,
            burst,
            local,
        })
    }

    /// Decides every descriptor of a request in one Redis call, in order.
    /// A cost of 0 only looks; a cost above the limit itself can never
    /// fit: it looks, and is over the limit. With the over-limit cache, a
    /// key Redis refused a single hit is refused here until that refusal
    /// ends, with no call.
    pub async fn decide(&self, asked: &[Asked<'_>]) -> Vec<Outcome> {
        let looks = |bucket: &RedisBucket, cost: u64| cost == 0 || cost > bucket.burst;
        let sent = Instant::now();
        let mut outcomes: Vec<Option<Outcome>> = vec![None; asked.len()];
        let mut cache_keys: Vec<Option<String>> = vec![None; asked.len()];
        if let Some(cache) = &self.cache {
            for (i, &(bucket, key, cost)) in asked.iter().enumerate() {
                if looks(bucket, cost) {
                    continue;
                }
                let cache_key = Self::cache_key(bucket, key);
                if let Some(over) = cache.get(&cache_key, sent) {
                    outcomes[i] = Some(Outcome {
                        allowed: false,
                        decision: over.decision,
                        looked: false,
                        cached: Some(over.until),
                    });
                }
                cache_keys[i] = Some(cache_key);
            }
        }
        let pending: Vec<usize> = (0..asked.len())
            .filter(|&i| outcomes[i].is_none())
            .collect();
        let requests: Vec<EachRequest<'_>> = pending
            .iter()
            .map(|&i| {
                let (bucket, key, cost) = asked[i];
                let peek = looks(bucket, cost);
                EachRequest {
                    limiter: &bucket.limiter,
                    key: key.as_bytes(),
                    cost: if peek { 1 } else { cost },
                    peek,
                }
            })
            .collect();
        let mut decisions = Vec::with_capacity(requests.len());
        if !requests.is_empty()
            && self
                .base
                .check_each(&requests, &mut decisions)
                .await
                .is_err()
        {
            // Only a bad key gets here, and the service never builds an
            // empty one: refuse, as failing closed would.
            decisions.clear();
        }
        for (&i, decision) in pending.iter().zip(decisions) {
            let (bucket, key, cost) = asked[i];
            let outcome = match &bucket.local {
                Some(local) if decision.is_fallback() => decide_local(local, key, cost),
                _ => Outcome {
                    allowed: decision.is_allowed() && cost <= bucket.burst,
                    decision: Some(decision),
                    looked: looks(bucket, cost),
                    cached: None,
                },
            };
            // Redis refused one hit: no hit passes before its retry_after,
            // counted from before the call was sent.
            let refused_one = cost == 1 && decision.is_denied() && !decision.is_fallback();
            if let (Some(cache), Some(cache_key), true) =
                (&self.cache, cache_keys[i].as_deref(), refused_one)
            {
                if let Some(wait) = decision.retry_after() {
                    let over = OverLimit {
                        until: sent + wait,
                        decision: Some(decision),
                    };
                    cache.insert(cache_key, over, sent);
                }
            }
            outcomes[i] = Some(outcome);
        }
        outcomes
            .into_iter()
            .map(|o| o.unwrap_or_else(Outcome::refused))
            .collect()
    }

    /// A GCRA bucket's key in the over-limit cache: its Redis key (fixed
    /// windows' start otherwise, so the two never meet).
    fn cache_key(bucket: &RedisBucket, key: &str) -> String {
        let redis_key = bucket.limiter.redis_key(key.as_bytes());
        format!("g:{}", String::from_utf8_lossy(&redis_key))
    }

    /// The Redis counters and latency of the service (every GCRA limit's
    /// calls: they share one path).
    pub fn metrics(&self) -> MetricsSnapshot {
        self.base.metrics()
    }

    /// The service's limiter, whose connection, timeout and breaker the
    /// fixed windows in Redis share (`crate::redis_windows`).
    pub fn shared(&self) -> Arc<RedisLimiter> {
        self.base.clone()
    }
}

impl RedisBucket {
    /// The limiter (its quota, metrics, leases).
    pub fn limiter(&self) -> &RedisLimiter {
        &self.limiter
    }
}
