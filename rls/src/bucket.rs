//! `Bucket`: the state of one configured limit, in-process or in Redis.

use std::time::{Duration, Instant};

use turnstile_rl::{Clock, Decision, KeyedLimiter, Quota};

use crate::config::{Algorithm, Limit};
use crate::redis_gcra::{RedisBucket, RedisGcra};

/// One configured limit's buckets, one per distinct request value.
// Built once per limit and kept behind an `Arc`, never moved on a hot path.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Bucket {
    /// In-process GCRA.
    Gcra(KeyedLimiter<String>),
    /// A fixed window, envoyproxy/ratelimit's: counted by the engine, in
    /// this process or in Redis, all of a request's windows at once.
    Window,
    /// GCRA in Redis, shared by every instance of the service (decided by
    /// the engine, all of a request's at once).
    Redis(RedisBucket),
    /// `requests_per_unit: 0`: every request is over the limit.
    DenyAll,
}

/// What a bucket answered for one descriptor.
#[derive(Clone, Copy, Debug)]
pub struct Outcome {
    /// Whether the hits fit.
    pub allowed: bool,
    /// The numbers behind the answer (`None` for [`Bucket::DenyAll`]).
    pub decision: Option<Decision>,
    /// A look (cost 0): `decision` is what one more hit would get.
    pub looked: bool,
    /// Answered by the local over-limit cache, with no Redis call: the
    /// refusal holds until then.
    pub cached: Option<Instant>,
}

impl Outcome {
    /// Over the limit, with no figures.
    pub fn refused() -> Outcome {
        Outcome {
            allowed: false,
            decision: None,
            looked: false,
            cached: None,
        }
    }

    /// Requests of cost 1 left.
    pub fn remaining(&self) -> u64 {
        // A look's decision counts the hit it did not take: one more left.
        let taken_by_look = u64::from(self.looked && self.decision.is_some_and(|d| d.is_allowed()));
        self.decision.map_or(0, |d| d.remaining() + taken_by_look)
    }

    /// Envoy's `duration_until_reset`: for a refusal, the wait until the
    /// same hits could pass (a fixed window's edge); otherwise the time
    /// until the bucket is full again.
    pub fn until_reset(&self, unit: Duration) -> Duration {
        match self.decision {
            Some(d) => d.retry_after().unwrap_or_else(|| d.reset_after()),
            None => unit,
        }
    }
}

impl Bucket {
    /// The bucket for `limit`: in Redis through `redis` if given, else in
    /// this process with up to `max_keys` keys; `id` names the limit in
    /// Redis keys.
    pub fn build(
        limit: &Limit,
        redis: Option<&RedisGcra>,
        max_keys: usize,
        id: &str,
    ) -> Result<Bucket, String> {
        if limit.algorithm == Algorithm::FixedWindow {
            return Ok(Bucket::Window);
        }
        if limit.requests_per_unit == 0 {
            return Ok(Bucket::DenyAll);
        }
        let quota = quota(limit)?;
        match redis {
            None => Ok(Bucket::Gcra(
                KeyedLimiter::builder(quota).max_keys(max_keys).build(),
            )),
            Some(redis) => Ok(Bucket::Redis(redis.bucket(quota, id)?)),
        }
    }

    /// Takes `cost` hits for `key` in this process (`0`: only looks, as
    /// Envoy's `hits_addend: 0` asks). A cost above the bucket's size can
    /// never fit: it is over the limit, and takes nothing. Windows and
    /// Redis buckets are decided by the engine, a request's all at once.
    pub fn decide(&self, key: &str, cost: u64) -> Outcome {
        match self {
            Bucket::Gcra(l) => decide_local(l, key, cost),
            Bucket::Window | Bucket::DenyAll | Bucket::Redis(_) => Outcome::refused(),
        }
    }

    /// The in-process limiter's gauges, if any.
    pub fn stats(&self) -> Option<turnstile_rl::Stats> {
        match self {
            Bucket::Gcra(l) => Some(l.stats()),
            _ => None,
        }
    }
}

/// [`Bucket::decide`] for an in-process limiter.
pub(crate) fn decide_local<C: Clock, A: turnstile_rl::Algorithm>(
    limiter: &KeyedLimiter<String, C, A>,
    key: &str,
    cost: u64,
) -> Outcome {
    let decision = if cost == 0 {
        limiter.peek(key)
    } else {
        match limiter.check_n(key, cost) {
            Ok(d) => d,
            // Above the bucket's size: it can never fit, and takes nothing.
            Err(_) => {
                return Outcome {
                    allowed: false,
                    decision: Some(limiter.peek(key)),
                    looked: true,
                    cached: None,
                }
            }
        }
    };
    Outcome {
        allowed: decision.is_allowed(),
        decision: Some(decision),
        looked: cost == 0,
        cached: None,
    }
}

/// The quota of `limit`: a bucket of `requests_per_unit`, refilled over one unit.
pub fn quota(limit: &Limit) -> Result<Quota, String> {
    Quota::new(u64::from(limit.requests_per_unit), limit.unit.duration())
        .map_err(|e| format!("{} per {}: {e}", limit.requests_per_unit, limit.unit))
}
