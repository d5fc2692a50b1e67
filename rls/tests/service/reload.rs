//! Reloading: a limit whose quota did not change keeps its buckets (the
//! same limiter instance), a changed one starts afresh, a bad file keeps
//! the previous configuration serving; and SIGHUP triggers it in the
//! real command.

use crate::support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use support::{settings, start, ConfigDir};

const BEFORE: &str = r#"
domain: r
descriptors:
  - key: kept
    rate_limit: { unit: hour, requests_per_unit: 3 }
  - key: changed
    rate_limit: { unit: hour, requests_per_unit: 3 }
"#;

const AFTER: &str = r#"
domain: r
descriptors:
  - key: kept
    rate_limit: { unit: hour, requests_per_unit: 3 }
  - key: changed
    rate_limit: { unit: hour, requests_per_unit: 4 }
  - key: added
    rate_limit: { unit: hour, requests_per_unit: 1 }
"#;

#[tokio::test]
async fn a_reload_keeps_the_state_of_unchanged_limits() {
    let dir = ConfigDir::with("r.yaml", BEFORE);
    let mut h = start(settings(&dir)).await;
    assert_eq!(h.admitted("r", &[("kept", "k")], 2).await, 2);
    assert_eq!(h.admitted("r", &[("changed", "k")], 2).await, 2);
    assert_eq!(
        h.admitted("r", &[("added", "k")], 2).await,
        2,
        "not configured yet"
    );

    dir.write("r.yaml", AFTER);
    h.service.engine.reload().await.expect("reload");
    assert_eq!(
        h.admitted("r", &[("kept", "k")], 3).await,
        1,
        "1 of 3 left, as before"
    );
    assert_eq!(
        h.admitted("r", &[("changed", "k")], 5).await,
        4,
        "a new quota, a new bucket"
    );
    assert_eq!(
        h.admitted("r", &[("added", "k")], 2).await,
        1,
        "the new limit"
    );
}

#[tokio::test]
async fn a_bad_file_keeps_the_previous_configuration() {
    let dir = ConfigDir::with("r.yaml", BEFORE);
    let mut h = start(settings(&dir)).await;
    assert_eq!(h.admitted("r", &[("kept", "k")], 1).await, 1);

    dir.write(
        "r.yaml",
        "domain: r\ndescriptors:\n  - key: kept\n    rate_limit: { unit: lightyear }\n",
    );
    let error = h.service.engine.reload().await.expect_err("refused");
    assert!(error.to_string().contains("lightyear"), "{error}");
    assert_eq!(
        h.admitted("r", &[("kept", "k")], 3).await,
        2,
        "same rules, same bucket"
    );
    let text = h.metrics().await;
    assert_eq!(
        support::sample(&text, "ratelimit_service_config_load_error"),
        Some(1.0),
        "{text}"
    );
}

/// The command, started on free ports; reads its "listening" line.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[cfg(unix)]
#[tokio::test]
async fn sighup_reloads_the_running_command() {
    let dir = ConfigDir::with("r.yaml", BEFORE);
    let mut child = Child(
        support::command(&dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start turnstile-rls"),
    );
    let stdout = child.0.stdout.take().expect("stdout");
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map(|_| line)
    })
    .await
    .expect("join")
    .expect("the listening line");
    let grpc = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("grpc="))
        .unwrap_or_else(|| panic!("no grpc= in {line:?}"));
    let mut client = support::connect(grpc.parse().expect("addr")).await;
    let ask = |client: &mut support::Client, entries: &'static [(&'static str, &'static str)]| {
        let mut client = client.clone();
        async move {
            client
                .should_rate_limit(support::request("r", vec![support::descriptor(entries)]))
                .await
                .expect("answer")
                .into_inner()
        }
    };
    assert!(ask(&mut client, &[("added", "k")]).await.statuses[0]
        .current_limit
        .is_none());

    dir.write("r.yaml", AFTER);
    let stderr = child.0.stderr.take().expect("stderr");
    let status = Command::new("kill")
        .args(["-HUP", &child.0.id().to_string()])
        .status()
        .expect("kill -HUP");
    assert!(status.success());
    // The command logs when the reload is done (after its start line).
    let said = tokio::task::spawn_blocking(move || {
        BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .find(|line| line.contains("configuration reloaded"))
    })
    .await
    .expect("join");
    let said = said.expect("a reload line on stderr");
    assert!(said.contains("SIGHUP"), "{said}");
    let limit = ask(&mut client, &[("added", "k")]).await.statuses[0]
        .current_limit
        .clone()
        .expect("the added limit serves");
    assert_eq!(limit.requests_per_unit, 1);
}
