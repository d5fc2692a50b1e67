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

use turnstile_rl::redis::{EachRequest, FailurePolicy, MetricsSnapshot, RedisLimiter};
use turnstile_rl::{KeyedLimiter, Quota};

use crate::bucket::{decide_local, Outcome};
use crate::settings::{FailurePolicyName, RedisSettings};

/// The service's Redis for GCRA limits: the limiter every limit's is made
/// from, whose call path they all share.
#[derive(Debug)]
pub struct RedisGcra {
    base: RedisLimiter,
    settings: RedisSettings,
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
    /// the service starts while Redis is down).
    pub async fn new(settings: &RedisSettings) -> Result<RedisGcra, String> {
        // The service's one path has no quota of its own: this one is
        // never checked. `local` decides per limit (RedisBucket::local),
        // from the decisions this path marks as fallbacks.
        let policy = match settings.failure_policy {
            FailurePolicyName::Open | FailurePolicyName::Local => FailurePolicy::FailOpen,
            FailurePolicyName::Closed => FailurePolicy::FailClosed,
        };
        let base = RedisLimiter::builder(Quota::per_second(1).map_err(|e| e.to_string())?)
            .url(settings.url.clone())
            .prefix(settings.prefix.clone())
            .timeout(settings.timeout)
            .failure_policy(policy)
            .build()
            .await
            .map_err(|e| format!("cannot use Redis at {}: {e}", settings.url))?;
        Ok(RedisGcra {
            base,
            settings: settings.clone(),
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
    /// fit: it looks, and is over the limit.
    pub async fn decide(&self, asked: &[Asked<'_>]) -> Vec<Outcome> {
        if asked.is_empty() {
            return Vec::new();
        }
        let looks = |bucket: &RedisBucket, cost: u64| cost == 0 || cost > bucket.burst;
        let requests: Vec<EachRequest<'_>> = asked
            .iter()
            .map(|&(bucket, key, cost)| {
                let peek = looks(bucket, cost);
                EachRequest {
                    limiter: &bucket.limiter,
                    key: key.as_bytes(),
                    cost: if peek { 1 } else { cost },
                    peek,
                }
            })
            .collect();
        let mut decisions = Vec::with_capacity(asked.len());
        if self
            .base
            .check_each(&requests, &mut decisions)
            .await
            .is_err()
        {
            // Only a bad key gets here, and the service never builds an
            // empty one: refuse, as failing closed would.
            return vec![Outcome::refused(); asked.len()];
        }
        asked
            .iter()
            .zip(decisions)
            .map(|(&(bucket, key, cost), decision)| match &bucket.local {
                Some(local) if decision.is_fallback() => decide_local(local, key, cost),
                _ => {
                    let look = looks(bucket, cost);
                    Outcome {
                        allowed: decision.is_allowed() && cost <= bucket.burst,
                        decision: Some(decision),
                        looked: look,
                    }
                }
            })
            .collect()
    }

    /// The Redis counters and latency of the service (every GCRA limit's
    /// calls: they share one path).
    pub fn metrics(&self) -> MetricsSnapshot {
        self.base.metrics()
    }
}

impl RedisBucket {
    /// The limiter (its quota, metrics, leases).
    pub fn limiter(&self) -> &RedisLimiter {
        &self.limiter
    }
}
