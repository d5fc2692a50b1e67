//! `RedisLimiter`: the same quotas and decisions from a shared Redis, for
//! a fleet of stateless gateways (feature `redis`).
//!
//! If each of 20 gateways counts alone, a user spread across them gets 20
//! times the limit; so the state lives in Redis and every check updates it
//! atomically, with one Lua script. A check is one round trip (tens of
//! microseconds on loopback: the README has the measured figures). Every
//! Redis call, a check, a batch, a peek, refund or reset, on one limit or
//! on several ([`RedisMulti`]), takes one path that wraps it in:
//!
//! - **a timeout** (default [`DEFAULT_TIMEOUT`], configurable): a slow Redis
//!   costs at most that;
//! - **a circuit breaker** ([`BreakerState`]): after consecutive failures it
//!   stops calling Redis for a cool-down, so a dead Redis costs no timeouts,
//!   then lets one probe through;
//! - **a failure policy** ([`FailurePolicy`]): fail open, fail closed, or a
//!   local [`KeyedLimiter`](crate::KeyedLimiter), for the checks Redis
//!   could not decide (a peek, refund or reset it did not answer is an
//!   error instead: [`RedisLimitError::Unavailable`]);
//! - **reconnection** by the redis crate's connection manager (or cluster
//!   client) by itself when Redis comes back;
//! - optional **leases** ([`RedisLimiterBuilder::lease`]): take `k` tokens per round trip and
//!   spend them locally, for at most `gateways × (k − 1)` extra admissions
//!   per window;
//! - **metrics** ([`MetricsSnapshot`]): allowed, denied, errors, timeouts,
//!   breaker transitions, calls the open breaker refused, fallback
//!   decisions, and the call's P50/P95/P99;
//!   the last failed call's [`RedisCallError`] from
//!   [`RedisLimiter::last_error`].
//!
//! The script, and why it counts microseconds: [below](#the-script-in-integer-microseconds).
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
//! use turnstile_rl::redis::{FailurePolicy, RedisLimiter};
//! use turnstile_rl::Quota;
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
//! # Batches
//!
//! [`check_batch`](RedisLimiter::check_batch) and
//! [`check_batch_n`](RedisLimiter::check_batch_n) decide many keys in one
//! round trip, for servers that take work in batches (a queue consumer, a
//! log ingester limiting per tenant): the same script, given every key of
//! the batch, decides them in slice order at one reading of the clock, so
//! the decisions are exactly those of checking the keys one by one, a key
//! named twice charged twice. Around the call, the same timeout (one for
//! the whole batch), breaker, failure policy and metrics as a single
//! check: a batch counts as one call to the breaker, and if Redis does not
//! answer, every key of the batch gets the failure policy's decision, in
//! slice order.
//!
//! - **On Redis Cluster** a script's keys must share a hash slot, so a
//!   batch is split by slot: one script call per slot its keys fall in,
//!   all sent at once and bounded by one deadline (each master receives
//!   its calls on one connection, together). Each call succeeds or fails on
//!   its own: the keys of a call that failed get the failure policy's
//!   decision, the others Redis's. On the server's clock each call reads
//!   its own master's `TIME` (calls share no bucket, so only the instant
//!   differs). For one call per batch on a Cluster, put the keys on one
//!   slot ([`HashTag::Fixed`]).
//! - **Leases**: a batch spends a key's leased tokens first, exactly as a
//!   check does; the keys it sends to Redis take just their cost (a batch
//!   takes no new leases), so batches never widen the lease bound.
//! - A batch is one script run: Redis does nothing else while it runs (a
//!   few microseconds per key: a 256-key batch took 1.1 ms end to end on
//!   this repo's loaded 2-core machine, against 8.5 ms one by one), so
//!   keep batches to hundreds of keys, not millions.
//!
//! # Several limits in one call
//!
//! A server whose one request meets several limits, each with its own
//! quota and key (a rate limit service deciding every descriptor of a
//! request), makes the limiters with [`RedisLimiter::with_quota`] from one
//! limiter, so they share its connection, breaker, failure policy and
//! metrics, and decides a request's checks on all of them in one script
//! call with [`RedisLimiter::check_each`]: each decided on its own, as if
//! checked alone in order (leases included); all or nothing on one key is
//! [`RedisMulti`]'s.
//!
//! # Keys
//!
//! Keys are bytes (`impl AsRef<[u8]>`: `&str`, `String`, `Vec<u8>`,
//! `&[u8]`), stored under a configurable prefix (default
//! [`DEFAULT_PREFIX`]). An empty key is refused ([`RedisLimitError::EmptyKey`]):
//! it is nearly always a missing header or user id, and would put every such
//! caller in one bucket. A key longer than [`MAX_KEY_BYTES`] is refused too;
//! anything else, any bytes at all, is a key. Each check touches exactly one
//! Redis key (a batch, one per key in each call, a call's keys sharing a
//! slot), so the script runs on Redis Cluster; [`HashTag`] groups keys
//! on one slot when you want that.
//!
//! # Time
//!
//! By default the script reads the server's `TIME`, so gateways' clocks
//! never matter (clock skew between gateways is the classic failure of a
//! shared limit that each gateway timestamps itself). [`TimeSource::Client`]
//! passes a client clock instead: for tests and simulations on a
//! [`ManualClock`](crate::ManualClock), or for a fleet that trusts its
//! clocks; every gateway must then share one time scale, and the keys'
//! expiry (`PEXPIRE`, in server time) assumes that scale runs at real speed.
//!
//! # The script, in integer microseconds
//!
//! The GCRA of [`Gcra`](crate::algorithms::Gcra) as one Lua script.
//!
//! ## Why microseconds
//!
//! Lua numbers are IEEE doubles: integers are exact only below
//! 2<sup>53</sup>. Nanoseconds since the Unix epoch are about 1.8 ×
//! 10<sup>18</sup>, far above 2<sup>53</sup> ≈ 9.0 × 10<sup>15</sup>, so a
//! script on nanoseconds would round its own clock (the reason Bucket4j's
//! maintainers turned Lua down). Microseconds since the epoch are about 1.8
//! × 10<sup>15</sup>: exact. turnstile keeps every quantity the script
//! touches below 2<sup>53</sup>:
//!
//! - `now` (the server's `TIME`, or a client clock) below
//!   [`MAX_NOW_MICROS`] = 2<sup>52</sup> µs (the year 2112 for `TIME`);
//! - `tau = B × T` at most [`MAX_TOLERANCE_MICROS`] = 2<sup>52</sup> µs
//!   (about 142 years), checked when the limiter is built;
//! - so `TAT <= now + tau < 2^53`, and every sum, product and comparison in
//!   the script is exact integer arithmetic.
//!
//! The emission interval is rounded **up** to whole microseconds (a 3/s
//! quota runs with `T = 333,334 µs`): rounding can only admit fewer requests
//! than the quota, never more. A quota whose `T` is under 1 µs (more than a
//! million requests a second per key) cannot be represented and is refused
//! when the limiter is built.
//!
//! ## The call
//!
//! `gcra.lua` reads `TAT` with `GET`, computes exactly what
//! [`Gcra`](crate::algorithms::Gcra) computes, stores the new `TAT` and sets `PEXPIRE`
//! to the bucket's reset time (when the bucket is full again, a missing key
//! decides the same, so idle users cost Redis nothing). It takes its keys and
//! every value through `KEYS`/`ARGV` (no string building), so it runs on
//! Redis Cluster (a call's keys in one hash slot). It is sent with `EVALSHA` and loaded again on `NOSCRIPT`
//! (the redis crate's [`Script`](redis::Script)).
//!
//! One call decides one request or several, in order, at one `now` (a
//! batch: [`RedisLimiter::check_batch`]).
//! The reply is `{now, granted, TAT before, ...}`, a pair per request; each
//! [`Decision`] is then worked out in Rust by [`Gcra`](crate::algorithms::Gcra) itself on those numbers
//! (scaled to nanoseconds), so Redis decisions carry the same figures as
//! local ones, and a reply that disagrees with the pure function is
//! reported as a bad reply rather than trusted.
//!
//! For leases, the script can take more than the cost: `want` tokens if that
//! many are available, the cost `n` otherwise. With `want == n` it is plain
//! GCRA.

mod breaker;
mod call;
mod changing;
mod connection;
mod each;
mod error;
#[cfg(feature = "tower")]
mod http;
mod lease;
mod metrics;
mod multi_builder;
mod ops;
mod policy;
mod script;

use std::collections::BTreeMap;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use breaker::{BreakerConfig, BreakerState, DEFAULT_COOL_DOWN, DEFAULT_FAILURE_THRESHOLD};
pub use connection::slot;
pub use each::EachRequest;
pub use error::{RedisBuildError, RedisCallError, RedisLimitError};
pub use metrics::{LatencySnapshot, MetricsSnapshot};
pub use multi_builder::RedisMultiBuilder;
pub use ops::RedisMulti;
pub use policy::FailurePolicy;
pub use script::{MAX_NOW_MICROS, MAX_TOLERANCE_MICROS};

use self::breaker::Breaker;
use self::call::CallPath;
use self::changing::{Changing, Versioned};
use self::connection::Connection;
use self::lease::Leases;
use self::script::{GcraScript, Reply};
use crate::algorithms::Algorithm;
use crate::clock::saturating_nanos;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::BatchError;
use crate::quota::Quota;

/// The call timeout unless set: tens of milliseconds, about 200 loopback
/// round trips, short enough that a stalled Redis barely shows.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);
/// The key prefix unless set.
pub const DEFAULT_PREFIX: &str = "turnstile:";
/// The one server a limiter talks to unless told otherwise.
pub const DEFAULT_URL: &str = "redis://127.0.0.1:6379";
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

    /// Takes `k` tokens per Redis round trip and spends the rest locally;
    /// `k` must be 2 to the burst.
    ///
    /// With this set to `k`, a check that finds no local tokens for its key asks Redis for
    /// `k` tokens (or, if fewer are available, just its own cost) in the same
    /// single script call, and keeps what it did not spend for the next checks
    /// of that key on this gateway. Those spend locally, without a round trip,
    /// until the lease runs out or expires. Leased tokens keep being spent while
    /// Redis is away; the failure policy decides only once they are gone.
    ///
    /// # The error bound
    ///
    /// Every token spent locally was taken from the Redis bucket *before* it
    /// was spent, so leasing never lets the fleet take more tokens from Redis
    /// than the quota gives. What it changes is *when* they are spent: a token
    /// taken at `t0` may be spent later. Count the admissions of one key in any
    /// window `[a, b]`: each is either a token taken from Redis within `[a, b]`
    /// (bounded by the quota, exactly as without leases) or a token taken
    /// before `a` and still unspent at `a`. A gateway never holds more than
    /// `k − 1` unspent tokens of a key (its lease is capped there), so:
    ///
    /// > admissions in any window ≤ the quota's bound for that window
    /// > + gateways × (k − 1).
    ///
    /// The error runs the other way too: tokens leased by a gateway whose
    /// traffic stops are not available to the others until they expire (the
    /// lease's time to live, by default `k × T` but at least
    /// [`MIN_DEFAULT_LEASE_TTL`]) and come back with the
    /// bucket's refill. `tests/redis_lease.rs` checks the bound and measures
    /// the calls saved.
    ///
    /// Lease expiry runs on the process's monotonic clock (`Instant`),
    /// whatever the limiter's [`TimeSource`].
    ///
    /// One fetch per key at a time: a check that finds the key's lease
    /// empty while another check's call is fetching the next one waits for
    /// that call (at most the call timeout) and spends what it brought,
    /// instead of sending a call of its own; so concurrent checks of a hot
    /// key cost one round trip per lease, not one each. (Batches take no
    /// leases and do not wait.)
    ///
    /// The leases sit in one mutex-guarded map per limiter: a lookup is
    /// a few tens of nanoseconds, next to the tens of microseconds of the round
    /// trip it saves. Expired leases are swept when the map has grown past
    /// twice its size at the last sweep.
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
        let leases = leases(self.lease, &script)?;
        let connection = if self.cluster {
            Connection::cluster(&self.nodes, self.timeout).await?
        } else {
            Connection::single(&self.nodes[0], self.timeout)?
        };
        let interval = script.interval_nanos();
        let path = CallPath::new(
            connection,
            self.timeout,
            Breaker::new(self.breaker, self.timeout),
            self.policy,
            self.time,
        );
        Ok(RedisLimiter {
            current: Changing::new(Current {
                quota: self.quota,
                script,
                interval,
            }),
            path: Arc::new(path),
            prefix: self.prefix,
            hash_tag: self.hash_tag,
            leases,
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
    /// The quota and what the script runs for it, replaced whole by
    /// `set_quota`. A call copies the `Arc` out (the lock is held for that
    /// copy only, never across a round trip) and runs wholly at that quota.
    current: Changing<Current>,
    /// Connection, timeout, breaker, failure policy, clock and metrics:
    /// shared with every [`RedisMulti`] made from this limiter.
    path: Arc<CallPath>,
    prefix: Vec<u8>,
    hash_tag: HashTag,
    leases: Option<Leases>,
}

/// A [`RedisLimiter`]'s quota and what the script runs for it.
#[derive(Debug)]
struct Current {
    /// As given.
    quota: Quota,
    script: GcraScript,
    /// `T` as the script runs it (whole µs), in ns.
    interval: NonZeroU64,
}

/// One call's script, held by the `Arc` of the quota it belongs to.
struct ScriptOf(Arc<Versioned<Current>>);

impl std::ops::Deref for ScriptOf {
    type Target = GcraScript;

    fn deref(&self) -> &GcraScript {
        &self.0.script
    }
}

impl RedisLimiter {
    /// A builder for `quota`: one server at [`DEFAULT_URL`] unless told
    /// otherwise; the defaults are listed in the README's Redis section.
    pub fn builder(quota: Quota) -> RedisLimiterBuilder {
        RedisLimiterBuilder {
            quota,
            nodes: vec![DEFAULT_URL.to_owned()],
            cluster: false,
            prefix: DEFAULT_PREFIX.as_bytes().to_vec(),
            hash_tag: HashTag::None,
            timeout: DEFAULT_TIMEOUT,
            breaker: BreakerConfig::default(),
            policy: FailurePolicy::default(),
            time: TimeSource::default(),
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
        self.script().gcra().check_cost(n)?;
        check_key(key)?;
        let now_micros = self.path.client_now()?;
        let mut out = Vec::with_capacity(1);
        self.decide(&[(key, n)], Want::Lease, now_micros, &mut out)
            .await;
        // `decide` answers every request it is given; were it not to, the
        // failure policy would.
        Ok(out.pop().unwrap_or_else(|| self.fallback(key, n)))
    }

    /// Decides one request of cost 1 for each of `keys`, in order, into
    /// `out` (cleared first), in **one** Redis round trip: exactly the
    /// decisions of calling [`check`](RedisLimiter::check) on each key in
    /// slice order, a key named twice charged twice (one script call
    /// decides them all, at one reading of the clock).
    ///
    /// The same timeout (one for the whole batch), circuit breaker, failure
    /// policy and metrics as single checks: if Redis does not answer, every
    /// key of the batch gets the failure policy's decision. On a Cluster
    /// the batch is split by hash slot, one script call per slot, all sent
    /// at once (see [the module docs](self#batches)). An error, with
    /// nothing decided or sent, for a bad key (its index in the batch is
    /// in [`RedisLimitError::BatchKey`]).
    ///
    /// ```no_run
    /// # async fn run(limiter: turnstile_rl::redis::RedisLimiter) -> Result<(), Box<dyn std::error::Error>> {
    /// // A queue consumer: one round trip for a batch of events per tenant.
    /// let tenants = ["acme", "globex", "acme"];
    /// let mut decisions = Vec::new(); // reused across batches
    /// limiter.check_batch(&tenants, &mut decisions).await?;
    /// for (tenant, decision) in tenants.iter().zip(&decisions) {
    ///     if decision.is_denied() {
    ///         println!("{tenant}: retry in {:?}", decision.retry_after());
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn check_batch<K>(
        &self,
        keys: &[K],
        out: &mut Vec<Decision>,
    ) -> Result<(), RedisLimitError>
    where
        K: AsRef<[u8]> + Sync,
    {
        self.batch(keys, |_| 1, out).await
    }

    /// [`check_batch`](RedisLimiter::check_batch) with a cost per key: the
    /// decisions of [`check_n`](RedisLimiter::check_n) on each pair in
    /// order, in one round trip. An error, with nothing decided or sent,
    /// when the lengths differ or a cost is 0 or above the burst
    /// ([`RedisLimitError::Batch`], as the local
    /// [`KeyedLimiter::check_batch_n`](crate::KeyedLimiter::check_batch_n)
    /// reports them) or a key is bad ([`RedisLimitError::BatchKey`]).
    ///
    /// ```no_run
    /// # async fn run(limiter: turnstile_rl::redis::RedisLimiter) -> Result<(), Box<dyn std::error::Error>> {
    /// use turnstile_rl::BatchError;
    /// use turnstile_rl::redis::RedisLimitError;
    ///
    /// let mut decisions = Vec::new();
    /// // Bytes per tenant: one round trip for the whole batch of uploads.
    /// limiter.check_batch_n(&["acme", "globex"], &[40, 2], &mut decisions).await?;
    /// assert!(matches!(
    ///     limiter.check_batch_n(&["acme"], &[1, 1], &mut decisions).await,
    ///     Err(RedisLimitError::Batch(BatchError::LengthMismatch { keys: 1, costs: 2 }))
    /// ));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn check_batch_n<K>(
        &self,
        keys: &[K],
        costs: &[u64],
        out: &mut Vec<Decision>,
    ) -> Result<(), RedisLimitError>
    where
        K: AsRef<[u8]> + Sync,
    {
        let script = self.script();
        BatchError::check(keys.len(), costs, |cost| script.gcra().check_cost(cost))?;
        self.batch(keys, |i| costs[i], out).await
    }

    /// The batch path once costs are valid: checks the keys, then decides.
    async fn batch<K>(
        &self,
        keys: &[K],
        cost: impl Fn(usize) -> u64,
        out: &mut Vec<Decision>,
    ) -> Result<(), RedisLimitError>
    where
        K: AsRef<[u8]> + Sync,
    {
        let requests = keys
            .iter()
            .enumerate()
            .map(|(index, key)| {
                let key = key.as_ref();
                check_key(key).map_err(|source| RedisLimitError::BatchKey {
                    index,
                    source: Box::new(source),
                })?;
                Ok((key, cost(index)))
            })
            .collect::<Result<Vec<_>, RedisLimitError>>()?;
        let now_micros = self.path.client_now()?;
        self.decide(&requests, Want::Cost, now_micros, out).await;
        Ok(())
    }

    /// Decides valid `requests` (key, cost) on this limiter in order into
    /// `out`, as [`check_each`](RedisLimiter::check_each) does (one script
    /// call carrying the quota once).
    async fn decide(
        &self,
        requests: &[(&[u8], u64)],
        want: Want,
        now_micros: Option<u64>,
        out: &mut Vec<Decision>,
    ) {
        let each: Vec<EachRequest<'_>> = requests
            .iter()
            .map(|&(key, cost)| EachRequest {
                limiter: self,
                key,
                cost,
                peek: false,
            })
            .collect();
        let currents = vec![self.current(); requests.len()];
        self.decide_each(&each, &currents, want, now_micros, out)
            .await;
    }

    /// How `redis_keys` split into script calls: one call in all on a
    /// single server, one per hash slot on a Cluster (a script's keys must
    /// share a slot). Each group holds positions in `redis_keys`, in order.
    fn groups(&self, redis_keys: &[Vec<u8>]) -> Vec<Vec<usize>> {
        if !self.path.is_cluster() {
            return vec![(0..redis_keys.len()).collect()];
        }
        let mut by_slot: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        for (at, key) in redis_keys.iter().enumerate() {
            by_slot.entry(connection::slot(key)).or_default().push(at);
        }
        by_slot.into_values().collect()
    }

    /// Tokens to ask Redis for, for a request of cost `n`.
    fn want(&self, want: Want, n: u64) -> u64 {
        match (want, &self.leases) {
            (Want::Lease, Some(leases)) => leases.want(n),
            _ => n,
        }
    }

    /// The decision for a request of cost `n` that Redis answered: its
    /// own, or, when Redis granted more for a lease, one that counts the
    /// tokens kept locally.
    fn settle(&self, key: &[u8], n: u64, reply: Reply) -> Decision {
        let extra = reply.granted.saturating_sub(n);
        match &self.leases {
            Some(leases) if extra > 0 => {
                let kept = leases.keep(key, extra, Instant::now(), reply.decision.reset_after());
                // What this gateway may still admit: Redis's tokens for a
                // request of cost n, plus the ones it keeps locally.
                let remaining = reply.decision.remaining().saturating_add(kept);
                let interval = self.current().interval;
                Decision::allowed(
                    reply.decision.limit(),
                    remaining.saturating_mul(interval.get()),
                    interval,
                    saturating_nanos(reply.decision.reset_after()),
                )
            }
            _ => reply.decision,
        }
    }

    /// The failure policy's decision, counted.
    fn fallback(&self, key: &[u8], n: u64) -> Decision {
        let current = self.current();
        self.path
            .fallback((key, n, false), current.script.burst(), current.interval)
    }

    /// The Redis key of `key`: prefix, then the key as the hash tag asks.
    pub fn redis_key(&self, key: &[u8]) -> Vec<u8> {
        redis_key(&self.prefix, &self.hash_tag, key)
    }

    /// The quota enforced now, as given (to the builder or to
    /// [`set_quota`](RedisLimiter::set_quota)).
    pub fn quota(&self) -> Quota {
        self.current().quota
    }

    /// Changes the quota while the limiter serves, through `&self`: calls
    /// that begin after this returns send the new quota to the script.
    /// Every bucket in Redis is kept, by the one rule every limiter follows
    /// ([`Quota`]'s "Changing a quota"): the script reads each stored TAT
    /// under whatever quota the call brings, so the gateways of a fleet
    /// agree whenever each makes the change. An error, changing nothing,
    /// when the script cannot hold the quota in microseconds, or when the
    /// limiter leases more tokens than the new burst.
    ///
    /// ```no_run
    /// # async fn run(limiter: turnstile_rl::redis::RedisLimiter) -> Result<(), Box<dyn std::error::Error>> {
    /// limiter.set_quota("50/min".parse()?)?;
    /// assert_eq!(limiter.quota(), "50/min".parse()?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_quota(&self, quota: Quota) -> Result<(), RedisBuildError> {
        let script = GcraScript::new(&quota)?;
        if let Some(k) = self.leases.as_ref().map(Leases::size) {
            if k > script.burst() {
                return Err(RedisBuildError::Config(format!(
                    "a lease of {k} tokens is above the new burst ({}): build a limiter \
                     with a smaller lease for this quota",
                    script.burst()
                )));
            }
        }
        let interval = script.interval_nanos();
        self.current.set(Current {
            quota,
            script,
            interval,
        });
        Ok(())
    }

    /// A number that moves whenever the quota changes (0 until the first
    /// [`set_quota`](RedisLimiter::set_quota)): what the HTTP layer
    /// compares to know its `RateLimit-Policy` is current.
    pub fn quota_version(&self) -> u64 {
        self.current().version
    }

    /// The emission interval the script runs now: the quota's, rounded up
    /// to whole microseconds.
    pub fn emission_interval(&self) -> Duration {
        self.script().interval()
    }

    /// The quota now and what the script runs for it.
    fn current(&self) -> Arc<Versioned<Current>> {
        self.current.get()
    }

    /// The script parameters of the quota now (`current().script`).
    fn script(&self) -> ScriptOf {
        ScriptOf(self.current())
    }

    /// The circuit breaker's state now.
    pub fn breaker_state(&self) -> BreakerState {
        self.path.breaker_state()
    }

    /// The failure policy.
    pub fn failure_policy(&self) -> &FailurePolicy {
        self.path.policy()
    }

    /// Counters and latency percentiles since the limiter was built (its
    /// [`RedisMulti`]s' calls and checks included: they share its path).
    pub fn metrics(&self) -> MetricsSnapshot {
        self.path.metrics().snapshot()
    }

    /// The last failed Redis call's error (a timeout, a refused
    /// connection, a server error), if any: for logs and operators.
    pub fn last_error(&self) -> Option<RedisCallError> {
        self.path.metrics().last_error()
    }

    /// Sends a pipeline of the caller's own commands through this
    /// limiter's connection, timeout and circuit breaker, counted in its
    /// metrics: for a service that keeps counters of its own beside its
    /// limits (turnstile-rls counts envoyproxy/ratelimit's fixed windows
    /// with `INCRBY` and `EXPIRE`), so that one outage opens one breaker
    /// for both, and an open breaker refuses this call at once
    /// ([`RedisCallError::BreakerOpen`]) as it refuses checks. What a
    /// failure means is the caller's to decide: no failure policy applies.
    /// On a Cluster, the pipeline's keys must share a hash slot.
    ///
    /// ```no_run
    /// # async fn run(limiter: turnstile_rl::redis::RedisLimiter) -> Result<(), turnstile_rl::redis::RedisCallError> {
    /// let mut pipe = redis::pipe();
    /// pipe.incr("hits:2026-12-04", 1).expire("hits:2026-12-04", 86_400).ignore();
    /// let (hits,): (u64,) = limiter.query(&pipe).await?;
    /// # let _ = hits;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn query<T: redis::FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
    ) -> Result<T, RedisCallError> {
        self.query_each(std::slice::from_ref(pipe))
            .await?
            .pop()
            .ok_or_else(|| RedisCallError::BadReply("no reply to the pipeline".into()))
    }

    /// Sends several pipelines at once as [`query`](Self::query) sends
    /// one, their replies in order: the breaker is asked once and hears one
    /// failure if any pipeline failed (the answer is then the first
    /// failure), as for a batch of checks. For commands spanning a
    /// Cluster's slots: one pipeline per slot ([`slot`]), one round trip of
    /// waiting.
    ///
    /// ```no_run
    /// # async fn run(limiter: turnstile_rl::redis::RedisLimiter) -> Result<(), turnstile_rl::redis::RedisCallError> {
    /// let (mut a, mut b) = (redis::pipe(), redis::pipe());
    /// a.incr("hits:a", 1);
    /// b.incr("hits:b", 1);
    /// let replies: Vec<(u64,)> = limiter.query_each(&[a, b]).await?;
    /// # let _ = replies;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn query_each<T: redis::FromRedisValue>(
        &self,
        pipes: &[redis::Pipeline],
    ) -> Result<Vec<T>, RedisCallError> {
        self.path.run_pipelines(pipes).await
    }

    /// Whether this limiter talks to a Redis Cluster (built with
    /// [`RedisLimiterBuilder::cluster`]): a [`query`](Self::query)'s keys
    /// must then share a hash slot ([`slot`]).
    pub fn is_cluster(&self) -> bool {
        self.path.is_cluster()
    }
}

/// The leases that `lease` (size `k`, time to live) asks for on `script`'s
/// quota, or why it cannot have them.
fn leases(
    lease: Option<(u64, Option<Duration>)>,
    script: &GcraScript,
) -> Result<Option<Leases>, RedisBuildError> {
    let Some((k, ttl)) = lease else {
        return Ok(None);
    };
    if k < 2 || k > script.burst() {
        return Err(RedisBuildError::Config(format!(
            "a lease of {}: it must be 2 to the burst ({})",
            crate::error::plural(k, "token"),
            script.burst()
        )));
    }
    let k32 = u32::try_from(k).unwrap_or(u32::MAX);
    let ttl = ttl.unwrap_or_else(|| {
        script
            .interval()
            .saturating_mul(k32)
            .max(MIN_DEFAULT_LEASE_TTL)
    });
    Ok(Some(Leases::new(k, ttl)))
}

/// Whether a request may ask Redis for a lease.
#[derive(Clone, Copy, Debug)]
enum Want {
    /// Exactly the cost (batches: a batch takes no new leases).
    Cost,
    /// The lease size when leasing is on (single checks).
    Lease,
}

/// An error for a key no check may use: empty, or over [`MAX_KEY_BYTES`].
fn check_key(key: &[u8]) -> Result<(), RedisLimitError> {
    if key.is_empty() {
        return Err(RedisLimitError::EmptyKey);
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(RedisLimitError::KeyTooLong {
            len: key.len(),
            max: MAX_KEY_BYTES,
        });
    }
    Ok(())
}

/// The Redis key of `key`: `prefix`, then the key as `hash_tag` asks.
fn redis_key(prefix: &[u8], hash_tag: &HashTag, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(prefix.len() + key.len() + 2);
    out.extend_from_slice(prefix);
    match hash_tag {
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
