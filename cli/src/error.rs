//! What makes a command stop: each failure the program reports as
//! `error: <message>` with exit status 2, and the one it keeps quiet.

use std::io;
use std::num::TryFromIntError;
use std::time::Duration;

use turnstile_rl::{QuotaError, QuotasError};

/// Why a command stopped. Every variant but [`UsageError::BrokenPipe`] is
/// printed as `error: <message>` and exits with status 2.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UsageError {
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
    /// A Redis limiter that could not be built (`fleet`).
    #[cfg(feature = "redis")]
    #[error(transparent)]
    RedisBuild(#[from] turnstile_rl::redis::RedisBuildError),
    /// A Redis check that failed (`fleet`).
    #[cfg(feature = "redis")]
    #[error(transparent)]
    RedisLimit(#[from] turnstile_rl::redis::RedisLimitError),
    /// A simulated gateway's task that panicked or was cancelled (`fleet`).
    #[cfg(feature = "redis")]
    #[error(transparent)]
    Gateway(#[from] tokio::task::JoinError),
}

impl UsageError {
    /// Whether the program should stop without a message, with success.
    pub(crate) fn is_silent(&self) -> bool {
        matches!(self, UsageError::BrokenPipe)
    }
}

impl From<io::Error> for UsageError {
    fn from(error: io::Error) -> Self {
        if error.kind() == io::ErrorKind::BrokenPipe {
            UsageError::BrokenPipe
        } else {
            UsageError::Io(error)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_stdout_stops_quietly_and_other_errors_keep_their_message() {
        let closed = UsageError::from(io::Error::from(io::ErrorKind::BrokenPipe));
        assert!(closed.is_silent());
        let full = UsageError::from(io::Error::other("disk full"));
        assert!(!full.is_silent());
        assert_eq!(full.to_string(), "disk full");
    }
}
