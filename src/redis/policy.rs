//! What a check answers when Redis cannot: the user's choice.
//!
//! The usual trade-off: failing open protects availability, failing closed
//! suits sensitive endpoints such as login, and a common compromise is a
//! local in-memory limiter as a fallback. The policy decides a
//! request when the Redis call failed, timed out, or was not made because
//! the circuit breaker is open; [`MetricsSnapshot::fallback_decisions`]
//! counts how often, and each such decision says so
//! ([`Decision::is_fallback`]).
//!
//! [`MetricsSnapshot::fallback_decisions`]: super::MetricsSnapshot::fallback_decisions

use std::fmt;
use std::num::NonZeroU64;
use std::time::Duration;

use crate::clock::saturating_nanos;
use crate::decision::Decision;
use crate::keyed::KeyedLimiter;

/// What a check answers when Redis cannot decide.
// One policy per limiter, built once and never moved on a hot path: boxing
// the local limiter would only make users write `Box::new`.
#[allow(clippy::large_enum_variant)]
#[non_exhaustive]
#[derive(Default)]
pub enum FailurePolicy {
    /// Allow every request (availability first). The default: a rate
    /// limiter that went down with Redis would take the service with it.
    #[default]
    FailOpen,
    /// Deny every request (protection first). The decision's `retry_after`
    /// is the time until the circuit breaker next tries Redis (at least the
    /// call timeout).
    FailClosed,
    /// Decide with this in-process limiter, one bucket per key: each
    /// gateway enforces the quota you give it on its own. A common choice is
    /// the fleet's quota divided by the number of gateways, so the fleet as
    /// a whole stays near its limit while Redis is away. A cost above the
    /// local quota's burst (but within the fleet's) is denied, as
    /// `FailClosed` would.
    Local(KeyedLimiter<Vec<u8>>),
}

impl fmt::Debug for FailurePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailurePolicy::FailOpen => f.write_str("FailOpen"),
            FailurePolicy::FailClosed => f.write_str("FailClosed"),
            FailurePolicy::Local(limiter) => f.debug_tuple("Local").field(limiter).finish(),
        }
    }
}

impl FailurePolicy {
    /// The fallback decision for `n` tokens of `key`, for a quota of burst
    /// `limit` and interval `interval`; `retry_in` is when Redis will next
    /// be tried. A `peek` takes nothing: a local limiter peeks instead of
    /// checking.
    pub(crate) fn decide(
        &self,
        (key, n, peek): (&[u8], u64, bool),
        limit: u64,
        interval: NonZeroU64,
        retry_in: Duration,
    ) -> Decision {
        let retry = saturating_nanos(retry_in);
        let closed = Decision::denied(limit, 0, interval, 0, retry);
        let decision = match self {
            FailurePolicy::FailOpen => Decision::allowed(limit, 0, interval, 0),
            FailurePolicy::FailClosed => closed,
            // The fleet's limiter accepted the cost already; a local quota
            // too small for it cannot grant it, so it is denied.
            FailurePolicy::Local(limiter) if peek => limiter.peek_n(key, n).unwrap_or(closed),
            FailurePolicy::Local(limiter) => limiter.check_n(key, n).unwrap_or(closed),
        };
        decision.by_fallback()
    }

    /// The local limiter's quota, for [`Local`](FailurePolicy::Local):
    /// what its decisions are made under.
    pub fn local_quota(&self) -> Option<crate::Quota> {
        match self {
            FailurePolicy::Local(limiter) => Some(limiter.quota()),
            _ => None,
        }
    }

    /// A short name for reports ("fail-open", "fail-closed", "local").
    pub fn name(&self) -> &'static str {
        match self {
            FailurePolicy::FailOpen => "fail-open",
            FailurePolicy::FailClosed => "fail-closed",
            FailurePolicy::Local(_) => "local",
        }
    }
}
