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
//! whole seconds. A [fallback decision](Decision::is_fallback) (a remote
//! limiter's store did not answer) is described by what decided it:
//!
//! - a local fallback limiter (Redis's `FailurePolicy::Local`, a
//!   [`Limiter::fallback_quota`](super::Limiter::fallback_quota)):
//!   `RateLimit-Policy` is the local quota, and `RateLimit`, the trio and
//!   `Retry-After` its bucket's, so all of them describe the limit that
//!   decided;
//! - no bucket (fail open, fail closed): `RateLimit-Policy` is the
//!   limiter's own quota, with neither `RateLimit` nor the trio, as the
//!   fleet's state is unknown and `r=0` would tell an admitted client to
//!   back off (a denial still gets `Retry-After`: when the store is tried
//!   again).
//!
//! On a denial, `Retry-After` is [`Decision::retry_after`] in delta-seconds, rounded
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

/// Which headers a layer writes, for its policies.
#[derive(Debug)]
pub(crate) struct HeaderSet {
    /// The quoted policy names, one per limit.
    names: Vec<String>,
    /// Whether to write `RateLimit-Policy` and `RateLimit`.
    ietf: bool,
    x_trio: bool,
    /// This set's own number in each thread's [`RENDERED`] cache.
    id: u64,
}

/// `RateLimit-Policy` values rendered on this thread: (layer, quota
/// version, value). A response clones its layer's value (a reference
/// count) while the limiter's [`quota_version`](super::Limiter::quota_version)
/// is the one it was rendered for, and renders it again once, on each
/// thread, after a quota change. Per thread, so no response waits for
/// another and no lock or shared write is taken.
type Rendered = Vec<(u64, u64, Option<HeaderValue>)>;

thread_local! {
    static RENDERED: std::cell::RefCell<Rendered> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Layers whose policy one thread keeps rendered (the oldest goes first).
const RENDERED_LAYERS: usize = 16;

/// Numbers the header sets, for [`RENDERED`]: never reused, so a dropped
/// layer's entries can never be taken for a new layer's.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// `RateLimit-Policy` for `quotas` under `names` (sf-strings): every
/// policy, as one list.
fn render(names: &[String], quotas: &[Quota]) -> Option<HeaderValue> {
    let policy = names
        .iter()
        .zip(quotas)
        .map(|(name, quota)| format!("{name};q={};w={}", quota.burst_size(), window_secs(quota)))
        .collect::<Vec<_>>()
        .join(", ");
    HeaderValue::from_str(&policy).ok()
}

impl HeaderSet {
    /// `names` are the policies' names, already sf-strings
    /// ([`sf_string`]), one per quota of the limiter.
    pub(crate) fn new(names: Vec<String>, ietf: bool, x_trio: bool) -> Self {
        HeaderSet {
            names,
            ietf,
            x_trio,
            // Relaxed: a counter; only its uniqueness matters.
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// `RateLimit-Policy` for the limiter's quotas at `version`, or `None`
    /// when the IETF fields are off: this thread's rendering while
    /// `version` is the one it was made for, else `quotas()` rendered again
    /// (read after `version`, so a value is never older than its version).
    pub(crate) fn policy(
        &self,
        version: u64,
        quotas: impl FnOnce() -> Vec<Quota>,
    ) -> Option<HeaderValue> {
        if !self.ietf {
            return None;
        }
        RENDERED.with(|rendered| {
            let mut rendered = rendered.borrow_mut();
            let mine = rendered.iter().position(|&(id, ..)| id == self.id);
            if let Some(i) = mine {
                if rendered[i].1 == version {
                    return rendered[i].2.clone();
                }
                rendered.remove(i);
            } else if rendered.len() >= RENDERED_LAYERS {
                rendered.remove(0);
            }
            let value = render(&self.names, &quotas());
            rendered.push((self.id, version, value.clone()));
            value
        })
    }

    /// Appends `policy` (from [`policy`](HeaderSet::policy)) alone: for
    /// an answer no bucket decided (a cost no limit can meet).
    pub(crate) fn write_policy(&self, policy: Option<HeaderValue>, headers: &mut HeaderMap) {
        if let Some(policy) = policy {
            headers.append(RATELIMIT_POLICY, policy);
        }
    }

    /// `RateLimit-Policy` for a fallback decision of the policy at
    /// `binding` made under `quota` (a local fallback limiter's), or `None`
    /// when the IETF fields are off. Rendered each time: only a
    /// store that is down takes this path.
    pub(crate) fn fallback_policy(&self, binding: usize, quota: Quota) -> Option<HeaderValue> {
        let name = self.names.get(binding).or(self.names.first())?;
        self.ietf
            .then(|| render(std::slice::from_ref(name), &[quota]))
            .flatten()
    }

    /// Writes the rate-limit fields for `decision`, the decision of the
    /// policy at `binding` (not `Retry-After`: see [`write_retry_after`]),
    /// with `policy` from [`policy`](HeaderSet::policy).
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
    pub(crate) fn write(
        &self,
        policy: Option<HeaderValue>,
        decision: &Decision,
        binding: usize,
        headers: &mut HeaderMap,
    ) {
        self.write_described(policy, decision, binding, !decision.is_fallback(), headers);
    }

    /// [`write`](HeaderSet::write), with `RateLimit` and the trio only when
    /// `decision` describes a bucket (`stateful`).
    pub(crate) fn write_described(
        &self,
        policy: Option<HeaderValue>,
        decision: &Decision,
        binding: usize,
        stateful: bool,
        headers: &mut HeaderMap,
    ) {
        let fallback = !stateful;
        let remaining = decision.remaining();
        let reset = ceil_secs(decision.reset_after());
        // A binding index out of range (a limiter answering for a policy it
        // did not list) falls back to the first name rather than failing.
        let name = self.names.get(binding).or(self.names.first());
        if let (Some(policy), Some(name)) = (policy, name) {
            headers.append(RATELIMIT_POLICY, policy);
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
    let names = policies
        .iter()
        .map(|(name, _)| sf_string(name))
        .collect::<Result<Vec<_>, NotPrintable>>()?;
    let quotas: Vec<Quota> = policies.iter().map(|&(_, quota)| quota).collect();
    let mut headers = HeaderMap::new();
    let policy = render(&names, &quotas);
    HeaderSet::new(names, true, false).write(policy, decision, binding, &mut headers);
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
        let set = |q: &str| render(&["\"p\"".into()], &[q.parse().unwrap()]).unwrap();
        assert_eq!(set("100/min"), "\"p\";q=100;w=60");
        assert_eq!(set("3/1.5s"), "\"p\";q=3;w=2");
        assert_eq!(set("10/ms"), "\"p\";q=10;w=1");
        // The bucket, not the rate: what `r` counts down from.
        assert_eq!(set("10/s burst 20"), "\"p\";q=20;w=2");
        assert_eq!(set("1/min burst 5"), "\"p\";q=5;w=300");
        // The nanosecond rounding of 1/3 s adds no second.
        assert_eq!(set("3/s"), "\"p\";q=3;w=1");
        assert_eq!(set("7/s burst 14"), "\"p\";q=14;w=2");
    }

    #[test]
    fn a_fallback_decision_gets_the_policy_only() {
        let quota: Quota = "3/min".parse().unwrap();
        let set = HeaderSet::new(vec!["\"p\"".into()], true, true);
        let policy = || set.policy(0, || vec![quota]);
        let decision = crate::direct::DirectLimiter::new(quota).check();
        let mut headers = HeaderMap::new();
        set.write(policy(), &decision.by_fallback(), 0, &mut headers);
        assert_eq!(headers.len(), 1, "{headers:?}");
        assert_eq!(headers.get(RATELIMIT_POLICY).unwrap(), "\"p\";q=3;w=60");
        // The same decision from the limiter itself: every field.
        set.write(policy(), &decision, 0, &mut headers);
        assert_eq!(headers.get(RATELIMIT).unwrap(), "\"p\";r=2;t=20");
        assert_eq!(headers.get(X_RATELIMIT_REMAINING).unwrap(), "2");
    }

    /// The rendering is kept per version: the same version never renders
    /// twice on a thread, a new one renders at once.
    #[test]
    fn the_policy_follows_the_quota_version() {
        let set = HeaderSet::new(vec!["\"p\"".into()], true, false);
        let renders = std::cell::Cell::new(0);
        let quota = |text: &'static str| {
            let renders = &renders;
            move || {
                renders.set(renders.get() + 1);
                vec![text.parse().unwrap()]
            }
        };
        assert_eq!(set.policy(0, quota("5/min")).unwrap(), "\"p\";q=5;w=60");
        assert_eq!(set.policy(0, quota("50/min")).unwrap(), "\"p\";q=5;w=60");
        assert_eq!(renders.get(), 1, "version 0 rendered once");
        assert_eq!(set.policy(1, quota("50/min")).unwrap(), "\"p\";q=50;w=60");
        assert_eq!(renders.get(), 2);
        let off = HeaderSet::new(vec!["\"p\"".into()], false, true);
        assert_eq!(off.policy(0, quota("5/min")), None);
    }

    #[test]
    fn several_policies_make_one_list() {
        let quotas = || vec!["10/s".parse().unwrap(), "1000/h".parse().unwrap()];
        let set = HeaderSet::new(vec!["\"a\"".into(), "\"b\"".into()], true, false);
        let policy = set.policy(0, quotas);
        assert_eq!(
            policy.clone().unwrap(),
            "\"a\";q=10;w=1, \"b\";q=1000;w=3600"
        );
        let mut headers = HeaderMap::new();
        let decision = crate::direct::DirectLimiter::new("1000/h".parse().unwrap()).check();
        set.write(policy, &decision, 1, &mut headers);
        let rate = headers.get(RATELIMIT).unwrap().to_str().unwrap();
        assert!(rate.starts_with("\"b\";r=999;"), "{rate}");
    }
}
