//! Rate-limit response headers: `Retry-After`, the IETF draft's
//! `RateLimit-Policy` and `RateLimit`, and the older `X-RateLimit-*` trio.
//!
//! The fields of draft-ietf-httpapi-ratelimit-headers (revisions 09 and 10;
//! structured fields, RFC 9651):
//!
//! ```text
//! RateLimit-Policy: "api";q=100;w=60    the policy: q requests per w seconds
//! RateLimit: "api";r=42;t=35            this client: r left, full again in t seconds
//! ```
//!
//! How turnstile's numbers map onto them: `q` and `w` are the bucket of
//! each [`Quota`], the same for every limiter (direct, keyed, multi-limit,
//! Redis): `q` is its burst ([`Quota::burst_size`]) and `w` the time an
//! empty bucket takes to refill (`burst` emission intervals) in seconds,
//! rounded up. So `"10/s burst 20"` is `q=20;w=2`, `"100/min"` is
//! `q=100;w=60`, and `r` never exceeds `q`. `r` is
//! [`Decision::remaining`]; `t` is [`Decision::reset_after`] rounded up to
//! whole seconds. A [fallback decision](Decision::is_fallback) describes
//! no shared state: it gets `RateLimit-Policy` but neither `RateLimit` nor
//! the `X-RateLimit-*` trio (a denial still gets `Retry-After`). On a denial,
//! `Retry-After` is [`Decision::retry_after`] in delta-seconds, rounded
//! **up** so that a client that waits exactly that long is admitted (and
//! never `0`).
//!
//! The trio, when enabled: `X-RateLimit-Limit` is [`Decision::limit`],
//! `X-RateLimit-Remaining` is `r`, `X-RateLimit-Reset` is `t` (seconds from
//! now, not a Unix time).

use std::fmt::Write;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::HeaderMap;

use crate::decision::Decision;
use crate::quota::Quota;

/// `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` (draft-ietf-httpapi-ratelimit-headers).
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `X-RateLimit-Limit`.
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`.
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// A duration in whole seconds, rounded up.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// `w` for `quota`: `burst` emission intervals in whole seconds, rounded
/// up, at least 1. The interval is the period over the count rounded up to
/// a nanosecond, which overshoots by less than `burst` nanoseconds in all:
/// that overshoot is not rounded up to one more second (`"3/s"` is `w=1`).
fn window_secs(quota: &Quota) -> u64 {
    let burst = quota.burst_size();
    // tolerance >= burst, as the interval is at least 1 ns.
    let refill = quota.tolerance_nanos() - (burst - 1);
    ceil_secs(Duration::from_nanos(refill)).max(1)
}

/// Why a name cannot be a structured-field string: it holds this
/// character, which is not printable ASCII.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not printable ASCII")]
pub struct NotPrintable(pub char);

/// A policy name as a structured-field string (`"api"`), or the first
/// character that keeps it from being one: only printable ASCII is
/// allowed; `"` and `\` are escaped.
pub(crate) fn sf_string(name: &str) -> Result<String, NotPrintable> {
    let mut out = String::with_capacity(name.len() + 2);
    out.push('"');
    for c in name.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => return Err(NotPrintable(c)),
        }
    }
    out.push('"');
    Ok(out)
}

/// Which headers a layer writes, precomputed for its policies.
#[derive(Clone, Debug)]
pub(crate) struct HeaderSet {
    /// The quoted policy names, one per limit.
    names: Vec<String>,
    /// `RateLimit-Policy` (every policy, as one list), or `None` when the
    /// IETF fields are off.
    policy: Option<HeaderValue>,
    x_trio: bool,
}

impl HeaderSet {
    /// `policies` are (name, quota) pairs whose names are already
    /// sf-strings ([`sf_string`]).
    pub(crate) fn new(policies: Vec<(String, Quota)>, ietf: bool, x_trio: bool) -> Self {
        let policy = policies
            .iter()
            .map(|(name, quota)| {
                format!("{name};q={};w={}", quota.burst_size(), window_secs(quota))
            })
            .collect::<Vec<_>>()
            .join(", ");
        HeaderSet {
            policy: ietf.then(|| HeaderValue::from_str(&policy).ok()).flatten(),
            names: policies.into_iter().map(|(name, _)| name).collect(),
            x_trio,
        }
    }

    /// Writes the rate-limit fields for `decision`, the decision of the
    /// policy at `binding` (not `Retry-After`: see [`write_retry_after`]).
    ///
    /// `RateLimit-Policy` and `RateLimit` are lists in the draft. One layer
    /// of several limits lists every policy in `RateLimit-Policy` and the
    /// binding one in `RateLimit` (the others' state is not what decided).
    /// Each layer **appends** its own items, so two stacked layers (two
    /// policies) both show, each under its own name, and the denying one's
    /// item is the one with `r=0`. The `X-RateLimit-*` trio holds one
    /// policy only: the one with the fewest requests left (the binding
    /// one) wins, so stacked layers never mix two policies' numbers. A
    /// fallback decision writes the policy only (see the module docs).
    pub(crate) fn write(&self, decision: &Decision, binding: usize, headers: &mut HeaderMap) {
        let fallback = decision.is_fallback();
        let remaining = decision.remaining();
        let reset = ceil_secs(decision.reset_after());
        // A binding index out of range (a limiter answering for a policy it
        // did not list) falls back to the first name rather than failing.
        let name = self.names.get(binding).or(self.names.first());
        if let (Some(policy), Some(name)) = (&self.policy, name) {
            headers.append(RATELIMIT_POLICY, policy.clone());
            if !fallback {
                let mut value = String::with_capacity(name.len() + 24);
                let _ = write!(value, "{name};r={remaining};t={reset}");
                if let Ok(value) = HeaderValue::from_maybe_shared(Bytes::from(value)) {
                    headers.append(RATELIMIT, value);
                }
            }
        }
        if self.x_trio && !fallback {
            let binding = headers
                .get(X_RATELIMIT_REMAINING)
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                .is_none_or(|theirs| remaining < theirs);
            if binding {
                headers.insert(X_RATELIMIT_LIMIT, decision.limit().into());
                headers.insert(X_RATELIMIT_REMAINING, remaining.into());
                headers.insert(X_RATELIMIT_RESET, reset.into());
            }
        }
    }
}

/// The IETF `RateLimit-Policy` and `RateLimit` fields for `decision`,
/// exactly as [`RateLimitLayer`](crate::http::RateLimitLayer) writes them,
/// for a service that answers for a proxy instead of serving HTTP itself
/// (Envoy's rate limit service, `turnstile-rls`). `policies` are (name,
/// quota) pairs with plain names; `binding` is the index of the policy
/// `decision` came from. An error names the first character of a name that
/// is not printable ASCII.
pub fn ietf_fields(
    policies: &[(&str, Quota)],
    binding: usize,
    decision: &Decision,
) -> Result<HeaderMap, NotPrintable> {
    let policies = policies
        .iter()
        .map(|(name, quota)| Ok((sf_string(name)?, *quota)))
        .collect::<Result<Vec<_>, NotPrintable>>()?;
    let mut headers = HeaderMap::new();
    HeaderSet::new(policies, true, false).write(decision, binding, &mut headers);
    Ok(headers)
}

/// `Retry-After` for a denial: the wait in delta-seconds, rounded up and
/// never `0`, as in the body of the default response.
pub(crate) fn write_retry_after(decision: &Decision, headers: &mut HeaderMap) {
    let wait = decision.retry_after().map_or(1, |d| ceil_secs(d).max(1));
    headers.insert(RETRY_AFTER, wait.into());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_round_up() {
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_nanos(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(5)), 5);
        assert_eq!(ceil_secs(Duration::from_millis(5_001)), 6);
        assert_eq!(ceil_secs(Duration::MAX), u64::MAX);
    }

    #[test]
    fn names_become_sf_strings() {
        assert_eq!(sf_string("api").as_deref(), Ok("\"api\""));
        assert_eq!(sf_string("a\"b\\c").as_deref(), Ok("\"a\\\"b\\\\c\""));
        assert_eq!(sf_string("caf\u{e9}"), Err(NotPrintable('\u{e9}')));
        assert_eq!(sf_string("a\nb"), Err(NotPrintable('\n')));
        assert_eq!(
            NotPrintable('\n').to_string(),
            "'\\n' is not printable ASCII"
        );
    }

    #[test]
    fn policy_window_is_whole_seconds() {
        let set = |q: &str| HeaderSet::new(vec![("\"p\"".into(), q.parse().unwrap())], true, false);
        assert_eq!(set("100/min").policy.unwrap(), "\"p\";q=100;w=60");
        assert_eq!(set("3/1.5s").policy.unwrap(), "\"p\";q=3;w=2");
        assert_eq!(set("10/ms").policy.unwrap(), "\"p\";q=10;w=1");
        // The bucket, not the rate: what `r` counts down from.
        assert_eq!(set("10/s burst 20").policy.unwrap(), "\"p\";q=20;w=2");
        assert_eq!(set("1/min burst 5").policy.unwrap(), "\"p\";q=5;w=300");
        // The nanosecond rounding of 1/3 s adds no second.
        assert_eq!(set("3/s").policy.unwrap(), "\"p\";q=3;w=1");
        assert_eq!(set("7/s burst 14").policy.unwrap(), "\"p\";q=14;w=2");
    }

    #[test]
    fn a_fallback_decision_gets_the_policy_only() {
        let quota: Quota = "3/min".parse().unwrap();
        let set = HeaderSet::new(vec![("\"p\"".into(), quota)], true, true);
        let decision = crate::direct::DirectLimiter::new(quota).check();
        let mut headers = HeaderMap::new();
        set.write(&decision.by_fallback(), 0, &mut headers);
        assert_eq!(headers.len(), 1, "{headers:?}");
        assert_eq!(headers.get(RATELIMIT_POLICY).unwrap(), "\"p\";q=3;w=60");
        // The same decision from the limiter itself: every field.
        set.write(&decision, 0, &mut headers);
        assert_eq!(headers.get(RATELIMIT).unwrap(), "\"p\";r=2;t=20");
        assert_eq!(headers.get(X_RATELIMIT_REMAINING).unwrap(), "2");
    }

    #[test]
    fn several_policies_make_one_list() {
        let policies = vec![
            ("\"a\"".into(), "10/s".parse().unwrap()),
            ("\"b\"".into(), "1000/h".parse().unwrap()),
        ];
        let set = HeaderSet::new(policies, true, false);
        assert_eq!(
            set.policy.clone().unwrap(),
            "\"a\";q=10;w=1, \"b\";q=1000;w=3600"
        );
        let mut headers = HeaderMap::new();
        let decision = crate::direct::DirectLimiter::new("1000/h".parse().unwrap()).check();
        set.write(&decision, 1, &mut headers);
        let rate = headers.get(RATELIMIT).unwrap().to_str().unwrap();
        assert!(rate.starts_with("\"b\";r=999;"), "{rate}");
    }
}
