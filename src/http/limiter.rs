//! [`Limiter`]: the one trait [`RateLimitLayer`](super::RateLimitLayer)
//! uses, so one layer serves a local limiter and a remote (Redis) one.

use std::convert::Infallible;
use std::future::{ready, Future, Ready};
use std::sync::Arc;

use super::request::HttpKey;
use crate::algorithms::Gcra;
use crate::clock::Clock;
use crate::direct::DirectLimiter;
use crate::error::CostError;
use crate::keyed::KeyedLimiter;
use crate::multi::{KeyedMultiLimiter, MultiDecision, MultiLimiter};
use crate::quota::Quota;

/// A limiter the HTTP layer can ask: an asynchronous check of one request
/// for a key, of cost 1 or of a cost the layer's
/// [`CostExtractor`](super::CostExtractor) read, and the quotas it enforces
/// (for the `RateLimit-Policy` header).
///
/// A check answers a [`MultiDecision`]: the binding limit's
/// [`Decision`](crate::Decision)
/// and which of [`quotas`](Limiter::quotas) it is. A limiter of one quota
/// answers `decision.into()` (binding limit 0); a limiter of several
/// ([`KeyedMultiLimiter`], [`MultiLimiter`]) decides them all or nothing,
/// so one layer enforces several limits without spending a token of one on
/// a request another denies.
///
/// Local limiters answer at once ([`Ready`] futures, [`Infallible`]
/// errors); a remote limiter returns a future that talks to its store and
/// may fail. What the layer does with an error is the layer's
/// [`OnLimiterError`](super::OnLimiterError) policy: fail closed with a
/// `503` (the default) or fail open.
///
/// # Implementing it for a remote limiter
///
/// ```
/// use std::future::Future;
/// use std::pin::Pin;
/// use turnstile_rl::http::{HttpKey, Limiter};
/// use turnstile_rl::{CostError, MultiDecision, Quota};
///
/// #[derive(Debug, thiserror::Error)]
/// #[error("store unreachable")]
/// struct StoreDown;
///
/// struct Remote { quota: Quota /* , a connection pool */ }
///
/// impl Limiter for Remote {
///     type Error = StoreDown;
///     type Future = Pin<Box<dyn Future<Output = Result<MultiDecision, StoreDown>> + Send>>;
///
///     fn check(&self, key: &HttpKey) -> Self::Future {
///         // Move what the call needs (the key, a pool handle) into the
///         // future: it must not borrow `self` or `key`. Cloning an
///         // `HttpKey` bumps a reference count; it is `AsRef<[u8]>`.
///         let _key: HttpKey = key.clone();
///         Box::pin(async move { Err(StoreDown) })
///     }
///
///     fn check_n(&self, key: &HttpKey, cost: u64) -> Result<Self::Future, CostError> {
///         // A cost no wait can meet is refused before anything is sent.
///         let capacity = self.quota.burst_size();
///         if cost == 0 {
///             return Err(CostError::Zero);
///         }
///         if cost > capacity {
///             return Err(CostError::ExceedsCapacity { cost, capacity });
///         }
///         let _key: HttpKey = key.clone();
///         Ok(Box::pin(async move { Err(StoreDown) }))
///     }
///
///     fn quota(&self) -> Quota {
///         self.quota
///     }
/// }
/// # let _ = Remote { quota: Quota::per_minute(1).unwrap() };
/// ```
pub trait Limiter: Send + Sync + 'static {
    /// Why a check could not be decided (a store that is down). Local
    /// limiters never fail: [`Infallible`].
    type Error: std::error::Error + Send + Sync + 'static;

    /// The pending check. It owns what it needs (`'static`), so the layer
    /// can hold it across polls without borrowing the limiter.
    type Future: Future<Output = Result<MultiDecision, Self::Error>> + Send + 'static;

    /// Decides one request of cost 1 for `key`. Dropping the future before
    /// it completes must leave the key's state as it was or as if the check
    /// had run once; the layer never retries a check.
    fn check(&self, key: &HttpKey) -> Self::Future;

    /// Decides one request of cost `cost` for `key`, all `cost` tokens of
    /// every limit or none (see [`check`](Limiter::check) on dropping the
    /// future). A cost no wait can ever meet, 0 or above a limit's
    /// capacity, is an error at once, before anything is charged or sent:
    /// the layer answers it (`400`, `413`) instead of a `429` whose
    /// `Retry-After` could never be honoured.
    fn check_n(&self, key: &HttpKey, cost: u64) -> Result<Self::Future, CostError>;

    /// The quota this limiter enforces, advertised in `RateLimit-Policy`
    /// (how: [`headers`](super::headers)); for a limiter of several, the
    /// first.
    fn quota(&self) -> Quota;

    /// Every quota this limiter enforces, in the order a
    /// [`MultiDecision::binding`] counts them: each is one item of
    /// `RateLimit-Policy`. One limit by default.
    fn quotas(&self) -> Vec<Quota> {
        vec![self.quota()]
    }

    /// The quota a [fallback decision](crate::Decision::is_fallback) is
    /// made under, when a local limiter makes it (a Redis limiter's
    /// `FailurePolicy::Local`): the layer then describes such a decision
    /// by that quota and its bucket (`RateLimit-Policy`, `RateLimit`,
    /// `Retry-After`), the limit that decided. `None` (the default) when
    /// fallback decisions describe no bucket (fail open, fail closed).
    fn fallback_quota(&self) -> Option<Quota> {
        None
    }

    /// A number that moves whenever [`quotas`](Limiter::quotas) may answer
    /// differently: the layer renders `RateLimit-Policy` again on the first
    /// response after it moves, and keeps the rendering while it does not.
    /// Constant (`0`) by default, for quotas that never change; the
    /// crate's limiters count their quota changes (`set_quota`).
    fn quota_version(&self) -> u64 {
        0
    }
}

/// One bucket per key: the usual choice (per API key, user or client IP).
impl<C: Clock + 'static> Limiter for KeyedLimiter<HttpKey, C, Gcra> {
    type Error = Infallible;
    type Future = Ready<Result<MultiDecision, Infallible>>;

    #[inline]
    fn check(&self, key: &HttpKey) -> Self::Future {
        ready(Ok(KeyedLimiter::check(self, key).into()))
    }

    #[inline]
    fn check_n(&self, key: &HttpKey, cost: u64) -> Result<Self::Future, CostError> {
        KeyedLimiter::check_n(self, key, cost).map(|d| ready(Ok(d.into())))
    }

    fn quota(&self) -> Quota {
        KeyedLimiter::quota(self)
    }

    fn quota_version(&self) -> u64 {
        KeyedLimiter::quota_version(self)
    }
}

/// One bucket for every request the layer sees, whatever its key: a global
/// limit on a route (protecting a fragile backend). The key is still
/// extracted, so a malformed key is still refused by the key policy.
impl<C: Clock + 'static> Limiter for DirectLimiter<C, Gcra> {
    type Error = Infallible;
    type Future = Ready<Result<MultiDecision, Infallible>>;

    #[inline]
    fn check(&self, _key: &HttpKey) -> Self::Future {
        ready(Ok(DirectLimiter::check(self).into()))
    }

    #[inline]
    fn check_n(&self, _key: &HttpKey, cost: u64) -> Result<Self::Future, CostError> {
        DirectLimiter::check_n(self, cost).map(|d| ready(Ok(d.into())))
    }

    fn quota(&self) -> Quota {
        DirectLimiter::quota(self)
    }

    fn quota_version(&self) -> u64 {
        DirectLimiter::quota_version(self)
    }
}

/// A shared limiter: the same buckets behind several layers (several routes
/// that draw on one quota).
impl<L: Limiter + ?Sized> Limiter for Arc<L> {
    type Error = L::Error;
    type Future = L::Future;

    #[inline]
    fn check(&self, key: &HttpKey) -> Self::Future {
        (**self).check(key)
    }

    #[inline]
    fn check_n(&self, key: &HttpKey, cost: u64) -> Result<Self::Future, CostError> {
        (**self).check_n(key, cost)
    }

    fn quota(&self) -> Quota {
        (**self).quota()
    }

    fn quotas(&self) -> Vec<Quota> {
        (**self).quotas()
    }

    fn fallback_quota(&self) -> Option<Quota> {
        (**self).fallback_quota()
    }

    fn quota_version(&self) -> u64 {
        (**self).quota_version()
    }
}

/// Several limits per key, all or nothing (see [`KeyedMultiLimiter`]): one
/// layer for `"10/s burst 20; 1000/h"`. A request one limit denies takes
/// nothing from the others, and the headers name the binding limit.
impl<C: Clock + 'static> Limiter for KeyedMultiLimiter<HttpKey, C> {
    type Error = Infallible;
    type Future = Ready<Result<MultiDecision, Infallible>>;

    #[inline]
    fn check(&self, key: &HttpKey) -> Self::Future {
        ready(Ok(KeyedMultiLimiter::check(self, key)))
    }

    #[inline]
    fn check_n(&self, key: &HttpKey, cost: u64) -> Result<Self::Future, CostError> {
        KeyedMultiLimiter::check_n(self, key, cost).map(|d| ready(Ok(d)))
    }

    fn quota(&self) -> Quota {
        KeyedMultiLimiter::quotas(self).first()
    }

    fn quotas(&self) -> Vec<Quota> {
        KeyedMultiLimiter::quotas(self).as_slice().to_vec()
    }

    fn quota_version(&self) -> u64 {
        KeyedMultiLimiter::quota_version(self)
    }
}

/// Several limits on one shared bucket each, all or nothing (see
/// [`MultiLimiter`]): a global budget of several limits on a route.
impl<C: Clock + 'static> Limiter for MultiLimiter<C> {
    type Error = Infallible;
    type Future = Ready<Result<MultiDecision, Infallible>>;

    #[inline]
    fn check(&self, _key: &HttpKey) -> Self::Future {
        ready(Ok(MultiLimiter::check(self)))
    }

    #[inline]
    fn check_n(&self, _key: &HttpKey, cost: u64) -> Result<Self::Future, CostError> {
        MultiLimiter::check_n(self, cost).map(|d| ready(Ok(d)))
    }

    fn quota(&self) -> Quota {
        MultiLimiter::quotas(self).first()
    }

    fn quotas(&self) -> Vec<Quota> {
        MultiLimiter::quotas(self).as_slice().to_vec()
    }

    fn quota_version(&self) -> u64 {
        MultiLimiter::quota_version(self)
    }
}
