//! The layer on a real tonic server (the generated grpc.health.v1 service
//! from tonic-health), called by a real tonic client over loopback: an
//! allowed call carries the rate-limit fields as metadata, a denied one is
//! `RESOURCE_EXHAUSTED` with the wait in `retry-after`,
//! `grpc-retry-pushback-ms` and a `google.rpc.RetryInfo` status detail, and
//! a refused key is `INVALID_ARGUMENT`.
#![cfg(feature = "tower")]

use std::time::Duration;

use tonic::transport::server::{TcpConnectInfo, TcpIncoming};
use tonic::transport::{Channel, Server};
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_types::StatusExt;
use turnstile_rl::http::{ClientIp, HttpKey, KeyExtractor, RateLimitLayer};
use turnstile_rl::{KeyedLimiter, ManualClock};

/// Serves the health service behind `layer` on a free loopback port;
/// returns a connected client.
async fn serve(layer: RateLimitLayer<KeyedLimiter<HttpKey, ManualClock>>) -> HealthClient<Channel> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (_reporter, health) = tonic_health::server::health_reporter();
    tokio::spawn(async move {
        Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .expect("serve");
    });
    let channel = Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .timeout(Duration::from_secs(30))
        .connect()
        .await
        .expect("connect");
    HealthClient::new(channel)
}

fn limiter() -> KeyedLimiter<HttpKey, ManualClock> {
    KeyedLimiter::builder("1/min".parse().expect("quota"))
        .clock(ManualClock::new())
        .build()
}

fn metadata<'a>(map: &'a tonic::metadata::MetadataMap, key: &str) -> Option<&'a str> {
    map.get(key).map(|v| v.to_str().expect("ASCII"))
}

#[tokio::test]
async fn a_denied_grpc_call_is_resource_exhausted_with_the_wait() {
    // tonic's peer address is its TcpConnectInfo.
    let client_ip = ClientIp::new()
        .peer_addr_from(|ext| ext.get::<TcpConnectInfo>().and_then(|c| c.remote_addr()));
    let layer = RateLimitLayer::builder(limiter())
        .name("health")
        .key(KeyExtractor::peer_ip().client_ip(client_ip))
        .build()
        .expect("layer");
    let mut client = serve(layer).await;

    let allowed = client
        .check(HealthCheckRequest::default())
        .await
        .expect("first call allowed");
    assert_eq!(
        allowed.get_ref().status,
        ServingStatus::Serving as i32,
        "the service answered"
    );
    assert_eq!(
        metadata(allowed.metadata(), "ratelimit-policy"),
        Some("\"health\";q=1;w=60")
    );
    assert_eq!(
        metadata(allowed.metadata(), "ratelimit"),
        Some("\"health\";r=0;t=60")
    );

    let denied = client
        .check(HealthCheckRequest::default())
        .await
        .expect_err("second call denied");
    assert_eq!(denied.code(), Code::ResourceExhausted, "{denied:?}");
    assert_eq!(
        denied.message(),
        "rate limit \"health\" exceeded; retry after 60 s"
    );
    assert_eq!(metadata(denied.metadata(), "retry-after"), Some("60"));
    assert_eq!(
        metadata(denied.metadata(), "grpc-retry-pushback-ms"),
        Some("60000")
    );
    assert_eq!(
        metadata(denied.metadata(), "ratelimit"),
        Some("\"health\";r=0;t=60")
    );
    // The richer error model: the exact wait as a google.rpc.RetryInfo in
    // the status details, read with tonic-types.
    let retry = denied
        .get_details_retry_info()
        .expect("a RetryInfo in the status details");
    assert_eq!(retry.retry_delay, Some(Duration::from_secs(60)));
}

#[tokio::test]
async fn a_grpc_call_without_its_key_is_invalid_argument() {
    let layer = RateLimitLayer::builder(limiter())
        .name("health")
        .key(KeyExtractor::header(
            tonic::codegen::http::HeaderName::from_static("x-api-key"),
        ))
        .build()
        .expect("layer");
    let mut client = serve(layer).await;
    let refused = client
        .check(HealthCheckRequest::default())
        .await
        .expect_err("no key");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert_eq!(refused.message(), "missing header \"x-api-key\"");

    let mut request = tonic::Request::new(HealthCheckRequest::default());
    request
        .metadata_mut()
        .insert("x-api-key", "k1".parse().expect("metadata"));
    client.check(request).await.expect("with a key");
}
