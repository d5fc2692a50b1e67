//! `turnstile`: the crate's command-line program.
//!
//! - `turnstile` prints the seed scenarios table, then the latency table.
//! - `turnstile scenarios`: the seed documents' scenarios, every algorithm,
//!   on a manual clock (exact, deterministic counts).
//! - `turnstile latency [--checks N] [--threads N] [--algorithm NAME]...`:
//!   per-check latency percentiles, beside the seeds' illustrative figures.
//! - `turnstile check --quota "10/s burst 20" [--requests N] [--interval 50ms]`:
//!   tries a quota string on the real clock, one decision per line.
//! - `turnstile fleet [--redis URL] [--gateways N] [--users N] [--quota Q]`
//!   (features `cli` and `redis`): simulated gateways sharing one quota
//!   through Redis, and the failure policies while Redis is stopped.
//!
//! `turnstile --help` (and `--help` on each subcommand) documents every flag.
//! Usage errors exit with status 2, as clap's do.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
