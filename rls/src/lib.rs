//! `turnstile-rls`: a rate limit service for Envoy
//! (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`) on
//! turnstile's engine, configured with envoyproxy/ratelimit's YAML.
//!
//! - [`config`]: the YAML files, checked, with errors naming file, line and field;
//! - [`rules`]: the compiled descriptor tree and envoyproxy/ratelimit's lookup;
//! - [`bucket`]: one limit's state, in-process (`KeyedLimiter`) or in Redis;
//! - [`redis_gcra`]: GCRA in Redis, a request's descriptors in one script call;
//! - [`engine`]: the live rules, reloads, and the answer to a request;
//! - [`service`]: the gRPC service; [`server`]: listeners and SIGHUP;
//! - [`window`], [`redis_windows`]: envoyproxy/ratelimit's fixed windows, here or in Redis;
//! - [`over_limit_cache`]: keys Redis refused, answered here until their refusal ends;
//! - [`stats`]: the Prometheus metrics; [`settings`]: flags and environment;
//! - [`peer_env`]: envoyproxy/ratelimit's environment variables as defaults;
//! - [`watch`]: reloads when the configuration directory changes;
//! - [`logging`]: the `tracing` log, text or JSON; [`redis_health`]: Redis lost and back, in it;
//! - [`load`]: the load test behind `benches/load.rs`.
//!
//! rls/README.md says how to run it and point Envoy at it.

pub mod bucket;
pub mod config;
pub mod engine;
pub mod load;
pub mod logging;
pub mod over_limit_cache;
pub mod peer_env;
pub mod redis_gcra;
pub mod redis_health;
pub mod redis_windows;
pub mod rules;
pub mod server;
pub mod service;
pub mod settings;
pub mod stats;
pub mod watch;
pub mod window;

pub use engine::Engine;
pub use server::{start, RunningService, StartError};
pub use settings::Settings;
