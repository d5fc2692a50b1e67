//! HTTP and gRPC rate limiting as a tower layer (feature `tower`): axum,
//! hyper and tonic servers all take it.
//!
//! A [`RateLimitLayer`] keys each request ([`KeyExtractor`]: an API key
//! header, a user id from your auth layer, the client address with
//! forwarded headers honoured only from trusted proxies, or a closure),
//! asks a [`Limiter`] (a [`KeyedLimiter`](crate::KeyedLimiter) or
//! [`DirectLimiter`](crate::DirectLimiter) here, a remote one through the
//! same trait), and:
//!
//! - on a denial answers `429 Too Many Requests` with `Retry-After`
//!   (delta-seconds, rounded up) and an `application/problem+json` body
//!   (or a gRPC `RESOURCE_EXHAUSTED` status to a gRPC call; or your own
//!   response), without calling the service, so refused traffic costs one
//!   check;
//! - on every response it lets through writes `RateLimit-Policy` and
//!   `RateLimit` (draft-ietf-httpapi-ratelimit-headers), and optionally the
//!   `X-RateLimit-*` trio ([`headers`]);
//! - counts each outcome in the `metrics` facade ([`DECISIONS_METRIC`]).
//!
//! # Per-route quotas: one layer per route, with `route_layer`
//!
//! Each route that has a quota gets its own layer, with its own limiter,
//! policy name and key. In axum, put it on the route with **`route_layer`**,
//! not `layer`: `post(handler).layer(l)` also wraps the method router's
//! fallback, so a `GET` to a `POST`-only path would spend a token on its
//! `405`; `route_layer` runs only when a handler matches (a route made with
//! `any(..)` has no method to miss: there, axum wants `layer`). Routes without a
//! layer are not limited. Routes that must share one budget share the
//! limiter through an `Arc`. There is no route table inside the layer: the
//! router already is one.
//!
//! ```
//! use axum::{http::HeaderName, routing::{get, post}, Router};
//! use turnstile_rl::http::{HttpKey, KeyExtractor, RateLimitLayer};
//! use turnstile_rl::{DirectLimiter, KeyedLimiter};
//!
//! // /login: 5 a minute per client address (the default key; with the
//! // `axum` feature the address comes from axum's ConnectInfo).
//! let login = RateLimitLayer::builder(KeyedLimiter::<HttpKey>::new("5/min".parse()?))
//!     .name("login")
//!     .build()?;
//!
//! // /api: 100 a minute per API key.
//! let api = RateLimitLayer::builder(KeyedLimiter::<HttpKey>::new("100/min".parse()?))
//!     .name("api")
//!     .key(KeyExtractor::header(HeaderName::from_static("x-api-key")))
//!     .x_ratelimit_headers(true)
//!     .build()?;
//!
//! // /search: 1,000 a second for everyone together, in shadow mode while
//! // the limit is new (counted, never refused).
//! let search = RateLimitLayer::builder(DirectLimiter::new("1000/s".parse()?))
//!     .name("search")
//!     .key(KeyExtractor::global())
//!     .shadow(true)
//!     .build()?;
//!
//! let app: Router = Router::new()
//!     .route("/login", post(|| async { "welcome" }).route_layer(login))
//!     .route("/api", get(|| async { "data" }).route_layer(api))
//!     .route("/search", get(|| async { "results" }).route_layer(search))
//!     .route("/health", get(|| async { "ok" }));
//! // axum::serve(listener, app.into_make_service_with_connect_info::<std::net::SocketAddr>())
//! # let _ = app;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What each case answers
//!
//! | case | status | body | headers |
//! |------|--------|------|---------|
//! | allowed | the service's | the service's | `RateLimit-Policy`, `RateLimit` (+ trio) |
//! | denied | `429` | problem+json with `policy`, `retry_after` ([`on_denied`](RateLimitLayerBuilder::on_denied) to change it) | the same, and `Retry-After` |
//! | denied, [shadow mode](RateLimitLayerBuilder::shadow) | the service's | the service's | `RateLimit-Policy`, `RateLimit` (`r=0`) |
//! | missing or malformed key | [`OnBadKey`]: `400` by default, or counted against the client address | problem+json naming the problem | none |
//! | no peer address from the server | `500` | problem+json | none |
//! | the limiter failed | [`OnLimiterError`]: `503` by default, or passed on | problem+json | none |
//! | a [cost](RateLimitLayerBuilder::cost) that cannot be read, or 0 | `400` | problem+json naming the problem | none |
//! | a cost above a limit's capacity | `413` (in shadow mode: the service's) | problem+json with `policy`, `cost`, `capacity` | `RateLimit-Policy`, no `Retry-After` |
//!
//! # gRPC
//!
//! A request with `content-type: application/grpc` is a gRPC call, and is
//! answered as one: `200` with `grpc-status` in the headers and an empty
//! body (Trailers-Only). A denial is `RESOURCE_EXHAUSTED` (code 8) with
//! `retry-after` (seconds) and `grpc-retry-pushback-ms` (milliseconds, what
//! gRPC's retry policy reads) in the metadata, next to `ratelimit-policy`
//! and `ratelimit`, and the exact wait as a `google.rpc.RetryInfo` in the
//! status details (`grpc-status-details-bin`; with tonic-types,
//! `status.get_details_retry_info()`); a refused key is
//! `INVALID_ARGUMENT`, a failed limiter `UNAVAILABLE`. A tonic server takes
//! the layer as `Server::builder().layer(layer)`; tonic's peer address is
//! its `TcpConnectInfo`, read with [`ClientIp::peer_addr_from`]:
//!
//! ```
//! use tonic::codegen::http::HeaderName;
//! use tonic::transport::server::TcpConnectInfo;
//! use turnstile_rl::http::{ClientIp, KeyExtractor};
//!
//! let by_ip = KeyExtractor::peer_ip().client_ip(
//!     ClientIp::new().peer_addr_from(|ext| ext.get::<TcpConnectInfo>()?.remote_addr()),
//! );
//! let by_api_key = KeyExtractor::header(HeaderName::from_static("x-api-key"));
//! # let _ = (by_ip, by_api_key);
//! ```
//!
//! The examples elsewhere in these docs name the `http` crate's types
//! through axum (`axum::http::HeaderName`); tonic re-exports the same
//! crate as `tonic::codegen::http`.
//!
//! # Several limits on one route
//!
//! One layer over a [`KeyedMultiLimiter`](crate::KeyedMultiLimiter) (or a
//! [`MultiLimiter`](crate::MultiLimiter) for a global budget) enforces
//! several limits all or nothing: a request one limit denies spends no
//! token of the others. `RateLimit-Policy` lists every policy (a list, as
//! the IETF draft allows), `RateLimit` carries the binding one (the one the
//! [`MultiDecision`](crate::MultiDecision) names), and `Retry-After` and
//! the body name it. Policies are named `name-0`, `name-1`, ... or as
//! [`policy_names`](RateLimitLayerBuilder::policy_names) says.
//!
//! ```
//! use turnstile_rl::http::{HttpKey, KeyExtractor, RateLimitLayer};
//! use turnstile_rl::KeyedMultiLimiter;
//!
//! let limits = KeyedMultiLimiter::<HttpKey>::new("10/s burst 20; 1000/h".parse()?);
//! let layer = RateLimitLayer::builder(limits)
//!     .name("search")
//!     .key(KeyExtractor::peer_ip())
//!     .build()?;
//! // RateLimit-Policy: "search-0";q=20;w=2, "search-1";q=1000;w=3600
//! # let _ = layer;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Layers can still be stacked: each appends its own items to both
//! fields, but they decide one after the other, so a request the inner
//! layer denies has already spent the outer layer's token.
//!
//! # Weighted requests
//!
//! Without a [`CostExtractor`] every request costs 1. With one
//! ([`RateLimitLayerBuilder::cost`]) a request costs what it weighs: a
//! batch's item count, an upload's bytes, a GraphQL query's complexity, a
//! model call's tokens. The one cost is charged to every limit of the
//! layer, all or nothing, and `RateLimit` counts what is left after it.
//! A cost that fits a limit's bucket but not its tokens now is a `429`
//! whose `Retry-After` is the wait for that many tokens. A cost above a
//! limit's capacity (its burst: `"1000/min"` holds 1,000) can never be
//! admitted, however long the client waits: it is answered `413 Content
//! Too Large` with a problem+json body naming the policy, the cost and
//! the capacity, `RateLimit-Policy`, and no `Retry-After` (a gRPC call gets
//! `RESOURCE_EXHAUSTED` with `grpc-retry-pushback-ms: -1`, which tells
//! gRPC's retry policy not to retry). Give such endpoints a burst that
//! holds their largest request.
//!
//! ```
//! use axum::http::HeaderName;
//! use turnstile_rl::http::{CostExtractor, HttpKey, KeyExtractor, RateLimitLayer};
//! use turnstile_rl::KeyedMultiLimiter;
//!
//! // Tokens of a model call, per API key: 10,000 a minute in bursts of
//! // 2,000, and 100,000 a day, both charged the same cost.
//! let limits = KeyedMultiLimiter::<HttpKey>::new("10000/min burst 2000; 100000/d".parse()?);
//! let layer = RateLimitLayer::builder(limits)
//!     .name("tokens")
//!     .key(KeyExtractor::header(HeaderName::from_static("x-api-key")))
//!     .cost(CostExtractor::header(HeaderName::from_static("x-max-tokens")))
//!     .build()?;
//! // x-max-tokens: 500   -> 200, RateLimit: "tokens-0";r=1500;t=3
//! // x-max-tokens: 5000  -> 413, {"policy":"tokens-0","cost":5000,"capacity":2000,..}
//! # let _ = layer;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Metrics
//!
//! [`DECISIONS_METRIC`] counts every outcome, with a `# HELP` description.
//! The handles are taken from the `metrics` recorder at a layer's first
//! request, so install the recorder before serving traffic; building the
//! layers first is fine. A layer's series appear with its first request.

mod body;
mod client_ip;
mod cost;
mod grpc;
pub mod headers;
mod key;
mod layer;
mod limiter;
mod problem;
mod rejection;
mod request;

pub use body::RateLimitBody;
pub use client_ip::{ClientIp, PeerAddr, X_FORWARDED_FOR, X_REAL_IP};
pub use cost::{BadCost, CostExtractor};
pub use key::{KeyExtractor, OnBadKey, DEFAULT_MAX_KEY_LEN};
pub use layer::{
    LayerError, OnLimiterError, RateLimit, RateLimitLayer, RateLimitLayerBuilder, ResponseFuture,
    DECISIONS_METRIC,
};
pub use limiter::Limiter;
pub use problem::PROBLEM_JSON;
pub use rejection::Denied;
pub use request::{HttpKey, KeyError, RequestParts};
