//! HTTP rate limiting as a tower layer (feature `tower`): axum, hyper and
//! tonic servers all take it.
//!
//! A [`RateLimitLayer`] keys each request ([`KeyExtractor`]: an API key
//! header, a user id from your auth layer, the client address with
//! forwarded headers honoured only from trusted proxies, or a closure),
//! asks a [`Limiter`] (a [`KeyedLimiter`](crate::KeyedLimiter) or
//! [`DirectLimiter`](crate::DirectLimiter) here, a remote one through the
//! same trait), and:
//!
//! - on a denial answers `429 Too Many Requests` with `Retry-After`
//!   (delta-seconds, rounded up) and an `application/problem+json` body,
//!   without calling the service, so refused traffic costs one check;
//! - on every response it lets through writes `RateLimit-Policy` and
//!   `RateLimit` (draft-ietf-httpapi-ratelimit-headers), and optionally the
//!   `X-RateLimit-*` trio ([`headers`]);
//! - counts each outcome in the `metrics` facade ([`DECISIONS_METRIC`]).
//!
//! # Per-route quotas: one layer per route
//!
//! Each route that has a quota gets its own layer, with its own limiter,
//! policy name and key. In axum, put it on the route (`.route(path,
//! handler.layer(layer))`) or on a sub-router with `route_layer`; routes
//! without a layer are not limited. Routes that must share one budget
//! share the limiter through an `Arc`. There is no route table inside the
//! layer: the router already is one.
//!
//! ```
//! use std::net::SocketAddr;
//! use axum::{extract::ConnectInfo, routing::{get, post}, Router};
//! use http::HeaderName;
//! use turnstile::http::{ClientIp, HttpKey, KeyExtractor, RateLimitLayer};
//! use turnstile::KeyedLimiter;
//!
//! // axum hands the peer address over as `ConnectInfo`.
//! let client_ip = ClientIp::new()
//!     .peer_addr_from(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0));
//!
//! // /login: 5 a minute per client address.
//! let login = RateLimitLayer::builder(KeyedLimiter::<HttpKey>::new("5/min".parse()?))
//!     .name("login")
//!     .key(KeyExtractor::peer_ip().client_ip(client_ip))
//!     .build()?;
//!
//! // /api: 100 a minute per API key.
//! let api = RateLimitLayer::builder(KeyedLimiter::<HttpKey>::new("100/min".parse()?))
//!     .name("api")
//!     .key(KeyExtractor::header(HeaderName::from_static("x-api-key")))
//!     .x_ratelimit_headers(true)
//!     .build()?;
//!
//! let app: Router = Router::new()
//!     .route("/login", post(|| async { "welcome" }).layer(login))
//!     .route("/api", get(|| async { "data" }).layer(api))
//!     .route("/health", get(|| async { "ok" }));
//! // axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
//! # let _ = app;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What each case answers
//!
//! | case | status | body | headers |
//! |------|--------|------|---------|
//! | allowed | the service's | the service's | `RateLimit-Policy`, `RateLimit` (+ trio) |
//! | denied | `429` | problem+json with `policy`, `retry_after` | the same, and `Retry-After` |
//! | missing or malformed key | [`OnBadKey`]: `400` by default, or counted against the client address | problem+json naming the problem | none |
//! | no peer address from the server | `500` | problem+json | none |
//! | the limiter failed | [`OnLimiterError`]: `503` by default, or passed on | problem+json | none |

pub mod headers;
pub mod key;
mod layer;
mod limiter;
mod problem;

pub use key::{
    ClientIp, HttpKey, KeyError, KeyExtractor, OnBadKey, PeerAddr, RequestParts,
    DEFAULT_MAX_KEY_LEN, X_FORWARDED_FOR,
};
pub use layer::{
    LayerError, OnLimiterError, RateLimit, RateLimitLayer, RateLimitLayerBuilder, ResponseFuture,
    DECISIONS_METRIC,
};
pub use limiter::Limiter;
pub use problem::PROBLEM_JSON;
