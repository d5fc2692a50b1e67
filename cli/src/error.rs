//! What makes a command stop: each failure the program reports as
//! `error: <message>`, with an exit status that says which kind it was
//! ([`CliError::exit_code`]), and the one it keeps quiet.

use std::io;
use std::num::TryFromIntError;
use std::time::Duration;

use turnstile_rl::{QuotaError, QuotasError};

/// Why a command stopped. Every variant but [`CliError::BrokenPipe`] is
/// printed as `error: <message>` and exits with its kind's status
/// ([`CliError::exit_code`]).
#[derive(Debug, thiserror::Error)]
pub(crate) enum CliError {
    /// A quota that does not parse or is out of range, or that the chosen
    /// algorithm cannot hold.
    #[error(transparent)]
    Quota(#[from] QuotaError),
    /// A list of quotas that does not parse or does not combine.
    #[error(transparent)]
    Quotas(#[from] QuotasError),
    /// `check` given several quotas and an algorithm other than GCRA.
    #[error("several quotas combine under GCRA only: drop --algorithm, or give one quota")]
    SeveralQuotasNeedGcra,
    /// A `check` run that would last longer than `max`.
    #[error(
        "{requests} requests {interval:?} apart would run for {run_time:?}, more than {max:?}"
    )]
    RunTooLong {
        /// Requests asked for.
        requests: u32,
        /// Time between two of them.
        interval: Duration,
        /// How long the run would last.
        run_time: Duration,
        /// The longest run allowed.
        max: Duration,
    },
    /// A thread count this platform cannot hold.
    #[error(transparent)]
    ThreadCount(#[from] TryFromIntError),
    /// Fewer checks than threads: a thread would measure nothing.
    #[error(
        "--checks {checks} is fewer than the {threads} threads: every thread needs at least one check"
    )]
    FewerChecksThanThreads {
        /// Checks asked for.
        checks: u64,
        /// Threads asked for.
        threads: usize,
    },
    /// Standard output was closed (`turnstile latency | head`): the reader
    /// has what it wanted, so the program stops quietly, with success.
    #[error("standard output was closed")]
    BrokenPipe,
    /// Writing the output, or starting a runtime or a server, failed.
    #[error(transparent)]
    Io(io::Error),
    /// A Redis limiter that could not be built (`fleet`): a bad URL or
    /// setting, or (for a cluster, which connects at once) no answer.
    #[cfg(feature = "redis")]
    #[error(transparent)]
    RedisBuild(#[from] turnstile_rl::redis::RedisBuildError),
    /// The Redis server given with `--redis` did not answer (`fleet` asks
    /// it once before the gateways start).
    #[cfg(feature = "redis")]
    #[error("Redis at {url} did not answer: {source}")]
    RedisUnavailable {
        /// The URL given.
        url: String,
        /// Why: a timeout, a refused connection, Redis's own error.
        source: turnstile_rl::redis::RedisCallError,
    },
    /// A Redis check that failed (`fleet`).
    #[cfg(feature = "redis")]
    #[error(transparent)]
    RedisLimit(#[from] turnstile_rl::redis::RedisLimitError),
    /// A simulated gateway's task that panicked or was cancelled (`fleet`).
    #[cfg(feature = "redis")]
    #[error(transparent)]
    Gateway(#[from] tokio::task::JoinError),
}

/// Exit status of a usage error: a bad flag value. clap exits with the
/// same status for a bad flag, so a script sees one status for every
/// mistake in the command line.
pub(crate) const EXIT_USAGE: u8 = 2;
/// Exit status when a service the command needs did not answer (Redis):
/// sysexits' `EX_UNAVAILABLE`. Worth retrying; the command line is fine.
// Only `fleet` (feature `redis`) can fail this way; `--help` lists it always.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) const EXIT_UNAVAILABLE: u8 = 69;
/// Exit status of an internal failure (a gateway task that panicked, a
/// Redis reply the command did not expect): sysexits' `EX_SOFTWARE`.
// Only `fleet` (feature `redis`) has such failures; `--help` lists it always.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) const EXIT_SOFTWARE: u8 = 70;
/// Exit status of an I/O failure (writing the output, starting a runtime
/// or a redis-server): sysexits' `EX_IOERR`.
pub(crate) const EXIT_IO: u8 = 74;

impl CliError {
    /// Whether the program should stop without a message, with success.
    pub(crate) fn is_silent(&self) -> bool {
        matches!(self, CliError::BrokenPipe)
    }

    /// The process's exit status for this failure.
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            CliError::Quota(_)
            | CliError::Quotas(_)
            | CliError::SeveralQuotasNeedGcra
            | CliError::RunTooLong { .. }
            | CliError::ThreadCount(_)
            | CliError::FewerChecksThanThreads { .. } => EXIT_USAGE,
            CliError::BrokenPipe => 0,
            CliError::Io(_) => EXIT_IO,
            #[cfg(feature = "redis")]
            CliError::RedisBuild(turnstile_rl::redis::RedisBuildError::Connect(error))
                if error.is_io_error() || error.is_timeout() =>
            {
                EXIT_UNAVAILABLE
            }
            #[cfg(feature = "redis")]
            CliError::RedisBuild(_) => EXIT_USAGE,
            #[cfg(feature = "redis")]
            CliError::RedisUnavailable { .. }
            | CliError::RedisLimit(turnstile_rl::redis::RedisLimitError::Unavailable(_)) => {
                EXIT_UNAVAILABLE
            }
            #[cfg(feature = "redis")]
            CliError::RedisLimit(_) | CliError::Gateway(_) => EXIT_SOFTWARE,
        }
    }
}

impl From<io::Error> for CliError {
    fn from(error: io::Error) -> Self {
        if error.kind() == io::ErrorKind::BrokenPipe {
            CliError::BrokenPipe
        } else {
            CliError::Io(error)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_stdout_stops_quietly_and_other_errors_keep_their_message() {
        let closed = CliError::from(io::Error::from(io::ErrorKind::BrokenPipe));
        assert!(closed.is_silent());
        let full = CliError::from(io::Error::other("disk full"));
        assert!(!full.is_silent());
        assert_eq!(full.to_string(), "disk full");
        assert_eq!(full.exit_code(), EXIT_IO);
        assert_eq!(CliError::SeveralQuotasNeedGcra.exit_code(), EXIT_USAGE);
    }
}
