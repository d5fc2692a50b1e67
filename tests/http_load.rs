//! A bounded load run through a real server: 20,000 requests from 64
//! concurrent clients against one key whose bucket holds 1,000, on a frozen
//! clock. Exactly 1,000 must pass, and the metrics must say so, though the
//! recorder is installed after the layer is built.
#![cfg(feature = "tower")]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::http::{HeaderName, StatusCode};
use axum::routing::get;
use axum::Router;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;
use turnstile_rl::http::{ClientIp, HttpKey, KeyExtractor, RateLimitLayer, DECISIONS_METRIC};

use http_server::serve;
use turnstile_rl::{KeyedLimiter, ManualClock};
use turnstile_test_kit::http_server;

const REQUESTS: usize = 20_000;
const CLIENTS: usize = 64;
const BURST: u64 = 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_requests_admit_exactly_the_burst() {
    let clock = ManualClock::new();
    let limiter: KeyedLimiter<HttpKey, ManualClock> =
        KeyedLimiter::builder("1000/h".parse().expect("quota"))
            .clock(clock)
            .build();
    let layer = RateLimitLayer::builder(limiter)
        .name("api")
        .route("/api")
        .key(
            KeyExtractor::header(HeaderName::from_static("x-api-key")).client_ip(
                ClientIp::new().peer_addr_from(|e| e.get::<ConnectInfo<SocketAddr>>().map(|c| c.0)),
            ),
        )
        .build()
        .expect("layer");
    // The recorder after the layer: the layer takes its handles at its
    // first request, so the order does not matter.
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this test binary");
    let app = Router::new().route("/api", get(|| async { "data" }).layer(layer));

    let url = format!("{}/api", serve(app).await);

    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(CLIENTS)
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    let url = Arc::new(url);
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let (client, url) = (client.clone(), Arc::clone(&url));
        tasks.push(tokio::spawn(async move {
            let (mut ok, mut denied) = (0u64, 0u64);
            for _ in (c..REQUESTS).step_by(CLIENTS) {
                let response = client
                    .get(url.as_str())
                    .header("x-api-key", "shared-key")
                    .send()
                    .await
                    .expect("send");
                match response.status() {
                    StatusCode::OK => ok += 1,
                    StatusCode::TOO_MANY_REQUESTS => denied += 1,
                    other => panic!("unexpected status {other}"),
                }
            }
            (ok, denied)
        }));
    }
    let (mut ok, mut denied) = (0, 0);
    for task in tasks {
        let (o, d) = task.await.expect("client task");
        ok += o;
        denied += d;
    }
    assert_eq!(ok + denied, REQUESTS as u64);
    assert_eq!(ok, BURST);
    assert_eq!(denied, REQUESTS as u64 - BURST);

    let mut counted = std::collections::BTreeMap::new();
    for (key, _, description, value) in snapshotter.snapshot().into_vec() {
        assert!(description.is_some(), "no # HELP text for {key:?}");
        let key = key.into_parts();
        assert_eq!(key.0, MetricKind::Counter);
        let (name, labels) = key.1.into_parts();
        assert_eq!(name.as_str(), DECISIONS_METRIC);
        let labels: Vec<(String, String)> = labels
            .iter()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        assert!(labels.contains(&("limiter".into(), "api".into())));
        assert!(labels.contains(&("route".into(), "/api".into())));
        let outcome = labels
            .iter()
            .find(|(k, _)| k == "outcome")
            .map(|(_, v)| v.clone())
            .expect("outcome label");
        let DebugValue::Counter(n) = value else {
            panic!("not a counter: {value:?}")
        };
        counted.insert(outcome, n);
    }
    assert_eq!(counted.get("allowed"), Some(&BURST));
    assert_eq!(counted.get("denied"), Some(&(REQUESTS as u64 - BURST)));
    assert_eq!(counted.get("bad_key"), Some(&0));
    assert_eq!(counted.get("limiter_error"), Some(&0));
    assert_eq!(counted.get("shadow_denied"), Some(&0));
}
