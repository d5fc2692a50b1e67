//! Errors of the Redis limiter: at build time (a quota the script cannot
//! represent, a bad URL or setting) and per call (a bad key or cost).
//!
//! Redis being slow or gone is not an error of `check`: the
//! [`FailurePolicy`](super::FailurePolicy) decides those requests, the
//! [metrics](super::MetricsSnapshot) count them, and the last
//! [`RedisCallError`] is kept for operators.

use std::time::Duration;

use crate::error::{BatchError, CostError, QuotasError};

/// Why a [`RedisLimiter`](super::RedisLimiter) or
/// [`RedisMulti`](super::RedisMulti) could not be built, or its quotas not
/// changed (`set_quota`, `set_quotas`: nothing was changed).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisBuildError {
    /// The quota cannot be run by the script in integer microseconds.
    #[error("the Redis script cannot hold {quota}: {reason}")]
    Unrepresentable {
        /// The quota, as text.
        quota: String,
        /// Why, with the bound that was exceeded.
        reason: String,
    },
    /// A setting of the builder that cannot work.
    #[error("invalid Redis limiter setting: {0}")]
    Config(String),
    /// A list of quotas that does not fit the limiter: for
    /// [`RedisMulti::set_quotas`](super::RedisMulti::set_quotas), another
    /// number of limits than it has ([`QuotasError::CountChanged`]).
    #[error(transparent)]
    Quotas(#[from] QuotasError),
    /// The Redis client refused the URL, or (for a cluster) the first
    /// connection failed.
    #[error("cannot connect to Redis: {0}")]
    Connect(#[from] redis::RedisError),
}

/// A call that can never be decided, whatever Redis does (nothing is sent
/// to Redis and no state changes), or an operation Redis did not answer
/// ([`Unavailable`](Self::Unavailable); checks get the failure policy's
/// decision instead).
// Not `Eq`: it may hold a `RedisCallError`, whose redis errors are not
// equal to themselves (an I/O error compares unequal).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RedisLimitError {
    /// The cost is 0 or above the burst.
    #[error(transparent)]
    Cost(#[from] CostError),
    /// An empty key: almost always a missing user id or header, which would
    /// put every such caller in one shared bucket.
    #[error("an empty key is not a caller's identity (a missing header or user id?)")]
    EmptyKey,
    /// A key longer than [`MAX_KEY_BYTES`](super::MAX_KEY_BYTES).
    #[error("a key of {len} bytes is longer than the {max} bytes a rate-limit key may have")]
    KeyTooLong {
        /// The key's length in bytes.
        len: usize,
        /// The most allowed.
        max: usize,
    },
    /// A batch whose keys and costs do not pair up, or with a cost that can
    /// never be met: the errors of the local
    /// [`KeyedLimiter::check_batch_n`](crate::KeyedLimiter::check_batch_n).
    #[error(transparent)]
    Batch(#[from] BatchError),
    /// A key of a batch that no check may use (the first one found).
    #[error("key {index} of the batch (from 0): {source}")]
    BatchKey {
        /// Its position in the batch.
        index: usize,
        /// What is wrong with it ([`EmptyKey`](Self::EmptyKey) or
        /// [`KeyTooLong`](Self::KeyTooLong)).
        source: Box<RedisLimitError>,
    },
    /// A request of [`RedisLimiter::check_each`](super::RedisLimiter::check_each)
    /// names a limiter on another call path (another connection and
    /// breaker): one script call cannot decide it with the others.
    #[error(
        "request {index} (from 0) names a limiter on another Redis connection: \
         build every limiter of one call with `with_quota` from one limiter"
    )]
    OtherConnection {
        /// Its position in the requests.
        index: usize,
    },
    /// Redis did not answer a peek, refund or reset (single or several
    /// limits), and why: these have no failure policy, since an operation
    /// that did not happen must not look done; the caller decides. With the
    /// breaker open it is [`RedisCallError::BreakerOpen`], at once.
    #[error("Redis did not answer: {0}")]
    Unavailable(#[from] RedisCallError),
    /// A client-side clock ([`TimeSource::Client`](super::TimeSource)) read
    /// a time the script cannot hold exactly.
    #[error("the client clock reads {now:?}, past the {max:?} the script holds exactly")]
    ClockOutOfRange {
        /// The reading.
        now: Duration,
        /// The largest reading allowed.
        max: Duration,
    },
}

/// Why one Redis call gave no decision. The [failure
/// policy](super::FailurePolicy) decides the request instead and the
/// [metrics](super::MetricsSnapshot) count it; the last one is kept for
/// operators ([`RedisLimiter::last_error`](super::RedisLimiter::last_error)).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RedisCallError {
    /// No reply within the timeout.
    #[error("no reply within the timeout")]
    Timeout,
    /// Not sent: the circuit breaker is open after consecutive failures.
    /// Never the [last error](super::RedisLimiter::last_error), which is
    /// the failure that opened it.
    #[error("not sent: the circuit breaker is open (Redis is tried again in {retry_in:?})")]
    BreakerOpen {
        /// How long until the breaker lets a probe call through.
        retry_in: Duration,
    },
    /// Nothing accepted the connection (no Redis listening at the
    /// address, or a firewall that rejects): the call fails at once, not
    /// after the timeout, and counts toward the breaker as any failure.
    #[error("Redis refused the connection (is it running at that address?): {0}")]
    ConnectionRefused(redis::RedisError),
    /// Redis (or the connection to it) failed: a server error, or a
    /// connection that dropped.
    #[error(transparent)]
    Redis(redis::RedisError),
    /// A reply that is not what the script returns (the reply, as text).
    #[error("unexpected script reply {0}")]
    BadReply(String),
}

impl RedisLimitError {
    /// The same error about a refund: a cost error says so in a refund's
    /// words ([`CostError::for_refund`]).
    pub(crate) fn for_refund(self) -> Self {
        match self {
            RedisLimitError::Cost(cost) => RedisLimitError::Cost(cost.for_refund()),
            other => other,
        }
    }
}

impl RedisCallError {
    /// The redis crate reports its own response timeouts as errors.
    /// A refused connection is told apart: it is the one failure that
    /// says where the fault is (nothing listening).
    pub(crate) fn from_redis(error: redis::RedisError) -> Self {
        if error.is_timeout() {
            RedisCallError::Timeout
        } else if error.is_connection_refusal() {
            RedisCallError::ConnectionRefused(error)
        } else {
            RedisCallError::Redis(error)
        }
    }
}
