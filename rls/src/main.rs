//! `turnstile-rls`: the service's command. Flags and environment variables
//! are in `--help` and rls/README.md.

use std::process::ExitCode;

use turnstile_rls::{server, Settings};

#[tokio::main]
async fn main() -> ExitCode {
    let settings =
        match Settings::parse_with_peer_env(std::env::args_os(), |name| std::env::var(name).ok()) {
            Ok(settings) => settings,
            Err(turnstile_rls::peer_env::PeerEnvError::Args(e)) => e.exit(),
            Err(e) => {
                eprintln!("turnstile-rls: {e}");
                return ExitCode::FAILURE;
            }
        };
    if let Err(e) = turnstile_rls::logging::init(&settings.log_level, &settings.log_format) {
        eprintln!("turnstile-rls: {e}");
        return ExitCode::FAILURE;
    }
    let backend = settings.backend;
    let running = match server::start(settings).await {
        Ok(running) => running,
        Err(e) => {
            tracing::error!(error = %e, "turnstile-rls cannot start");
            return ExitCode::FAILURE;
        }
    };
    let mut domains: Vec<String> = running
        .engine
        .rules()
        .domains()
        .map(str::to_owned)
        .collect();
    domains.sort();
    // Before the line below: whoever reads it may send SIGHUP at once.
    #[cfg(unix)]
    match server::reload_on_sighup(running.engine.clone()) {
        Ok(reloads) => drop(tokio::spawn(reloads)),
        Err(e) => tracing::warn!(error = %e, "no reloads on SIGHUP"),
    }
    // One line on stdout with the bound addresses (ports chosen by the OS
    // when asked for 0): scripts and tests read it.
    println!(
        "turnstile-rls listening: grpc={} metrics=http://{}/metrics backend={backend:?} domains={}",
        running.grpc_addr,
        running.metrics_addr,
        domains.join(",")
    );
    tracing::info!(
        grpc = %running.grpc_addr,
        metrics = %running.metrics_addr,
        backend = ?backend,
        domains = %domains.join(","),
        "turnstile-rls serving"
    );
    let _ = tokio::signal::ctrl_c().await;
    ExitCode::SUCCESS
}
