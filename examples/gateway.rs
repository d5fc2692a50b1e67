//! A gateway with per-route quotas from a TOML file, `/metrics` in
//! Prometheus format, and logs through `tracing`. A route may have several
//! quotas (one layer over a `KeyedMultiLimiter`: all or nothing, so a
//! request one quota denies spends nothing of the others, and every policy
//! shows in the headers) and may run in shadow mode (counted, never
//! refused).
//!
//! ```text
//! cargo run --release --example gateway --features tower -- examples/gateway.toml
//! curl -i -H 'x-api-key: k1' http://127.0.0.1:8080/api
//! curl -s http://127.0.0.1:8080/metrics
//! ```
//!
//! `--no-limit` serves the same routes without the rate-limit layers (to
//! measure the layer's overhead, `scripts/http_overhead.sh`). `RUST_LOG=debug`
//! logs every request.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request};
use axum::http::HeaderName;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use ipnet::IpNet;
use metrics_exporter_prometheus::PrometheusBuilder;
use serde::Deserialize;
use tracing_subscriber::EnvFilter;
use turnstile_rl::http::{ClientIp, HttpKey, KeyExtractor, OnBadKey, RateLimitLayer};
use turnstile_rl::{KeyedLimiter, KeyedMultiLimiter, Quota};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    listen: SocketAddr,
    #[serde(default)]
    trusted_proxies: Vec<IpNet>,
    #[serde(default = "default_ipv6_prefix")]
    ipv6_prefix: u8,
    #[serde(default, rename = "route")]
    routes: Vec<RouteConfig>,
}

fn default_ipv6_prefix() -> u8 {
    64
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteConfig {
    path: String,
    quota: Quotas,
    key: String,
    #[serde(default)]
    on_bad_key: Option<String>,
    #[serde(default)]
    shadow: bool,
}

/// `quota = "100/min"` or `quota = ["10/s", "1000/h"]`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Quotas {
    One(String),
    Several(Vec<String>),
}

impl Quotas {
    fn all(&self) -> &[String] {
        match self {
            Quotas::One(quota) => std::slice::from_ref(quota),
            Quotas::Several(quotas) => quotas,
        }
    }
}

type Error = Box<dyn std::error::Error + Send + Sync>;

fn key_extractor(route: &RouteConfig, client_ip: &ClientIp) -> Result<KeyExtractor, Error> {
    let key = match route.key.as_str() {
        "ip" => KeyExtractor::peer_ip(),
        other => match other.strip_prefix("header:") {
            Some(name) => KeyExtractor::header(HeaderName::try_from(name)?),
            None => return Err(format!("route {}: unknown key {other:?}", route.path).into()),
        },
    };
    let on_bad_key = match route.on_bad_key.as_deref() {
        None | Some("reject") => OnBadKey::default(),
        Some("ip") => OnBadKey::PeerIp,
        Some(other) => {
            return Err(format!("route {}: unknown on_bad_key {other:?}", route.path).into())
        }
    };
    Ok(key.client_ip(client_ip.clone()).on_bad_key(on_bad_key))
}

/// The limiters behind the layers, by policy name, for the key gauges:
/// each reads (keys held, idle ones included until swept; most keys) of one
/// limit.
type Limiters = Vec<(String, Gauge)>;
type Gauge = Box<dyn Fn() -> (usize, usize) + Send>;

fn app(config: &Config, limited: bool) -> Result<(Router, Limiters), Error> {
    let mut limiters = Limiters::new();
    let client_ip = ClientIp::new()
        .trust(config.trusted_proxies.iter().copied())
        .ipv6_prefix(config.ipv6_prefix)
        .peer_addr_from(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0));
    let mut router = Router::new();
    for route in &config.routes {
        // GET and POST: other methods get axum's 405, without a token spent.
        let handler = get(ok).post(ok);
        if !limited {
            router = router.route(&route.path, handler);
            continue;
        }
        let quotas = route.quota.all();
        if quotas.is_empty() {
            return Err(format!("route {}: no quota", route.path).into());
        }
        let base = route.path.trim_start_matches('/');
        let parsed = quotas
            .iter()
            .map(|text| text.parse::<Quota>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("route {}: {e}", route.path))?;
        let key = key_extractor(route, &client_ip)?;
        tracing::info!(
            path = %route.path,
            quota = %quotas.join("; "),
            key = %route.key,
            shadow = route.shadow,
            "rate-limited route"
        );
        // `route_layer`: a method the route does not take (405) never
        // reaches the limiter, so it spends no token.
        let handler = if let [quota] = parsed[..] {
            let limiter = Arc::new(KeyedLimiter::<HttpKey>::new(quota));
            let gauge = Arc::clone(&limiter);
            limiters.push((
                base.to_owned(),
                Box::new(move || (gauge.len(), gauge.max_keys())),
            ));
            let layer = RateLimitLayer::builder(limiter)
                .name(base)
                .route(route.path.as_str())
                .key(key)
                .x_ratelimit_headers(true)
                .shadow(route.shadow)
                .build()?;
            handler.route_layer(layer)
        } else {
            // Several quotas: one layer, all or nothing. One policy name per
            // quota, so each shows apart in the headers and the gauges.
            let names: Vec<String> = quotas.iter().map(|text| format!("{base}:{text}")).collect();
            let limits = turnstile_rl::Quotas::new(parsed)
                .map_err(|e| format!("route {}: {e}", route.path))?;
            let limiter = Arc::new(KeyedMultiLimiter::<HttpKey>::new(limits));
            for (i, name) in names.iter().enumerate() {
                let gauge = Arc::clone(&limiter);
                limiters.push((
                    name.clone(),
                    Box::new(move || {
                        gauge
                            .limits()
                            .get(i)
                            .map_or((0, 0), |limit| (limit.len(), limit.max_keys()))
                    }),
                ));
            }
            let layer = RateLimitLayer::builder(limiter)
                .name(base)
                .policy_names(names)
                .route(route.path.as_str())
                .key(key)
                .x_ratelimit_headers(true)
                .shadow(route.shadow)
                .build()?;
            handler.route_layer(layer)
        };
        router = router.route(&route.path, handler);
    }
    Ok((router, limiters))
}

/// Keys held and the most each limiter tracks, as gauges, once a second:
/// read off the request path (the `metrics` facade has no gauges computed
/// at scrape time, and setting them on every request would make every
/// request write one shared line).
async fn key_gauges(limiters: Limiters) {
    metrics::describe_gauge!(
        "turnstile_keys",
        metrics::Unit::Count,
        "Keys a limiter tracks now (idle ones count until evicted)"
    );
    metrics::describe_gauge!(
        "turnstile_max_keys",
        metrics::Unit::Count,
        "The most keys a limiter tracks at once"
    );
    let gauges: Vec<_> = limiters
        .into_iter()
        .map(|(name, read)| {
            let keys = metrics::gauge!("turnstile_keys", "limiter" => name.clone());
            let max = metrics::gauge!("turnstile_max_keys", "limiter" => name);
            (read, keys, max)
        })
        .collect();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        for (read, keys, max) in &gauges {
            let (live, most) = read();
            keys.set(live as f64);
            max.set(most as f64);
        }
    }
}

async fn ok() -> &'static str {
    "ok\n"
}

/// One debug line per request: method, path, status, time.
async fn log_request(request: Request, next: Next) -> Response {
    let (method, path) = (request.method().clone(), request.uri().path().to_owned());
    let started = Instant::now();
    let response = next.run(request).await;
    tracing::debug!(
        %method,
        %path,
        status = response.status().as_u16(),
        micros = started.elapsed().as_micros() as u64,
        "request"
    );
    response
}

async fn run() -> Result<(), Error> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let mut path = "examples/gateway.toml".to_owned();
    let mut limited = true;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--no-limit" => limited = false,
            _ => path = arg,
        }
    }
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    let config: Config = toml::from_str(&text).map_err(|e| format!("{path}: {e}"))?;

    // The layers take their counters at their first request: the recorder
    // only has to be installed before serving.
    let prometheus = PrometheusBuilder::new().install_recorder()?;
    let (app, limiters) = app(&config, limited)?;
    tokio::spawn(key_gauges(limiters));
    let app = app
        .route(
            "/metrics",
            get(move || {
                let prometheus = prometheus.clone();
                async move { prometheus.render() }
            }),
        )
        .layer(middleware::from_fn(log_request));

    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    tracing::info!(addr = %listener.local_addr()?, limited, "gateway listening");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("gateway: {error}");
            ExitCode::from(2)
        }
    }
}
