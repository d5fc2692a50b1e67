//! The service's log: `tracing` events on stderr, as text or JSON lines
//! (`--log-format`, envoyproxy/ratelimit's `LOG_FORMAT`), filtered by
//! `--log-level` (`LOG_LEVEL`, the peer's level names).

use tracing::level_filters::LevelFilter;

/// A log setting the service does not know.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogSettingError {
    /// `--log-level`.
    #[error("unknown log level `{0}`: expected trace, debug, info, warn, error, fatal or panic")]
    Level(String),
    /// `--log-format`.
    #[error("unknown log format `{0}`: expected text or json")]
    Format(String),
}

/// The level filter for a level name (case-insensitive; logrus' `fatal`
/// and `panic` are `error` here).
pub fn level(name: &str) -> Result<LevelFilter, LogSettingError> {
    Ok(match name.to_ascii_lowercase().as_str() {
        "trace" => LevelFilter::TRACE,
        "debug" => LevelFilter::DEBUG,
        "info" => LevelFilter::INFO,
        "warn" | "warning" => LevelFilter::WARN,
        "error" | "fatal" | "panic" => LevelFilter::ERROR,
        _ => return Err(LogSettingError::Level(name.to_owned())),
    })
}

/// Installs the process's subscriber (once; a second call changes nothing).
pub fn init(level_name: &str, format: &str) -> Result<(), LogSettingError> {
    let level = level(level_name)?;
    let builder = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        // A closed stderr must not stop the service: by default the
        // subscriber reports a failed write with `eprintln!`, which panics
        // when stderr itself is the failure (seen when a supervisor closed
        // the pipe: the process exited 101 at its next event).
        .log_internal_errors(false);
    let _ = match format.to_ascii_lowercase().as_str() {
        "text" => builder.try_init(),
        "json" => builder.json().try_init(),
        _ => return Err(LogSettingError::Format(format.to_owned())),
    };
    Ok(())
}
