//! `turnstile`: the workspace's command-line program (package `turnstile-cli`).
//!
//! - `turnstile` prints the seed scenarios table, then the latency table.
//! - `turnstile scenarios`: the seed documents' scenarios, every algorithm,
//!   on a manual clock (exact, deterministic counts).
//! - `turnstile latency [--checks N] [--threads N] [--algorithm NAME]...`:
//!   per-check latency percentiles, beside the seeds' illustrative figures.
//! - `turnstile check --quota "10/s burst 20" [--requests N] [--interval 50ms]`:
//!   tries a quota string on the real clock, one decision per line.
//! - `turnstile fleet [--redis URL] [--gateways N] [--users N] [--quota Q]`
//!   (feature `redis`): simulated gateways sharing one quota
//!   through Redis, and the failure policies while Redis is stopped.
//!
//! `turnstile --help` (and `--help` on each subcommand) documents every flag.
//! Exit status: 0 on success (and when standard output is closed early), 2
//! for a usage error (a bad flag, as clap's, or a bad value), 69 when Redis
//! did not answer, 70 for an internal failure, 74 for an I/O error: the
//! constants in `error.rs`, printed by `--help`.
//!
//! The flags are clap derive; each subcommand is its own module.

mod check;
mod error;
#[cfg(feature = "redis")]
mod fleet;
mod latency;
mod limiter;
mod scenarios;

use std::io::{self, Write};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// turnstile: a lock-free, in-process rate limiter (GCRA in one AtomicU64).
///
/// Without a subcommand, prints the seed scenarios table and then the
/// latency table (the flags below are the `latency` flags).
#[derive(Debug, Parser)]
#[command(
    name = "turnstile",
    version,
    args_conflicts_with_subcommands = true,
    after_help = EXIT_STATUS
)]
struct Cli {
    /// What to run; both tables when omitted.
    #[command(subcommand)]
    command: Option<Command>,
    /// Latency flags, for the default run.
    #[command(flatten)]
    latency: latency::LatencyArgs,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
enum Command {
    /// The seed documents' scenarios on a manual clock: admitted / denied
    /// per algorithm, exact and deterministic.
    Scenarios,
    /// Per-check latency (mean, P50, P95, P99, P99.9) of every algorithm,
    /// on one thread and on all cores, beside the seeds' illustrative figures.
    Latency(latency::LatencyArgs),
    /// Tries a quota on the real clock: runs N checks and prints each
    /// decision (allowed or denied, remaining, retry_after).
    Check(check::CheckArgs),
    /// N simulated gateways share one quota through Redis: admitted and
    /// denied per user next to the limit, then (with its own redis-server)
    /// what each failure policy does while Redis is stopped.
    #[cfg(feature = "redis")]
    Fleet(fleet::FleetArgs),
}

use error::CliError;

/// The exit statuses, for `--help` (each number is its constant's in
/// `error.rs`; a test holds the two together).
const EXIT_STATUS: &str = "Exit status: 0 success; 2 usage error (a bad flag or value); \
69 Redis did not answer (fleet); 70 internal failure; 74 I/O error.";

/// Parses the command line, runs the command, and maps failures to an exit
/// status ([`CliError::exit_code`]): clap's own for bad flags, 0 on success.
fn main() -> ExitCode {
    let cli = Cli::parse();
    let stdout = io::stdout();
    let mut out = stdout.lock();
    let result = match cli.command {
        None => scenarios::run(&mut out)
            .and_then(|()| writeln!(out).map_err(CliError::from))
            .and_then(|()| latency::run(&cli.latency, &mut out)),
        Some(Command::Scenarios) => scenarios::run(&mut out),
        Some(Command::Latency(args)) => latency::run(&args, &mut out),
        Some(Command::Check(args)) => check::run(&args, &mut out),
        #[cfg(feature = "redis")]
        Some(Command::Fleet(args)) => fleet::run(&args, &mut out),
    };
    let _ = out.flush();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) if error.is_silent() => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn help_states_the_exit_statuses_the_constants_hold() {
        use error::{EXIT_IO, EXIT_SOFTWARE, EXIT_UNAVAILABLE, EXIT_USAGE};
        for (code, what) in [
            (EXIT_USAGE, "usage error"),
            (EXIT_UNAVAILABLE, "Redis did not answer"),
            (EXIT_SOFTWARE, "internal failure"),
            (EXIT_IO, "I/O error"),
        ] {
            assert!(
                EXIT_STATUS.contains(&format!("{code} {what}")),
                "{code} {what}"
            );
        }
    }

    #[test]
    fn latency_flags_work_with_and_without_the_subcommand() {
        let cli = Cli::try_parse_from(["turnstile", "--checks", "5000"]).unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.latency.checks, 5000);
        let cli = Cli::try_parse_from(["turnstile", "latency", "--threads", "2"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Latency(ref a)) if a.threads == Some(2)));
        assert!(Cli::try_parse_from(["turnstile", "--checks", "0"]).is_err());
        assert!(Cli::try_parse_from(["turnstile", "--bogus"]).is_err());
    }
}
