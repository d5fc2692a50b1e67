//! The Redis backend on a real 3-master Redis Cluster (test-kit's
//! launcher): a request whose keys fall in different hash slots, on
//! different masters, is decided as on one server, for GCRA (the library's
//! script calls, one per slot) and for fixed windows (the peer's keys,
//! one pipeline per slot); and a deployment written for the peer
//! (`REDIS_TYPE=cluster`, `REDIS_URL=host:port,...`) starts and limits.
//!
//! One cluster serves every case (starting one takes seconds), each case
//! in a domain of its own.

use crate::support;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::google::protobuf::UInt64Value;
use support::{descriptor, request, settings, start, ConfigDir, Harness};
use turnstile_rls::settings::{BackendName, RedisType};
use turnstile_test_kit::redis_server::{free_port, redis_cli, RedisCluster};

const RULES: &str = r#"
domain: g
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 3 }
"#;

const WINDOWS: &str = r#"
domain: w
descriptors:
  - key: k
    rate_limit: { unit: day, requests_per_unit: 3 }
  - key: s
    rate_limit: { unit: day, requests_per_unit: 3 }
  - key: one
    rate_limit: { unit: day, requests_per_unit: 1 }
"#;

const PEER: &str = r#"
domain: p
descriptors:
  - key: k
    rate_limit: { unit: day, requests_per_unit: 2 }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_whose_keys_span_cluster_slots_are_decided_as_on_one_server() {
    let cluster = RedisCluster::start().expect("a Redis Cluster (scripts/test.sh installs redis)");
    let dir = ConfigDir::with("g.yaml", RULES);
    dir.write("w.yaml", WINDOWS);
    dir.write("p.yaml", PEER);
    gcra_across_slots(&cluster, &dir).await;
    windows_across_slots(&cluster, &dir).await;
    stop_increment_across_slots(&cluster, &dir).await;
    peer_environment_selects_the_cluster(&cluster, &dir).await;
}

/// A Cluster must be up when the service starts (its client learns the
/// slots then): with none there, the start fails with a sentence naming
/// the nodes, instead of serving without Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_that_is_not_there_fails_the_start_with_a_sentence() {
    let port = free_port().expect("a free port");
    let dir = ConfigDir::with("g.yaml", RULES);
    let mut settings = settings(&dir);
    settings.backend = BackendName::Redis;
    settings.redis_type = RedisType::Cluster;
    settings.redis_url = format!("127.0.0.1:{port}");
    let Err(error) = turnstile_rls::start(settings).await else {
        panic!("no Cluster, no start");
    };
    let error = error.to_string();
    assert!(
        error.contains("cannot use Redis at") && error.contains(&format!("127.0.0.1:{port}")),
        "{error}"
    );
}

/// The service on `cluster` by its flags; fixed windows with no jitter.
async fn on_cluster(cluster: &RedisCluster, dir: &ConfigDir, windows: bool, stop: bool) -> Harness {
    let mut settings = settings(dir);
    settings.backend = BackendName::Redis;
    settings.redis_type = RedisType::Cluster;
    settings.redis_url = cluster.urls().join(",");
    if windows {
        settings.default_algorithm = turnstile_rls::config::Algorithm::FixedWindow;
    }
    settings.expiration_jitter_max_seconds = 0;
    settings.stop_cache_key_increment_when_overlimit = stop;
    // Exact counts: no loaded-machine timeout may hand a call to the policy.
    settings.redis_timeout_ms = 5_000;
    start(settings).await
}

/// The master (its port) that holds `key`'s slot: the others answer MOVED.
fn owner(cluster: &RedisCluster, key: &str) -> u16 {
    let owners: Vec<u16> = cluster
        .ports()
        .into_iter()
        .filter(|&port| {
            !redis_cli(port, &["GET", key])
                .expect("redis-cli")
                .contains("MOVED")
        })
        .collect();
    assert_eq!(owners.len(), 1, "one master owns {key:?}: {owners:?}");
    owners[0]
}

/// `n` values of `k` whose peer keys (`domain_k_value_` + today) sit on
/// `n` different masters, so on `n` different slots.
fn values_on_distinct_masters(
    cluster: &RedisCluster,
    domain: &str,
    k: &str,
    n: usize,
) -> Vec<String> {
    let mut owners = Vec::new();
    let mut values = Vec::new();
    // Spread values: keys that differ in a digit or two may all fall in
    // a few slots (CRC16 is linear).
    let spread = (1..200u64).map(|i| format!("v{:x}", i.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
    for candidate in spread {
        let port = owner(cluster, &peer_key(domain, k, &candidate));
        if !owners.contains(&port) {
            owners.push(port);
            values.push(candidate);
            if values.len() == n {
                return values;
            }
        }
    }
    panic!("no {n} values of {k} on distinct masters")
}

/// The peer's key of `k=value` in `domain`'s daily window now (a day: no
/// edge falls inside a test in practice).
fn peer_key(domain: &str, k: &str, value: &str) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    format!("{domain}_{k}_{value}_{}", now / 86_400 * 86_400)
}

/// `key`'s value read from its master (redis-cli follows MOVED with `-c`).
fn read(cluster: &RedisCluster, key: &str, command: &str) -> String {
    redis_cli(cluster.ports()[0], &["-c", command, key])
        .expect("redis-cli")
        .trim()
        .to_owned()
}

fn codes(
    response: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse,
) -> Vec<Code> {
    response.statuses.iter().map(support::status_code).collect()
}

/// GCRA: one request of six descriptors (keys over several masters) is
/// decided per descriptor, each answer in its own place.
async fn gcra_across_slots(cluster: &RedisCluster, dir: &ConfigDir) {
    let mut h = on_cluster(cluster, dir, false, false).await;
    let values = ["a", "b", "c", "d", "e", "f"];
    // `a` spends its 3 alone first.
    assert_eq!(h.admitted("g", &[("user", "a")], 3).await, 3);
    let all = || {
        request(
            "g",
            values.iter().map(|v| descriptor(&[("user", v)])).collect(),
        )
    };
    for round in 0..2 {
        let response = h.ask(all()).await;
        assert_eq!(support::code(response.overall_code), Code::OverLimit);
        let mut expected = vec![Code::Ok; values.len()];
        expected[0] = Code::OverLimit;
        assert_eq!(
            codes(&response),
            expected,
            "round {round}: only `a` is spent"
        );
    }
    // b..f spent 2 of their 3: one more each, then none.
    let rest = || {
        request(
            "g",
            values[1..]
                .iter()
                .map(|v| descriptor(&[("user", v)]))
                .collect(),
        )
    };
    let response = h.ask(rest()).await;
    assert_eq!(codes(&response), vec![Code::Ok; 5]);
    let response = h.ask(rest()).await;
    assert_eq!(codes(&response), vec![Code::OverLimit; 5]);
    // The buckets really spread over the masters (so over several slots).
    let holding = cluster
        .ports()
        .into_iter()
        .filter(|&port| {
            !redis_cli(port, &["KEYS", "turnstile-rls:g*"])
                .expect("redis-cli")
                .trim()
                .is_empty()
        })
        .count();
    assert!(holding >= 2, "the six buckets sit on {holding} master(s)");
}

/// Fixed windows: three descriptors on three masters, counted in the
/// peer's keys with the unit's expiry.
async fn windows_across_slots(cluster: &RedisCluster, dir: &ConfigDir) {
    let mut h = on_cluster(cluster, dir, true, false).await;
    let values = values_on_distinct_masters(cluster, "w", "k", 3);
    // The first value is hit once more beforehand: it goes over first.
    assert_eq!(h.admitted("w", &[("k", &values[0])], 1).await, 1);
    let all = || {
        request(
            "w",
            values.iter().map(|v| descriptor(&[("k", v)])).collect(),
        )
    };
    for _ in 0..2 {
        assert_eq!(codes(&h.ask(all()).await), vec![Code::Ok; 3]);
    }
    assert_eq!(
        codes(&h.ask(all()).await),
        vec![Code::OverLimit, Code::Ok, Code::Ok]
    );
    for (value, count) in values.iter().zip(["4", "3", "3"]) {
        let key = peer_key("w", "k", value);
        assert_eq!(read(cluster, &key, "GET"), count, "{key}");
        let ttl: u64 = read(cluster, &key, "TTL").parse().expect("a TTL");
        assert!((86_390..=86_400).contains(&ttl), "a day's expiry: {ttl}");
    }
}

/// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` on a Cluster: the GET pass
/// reads every slot, and a descriptor going over spares the others.
async fn stop_increment_across_slots(cluster: &RedisCluster, dir: &ConfigDir) {
    let mut h = on_cluster(cluster, dir, true, true).await;
    let kept = values_on_distinct_masters(cluster, "w", "s", 3);
    let over_value = "over";
    let mut over = descriptor(&[("one", over_value)]);
    over.hits_addend = Some(UInt64Value { value: 2 });
    let mut descriptors: Vec<_> = kept.iter().map(|v| descriptor(&[("s", v)])).collect();
    descriptors.push(over);
    let response = h.ask(request("w", descriptors)).await;
    assert_eq!(support::code(response.overall_code), Code::OverLimit);
    for value in &kept {
        let key = peer_key("w", "s", value);
        assert_eq!(read(cluster, &key, "GET"), "0", "{key} spared");
    }
    assert_eq!(read(cluster, &peer_key("w", "one", over_value), "GET"), "2");
    let slots: std::collections::BTreeSet<u16> = kept
        .iter()
        .map(|v| turnstile_rl::redis::slot(peer_key("w", "s", v).as_bytes()))
        .collect();
    assert!(slots.len() >= 2, "the spared keys span slots: {slots:?}");
}

/// A deployment written for the peer, configured only by its variables.
async fn peer_environment_selects_the_cluster(cluster: &RedisCluster, dir: &ConfigDir) {
    let nodes: Vec<String> = cluster
        .ports()
        .iter()
        .map(|port| format!("127.0.0.1:{port}"))
        .collect();
    let root = dir.path().parent().expect("the temporary directory");
    let app = dir.path().file_name().expect("a name").to_string_lossy();
    // The peer's REDIS_TIMEOUT is not read: a long timeout by flag keeps
    // the counts exact on a loaded machine.
    let settings = support::peer_env_settings(
        &[
            ("RUNTIME_ROOT", root.to_string_lossy().into_owned()),
            ("RUNTIME_APPDIRECTORY", app.into_owned()),
            ("REDIS_TYPE", "cluster".into()),
            ("REDIS_SOCKET_TYPE", "tcp".into()),
            ("REDIS_URL", nodes.join(",")),
            ("EXPIRATION_JITTER_MAX_SECONDS", "0".into()),
        ],
        &["--redis-timeout-ms", "5000"],
    );
    assert_eq!(settings.redis_type, RedisType::Cluster);
    assert_eq!(settings.backend, BackendName::Redis);
    assert_eq!(settings.config, dir.path());
    let mut h = start(settings).await;
    let values = values_on_distinct_masters(cluster, "p", "k", 2);
    let both = || {
        request(
            "p",
            values.iter().map(|v| descriptor(&[("k", v)])).collect(),
        )
    };
    assert_eq!(codes(&h.ask(both()).await), vec![Code::Ok; 2]);
    assert_eq!(codes(&h.ask(both()).await), vec![Code::Ok; 2]);
    assert_eq!(codes(&h.ask(both()).await), vec![Code::OverLimit; 2]);
    for value in &values {
        assert_eq!(read(cluster, &peer_key("p", "k", value), "GET"), "3");
    }
}
