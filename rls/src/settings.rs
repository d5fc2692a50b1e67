//! The service's own settings: command-line flags, each also read from an
//! environment variable (`TURNSTILE_RLS_*`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use crate::config::{Algorithm, LoadOptions};

/// `turnstile-rls`: a rate limit service for Envoy.
#[derive(Clone, Debug, Parser)]
#[command(name = "turnstile-rls", version, about)]
pub struct Settings {
    /// A directory of envoyproxy/ratelimit YAML files (one domain each), or
    /// one file (envoyproxy/ratelimit's variables give
    /// `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY` by default).
    #[arg(long, env = "TURNSTILE_RLS_CONFIG")]
    pub config: PathBuf,
    /// Where the gRPC services (rate limit, health) listen.
    #[arg(
        long,
        env = "TURNSTILE_RLS_GRPC_ADDR",
        default_value = "127.0.0.1:8081"
    )]
    pub grpc_addr: SocketAddr,
    /// Where the HTTP `/metrics` endpoint (Prometheus text) listens.
    #[arg(
        long,
        env = "TURNSTILE_RLS_METRICS_ADDR",
        default_value = "127.0.0.1:6070"
    )]
    pub metrics_addr: SocketAddr,
    /// Where the buckets live: in this process, or in Redis for a fleet.
    #[arg(long, env = "TURNSTILE_RLS_BACKEND", value_enum, default_value_t = BackendName::Memory)]
    pub backend: BackendName,
    /// The most distinct request values each in-process limit tracks
    /// (and each Redis limit's local fallback); past it, the fullest
    /// buckets are forgotten first.
    #[arg(long, env = "TURNSTILE_RLS_MAX_KEYS", default_value_t = turnstile_rl::keyed::DEFAULT_MAX_KEYS)]
    pub max_keys: usize,
    /// The Redis server (`--backend redis`); with `--redis-type cluster`,
    /// a comma-separated list of some of the Cluster's nodes
    /// (`redis://host:port` or `host:port`), from which it learns the rest.
    #[arg(
        long,
        env = "TURNSTILE_RLS_REDIS_URL",
        default_value = "redis://127.0.0.1:6379"
    )]
    pub redis_url: String,
    /// `single`: one Redis server; `cluster`: a Redis Cluster (which must
    /// be up when the service starts, to learn its slots).
    /// Environment: also `REDIS_TYPE`, as envoyproxy/ratelimit names it.
    #[arg(long, env = "TURNSTILE_RLS_REDIS_TYPE", value_enum, default_value_t = RedisType::Single)]
    pub redis_type: RedisType,
    /// Prefix of every Redis key.
    #[arg(
        long,
        env = "TURNSTILE_RLS_REDIS_PREFIX",
        default_value = "turnstile-rls:"
    )]
    pub redis_prefix: String,
    /// Timeout of one Redis call, in milliseconds.
    #[arg(long, env = "TURNSTILE_RLS_REDIS_TIMEOUT_MS", default_value_t = 20)]
    pub redis_timeout_ms: u64,
    /// What a descriptor gets when Redis cannot answer.
    #[arg(long, env = "TURNSTILE_RLS_REDIS_FAILURE_POLICY", value_enum, default_value_t = FailurePolicyName::Open)]
    pub redis_failure_policy: FailurePolicyName,
    /// GCRA in Redis: take up to this many tokens of a key per Redis call
    /// and spend them here, so a hot key costs one call per lease, not per
    /// decision (at most `instances x (lease - 1)` admissions over the
    /// limit in any window); 0 (the default): one call per decision.
    #[arg(long, env = "TURNSTILE_RLS_REDIS_LEASE", default_value_t = 0)]
    pub redis_lease: u64,
    /// Add the IETF `RateLimit` and `RateLimit-Policy` headers to every answer.
    #[arg(long, env = "TURNSTILE_RLS_RESPONSE_HEADERS")]
    pub response_headers: bool,
    /// Global shadow mode: count everything, refuse nothing.
    #[arg(long, env = "TURNSTILE_RLS_SHADOW_MODE")]
    pub shadow_mode: bool,
    /// The share of a limit past which hits count as `near_limit`.
    #[arg(long, env = "TURNSTILE_RLS_NEAR_LIMIT_RATIO", default_value_t = 0.8)]
    pub near_limit_ratio: f64,
    /// The algorithm of limits that name none: `gcra` (refills evenly; a
    /// refused request costs nothing) or `fixed_window` (envoyproxy/ratelimit's
    /// numbers exactly).
    #[arg(long, env = "TURNSTILE_RLS_DEFAULT_ALGORITHM", value_enum, default_value_t = Algorithm::Gcra)]
    pub default_algorithm: Algorithm,
    /// Fixed windows: when a descriptor of a request goes over, the others
    /// of that request are not charged (envoyproxy/ratelimit's setting; by
    /// default every hit counts, refused or not).
    /// Environment: `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`, as envoyproxy/ratelimit names it.
    #[arg(long)]
    pub stop_cache_key_increment_when_overlimit: bool,
    /// Files naming one domain merge their descriptors instead of being an error.
    /// Environment: `MERGE_DOMAIN_CONFIG`, as envoyproxy/ratelimit names it.
    #[arg(long)]
    pub merge_domain_config: bool,
    /// Every descriptor is in quota mode: the request is refused only when
    /// all quota descriptors are over their limits.
    /// Environment: `QUOTA_MODE`, as envoyproxy/ratelimit names it.
    #[arg(long)]
    pub quota_mode: bool,
    /// Add envoyproxy/ratelimit's three headers (limit, remaining, reset
    /// of the descriptor closest to its limit) to every answer.
    /// Environment: `LIMIT_RESPONSE_HEADERS_ENABLED`, as envoyproxy/ratelimit names it.
    #[arg(long)]
    pub limit_response_headers: bool,
    /// The limit header's name.
    /// Environment: `LIMIT_LIMIT_HEADER`, as envoyproxy/ratelimit names it.
    #[arg(long, default_value = "RateLimit-Limit")]
    pub limit_limit_header: String,
    /// The remaining header's name.
    /// Environment: `LIMIT_REMAINING_HEADER`, as envoyproxy/ratelimit names it.
    #[arg(long, default_value = "RateLimit-Remaining")]
    pub limit_remaining_header: String,
    /// The reset header's name.
    /// Environment: `LIMIT_RESET_HEADER`, as envoyproxy/ratelimit names it.
    #[arg(long, default_value = "RateLimit-Reset")]
    pub limit_reset_header: String,
    /// How often the configuration directory is checked for changes, in
    /// milliseconds (a change reloads it, as SIGHUP does); 0: never.
    #[arg(long, env = "TURNSTILE_RLS_WATCH_INTERVAL_MS", default_value_t = 1000)]
    pub watch_interval_ms: u64,
    /// With Redis, keys Redis answered over their limit are answered over
    /// their limit here, with no Redis call, until their window or refusal
    /// ends, in a cache of about this many bytes (envoyproxy/ratelimit's
    /// setting); 0 (the default): off.
    /// Environment: `LOCAL_CACHE_SIZE_IN_BYTES`, as envoyproxy/ratelimit names it.
    #[arg(long, default_value_t = 0)]
    pub local_cache_size_in_bytes: usize,
    /// Fixed windows in Redis: the prefix of every key (the peer's
    /// `CACHE_KEY_PREFIX`; keys are then the peer's own).
    /// Environment: `CACHE_KEY_PREFIX`, as envoyproxy/ratelimit names it.
    #[arg(long, default_value = "")]
    pub cache_key_prefix: String,
    /// Fixed windows in Redis: each key expires a window's length plus a
    /// random part of up to this many seconds.
    /// Environment: `EXPIRATION_JITTER_MAX_SECONDS`, as envoyproxy/ratelimit names it.
    #[arg(long, default_value_t = 300)]
    pub expiration_jitter_max_seconds: u64,
    /// The least severe log events written: trace, debug, info, warn,
    /// error (envoyproxy/ratelimit's `LOG_LEVEL` names).
    #[arg(long, env = "TURNSTILE_RLS_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// `text` or `json` (one object a line).
    #[arg(long, env = "TURNSTILE_RLS_LOG_FORMAT", default_value = "text")]
    pub log_format: String,
}

/// `--backend`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendName {
    /// One `KeyedLimiter` per configured limit, in this process.
    Memory,
    /// One `RedisLimiter` per configured limit.
    Redis,
}

/// `--redis-type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RedisType {
    /// One server.
    Single,
    /// A Redis Cluster: keys spread over its masters by hash slot.
    Cluster,
}

/// `--redis-failure-policy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FailurePolicyName {
    /// Allow (Envoy's own default when the service fails).
    Open,
    /// Refuse.
    Closed,
    /// Decide in this process, each instance alone, with the same quota.
    Local,
}

/// The backend part of the settings, as the limits are built from it.
#[derive(Clone, Debug, PartialEq)]
pub enum BackendSettings {
    /// In-process buckets.
    InProcess {
        /// `--max-keys`.
        max_keys: usize,
    },
    /// Redis buckets.
    Redis(RedisSettings),
}

/// `--redis-*`.
#[derive(Clone, Debug, PartialEq)]
pub struct RedisSettings {
    /// `--redis-url`.
    pub url: String,
    /// `--redis-type`.
    pub redis_type: RedisType,
    /// `--redis-prefix`.
    pub prefix: String,
    /// `--redis-timeout-ms`.
    pub timeout: Duration,
    /// `--redis-failure-policy`.
    pub failure_policy: FailurePolicyName,
    /// `--max-keys`, for the local fallback.
    pub max_keys: usize,
    /// `--redis-lease`: tokens per lease (0 or 1: no leases).
    pub lease: u64,
}

impl RedisSettings {
    /// The Cluster's seed nodes of `--redis-url` as URLs: split at commas,
    /// a bare `host:port` given the `redis://` scheme.
    pub fn cluster_nodes(&self) -> Vec<String> {
        self.url
            .split(',')
            .map(str::trim)
            .filter(|node| !node.is_empty())
            .map(|node| match node.contains("://") {
                true => node.to_owned(),
                false => format!("redis://{node}"),
            })
            .collect()
    }
}

impl Settings {
    /// Settings for `config` with every default (what tests start from).
    pub fn new(config: impl Into<PathBuf>) -> Settings {
        Settings::parse_from([
            "turnstile-rls".as_ref(),
            "--config".as_ref(),
            config.into().as_os_str(),
        ])
    }

    /// How the configuration directory is read.
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            merge_domains: self.merge_domain_config,
            default_algorithm: self.default_algorithm,
        }
    }

    /// The backend the limits are built on.
    pub fn backend_settings(&self) -> BackendSettings {
        match self.backend {
            BackendName::Memory => BackendSettings::InProcess {
                max_keys: self.max_keys,
            },
            BackendName::Redis => BackendSettings::Redis(RedisSettings {
                url: self.redis_url.clone(),
                redis_type: self.redis_type,
                prefix: self.redis_prefix.clone(),
                timeout: Duration::from_millis(self.redis_timeout_ms),
                failure_policy: self.redis_failure_policy,
                max_keys: self.max_keys,
                lease: self.redis_lease,
            }),
        }
    }
}
