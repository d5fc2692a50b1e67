//! [`Limiter`]: the one trait [`RateLimitLayer`](super::RateLimitLayer)
//! uses, so one layer serves a local limiter and a remote (Redis) one.

use std::convert::Infallible;
use std::future::{ready, Future, Ready};
use std::sync::Arc;

use super::HttpKey;
use crate::{Clock, Decision, DirectLimiter, Gcra, KeyedLimiter, Quota};

/// A limiter the HTTP layer can ask: an asynchronous check of one request
/// of cost 1 for a key, and the quota it enforces (for the
/// `RateLimit-Policy` header).
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
/// use turnstile::http::{HttpKey, Limiter};
/// use turnstile::{Decision, Quota};
///
/// #[derive(Debug, thiserror::Error)]
/// #[error("store unreachable")]
/// struct StoreDown;
///
/// struct Remote { quota: Quota /* , a connection pool */ }
///
/// impl Limiter for Remote {
///     type Error = StoreDown;
///     type Future = Pin<Box<dyn Future<Output = Result<Decision, StoreDown>> + Send>>;
///
///     fn check(&self, key: &HttpKey) -> Self::Future {
///         // Move what the call needs (the key, a pool handle) into the
///         // future: it must not borrow `self` or `key`. Cloning an
///         // `HttpKey` bumps a reference count; it is `AsRef<[u8]>`.
///         let _key: HttpKey = key.clone();
///         Box::pin(async move { Err(StoreDown) })
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
    type Future: Future<Output = Result<Decision, Self::Error>> + Send + 'static;

    /// Decides one request of cost 1 for `key`. Dropping the future before
    /// it completes must leave the key's state as it was or as if the check
    /// had run once; the layer never retries a check.
    fn check(&self, key: &HttpKey) -> Self::Future;

    /// The quota this limiter enforces, advertised as `q` (requests) and
    /// `w` (seconds, rounded up) in `RateLimit-Policy`.
    fn quota(&self) -> Quota;
}

/// One bucket per key: the usual choice (per API key, user or client IP).
impl<C: Clock + 'static> Limiter for KeyedLimiter<HttpKey, C, Gcra> {
    type Error = Infallible;
    type Future = Ready<Result<Decision, Infallible>>;

    #[inline]
    fn check(&self, key: &HttpKey) -> Self::Future {
        ready(Ok(KeyedLimiter::check(self, key)))
    }

    fn quota(&self) -> Quota {
        self.algorithm().quota()
    }
}

/// One bucket for every request the layer sees, whatever its key: a global
/// limit on a route (protecting a fragile backend). The key is still
/// extracted, so a malformed key is still refused by the key policy.
impl<C: Clock + 'static> Limiter for DirectLimiter<C, Gcra> {
    type Error = Infallible;
    type Future = Ready<Result<Decision, Infallible>>;

    #[inline]
    fn check(&self, _key: &HttpKey) -> Self::Future {
        ready(Ok(DirectLimiter::check(self)))
    }

    fn quota(&self) -> Quota {
        self.algorithm().quota()
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

    fn quota(&self) -> Quota {
        (**self).quota()
    }
}
