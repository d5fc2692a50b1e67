//! The `turnstile` binary, run as a user runs it: the exact figures of the
//! seed scenarios (the tutorials' worked examples, see
//! `turnstile_test_kit::reference`) in `scenarios`, usage errors with exit status 2 and a message, an I/O error with 74, and a small
//! latency run that prints every row. No assertion is ever made on a time.

use std::process::{Command, Output};

fn turnstile(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_turnstile"))
        .args(args)
        .output()
        .expect("the turnstile binary runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The four `admitted/denied` cells (scenarios A, B, C, D) of the row that
/// starts with `label`.
fn scenario_row(text: &str, label: &str) -> Vec<String> {
    let line = text
        .lines()
        .find(|line| line.starts_with(label))
        .unwrap_or_else(|| panic!("no row {label:?} in\n{text}"));
    let cells: Vec<String> = line[label.len()..]
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert_eq!(cells.len(), 4, "{line}");
    cells
}

#[test]
fn scenarios_print_the_seeds_exact_figures() {
    let output = turnstile(&["scenarios"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    // GCRA: 7 immediate give 5/2; +1.1 s, 3 more give 2/1; +1.5 s, 4 more
    // give 3/1; 100/min across the boundary admits 100.
    assert_eq!(
        scenario_row(&text, "GCRA (DirectLimiter)"),
        ["5/2", "2/1", "3/1", "100/200"]
    );
    assert_eq!(
        scenario_row(&text, "seed f64 token bucket"),
        ["5/2", "2/1", "3/1", "100/200"]
    );
    // Only the fixed window lets 200 through at the minute boundary.
    assert_eq!(scenario_row(&text, "fixed window")[3], "200/100");
    assert_eq!(scenario_row(&text, "sliding log")[3], "100/200");
    assert_eq!(scenario_row(&text, "sliding-window counter")[3], "100/200");
    // Every quota is stated.
    assert!(text.contains("\"2/s burst 5\""), "{text}");
    assert!(text.contains("\"5/2500ms\""), "{text}");
    assert!(text.contains("\"100/min\""), "{text}");
}

#[test]
fn a_bad_quota_exits_2_with_a_message_that_names_the_problem() {
    let output = turnstile(&["check", "--quota", "0/s"]);
    assert_eq!(output.status.code(), Some(2));
    let message = stderr(&output);
    assert!(message.starts_with("error: "), "{message}");
    assert!(message.contains("count is 0"), "{message}");
    assert!(!message.contains("panicked"), "{message}");

    let output = turnstile(&["check", "--quota", "10/fortnight"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr(&output).contains("fortnight"), "{}", stderr(&output));
}

#[test]
fn check_prints_each_decision() {
    let output = turnstile(&["check", "--quota", "1/min burst 2", "--requests", "3"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    assert_eq!(text.matches(" allowed ").count(), 2, "{text}");
    assert_eq!(text.matches(" denied ").count(), 1, "{text}");
    assert!(text.contains("retry_after"), "{text}");
}

#[test]
fn zero_or_absurd_checks_are_clear_errors_not_panics() {
    for args in [
        &["latency", "--checks", "0"][..],
        &["--checks", "0"],
        &["latency", "--checks", "99999999999999"],
        &["latency", "--checks", "-5"],
        &["latency", "--threads", "0"],
        &["latency", "--checks", "2", "--threads", "3"],
        &["check", "--quota", "1/s", "--requests", "0"],
        &["check", "--quota", "1/s", "--interval", "5 parsecs"],
        &[
            "check",
            "--quota",
            "1/s",
            "--interval",
            "9min",
            "--requests",
            "100",
        ],
    ] {
        let output = turnstile(args);
        let message = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {message}");
        assert!(message.contains("error"), "{args:?}: {message}");
        assert!(!message.contains("panicked"), "{args:?}: {message}");
    }
}

/// An output that cannot be written is an I/O error, exit status 74, not a
/// usage error: the command line was fine.
#[cfg(target_os = "linux")]
#[test]
fn an_unwritable_output_exits_74() {
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full opens");
    let output = Command::new(env!("CARGO_BIN_EXE_turnstile"))
        .arg("scenarios")
        .stdout(full)
        .output()
        .expect("the turnstile binary runs");
    let message = stderr(&output);
    assert_eq!(output.status.code(), Some(74), "{message}");
    assert!(message.starts_with("error: "), "{message}");
}

#[test]
fn help_lists_the_exit_statuses() {
    let help = stdout(&turnstile(&["--help"]));
    for status in ["0 success", "2 usage error", "69 Redis", "74 I/O error"] {
        assert!(help.contains(status), "{status}: {help}");
    }
}

#[test]
fn unknown_flags_fail_with_clap_s_message() {
    let output = turnstile(&["latency", "--bogus"]);
    assert!(!output.status.success());
    assert!(stderr(&output).contains("--bogus"), "{}", stderr(&output));
}

#[test]
fn help_documents_every_flag() {
    let help = stdout(&turnstile(&["latency", "--help"]));
    for flag in ["--checks", "--threads", "--algorithm"] {
        assert!(help.contains(flag), "{help}");
    }
    let help = stdout(&turnstile(&["check", "--help"]));
    for flag in ["--quota", "--requests", "--interval", "--algorithm"] {
        assert!(help.contains(flag), "{help}");
    }
    let help = stdout(&turnstile(&["--help"]));
    for word in ["scenarios", "latency", "check", "--checks"] {
        assert!(help.contains(word), "{help}");
    }
}

#[test]
fn a_small_latency_run_prints_every_row() {
    let output = turnstile(&["latency", "--checks", "2000", "--threads", "2"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    for label in [
        "empty measurement (2 raw reads)",
        "GCRA DirectLimiter",
        "GCRA KeyedLimiter<u64>, 1 key",
        "GCRA KeyedLimiter<u64>, 1,000 keys",
        "GCRA check_batch 1,000 keys, b=8",
        "GCRA check_batch 1M keys, b=256",
        "fixed window",
        "sliding-window counter",
        "sliding log",
        "seed f64 bucket",
    ] {
        // Once on one thread, once on two.
        let rows: Vec<&str> = text.lines().filter(|l| l.starts_with(label)).collect();
        assert_eq!(rows.len(), 2, "{label}\n{text}");
        assert!(rows.iter().all(|r| !r.contains("n/a")), "{label}\n{text}");
    }
    assert!(text.contains("Ryzen 7 5800X"), "{text}");
    assert!(text.contains("machine: "), "{text}");
}

#[test]
fn latency_can_run_one_algorithm() {
    let output = turnstile(&[
        "latency",
        "--checks",
        "1000",
        "--threads",
        "1",
        "--algorithm",
        "gcra-keyed-1000",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    assert!(text.contains("1,000 keys"), "{text}");
    assert!(!text.contains("GCRA DirectLimiter"), "{text}");
}

#[test]
fn latency_prints_a_row_per_batch_size() {
    let output = turnstile(&[
        "latency",
        "--checks",
        "1024",
        "--threads",
        "1",
        "--algorithm",
        "gcra-batch-1000",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    for size in [1, 8, 32, 256] {
        let label = format!("GCRA check_batch 1,000 keys, b={size} ");
        let rows = text.lines().filter(|l| l.starts_with(&label)).count();
        assert_eq!(rows, 1, "{label}\n{text}");
    }
    assert!(!text.contains("n/a"), "{text}");
}
