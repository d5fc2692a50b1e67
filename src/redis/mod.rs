//! `RedisLimiter`: the same quotas and decisions from a shared Redis, for
//! a fleet of stateless gateways (feature `redis`).
//!
//! If each of 20 gateways counts alone, a user spread across them gets 20
//! times the limit; so the state lives in Redis and every check updates it
//! atomically, with one Lua script. A check is one round trip (P50 about
//! 30 µs, P99 about 70 µs on loopback; see the README), wrapped in:
//!
//! - **a timeout** (default [`DEFAULT_TIMEOUT`], configurable): a slow Redis
//!   costs at most that;
//! - **a circuit breaker** ([`breaker`]): after consecutive failures it
//!   stops calling Redis for a cool-down, so a dead Redis costs no timeouts,
//!   then lets one probe through;
//! - **a failure policy** ([`FailurePolicy`]): fail open, fail closed, or a
//!   local [`KeyedLimiter`](crate::KeyedLimiter), for the requests Redis
//!   could not decide;
//! - **reconnection** by the redis crate's connection manager (or cluster
//!   client) by itself when Redis comes back;
//! - optional **leases** ([`lease`]): take `k` tokens per round trip and
//!   spend them locally, for at most `gateways × (k − 1)` extra admissions
//!   per window;
//! - **metrics** ([`MetricsSnapshot`]): allowed, denied, errors, timeouts,
//!   breaker transitions, fallback decisions, and the call's P50/P95/P99.
//!
//! The script, and why it counts microseconds: [`script`].
//!
//! # A timeout is not a rollback
//!
//! A call that times out was sent: if Redis was only slow (or paused), it
//! still runs the script when it gets to it and takes the tokens, while the
//! failure policy has already answered. Such a request is counted by Redis
//! and decided by the policy: under `FailClosed` a denied request may still
//! cost a token, under `FailOpen` an allowed one is charged late. Redis
//! never admits more than the quota through this; the fleet may see
//! slightly fewer admissions after a stall (`tests/redis_failure.rs` shows
//! it with a server paused by SIGSTOP).
//!
//! ```no_run
//! use std::time::Duration;
//! use turnstile::redis::{FailurePolicy, RedisLimiter};
//! use turnstile::Quota;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = RedisLimiter::builder(Quota::per_minute(100)?)
//!     .url("redis://127.0.0.1:6379")
//!     .prefix("api:")
//!     .timeout(Duration::from_millis(20))
//!     .failure_policy(FailurePolicy::FailOpen)
//!     .build()
//!     .await?;
//! let decision = limiter.check("user_42").await?;
//! if decision.is_denied() {
//!     // 429, Retry-After: decision.retry_after()
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Keys
//!
//! Keys are bytes (`impl AsRef<[u8]>`: `&str`, `String`, `Vec<u8>`,
//! `&[u8]`), stored under a configurable prefix (default
//! [`DEFAULT_PREFIX`]). An empty key is refused ([`RedisLimitError::EmptyKey`]):
//! it is nearly always a missing header or user id, and would put every such
//! caller in one bucket. A key longer than [`MAX_KEY_BYTES`] is refused too;
//! anything else, any bytes at all, is a key. Each check touches exactly one
//! Redis key, so the script runs on Redis Cluster; [`HashTag`] groups keys
//! on one slot when you want that.
//!
//! # Time
//!
//! By default the script reads the server's `TIME`, so gateways' clocks
//! never matter (the seeds name skew as a risk). [`TimeSource::Client`]
//! passes a client clock instead: for tests and simulations on a
//! [`ManualClock`](crate::ManualClock), or for a fleet that trusts its
//! clocks; every gateway must then share one time scale, and the keys'
//! expiry (`PEXPIRE`, in server time) assumes that scale runs at real speed.

pub mod breaker;
mod connection;
mod error;
#[cfg(feature = "tower")]
mod http;
pub mod lease;
mod metrics;
mod ops;
mod policy;
pub mod script;

use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use breaker::{BreakerConfig, BreakerState};
pub use error::{RedisBuildError, RedisLimitError};
pub use metrics::{LatencySnapshot, MetricsSnapshot};
pub use ops::RedisMulti;
pub use policy::FailurePolicy;
pub use script::{MAX_NOW_MICROS, MAX_TOLERANCE_MICROS};

use self::breaker::{Admission, Breaker};
use self::connection::Connection;
use self::error::CallError;
use self::lease::Leases;
use self::metrics::Metrics;
use self::script::GcraScript;
use crate::algorithm::Algorithm;
use crate::clock::saturating_nanos;
use crate::{Clock, Decision, Quota};

/// The call timeout unless set: tens of milliseconds, about 200 loopback
/// round trips, short enough that a stalled Redis barely shows.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);
/// The key prefix unless set.
pub const DEFAULT_PREFIX: &str = "turnstile:";
/// The longest key accepted, in bytes (64 KiB): far beyond any identity,
/// short of what would make one request a memory attack on Redis.
pub const MAX_KEY_BYTES: usize = 64 * 1024;

/// The shortest default lease time to live: for fast quotas `k × T` is
/// microseconds, and a lease that expires before the next request only
/// costs an extra call.
pub const MIN_DEFAULT_LEASE_TTL: Duration = Duration::from_secs(1);

/// Where the script's "now" comes from.
#[derive(Clone, Default)]
pub enum TimeSource {
    /// The Redis server's `TIME`: one clock for the whole fleet (default).
    #[default]
    Server,
    /// A clock on the client, read by each check and sent to the script in
    /// microseconds. Gateways whose clocks disagree by `d` shift each
    /// other's decisions by up to `d`: use it for tests and simulations
    /// (a shared [`ManualClock`](crate::ManualClock)) or clocks you trust.
    Client(Arc<dyn Clock>),
}

impl std::fmt::Debug for TimeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TimeSource::Server => "TimeSource::Server",
            TimeSource::Client(_) => "TimeSource::Client",
        })
    }
}

/// How a key's Redis key is formed, and so which Cluster slot it hashes to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum HashTag {
    /// `prefix + key`: keys spread over the slots (default). As for any
    /// Redis key, a key that itself holds `{...}` hashes by that part.
    #[default]
    None,
    /// `prefix + "{" + key + "}"`: only the key picks the slot, so one
    /// user's buckets under different prefixes (different limiters) share
    /// a slot and can be read together.
    Key,
    /// `prefix + "{" + tag + "}" + key`: every bucket of this limiter on
    /// one slot (one shard: no spreading).
    Fixed(String),
}

/// Builds a [`RedisLimiter`]: where Redis is, and how to behave when it is
/// not there.
#[derive(Debug)]
pub struct RedisLimiterBuilder {
    quota: Quota,
    nodes: Vec<String>,
    cluster: bool,
    prefix: Vec<u8>,
    hash_tag: HashTag,
    timeout: Duration,
    breaker: BreakerConfig,
    policy: FailurePolicy,
    time: TimeSource,
    lease: Option<(u64, Option<Duration>)>,
}

impl RedisLimiterBuilder {
    /// One Redis server, for example `redis://127.0.0.1:6379` (default).
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.nodes = vec![url.into()];
        self.cluster = false;
        self
    }

    /// A Redis Cluster, reached through any of these nodes.
    pub fn cluster<I, S>(mut self, nodes: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.nodes = nodes.into_iter().map(Into::into).collect();
        self.cluster = true;
        self
    }

    /// The prefix of every Redis key (default [`DEFAULT_PREFIX`]). Limiters
    /// with different quotas need different prefixes. A `{...}` in the
    /// prefix would be every key's hash tag (one Cluster slot for all):
    /// use [`HashTag`] to choose that.
    pub fn prefix(mut self, prefix: impl AsRef<[u8]>) -> Self {
        self.prefix = prefix.as_ref().to_vec();
        self
    }

    /// How keys pick their Cluster slot (default [`HashTag::None`]).
    pub fn hash_tag(mut self, tag: HashTag) -> Self {
        self.hash_tag = tag;
        self
    }

    /// The most a Redis call may take before the failure policy decides
    /// (default [`DEFAULT_TIMEOUT`]); it also bounds connecting.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// When the circuit breaker opens and for how long.
    pub fn breaker(mut self, config: BreakerConfig) -> Self {
        self.breaker = config;
        self
    }

    /// What checks answer when Redis cannot (default
    /// [`FailurePolicy::FailOpen`]).
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Where "now" comes from (default [`TimeSource::Server`]).
    pub fn time_source(mut self, time: TimeSource) -> Self {
        self.time = time;
        self
    }

    /// Takes `k` tokens per Redis round trip and spends the rest locally
    /// ([`lease`]); `k` must be 2 to the burst.
    pub fn lease(mut self, k: u64) -> Self {
        self.lease = Some((k, self.lease.and_then(|(_, ttl)| ttl)));
        self
    }

    /// How long leased tokens stay spendable (default `k × T`, at least
    /// [`MIN_DEFAULT_LEASE_TTL`]).
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease = self.lease.map(|(k, _)| (k, Some(ttl)));
        self
    }

    /// Checks every setting and connects (lazily to one server, so a
    /// limiter can start while Redis is down; a Cluster must be up, to
    /// learn its slots). Must run inside a tokio runtime with time enabled.
    pub async fn build(self) -> Result<RedisLimiter, RedisBuildError> {
        let script = GcraScript::new(&self.quota)?;
        let config = |why: String| Err(RedisBuildError::Config(why));
        if self.timeout.is_zero() {
            return config("the timeout must be longer than zero".into());
        }
        if self.breaker.failure_threshold == 0 {
            return config("the breaker's failure threshold must be at least 1".into());
        }
        if self.nodes.is_empty() {
            return config("no Redis node given".into());
        }
        if let HashTag::Fixed(tag) = &self.hash_tag {
            if tag.is_empty() || tag.contains('}') {
                return config(format!(
                    "hash tag {tag:?} must be non-empty and without '}}'"
                ));
            }
        }
        let leases = match self.lease {
            None => None,
            Some((k, ttl)) => {
                if k < 2 || k > script.burst() {
                    return config(format!(
                        "a lease of {k} tokens: it must be 2 to the burst ({})",
                        script.burst()
                    ));
                }
                let k32 = u32::try_from(k).unwrap_or(u32::MAX);
                let ttl = ttl.unwrap_or_else(|| {
                    script
                        .interval()
                        .saturating_mul(k32)
                        .max(MIN_DEFAULT_LEASE_TTL)
                });
                Some(Leases::new(k, ttl))
            }
        };
        let connection = if self.cluster {
            Connection::cluster(&self.nodes, self.timeout).await?
        } else {
            Connection::single(&self.nodes[0], self.timeout)?
        };
        let interval =
            NonZeroU64::new(saturating_nanos(script.interval())).unwrap_or(NonZeroU64::MIN);
        Ok(RedisLimiter {
            quota: self.quota,
            script,
            interval,
            connection,
            prefix: self.prefix,
            hash_tag: self.hash_tag,
            timeout: self.timeout,
            breaker: Breaker::new(self.breaker, self.timeout),
            policy: self.policy,
            time: self.time,
            leases,
            metrics: Metrics::new(),
        })
    }
}

/// A GCRA limiter whose buckets live in Redis, shared by every gateway
/// that uses the same Redis, prefix and quota.
///
/// Cheap to share: put it in an `Arc` and call it from any task. See the
/// [module docs](self) for what happens around each call.
#[derive(Debug)]
pub struct RedisLimiter {
    quota: Quota,
    script: GcraScript,
    /// `T` as the script runs it (whole µs), in ns.
    interval: NonZeroU64,
    connection: Connection,
    prefix: Vec<u8>,
    hash_tag: HashTag,
    timeout: Duration,
    breaker: Breaker,
    policy: FailurePolicy,
    time: TimeSource,
    leases: Option<Leases>,
    metrics: Metrics,
}

impl RedisLimiter {
    /// A builder for `quota`: one server at `redis://127.0.0.1:6379` unless
    /// told otherwise.
    pub fn builder(quota: Quota) -> RedisLimiterBuilder {
        RedisLimiterBuilder {
            quota,
            nodes: vec!["redis://127.0.0.1:6379".to_owned()],
            cluster: false,
            prefix: DEFAULT_PREFIX.as_bytes().to_vec(),
            hash_tag: HashTag::None,
            timeout: DEFAULT_TIMEOUT,
            breaker: BreakerConfig::default(),
            policy: FailurePolicy::FailOpen,
            time: TimeSource::Server,
            lease: None,
        }
    }

    /// Decides one request of cost 1 for `key`.
    pub async fn check(&self, key: impl AsRef<[u8]>) -> Result<Decision, RedisLimitError> {
        self.check_n(key, 1).await
    }

    /// Decides one request of cost `n` for `key`: all `n` tokens or none.
    /// An error (and no call) for a bad key, or `n` of 0 or above the
    /// burst; otherwise always a decision, from Redis, a lease, or the
    /// failure policy.
    pub async fn check_n(
        &self,
        key: impl AsRef<[u8]>,
        n: u64,
    ) -> Result<Decision, RedisLimitError> {
        let key = key.as_ref();
        self.script.gcra().check_cost(n)?;
        if key.is_empty() {
            return Err(RedisLimitError::EmptyKey);
        }
        if key.len() > MAX_KEY_BYTES {
            return Err(RedisLimitError::KeyTooLong {
                len: key.len(),
                max: MAX_KEY_BYTES,
            });
        }
        let now_micros = self.client_now()?;
        let burst = self.script.burst();
        if let Some(leases) = &self.leases {
            if let Some(decision) = leases.spend(key, n, Instant::now(), burst, self.interval) {
                self.metrics.lease_hit();
                self.metrics.decision(true);
                return Ok(decision);
            }
        }
        let (admission, transition) = self.breaker.admit(Instant::now());
        self.metrics.transition(transition);
        let decision = match admission {
            Admission::Reject => self.fallback(key, n),
            Admission::Call | Admission::Probe => match self.call(key, n, now_micros).await {
                Ok(decision) => {
                    self.metrics.transition(self.breaker.on_success());
                    decision
                }
                Err(error) => {
                    self.metrics.failure(&error);
                    self.metrics
                        .transition(self.breaker.on_failure(Instant::now()));
                    self.fallback(key, n)
                }
            },
        };
        self.metrics.decision(decision.is_allowed());
        Ok(decision)
    }

    /// One script call, within the timeout.
    async fn call(
        &self,
        key: &[u8],
        n: u64,
        now_micros: Option<u64>,
    ) -> Result<Decision, CallError> {
        let want = self.leases.as_ref().map_or(n, |l| l.want(n));
        let redis_key = self.redis_key(key);
        let invocation = self.script.invocation(&redis_key, n, want, now_micros);
        self.metrics.call();
        let started = Instant::now();
        let reply = tokio::time::timeout(self.timeout, self.connection.invoke(&invocation))
            .await
            .map_err(|_| CallError::Timeout)?
            .map_err(CallError::from_redis)?;
        self.metrics.latency(started.elapsed());
        let reply = self.script.decode(&reply, n)?;
        let extra = reply.granted.saturating_sub(n);
        match &self.leases {
            Some(leases) if extra > 0 => {
                let kept = leases.keep(key, extra, Instant::now(), reply.decision.reset_after());
                // What this gateway may still admit: Redis's tokens for a
                // request of cost n, plus the ones it keeps locally.
                let remaining = reply.decision.remaining().saturating_add(kept);
                Ok(Decision::allowed(
                    reply.decision.limit(),
                    remaining.saturating_mul(self.interval.get()),
                    self.interval,
                    saturating_nanos(reply.decision.reset_after()),
                ))
            }
            _ => Ok(reply.decision),
        }
    }

    /// The failure policy's decision, counted.
    fn fallback(&self, key: &[u8], n: u64) -> Decision {
        self.metrics.fallback();
        let retry_in = self.breaker.retry_in(Instant::now()).max(self.timeout);
        self.policy
            .decide(key, n, self.script.burst(), self.interval, retry_in)
    }

    /// The client clock's reading in µs, or `None` for the server's TIME.
    fn client_now(&self) -> Result<Option<u64>, RedisLimitError> {
        match &self.time {
            TimeSource::Server => Ok(None),
            TimeSource::Client(clock) => {
                let now = clock.now();
                let micros = now / 1_000;
                if micros >= MAX_NOW_MICROS {
                    return Err(RedisLimitError::ClockOutOfRange {
                        now: Duration::from_nanos(now),
                        max: Duration::from_micros(MAX_NOW_MICROS - 1),
                    });
                }
                Ok(Some(micros))
            }
        }
    }

    /// The Redis key of `key`: prefix, then the key as the hash tag asks.
    pub fn redis_key(&self, key: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.prefix.len() + key.len() + 2);
        out.extend_from_slice(&self.prefix);
        match &self.hash_tag {
            HashTag::None => out.extend_from_slice(key),
            HashTag::Key => {
                out.push(b'{');
                out.extend_from_slice(key);
                out.push(b'}');
            }
            HashTag::Fixed(tag) => {
                out.push(b'{');
                out.extend_from_slice(tag.as_bytes());
                out.push(b'}');
                out.extend_from_slice(key);
            }
        }
        out
    }

    /// The quota, as given.
    pub fn quota(&self) -> &Quota {
        &self.quota
    }

    /// The emission interval the script runs: the quota's, rounded up to
    /// whole microseconds.
    pub fn emission_interval(&self) -> Duration {
        self.script.interval()
    }

    /// The circuit breaker's state now.
    pub fn breaker_state(&self) -> BreakerState {
        self.breaker.state(Instant::now())
    }

    /// The failure policy.
    pub fn failure_policy(&self) -> &FailurePolicy {
        &self.policy
    }

    /// Counters and latency percentiles since the limiter was built.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.metrics.snapshot()
    }

    /// The last failed Redis call's error (a timeout, a refused
    /// connection, a server error), if any: for logs and operators.
    pub fn last_error(&self) -> Option<String> {
        self.metrics.last_error()
    }
}
