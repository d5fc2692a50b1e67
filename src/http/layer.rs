//! [`RateLimitLayer`]: the tower layer, its service and its future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use metrics::Counter;
use pin_project_lite::pin_project;
use tower::{Layer, Service};

use super::headers::{self, ceil_secs, HeaderSet};
use super::key::{KeyExtractor, RequestParts};
use super::{problem, Limiter};
use crate::Decision;

/// What the layer does when its limiter fails (a Redis limiter whose store
/// is down): the seeds' policy choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnLimiterError {
    /// Fail closed: answer with this status (default `503 Service
    /// Unavailable`) and a problem+json body. Suits sensitive routes
    /// (login).
    Reject(StatusCode),
    /// Fail open: pass the request on, without rate-limit headers.
    /// Protects availability.
    Allow,
}

impl Default for OnLimiterError {
    fn default() -> Self {
        OnLimiterError::Reject(StatusCode::SERVICE_UNAVAILABLE)
    }
}

/// A layer setting that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LayerError {
    /// The policy name cannot be written in a header.
    #[error("the policy name {name:?} cannot go in a RateLimit header: {reason}")]
    BadName {
        /// The name given.
        name: String,
        /// Why.
        reason: String,
    },
}

/// The name of the metric the layer counts decisions in.
///
/// One counter per outcome, labelled `limiter` (the policy name), `route`
/// and `outcome`: `allowed`, `denied`, `bad_key` (refused by the key
/// policy) or `limiter_error`.
pub const DECISIONS_METRIC: &str = "turnstile_http_decisions_total";

/// The counters of one layer. Handles are taken from the `metrics` recorder
/// when the layer is built: install the recorder (exporter) first.
#[derive(Clone, Debug)]
struct Counters {
    allowed: Counter,
    denied: Counter,
    bad_key: Counter,
    limiter_error: Counter,
}

impl Counters {
    fn new(limiter: &str, route: &str) -> Self {
        let counter = |outcome: &'static str| {
            metrics::counter!(
                DECISIONS_METRIC,
                "limiter" => limiter.to_owned(),
                "route" => route.to_owned(),
                "outcome" => outcome,
            )
        };
        Counters {
            allowed: counter("allowed"),
            denied: counter("denied"),
            bad_key: counter("bad_key"),
            limiter_error: counter("limiter_error"),
        }
    }
}

struct Shared<L> {
    limiter: L,
    name: String,
    key: KeyExtractor,
    headers: HeaderSet,
    on_error: OnLimiterError,
    counters: Counters,
}

/// A tower [`Layer`] that rate-limits requests: keys each request
/// ([`KeyExtractor`]), asks the [`Limiter`], and answers a denial with
/// `429 Too Many Requests`, `Retry-After` and an `application/problem+json`
/// body; every response it lets through gets the rate-limit headers (see
/// [`headers`](super::headers)).
///
/// One layer is one policy. Per-route quotas are one layer per route (in
/// axum, `route_layer` or a layer on the route's handler); see the
/// [module docs](super).
///
/// The response body type must be buildable from [`Bytes`] (axum's
/// `Body`, `http_body_util::Full<Bytes>`); the inner service must be
/// [`Clone`] (axum's are).
pub struct RateLimitLayer<L> {
    shared: Arc<Shared<L>>,
}

impl<L> Clone for RateLimitLayer<L> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<L> fmt::Debug for RateLimitLayer<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("name", &self.shared.name)
            .field("key", &self.shared.key)
            .field("on_error", &self.shared.on_error)
            .finish_non_exhaustive()
    }
}

impl<L: Limiter> RateLimitLayer<L> {
    /// A builder: policy name `"default"`, keyed by client address,
    /// IETF headers on, `X-RateLimit-*` off, failing closed with `503`.
    pub fn builder(limiter: L) -> RateLimitLayerBuilder<L> {
        RateLimitLayerBuilder {
            limiter,
            name: "default".to_owned(),
            route: None,
            key: KeyExtractor::peer_ip(),
            ietf_headers: true,
            x_ratelimit_headers: false,
            on_error: OnLimiterError::default(),
        }
    }

    /// The limiter behind this layer.
    pub fn limiter(&self) -> &L {
        &self.shared.limiter
    }
}

impl<S, L> Layer<S> for RateLimitLayer<L> {
    type Service = RateLimit<S, L>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// Builds a [`RateLimitLayer`]: `RateLimitLayer::builder(limiter)`.
pub struct RateLimitLayerBuilder<L> {
    limiter: L,
    name: String,
    route: Option<String>,
    key: KeyExtractor,
    ietf_headers: bool,
    x_ratelimit_headers: bool,
    on_error: OnLimiterError,
}

impl<L> fmt::Debug for RateLimitLayerBuilder<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayerBuilder")
            .field("name", &self.name)
            .field("route", &self.route)
            .field("key", &self.key)
            .field("ietf_headers", &self.ietf_headers)
            .field("x_ratelimit_headers", &self.x_ratelimit_headers)
            .field("on_error", &self.on_error)
            .finish_non_exhaustive()
    }
}

impl<L: Limiter> RateLimitLayerBuilder<L> {
    /// The policy's name, in `RateLimit-Policy`, `RateLimit` and the
    /// metrics' `limiter` label (printable ASCII).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The metrics' `route` label (default: the policy name). Use the
    /// route's pattern (`/api`), never the raw path: every label value is
    /// a time series.
    pub fn route(mut self, route: impl Into<String>) -> Self {
        self.route = Some(route.into());
        self
    }

    /// How requests are keyed (default: [`KeyExtractor::peer_ip`]).
    pub fn key(mut self, key: KeyExtractor) -> Self {
        self.key = key;
        self
    }

    /// Whether to write `RateLimit-Policy` and `RateLimit` (default on).
    pub fn ietf_headers(mut self, on: bool) -> Self {
        self.ietf_headers = on;
        self
    }

    /// Whether to write `X-RateLimit-Limit`, `-Remaining` and `-Reset`
    /// (default off).
    pub fn x_ratelimit_headers(mut self, on: bool) -> Self {
        self.x_ratelimit_headers = on;
        self
    }

    /// What to do when the limiter fails (default: `503`).
    pub fn on_limiter_error(mut self, policy: OnLimiterError) -> Self {
        self.on_error = policy;
        self
    }

    /// The layer. Takes the metrics handles now, so install the `metrics`
    /// recorder before building layers.
    pub fn build(self) -> Result<RateLimitLayer<L>, LayerError> {
        let quoted = headers::sf_string(&self.name).map_err(|reason| LayerError::BadName {
            name: self.name.clone(),
            reason,
        })?;
        let quota = self.limiter.quota();
        let route = self.route.as_deref().unwrap_or(&self.name);
        Ok(RateLimitLayer {
            shared: Arc::new(Shared {
                counters: Counters::new(&self.name, route),
                headers: HeaderSet::new(
                    quoted,
                    &quota,
                    self.ietf_headers,
                    self.x_ratelimit_headers,
                ),
                limiter: self.limiter,
                name: self.name,
                key: self.key,
                on_error: self.on_error,
            }),
        })
    }
}

/// The service [`RateLimitLayer`] wraps around another.
pub struct RateLimit<S, L> {
    inner: S,
    shared: Arc<Shared<L>>,
}

impl<S: Clone, L> Clone for RateLimit<S, L> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, L> fmt::Debug for RateLimit<S, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("policy", &self.shared.name)
            .finish_non_exhaustive()
    }
}

impl<S, L, ReqB, ResB> Service<Request<ReqB>> for RateLimit<S, L>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    L: Limiter,
    ResB: From<Bytes>,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = ResponseFuture<S, L, ReqB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        let shared = Arc::clone(&self.shared);
        let key = match shared.key.key(&RequestParts::of(&request)) {
            Ok(key) => key,
            Err((status, error)) => {
                shared.counters.bad_key.increment(1);
                let response = problem::response(status, &error.to_string(), None);
                return ResponseFuture::ready(shared, response);
            }
        };
        let check = shared.limiter.check(&key);
        // The clone that was made ready is the one that must be called:
        // keep it for the request and leave a fresh clone in its place.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture {
            shared,
            state: State::Checking {
                check,
                pending: Some((inner, request)),
            },
        }
    }
}

pin_project! {
    /// The future of [`RateLimit`]: the limiter's check, then the inner
    /// service's call, then the headers.
    pub struct ResponseFuture<S, L, ReqB>
    where
        S: Service<Request<ReqB>>,
        L: Limiter,
    {
        shared: Arc<Shared<L>>,
        #[pin]
        state: State<S, L, ReqB>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, L, ReqB>
    where
        S: Service<Request<ReqB>>,
        L: Limiter,
    {
        Checking {
            #[pin]
            check: L::Future,
            pending: Option<(S, Request<ReqB>)>,
        },
        Calling {
            #[pin]
            call: S::Future,
            decision: Option<Decision>,
        },
        Ready {
            response: Option<S::Response>,
        },
    }
}

impl<S, L, ReqB> ResponseFuture<S, L, ReqB>
where
    S: Service<Request<ReqB>>,
    L: Limiter,
{
    fn ready(shared: Arc<Shared<L>>, response: S::Response) -> Self {
        ResponseFuture {
            shared,
            state: State::Ready {
                response: Some(response),
            },
        }
    }
}

impl<S, L, ReqB> fmt::Debug for ResponseFuture<S, L, ReqB>
where
    S: Service<Request<ReqB>>,
    L: Limiter,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Checking { .. } => "checking",
            State::Calling { .. } => "calling",
            State::Ready { .. } => "ready",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

impl<S, L, ReqB, ResB> Future for ResponseFuture<S, L, ReqB>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    L: Limiter,
    ResB: From<Bytes>,
{
    type Output = Result<Response<ResB>, S::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let this = self.as_mut().project();
            let shared = &**this.shared;
            let next = match this.state.project() {
                StateProj::Checking { check, pending } => {
                    let outcome = ready!(check.poll(cx));
                    let Some((mut inner, request)) = pending.take() else {
                        // Polled again after the check ended: a caller bug
                        // the state machine never causes.
                        return Poll::Ready(Ok(problem::response(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "rate limiter future polled after completion",
                            None,
                        )));
                    };
                    let decision = match outcome {
                        Ok(decision) if decision.is_allowed() => {
                            shared.counters.allowed.increment(1);
                            Some(decision)
                        }
                        Ok(decision) => {
                            shared.counters.denied.increment(1);
                            return Poll::Ready(Ok(too_many_requests(shared, &decision)));
                        }
                        Err(error) => {
                            shared.counters.limiter_error.increment(1);
                            match shared.on_error {
                                OnLimiterError::Allow => None,
                                OnLimiterError::Reject(status) => {
                                    let detail = format!("rate limiter unavailable: {error}");
                                    return Poll::Ready(Ok(problem::response(
                                        status, &detail, None,
                                    )));
                                }
                            }
                        }
                    };
                    State::Calling {
                        call: inner.call(request),
                        decision,
                    }
                }
                StateProj::Calling { call, decision } => {
                    let mut response = ready!(call.poll(cx))?;
                    if let Some(decision) = decision {
                        shared.headers.write(decision, response.headers_mut());
                    }
                    return Poll::Ready(Ok(response));
                }
                StateProj::Ready { response } => {
                    return Poll::Ready(Ok(response.take().unwrap_or_else(|| {
                        problem::response(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "rate limiter future polled after completion",
                            None,
                        )
                    })));
                }
            };
            self.as_mut().project().state.set(next);
        }
    }
}

/// The 429: problem+json, `Retry-After` and the rate-limit headers.
fn too_many_requests<L, B: From<Bytes>>(shared: &Shared<L>, decision: &Decision) -> Response<B> {
    let retry = decision.retry_after().map_or(1, |d| ceil_secs(d).max(1));
    let detail = format!(
        "rate limit \"{}\" exceeded; retry after {retry} s",
        shared.name
    );
    let throttled = problem::Throttled {
        policy: &shared.name,
        retry_after: retry,
    };
    let mut response = problem::response(StatusCode::TOO_MANY_REQUESTS, &detail, Some(throttled));
    shared.headers.write(decision, response.headers_mut());
    response
}
