//! envoyproxy/ratelimit's environment variables, read as the defaults of
//! this service's settings: a container or unit written for the peer
//! works unchanged, and a flag or a `TURNSTILE_RLS_*` variable still wins.
//!
//! Each is turned into the value of one of [`Settings`]' arguments, with
//! the peer's defaults (`settings.go`) for the variables it combines.

use clap::{CommandFactory, FromArgMatches};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use crate::settings::Settings;

/// Why the peer's variables could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PeerEnvError {
    /// A variable holds a value the peer would refuse too.
    #[error("environment variable {name}={value:?}: {expected}")]
    Invalid {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What it should be.
        expected: &'static str,
    },
    /// The command line (or a `TURNSTILE_RLS_*` variable) is wrong.
    #[error(transparent)]
    Args(#[from] clap::Error),
}

impl Settings {
    /// The settings of the command line `args`, the `TURNSTILE_RLS_*`
    /// variables, and envoyproxy/ratelimit's variables (read with `env`)
    /// as defaults.
    pub fn parse_with_peer_env<I, T>(
        args: I,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Settings, PeerEnvError>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let mut command = Settings::command();
        for (arg, value) in peer_defaults(&env)? {
            // clap keeps a default as `&'static str`; these are read once
            // per process start.
            let value: &'static str = Box::leak(value.into_boxed_str());
            command = command.mut_arg(arg, |a| a.default_value(value).required(false));
        }
        let matches = command.try_get_matches_from(args)?;
        Ok(Settings::from_arg_matches(&matches)?)
    }
}

/// The peer's variables that are set, as (argument id, value).
fn peer_defaults(
    env: &impl Fn(&str) -> Option<String>,
) -> Result<Vec<(&'static str, String)>, PeerEnvError> {
    let mut out = Vec::new();
    let var = |name: &str| env(name).filter(|v| !v.is_empty());
    // The runtime directory: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY.
    let root = var("RUNTIME_ROOT").unwrap_or_else(|| "/srv/runtime_data/current".into());
    let mut config = std::path::PathBuf::from(root);
    if let Some(sub) = var("RUNTIME_SUBDIRECTORY") {
        config.push(sub);
    }
    config.push(var("RUNTIME_APPDIRECTORY").unwrap_or_else(|| "config".into()));
    out.push(("config", config.to_string_lossy().into_owned()));
    // Listeners: the peer binds every interface; only when a manifest
    // names a host or port, so a bare start stays on loopback.
    for (arg, host, port, default_port) in [
        ("grpc_addr", "GRPC_HOST", "GRPC_PORT", "8081"),
        ("metrics_addr", "DEBUG_HOST", "DEBUG_PORT", "6070"),
    ] {
        if var(host).is_some() || var(port).is_some() {
            let host = var(host).unwrap_or_else(|| "0.0.0.0".into());
            let port = var(port).unwrap_or_else(|| default_port.into());
            out.push((arg, format!("{host}:{port}")));
        }
    }
    // Redis: REDIS_TYPE is `single` (the peer's default) or `cluster`.
    let cluster = match var("REDIS_TYPE").map(|t| t.to_ascii_lowercase()).as_deref() {
        None | Some("single") => false,
        Some("cluster") => true,
        Some(_) => {
            let value = var("REDIS_TYPE").unwrap_or_default();
            let sentinel = value.eq_ignore_ascii_case("sentinel");
            return Err(PeerEnvError::Invalid {
                name: "REDIS_TYPE",
                value,
                expected: match sentinel {
                    true => "single or cluster (turnstile-rls does not support Redis Sentinel: give REDIS_URL the master's address, or use a Cluster)",
                    false => "single or cluster",
                },
            });
        }
    };
    if cluster {
        out.push(("redis_type", "cluster".into()));
    }
    // REDIS_URL is a host:port (tcp) or a socket path (unix, the peer's
    // default socket type), or for a Cluster a comma-separated list of
    // host:port (always tcp there, as the peer's Cluster client dials);
    // the peer's backend is Redis by default.
    if let Some(url) = var("REDIS_URL") {
        let socket = var("REDIS_SOCKET_TYPE").unwrap_or_else(|| "unix".into());
        // REDIS_AUTH: `password` or `user:password`, as the peer splits it
        // (a full URL carries its own credentials).
        let auth = var("REDIS_AUTH").map(|auth| match auth.split_once(':') {
            Some((user, pass)) => (Some(url_part(user)), url_part(pass)),
            None => (None, url_part(&auth)),
        });
        let tcp = |node: &str| match &auth {
            _ if node.contains("://") => node.to_owned(),
            Some((user, pass)) => {
                format!(
                    "redis://{}:{pass}@{node}",
                    user.as_deref().unwrap_or_default()
                )
            }
            None => format!("redis://{node}"),
        };
        let url = match socket.to_ascii_lowercase().as_str() {
            _ if cluster => url
                .split(',')
                .map(str::trim)
                .map(tcp)
                .collect::<Vec<_>>()
                .join(","),
            _ if url.contains("://") => url,
            "tcp" => tcp(&url),
            "unix" => match auth {
                Some((Some(user), pass)) => format!("redis+unix://{url}?user={user}&pass={pass}"),
                Some((None, pass)) => format!("redis+unix://{url}?pass={pass}"),
                None => format!("redis+unix://{url}"),
            },
            _ => {
                return Err(PeerEnvError::Invalid {
                    name: "REDIS_SOCKET_TYPE",
                    value: socket,
                    expected: "tcp or unix",
                })
            }
        };
        out.push(("redis_url", url));
        if var("BACKEND_TYPE").is_none() {
            out.push(("backend", "redis".into()));
        }
    }
    if let Some(backend) = var("BACKEND_TYPE") {
        match backend.as_str() {
            "redis" => out.push(("backend", "redis".into())),
            _ => return Err(PeerEnvError::Invalid {
                name: "BACKEND_TYPE",
                value: backend,
                expected:
                    "redis (turnstile-rls has no memcache backend; unset it for the in-process one)",
            }),
        }
    }
    if let Some(level) = var("LOG_LEVEL") {
        out.push(("log_level", level));
    }
    if let Some(format) = var("LOG_FORMAT") {
        out.push(("log_format", format));
    }
    if let Some(value) = var("SHADOW_MODE") {
        out.push(("shadow_mode", go_bool("SHADOW_MODE", value)?));
    }
    if let Some(ratio) = var("NEAR_LIMIT_RATIO") {
        out.push(("near_limit_ratio", ratio));
    }
    // The peer's settings of the same meaning here: read through `env` as
    // every variable above (not by the command line parser from the
    // process' environment), so `env` is the only source of the peer's
    // variables, and booleans read as the peer reads them.
    for (arg, name) in [
        (
            "stop_cache_key_increment_when_overlimit",
            "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
        ),
        ("merge_domain_config", "MERGE_DOMAIN_CONFIG"),
        ("quota_mode", "QUOTA_MODE"),
        ("limit_response_headers", "LIMIT_RESPONSE_HEADERS_ENABLED"),
    ] {
        if let Some(value) = var(name) {
            out.push((arg, go_bool(name, value)?));
        }
    }
    for (arg, name) in [
        ("limit_limit_header", "LIMIT_LIMIT_HEADER"),
        ("limit_remaining_header", "LIMIT_REMAINING_HEADER"),
        ("limit_reset_header", "LIMIT_RESET_HEADER"),
        ("local_cache_size_in_bytes", "LOCAL_CACHE_SIZE_IN_BYTES"),
        ("cache_key_prefix", "CACHE_KEY_PREFIX"),
        (
            "expiration_jitter_max_seconds",
            "EXPIRATION_JITTER_MAX_SECONDS",
        ),
    ] {
        if let Some(value) = var(name) {
            out.push((arg, value));
        }
    }
    if let Some(value) = var("RUNTIME_WATCH_ROOT") {
        // Either way the directory itself is polled, targets of symlinks
        // included; read so that a bad value is refused as the peer does.
        go_bool("RUNTIME_WATCH_ROOT", value)?;
    }
    if let Some(value) = var("RUNTIME_IGNOREDOTFILES") {
        go_bool("RUNTIME_IGNOREDOTFILES", value)?;
    }
    Ok(out)
}

/// Every byte but the URL-safe ones (letters, digits, `-._~`).
const URL_PART: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `text` with every byte but URL-safe ones as `%XX`, for a URL's user
/// and password (the Redis client decodes them).
fn url_part(text: &str) -> String {
    utf8_percent_encode(text, URL_PART).to_string()
}

/// Go's `strconv.ParseBool`, as the peer reads its booleans.
fn go_bool(name: &'static str, value: String) -> Result<String, PeerEnvError> {
    match value.as_str() {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok("true".into()),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok("false".into()),
        _ => Err(PeerEnvError::Invalid {
            name,
            value,
            expected: "a boolean (true, false, 1, 0, t, f)",
        }),
    }
}
