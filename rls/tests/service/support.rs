//! What the service's tests share: a configuration directory, a service on
//! a free loopback port, a real tonic client, and request builders.
#![allow(dead_code)] // each test binary uses its own part

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::transport::Channel;
use turnstile_rls::{RunningService, Settings};

/// A directory of configuration files, removed on drop.
#[derive(Debug)]
pub struct ConfigDir(PathBuf);

impl ConfigDir {
    pub fn new() -> ConfigDir {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("turnstile-rls-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create the config dir");
        ConfigDir(path)
    }

    /// A directory holding `name` with `yaml`.
    pub fn with(name: &str, yaml: &str) -> ConfigDir {
        let dir = ConfigDir::new();
        dir.write(name, yaml);
        dir
    }

    pub fn write(&self, name: &str, yaml: &str) {
        std::fs::write(self.0.join(name), yaml).expect("write a config file");
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ConfigDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Settings for `dir` on free loopback ports.
pub fn settings(dir: &ConfigDir) -> Settings {
    let mut settings = Settings::new(dir.path());
    settings.grpc_addr = "127.0.0.1:0".parse().expect("addr");
    settings.metrics_addr = "127.0.0.1:0".parse().expect("addr");
    // Reloads only when a test asks (tests/service/deploy.rs turns it on).
    settings.watch_interval_ms = 0;
    settings
}

/// A running service and a client connected to it.
pub struct Harness {
    pub service: RunningService,
    pub client: RateLimitServiceClient<Channel>,
}

pub async fn start(settings: Settings) -> Harness {
    let service = turnstile_rls::start(settings)
        .await
        .expect("the service starts");
    let client = connect(service.grpc_addr).await;
    Harness { service, client }
}

pub async fn connect(addr: std::net::SocketAddr) -> RateLimitServiceClient<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .timeout(Duration::from_secs(30))
        .connect()
        .await
        .expect("connect");
    RateLimitServiceClient::new(channel)
}

/// One descriptor from `key=value` pairs (an empty value stays empty).
pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).into(),
                value: (*value).into(),
            })
            .collect(),
        ..Default::default()
    }
}

pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    }
}

impl Harness {
    pub async fn ask(&mut self, request: RateLimitRequest) -> RateLimitResponse {
        self.client
            .should_rate_limit(request)
            .await
            .expect("ShouldRateLimit answers")
            .into_inner()
    }

    /// Sends one descriptor `n` times; the codes answered.
    pub async fn codes(&mut self, domain: &str, entries: &[(&str, &str)], n: usize) -> Vec<Code> {
        let mut codes = Vec::with_capacity(n);
        for _ in 0..n {
            let response = self.ask(request(domain, vec![descriptor(entries)])).await;
            codes.push(code(response.overall_code));
        }
        codes
    }

    /// How many of `n` sends of one descriptor were OK.
    pub async fn admitted(&mut self, domain: &str, entries: &[(&str, &str)], n: usize) -> usize {
        self.codes(domain, entries, n)
            .await
            .into_iter()
            .filter(|c| *c == Code::Ok)
            .count()
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> String {
        metrics_text(self.service.metrics_addr).await
    }
}

/// GETs `/metrics` with a plain HTTP/1.0 request.
pub async fn metrics_text(addr: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to /metrics");
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await
        .expect("send");
    let mut text = String::new();
    stream.read_to_string(&mut text).await.expect("read");
    assert!(
        text.starts_with("HTTP/1.0 200") || text.starts_with("HTTP/1.1 200"),
        "{text}"
    );
    text
}

/// The value of the sample `name{labels}` in a metrics text (labels as
/// rendered, in order), if present.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        line.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

pub fn code(raw: i32) -> Code {
    Code::try_from(raw).expect("a known code")
}

pub fn status_code(status: &DescriptorStatus) -> Code {
    code(status.code)
}

/// The generated client on a tonic channel.
pub type Client = RateLimitServiceClient<Channel>;

/// The `turnstile-rls` command on `dir`, on free loopback ports.
pub fn command(dir: &ConfigDir) -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_turnstile-rls"));
    command.arg("--config").arg(dir.path()).args([
        "--grpc-addr",
        "127.0.0.1:0",
        "--metrics-addr",
        "127.0.0.1:0",
        "--watch-interval-ms",
        "0",
    ]);
    command
}

/// envoyproxy/ratelimit's statistic `stat` of `descriptor` in `domain`, in
/// a metrics text; panics with the text when it is missing.
pub fn stat(text: &str, domain: &str, descriptor: &str, stat: &str) -> f64 {
    let name = format!(
        "ratelimit_service_rate_limit_{stat}{{domain=\"{domain}\",descriptor=\"{descriptor}\"}}"
    );
    sample(text, &name).unwrap_or_else(|| panic!("{name} in\n{text}"))
}

/// The settings a deployment written for envoyproxy/ratelimit gives the
/// service: the peer's variables `vars` (read as `main` reads the process'
/// environment), fixed windows (the one setting the README's migration
/// section adds), free loopback ports, then `args`.
pub fn peer_env_settings(vars: &[(&str, String)], args: &[&str]) -> Settings {
    let mut argv = vec![
        "turnstile-rls",
        "--grpc-addr",
        "127.0.0.1:0",
        "--metrics-addr",
        "127.0.0.1:0",
        "--default-algorithm",
        "fixed_window",
    ];
    argv.extend_from_slice(args);
    Settings::parse_with_peer_env(argv, |name| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.clone())
    })
    .expect("the peer's variables are read")
}
