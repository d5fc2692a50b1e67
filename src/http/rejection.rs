//! [`Denied`]: what a custom denial response is built from, and the
//! default response (problem+json, or a gRPC status for gRPC calls).
//!
//! tower_governor users write an error handler; here it is a closure given
//! to [`RateLimitLayerBuilder::on_denied`](super::RateLimitLayerBuilder::on_denied).
//! Whatever it returns, the layer then writes the rate-limit fields and
//! `Retry-After` from the same decision, so the headers and the policy
//! named in the body can never disagree.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode};

use super::headers::ceil_secs;
use super::{grpc, problem};
use crate::decision::Decision;

/// A denied request, as a custom denial response sees it.
#[derive(Clone, Copy, Debug)]
pub struct Denied<'a> {
    pub(crate) policy: &'a str,
    pub(crate) decision: &'a Decision,
    pub(crate) grpc: bool,
}

impl Denied<'_> {
    /// The binding policy's name: the layer's
    /// [`name`](super::RateLimitLayerBuilder::name), or for a limiter of
    /// several quotas the name of the one that denied (see
    /// [`policy_names`](super::RateLimitLayerBuilder::policy_names)).
    pub fn policy(&self) -> &str {
        self.policy
    }

    /// The limiter's decision (limit, remaining, waits).
    pub fn decision(&self) -> &Decision {
        self.decision
    }

    /// The wait in whole seconds, rounded up and never `0`: the value of
    /// `Retry-After`.
    pub fn retry_after_secs(&self) -> u64 {
        self.decision
            .retry_after()
            .map_or(1, |wait| ceil_secs(wait).max(1))
    }

    /// Whether the request is a gRPC call (`content-type:
    /// application/grpc`): its client reads `grpc-status`, not the HTTP
    /// status.
    pub fn is_grpc(&self) -> bool {
        self.grpc
    }

    /// What the layer answers when no custom response is set: a `429` with
    /// an `application/problem+json` body naming the policy and the wait,
    /// or for a gRPC call the status `RESOURCE_EXHAUSTED` with the wait in
    /// its metadata and details (see [`http`](crate::http#grpc)).
    pub fn default_response(&self) -> Response<Bytes> {
        let retry = self.retry_after_secs();
        let detail = format!(
            "rate limit \"{}\" exceeded; retry after {retry} s",
            self.policy
        );
        if self.grpc {
            let mut response = grpc::status_response(grpc::RESOURCE_EXHAUSTED, &detail);
            let wait = self.decision.retry_after().unwrap_or_default();
            let headers = response.headers_mut();
            headers.insert(grpc::GRPC_RETRY_PUSHBACK_MS, grpc::pushback_ms(wait).into());
            headers.insert(
                grpc::GRPC_STATUS_DETAILS,
                grpc::retry_details(grpc::RESOURCE_EXHAUSTED, &detail, wait),
            );
            return response;
        }
        let throttled = problem::Members::Throttled {
            policy: self.policy,
            retry_after: retry,
        };
        problem::response(StatusCode::TOO_MANY_REQUESTS, &detail, Some(throttled))
    }
}

type DenyFn = dyn Fn(&Denied<'_>) -> Response<Bytes> + Send + Sync;

/// The denial response a layer builds: the default, or the user's closure.
#[derive(Clone, Default)]
pub(crate) struct OnDenied(Option<Arc<DenyFn>>);

impl OnDenied {
    pub(crate) fn custom(
        build: impl Fn(&Denied<'_>) -> Response<Bytes> + Send + Sync + 'static,
    ) -> Self {
        OnDenied(Some(Arc::new(build)))
    }

    pub(crate) fn response(&self, denied: &Denied<'_>) -> Response<Bytes> {
        match &self.0 {
            Some(build) => build(denied),
            None => denied.default_response(),
        }
    }
}

impl fmt::Debug for OnDenied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "custom"
        } else {
            "default"
        })
    }
}
