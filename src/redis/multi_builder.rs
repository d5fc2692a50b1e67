//! [`RedisMultiBuilder`]: a [`RedisMulti`] built from its quotas alone,
//! with the settings of a [`RedisLimiter`]'s builder.

use std::time::Duration;

use super::{
    BreakerConfig, FailurePolicy, HashTag, RedisBuildError, RedisLimiter, RedisLimiterBuilder,
    RedisMulti, TimeSource,
};
use crate::quotas::Quotas;

/// Builds a [`RedisMulti`]: `RedisMulti::builder(quotas)`, then where Redis
/// is and how to behave when it is not there, as for a
/// [`RedisLimiter`](super::RedisLimiterBuilder) (the same defaults, the
/// same checks when built).
///
/// No lease: each check decides every limit in one script call, all or
/// nothing, so there is no single bucket to lease tokens from.
#[derive(Debug)]
pub struct RedisMultiBuilder {
    quotas: Quotas,
    /// The settings, held by a single-limit builder of the first quota:
    /// one place checks them and builds the call path.
    settings: RedisLimiterBuilder,
}

impl RedisMulti {
    /// A builder for `quotas`: one server at `redis://127.0.0.1:6379`
    /// unless told otherwise, and the defaults of
    /// [`RedisLimiter::builder`].
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use turnstile_rl::redis::{FailurePolicy, RedisMulti};
    ///
    /// let api = RedisMulti::builder("10/s burst 20; 1000/h".parse()?)
    ///     .url("redis://127.0.0.1:6379")
    ///     .prefix("api:")
    ///     .timeout(Duration::from_millis(20))
    ///     .failure_policy(FailurePolicy::FailClosed)
    ///     .build()
    ///     .await?;
    /// let d = api.check("alice").await?;
    /// # let _ = d;
    /// # Ok(())
    /// # }
    /// ```
    pub fn builder(quotas: Quotas) -> RedisMultiBuilder {
        RedisMultiBuilder {
            settings: RedisLimiter::builder(quotas.first()),
            quotas,
        }
    }
}

impl RedisMultiBuilder {
    /// One Redis server (see [`RedisLimiterBuilder::url`]).
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.settings = self.settings.url(url);
        self
    }

    /// A Redis Cluster (see [`RedisLimiterBuilder::cluster`]).
    pub fn cluster<I, S>(mut self, nodes: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.settings = self.settings.cluster(nodes);
        self
    }

    /// The prefix of every Redis key (see [`RedisLimiterBuilder::prefix`]):
    /// limit `i` of key `k` is `prefix` `k` `:i`.
    pub fn prefix(mut self, prefix: impl AsRef<[u8]>) -> Self {
        self.settings = self.settings.prefix(prefix);
        self
    }

    /// How keys pick their Cluster slot (see
    /// [`RedisLimiterBuilder::hash_tag`]).
    pub fn hash_tag(mut self, tag: HashTag) -> Self {
        self.settings = self.settings.hash_tag(tag);
        self
    }

    /// The most a Redis call may take (see
    /// [`RedisLimiterBuilder::timeout`]).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.settings = self.settings.timeout(timeout);
        self
    }

    /// When the circuit breaker opens and for how long.
    pub fn breaker(mut self, config: BreakerConfig) -> Self {
        self.settings = self.settings.breaker(config);
        self
    }

    /// What checks answer when Redis cannot (default
    /// [`FailurePolicy::FailOpen`]).
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.settings = self.settings.failure_policy(policy);
        self
    }

    /// Where "now" comes from (default [`TimeSource::Server`]).
    pub fn time_source(mut self, time: TimeSource) -> Self {
        self.settings = self.settings.time_source(time);
        self
    }

    /// Checks every setting and every quota, and connects, as
    /// [`RedisLimiterBuilder::build`] does.
    pub async fn build(self) -> Result<RedisMulti, RedisBuildError> {
        self.settings.build().await?.multi(self.quotas)
    }
}
