//! Reloads when the configuration directory changes, as envoyproxy/ratelimit
//! does: a poll of the directory's fingerprint (each file's resolved path,
//! size and modification time) once an interval.
//!
//! A poll rather than `notify`: a Kubernetes ConfigMap update is a rename of
//! a `..data` symlink, which inotify reports on the link, not on the files
//! behind it (so watchers must re-resolve anyway); a poll of resolved paths
//! sees it with no new dependency, and a file caught half-written is
//! refused, then read again once its size or time moves.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::engine::Engine;

/// What a directory looks like: enough to see any change that matters.
pub type Fingerprint = Vec<(PathBuf, u64, Option<SystemTime>)>;

/// `path`'s fingerprint: the resolved path, size and modification time of
/// the path itself and of each entry (following symlinks), sorted.
pub fn fingerprint(path: &Path) -> Fingerprint {
    let mut seen = Vec::new();
    let mut note = |p: &Path| {
        let resolved = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        let meta = std::fs::metadata(&resolved).ok();
        seen.push((
            resolved,
            meta.as_ref().map_or(0, |m| m.len()),
            meta.and_then(|m| m.modified().ok()),
        ));
    };
    note(path);
    if let Ok(entries) = std::fs::read_dir(path) {
        for entry in entries.flatten() {
            note(&entry.path());
        }
    }
    seen.sort();
    seen
}

/// Polls `engine`'s configuration directory every `interval`, forever,
/// reloading when it changed; a refused reload keeps the previous rules
/// and is not retried until the directory changes again.
pub async fn reload_on_change(engine: Arc<Engine>, interval: Duration) {
    let path = engine.settings().config.clone();
    let mut last = fingerprint(&path);
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let now = fingerprint(&path);
        if now == last {
            continue;
        }
        last = now;
        crate::server::reload_and_report(&engine, "the configuration directory changed").await;
    }
}
