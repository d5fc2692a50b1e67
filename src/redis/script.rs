//! The GCRA of [`Gcra`] as one Lua script, in integer microseconds; the
//! reasoning is in the `redis` module docs ("The script").

use std::num::NonZeroU64;
use std::time::Duration;

use redis::{Script, ScriptInvocation};

use super::error::{RedisBuildError, RedisCallError};
use crate::algorithms::Algorithm;
use crate::algorithms::Gcra;
use crate::clock::saturating_nanos;
use crate::decision::Decision;
use crate::quota::Quota;

/// The largest `tau = B × T` the script holds, in microseconds (2^52).
pub const MAX_TOLERANCE_MICROS: u64 = 1 << 52;
/// The latest `now` the script holds, in microseconds (2^52): with
/// `tau <= 2^52` every TAT stays below 2^53.
pub const MAX_NOW_MICROS: u64 = 1 << 52;

const NANOS_PER_MICRO: u64 = 1_000;

/// The script and one quota's parameters in microseconds.
#[derive(Debug, Clone)]
pub(crate) struct GcraScript {
    /// `T` in µs, rounded up.
    interval_micros: u64,
    /// `B × T` in µs.
    tolerance_micros: u64,
    /// The GCRA that the script runs, on the µs-rounded `T`, in ns.
    gcra: Gcra,
    burst: u64,
}

/// What one script call decided.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reply {
    /// Tokens taken (0 when denied): the cost, or more for a lease.
    pub granted: u64,
    /// The decision for the tokens taken (or, denied, for the cost).
    pub decision: Decision,
}

impl GcraScript {
    /// The script for `quota`, or why it cannot be represented.
    pub(crate) fn new(quota: &Quota) -> Result<Self, RedisBuildError> {
        let unrepresentable = |reason: String| RedisBuildError::Unrepresentable {
            quota: quota.to_string(),
            reason,
        };
        let interval_nanos = quota.interval_nanos();
        if interval_nanos < NANOS_PER_MICRO {
            return Err(unrepresentable(format!(
                "its emission interval is {interval_nanos} ns; the script counts whole \
                 microseconds, so at most one token per microsecond per key"
            )));
        }
        let interval_micros = interval_nanos.div_ceil(NANOS_PER_MICRO);
        let burst = quota.burst_size();
        let tolerance_micros = burst
            .checked_mul(interval_micros)
            .filter(|&tau| tau <= MAX_TOLERANCE_MICROS)
            .ok_or_else(|| {
                unrepresentable(format!(
                    "burst {burst} x {interval_micros} us exceeds 2^52 us (about 142 years), \
                     beyond which Lua's doubles are not exact"
                ))
            })?;
        // tau <= 2^52 us, so T and tau in ns fit in a u64 (2^52 * 1000 < 2^62).
        let rounded = Quota::new(1, Duration::from_micros(interval_micros))
            .and_then(|q| q.burst(burst))
            .map_err(|e| unrepresentable(e.to_string()))?;
        Ok(GcraScript {
            interval_micros,
            tolerance_micros,
            gcra: Gcra::new(&rounded),
            burst,
        })
    }

    /// The quota's burst `B`.
    pub(crate) fn burst(&self) -> u64 {
        self.burst
    }

    /// The emission interval the script runs (rounded up to whole µs).
    pub(crate) fn interval(&self) -> Duration {
        Duration::from_micros(self.interval_micros)
    }

    /// The emission interval the script runs, in ns (for decisions).
    pub(crate) fn interval_nanos(&self) -> NonZeroU64 {
        NonZeroU64::new(saturating_nanos(self.interval())).unwrap_or(NonZeroU64::MIN)
    }

    /// `(T, tau)` in whole microseconds, as the scripts take them.
    pub(crate) fn micros(&self) -> (u64, u64) {
        (self.interval_micros, self.tolerance_micros)
    }

    /// The pure GCRA the script runs.
    pub(crate) fn gcra(&self) -> &Gcra {
        &self.gcra
    }

    /// Checks a reply to a call of `costs.len()` checks on this script's
    /// quota against the pure GCRA: one [`Reply`] per request, in order.
    #[cfg(test)]
    fn decode(&self, reply: &[i64], costs: &[u64]) -> Result<Vec<Reply>, RedisCallError> {
        let (now_ns, pairs) = split_reply(reply, costs.len())?;
        pairs
            .chunks_exact(2)
            .zip(costs)
            .map(|(pair, &n)| self.decode_one(reply, now_ns, pair, n, false))
            .collect()
    }

    /// One request's `{granted, tat}` of `reply`, for a check of cost `n`
    /// or, with `look`, a look at what a check of `n` would get (sent as a
    /// cost of 0: nothing granted, nothing written).
    fn decode_one(
        &self,
        reply: &[i64],
        now_ns: u64,
        pair: &[i64],
        n: u64,
        look: bool,
    ) -> Result<Reply, RedisCallError> {
        let bad = |why: &str| RedisCallError::BadReply(format!("{why}: {reply:?}"));
        let (granted, tat) = (as_micros(reply, pair[0])?, as_micros(reply, pair[1])?);
        let step_cost = if granted == 0 { n } else { granted };
        if granted != 0 && (look || granted < n || granted > self.burst) {
            return Err(bad("granted tokens outside n..=burst"));
        }
        let step = self.gcra.decide(tat * NANOS_PER_MICRO, now_ns, step_cost);
        if !look && step.decision.is_allowed() != (granted != 0) {
            return Err(bad("the script and the pure GCRA disagree"));
        }
        Ok(Reply {
            granted,
            decision: step.decision,
        })
    }
}

/// One script call deciding `requests` in order: `(Redis key, its
/// limit's script, cost, want, look)`, at `now_micros` or the server's
/// `TIME`. Requests all on one script send its `T` and tau once; requests
/// on several send each its own (`ARGV[1] = ''`). A look is sent as a cost
/// of 0. On a Cluster every key must hash to one slot.
pub(crate) fn invocation<'k>(
    requests: &[(&'k [u8], &'k GcraScript, u64, u64, bool)],
    now_micros: Option<u64>,
) -> ScriptInvocation<'static> {
    let mut call = script().prepare_invoke();
    let one = requests
        .first()
        .map(|first| first.1)
        .filter(|first| requests.iter().all(|r| std::ptr::eq(r.1, *first)));
    match one {
        Some(s) => call.arg(s.interval_micros).arg(s.tolerance_micros),
        None => call.arg("").arg(""),
    };
    match now_micros {
        Some(now) => call.arg(now),
        None => call.arg(""),
    };
    for &(key, s, n, want, look) in requests {
        let (n, want) = if look { (0, 0) } else { (n, want.max(n)) };
        call.key(key).arg(n).arg(want);
        if one.is_none() {
            call.arg(s.interval_micros).arg(s.tolerance_micros);
        }
    }
    call
}

/// Checks a reply to an [`invocation`] against each request's own pure
/// GCRA: `(script, cost, look)` per request, in order.
pub(crate) fn decode(
    reply: &[i64],
    requests: &[(&GcraScript, u64, bool)],
) -> Result<Vec<Reply>, RedisCallError> {
    let (now_ns, pairs) = split_reply(reply, requests.len())?;
    pairs
        .chunks_exact(2)
        .zip(requests)
        .map(|(pair, &(s, n, look))| s.decode_one(reply, now_ns, pair, n, look))
        .collect()
}

/// The script, hashed once for every limiter.
fn script() -> &'static Script {
    static SCRIPT: std::sync::OnceLock<Script> = std::sync::OnceLock::new();
    SCRIPT.get_or_init(|| Script::new(include_str!("gcra.lua")))
}

/// A reply's `now` in ns and its `{granted, tat}` pairs, `requests` of
/// them.
fn split_reply(reply: &[i64], requests: usize) -> Result<(u64, &[i64]), RedisCallError> {
    let bad = |why: &str| RedisCallError::BadReply(format!("{why}: {reply:?}"));
    let Some((&now, pairs)) = reply.split_first() else {
        return Err(bad("expected {now, granted, tat, ...}"));
    };
    if pairs.len() != 2 * requests {
        return Err(bad("expected {now, granted, tat, ...}"));
    }
    let now = as_micros(reply, now)?;
    if now >= MAX_NOW_MICROS {
        return Err(bad("the server's clock is past 2^52 us"));
    }
    Ok((now * NANOS_PER_MICRO, pairs))
}

/// A value of `reply` in microseconds: within 0..2^53, or a bad reply.
fn as_micros(reply: &[i64], v: i64) -> Result<u64, RedisCallError> {
    u64::try_from(v)
        .ok()
        .filter(|&v| v < 1 << 53)
        .ok_or_else(|| RedisCallError::BadReply(format!("a value outside 0..2^53: {reply:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_round_up_to_whole_microseconds() {
        let s = GcraScript::new(&Quota::per_second(3).unwrap()).unwrap();
        assert_eq!(s.interval(), Duration::from_micros(333_334));
        assert_eq!(s.tolerance_micros, 3 * 333_334);
        let s = GcraScript::new(&"2/s burst 5".parse().unwrap()).unwrap();
        assert_eq!(
            (s.interval_micros, s.tolerance_micros),
            (500_000, 2_500_000)
        );
    }

    #[test]
    fn quotas_the_script_cannot_hold_are_refused() {
        let too_fine = Quota::per_second(2_000_000).unwrap();
        assert!(matches!(
            GcraScript::new(&too_fine),
            Err(RedisBuildError::Unrepresentable { .. })
        ));
        // 1 per hour, burst 2,000,000: tau = 7.2e15 us > 2^52 (fits in ns).
        let too_long = Quota::per_hour(1).unwrap().burst(2_000_000).unwrap();
        assert!(GcraScript::new(&too_long).is_err());
        assert!(GcraScript::new(&Quota::per_second(1_000_000).unwrap()).is_ok());
    }

    #[test]
    fn replies_are_checked_against_the_pure_gcra() {
        let s = GcraScript::new(&"2/s burst 5".parse().unwrap()).unwrap();
        let now = 1_700_000_000_000_000;
        let one = |reply: &[i64]| s.decode(reply, &[1]).map(|r| r[0]);
        let reply = one(&[now, 1, 0]).unwrap();
        assert_eq!((reply.granted, reply.decision.remaining()), (1, 4));
        // A full bucket denies: the script saying "allowed" is a bad reply.
        let full = now + 2_500_000;
        assert!(one(&[now, 0, full]).unwrap().decision.is_denied());
        assert!(matches!(
            one(&[now, 1, full]),
            Err(RedisCallError::BadReply(_))
        ));
        assert!(matches!(one(&[now, 1]), Err(RedisCallError::BadReply(_))));
        assert!(matches!(
            one(&[now, -1, 0]),
            Err(RedisCallError::BadReply(_))
        ));
        assert!(matches!(
            one(&[now, 9, 0]),
            Err(RedisCallError::BadReply(_))
        ));
        assert!(matches!(
            s.decode(&[], &[]),
            Err(RedisCallError::BadReply(_))
        ));
    }

    #[test]
    fn a_reply_of_several_requests_is_checked_request_by_request() {
        let s = GcraScript::new(&"2/s burst 5".parse().unwrap()).unwrap();
        let now = 1_700_000_000_000_000;
        // The same key twice, cost 2 then 3: the second sees the first's TAT.
        let replies = s.decode(&[now, 2, 0, 3, now + 1_000_000], &[2, 3]).unwrap();
        let left: Vec<u64> = replies.iter().map(|r| r.decision.remaining()).collect();
        assert_eq!(left, [3, 0]);
        // One pair too few, or a second request the pure GCRA denies.
        assert!(s.decode(&[now, 2, 0], &[2, 3]).is_err());
        assert!(s.decode(&[now, 2, 0, 4, now + 1_000_000], &[2, 4]).is_err());
    }
}
