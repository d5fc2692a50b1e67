//! envoyproxy/ratelimit's integration test
//! (`test/integration/integration_test.go`) replayed against this service:
//! its runtime directory (`tests/peer_config/integration/runtime/`, copied
//! unchanged) and its sequences of `ShouldRateLimit` calls, each answer
//! compared whole (the peer's `AssertProtoEqual`), with its statistics.
//!
//! The service is configured as a deployment written for the peer would
//! configure it: the peer's environment variables (`RUNTIME_ROOT`,
//! `RUNTIME_SUBDIRECTORY`, `RUNTIME_APPDIRECTORY`, `REDIS_URL`,
//! `REDIS_SOCKET_TYPE`, `LOCAL_CACHE_SIZE_IN_BYTES`, `CACHE_KEY_PREFIX`,
//! `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`), plus the one setting the
//! README's migration section asks for, fixed windows. Each Redis case has
//! a `redis-server` of its own (the peer's run one after another on one).
//!
//! The peer's counts are of fixed windows aligned to the clock: a sequence
//! that a minute's or an hour's edge falls inside restarts its count. The
//! peer's test would fail then; here the edge is seen (a window's reset
//! grows) and the case runs again on a fresh service and an empty Redis.

use std::path::Path;
use std::time::Duration;

use crate::support;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use support::{descriptor, request, sample, start, ConfigDir, Harness};
use turnstile_rls::Settings;
use turnstile_test_kit::redis_server::{redis_cli, RedisServer};

/// The peer's runtime directory, as copied.
fn peer_runtime() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/peer_config/integration/runtime")
}

/// A copy of the peer's runtime directory (its reload test writes in it).
fn runtime_copy() -> ConfigDir {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).expect("a directory");
        for entry in std::fs::read_dir(from).expect("the peer's runtime") {
            let path = entry.expect("an entry").path();
            let target = to.join(path.file_name().expect("a name"));
            if path.is_dir() {
                copy(&path, &target);
            } else {
                std::fs::copy(&path, &target).expect("copy a file");
            }
        }
    }
    let dir = ConfigDir::new();
    copy(&peer_runtime(), dir.path());
    dir
}

/// One of the peer's `t.Run` cases of `TestBasicConfig`: its settings.
#[derive(Clone, Copy, Debug)]
struct Case {
    /// On Redis (the peer's every case), or in this process.
    redis: bool,
    /// `LOCAL_CACHE_SIZE_IN_BYTES=1000`: the peer's `_local` keys.
    local_cache: bool,
    /// `CACHE_KEY_PREFIX=prefix:`.
    prefix: bool,
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true`.
    stop: bool,
    /// `REDIS_AUTH=password123`, Redis requiring it.
    auth: bool,
    /// `RUNTIME_WATCH_ROOT=false`.
    no_watch_root: bool,
    /// Also wait for a day's reset to tick down (the peer's last check,
    /// which sleeps: done in two cases, not all, to keep the suite fast).
    tick: bool,
}

/// The peer's `testBasicConfigAuth` password.
const PASSWORD: &str = "password123";

/// In this process, nothing else set.
const IN_PROCESS: Case = Case {
    redis: false,
    local_cache: false,
    prefix: false,
    stop: false,
    auth: false,
    no_watch_root: false,
    tick: false,
};

/// On Redis, nothing else set: the peer's `makeSimpleRedisSettings`.
const REDIS: Case = Case {
    redis: true,
    ..IN_PROCESS
};

/// The settings a deployment written for the peer gives this service, on
/// the runtime directory `root` (with `redis` if the case is on Redis).
fn peer_settings(
    root: &ConfigDir,
    redis: Option<&RedisServer>,
    case: Case,
    watch: bool,
) -> Settings {
    let current = root.path().join("current");
    let mut vars: Vec<(&str, String)> = vec![
        ("RUNTIME_ROOT", current.display().to_string()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".into()),
        ("RUNTIME_APPDIRECTORY", "config".into()),
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("USE_STATSD", "false".into()),
    ];
    if let Some(redis) = redis {
        vars.push(("REDIS_URL", format!("127.0.0.1:{}", redis.port())));
    }
    if case.local_cache {
        vars.push(("LOCAL_CACHE_SIZE_IN_BYTES", "1000".into()));
    }
    if case.prefix {
        vars.push(("CACHE_KEY_PREFIX", "prefix:".into()));
    }
    if case.stop {
        vars.push(("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true".into()));
    }
    if case.auth {
        vars.push(("REDIS_AUTH", PASSWORD.into()));
    }
    if case.no_watch_root {
        vars.push(("RUNTIME_WATCH_ROOT", "false".into()));
    }
    let watch_ms = if watch { "50" } else { "0" };
    // The peer's REDIS_TIMEOUT is 10 s; this service's 20 ms default could
    // hand a call on a loaded machine to the failure policy.
    let args = [
        "--redis-timeout-ms",
        "5000",
        "--watch-interval-ms",
        watch_ms,
    ];
    support::peer_env_settings(&vars, &args)
}

/// The peer's `newDescriptorStatus`: the reset's whole seconds taken from
/// the answer, its nanoseconds 0.
fn status(
    code: Code,
    rpu: u32,
    unit: Unit,
    remaining: u32,
    reset: &Option<ProtoDuration>,
) -> DescriptorStatus {
    DescriptorStatus {
        code: code as i32,
        current_limit: Some(RateLimit {
            requests_per_unit: rpu,
            unit: unit as i32,
            ..Default::default()
        }),
        limit_remaining: remaining,
        duration_until_reset: Some(ProtoDuration {
            seconds: reset.as_ref().map_or(-1, |d| d.seconds),
            nanos: 0,
        }),
        ..Default::default()
    }
}

fn response(code: Code, statuses: Vec<DescriptorStatus>) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: code as i32,
        statuses,
        ..Default::default()
    }
}

/// The peer's `common.NewRateLimitRequest`.
fn peer_request(domain: &str, descriptors: &[&[(&str, &str)]], hits: u32) -> RateLimitRequest {
    let mut req = request(domain, descriptors.iter().map(|d| descriptor(d)).collect());
    req.hits_addend = hits;
    req
}

/// The peer's `getCacheKey`: `_local` keys when the local cache is on.
fn key(key: &str, case: Case) -> String {
    if case.local_cache {
        format!("{key}_local")
    } else {
        key.to_owned()
    }
}

/// The peer's statistic `rate_limit.DOMAIN.DESCRIPTOR.STAT` (0 if absent).
async fn stat(h: &Harness, domain: &str, descriptor: &str, stat: &str) -> u64 {
    let name = format!(
        "ratelimit_service_rate_limit_{stat}{{domain=\"{domain}\",descriptor=\"{descriptor}\"}}"
    );
    sample(&h.metrics().await, &name).unwrap_or(0.0) as u64
}

/// The peer's `ratelimit.localcache.hitCount` and `missCount` (0 when the
/// cache is off).
async fn local_cache(h: &Harness) -> (u64, u64) {
    let text = h.metrics().await;
    let of = |name| sample(&text, name).unwrap_or(0.0) as u64;
    (
        of("ratelimit_localcache_hitCount"),
        of("ratelimit_localcache_missCount"),
    )
}

/// A window's edge fell inside the sequence: its counts restarted.
#[derive(Debug)]
struct WindowEdge;

/// The reset of a window seen before; a later one means a new window.
fn same_window(last: &mut Option<i64>, status: &DescriptorStatus) -> Result<(), WindowEdge> {
    let now = status
        .duration_until_reset
        .as_ref()
        .map_or(0, |d| d.seconds);
    match last.replace(now) {
        Some(before) if now > before => Err(WindowEdge),
        _ => Ok(()),
    }
}

/// A value no earlier run used (the peer's `r.Int()`).
fn random_value() -> String {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new()
        .hash_one(std::time::SystemTime::now())
        .to_string()
}

/// `testBasicBaseConfig`: the peer's sequence, asserted call by call.
async fn basic_base_config(h: &mut Harness, case: Case) -> Result<(), WindowEdge> {
    // An unknown domain: OK, no limit, nothing left, no reset.
    let answer = h
        .ask(peer_request("foo", &[&[(&key("hello", case), "world")]], 1))
        .await;
    let no_limit = DescriptorStatus {
        code: Code::Ok as i32,
        ..Default::default()
    };
    assert_eq!(answer, response(Code::Ok, vec![no_limit]));
    assert_eq!(local_cache(h).await, (0, 0));

    let key1 = key("key1", case);
    let answer = h.ask(peer_request("basic", &[&[(&key1, "foo")]], 1)).await;
    let reset = &answer.statuses[0].duration_until_reset;
    assert_eq!(
        answer,
        response(
            Code::Ok,
            vec![status(Code::Ok, 50, Unit::Second, 49, reset)]
        )
    );
    assert_eq!(stat(h, "basic", &key1, "total_hits").await, 1);
    assert_eq!(local_cache(h).await, (0, u64::from(case.local_cache)));

    // A random key over a minute's limit.
    let key2 = key("key2", case);
    let value = random_value();
    let mut window = None;
    for i in 0..25u32 {
        let answer = h
            .ask(peer_request("another", &[&[(&key2, &value)]], 1))
            .await;
        same_window(&mut window, &answer.statuses[0])?;
        let (code, remaining) = if i >= 20 {
            (Code::OverLimit, 0)
        } else {
            (Code::Ok, 20 - (i + 1))
        };
        let reset = &answer.statuses[0].duration_until_reset;
        assert_eq!(
            answer,
            response(code, vec![status(code, 20, Unit::Minute, remaining, reset)]),
            "hit {i}"
        );
        assert_eq!(
            stat(h, "another", &key2, "total_hits").await,
            u64::from(i + 1)
        );
        let over = if i >= 20 { i - 19 } else { 0 };
        assert_eq!(
            stat(h, "another", &key2, "over_limit").await,
            u64::from(over),
            "hit {i}"
        );
        let cached = if case.local_cache && i >= 20 {
            i - 20
        } else {
            0
        };
        assert_eq!(
            stat(h, "another", &key2, "over_limit_with_local_cache").await,
            u64::from(cached),
            "hit {i}"
        );
        let (hits, misses) = match (case.local_cache, i >= 20) {
            (false, _) => (0, 0),
            (true, false) => (0, i + 2),
            (true, true) => (i - 20, 22),
        };
        assert_eq!(
            local_cache(h).await,
            (u64::from(hits), u64::from(misses)),
            "hit {i}"
        );
    }

    // Two keys of one domain in one request.
    let key3 = key("key3", case);
    let value = random_value();
    let (mut window2, mut window3) = (None, None);
    for i in 0..15u32 {
        let answer = h
            .ask(peer_request(
                "another",
                &[&[(&key2, &value)], &[(&key3, &value)]],
                1,
            ))
            .await;
        same_window(&mut window2, &answer.statuses[0])?;
        same_window(&mut window3, &answer.statuses[1])?;
        let mut code = Code::Ok;
        let mut remaining1 = 20 - (i + 1);
        let mut remaining2 = 10u32.saturating_sub(i + 1);
        if i >= 10 {
            code = Code::OverLimit;
            remaining2 = 0;
            // Once key3 is over, key2 is no longer charged.
            if case.stop {
                remaining1 = 10;
            }
        }
        let (reset1, reset2) = (
            &answer.statuses[0].duration_until_reset,
            &answer.statuses[1].duration_until_reset,
        );
        assert_eq!(
            answer,
            response(
                code,
                vec![
                    status(Code::Ok, 20, Unit::Minute, remaining1, reset1),
                    status(code, 10, Unit::Hour, remaining2, reset2),
                ]
            ),
            "request {i}"
        );
        assert_eq!(
            stat(h, "another", &key2, "total_hits").await,
            u64::from(i + 26)
        );
        assert_eq!(stat(h, "another", &key2, "over_limit").await, 5);
        let cached2 = if case.local_cache { 4 } else { 0 };
        assert_eq!(
            stat(h, "another", &key2, "over_limit_with_local_cache").await,
            cached2
        );
        assert_eq!(
            stat(h, "another", &key3, "total_hits").await,
            u64::from(i + 1)
        );
        let over3 = if i >= 10 { i - 9 } else { 0 };
        assert_eq!(
            stat(h, "another", &key3, "over_limit").await,
            u64::from(over3),
            "request {i}"
        );
        let cached3 = if case.local_cache && i >= 10 {
            i - 10
        } else {
            0
        };
        assert_eq!(
            stat(h, "another", &key3, "over_limit_with_local_cache").await,
            u64::from(cached3),
            "request {i}"
        );
        // key3 cached from its 12th request on; key2 never.
        let (hits, misses) = match (case.local_cache, i >= 10) {
            (false, _) => (0, 0),
            (true, false) => (4, i * 2 + 24),
            (true, true) => (i - 6, i + 34),
        };
        assert_eq!(
            local_cache(h).await,
            (u64::from(hits), u64::from(misses)),
            "request {i}"
        );
    }

    if case.tick {
        // A day's reset ticks down. The peer sleeps 2 s; whole seconds
        // counted down from the window's edge drop after 1.1 s.
        let key4 = key("key4", case);
        let first = h
            .ask(peer_request("another", &[&[(&key4, "durTest")]], 1))
            .await;
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        let second = h
            .ask(peer_request("another", &[&[(&key4, "durTest")]], 1))
            .await;
        let reset = |r: &RateLimitResponse| {
            r.statuses[0]
                .duration_until_reset
                .as_ref()
                .map(|d| d.seconds)
        };
        assert!(reset(&second) < reset(&first), "{first:?} then {second:?}");
    }
    Ok(())
}

/// Runs `testBasicBaseConfig` for `case`, again on a fresh service (and an
/// emptied Redis) if a window's edge fell inside it.
async fn test_basic_config(case: Case) {
    let root = runtime_copy();
    let redis = case
        .redis
        .then(|| RedisServer::start().expect("redis-server (scripts/test.sh installs it)"));
    if let (Some(redis), true) = (&redis, case.auth) {
        let set = redis_cli(redis.port(), &["CONFIG", "SET", "requirepass", PASSWORD])
            .expect("requirepass");
        assert_eq!(set.trim(), "OK", "Redis now requires the password");
    }
    // redis-cli's own arguments to reach it.
    let login: &[&str] = if case.auth {
        &["-a", PASSWORD, "--no-auth-warning"]
    } else {
        &[]
    };
    for _ in 0..3 {
        if let Some(redis) = &redis {
            let flush = [login, &["FLUSHALL"]].concat();
            let answer = redis_cli(redis.port(), &flush).expect("empty the test's Redis");
            assert_eq!(answer.trim(), "OK", "FLUSHALL");
        }
        let mut h = start(peer_settings(&root, redis.as_ref(), case, false)).await;
        if basic_base_config(&mut h, case).await.is_err() {
            continue;
        }
        if let (Some(redis), true) = (&redis, case.prefix) {
            // Not asserted by the peer: its prefix is on every key it wrote.
            let keys = redis_cli(redis.port(), &[login, &["KEYS", "*"]].concat()).expect("KEYS");
            assert!(keys.lines().count() >= 4, "{keys}");
            assert!(
                keys.lines()
                    .all(|k| k.starts_with("prefix:another_") || k.starts_with("prefix:basic_")),
                "{keys}"
            );
        }
        return;
    }
    panic!("a window's edge in each of three runs");
}

/// `TestBasicConfig`'s cases that run on one Redis (its `WithPerSecond*`
/// cases need a second Redis for per-second limits, `REDIS_PERSECOND`,
/// which this service does not have: README, "Not supported").
mod test_basic_config {
    use super::*;

    #[tokio::test]
    async fn without_per_second_redis() {
        test_basic_config(Case {
            tick: true,
            ..REDIS
        })
        .await;
    }

    #[tokio::test]
    async fn without_per_second_redis_with_local_cache() {
        test_basic_config(Case {
            local_cache: true,
            ..REDIS
        })
        .await;
    }

    /// `TestBasicAuthConfig`'s one-Redis cases: Redis requires a password,
    /// given as REDIS_AUTH.
    #[tokio::test]
    async fn without_per_second_redis_auth() {
        test_basic_config(Case {
            auth: true,
            ..REDIS
        })
        .await;
    }

    #[tokio::test]
    async fn without_per_second_redis_auth_with_local_cache() {
        test_basic_config(Case {
            auth: true,
            local_cache: true,
            ..REDIS
        })
        .await;
    }

    #[tokio::test]
    async fn without_per_second_redis_with_cache_prefix() {
        test_basic_config(Case {
            prefix: true,
            ..REDIS
        })
        .await;
    }

    #[tokio::test]
    async fn without_per_second_redis_with_stop_cache_key_increment_when_overlimit_config() {
        test_basic_config(Case {
            stop: true,
            ..REDIS
        })
        .await;
    }

    #[tokio::test]
    async fn without_per_second_redis_with_local_cache_and_stop_cache_key_increment_when_overlimit_config(
    ) {
        test_basic_config(Case {
            local_cache: true,
            stop: true,
            ..REDIS
        })
        .await;
    }

    /// Not the peer's (its cases all need Redis or Memcache): the same
    /// sequence on the in-process backend.
    #[tokio::test]
    async fn in_process() {
        test_basic_config(Case {
            tick: true,
            ..IN_PROCESS
        })
        .await;
    }

    /// Not the peer's: the in-process backend with
    /// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT.
    #[tokio::test]
    async fn in_process_with_stop_cache_key_increment_when_overlimit_config() {
        test_basic_config(Case {
            stop: true,
            ..IN_PROCESS
        })
        .await;
    }
}

/// `testConfigReload` (`TestBasicReloadConfig`'s `ReloadWithoutWatchRoot`):
/// a file copied into the runtime directory is served once loaded, and
/// its removal reloads again.
async fn test_config_reload(case: Case) {
    let root = runtime_copy();
    let redis = case
        .redis
        .then(|| RedisServer::start().expect("redis-server (scripts/test.sh installs it)"));
    let h = &mut start(peer_settings(&root, redis.as_ref(), case, true)).await;
    let block = key("block", case);
    let answer = h
        .ask(peer_request("reload", &[&[(&block, "foo")]], 1))
        .await;
    let no_limit = DescriptorStatus {
        code: Code::Ok as i32,
        ..Default::default()
    };
    assert_eq!(answer, response(Code::Ok, vec![no_limit]));

    let ratelimit = root.path().join("current/ratelimit");
    let loads = config_loads(h).await;
    std::fs::copy(
        ratelimit.join("reload.yaml"),
        ratelimit.join("config/reload.yaml"),
    )
    .expect("reloadNewConfigFile");
    let loads = wait_for_config_reload(h, loads).await;

    let key1 = key("key1", case);
    let answer = h.ask(peer_request("reload", &[&[(&key1, "foo")]], 1)).await;
    let reset = &answer.statuses[0].duration_until_reset;
    assert_eq!(
        answer,
        response(
            Code::Ok,
            vec![status(Code::Ok, 50, Unit::Second, 49, reset)]
        )
    );

    // Removing a file reloads too.
    std::fs::remove_file(ratelimit.join("config/reload.yaml")).expect("restoreConfigFile");
    wait_for_config_reload(h, loads).await;
}

/// `ratelimit_service_config_load_success`.
async fn config_loads(h: &Harness) -> u64 {
    sample(&h.metrics().await, "ratelimit_service_config_load_success").unwrap_or(0.0) as u64
}

/// The peer's `waitForConfigReload`: until the successful loads pass
/// `before` (the peer waits up to 120 s; 30 s here, the watch polls every
/// 50 ms). The loads then.
async fn wait_for_config_reload(h: &Harness, before: u64) -> u64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let after = config_loads(h).await;
        if after > before {
            return after;
        }
        assert!(std::time::Instant::now() < deadline, "no reload in 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

mod test_basic_reload_config {
    use super::*;

    #[tokio::test]
    async fn basic_without_watch_root() {
        test_basic_config(Case {
            no_watch_root: true,
            ..REDIS
        })
        .await;
    }

    #[tokio::test]
    async fn reload_without_watch_root() {
        test_config_reload(Case {
            no_watch_root: true,
            ..REDIS
        })
        .await;
    }

    /// Not the peer's: the same on the in-process backend.
    #[tokio::test]
    async fn reload_in_process() {
        test_config_reload(IN_PROCESS).await;
    }
}

/// `TestShareThreshold`'s `WithoutPerSecondRedis`: values matching a
/// shared wildcard spend one count; without `share_threshold`, each value
/// its own.
#[tokio::test]
async fn test_share_threshold_without_per_second_redis() {
    let root = runtime_copy();
    let redis = RedisServer::start().expect("redis-server (scripts/test.sh installs it)");
    let h = &mut start(peer_settings(&root, Some(&redis), REDIS, false)).await;
    let domain = "share-threshold-test";
    for i in 0..10 {
        let answer = h
            .ask(peer_request(domain, &[&[("files", "files/a.pdf")]], 1))
            .await;
        let code = support::code(answer.overall_code);
        assert!(
            matches!(code, Code::Ok | Code::OverLimit),
            "request {i}: {code:?}"
        );
    }
    let answer = h
        .ask(peer_request(domain, &[&[("files", "files/b.csv")]], 1))
        .await;
    let reset = &answer.statuses[0].duration_until_reset;
    assert_eq!(
        answer,
        response(
            Code::OverLimit,
            vec![status(Code::OverLimit, 10, Unit::Hour, 0, reset)]
        ),
        "files/b.csv shares files/a.pdf's count"
    );
    let base = random_value();
    for i in 0..10 {
        let value = format!("files_no_share/{base}-{i}");
        let answer = h
            .ask(peer_request(domain, &[&[("files_no_share", &value)]], 1))
            .await;
        let reset = &answer.statuses[0].duration_until_reset;
        assert_eq!(
            answer,
            response(Code::Ok, vec![status(Code::Ok, 10, Unit::Hour, 9, reset)]),
            "{value}"
        );
    }
}
