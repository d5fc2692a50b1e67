//! The load test: `ShouldRateLimit` calls from concurrent tonic clients,
//! reporting decisions per second and latency percentiles
//! (`benches/load.rs` runs it against both backends).

use std::fmt;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use hdrhistogram::Histogram;
use tonic::transport::Channel;

/// How to load the service.
#[derive(Clone, Debug)]
pub struct LoadPlan {
    /// The domain of every request.
    pub domain: String,
    /// The descriptor key; values cycle through `key_count` distinct ones.
    pub key: String,
    /// Distinct values of `key`.
    pub key_count: usize,
    /// HTTP/2 connections.
    pub connections: usize,
    /// Calls in flight at once (spread over the connections).
    pub concurrency: usize,
    /// Calls in all.
    pub requests: usize,
}

/// What a load test measured.
#[derive(Clone, Debug)]
pub struct LoadReport {
    /// Calls answered.
    pub calls: u64,
    /// Calls answered OVER_LIMIT.
    pub over_limit: u64,
    /// Calls that failed (gRPC errors).
    pub errors: u64,
    /// Wall time of the whole run.
    pub elapsed: Duration,
    /// Latency percentiles of one call: 50, 90, 99, 99.9.
    pub percentiles: [Duration; 4],
}

impl LoadReport {
    /// Decisions per second.
    pub fn rate(&self) -> f64 {
        self.calls as f64 / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }
}

impl fmt::Display for LoadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        write!(
            f,
            "{:>9.0} decisions/s  p50 {:>6.0} µs  p90 {:>6.0} µs  p99 {:>6.0} µs  p99.9 {:>6.0} µs  ({} calls, {} over limit, {} errors)",
            self.rate(),
            us(self.percentiles[0]),
            us(self.percentiles[1]),
            us(self.percentiles[2]),
            us(self.percentiles[3]),
            self.calls,
            self.over_limit,
            self.errors
        )
    }
}

/// Runs `plan` against the service at `addr`.
pub async fn run(addr: SocketAddr, plan: &LoadPlan) -> Result<LoadReport, tonic::transport::Error> {
    let mut channels = Vec::with_capacity(plan.connections.max(1));
    for _ in 0..plan.connections.max(1) {
        channels.push(
            Channel::from_shared(format!("http://{addr}"))
                .expect("a socket address is a valid URI")
                .connect()
                .await?,
        );
    }
    let workers = plan.concurrency.max(1);
    let per_worker = plan.requests / workers;
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(workers);
    for w in 0..workers {
        let mut client = RateLimitServiceClient::new(channels[w % channels.len()].clone());
        let plan = plan.clone();
        tasks.push(tokio::spawn(async move {
            // Microseconds, 1 µs to 10 s, 3 significant digits.
            let mut histogram = Histogram::<u64>::new_with_bounds(1, 10_000_000, 3)
                .expect("valid histogram bounds");
            let (mut over, mut errors) = (0u64, 0u64);
            for i in 0..per_worker {
                let value = format!("v{}", (w * per_worker + i) % plan.key_count.max(1));
                let request = RateLimitRequest {
                    domain: plan.domain.clone(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: vec![Entry {
                            key: plan.key.clone(),
                            value,
                        }],
                        ..Default::default()
                    }],
                    hits_addend: 0,
                };
                let sent = Instant::now();
                match client.should_rate_limit(request).await {
                    Ok(response) => {
                        let micros = sent.elapsed().as_micros().max(1);
                        histogram.saturating_record(u64::try_from(micros).unwrap_or(u64::MAX));
                        if response.get_ref().overall_code == Code::OverLimit as i32 {
                            over += 1;
                        }
                    }
                    Err(_) => errors += 1,
                }
            }
            (histogram, over, errors)
        }));
    }
    let mut total = Histogram::<u64>::new_with_bounds(1, 10_000_000, 3).expect("valid bounds");
    let (mut over, mut errors) = (0, 0);
    for task in tasks {
        if let Ok((histogram, o, e)) = task.await {
            let _ = total.add(&histogram);
            over += o;
            errors += e;
        }
    }
    let elapsed = started.elapsed();
    let at = |q: f64| Duration::from_micros(total.value_at_quantile(q));
    Ok(LoadReport {
        calls: total.len(),
        over_limit: over,
        errors,
        elapsed,
        percentiles: [at(0.50), at(0.90), at(0.99), at(0.999)],
    })
}
