//! Starting the service: the gRPC listener (rate limit and health), the
//! `/metrics` listener, and reloads on SIGHUP.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;

use crate::config::ConfigError;
use crate::engine::Engine;
use crate::service::RateLimitGrpc;
use crate::settings::Settings;

/// Why the service did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The configuration is invalid.
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    /// An address could not be bound.
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Which listener.
        what: &'static str,
        /// Why.
        source: io::Error,
    },
}

/// A running service; stops when dropped.
#[derive(Debug)]
pub struct RunningService {
    /// Where gRPC listens (the bound port when the settings said 0).
    pub grpc_addr: SocketAddr,
    /// Where `/metrics` listens.
    pub metrics_addr: SocketAddr,
    /// The engine, for reloads and direct reads.
    pub engine: Arc<Engine>,
    stop: Option<oneshot::Sender<()>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for RunningService {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Loads the configuration, binds both listeners and serves on the current
/// tokio runtime.
pub async fn start(settings: Settings) -> Result<RunningService, StartError> {
    let bind = |addr: SocketAddr, what: &'static str| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|source| StartError::Bind { addr, what, source })
    };
    let grpc = bind(settings.grpc_addr, "gRPC").await?;
    let metrics = bind(settings.metrics_addr, "metrics").await?;
    let local = |l: &TcpListener, addr: SocketAddr, what| {
        l.local_addr()
            .map_err(|source| StartError::Bind { addr, what, source })
    };
    let grpc_addr = local(&grpc, settings.grpc_addr, "gRPC")?;
    let metrics_addr = local(&metrics, settings.metrics_addr, "metrics")?;
    let engine = Arc::new(Engine::start(settings).await?);

    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer<RateLimitGrpc>>()
        .await;
    // envoyproxy/ratelimit registers its health under this name: probes
    // written for it (Kubernetes' `grpc: { service: ratelimit }`) ask for it.
    health_reporter
        .set_service_status(PEER_HEALTH_NAME, tonic_health::ServingStatus::Serving)
        .await;
    let (stop, stopped) = oneshot::channel::<()>();
    let grpc_task = tokio::spawn({
        let engine = engine.clone();
        async move {
            let result = Server::builder()
                .add_service(health)
                .add_service(RateLimitGrpc::server(engine))
                .serve_with_incoming_shutdown(incoming(grpc), async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(e) = result {
                tracing::error!(error = %e, "the gRPC server stopped");
            }
        }
    });
    let metrics_task = tokio::spawn({
        let engine = engine.clone();
        async move {
            let app = axum::Router::new().route(
                "/metrics",
                get(move || {
                    let engine = engine.clone();
                    async move { engine.render_metrics() }
                }),
            );
            if let Err(e) = axum::serve(metrics, app).await {
                tracing::error!(error = %e, "the metrics server stopped");
            }
        }
    });
    let mut tasks = vec![grpc_task, metrics_task];
    if engine.settings().backend == crate::settings::BackendName::Redis {
        tasks.push(tokio::spawn(crate::redis_health::log_redis_health(
            engine.clone(),
            Duration::from_secs(1),
        )));
    }
    if engine.settings().watch_interval_ms > 0 {
        let interval = Duration::from_millis(engine.settings().watch_interval_ms);
        tasks.push(tokio::spawn(crate::watch::reload_on_change(
            engine.clone(),
            interval,
        )));
    }
    Ok(RunningService {
        grpc_addr,
        metrics_addr,
        engine,
        stop: Some(stop),
        tasks,
    })
}

/// The health service name envoyproxy/ratelimit serves.
pub const PEER_HEALTH_NAME: &str = "ratelimit";

/// The accepted gRPC connections, with Nagle's algorithm off: tonic's
/// `From<TcpListener>` leaves `nodelay` unset (the builder's `tcp_nodelay`
/// applies only to listeners it binds), and a small answer then waits for
/// the client's delayed ACK, about 40 ms, whenever one is in flight.
fn incoming(listener: TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener).with_nodelay(Some(true))
}

/// Reloads `engine`'s configuration on every SIGHUP, forever; a bad file
/// is reported on stderr and the previous rules keep serving. The handler
/// is installed before this returns, so a SIGHUP sent once the caller
/// announces itself reloads rather than ending the process.
#[cfg(unix)]
pub fn reload_on_sighup(engine: Arc<Engine>) -> io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangups = signal(SignalKind::hangup())?;
    Ok(async move {
        while hangups.recv().await.is_some() {
            reload_and_report(&engine, "SIGHUP").await;
        }
    })
}

/// Reloads `engine` and logs the outcome.
pub async fn reload_and_report(engine: &Engine, why: &str) {
    match engine.reload().await {
        Ok(()) => tracing::info!(trigger = why, "configuration reloaded"),
        Err(e) => tracing::error!(
            trigger = why,
            error = %e,
            "reload refused, the previous configuration keeps serving"
        ),
    }
}
