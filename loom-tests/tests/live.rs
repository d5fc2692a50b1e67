//! loom models of a quota changed while checks read it (`src/live.rs`,
//! issue 24 item 1): a check reads its quota whole, one change's or the
//! next's, never a mix of two, and never waits for a writer.
//!
//! Each model asserts, after loom has explored it, that its race was
//! reached (the crate's `probe` counters). Run with `scripts/loom.sh quota`;
//! without both cfgs this file compiles to nothing.
#![cfg(all(turnstile_loom, crossbeam_loom))]

use std::sync::Arc;

use loom::thread;
use turnstile_loom_tests::reached;
use turnstile_rl::probe;
use turnstile_rl::{Decision, DirectLimiter, ManualClock, Quota};

/// Two quotas that differ in every parameter (burst, interval, tolerance):
/// a check of a full bucket reads (limit, remaining) (2, 1) under the
/// first, (5, 4) under the second, and anything else under a mix.
const FIRST: &str = "1/s burst 2";
const SECOND: &str = "1/h burst 5";

fn quota(text: &str) -> Quota {
    text.parse().unwrap()
}

/// Asserts that `decision`, a check of a full bucket, was made wholly at
/// one of the two quotas.
fn whole(decision: Decision) {
    let figures = (decision.limit(), decision.remaining());
    assert!(
        figures == (2, 1) || figures == (5, 4),
        "a check read a mix of two quotas: {figures:?}"
    );
}

/// A check races two quota changes made back to back by another thread.
/// The race: the second change rewrites the very slot the check was sent
/// to while the check reads it (the double buffer's one retry), and the
/// check still reads one quota whole.
#[test]
fn a_check_racing_two_changes_reads_one_quota_whole() {
    let since = probe::sequence();
    loom::model(|| {
        let limiter = Arc::new(
            DirectLimiter::builder(quota(FIRST))
                .clock(ManualClock::new())
                .build(),
        );
        let writer = {
            let limiter = limiter.clone();
            thread::spawn(move || {
                limiter.set_quota(quota(SECOND));
                limiter.set_quota(quota(FIRST));
            })
        };
        whole(limiter.peek());
        writer.join().unwrap();
        assert_eq!(limiter.quota_version(), 2);
        assert_eq!(limiter.peek().limit(), 2, "the last change is the one kept");
    });
    reached(
        since,
        &probe::QUOTA_READ_RETRIED,
        "a read whose slot a second change rewrote",
    );
}

/// Two changes from two threads take turns, and a check racing both reads
/// one of the quotas whole; afterwards the limiter holds the change that
/// came last, and counts both.
#[test]
fn two_quota_changes_racing_a_check_take_turns() {
    loom::model(|| {
        let limiter = Arc::new(
            DirectLimiter::builder(quota(FIRST))
                .clock(ManualClock::new())
                .build(),
        );
        let writers: Vec<_> = [SECOND, FIRST]
            .into_iter()
            .map(|text| {
                let limiter = limiter.clone();
                thread::spawn(move || limiter.set_quota(quota(text)))
            })
            .collect();
        whole(limiter.check());
        for writer in writers {
            writer.join().unwrap();
        }
        assert_eq!(limiter.quota_version(), 2);
        // Spent one token at most: a whole quota's full bucket, less that.
        let left = limiter.peek();
        assert!(
            [(2, 0), (5, 3)].contains(&(left.limit(), left.remaining())),
            "{left:?}"
        );
    });
}
