//! loom models of a multi-limit rollback racing a reset (issue 21, item
//! 4): a rollback takes its charge out of the bucket the charge landed on,
//! and out of nothing once a reset has forgotten that bucket, never out of
//! the new bucket that holds the key after it.
//!
//! Each model asserts, after loom has explored it, that its race was
//! reached (the crate's `probe` counters). Run with `scripts/loom.sh`;
//! without both cfgs this file compiles to nothing.
#![cfg(all(turnstile_loom, crossbeam_loom))]

use std::sync::Arc;

use loom::thread;
use turnstile_rl::probe::{self, Probe};
use turnstile_rl::{Decision, KeyedMultiLimiter, ManualClock, MultiLimiter, Quotas};

/// Runs `body` under loom on a thread with room for crossbeam-epoch's
/// frames (as in `loom.rs`).
fn model(body: impl Fn() + Sync + Send + 'static) -> usize {
    let since = probe::sequence();
    let body = Arc::new(body);
    let mut builder = loom::model::Builder::new();
    builder.max_branches = 100_000;
    builder.check(move || {
        let body = body.clone();
        thread::Builder::new()
            .stack_size(STACK)
            .spawn(move || body())
            .unwrap()
            .join()
            .unwrap();
    });
    since
}

const STACK: usize = 8 << 20;

fn spawn<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> thread::JoinHandle<T> {
    thread::Builder::new().stack_size(STACK).spawn(f).unwrap()
}

/// Asserts that `probe` was hit by this model's executions (after `since`).
fn reached(since: usize, probe: &Probe, race: &str) {
    assert!(
        probe.last() > since,
        "no execution reached {race}: the model passed without its race"
    );
}

/// Limit 0: burst 2, 2 h a token; limit 1: burst 1, 1 h a token. Limit 1
/// is spent first, so every multi-limit check is denied by it and rolls
/// its charge of limit 0 back.
const QUOTAS: &str = "1/2h burst 2; 1/h burst 1";

/// What limit 0 must hold at the end of every interleaving: the other
/// thread's one admission since its reset, and nothing of the denied
/// check's (rolled back, or forgotten with the old bucket): one token left.
/// Unless `kept` (the denied check's rollback did nothing on a bucket that
/// may still hold its charge, at the cost `crate::multi` documents): then
/// that charge may be there too, but never anything less.
fn holds_one_admission(first: Decision, kept: bool) {
    assert!(
        first.is_denied() || first.remaining() == 0,
        "the rollback took a charge out of a bucket that never held it"
    );
    assert!(
        kept || first.is_allowed(),
        "the denied check's charge leaked"
    );
}

/// Whether `probe` was hit in this execution (which began at `start`, a
/// `probe::sequence()`).
fn hit_since(start: usize, probe: &Probe) -> bool {
    probe.last() > start
}

/// A keyed multi-limit check, denied, rolls back while another thread
/// resets its key in limit 0 and is admitted there once. With the key
/// already in limit 0's map (`known`), the check's charge is an update of a
/// known cell; without, it is an insert, and may grow the table. Returns
/// the probe sequence the model began at.
fn keyed_rollback_races_a_reset(known: bool) -> usize {
    // A key whose home (under the models' fixed hasher) is the first slot
    // of every table: the first chunk a migration copies.
    const KEY: u64 = 13;
    model(move || {
        let start = probe::sequence();
        let limiter = Arc::new(
            KeyedMultiLimiter::<u64, _>::builder(QUOTAS.parse::<Quotas>().unwrap())
                .clock(ManualClock::new())
                .build(),
        );
        assert!(limiter.limits()[1].check(&KEY).is_allowed());
        if known {
            // Forgotten by the reset, as everything before it is.
            assert!(limiter.limits()[0].check(&KEY).is_allowed());
        }
        let other = limiter.clone();
        let held = spawn(move || other.check(&KEY));
        let _ = limiter.limits()[0].reset(&KEY);
        assert!(limiter.limits()[0].check(&KEY).is_allowed());
        assert!(held.join().unwrap().is_denied());
        let kept = hit_since(start, &probe::ROLLBACK_FOUND_BUCKET_MOVED);
        holds_one_admission(limiter.limits()[0].peek(&KEY), kept);
    })
}

/// The race: the rollback finds the cell its charge landed on dead (the
/// reset claimed it) while a new bucket holds the key. The charge is an
/// update: an insert could grow the table between the charge and the
/// reset, and loom's bounded search then misses this race.
#[test]
fn keyed_rollback_finds_its_bucket_reset() {
    let since = keyed_rollback_races_a_reset(true);
    reached(
        since,
        &probe::ROLLBACK_FOUND_BUCKET_DEAD,
        "a rollback finding its bucket reset",
    );
}

/// The race: the rollback finds the cell its charge landed on frozen by a
/// migration (loom's tables are small: inserting the key grows one).
#[test]
fn keyed_rollback_finds_its_bucket_moved() {
    let since = keyed_rollback_races_a_reset(false);
    reached(
        since,
        &probe::ROLLBACK_FOUND_BUCKET_MOVED,
        "a rollback finding its bucket frozen by a migration",
    );
}

/// The same on a direct multi-limiter, whose one cell holds a new bucket
/// after a reset. The races: a rollback finding the limiter reset since
/// its charge, a reset waiting for a rollback already under way, and a
/// charge overlapping a reset.
#[test]
fn direct_rollback_races_a_reset() {
    let since = model(|| {
        let start = probe::sequence();
        let limiter = Arc::new(
            MultiLimiter::builder(QUOTAS.parse::<Quotas>().unwrap())
                .clock(ManualClock::new())
                .build(),
        );
        assert!(limiter.limits()[1].check().is_allowed());
        let other = limiter.clone();
        let held = spawn(move || other.check());
        let _ = limiter.limits()[0].reset();
        assert!(limiter.limits()[0].check().is_allowed());
        assert!(held.join().unwrap().is_denied());
        let kept = hit_since(start, &probe::CHARGE_OVERLAPPED_RESET);
        holds_one_admission(limiter.limits()[0].peek(), kept);
    });
    reached(
        since,
        &probe::ROLLBACK_AFTER_RESET,
        "a rollback finding its limiter reset",
    );
    reached(
        since,
        &probe::RESET_WAITED_FOR_ROLLBACK,
        "a reset waiting for a rollback under way",
    );
    reached(
        since,
        &probe::CHARGE_OVERLAPPED_RESET,
        "a charge overlapping a reset",
    );
}
