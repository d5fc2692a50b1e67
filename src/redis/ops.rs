//! Peek, refund, reset, and several limits per key on Redis: one script
//! (`ops.lua`), one atomic call per operation, the same decisions as the
//! local limiters.
//!
//! Several limits are decided in **one** script call over one Redis key per
//! limit, all in one hash slot (the caller's key is the hash tag), so a
//! fleet stays atomic without charge-then-refund: the script reads every
//! limit, and charges all of them or none. The decisions are worked out in
//! Rust by each limit's pure [`Gcra`](crate::Gcra) on the TATs the script
//! read, and a reply that disagrees with them is a bad reply.
//!
//! Every call here takes the limiter's one call path (timeout, breaker,
//! failure policy, metrics: see the `redis` module docs), as a check does.

use std::sync::Arc;

use redis::{Script, ScriptInvocation};

use super::call::CallPath;
use super::changing::Changing;
use super::error::{RedisBuildError, RedisCallError, RedisLimitError};
use super::script::GcraScript;
use super::{
    check_key, redis_key, BreakerState, FailurePolicy, HashTag, MetricsSnapshot, RedisLimiter,
};
use crate::algorithms::Algorithm;
use crate::decision::Decision;
use crate::error::{CostError, QuotasError};
use crate::multi::{peek_all, MultiDecision};
use crate::quotas::Quotas;

const NANOS_PER_MICRO: u64 = 1_000;

/// What the script does.
#[derive(Clone, Copy, Debug)]
enum Op {
    Check,
    Peek,
    Refund,
    Reset,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Check => "check",
            Op::Peek => "peek",
            Op::Refund => "refund",
            Op::Reset => "reset",
        }
    }
}

/// A decoded reply: the flag, and each limit's decision for cost `n`.
struct Outcome {
    flag: i64,
    decisions: Vec<Decision>,
}

impl RedisLimiter {
    /// The decision a [`check`](RedisLimiter::check) of `key` would get now,
    /// taking nothing (one script call that writes nothing).
    ///
    /// ```no_run
    /// # async fn run(limiter: turnstile_rl::redis::RedisLimiter) -> Result<(), Box<dyn std::error::Error>> {
    /// let left = limiter.peek("alice").await?.remaining();
    /// println!("{left} login attempts left");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn peek(&self, key: impl AsRef<[u8]>) -> Result<Decision, RedisLimitError> {
        self.peek_n(key, 1).await
    }

    /// [`peek`](RedisLimiter::peek) for a request of cost `n`.
    ///
    /// ```no_run
    /// # async fn run(limiter: turnstile_rl::redis::RedisLimiter) -> Result<(), Box<dyn std::error::Error>> {
    /// if limiter.peek_n("alice", 10).await?.is_denied() {
    ///     // do not start the expensive batch
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn peek_n(&self, key: impl AsRef<[u8]>, n: u64) -> Result<Decision, RedisLimitError> {
        let script = self.script();
        script.gcra().check_cost(n)?;
        let keys = [self.checked_key(key.as_ref())?];
        let outcome = self
            .run(Op::Peek, &keys, std::slice::from_ref(&*script), n)
            .await?;
        Ok(outcome.decisions[0])
    }

    /// Gives `n` tokens of `key` back: `TAT := max(TAT - n*T, now)` in one
    /// script call, exact and never fuller than full, a no-op when the
    /// bucket has refilled by itself. Returns whether anything was given
    /// back.
    ///
    /// ```no_run
    /// # async fn run(limiter: turnstile_rl::redis::RedisLimiter) -> Result<(), Box<dyn std::error::Error>> {
    /// if limiter.check("alice").await?.is_allowed() {
    ///     // ... the upstream failed: the request was not served
    ///     limiter.refund("alice", 1).await?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn refund(&self, key: impl AsRef<[u8]>, n: u64) -> Result<bool, RedisLimitError> {
        let script = self.script();
        script.gcra().check_cost(n).map_err(CostError::for_refund)?;
        let keys = [self.checked_key(key.as_ref())?];
        let outcome = self
            .run(Op::Refund, &keys, std::slice::from_ref(&*script), n)
            .await?;
        Ok(outcome.flag == 1)
    }

    /// Forgets `key`: its bucket is full again (one `DEL`, in the script).
    /// Returns whether it existed.
    ///
    /// ```no_run
    /// # async fn run(limiter: turnstile_rl::redis::RedisLimiter) -> Result<(), Box<dyn std::error::Error>> {
    /// // A successful login clears the failure counter.
    /// limiter.reset("alice").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn reset(&self, key: impl AsRef<[u8]>) -> Result<bool, RedisLimitError> {
        let keys = [self.checked_key(key.as_ref())?];
        let outcome = self
            .run(Op::Reset, &keys, std::slice::from_ref(&*self.script()), 1)
            .await?;
        Ok(outcome.flag > 0)
    }

    /// Several limits per key on this limiter's connection, prefix, time
    /// source, circuit breaker, failure policy and metrics (shared, so one
    /// outage opens one breaker for both): each check decided in one script
    /// call, all or nothing. The [`RedisMulti`] owns what it needs (a
    /// reference count on the limiter's call path), so it can outlive the
    /// limiter and go behind the HTTP layer in an `Arc`. An error if a
    /// quota cannot be held by the script in microseconds.
    ///
    /// ```no_run
    /// # async fn run(limiter: turnstile_rl::redis::RedisLimiter) -> Result<(), Box<dyn std::error::Error>> {
    /// let multi = limiter.multi("10/s burst 20; 1000/h".parse()?)?;
    /// let d = multi.check("alice").await?;
    /// if d.is_denied() {
    ///     println!("limit {} binds, retry in {:?}", d.binding(), d.decision().retry_after());
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn multi(&self, quotas: Quotas) -> Result<RedisMulti, RedisBuildError> {
        Ok(RedisMulti {
            path: Arc::clone(&self.path),
            prefix: self.prefix.clone(),
            hash_tag: self.hash_tag.clone(),
            limits: Changing::new(Limits::new(quotas)?),
        })
    }

    fn checked_key(&self, key: &[u8]) -> Result<Vec<u8>, RedisLimitError> {
        check_key(key)?;
        Ok(self.redis_key(key))
    }

    async fn run(
        &self,
        op: Op,
        keys: &[Vec<u8>],
        scripts: &[GcraScript],
        n: u64,
    ) -> Result<Outcome, RedisLimitError> {
        let now = self.path.client_now()?;
        Ok(run_ops(&self.path, op, keys, scripts, n, now).await?)
    }
}

/// The script, hashed once.
fn ops_script() -> &'static Script {
    static SCRIPT: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    SCRIPT.get_or_init(|| Script::new(include_str!("ops.lua")))
}

/// One `ops.lua` call for `keys` (one per limit, in one slot) through the
/// one call path; `now` is the client clock's reading, if any.
async fn run_ops(
    path: &CallPath,
    op: Op,
    keys: &[Vec<u8>],
    scripts: &[GcraScript],
    n: u64,
    now: Option<u64>,
) -> Result<Outcome, RedisCallError> {
    path.run_one(&invocation(op, keys, scripts, n, now), |reply| {
        decode(reply, op, scripts, n)
    })
    .await
}

/// The `ops.lua` call: keys, then the op, the cost, the clock and each
/// limit's `(T, tau)`, as the script's header lists them.
fn invocation(
    op: Op,
    keys: &[Vec<u8>],
    scripts: &[GcraScript],
    n: u64,
    now: Option<u64>,
) -> ScriptInvocation<'static> {
    let mut call = ops_script().prepare_invoke();
    for key in keys {
        call.key(key.as_slice());
    }
    call.arg(op.name()).arg(n);
    match now {
        Some(now) => call.arg(now),
        None => call.arg(""),
    };
    for s in scripts {
        let (t, tau) = s.micros();
        call.arg(t).arg(tau);
    }
    call
}

/// Checks a reply against each limit's pure GCRA.
fn decode(
    reply: &[i64],
    op: Op,
    scripts: &[GcraScript],
    n: u64,
) -> Result<Outcome, RedisCallError> {
    let bad = |why: &str| RedisCallError::BadReply(format!("{why}: {reply:?}"));
    if reply.len() != scripts.len() + 2 {
        return Err(bad("expected {flag, now, tat...}"));
    }
    let value = |v: i64| {
        u64::try_from(v)
            .ok()
            .filter(|&v| v < 1 << 53)
            .ok_or_else(|| bad("a value outside 0..2^53"))
    };
    let now = value(reply[1])? * NANOS_PER_MICRO;
    let decisions = scripts
        .iter()
        .zip(&reply[2..])
        .map(|(s, &tat)| {
            Ok(s.gcra()
                .decide(value(tat)? * NANOS_PER_MICRO, now, n)
                .decision)
        })
        .collect::<Result<Vec<Decision>, RedisCallError>>()?;
    let flag = reply[0];
    if matches!(op, Op::Check | Op::Peek)
        && (flag == 1) != decisions.iter().all(Decision::is_allowed)
    {
        return Err(bad("the script and the pure GCRA disagree"));
    }
    Ok(Outcome { flag, decisions })
}

/// Several limits per key on Redis, from [`RedisMulti::builder`] (its
/// quotas and the settings of a [`RedisLimiter`]'s builder) or from
/// [`RedisLimiter::multi`]: each check is one script call that charges
/// every limit or none.
///
/// Made by [`RedisLimiter::multi`], it shares that limiter's call path:
/// the same connection, timeout, circuit breaker, failure policy and
/// [metrics](RedisLimiter::metrics).
/// A check Redis did not decide (an error, a timeout, the breaker open)
/// gets the failure policy's decision, [marked as
/// such](crate::Decision::is_fallback) and speaking for limit 0: open
/// allows, closed denies until the breaker next tries Redis, and
/// `FailurePolicy::Local` decides with its local limiter (its one quota,
/// and the same local bucket for a key as the single limiter's checks).
///
/// Behind the HTTP layer, in an `Arc` (features `tower` and `redis`):
///
/// ```no_run
/// # async fn run(limiter: turnstile_rl::redis::RedisLimiter) -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use turnstile_rl::http::RateLimitLayer;
///
/// let multi = limiter.multi("10/s burst 20; 1000/h".parse()?)?;
/// let layer = RateLimitLayer::builder(Arc::new(multi)).name("api").build()?;
/// # let _ = layer;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct RedisMulti {
    path: Arc<CallPath>,
    prefix: Vec<u8>,
    hash_tag: HashTag,
    /// The quotas and their scripts, replaced whole by `set_quotas`: a
    /// call takes one snapshot and runs wholly on it.
    limits: Changing<Limits>,
}

/// A [`RedisMulti`]'s quotas and what the script runs for each, in order.
#[derive(Debug)]
struct Limits {
    /// As given.
    quotas: Quotas,
    scripts: Vec<GcraScript>,
}

impl Limits {
    /// The scripts for `quotas`, or why one cannot be held.
    fn new(quotas: Quotas) -> Result<Self, RedisBuildError> {
        let scripts = quotas
            .as_slice()
            .iter()
            .map(GcraScript::new)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Limits { quotas, scripts })
    }

    /// An error for a cost some limit can never admit, naming the
    /// smallest burst.
    fn check_cost(&self, n: u64) -> Result<(), RedisLimitError> {
        Ok(CostError::check(n, self.quotas.min_burst())?)
    }
}

impl RedisMulti {
    /// Decides one request of cost 1 for `key` against every limit.
    pub async fn check(&self, key: impl AsRef<[u8]>) -> Result<MultiDecision, RedisLimitError> {
        self.check_n(key, 1).await
    }

    /// Decides one request of cost `n`: every limit admits all `n` tokens
    /// and all are charged, or none is. An error (and no call) for a bad
    /// key or cost; otherwise always a decision, from Redis or the failure
    /// policy.
    ///
    /// ```no_run
    /// # async fn run(limiter: turnstile_rl::redis::RedisLimiter) -> Result<(), Box<dyn std::error::Error>> {
    /// let multi = limiter.multi("100/min; 2000/day".parse()?)?;
    /// let d = multi.check_n("alice", 5).await?;
    /// println!("{} left under limit {}", d.decision().remaining(), d.binding());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn check_n(
        &self,
        key: impl AsRef<[u8]>,
        n: u64,
    ) -> Result<MultiDecision, RedisLimitError> {
        let key = key.as_ref();
        let limits = self.limits.get();
        let (keys, now) = self.prepare(&limits, key, n)?;
        let decision = match run_ops(&self.path, Op::Check, &keys, &limits.scripts, n, now).await {
            Ok(outcome) => Self::binding(&outcome),
            Err(_) => {
                let first = &limits.scripts[0];
                self.path
                    .fallback((key, n, false), first.burst(), first.interval_nanos())
                    .into()
            }
        };
        self.path.decided(&decision.decision());
        Ok(decision)
    }

    /// The decision a check of cost `n` would get now, taking nothing.
    /// [`RedisLimitError::Unavailable`] if Redis did not answer.
    ///
    /// ```no_run
    /// # async fn run(limiter: turnstile_rl::redis::RedisLimiter) -> Result<(), Box<dyn std::error::Error>> {
    /// let multi = limiter.multi("5/15min; 20/day".parse()?)?;
    /// let left = multi.peek_n("alice", 1).await?.decision().remaining();
    /// println!("{left} attempts left");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn peek_n(
        &self,
        key: impl AsRef<[u8]>,
        n: u64,
    ) -> Result<MultiDecision, RedisLimitError> {
        let outcome = self.operate(Op::Peek, key.as_ref(), n).await?;
        Ok(Self::binding(&outcome))
    }

    /// Gives `n` tokens of `key` back to every limit. Returns whether any
    /// took some back; [`RedisLimitError::Unavailable`] if Redis did not
    /// answer.
    pub async fn refund(&self, key: impl AsRef<[u8]>, n: u64) -> Result<bool, RedisLimitError> {
        let refunded = self.operate(Op::Refund, key.as_ref(), n).await;
        Ok(refunded.map_err(RedisLimitError::for_refund)?.flag == 1)
    }

    /// Forgets `key` in every limit. Returns whether any bucket existed;
    /// [`RedisLimitError::Unavailable`] if Redis did not answer.
    pub async fn reset(&self, key: impl AsRef<[u8]>) -> Result<bool, RedisLimitError> {
        Ok(self.operate(Op::Reset, key.as_ref(), 1).await?.flag > 0)
    }

    /// The quotas enforced now, in order, as given (to
    /// [`RedisLimiter::multi`] or to [`set_quotas`](RedisMulti::set_quotas)).
    pub fn quotas(&self) -> Quotas {
        self.limits.get().quotas.clone()
    }

    /// Changes every limit's quota while the multi-limit serves, through
    /// `&self` (in an `Arc` behind the HTTP layer, say): calls that begin
    /// after this returns send the new quotas to the script, each call
    /// wholly at the old quotas or wholly at the new ones. Every bucket in
    /// Redis is kept, by the one rule every limiter follows ([`Quota`]'s
    /// "Changing a quota while serving"): limit `i`'s bucket is keyed by
    /// its position alone ([`redis_keys`](RedisMulti::redis_keys)), and the
    /// script reads its stored TAT under whatever quota the call brings.
    ///
    /// An error, changing nothing, when `quotas` has another number of
    /// limits than this multi-limit ([`RedisBuildError::Quotas`] holding
    /// [`QuotasError::CountChanged`]), or when the script cannot hold one
    /// of them in microseconds ([`RedisBuildError::Unrepresentable`]).
    ///
    /// [`Quota`]: crate::Quota
    ///
    /// ```no_run
    /// # async fn run(limiter: turnstile_rl::redis::RedisLimiter) -> Result<(), Box<dyn std::error::Error>> {
    /// use turnstile_rl::redis::RedisBuildError;
    /// use turnstile_rl::QuotasError;
    ///
    /// let multi = limiter.multi("10/s burst 20; 1000/h".parse()?)?;
    /// multi.set_quotas("10/s burst 40; 1000/h".parse()?)?; // one quota per limit, in order
    /// assert_eq!(multi.quotas(), "10/s burst 40; 1000/h".parse()?);
    /// assert!(matches!(
    ///     multi.set_quotas("10/s".parse()?),
    ///     Err(RedisBuildError::Quotas(QuotasError::CountChanged { limits: 2, given: 1 }))
    /// ));
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_quotas(&self, quotas: Quotas) -> Result<(), RedisBuildError> {
        let limits = self.limits.get().scripts.len();
        if quotas.len() != limits {
            return Err(QuotasError::CountChanged {
                limits,
                given: quotas.len(),
            }
            .into());
        }
        self.limits.set(Limits::new(quotas)?);
        Ok(())
    }

    /// A number that moves whenever the quotas change (0 until the first
    /// [`set_quotas`](RedisMulti::set_quotas)): what the HTTP layer
    /// compares to know its `RateLimit-Policy` is current.
    pub fn quota_version(&self) -> u64 {
        self.limits.get().version
    }

    /// The circuit breaker's state now (shared with the limiter it was
    /// made from, if any).
    pub fn breaker_state(&self) -> BreakerState {
        self.path.breaker_state()
    }

    /// The failure policy.
    pub fn failure_policy(&self) -> &FailurePolicy {
        self.path.policy()
    }

    /// Counters and latency percentiles of the call path: this multi's
    /// calls, and those of the limiter it was made from, if any.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.path.metrics().snapshot()
    }

    /// The last failed Redis call's error, as
    /// [`RedisLimiter::last_error`].
    pub fn last_error(&self) -> Option<RedisCallError> {
        self.path.metrics().last_error()
    }

    /// The Redis keys of `key`'s limits: the limiter's key, hash-tagged on
    /// the caller's key (so all share one slot) unless the limiter already
    /// tags, then `:{i}`, the limit's position in the list. The position
    /// alone, not the quota, so a bucket outlives a change of its quota
    /// ([`set_quotas`](RedisMulti::set_quotas)) as every limiter's does;
    /// two multi-limits with different lists need different prefixes, as
    /// two limiters with different quotas do.
    pub fn redis_keys(&self, key: &[u8]) -> Vec<Vec<u8>> {
        self.keys(key, self.limits.get().scripts.len())
    }

    /// The Redis keys of `key`'s `limits` limits.
    fn keys(&self, key: &[u8], limits: usize) -> Vec<Vec<u8>> {
        let tag = match &self.hash_tag {
            HashTag::None => &HashTag::Key,
            tagged => tagged,
        };
        let base = redis_key(&self.prefix, tag, key);
        (0..limits)
            .map(|i| {
                let mut k = base.clone();
                k.extend_from_slice(format!(":{i}").as_bytes());
                k
            })
            .collect()
    }

    /// A peek, refund or reset: Redis's answer, or why there is none.
    async fn operate(&self, op: Op, key: &[u8], n: u64) -> Result<Outcome, RedisLimitError> {
        let limits = self.limits.get();
        let (keys, now) = self.prepare(&limits, key, n)?;
        Ok(run_ops(&self.path, op, &keys, &limits.scripts, n, now).await?)
    }

    /// Checks the key and the cost (against `limits`, the call's quotas),
    /// and reads the client clock: everything that can refuse a call
    /// before it is sent.
    fn prepare(
        &self,
        limits: &Limits,
        key: &[u8],
        n: u64,
    ) -> Result<(Vec<Vec<u8>>, Option<u64>), RedisLimitError> {
        limits.check_cost(n)?;
        check_key(key)?;
        Ok((
            self.keys(key, limits.scripts.len()),
            self.path.client_now()?,
        ))
    }

    /// The binding limit of a check's or peek's decisions.
    fn binding(outcome: &Outcome) -> MultiDecision {
        peek_all(outcome.decisions.len(), |i| outcome.decisions[i])
    }
}
