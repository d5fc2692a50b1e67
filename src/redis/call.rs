//! The one path every Redis call takes: a check, a batch, a peek, a
//! refund, a reset, on one limit or several. It holds what a call needs
//! around the script (the connection, the timeout, the circuit breaker, the
//! failure policy, the time source and the metrics), so no call can skip
//! one of them. A [`RedisLimiter`](super::RedisLimiter) and each
//! [`RedisMulti`](super::RedisMulti) made from it share one `CallPath` in
//! an `Arc`: one Redis, one breaker, one set of counters.
//!
//! [`CallPath::run`] sends the calls; what a failed call turns into (the
//! failure policy's decision, or an error for an operation) is said once,
//! in the `redis` module docs.

use std::num::NonZeroU64;
use std::time::{Duration, Instant};

use redis::ScriptInvocation;

use super::breaker::{Admission, Breaker, BreakerState};
use super::connection::Connection;
use super::error::{RedisCallError, RedisLimitError};
use super::metrics::Metrics;
use super::policy::FailurePolicy;
use super::script::MAX_NOW_MICROS;
use super::TimeSource;
use crate::decision::Decision;

/// What stands around every script call of one limiter and its multis.
#[derive(Debug)]
pub(crate) struct CallPath {
    connection: Connection,
    timeout: Duration,
    breaker: Breaker,
    policy: FailurePolicy,
    time: TimeSource,
    metrics: Metrics,
}

impl CallPath {
    pub(crate) fn new(
        connection: Connection,
        timeout: Duration,
        breaker: Breaker,
        policy: FailurePolicy,
        time: TimeSource,
    ) -> Self {
        CallPath {
            connection,
            timeout,
            breaker,
            policy,
            time,
            metrics: Metrics::new(),
        }
    }

    /// Sends `calls` (script invocations; on a Cluster each one's keys in
    /// one slot) and reads each reply with `decode(index, reply)`.
    ///
    /// The breaker is asked once for all of them: open, nothing is sent and
    /// the answer is [`RedisCallError::BreakerOpen`] at once (counted in
    /// [`MetricsSnapshot::breaker_rejections`](super::MetricsSnapshot::breaker_rejections)). Otherwise they are all in
    /// flight together under one deadline (the timeout), each counted and
    /// timed; each failure is counted and kept as the last error, and the
    /// breaker hears one failure if any call failed, else one success.
    pub(crate) async fn run<T>(
        &self,
        calls: &[ScriptInvocation<'_>],
        decode: impl Fn(usize, &[i64]) -> Result<T, RedisCallError> + Sync,
    ) -> Result<Vec<Result<T, RedisCallError>>, RedisCallError> {
        self.admit()?;
        let deadline = tokio::time::Instant::now() + self.timeout;
        let decode = &decode;
        let sent = calls.iter().enumerate().map(|(index, call)| async move {
            let reply = self.timed(deadline, self.connection.invoke(call)).await?;
            decode(index, &reply)
        });
        let results = futures_util::future::join_all(sent).await;
        self.settle(results.iter().filter_map(|r| r.as_ref().err()));
        Ok(results)
    }

    /// Sends pipelines of the caller's own commands (on a Cluster each
    /// one's keys in one slot) as [`run`](Self::run) sends script calls:
    /// the breaker asked once, all in flight under one deadline, each
    /// counted and timed, and the breaker told one failure if any failed
    /// (then the answer is the first failure), else one success.
    pub(crate) async fn run_pipelines<T: redis::FromRedisValue>(
        &self,
        pipes: &[redis::Pipeline],
    ) -> Result<Vec<T>, RedisCallError> {
        self.admit()?;
        let deadline = tokio::time::Instant::now() + self.timeout;
        let sent = pipes
            .iter()
            .map(|pipe| self.timed(deadline, self.connection.query(pipe)));
        let results: Vec<Result<T, RedisCallError>> = futures_util::future::join_all(sent).await;
        self.settle(results.iter().filter_map(|r| r.as_ref().err()));
        results.into_iter().collect()
    }

    /// One call of a send: counted, ended at `deadline`, and its latency
    /// recorded when it succeeds.
    async fn timed<R>(
        &self,
        deadline: tokio::time::Instant,
        call: impl std::future::Future<Output = redis::RedisResult<R>>,
    ) -> Result<R, RedisCallError> {
        self.metrics.call();
        let started = Instant::now();
        let reply = tokio::time::timeout_at(deadline, call)
            .await
            .map_err(|_| RedisCallError::Timeout)?
            .map_err(RedisCallError::from_redis)?;
        self.metrics.latency(started.elapsed());
        Ok(reply)
    }

    /// Asks the breaker whether a call may be sent: open, the call is
    /// refused at once (counted in
    /// [`MetricsSnapshot::breaker_rejections`](super::MetricsSnapshot::breaker_rejections)).
    fn admit(&self) -> Result<(), RedisCallError> {
        let (admission, transition) = self.breaker.admit(Instant::now());
        self.metrics.transition(transition);
        if admission == Admission::Reject {
            self.metrics.breaker_rejection();
            return Err(RedisCallError::BreakerOpen {
                retry_in: self.breaker.retry_in(Instant::now()),
            });
        }
        Ok(())
    }

    /// Counts each of a send's `errors` and tells the breaker: one failure
    /// if there was any, else one success.
    fn settle<'e>(&self, errors: impl IntoIterator<Item = &'e RedisCallError>) {
        let mut failed = false;
        for error in errors {
            self.metrics.failure(error);
            failed = true;
        }
        let transition = if failed {
            self.breaker.on_failure(Instant::now())
        } else {
            self.breaker.on_success()
        };
        self.metrics.transition(transition);
    }

    /// [`run`](Self::run) for one call.
    pub(crate) async fn run_one<T>(
        &self,
        call: &ScriptInvocation<'_>,
        decode: impl Fn(&[i64]) -> Result<T, RedisCallError> + Sync,
    ) -> Result<T, RedisCallError> {
        self.run(std::slice::from_ref(call), |_, reply| decode(reply))
            .await?
            .into_iter()
            .next()
            .unwrap_or(Err(RedisCallError::BadReply("no reply to the call".into())))
    }

    /// The failure policy's decision for a check of `n` tokens of `key`
    /// (or, with `peek`, a look that takes nothing) that Redis did not
    /// decide, on a limit of burst `limit` and interval `interval`:
    /// counted, and marked [`Decision::is_fallback`].
    pub(crate) fn fallback(
        &self,
        request: (&[u8], u64, bool),
        limit: u64,
        interval: NonZeroU64,
    ) -> Decision {
        self.metrics.fallback();
        let retry_in = self.breaker.retry_in(Instant::now()).max(self.timeout);
        self.policy.decide(request, limit, interval, retry_in)
    }

    /// Counts a check's (or a batch key's) decision, however it was made.
    pub(crate) fn decided(&self, decision: &Decision) {
        self.metrics.decision(decision.is_allowed());
    }

    /// The client clock's reading in µs, or `None` for the server's TIME.
    pub(crate) fn client_now(&self) -> Result<Option<u64>, RedisLimitError> {
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

    /// The most one call may take.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether this is a Cluster: a call's keys must then share a slot.
    pub(crate) fn is_cluster(&self) -> bool {
        self.connection.is_cluster()
    }

    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub(crate) fn breaker_state(&self) -> BreakerState {
        self.breaker.state(Instant::now())
    }

    pub(crate) fn policy(&self) -> &FailurePolicy {
        &self.policy
    }
}
