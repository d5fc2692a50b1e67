//! [`RateLimitLayer`]: the tower layer, its service and its future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use metrics::{Counter, Unit};
use pin_project_lite::pin_project;
use tower::{Layer, Service};

use super::body::RateLimitBody;
use super::cost::CostExtractor;
use super::headers::{self, HeaderSet, NotPrintable};
use super::key::KeyExtractor;
use super::rejection::{Denied, OnDenied};
use super::request::RequestParts;
use super::{grpc, problem, Limiter};
use crate::decision::Decision;
use crate::error::CostError;
use crate::multi::MultiDecision;

/// What the layer does when its limiter fails (a Redis limiter whose store
/// is down): a real policy choice, between availability (fail open) and
/// protection (fail closed).
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
    /// The policy name cannot be written in a header: it holds a
    /// character that is not printable ASCII.
    #[error(
        "the policy name {name:?} cannot go in a RateLimit header: {}",
        NotPrintable(*character)
    )]
    BadName {
        /// The name given.
        name: String,
        /// Its first character that is not printable ASCII.
        character: char,
    },
    /// [`policy_names`](RateLimitLayerBuilder::policy_names) gave a name
    /// count that is not the limiter's quota count.
    #[error(
        "{} for a limiter of {}: give one name per quota",
        crate::error::plural(*given, "policy name"),
        crate::error::plural(*quotas, "quota")
    )]
    PolicyNameCount {
        /// Names given.
        given: usize,
        /// Quotas the limiter enforces.
        quotas: usize,
    },
}

/// The name of the metric the layer counts decisions in.
///
/// One counter per outcome, labelled `limiter` (the policy name), `route`
/// and `outcome`: `allowed`, `denied`, `shadow_denied` (denied by a layer
/// in [shadow mode](RateLimitLayerBuilder::shadow), and let through),
/// `bad_key` (refused by the key policy), `bad_cost` (a cost that could not
/// be read, or 0), `too_costly` (a cost above a limit's capacity, which no
/// wait can meet) or `limiter_error`.
pub const DECISIONS_METRIC: &str = "turnstile_http_decisions_total";

/// The counters of one layer.
#[derive(Clone, Debug)]
struct Counters {
    allowed: Counter,
    denied: Counter,
    shadow_denied: Counter,
    bad_key: Counter,
    bad_cost: Counter,
    too_costly: Counter,
    limiter_error: Counter,
}

/// The counters' labels, and the handles, resolved at the first request
/// rather than when the layer is built: a recorder installed after the
/// layers (but before traffic) still gets every count.
#[derive(Debug)]
struct Metrics {
    limiter: String,
    route: String,
    counters: OnceLock<Counters>,
}

impl Metrics {
    fn get(&self) -> &Counters {
        self.counters.get_or_init(|| {
            // The recorder keeps the last description; describing once per
            // layer is cheap and keeps the text next to the series.
            metrics::describe_counter!(
                DECISIONS_METRIC,
                Unit::Count,
                "Requests seen by turnstile's HTTP rate-limit layer, by policy (limiter), \
                 route and outcome: allowed, denied, shadow_denied (denied in shadow \
                 mode and let through), bad_key (refused by the key policy), \
                 bad_cost (no readable cost, or 0), too_costly (a cost above a limit's \
                 capacity), limiter_error (the limiter could not decide)"
            );
            Counters::new(&self.limiter, &self.route)
        })
    }
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
            shadow_denied: counter("shadow_denied"),
            bad_key: counter("bad_key"),
            bad_cost: counter("bad_cost"),
            too_costly: counter("too_costly"),
            limiter_error: counter("limiter_error"),
        }
    }
}

struct Shared<L> {
    limiter: L,
    name: String,
    /// One name per quota of the limiter, in its order (unquoted, for the
    /// denial body).
    policies: Vec<String>,
    key: KeyExtractor,
    /// `None`: every request costs 1.
    cost: Option<CostExtractor>,
    headers: HeaderSet,
    on_error: OnLimiterError,
    on_denied: OnDenied,
    shadow: bool,
    metrics: Metrics,
}

impl<L: Limiter> Shared<L> {
    /// The rate-limit fields for `decision` (binding limit `binding`), with
    /// `RateLimit-Policy` for the limiter's quotas now: rendered again
    /// after a quota change, on the first response that follows it.
    ///
    /// A fallback decision made by a local limiter is described by that
    /// limiter's quota and bucket, not the store's it stands in for.
    fn write_headers(&self, decision: &Decision, binding: usize, headers: &mut http::HeaderMap) {
        // A local limiter's decision carries its burst as the limit; a
        // cost above that burst is denied by the store's closed rule, with
        // the store's burst, and describes no local bucket.
        let local = decision
            .is_fallback()
            .then(|| self.limiter.fallback_quota())
            .flatten()
            .filter(|quota| quota.burst_size() == decision.limit());
        if let Some(quota) = local {
            let policy = self.headers.fallback_policy(binding, quota);
            self.headers
                .write_described(policy, decision, binding, true, headers);
            return;
        }
        let policy = self
            .headers
            .policy(self.limiter.quota_version(), || self.limiter.quotas());
        self.headers.write(policy, decision, binding, headers);
    }

    /// The answer to a cost above the capacity of one of the limits: `413
    /// Content Too Large` (a gRPC `RESOURCE_EXHAUSTED` that asks not to be
    /// retried), naming the policy whose burst the cost exceeds, with
    /// `RateLimit-Policy` and no `Retry-After`: no wait would help.
    fn too_costly(&self, grpc: bool, cost: u64, capacity: u64) -> Response<Bytes> {
        let quotas = self.limiter.quotas();
        let binding = quotas
            .iter()
            .position(|quota| quota.burst_size() == capacity)
            .unwrap_or(0);
        let policy = self.policies.get(binding).unwrap_or(&self.name);
        let detail = format!(
            "a cost of {cost} can never be met: policy \"{policy}\" admits at most \
             {capacity} at once"
        );
        let mut response = if grpc {
            grpc::never_retry(grpc::status_response(grpc::RESOURCE_EXHAUSTED, &detail))
        } else {
            let members = problem::Members::TooCostly {
                policy,
                cost,
                capacity,
            };
            problem::response(StatusCode::PAYLOAD_TOO_LARGE, &detail, Some(members))
        };
        let policy = self.headers.policy(self.limiter.quota_version(), || quotas);
        self.headers.write_policy(policy, response.headers_mut());
        response
    }
}

/// A tower [`Layer`] that rate-limits requests: keys each request
/// ([`KeyExtractor`]), asks the [`Limiter`], and answers a denial with
/// `429 Too Many Requests`, `Retry-After` and an `application/problem+json`
/// body; every response it lets through gets the rate-limit headers (see
/// [`headers`](super::headers)).
///
/// One layer enforces its limiter's policies: one quota, or several all
/// or nothing with a [`KeyedMultiLimiter`](crate::KeyedMultiLimiter) (a
/// request one limit denies spends no token of the others; stacking two
/// layers would spend the outer one's). Per-route quotas are one layer per
/// route (in axum, `route_layer`, so that requests no handler takes, such
/// as a `405`, spend no token); see the [module docs](super).
///
/// Responses carry a [`RateLimitBody`]: the inner service's body passed
/// through, or the layer's own answer, so any body type works (axum's,
/// tonic's, hyper's). The inner service must be [`Clone`] (axum's and
/// tonic's are). gRPC calls are recognised by their `content-type` and
/// refused with a gRPC status (see [`http`](super#grpc)).
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
            .field("shadow", &self.shared.shadow)
            .finish_non_exhaustive()
    }
}

impl<L: Limiter> RateLimitLayer<L> {
    /// A builder: policy name `"default"`, keyed by client address,
    /// IETF headers on, `X-RateLimit-*` off, failing closed with `503`,
    /// the default denial response, enforcing (not in shadow mode).
    pub fn builder(limiter: L) -> RateLimitLayerBuilder<L> {
        RateLimitLayerBuilder {
            limiter,
            name: "default".to_owned(),
            policy_names: None,
            route: None,
            key: KeyExtractor::peer_ip(),
            cost: None,
            ietf_headers: true,
            x_ratelimit_headers: false,
            on_error: OnLimiterError::default(),
            on_denied: OnDenied::default(),
            shadow: false,
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
    policy_names: Option<Vec<String>>,
    route: Option<String>,
    key: KeyExtractor,
    cost: Option<CostExtractor>,
    ietf_headers: bool,
    x_ratelimit_headers: bool,
    on_error: OnLimiterError,
    on_denied: OnDenied,
    shadow: bool,
}

impl<L> fmt::Debug for RateLimitLayerBuilder<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayerBuilder")
            .field("name", &self.name)
            .field("route", &self.route)
            .field("key", &self.key)
            .field("cost", &self.cost)
            .field("ietf_headers", &self.ietf_headers)
            .field("x_ratelimit_headers", &self.x_ratelimit_headers)
            .field("on_error", &self.on_error)
            .field("on_denied", &self.on_denied)
            .field("shadow", &self.shadow)
            .finish_non_exhaustive()
    }
}

impl<L: Limiter> RateLimitLayerBuilder<L> {
    /// The policy's name, in `RateLimit-Policy`, `RateLimit` and the
    /// metrics' `limiter` label (printable ASCII). A limiter of several
    /// quotas names its policies `name-0`, `name-1`, ... unless
    /// [`policy_names`](Self::policy_names) says otherwise.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// One name per quota of the limiter, in its order, for the headers
    /// and the denial body (printable ASCII); the metrics keep the layer's
    /// [`name`](Self::name). [`build`](Self::build) fails if the count is
    /// not the limiter's quota count.
    ///
    /// ```
    /// use turnstile_rl::http::{HttpKey, RateLimitLayer};
    /// use turnstile_rl::KeyedMultiLimiter;
    ///
    /// let limiter = KeyedMultiLimiter::<HttpKey>::new("10/s burst 20; 1000/h".parse()?);
    /// let layer = RateLimitLayer::builder(limiter)
    ///     .name("search")
    ///     .policy_names(["search-burst", "search-hourly"])
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn policy_names<N: Into<String>>(mut self, names: impl IntoIterator<Item = N>) -> Self {
        self.policy_names = Some(names.into_iter().map(Into::into).collect());
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

    /// What each request costs (default: 1 each): one cost for every limit
    /// of the limiter, charged all or nothing. `RateLimit` then counts
    /// what is left after the charge. A cost that cannot be read, or 0, is
    /// a `400`; a cost above a limit's capacity (its burst) can never be
    /// admitted and is a `413` without `Retry-After`, never a `429` (see
    /// the [module docs](super#weighted-requests)).
    ///
    /// ```
    /// use axum::http::HeaderName;
    /// use turnstile_rl::http::{CostExtractor, HttpKey, KeyExtractor, RateLimitLayer};
    /// use turnstile_rl::KeyedLimiter;
    ///
    /// // 1,000 items a minute per API key, whatever the batch sizes.
    /// let layer = RateLimitLayer::builder(KeyedLimiter::<HttpKey>::new("1000/min".parse()?))
    ///     .name("ingest")
    ///     .key(KeyExtractor::header(HeaderName::from_static("x-api-key")))
    ///     .cost(CostExtractor::header(HeaderName::from_static("x-batch-size")))
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cost(mut self, cost: CostExtractor) -> Self {
        self.cost = Some(cost);
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

    /// Builds the response to a denied request (default:
    /// [`Denied::default_response`], problem+json or a gRPC status). The
    /// layer then adds `RateLimit-Policy`, `RateLimit` (and the
    /// `X-RateLimit-*` trio when on) and `Retry-After` from the same
    /// decision, so they always match the policy.
    ///
    /// ```
    /// use turnstile_rl::http::{HttpKey, KeyExtractor, RateLimitLayer};
    /// use turnstile_rl::DirectLimiter;
    /// use axum::http::{Response, StatusCode};
    ///
    /// let layer = RateLimitLayer::builder(DirectLimiter::new("100/s".parse()?))
    ///     .key(KeyExtractor::global())
    ///     .on_denied(|denied| {
    ///         if denied.is_grpc() {
    ///             return denied.default_response();
    ///         }
    ///         let mut response = Response::new(format!(
    ///             "slow down: try again in {} s\n",
    ///             denied.retry_after_secs()
    ///         ).into());
    ///         *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    ///         response
    ///     })
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn on_denied(
        mut self,
        build: impl Fn(&Denied<'_>) -> Response<Bytes> + Send + Sync + 'static,
    ) -> Self {
        self.on_denied = OnDenied::custom(build);
        self
    }

    /// Shadow mode (default off): decide and count every request, write the
    /// rate-limit headers, but let denied requests through, counted as
    /// `outcome="shadow_denied"` and without `Retry-After`. Roll a new
    /// limit out this way, watch what it would refuse, then turn it on.
    pub fn shadow(mut self, on: bool) -> Self {
        self.shadow = on;
        self
    }

    /// The layer. The metrics handles are taken at the first request, so
    /// the `metrics` recorder may be installed before or after the layers
    /// are built, as long as it is before traffic.
    pub fn build(self) -> Result<RateLimitLayer<L>, LayerError> {
        let quotas = self.limiter.quotas();
        let policies = match self.policy_names {
            Some(names) if names.len() != quotas.len() => {
                return Err(LayerError::PolicyNameCount {
                    given: names.len(),
                    quotas: quotas.len(),
                })
            }
            Some(names) => names,
            None if quotas.len() == 1 => vec![self.name.clone()],
            None => (0..quotas.len())
                .map(|i| format!("{}-{i}", self.name))
                .collect(),
        };
        let quoted = policies
            .iter()
            .map(|name| {
                headers::sf_string(name).map_err(|NotPrintable(character)| LayerError::BadName {
                    name: name.clone(),
                    character,
                })
            })
            .collect::<Result<Vec<_>, LayerError>>()?;
        // The layer's own name labels the metrics: check it too.
        headers::sf_string(&self.name).map_err(|NotPrintable(character)| LayerError::BadName {
            name: self.name.clone(),
            character,
        })?;
        let route = self.route.as_deref().unwrap_or(&self.name);
        Ok(RateLimitLayer {
            shared: Arc::new(Shared {
                metrics: Metrics {
                    limiter: self.name.clone(),
                    route: route.to_owned(),
                    counters: OnceLock::new(),
                },
                headers: HeaderSet::new(quoted, self.ietf_headers, self.x_ratelimit_headers),
                limiter: self.limiter,
                name: self.name,
                policies,
                key: self.key,
                cost: self.cost,
                on_error: self.on_error,
                on_denied: self.on_denied,
                shadow: self.shadow,
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
{
    type Response = Response<RateLimitBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, L, ReqB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        let shared = Arc::clone(&self.shared);
        let parts = RequestParts::of(&request);
        let grpc = || grpc::is_grpc(request.headers());
        let key = match shared.key.key(&parts) {
            Ok(key) => key,
            Err((status, error)) => {
                shared.metrics.get().bad_key.increment(1);
                let response = refusal(grpc(), status, &error.to_string());
                return ResponseFuture::ready(shared, response);
            }
        };
        let checked = match &shared.cost {
            None => Ok(shared.limiter.check(&key)),
            Some(cost) => match cost.cost(&parts) {
                Ok(cost) => shared.limiter.check_n(&key, cost),
                Err(error) => {
                    shared.metrics.get().bad_cost.increment(1);
                    let response = refusal(grpc(), StatusCode::BAD_REQUEST, &error.to_string());
                    return ResponseFuture::ready(shared, response);
                }
            },
        };
        // The clone that was made ready is the one that must be called:
        // keep it for the request and leave a fresh clone in its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let state = match checked {
            Ok(check) => State::Checking {
                check,
                pending: Some((inner, request)),
            },
            Err(CostError::ExceedsCapacity { cost, capacity }) => {
                if !shared.shadow {
                    shared.metrics.get().too_costly.increment(1);
                    let response = shared.too_costly(grpc(), cost, capacity);
                    return ResponseFuture::ready(shared, response);
                }
                // Shadow mode lets it through, undecided: no bucket was
                // charged, so no `RateLimit` field describes it.
                shared.metrics.get().shadow_denied.increment(1);
                State::Calling {
                    call: inner.call(request),
                    decision: None,
                }
            }
            Err(error) => {
                shared.metrics.get().bad_cost.increment(1);
                let response = refusal(grpc(), StatusCode::BAD_REQUEST, &error.to_string());
                return ResponseFuture::ready(shared, response);
            }
        };
        ResponseFuture { shared, state }
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
            decision: Option<MultiDecision>,
        },
        Ready {
            response: Option<Response<Bytes>>,
        },
    }
}

impl<S, L, ReqB> ResponseFuture<S, L, ReqB>
where
    S: Service<Request<ReqB>>,
    L: Limiter,
{
    fn ready(shared: Arc<Shared<L>>, response: Response<Bytes>) -> Self {
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
{
    type Output = Result<Response<RateLimitBody<ResB>>, S::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let own = |response: Response<Bytes>| Poll::Ready(Ok(response.map(RateLimitBody::full)));
        loop {
            let this = self.as_mut().project();
            let shared = &**this.shared;
            let next = match this.state.project() {
                StateProj::Checking { check, pending } => {
                    let outcome = ready!(check.poll(cx));
                    let Some((mut inner, request)) = pending.take() else {
                        // Polled again after the check ended: a caller bug
                        // the state machine never causes.
                        return own(after_completion());
                    };
                    // Whether to answer as gRPC is read only when the layer
                    // answers itself: an admitted request pays no lookup.
                    let grpc = || grpc::is_grpc(request.headers());
                    let decision = match outcome {
                        Ok(decision) if decision.is_allowed() => {
                            shared.metrics.get().allowed.increment(1);
                            Some(decision)
                        }
                        Ok(decision) if shared.shadow => {
                            shared.metrics.get().shadow_denied.increment(1);
                            Some(decision)
                        }
                        Ok(decision) => {
                            shared.metrics.get().denied.increment(1);
                            return own(denial(shared, grpc(), &decision));
                        }
                        Err(error) => {
                            shared.metrics.get().limiter_error.increment(1);
                            match shared.on_error {
                                OnLimiterError::Allow => None,
                                OnLimiterError::Reject(status) => {
                                    let detail = format!("rate limiter unavailable: {error}");
                                    return own(refusal(grpc(), status, &detail));
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
                        let binding = decision.binding();
                        let headers = response.headers_mut();
                        shared.write_headers(&decision.decision(), binding, headers);
                    }
                    return Poll::Ready(Ok(response.map(RateLimitBody::inner)));
                }
                StateProj::Ready { response } => {
                    return own(response.take().unwrap_or_else(after_completion));
                }
            };
            self.as_mut().project().state.set(next);
        }
    }
}

/// The answer to a future polled after it completed.
/// The request is gone by then, so it cannot say whether it was gRPC.
fn after_completion() -> Response<Bytes> {
    refusal(
        false,
        StatusCode::INTERNAL_SERVER_ERROR,
        "rate limiter future polled after completion",
    )
}

/// An answer the layer writes itself that is not a denial: problem+json
/// with `status`, or for a gRPC call the closest gRPC status.
fn refusal(grpc: bool, status: StatusCode, detail: &str) -> Response<Bytes> {
    if grpc {
        grpc::status_response(grpc::code_of(status), detail)
    } else {
        problem::response(status, detail, None)
    }
}

/// A denial: the policy's response (default or custom), then the
/// rate-limit fields and `Retry-After` from the same decision.
fn denial<L: Limiter>(shared: &Shared<L>, grpc: bool, multi: &MultiDecision) -> Response<Bytes> {
    let decision = &multi.decision();
    let binding = multi.binding();
    let policy = shared.policies.get(binding).unwrap_or(&shared.name);
    let denied = Denied {
        policy,
        decision,
        grpc,
    };
    let mut response = shared.on_denied.response(&denied);
    shared.write_headers(decision, binding, response.headers_mut());
    headers::write_retry_after(decision, response.headers_mut());
    response
}
