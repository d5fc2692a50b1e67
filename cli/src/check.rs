//! `turnstile check`: try a quota string on the real clock.

use std::io::Write;
use std::time::{Duration, Instant};

use clap::Args;
use turnstile_rl::{Decision, MultiLimiter, QuantaClock, Quota, Quotas};

use super::limiter::Algorithm;
use super::CliError;

/// The longest a `check` run may take (requests x interval).
const MAX_RUN: Duration = Duration::from_secs(600);

/// Flags of `turnstile check`.
#[derive(Debug, Args)]
pub(crate) struct CheckArgs {
    /// The quota to try, in the library's syntax: COUNT/PERIOD [burst B],
    /// for example "100/min", "10/s burst 20", "3/1.5s". Several limits on
    /// the same requests (GCRA only): a list such as "10/s burst 20;
    /// 1000/h", or the flag given again; a request passes only if every
    /// limit admits it, and the "limit" column names the binding one.
    #[arg(long, value_name = "QUOTA", required = true)]
    quota: Vec<String>,
    /// How many checks to run.
    #[arg(long, default_value_t = 10, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    requests: u32,
    /// Time between two checks: a number and a unit (ns, us, ms, s, min),
    /// for example 50ms or 1.5s; 0 sends them back to back. The whole run
    /// may last at most 10 minutes.
    #[arg(long, default_value = "0", value_name = "DURATION", value_parser = parse_interval)]
    interval: Duration,
    /// The algorithm that decides.
    #[arg(long, value_enum, default_value_t = Algorithm::Gcra)]
    algorithm: Algorithm,
}

/// Parses `[number] unit`, or a bare `0`, into a duration.
fn parse_interval(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = (&text[..split], text[split..].trim());
    let seconds_per_unit = match unit {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "min" => 60.0,
        "" => {
            return Err(format!(
                "{text:?} has no unit: write one of ns, us, ms, s, min (for example 50ms)"
            ))
        }
        other => {
            return Err(format!(
                "unknown unit {other:?}: expected one of ns, us, ms, s, min"
            ))
        }
    };
    let number: f64 = number
        .parse()
        .map_err(|_| format!("{number:?} is not a number (expected digits, for example 50ms)"))?;
    let seconds = number * seconds_per_unit;
    if seconds > MAX_RUN.as_secs_f64() {
        return Err(format!("an interval of {text} is longer than {MAX_RUN:?}"));
    }
    Duration::try_from_secs_f64(seconds).map_err(|e| e.to_string())
}

/// Runs the checks and prints one line per decision.
pub(crate) fn run(args: &CheckArgs, out: &mut impl Write) -> Result<(), CliError> {
    let quotas: Quotas = args.quota.join(";").parse()?;
    if quotas.len() > 1 {
        if args.algorithm != Algorithm::Gcra {
            return Err(CliError::SeveralQuotasNeedGcra);
        }
        return run_multi(args, quotas, out);
    }
    let quota: Quota = quotas.as_slice()[0];
    check_run_time(args)?;
    let limiter = args.algorithm.build(quota, QuantaClock::new())?;
    match args.algorithm {
        Algorithm::Gcra => writeln!(
            out,
            "quota \"{quota}\" (GCRA): burst {}, one token back every {:?}",
            quota.burst_size(),
            quota.emission_interval()
        )?,
        _ => writeln!(
            out,
            "quota \"{quota}\" ({}): {} requests per window of {:?} (burst ignored)",
            args.algorithm.name(),
            quota.count(),
            quota.period()
        )?,
    }
    paced(args, out, false, || (limiter.check(), 0))
}

/// `check` with several quotas: one `MultiLimiter`.
fn run_multi(args: &CheckArgs, quotas: Quotas, out: &mut impl Write) -> Result<(), CliError> {
    check_run_time(args)?;
    writeln!(out, "quotas \"{quotas}\" (GCRA, all must admit):")?;
    for (i, quota) in quotas.as_slice().iter().enumerate() {
        writeln!(
            out,
            "  limit {i}: \"{quota}\", burst {}, one token back every {:?}",
            quota.burst_size(),
            quota.emission_interval()
        )?;
    }
    let limiter = MultiLimiter::new(quotas);
    paced(args, out, true, || {
        let d = limiter.check();
        (d.decision(), d.binding())
    })
}

fn check_run_time(args: &CheckArgs) -> Result<(), CliError> {
    let run_time = args.interval.saturating_mul(args.requests - 1);
    if run_time > MAX_RUN {
        return Err(CliError::RunTooLong {
            requests: args.requests,
            interval: args.interval,
            run_time,
            max: MAX_RUN,
        });
    }
    Ok(())
}

/// Runs `args.requests` checks `args.interval` apart, one line each (with
/// the binding limit when `multi`).
fn paced(
    args: &CheckArgs,
    out: &mut impl Write,
    multi: bool,
    check: impl Fn() -> (Decision, usize),
) -> Result<(), CliError> {
    write!(
        out,
        "{:>6}  {:>10}  {:<8}  {:>9}  {:>14}  {:>14}",
        "#", "time", "decision", "remaining", "retry_after", "reset_after"
    )?;
    writeln!(out, "{}", if multi { "  limit" } else { "" })?;
    let start = Instant::now();
    for i in 0..args.requests {
        let due = start + args.interval.saturating_mul(i);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let (decision, binding) = check();
        let at = start.elapsed();
        write!(
            out,
            "{:>6}  {:>9.3}s  {:<8}  {:>9}  {:>14}  {:>14}",
            i + 1,
            at.as_secs_f64(),
            if decision.is_allowed() {
                "allowed"
            } else {
                "denied"
            },
            decision.remaining(),
            decision
                .retry_after()
                .map_or_else(|| "-".to_owned(), |d| format!("{d:?}")),
            format!("{:?}", decision.reset_after()),
        )?;
        if multi {
            write!(out, "  {binding:>5}")?;
        }
        writeln!(out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_parse_with_units_and_refuse_nonsense() {
        assert_eq!(parse_interval("0"), Ok(Duration::ZERO));
        assert_eq!(parse_interval("50ms"), Ok(Duration::from_millis(50)));
        assert_eq!(parse_interval("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_interval("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_interval("2min"), Ok(Duration::from_secs(120)));
        assert!(parse_interval("50").unwrap_err().contains("no unit"));
        assert!(parse_interval("5 fortnights")
            .unwrap_err()
            .contains("fortnights"));
        assert!(parse_interval("x ms").is_err());
        assert!(parse_interval("1e99s").is_err());
        assert!(parse_interval("99999999999min").is_err());
        assert!(parse_interval("-5ms").is_err());
    }

    #[test]
    fn a_bad_quota_is_a_usage_error() {
        let args = CheckArgs {
            quota: vec!["0/s".into()],
            requests: 1,
            interval: Duration::ZERO,
            algorithm: Algorithm::Gcra,
        };
        let message = run(&args, &mut Vec::new()).unwrap_err().to_string();
        assert!(message.contains("count is 0"), "{message}");
    }

    #[test]
    fn a_quota_the_window_cannot_hold_is_a_usage_error() {
        let args = CheckArgs {
            quota: vec!["5/100ms".into()],
            requests: 1,
            interval: Duration::ZERO,
            algorithm: Algorithm::SlidingWindow,
        };
        let message = run(&args, &mut Vec::new()).unwrap_err().to_string();
        assert!(message.contains("sliding window"), "{message}");
    }

    #[test]
    fn a_burst_prints_one_line_per_decision() {
        let args = CheckArgs {
            quota: vec!["1/min burst 3".into()],
            requests: 4,
            interval: Duration::ZERO,
            algorithm: Algorithm::Gcra,
        };
        let mut out = Vec::new();
        run(&args, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.matches("allowed").count(), 3, "{text}");
        assert_eq!(text.matches("denied").count(), 1, "{text}");
    }

    #[test]
    fn several_quotas_name_the_binding_limit() {
        let args = CheckArgs {
            quota: vec!["1/min burst 3; 2/h".into()],
            requests: 3,
            interval: Duration::ZERO,
            algorithm: Algorithm::Gcra,
        };
        let mut out = Vec::new();
        run(&args, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.matches("allowed").count(), 2, "{text}");
        let last = text.lines().last().unwrap();
        assert!(last.contains("denied") && last.ends_with(" 1"), "{text}");
        // The flag given twice is the same list.
        let twice = CheckArgs {
            quota: vec!["1/min burst 3".into(), "2/h".into()],
            ..args
        };
        let mut again = Vec::new();
        run(&twice, &mut again).unwrap();
        assert_eq!(
            String::from_utf8(again).unwrap().matches("allowed").count(),
            2
        );
        let windowed = CheckArgs {
            algorithm: Algorithm::FixedWindow,
            ..twice
        };
        let message = run(&windowed, &mut Vec::new()).unwrap_err().to_string();
        assert!(message.contains("GCRA only"), "{message}");
    }
}
