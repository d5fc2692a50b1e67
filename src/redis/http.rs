//! The HTTP layer's [`Limiter`] for a shared [`RedisLimiter`] or
//! [`RedisMulti`], so one [`RateLimitLayer`](crate::http::RateLimitLayer)
//! serves a fleet exactly as it serves a local limiter (features `redis`
//! and `tower`).
//!
//! The layer holds an `Arc` of either: each check moves a clone of the
//! `Arc` and of the key (two reference counts) into its future. Redis being
//! down or slow is the limiter's [`FailurePolicy`](super::FailurePolicy)'s
//! business, and arrives as a [fallback](crate::Decision::is_fallback)
//! decision (open: allowed; closed: denied with a `retry_after`; local: the
//! local limiter's, which the layer describes by the local quota: see
//! [`Limiter::fallback_quota`]). Only a key the script refuses
//! (empty, or above `MAX_KEY_BYTES`) is an error, which the layer answers
//! with its [`OnLimiterError`](crate::http::OnLimiterError) policy.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::{RedisLimitError, RedisLimiter, RedisMulti};
use crate::algorithms::Algorithm;
use crate::error::CostError;
use crate::http::{HttpKey, Limiter};
use crate::multi::MultiDecision;
use crate::quota::Quota;

impl Limiter for Arc<RedisLimiter> {
    type Error = RedisLimitError;
    type Future = Pin<Box<dyn Future<Output = Result<MultiDecision, RedisLimitError>> + Send>>;

    fn check(&self, key: &HttpKey) -> Self::Future {
        let (limiter, key) = (Arc::clone(self), key.clone());
        // The inherent check, by path: `limiter.check` would find this very
        // trait method on the `Arc` first.
        Box::pin(async move { RedisLimiter::check(&limiter, &key).await.map(Into::into) })
    }

    /// The cost is checked against the quota now; a quota changed before
    /// the call starts is checked again by the call, and a cost it cannot
    /// meet is then the layer's limiter error.
    fn check_n(&self, key: &HttpKey, cost: u64) -> Result<Self::Future, CostError> {
        self.script().gcra().check_cost(cost)?;
        let (limiter, key) = (Arc::clone(self), key.clone());
        Ok(Box::pin(async move {
            RedisLimiter::check_n(&limiter, &key, cost)
                .await
                .map(Into::into)
        }))
    }

    fn quota(&self) -> Quota {
        RedisLimiter::quota(self)
    }

    fn quota_version(&self) -> u64 {
        RedisLimiter::quota_version(self)
    }

    fn fallback_quota(&self) -> Option<Quota> {
        self.failure_policy().local_quota()
    }
}

/// Several limits per key in Redis, all or nothing: the headers name the
/// binding limit, and list every quota in `RateLimit-Policy` (again from
/// the first response after a [`set_quotas`](RedisMulti::set_quotas)).
impl Limiter for Arc<RedisMulti> {
    type Error = RedisLimitError;
    type Future = Pin<Box<dyn Future<Output = Result<MultiDecision, RedisLimitError>> + Send>>;

    fn check(&self, key: &HttpKey) -> Self::Future {
        let (limiter, key) = (Arc::clone(self), key.clone());
        Box::pin(async move { RedisMulti::check(&limiter, &key).await })
    }

    /// As for one limit: checked against the quotas now, and again by the
    /// call.
    fn check_n(&self, key: &HttpKey, cost: u64) -> Result<Self::Future, CostError> {
        CostError::check(cost, RedisMulti::quotas(self).min_burst())?;
        let (limiter, key) = (Arc::clone(self), key.clone());
        Ok(Box::pin(async move {
            RedisMulti::check_n(&limiter, &key, cost).await
        }))
    }

    fn quota(&self) -> Quota {
        RedisMulti::quotas(self).first()
    }

    fn quotas(&self) -> Vec<Quota> {
        RedisMulti::quotas(self).as_slice().to_vec()
    }

    fn quota_version(&self) -> u64 {
        RedisMulti::quota_version(self)
    }

    fn fallback_quota(&self) -> Option<Quota> {
        self.failure_policy().local_quota()
    }
}
