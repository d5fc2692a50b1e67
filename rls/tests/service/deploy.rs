//! Deployments written for envoyproxy/ratelimit: its environment variables
//! configure the service (flags still win), and the runtime directory is
//! watched: a Kubernetes ConfigMap's symlink swap reloads, a bad file is
//! refused and the previous rules keep serving.

use crate::support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use support::{descriptor, request, sample, settings, start, ConfigDir, Harness};
use turnstile_rls::settings::{BackendName, BackendSettings, RedisType};
use turnstile_rls::Settings;

fn with_env(args: &[&str], vars: &[(&str, &str)]) -> Result<Settings, String> {
    let vars: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let mut argv = vec!["turnstile-rls"];
    argv.extend_from_slice(args);
    Settings::parse_with_peer_env(argv, |name| vars.get(name).cloned()).map_err(|e| e.to_string())
}

#[test]
fn the_peers_variables_configure_the_service_with_its_defaults() {
    let bare = with_env(&[], &[]).expect("the peer's defaults");
    assert_eq!(
        bare.config.to_str(),
        Some("/srv/runtime_data/current/config")
    );
    assert_eq!(
        bare.grpc_addr.to_string(),
        "127.0.0.1:8081",
        "loopback unless asked"
    );
    assert_eq!(bare.backend, BackendName::Memory);

    let peer = with_env(
        &[],
        &[
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("GRPC_PORT", "9081"),
            ("DEBUG_PORT", "9070"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis.internal:6379"),
            ("SHADOW_MODE", "True"),
            ("NEAR_LIMIT_RATIO", "0.5"),
        ],
    )
    .expect("a peer's manifest");
    assert_eq!(peer.config.to_str(), Some("/data/ratelimit/config"));
    assert_eq!(peer.grpc_addr.to_string(), "0.0.0.0:9081");
    assert_eq!(peer.metrics_addr.to_string(), "0.0.0.0:9070");
    assert_eq!(peer.redis_url, "redis://redis.internal:6379");
    assert_eq!(
        peer.backend,
        BackendName::Redis,
        "the peer's backend is Redis"
    );
    assert!(peer.shadow_mode);
    assert_eq!(peer.near_limit_ratio, 0.5);

    let flags = with_env(
        &["--grpc-addr", "127.0.0.1:7000", "--config", "/etc/rls"],
        &[("GRPC_PORT", "9081"), ("RUNTIME_ROOT", "/data")],
    )
    .expect("flags");
    assert_eq!(flags.grpc_addr.to_string(), "127.0.0.1:7000", "a flag wins");
    assert_eq!(flags.config.to_str(), Some("/etc/rls"));

    let bad = with_env(&[], &[("SHADOW_MODE", "yes please")]).expect_err("refused");
    assert!(bad.contains("SHADOW_MODE"), "{bad}");
    let bad =
        with_env(&[], &[("REDIS_URL", "x"), ("REDIS_SOCKET_TYPE", "udp")]).expect_err("refused");
    assert!(bad.contains("REDIS_SOCKET_TYPE"), "{bad}");
}

/// REDIS_AUTH, `password` or `user:password`, goes into the Redis URL as
/// the peer's client uses it, encoded.
#[test]
fn redis_auth_is_put_in_the_redis_url() {
    let url = |socket: &str, auth: &str| {
        let mut vars = vec![
            ("REDIS_URL", "/run/redis.sock"),
            ("REDIS_SOCKET_TYPE", socket),
        ];
        if socket == "tcp" {
            vars[0].1 = "redis.internal:6379";
        }
        if !auth.is_empty() {
            vars.push(("REDIS_AUTH", auth));
        }
        with_env(&[], &vars).expect("a peer's manifest").redis_url
    };
    assert_eq!(
        url("tcp", "password123"),
        "redis://:password123@redis.internal:6379"
    );
    assert_eq!(
        url("tcp", "app:p@ss/w"),
        "redis://app:p%40ss%2Fw@redis.internal:6379"
    );
    assert_eq!(url("tcp", ""), "redis://redis.internal:6379");
    assert_eq!(url("unix", "pw"), "redis+unix:///run/redis.sock?pass=pw");
    assert_eq!(
        url("unix", "app:pw"),
        "redis+unix:///run/redis.sock?user=app&pass=pw"
    );
    let full = with_env(
        &[],
        &[("REDIS_URL", "redis://:own@h:1"), ("REDIS_AUTH", "other")],
    )
    .expect("a URL");
    assert_eq!(full.redis_url, "redis://:own@h:1", "a URL keeps its own");
}

/// REDIS_TYPE: `single` (the default) or `cluster`, whose REDIS_URL is a
/// comma-separated list of host:port, each a tcp URL with REDIS_AUTH;
/// Sentinel is refused with a sentence saying so.
#[test]
fn redis_type_selects_a_cluster_and_refuses_sentinel() {
    let nodes = "10.0.0.1:7000, 10.0.0.2:7000,10.0.0.3:7000";
    let single = with_env(&[], &[("REDIS_URL", "/run/redis.sock")]).expect("single");
    assert_eq!(single.redis_type, RedisType::Single);
    let cluster = with_env(
        &[],
        &[
            ("REDIS_TYPE", "CLUSTER"),
            ("REDIS_URL", nodes),
            ("REDIS_AUTH", "app:p@ss"),
        ],
    )
    .expect("a Cluster, whatever the socket type (the peer dials tcp)");
    assert_eq!(cluster.redis_type, RedisType::Cluster);
    assert_eq!(cluster.backend, BackendName::Redis);
    assert_eq!(
        cluster.redis_url,
        "redis://app:p%40ss@10.0.0.1:7000,redis://app:p%40ss@10.0.0.2:7000,redis://app:p%40ss@10.0.0.3:7000"
    );
    let flag = with_env(
        &["--redis-type", "single"],
        &[("REDIS_TYPE", "cluster"), ("REDIS_URL", nodes)],
    )
    .expect("a flag");
    assert_eq!(flag.redis_type, RedisType::Single, "a flag wins");
    let sentinel = with_env(
        &[],
        &[
            ("REDIS_TYPE", "sentinel"),
            ("REDIS_URL", "mymaster,s1:26379"),
        ],
    )
    .expect_err("refused");
    assert!(
        sentinel.contains("REDIS_TYPE") && sentinel.contains("does not support Redis Sentinel"),
        "{sentinel}"
    );
    let bad = with_env(&[], &[("REDIS_TYPE", "ring")]).expect_err("refused");
    assert!(bad.contains("single or cluster"), "{bad}");
}

/// `--redis-url` of a Cluster: its seed nodes, bare `host:port` or URLs.
#[test]
fn cluster_nodes_are_the_comma_separated_urls() {
    let settings = with_env(
        &[
            "--backend",
            "redis",
            "--redis-type",
            "cluster",
            "--redis-url",
            "127.0.0.1:7000,redis://127.0.0.1:7001,",
        ],
        &[],
    )
    .expect("flags");
    let BackendSettings::Redis(redis) = settings.backend_settings() else {
        panic!("the Redis backend")
    };
    assert_eq!(
        redis.cluster_nodes(),
        ["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"]
    );
}

const V1: &str =
    "domain: w\ndescriptors:\n  - key: k\n    rate_limit: { unit: day, requests_per_unit: 1 }\n";
const V2: &str =
    "domain: w\ndescriptors:\n  - key: k\n    rate_limit: { unit: day, requests_per_unit: 2 }\n";

/// The limit `k` answers with now.
async fn limit_of(mut client: support::Client) -> u32 {
    let mut d = descriptor(&[("k", "x")]);
    d.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: 0 });
    client
        .should_rate_limit(request("w", vec![d]))
        .await
        .expect("answer")
        .into_inner()
        .statuses[0]
        .current_limit
        .as_ref()
        .map_or(0, |l| l.requests_per_unit)
}

/// Polls until the service answers `k` with `limit`; panics after a
/// minute (a liveness bound, not a timing claim).
async fn until_limit(h: &Harness, limit: u32, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while limit_of(h.client.clone()).await != limit {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_symlink_swap_reloads_and_a_bad_file_is_refused() {
    use std::os::unix::fs::symlink;
    // A ConfigMap volume: `..data` → a timestamped directory, and each key
    // a link through `..data`. An update writes a new directory and
    // renames a new `..data` link over the old one.
    let dir = ConfigDir::new();
    let mount = dir.path();
    let version = |name: &str, yaml: &str| {
        std::fs::create_dir(mount.join(name)).expect("a version directory");
        std::fs::write(mount.join(name).join("w.yaml"), yaml).expect("write");
        symlink(name, mount.join("..data_tmp")).expect("new link");
        std::fs::rename(mount.join("..data_tmp"), mount.join("..data")).expect("swap");
    };
    version("..v1", V1);
    symlink("..data/w.yaml", mount.join("w.yaml")).expect("key link");
    let mut s = settings(&dir);
    s.watch_interval_ms = 10;
    let h = start(s).await;
    assert_eq!(limit_of(h.client.clone()).await, 1);

    version("..v2", V2);
    until_limit(&h, 2, "the swapped-in limit serves").await;

    // A bad version: refused, counted, and the previous rules keep serving.
    version(
        "..v3",
        "domain: w\ndescriptors:\n  - key: k\n    rate_limit: { unit: fortnight }\n",
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while sample(&h.metrics().await, "ratelimit_service_config_load_error") != Some(1.0) {
        assert!(Instant::now() < deadline, "the bad file was never refused");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        limit_of(h.client.clone()).await,
        2,
        "the previous rules serve"
    );

    // A plain edit in place reloads too.
    std::fs::write(mount.join("..v3/w.yaml"), V1).expect("fix it");
    until_limit(&h, 1, "the fixed file serves").await;
}

#[test]
fn the_command_starts_from_a_peers_environment_alone() {
    let dir = ConfigDir::new();
    std::fs::create_dir_all(dir.path().join("ratelimit/config")).expect("dirs");
    std::fs::write(dir.path().join("ratelimit/config/w.yaml"), V1).expect("write");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_turnstile-rls"))
        .env("RUNTIME_ROOT", dir.path())
        .env("RUNTIME_SUBDIRECTORY", "ratelimit")
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", "0")
        .env("DEBUG_HOST", "127.0.0.1")
        .env("DEBUG_PORT", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start turnstile-rls");
    let mut line = String::new();
    let read = BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line);
    let _ = child.kill();
    let _ = child.wait();
    read.expect("the listening line");
    assert!(
        line.contains("grpc=127.0.0.1:") && line.contains("domains=w"),
        "{line}"
    );
}

#[test]
fn log_format_json_writes_one_object_a_line() {
    let dir = ConfigDir::with("w.yaml", V1);
    let mut child = support::command(&dir)
        .env("LOG_FORMAT", "json")
        .env("LOG_LEVEL", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start turnstile-rls");
    let mut line = String::new();
    let read = BufReader::new(child.stderr.take().expect("stderr")).read_line(&mut line);
    let _ = child.kill();
    let _ = child.wait();
    read.expect("a log line");
    assert!(
        line.starts_with('{') && line.trim_end().ends_with('}'),
        "{line}"
    );
    assert!(line.contains("\"level\":\"INFO\""), "{line}");
    assert!(line.contains("turnstile-rls serving"), "{line}");

    let quiet = support::command(&dir)
        .env("LOG_LEVEL", "loud")
        .output()
        .expect("run turnstile-rls");
    assert!(!quiet.status.success(), "an unknown level is refused");
    assert!(String::from_utf8_lossy(&quiet.stderr).contains("unknown log level"));
}
