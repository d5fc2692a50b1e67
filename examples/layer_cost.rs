//! The CPU cost of the rate-limit layer alone, without a network: one
//! thread drives a trivial service through `tower` with and without the
//! layer, for admitted and for refused requests, and prints ns per request.
//!
//! ```text
//! cargo run --release --example layer_cost --features tower
//! ```
//!
//! The end-to-end figures (a real server under wrk) come from
//! `scripts/http_overhead.sh`.

use std::convert::Infallible;
use std::hint::black_box;
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderName, Request, Response};
use tower::Layer;
use tower::{Service, ServiceExt};
use turnstile_rl::http::{HttpKey, KeyExtractor, RateLimitLayer};
use turnstile_rl::KeyedLimiter;

const REQUESTS: u32 = 1_000_000;

fn request() -> Request<()> {
    let mut request = Request::new(());
    request
        .headers_mut()
        .insert("x-api-key", http::HeaderValue::from_static("bench-key"));
    request
}

async fn ns_per_request<S>(mut service: S) -> f64
where
    S: Service<Request<()>, Error = Infallible>,
{
    let started = Instant::now();
    for _ in 0..REQUESTS {
        let response = match service.ready().await {
            Ok(ready) => ready.call(request()).await,
            Err(never) => match never {},
        };
        let _ = black_box(response);
    }
    started.elapsed().as_nanos() as f64 / f64::from(REQUESTS)
}

async fn ns_per_axum(mut router: axum::Router) -> f64 {
    let started = Instant::now();
    for _ in 0..REQUESTS {
        let mut request = request().map(|()| axum::body::Body::empty());
        *request.uri_mut() = http::Uri::from_static("/");
        let ready = ServiceExt::<Request<axum::body::Body>>::ready(&mut router).await;
        let response = match ready {
            Ok(ready) => ready.call(request).await,
            Err(never) => match never {},
        };
        let _ = black_box(response);
    }
    started.elapsed().as_nanos() as f64 / f64::from(REQUESTS)
}

fn layered(
    quota: &str,
) -> Result<RateLimitLayer<KeyedLimiter<HttpKey>>, Box<dyn std::error::Error>> {
    Ok(
        RateLimitLayer::builder(KeyedLimiter::<HttpKey>::new(quota.parse()?))
            .name("api")
            .key(KeyExtractor::header(HeaderName::from_static("x-api-key")))
            .build()?,
    )
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let inner = tower::service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Bytes::from_static(b"ok")))
    });
    let bare = ns_per_request(inner).await;
    let allowed = ns_per_request(layered("1000000000/min")?.layer(inner)).await;
    let denied = ns_per_request(layered("1/h")?.layer(inner)).await;
    let router = |limited: bool| -> Result<axum::Router, Box<dyn std::error::Error>> {
        let handler = axum::routing::get(|| async { "ok" });
        let handler = if limited {
            handler.layer(layered("1000000000/min")?)
        } else {
            handler
        };
        Ok(axum::Router::new().route("/", handler))
    };
    let axum_bare = ns_per_axum(router(false)?).await;
    let axum_allowed = ns_per_axum(router(true)?).await;
    println!("{REQUESTS} requests on one thread, ns per request:");
    println!("  without the layer      {bare:8.1}");
    println!(
        "  with it, all admitted  {allowed:8.1}  (+{:.1})",
        allowed - bare
    );
    println!("  with it, all refused   {denied:8.1}  (a 429 with a problem+json body)");
    println!("an axum Router, in process:");
    println!("  without the layer      {axum_bare:8.1}");
    println!(
        "  with it, all admitted  {axum_allowed:8.1}  (+{:.1})",
        axum_allowed - axum_bare
    );
    Ok(())
}
