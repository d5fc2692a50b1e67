//! The layer's metrics through a real server: a shadow-mode layer counts
//! what it would have denied as `shadow_denied`, every series has its
//! `# HELP` text in the Prometheus exposition, and the recorder may be
//! installed after the layers are built.
#![cfg(feature = "tower")]

use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusBuilder;
use turnstile_rl::http::{HttpKey, KeyExtractor, RateLimitLayer, DECISIONS_METRIC};
use turnstile_rl::{KeyedLimiter, ManualClock};

use http_server::serve;
use turnstile_test_kit::http_server;

#[tokio::test]
async fn shadow_denials_are_counted_and_every_series_is_described() {
    let limiter: KeyedLimiter<HttpKey, ManualClock> =
        KeyedLimiter::builder("2/min".parse().expect("quota"))
            .clock(ManualClock::new())
            .build();
    let layer = RateLimitLayer::builder(limiter)
        .name("search")
        .route("/search")
        .key(KeyExtractor::global())
        .shadow(true)
        .build()
        .expect("layer");
    // Installed after the layer was built, before traffic.
    let prometheus = PrometheusBuilder::new()
        .install_recorder()
        .expect("the only recorder of this test binary");
    let app = Router::new().route("/search", get(|| async { "results" }).route_layer(layer));
    let url = format!("{}/search", serve(app).await);
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    for _ in 0..5 {
        let response = client.get(&url).send().await.expect("send");
        assert_eq!(response.status(), reqwest::StatusCode::OK);
    }

    let text = prometheus.render();
    let series = |outcome: &str| {
        format!("{DECISIONS_METRIC}{{limiter=\"search\",route=\"/search\",outcome=\"{outcome}\"}}")
    };
    let value = |outcome: &str| -> Option<u64> {
        let prefix = series(outcome);
        text.lines()
            .find_map(|line| line.strip_prefix(prefix.as_str()))
            .map(|v| v.trim().parse().expect("a count"))
    };
    assert_eq!(value("allowed"), Some(2), "{text}");
    assert_eq!(value("shadow_denied"), Some(3), "{text}");
    assert_eq!(value("denied"), Some(0), "{text}");
    assert!(
        text.contains(&format!("# HELP {DECISIONS_METRIC} ")),
        "no # HELP line:\n{text}"
    );
}
