//! turnstile-rls over a real tonic client on loopback, by subject, in one
//! test binary (one link of tonic and envoy-types instead of one each).

mod answers;
mod config_errors;
mod deploy;
mod matching;
mod peer;
mod peer_integration;
mod peer_redis_cache;
mod peer_service;
mod peer_suite;
mod peer_suite_inline;
mod redis_backend;
mod redis_cluster;
mod reload;
mod support;
