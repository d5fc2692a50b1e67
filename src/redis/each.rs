//! Requests on several limiters in one script call: a server whose one
//! request meets several limits, each with its own quota and key (a rate
//! limit service deciding every descriptor of a request), pays one round
//! trip for all of them, through one connection and one breaker.
//!
//! The limiters share a call path: [`RedisLimiter::with_quota`] makes one
//! with its own quota, prefix and leases on another's connection, timeout,
//! breaker, failure policy, time source and metrics. Then
//! [`RedisLimiter::check_each`] decides requests on any of them in one
//! `gcra.lua` call whose requests each bring their own `T` and tau.
//!
//! Each request is decided on its own, as if checked alone in slice order
//! (not all or nothing: that is [`RedisMulti`](super::RedisMulti), several
//! limits on one key at one cost).

use std::sync::Arc;
use std::time::Instant;

use redis::ScriptInvocation;

use super::changing::{Changing, Versioned};
use super::lease::{FetchGuard, Leases};
use super::script::{decode, invocation, GcraScript};
use super::{check_key, leases, Current, RedisBuildError, RedisLimitError, RedisLimiter, Want};
use crate::algorithms::Algorithm;
use crate::decision::Decision;
use crate::error::BatchError;
use crate::quota::Quota;

/// One request of [`RedisLimiter::check_each`].
#[derive(Clone, Copy, Debug)]
pub struct EachRequest<'a> {
    /// The limit: a limiter on the call path of the one that decides
    /// ([`RedisLimiter::with_quota`]).
    pub limiter: &'a RedisLimiter,
    /// The caller's key within that limit.
    pub key: &'a [u8],
    /// Tokens to take: 1 to the limiter's burst.
    pub cost: u64,
    /// Take nothing: the decision a check of `cost` would get now, as
    /// [`RedisLimiter::peek_n`] (leases are neither spent nor taken).
    pub peek: bool,
}

impl RedisLimiter {
    /// A limiter for `quota` on this limiter's Redis: the same connection,
    /// timeout, circuit breaker, failure policy, time source and metrics
    /// (one outage opens one breaker for both), with its own key `prefix`
    /// and, if `lease` is `Some(k)`, its own leases of `k` tokens (as
    /// [`RedisLimiterBuilder::lease`], with its bound and default time to
    /// live). Requests on both can then be decided in one script call
    /// ([`check_each`](RedisLimiter::check_each)).
    ///
    /// An error if the script cannot hold `quota` in microseconds, or the
    /// lease is not 2 to the burst.
    ///
    /// ```no_run
    /// # async fn run(base: turnstile_rl::redis::RedisLimiter) -> Result<(), Box<dyn std::error::Error>> {
    /// let per_user = base.with_quota("100/min".parse()?, "user:", Some(10))?;
    /// let per_ip = base.with_quota("20/s".parse()?, "ip:", None)?;
    /// # let _ = (per_user, per_ip);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// [`RedisLimiterBuilder::lease`]: super::RedisLimiterBuilder::lease
    pub fn with_quota(
        &self,
        quota: Quota,
        prefix: impl AsRef<[u8]>,
        lease: Option<u64>,
    ) -> Result<RedisLimiter, RedisBuildError> {
        let script = GcraScript::new(&quota)?;
        let leases = leases(lease.map(|k| (k, None)), &script)?;
        let interval = script.interval_nanos();
        Ok(RedisLimiter {
            current: Changing::new(Current {
                quota,
                script,
                interval,
            }),
            path: Arc::clone(&self.path),
            prefix: prefix.as_ref().to_vec(),
            hash_tag: self.hash_tag.clone(),
            leases,
        })
    }

    /// Decides `requests`, each on its own limiter, into `out` (cleared
    /// first, then one decision per request, in order) in **one** Redis
    /// round trip: the decisions of calling
    /// [`check_n`](RedisLimiter::check_n) (or [`peek_n`](RedisLimiter::peek_n)
    /// for a peek) on each in slice order, at one reading of the clock.
    /// Leased tokens are spent first, as a check spends them, and a check
    /// Redis answers may take a new lease; the rest go in one script call
    /// (one per hash slot on a Cluster, all in flight at once).
    ///
    /// Every limiter must share this one's call path
    /// ([`with_quota`](RedisLimiter::with_quota)): the call counts as one to
    /// the breaker, and if Redis does not answer every request gets the
    /// failure policy's decision (a peek one that takes nothing, under
    /// [`FailurePolicy::Local`](super::FailurePolicy::Local) a local peek).
    ///
    /// An error, with nothing decided or sent, for a limiter on another
    /// path ([`RedisLimitError::OtherConnection`]), a cost of 0 or above
    /// its limiter's burst ([`RedisLimitError::Batch`]) or a bad key
    /// ([`RedisLimitError::BatchKey`]), each naming the request.
    ///
    /// ```no_run
    /// # async fn run(base: turnstile_rl::redis::RedisLimiter) -> Result<(), Box<dyn std::error::Error>> {
    /// use turnstile_rl::redis::EachRequest;
    ///
    /// let per_user = base.with_quota("100/min".parse()?, "user:", None)?;
    /// let per_ip = base.with_quota("20/s".parse()?, "ip:", None)?;
    /// let mut decisions = Vec::new();
    /// base.check_each(
    ///     &[
    ///         EachRequest { limiter: &per_user, key: b"alice", cost: 1, peek: false },
    ///         EachRequest { limiter: &per_ip, key: b"192.0.2.7", cost: 1, peek: false },
    ///     ],
    ///     &mut decisions,
    /// )
    /// .await?;
    /// let allowed = decisions.iter().all(|d| d.is_allowed());
    /// # let _ = allowed;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn check_each(
        &self,
        requests: &[EachRequest<'_>],
        out: &mut Vec<Decision>,
    ) -> Result<(), RedisLimitError> {
        let currents = self.check_requests(requests)?;
        let now_micros = self.path.client_now()?;
        self.decide_each(requests, &currents, Want::Lease, now_micros, out)
            .await;
        Ok(())
    }

    /// Decides valid `requests` (each limiter's quota now in `currents`)
    /// in order into `out` (cleared first, then one decision per request):
    /// leased tokens first, then the rest through this limiter's call path
    /// (one script call, or one per hash slot on a Cluster, all in flight
    /// at once), then the failure policy for every request Redis did not
    /// decide. What every check, batch and `check_each` runs.
    pub(super) async fn decide_each(
        &self,
        requests: &[EachRequest<'_>],
        currents: &[Arc<Versioned<Current>>],
        want: Want,
        now_micros: Option<u64>,
        out: &mut Vec<Decision>,
    ) {
        out.clear();
        let spend = |r: &EachRequest<'_>, current: &Current| {
            let leases = r.limiter.leases.as_ref().filter(|_| !r.peek)?;
            let decision = leases.spend(
                r.key,
                r.cost,
                Instant::now(),
                current.script.burst(),
                current.interval,
            )?;
            self.path.metrics().lease_hit();
            Some(decision)
        };
        let mut decided: Vec<Option<Decision>> = requests
            .iter()
            .zip(currents)
            .map(|(r, current)| spend(r, current))
            .collect();
        // Checks whose key's next lease is on its way in another call wait
        // for it (holding no fetch of their own, so two calls never wait
        // for each other), then spend it.
        if matches!(want, Want::Lease) {
            for (i, (r, current)) in requests.iter().zip(currents).enumerate() {
                let Some(leases) = r.limiter.leases.as_ref().filter(|_| !r.peek) else {
                    continue;
                };
                if decided[i].is_some() {
                    continue;
                }
                if let Some(notify) = leases.in_flight(r.key) {
                    leases.wait(r.key, &notify, self.path.timeout()).await;
                    decided[i] = spend(r, current);
                }
            }
        }
        // The lease fetches this call makes: held until their replies are
        // kept, so checks of those keys elsewhere wait for them.
        let mut fetches: Vec<(&Leases, &[u8], FetchGuard<'_>)> = Vec::new();
        if matches!(want, Want::Lease) {
            for (r, decision) in requests.iter().zip(&decided) {
                let Some(leases) = r.limiter.leases.as_ref().filter(|_| !r.peek) else {
                    continue;
                };
                let ours = fetches
                    .iter()
                    .any(|(l, key, _)| std::ptr::eq(*l, leases) && *key == r.key);
                if decision.is_none() && !ours {
                    if let Some(guard) = leases.fetch(r.key) {
                        fetches.push((leases, r.key, guard));
                    }
                }
            }
        }
        let pending: Vec<usize> = (0..requests.len())
            .filter(|&i| decided[i].is_none())
            .collect();
        if !pending.is_empty() {
            let redis_keys: Vec<Vec<u8>> = pending
                .iter()
                .map(|&i| requests[i].limiter.redis_key(requests[i].key))
                .collect();
            let groups = self.groups(&redis_keys);
            let asked = |group: &[usize]| -> Vec<(&[u8], &GcraScript, u64, u64, bool)> {
                group
                    .iter()
                    .map(|&at| {
                        let i = pending[at];
                        let r = &requests[i];
                        let want = r.limiter.want(want, r.cost);
                        (
                            redis_keys[at].as_slice(),
                            &currents[i].script,
                            r.cost,
                            want,
                            r.peek,
                        )
                    })
                    .collect()
            };
            let calls: Vec<ScriptInvocation<'_>> = groups
                .iter()
                .map(|group| invocation(&asked(group), now_micros))
                .collect();
            let decode_call = |call: usize, reply: &[i64]| {
                let expected: Vec<(&GcraScript, u64, bool)> = asked(&groups[call])
                    .into_iter()
                    .map(|(_, script, n, _, look)| (script, n, look))
                    .collect();
                decode(reply, &expected)
            };
            // An open breaker sends nothing: every pending request falls
            // back; otherwise each call's requests get its replies or fall
            // back with it.
            if let Ok(results) = self.path.run(&calls, decode_call).await {
                for (group, result) in groups.iter().zip(results) {
                    for (&at, reply) in group.iter().zip(result.into_iter().flatten()) {
                        let i = pending[at];
                        let r = &requests[i];
                        decided[i] = Some(if r.peek {
                            reply.decision
                        } else {
                            r.limiter.settle(r.key, r.cost, reply)
                        });
                    }
                }
            }
        }
        out.extend(
            requests
                .iter()
                .zip(decided)
                .zip(currents)
                .map(|((r, decision), current)| {
                    let decision = decision.unwrap_or_else(|| {
                        let (burst, interval) = (current.script.burst(), current.interval);
                        self.path.fallback((r.key, r.cost, r.peek), burst, interval)
                    });
                    // A look decides nothing: only checks are counted.
                    if !r.peek {
                        self.path.decided(&decision);
                    }
                    decision
                }),
        );
    }

    /// Every request's limiter on this path, cost and key checked: each
    /// limiter's quota now, for the whole call.
    fn check_requests(
        &self,
        requests: &[EachRequest<'_>],
    ) -> Result<Vec<Arc<Versioned<Current>>>, RedisLimitError> {
        requests
            .iter()
            .enumerate()
            .map(|(index, r)| {
                if !Arc::ptr_eq(&r.limiter.path, &self.path) {
                    return Err(RedisLimitError::OtherConnection { index });
                }
                let current = r.limiter.current();
                current
                    .script
                    .gcra()
                    .check_cost(r.cost)
                    .map_err(|source| BatchError::Cost { index, source })?;
                check_key(r.key).map_err(|source| RedisLimitError::BatchKey {
                    index,
                    source: Box::new(source),
                })?;
                Ok(current)
            })
            .collect()
    }
}
