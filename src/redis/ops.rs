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
//! These calls have a timeout but no failure policy and no circuit breaker:
//! a peek, refund or reset that Redis did not answer is reported
//! ([`RedisLimitError::Unavailable`]) for the caller to handle.

use redis::Script;

use super::error::{RedisBuildError, RedisCallError, RedisLimitError};
use super::script::GcraScript;
use super::{check_key, HashTag, RedisLimiter};
use crate::algorithms::Algorithm;
use crate::decision::Decision;
use crate::error::CostError;
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
        script.gcra().check_cost(n)?;
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

    /// Several limits per key on this limiter's connection, prefix and
    /// time source: each decided in one script call, all or nothing. An
    /// error if a quota cannot be held by the script in microseconds.
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
    pub fn multi(&self, quotas: Quotas) -> Result<RedisMulti<'_>, RedisBuildError> {
        let scripts = quotas
            .as_slice()
            .iter()
            .map(GcraScript::new)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(RedisMulti {
            limiter: self,
            quotas,
            scripts,
            script: ops_script().clone(),
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
        run_script(self, ops_script(), op, keys, scripts, n).await
    }
}

/// The script, hashed once.
fn ops_script() -> &'static Script {
    static SCRIPT: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    SCRIPT.get_or_init(|| Script::new(include_str!("ops.lua")))
}

async fn run_script(
    limiter: &RedisLimiter,
    script: &Script,
    op: Op,
    keys: &[Vec<u8>],
    scripts: &[GcraScript],
    n: u64,
) -> Result<Outcome, RedisLimitError> {
    let now = limiter.client_now()?;
    let mut call = script.prepare_invoke();
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
    let reply = tokio::time::timeout(limiter.timeout, limiter.connection.invoke(&call))
        .await
        .map_err(|_| RedisCallError::Timeout)
        .and_then(|r| r.map_err(RedisCallError::from_redis))
        .map_err(|e| RedisLimitError::Unavailable(e.to_string()))?;
    decode(&reply, op, scripts, n).map_err(|e| RedisLimitError::Unavailable(e.to_string()))
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

/// Several limits per key on Redis, from [`RedisLimiter::multi`]: each
/// check is one script call that charges every limit or none.
#[derive(Debug)]
pub struct RedisMulti<'l> {
    limiter: &'l RedisLimiter,
    quotas: Quotas,
    scripts: Vec<GcraScript>,
    script: Script,
}

impl RedisMulti<'_> {
    /// Decides one request of cost 1 for `key` against every limit.
    pub async fn check(&self, key: impl AsRef<[u8]>) -> Result<MultiDecision, RedisLimitError> {
        self.check_n(key, 1).await
    }

    /// Decides one request of cost `n`: every limit admits all `n` tokens
    /// and all are charged, or none is.
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
        self.decide(Op::Check, key.as_ref(), n).await
    }

    /// The decision a check of cost `n` would get now, taking nothing.
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
        self.decide(Op::Peek, key.as_ref(), n).await
    }

    /// Gives `n` tokens of `key` back to every limit. Returns whether any
    /// took some back.
    pub async fn refund(&self, key: impl AsRef<[u8]>, n: u64) -> Result<bool, RedisLimitError> {
        self.check_cost(n)?;
        let keys = self.keys(key.as_ref())?;
        let outcome = run_script(
            self.limiter,
            &self.script,
            Op::Refund,
            &keys,
            &self.scripts,
            n,
        )
        .await?;
        Ok(outcome.flag == 1)
    }

    /// Forgets `key` in every limit. Returns whether any bucket existed.
    pub async fn reset(&self, key: impl AsRef<[u8]>) -> Result<bool, RedisLimitError> {
        let keys = self.keys(key.as_ref())?;
        let outcome = run_script(
            self.limiter,
            &self.script,
            Op::Reset,
            &keys,
            &self.scripts,
            1,
        )
        .await?;
        Ok(outcome.flag > 0)
    }

    /// The quotas, in order.
    pub fn quotas(&self) -> &Quotas {
        &self.quotas
    }

    /// The Redis keys of `key`'s limits: the limiter's key, hash-tagged on
    /// the caller's key (so all share one slot) unless the limiter already
    /// tags, then the limit's position and parameters (so two lists never
    /// share a bucket by accident).
    pub fn redis_keys(&self, key: &[u8]) -> Vec<Vec<u8>> {
        let base = match &self.limiter.hash_tag {
            HashTag::None => {
                let mut base = self.limiter.prefix.clone();
                base.push(b'{');
                base.extend_from_slice(key);
                base.push(b'}');
                base
            }
            HashTag::Key | HashTag::Fixed(_) => self.limiter.redis_key(key),
        };
        self.scripts
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let (t, tau) = s.micros();
                let mut k = base.clone();
                k.extend_from_slice(format!(":{i}:{t}:{tau}").as_bytes());
                k
            })
            .collect()
    }

    fn keys(&self, key: &[u8]) -> Result<Vec<Vec<u8>>, RedisLimitError> {
        check_key(key)?;
        Ok(self.redis_keys(key))
    }

    fn check_cost(&self, n: u64) -> Result<(), RedisLimitError> {
        let min = self.quotas.min_burst();
        match n {
            0 => Err(CostError::Zero.into()),
            n if n > min => Err(CostError::ExceedsBurst {
                cost: n,
                burst: min,
            }
            .into()),
            _ => Ok(()),
        }
    }

    async fn decide(&self, op: Op, key: &[u8], n: u64) -> Result<MultiDecision, RedisLimitError> {
        self.check_cost(n)?;
        let keys = self.keys(key)?;
        let outcome = run_script(self.limiter, &self.script, op, &keys, &self.scripts, n).await?;
        Ok(peek_all(outcome.decisions.len(), |i| outcome.decisions[i]))
    }
}
