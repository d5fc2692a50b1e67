//! The load test of `ShouldRateLimit` over loopback, client and service in
//! one process on the same machine, every row in one run: an empty tonic
//! service answering OK with no work (the floor the engine cannot beat),
//! the same service answering, with no work, the answer the service gives
//! (taken from it once: the floor with the answer's protocol cost in it),
//! the in-process backend, and Redis (a server started here, when
//! `redis-server` is on PATH): GCRA with one Redis call per decision, with
//! leases of 10 and of 100 (`--redis-lease`), and the peer's fixed windows;
//! then the three GCRA rows again with Redis behind a proxy that delays
//! each way (a Redis across a network rather than on loopback).
//! Each at 1 call in flight on 1 connection, then 64 on 4; each row says
//! its decisions a second (and as a share of the empty service's), p50,
//! p99, p99.9, and the Redis calls per decision the service counted.
//!
//! ```sh
//! cargo bench -p turnstile-rls --bench load            # defaults below
//! RLS_LOAD_REQUESTS=400000 cargo bench -p turnstile-rls --bench load
//! RLS_LOAD_ROWS=in-process cargo bench -p turnstile-rls --bench load   # one row (the empty service still runs: it is the floor)
//! ```

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use turnstile_rls::config::Algorithm;
use turnstile_rls::load::{run, LoadPlan};
use turnstile_rls::settings::BackendName;
use turnstile_rls::Settings;

// A limit no row reaches, so every decision is admitted and a lease is
// spent whole: the rows differ only in what a decision costs.
const CONFIG: &str = r#"
domain: load
descriptors:
  - key: user
    rate_limit: { unit: second, requests_per_unit: 1000000 }
"#;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `ShouldRateLimit` answering with no work: the default (empty) answer,
/// or a canned one.
struct Empty(RateLimitResponse);

#[tonic::async_trait]
impl RateLimitService for Empty {
    async fn should_rate_limit(
        &self,
        _: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        Ok(tonic::Response::new(self.0.clone()))
    }
}

/// Serves [`Empty`] answering `answer` on a loopback port, as the service
/// serves (no delay).
async fn empty_service(answer: RateLimitResponse) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RateLimitServiceServer::new(Empty(answer)))
            .serve_with_incoming(
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            ),
    );
    addr
}

/// The answer the in-process service gives a call of the plan (the
/// descriptor `user=v0`).
async fn the_services_answer(settings: Settings) -> RateLimitResponse {
    let service = turnstile_rls::start(settings)
        .await
        .expect("the service starts");
    let mut client = RateLimitServiceClient::connect(format!("http://{}", service.grpc_addr))
        .await
        .expect("a client");
    let request = RateLimitRequest {
        domain: "load".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: "v0".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    };
    client
        .should_rate_limit(request)
        .await
        .expect("an answer")
        .into_inner()
}

/// One row's figures.
struct Row {
    label: &'static str,
    report: turnstile_rls::load::LoadReport,
    /// Redis calls per decision, for the Redis rows.
    calls_per_decision: Option<f64>,
}

fn print_row(row: &Row, floor: f64) {
    let us = |d: std::time::Duration| d.as_secs_f64() * 1e6;
    let r = &row.report;
    let calls = row
        .calls_per_decision
        .map_or("-".to_owned(), |c| format!("{c:.3}"));
    println!(
        "| {:<18} | {:>8.0} | {:>5.2}x | {:>7.0} | {:>7.0} | {:>7.0} | {:>6} | {} |",
        row.label,
        r.rate(),
        r.rate() / floor,
        us(r.percentiles[0]),
        us(r.percentiles[2]),
        us(r.percentiles[3]),
        calls,
        r.over_limit + r.errors,
    );
}

/// The delay the far Redis's proxy adds each way (tokio's timer rounds it
/// up to its 1 ms tick).
const FAR: std::time::Duration = std::time::Duration::from_micros(500);

/// A loopback proxy to the Redis on `port` that passes every chunk on
/// `delay` after it arrived, each way, in order.
async fn delayed_proxy(port: u16, delay: std::time::Duration) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
                continue;
            };
            let _ = (client.set_nodelay(true), server.set_nodelay(true));
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            tokio::spawn(delayed_copy(client_read, server_write, delay));
            tokio::spawn(delayed_copy(server_read, client_write, delay));
        }
    });
    addr
}

/// Copies `from` to `to`, each chunk `delay` after it was read.
async fn delayed_copy(
    from: tokio::net::tcp::OwnedReadHalf,
    to: tokio::net::tcp::OwnedWriteHalf,
    delay: std::time::Duration,
) {
    let (chunks, mut due) =
        tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    tokio::spawn(async move {
        while let Some((at, bytes)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                if to.writable().await.is_err() {
                    return;
                }
                match to.try_write(rest) {
                    Ok(n) => rest = &rest[n..],
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => return,
                }
            }
        }
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if from.readable().await.is_err() {
            return;
        }
        match from.try_read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                let at = tokio::time::Instant::now() + delay;
                if chunks.send((at, buf[..n].to_vec())).is_err() {
                    return;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return,
        }
    }
}

/// Whether `RLS_LOAD_ROWS` (labels, comma-separated; every row when
/// unset) asks for the row `label`: a profile can run one row alone.
fn wanted(label: &str) -> bool {
    std::env::var("RLS_LOAD_ROWS").map_or(true, |rows| rows.split(',').any(|r| r.trim() == label))
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let dir = std::env::temp_dir().join(format!("turnstile-rls-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a config dir");
    std::fs::write(dir.join("load.yaml"), CONFIG).expect("the config");
    let keys = env("RLS_LOAD_KEYS", 100);
    let plans = [
        LoadPlan {
            domain: "load".into(),
            key: "user".into(),
            key_count: keys,
            connections: 1,
            concurrency: 1,
            requests: env("RLS_LOAD_REQUESTS_1", 20_000),
        },
        LoadPlan {
            domain: "load".into(),
            key: "user".into(),
            key_count: keys,
            connections: env("RLS_LOAD_CONNECTIONS", 4),
            concurrency: env("RLS_LOAD_CONCURRENCY", 64),
            requests: env("RLS_LOAD_REQUESTS", 100_000),
        },
    ];
    let settings = |backend: BackendName, redis_url: Option<&str>| {
        let mut s = Settings::new(&dir);
        s.grpc_addr = "127.0.0.1:0".parse().expect("addr");
        s.metrics_addr = "127.0.0.1:0".parse().expect("addr");
        s.backend = backend;
        if let Some(url) = redis_url {
            s.redis_url = url.to_owned();
            s.redis_timeout_ms = 200;
        }
        s
    };
    let redis = turnstile_test_kit::redis_server::RedisServer::start().ok();
    let answer = runtime.block_on(the_services_answer(settings(BackendName::Memory, None)));
    for plan in &plans {
        println!(
            "\nShouldRateLimit over loopback, client in the same process: {} calls, {} in flight on {} connections, {} keys",
            plan.requests, plan.concurrency, plan.connections, plan.key_count
        );
        println!("| backend            | calls/s  | vs empty | p50 µs | p99 µs  | p99.9 µs | Redis calls/decision | over limit or failed |");
        println!("|---|---|---|---|---|---|---|---|");
        let warm = LoadPlan {
            requests: plan.requests / 10,
            ..plan.clone()
        };
        let measure = |label: &'static str, settings: Settings| {
            if !wanted(label) {
                return None;
            }
            Some(runtime.block_on(async {
                let service = turnstile_rls::start(settings)
                    .await
                    .expect("the service starts");
                let _ = run(service.grpc_addr, &warm).await;
                let before = service.engine.redis_metrics();
                let report = run(service.grpc_addr, plan).await.expect("load");
                let calls_per_decision =
                    service
                        .engine
                        .redis_metrics()
                        .zip(before)
                        .map(|(after, before)| {
                            (after.redis_calls - before.redis_calls) as f64 / report.calls as f64
                        });
                Row {
                    label,
                    report,
                    calls_per_decision,
                }
            }))
        };
        let empty = |label: &'static str, answer: RateLimitResponse| {
            runtime.block_on(async {
                let addr = empty_service(answer).await;
                let _ = run(addr, &warm).await;
                Row {
                    label,
                    report: run(addr, plan).await.expect("load"),
                    calls_per_decision: None,
                }
            })
        };
        let floor_row = empty("empty tonic service", RateLimitResponse::default());
        let floor = floor_row.report.rate();
        if wanted(floor_row.label) {
            print_row(&floor_row, floor);
        }
        let print = |row: Option<Row>| {
            if let Some(row) = row {
                print_row(&row, floor);
            }
        };
        if wanted("canned answer") {
            print(Some(empty("canned answer", answer.clone())));
        }
        print(measure("in-process", settings(BackendName::Memory, None)));
        let Some(redis) = &redis else {
            println!("| redis | skipped: no redis-server on PATH |");
            continue;
        };
        let url = redis.url();
        print(measure(
            "redis, per decision",
            settings(BackendName::Redis, Some(&url)),
        ));
        for (label, lease) in [("redis, leases of 10", 10), ("redis, leases of 100", 100)] {
            let mut leased = settings(BackendName::Redis, Some(&url));
            leased.redis_lease = lease;
            print(measure(label, leased));
        }
        let mut windows = settings(BackendName::Redis, Some(&url));
        windows.default_algorithm = Algorithm::FixedWindow;
        // Its pipeline is not the GCRA path the counter reads.
        print(measure("redis, fixed window", windows).map(|row| Row {
            calls_per_decision: None,
            ..row
        }));
        // The same Redis behind a proxy that holds every chunk a while each
        // way, as a Redis across a network is: what a round trip saved is
        // worth when it is not a loopback one.
        let far = runtime.block_on(delayed_proxy(redis.port(), FAR));
        let far_url = format!("redis://{far}");
        print(measure(
            "far redis, per decision",
            settings(BackendName::Redis, Some(&far_url)),
        ));
        for (label, lease) in [
            ("far redis, leases of 10", 10),
            ("far redis, leases of 100", 100),
        ] {
            let mut leased = settings(BackendName::Redis, Some(&far_url));
            leased.redis_lease = lease;
            print(measure(label, leased));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
