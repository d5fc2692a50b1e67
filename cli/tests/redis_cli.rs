//! `turnstile fleet`, run as a user runs it: its own redis-server, the
//! per-user table within the limit, and each failure policy's outcome
//! while that server is stopped. No assertion is made on a time.
#![cfg(feature = "redis")]

use std::process::Command;

/// The whitespace-separated cells of the row that starts with `label`.
fn row<'a>(text: &'a str, label: &str) -> Vec<&'a str> {
    text.lines()
        .find(|line| line.starts_with(label))
        .unwrap_or_else(|| panic!("no row {label:?} in\n{text}"))
        .split_whitespace()
        .collect()
}

#[test]
fn fleet_with_its_own_server_stays_within_the_limit_and_shows_each_policy() {
    let output = Command::new(env!("CARGO_BIN_EXE_turnstile"))
        .args(["fleet", "--seconds", "1", "--gateways", "4", "--users", "3"])
        .args(["--quota", "10/s burst 5", "--timeout-ms", "100"])
        .output()
        .expect("the turnstile binary runs");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for user in ["user_0", "user_1", "user_2"] {
        let cells = row(&text, user);
        let (admitted, limit): (u64, u64) = (cells[1].parse().unwrap(), cells[3].parse().unwrap());
        assert!(admitted > 0 && admitted <= limit, "{cells:?}");
    }
    assert!(text.contains("users over the limit: 0;"), "{text}");
    // policy, allowed, denied, timeouts, errors, breaker opened, fallback
    assert_eq!(row(&text, "fail-open")[1..3], ["200", "0"]);
    assert_eq!(row(&text, "fail-closed")[1..3], ["0", "200"]);
    // Local: 10/s split over 4 gateways is 3/s, burst 3, on the real
    // clock: the burst, plus whatever refilled while the checks ran.
    let local = row(&text, "local");
    let (allowed, denied): (u64, u64) = (local[1].parse().unwrap(), local[2].parse().unwrap());
    assert!(
        allowed >= 3 && denied >= 150 && allowed + denied == 200,
        "{local:?}"
    );
    for policy in ["fail-open", "fail-closed", "local"] {
        let cells = row(&text, policy);
        assert_eq!(cells[5], "1", "the breaker opened once: {cells:?}");
        assert_eq!(cells[6], "200", "every check fell back: {cells:?}");
        assert_ne!(cells[cells.len() - 1], "yet", "recovered: {cells:?}");
    }
}

#[test]
fn fleet_with_a_malformed_url_is_a_usage_error() {
    let output = Command::new(env!("CARGO_BIN_EXE_turnstile"))
        .args(["fleet", "--redis", "not-a-url", "--seconds", "1"])
        .output()
        .expect("the turnstile binary runs");
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("error:"));
}

/// A Redis that does not answer is an outage, exit status 69, told apart
/// from a usage error (2, above) so a script knows a retry may help.
#[test]
fn fleet_with_no_redis_listening_exits_69() {
    // A loopback port that nothing listens on once the listener is gone.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free loopback port")
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let output = Command::new(env!("CARGO_BIN_EXE_turnstile"))
        .args(["fleet", "--redis", &url, "--seconds", "1"])
        .output()
        .expect("the turnstile binary runs");
    let message = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(69), "{message}");
    assert!(message.contains("did not answer"), "{message}");
}
