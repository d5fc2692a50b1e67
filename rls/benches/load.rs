//! The load test of `ShouldRateLimit` over loopback, client and service in
//! one process on the same machine: first an empty tonic service answering
//! OK with no work (the floor the engine cannot beat), then the in-process
//! backend, then Redis (a server started here, when `redis-server` is on
//! PATH): GCRA, one script call per decision, and the peer's fixed windows,
//! one pipeline per request.
//!
//! ```sh
//! cargo bench -p turnstile-rls --bench load            # defaults below
//! RLS_LOAD_REQUESTS=400000 cargo bench -p turnstile-rls --bench load
//! ```

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use turnstile_rls::config::Algorithm;
use turnstile_rls::load::{run, LoadPlan};
use turnstile_rls::settings::BackendName;
use turnstile_rls::Settings;

const CONFIG: &str = r#"
domain: load
descriptors:
  - key: user
    rate_limit: { unit: second, requests_per_unit: 1000 }
"#;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `ShouldRateLimit` answering OK with no work.
struct Empty;

#[tonic::async_trait]
impl RateLimitService for Empty {
    async fn should_rate_limit(
        &self,
        _: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        Ok(tonic::Response::new(RateLimitResponse::default()))
    }
}

/// Serves [`Empty`] on a loopback port, as the service serves (no delay).
async fn empty_service() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RateLimitServiceServer::new(Empty))
            .serve_with_incoming(
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            ),
    );
    addr
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let dir = std::env::temp_dir().join(format!("turnstile-rls-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a config dir");
    std::fs::write(dir.join("load.yaml"), CONFIG).expect("the config");
    let plan = LoadPlan {
        domain: "load".into(),
        key: "user".into(),
        key_count: env("RLS_LOAD_KEYS", 10_000),
        connections: env("RLS_LOAD_CONNECTIONS", 4),
        concurrency: env("RLS_LOAD_CONCURRENCY", 64),
        requests: env("RLS_LOAD_REQUESTS", 200_000),
    };
    println!(
        "ShouldRateLimit over loopback, client in the same process: {} calls, {} in flight on {} connections, {} keys",
        plan.requests, plan.concurrency, plan.connections, plan.key_count
    );
    let settings = |backend: BackendName, redis_url: Option<String>| {
        let mut s = Settings::new(&dir);
        s.grpc_addr = "127.0.0.1:0".parse().expect("addr");
        s.metrics_addr = "127.0.0.1:0".parse().expect("addr");
        s.backend = backend;
        if let Some(url) = redis_url {
            s.redis_url = url;
            s.redis_timeout_ms = 200;
        }
        s
    };
    let measure = |label: &str, settings: Settings| {
        runtime.block_on(async {
            let service = turnstile_rls::start(settings)
                .await
                .expect("the service starts");
            // A short warm-up, then the measured run.
            let warm = LoadPlan {
                requests: plan.requests / 10,
                ..plan.clone()
            };
            let _ = run(service.grpc_addr, &warm).await;
            let report = run(service.grpc_addr, &plan).await.expect("load");
            println!("{label:<11} {report}");
        })
    };
    runtime.block_on(async {
        let addr = empty_service().await;
        let warm = LoadPlan {
            requests: plan.requests / 10,
            ..plan.clone()
        };
        let _ = run(addr, &warm).await;
        let report = run(addr, &plan).await.expect("load");
        println!("{:<11} {report}", "empty");
    });
    measure("in-process", settings(BackendName::Memory, None));
    match turnstile_test_kit::redis_server::RedisServer::start() {
        Ok(redis) => {
            measure("redis", settings(BackendName::Redis, Some(redis.url())));
            let mut windows = settings(BackendName::Redis, Some(redis.url()));
            windows.default_algorithm = Algorithm::FixedWindow;
            measure("redis-fixed", windows);
        }
        Err(_) => println!("redis       skipped: no redis-server on PATH"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}
