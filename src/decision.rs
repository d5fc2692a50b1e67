//! `Decision`: what a check answers, the same for every algorithm and backend.

use std::num::NonZeroU64;
use std::time::Duration;

/// The answer to one check: allowed or denied, and what the caller may tell
/// its client (the numbers behind `Retry-After` and the RateLimit headers).
///
/// The figures are kept raw and worked out when asked, so a caller who only
/// wants [`is_allowed`](Decision::is_allowed) pays for no division on the
/// hot path.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[must_use = "a Decision says whether the request may pass"]
pub struct Decision {
    allowed: bool,
    fallback: bool,
    limit: u64,
    // remaining() == headroom / per_token: GCRA keeps headroom in nanoseconds
    // (per_token = T), the counters in requests (per_token = 1).
    headroom: u64,
    per_token: NonZeroU64,
    reset_after: u64,
    retry_after: u64,
}

impl Decision {
    /// An allowed decision. `headroom / per_token` tokens remain; the bucket
    /// is full again after `reset_after` nanoseconds.
    #[inline]
    pub(crate) fn allowed(
        limit: u64,
        headroom: u64,
        per_token: NonZeroU64,
        reset_after: u64,
    ) -> Self {
        Decision {
            allowed: true,
            fallback: false,
            limit,
            headroom,
            per_token,
            reset_after,
            retry_after: 0,
        }
    }

    /// A denied decision: the same request could pass after `retry_after`
    /// nanoseconds (saturated at `u64::MAX`).
    #[inline]
    pub(crate) fn denied(
        limit: u64,
        headroom: u64,
        per_token: NonZeroU64,
        reset_after: u64,
        retry_after: u64,
    ) -> Self {
        Decision {
            allowed: false,
            fallback: false,
            limit,
            headroom,
            per_token,
            reset_after,
            // A denial always has something to wait for, even if rounding
            // made the wait shorter than a nanosecond.
            retry_after: retry_after.max(1),
        }
    }

    /// This decision turned into a refusal that changes nothing: used when a
    /// request is refused without state (a full keyed limiter that denies new
    /// keys). The wait it advises is the time the request would have taken
    /// to pay back.
    pub(crate) fn refused(self) -> Decision {
        Decision {
            allowed: false,
            headroom: 0,
            retry_after: self.reset_after.max(1),
            ..self
        }
    }

    /// This decision, marked as a failure policy's (see
    /// [`is_fallback`](Decision::is_fallback)). Only the Redis limiter has
    /// a failure policy.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn by_fallback(self) -> Decision {
        Decision {
            fallback: true,
            ..self
        }
    }

    /// Whether a failure policy made this decision because the limiter's
    /// shared store could not (a Redis limiter with Redis unreachable).
    /// Its figures then describe no shared state: fail open reports no
    /// tokens left and no reset, a local fallback this process's own
    /// bucket. The HTTP layer writes no `RateLimit` field for it.
    #[inline]
    pub fn is_fallback(&self) -> bool {
        self.fallback
    }

    /// Whether the request may pass.
    #[inline]
    pub fn is_allowed(&self) -> bool {
        self.allowed
    }

    /// Whether the request was refused (HTTP 429).
    #[inline]
    pub fn is_denied(&self) -> bool {
        !self.allowed
    }

    /// Whole tokens (requests of cost 1) left after this decision.
    #[inline]
    pub fn remaining(&self) -> u64 {
        self.headroom / self.per_token
    }

    /// The most requests the limiter admits at once (the burst, or the
    /// window's limit).
    #[inline]
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// For a denial, how long until the same request could pass; `None` when
    /// allowed.
    #[inline]
    pub fn retry_after(&self) -> Option<Duration> {
        (!self.allowed).then(|| Duration::from_nanos(self.retry_after))
    }

    /// How long until the limiter is back to its full allowance if no more
    /// requests arrive.
    #[inline]
    pub fn reset_after(&self) -> Duration {
        Duration::from_nanos(self.reset_after)
    }
}
