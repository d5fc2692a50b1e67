//! The seed documents' scenarios, every algorithm, on a `ManualClock`.
//!
//! Time moves only when a scenario moves it, so every count is exact and
//! the same on every machine; `tests/cli.rs` and the unit tests below pin
//! the seeds' figures.

use std::io::Write;
use std::time::Duration;

use turnstile_rl::{ManualClock, Quota};
use turnstile_test_kit::reference::SeedTokenBucket;

use super::limiter::Algorithm;
use super::CliError;

/// The rows of the table, in order: the limiter factory's algorithms, then
/// the seeds' reference bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Row {
    /// An algorithm the limiter factory builds.
    Limiter(Algorithm),
    /// The seeds' `f64` token bucket (`SeedTokenBucket`).
    SeedBucket,
}

impl Row {
    /// Every row, in table order.
    pub(crate) const ALL: [Row; 5] = [
        Row::Limiter(Algorithm::Gcra),
        Row::Limiter(Algorithm::FixedWindow),
        Row::Limiter(Algorithm::SlidingWindow),
        Row::Limiter(Algorithm::SlidingLog),
        Row::SeedBucket,
    ];

    /// The row label (tests find rows by it).
    pub(crate) fn label(self) -> &'static str {
        match self {
            Row::Limiter(Algorithm::Gcra) => "GCRA (DirectLimiter)",
            Row::Limiter(Algorithm::FixedWindow) => "fixed window",
            Row::Limiter(Algorithm::SlidingWindow) => "sliding-window counter",
            Row::Limiter(Algorithm::SlidingLog) => "sliding log",
            Row::SeedBucket => "seed f64 token bucket",
        }
    }
}

/// The limit a scenario is about, before it is expressed in one
/// algorithm's terms (see [`Limit::quota`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Limit {
    /// The seeds' token bucket: capacity 5, refilled at 2 tokens a second.
    Capacity5Refill2PerSecond,
    /// 100 requests a minute.
    HundredPerMinute,
}

impl Limit {
    /// The quota text that represents this limit for `row`, or for the
    /// seed bucket its `(capacity, refill per second)`.
    fn quota(self, row: Row) -> Setting {
        match (self, row) {
            (Limit::Capacity5Refill2PerSecond, Row::SeedBucket) => Setting::Bucket(5.0, 2.0),
            (Limit::HundredPerMinute, Row::SeedBucket) => Setting::Bucket(100.0, 100.0 / 60.0),
            // GCRA: one token every 1/2 s, at most 5 at once: exactly the
            // seeds' bucket, in integer nanoseconds.
            (Limit::Capacity5Refill2PerSecond, Row::Limiter(Algorithm::Gcra)) => {
                Setting::Quota("2/s burst 5")
            }
            // A window has a limit and a length, no burst: 5 at once, and 5
            // again once the 5 have aged out, which is the same capacity and
            // the same long-run rate (5 per 5 / 2 s = 2/s), refilled a whole
            // window at a time instead of one token every 500 ms.
            (Limit::Capacity5Refill2PerSecond, _) => Setting::Quota("5/2.5s"),
            (Limit::HundredPerMinute, _) => Setting::Quota("100/min"),
        }
    }
}

/// How one algorithm is configured for one limit.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Setting {
    /// A quota string, parsed with `Quota::from_str`.
    Quota(&'static str),
    /// The seed bucket's capacity and refill rate per second.
    Bucket(f64, f64),
}

impl Setting {
    /// How the footnote shows it.
    fn describe(self) -> String {
        match self {
            Setting::Quota(text) => match text.parse::<Quota>() {
                Ok(quota) => format!("\"{quota}\""),
                Err(_) => format!("\"{text}\""),
            },
            Setting::Bucket(capacity, refill) if refill.fract() == 0.0 => {
                format!("capacity {capacity}, refill {refill}/s")
            }
            Setting::Bucket(capacity, refill) => {
                format!("capacity {capacity}, refill {refill:.4}/s (100/60)")
            }
        }
    }
}

/// One seed scenario: bursts of requests at given clock times.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scenario {
    /// The column letter.
    pub(crate) id: char,
    /// What the seeds call it.
    pub(crate) title: &'static str,
    /// The limit under test.
    limit: Limit,
    /// `(clock time in ms, requests sent at that time)`, in time order.
    phases: &'static [(u64, u32)],
    /// Phases before this index set the scene and are not counted.
    counted_from: usize,
}

/// The seeds' scenarios, in column order.
pub(crate) const SCENARIOS: [Scenario; 4] = [
    Scenario {
        id: 'A',
        title: "capacity 5, refill 2/s: 7 immediate",
        limit: Limit::Capacity5Refill2PerSecond,
        phases: &[(0, 7)],
        counted_from: 0,
    },
    Scenario {
        id: 'B',
        title: "A, then +1.1 s: 3 more",
        limit: Limit::Capacity5Refill2PerSecond,
        phases: &[(0, 7), (1_100, 3)],
        counted_from: 1,
    },
    Scenario {
        id: 'C',
        title: "A, then instead +1.5 s: 4 more",
        limit: Limit::Capacity5Refill2PerSecond,
        phases: &[(0, 7), (1_500, 4)],
        counted_from: 1,
    },
    Scenario {
        id: 'D',
        title: "100/min: 150 at 59.9 s + 150 at 60.1 s",
        limit: Limit::HundredPerMinute,
        phases: &[(59_900, 150), (60_100, 150)],
        counted_from: 0,
    },
];

/// Admitted and denied requests in a scenario's counted phases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// Requests allowed.
    pub(crate) admitted: u32,
    /// Requests denied.
    pub(crate) denied: u32,
}

/// A limiter of any algorithm on a manual clock, reduced to "may it pass?".
type Check = Box<dyn Fn() -> bool>;

/// Builds `row` for `setting` on `clock`; the typed error's message when
/// the algorithm cannot hold that quota.
fn build(row: Row, setting: Setting, clock: &ManualClock) -> Result<Check, String> {
    let clock = clock.clone();
    Ok(match (row, setting) {
        (Row::SeedBucket, Setting::Bucket(capacity, refill)) => {
            let bucket = SeedTokenBucket::<String, _>::with_clock(capacity, refill, clock)
                .map_err(|e| e.to_string())?;
            Box::new(move || bucket.allow_request("user_42", 1.0))
        }
        (Row::Limiter(algorithm), Setting::Quota(text)) => {
            let quota = text.parse::<Quota>().map_err(|e| e.to_string())?;
            let limiter = algorithm.build(quota, clock).map_err(|e| e.to_string())?;
            Box::new(move || limiter.check().is_allowed())
        }
        (Row::Limiter(_), Setting::Bucket(..)) | (Row::SeedBucket, Setting::Quota(_)) => {
            return Err("this algorithm takes no such setting".to_owned())
        }
    })
}

/// Runs `scenario` on a fresh limiter of `row`; `Err` holds the reason
/// the algorithm cannot represent the scenario's quota.
pub(crate) fn run_one(row: Row, scenario: &Scenario) -> Result<Outcome, String> {
    let clock = ManualClock::new();
    let check = build(row, scenario.limit.quota(row), &clock)?;
    let mut outcome = Outcome {
        admitted: 0,
        denied: 0,
    };
    for (phase, &(at_ms, requests)) in scenario.phases.iter().enumerate() {
        clock.set(Duration::from_millis(at_ms));
        for _ in 0..requests {
            let allowed = check();
            if phase >= scenario.counted_from {
                if allowed {
                    outcome.admitted += 1;
                } else {
                    outcome.denied += 1;
                }
            }
        }
    }
    Ok(outcome)
}

/// Prints the scenarios table and its footnotes.
pub(crate) fn run(out: &mut impl Write) -> Result<(), CliError> {
    writeln!(
        out,
        "Seed scenarios: admitted/denied, on a ManualClock (exact, deterministic)"
    )?;
    writeln!(out)?;
    for scenario in &SCENARIOS {
        writeln!(out, "  {}  {}", scenario.id, scenario.title)?;
    }
    writeln!(out)?;
    write!(out, "{:<24}", "algorithm")?;
    for scenario in &SCENARIOS {
        write!(out, "{:>9}", scenario.id)?;
    }
    writeln!(out)?;
    let mut not_applicable = Vec::new();
    for row in Row::ALL {
        write!(out, "{:<24}", row.label())?;
        for scenario in &SCENARIOS {
            let cell = match run_one(row, scenario) {
                Ok(o) => format!("{}/{}", o.admitted, o.denied),
                Err(reason) => {
                    not_applicable.push((row, scenario.id, reason));
                    "n/a".to_owned()
                }
            };
            write!(out, "{cell:>9}")?;
        }
        writeln!(out)?;
    }
    writeln!(out)?;
    writeln!(out, "Quotas (scenarios A-C | D):")?;
    for row in Row::ALL {
        let [small, minute] = [Limit::Capacity5Refill2PerSecond, Limit::HundredPerMinute]
            .map(|limit| limit.quota(row).describe());
        writeln!(out, "  {:<24}{small} | {minute}", row.label())?;
    }
    writeln!(
        out,
        "  GCRA's \"2/s burst 5\" is the seeds' bucket exactly (one token every 500 ms, 5 at once).\n  \
         A window has a limit and a length but no burst: \"5/2500ms\" keeps the capacity (5 at\n  \
         once) and the long-run rate (5 per 2.5 s = 2/s), but refills a whole window at a time, so\n  \
         after 1.1 s or 1.5 s nothing has come back yet (the 5 requests are 2.5 s from expiring)."
    )?;
    for (row, id, reason) in &not_applicable {
        writeln!(out, "  n/a: {} in {id}: {reason}", row.label())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(row: Row, id: char) -> (u32, u32) {
        let scenario = SCENARIOS.iter().find(|s| s.id == id).unwrap();
        let o = run_one(row, scenario).unwrap();
        (o.admitted, o.denied)
    }

    #[test]
    fn gcra_and_the_seed_bucket_give_the_seeds_figures() {
        for row in [Row::Limiter(Algorithm::Gcra), Row::SeedBucket] {
            assert_eq!(outcome(row, 'A'), (5, 2), "{row:?}");
            assert_eq!(outcome(row, 'B'), (2, 1), "{row:?}");
            assert_eq!(outcome(row, 'C'), (3, 1), "{row:?}");
            assert_eq!(outcome(row, 'D'), (100, 200), "{row:?}");
        }
    }

    #[test]
    fn at_the_minute_boundary_only_the_fixed_window_admits_200() {
        let outcome = |algorithm| outcome(Row::Limiter(algorithm), 'D');
        assert_eq!(outcome(Algorithm::FixedWindow), (200, 100));
        assert_eq!(outcome(Algorithm::SlidingLog), (100, 200));
        assert_eq!(outcome(Algorithm::SlidingWindow), (100, 200));
    }

    #[test]
    fn windows_of_5_per_2_5_s_refill_nothing_within_the_window() {
        for algorithm in [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::SlidingLog,
        ] {
            let row = Row::Limiter(algorithm);
            assert_eq!(outcome(row, 'A'), (5, 2), "{algorithm:?}");
            assert_eq!(outcome(row, 'B'), (0, 3), "{algorithm:?}");
            assert_eq!(outcome(row, 'C'), (0, 4), "{algorithm:?}");
        }
    }

    #[test]
    fn a_quota_an_algorithm_cannot_hold_is_a_reason_not_a_panic() {
        let clock = ManualClock::new();
        let window = Row::Limiter(Algorithm::SlidingWindow);
        let reason = build(window, Setting::Quota("5/100ms"), &clock)
            .err()
            .unwrap();
        assert!(reason.contains("sliding window"), "{reason}");
        let gcra = Row::Limiter(Algorithm::Gcra);
        assert!(build(gcra, Setting::Quota("0/s"), &clock).is_err());
        assert!(build(Row::SeedBucket, Setting::Bucket(0.0, 1.0), &clock).is_err());
    }

    #[test]
    fn the_table_prints_every_row() {
        let mut text = Vec::new();
        run(&mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        for row in Row::ALL {
            assert!(text.contains(row.label()), "{text}");
        }
        assert!(!text.contains("n/a"), "{text}");
    }
}
