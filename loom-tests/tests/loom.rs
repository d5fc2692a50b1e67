//! loom models of turnstile's lock-free protocols: every interleaving of the
//! real code (atomics through `src/sync.rs`, crossbeam-epoch's own under
//! `--cfg crossbeam_loom`), up to `LOOM_MAX_PREEMPTIONS` preemptions.
//!
//! Run with `scripts/loom.sh` (see the README); without both cfgs this
//! file compiles to nothing, so it can never pass by accident.
#![cfg(all(turnstile_loom, crossbeam_loom))]

use std::sync::Arc;
use std::time::Duration;

use loom::thread;
use turnstile::{DirectLimiter, KeyedLimiter, ManualClock, MultiLimiter, Quota, Quotas};

/// Runs `body` under loom on a thread with room for crossbeam-epoch's
/// frames: loom's default stack is small, and running out of it is a
/// SIGSEGV, not a test failure.
fn model(body: impl Fn() + Sync + Send + 'static) {
    let body = Arc::new(body);
    let mut builder = loom::model::Builder::new();
    // Epoch pinning and a migration are a few hundred atomic steps each.
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
}

const STACK: usize = 8 << 20;

fn spawn<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> thread::JoinHandle<T> {
    thread::Builder::new().stack_size(STACK).spawn(f).unwrap()
}

fn quota(burst: u64) -> Quota {
    Quota::per_hour(1).unwrap().burst(burst).unwrap()
}

fn keyed(burst: u64, clock: &ManualClock) -> Arc<KeyedLimiter<u64, ManualClock>> {
    Arc::new(
        KeyedLimiter::builder(quota(burst))
            .clock(clock.clone())
            .build(),
    )
}

/// (a) Two updaters on one cell with one token left: exactly one passes.
#[test]
fn two_updaters_one_token() {
    model(|| {
        let limiter = Arc::new(DirectLimiter::with_clock(quota(2), ManualClock::new()));
        assert!(limiter.check().is_allowed());
        let other = limiter.clone();
        let a = spawn(move || other.check().is_allowed());
        let b = limiter.check().is_allowed();
        let a = a.join().unwrap();
        assert!(a ^ b, "exactly one of two may take the last token: {a} {b}");
    });
}

/// (b) Two threads inserting the same key: one node, both updates counted.
#[test]
fn insert_insert_same_key() {
    model(|| {
        let clock = ManualClock::new();
        let limiter = keyed(3, &clock);
        let other = limiter.clone();
        let a = spawn(move || other.check(&7).is_allowed());
        assert!(limiter.check(&7).is_allowed());
        assert!(a.join().unwrap());
        assert_eq!(limiter.len(), 1);
        // Both updates landed on the one bucket: one token of three is left.
        assert_eq!(limiter.check(&7).remaining(), 0);
    });
}

/// (c) An update racing the eviction of its (idle) key: the update is never
/// lost, whichever comes first.
#[test]
fn update_races_eviction() {
    model(|| {
        let clock = ManualClock::new();
        let limiter = keyed(2, &clock);
        assert!(limiter.check(&1).is_allowed());
        // TAT = 1 h: at 1 h the bucket is full again, so idle and evictable.
        clock.set(Duration::from_secs(3600));
        let other = limiter.clone();
        let a = spawn(move || other.check(&1).is_allowed());
        limiter.evict_idle();
        assert!(a.join().unwrap());
        // The racing update counted: one token of two is left, then none.
        let last = limiter.check(&1);
        assert!(last.is_allowed());
        assert_eq!(last.remaining(), 0);
        assert!(limiter.check(&1).is_denied());
    });
}

/// (d) An update racing a migration (growth) that copies its node.
#[test]
fn update_races_growth() {
    model(|| {
        let clock = ManualClock::new();
        let limiter = keyed(3, &clock);
        assert!(limiter.check(&1).is_allowed());
        let other = limiter.clone();
        // Key 2 fills the smallest table and starts a migration.
        let a = spawn(move || other.check(&2).is_allowed());
        assert!(limiter.check(&1).is_allowed());
        assert!(a.join().unwrap());
        let last = limiter.check(&1);
        assert!(last.is_allowed());
        assert_eq!(last.remaining(), 0, "an update made during growth was lost");
        assert_eq!(limiter.len(), 2);
    });
}

/// (e) A reader holding a node while it is evicted, dropped by a migration
/// and handed to the epoch (and the garbage flushed, so the collector
/// tries to advance the epoch and free it): the reader's update lands on a cell that is still valid
/// memory, and the key's next decision accounts for it.
#[test]
fn reader_holds_node_through_reclamation() {
    model(|| {
        let clock = ManualClock::new();
        let limiter = keyed(2, &clock);
        assert!(limiter.check(&1).is_allowed());
        clock.set(Duration::from_secs(3600));
        // Key 2 stays busy, so the eviction leaves a sparse table and a
        // migration that drops key 1's node.
        assert!(limiter.check(&2).is_allowed());
        let other = limiter.clone();
        let reader = spawn(move || other.check(&1).is_allowed());
        limiter.evict_idle();
        assert!(reader.join().unwrap());
        let last = limiter.check(&1);
        assert_eq!(last.remaining(), 0, "the reader's update was lost");
    });
}

/// Executions, across one model's run, in which its named race was reached.
/// std's atomics, not loom's: it must outlive each execution.
static MULTI_RACE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static REFUND_RACE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// (f) Several limits, charge then roll back: two checks that the second
/// limit denies, racing on the first limit. The race: one check meets the
/// other's charge on the first limit before it is rolled back (it reports
/// the first limit as binding). In every interleaving both are denied and
/// the first limit ends with exactly the one admitted token taken: no
/// rolled-back charge leaks.
#[test]
fn multi_rollback_meets_a_racing_charge() {
    MULTI_RACE.store(0, std::sync::atomic::Ordering::Relaxed);
    model(|| {
        // First limit: burst 2, 2 h a token; second: burst 1, 1 h a token.
        // A check denied by the first waits 2 h, by the second 1 h.
        let quotas: Quotas = "1/2h burst 2; 1/h burst 1".parse().unwrap();
        let limiter = Arc::new(MultiLimiter::with_clock(quotas, ManualClock::new()));
        assert!(limiter.check().is_allowed());
        let other = limiter.clone();
        let a = spawn(move || other.check());
        let b = limiter.check();
        let a = a.join().unwrap();
        for d in [a, b] {
            assert!(d.is_denied());
            if d.binding() == 0 {
                MULTI_RACE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let first = limiter.limits()[0].peek();
        assert!(first.is_allowed(), "a rolled-back charge leaked");
        assert_eq!(first.remaining(), 0, "the admitted token was given back");
    });
    assert!(
        MULTI_RACE.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "no execution met a charge before its rollback"
    );
}

/// (g) A refund racing a check on the last token: a check that lands
/// between another's check and its refund is denied (the race), and in
/// every interleaving the bucket ends holding exactly the tokens not given
/// back.
#[test]
fn refund_races_a_check() {
    REFUND_RACE.store(0, std::sync::atomic::Ordering::Relaxed);
    model(|| {
        let limiter = Arc::new(DirectLimiter::with_clock(quota(1), ManualClock::new()));
        let other = limiter.clone();
        let a = spawn(move || {
            if other.check().is_allowed() {
                assert_eq!(other.refund(1), Ok(true), "its own token was still out");
            }
        });
        let b = limiter.check().is_allowed();
        a.join().unwrap();
        if !b {
            REFUND_RACE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        assert_eq!(
            limiter.peek().is_allowed(),
            !b,
            "a refund was lost or doubled"
        );
    });
    assert!(
        REFUND_RACE.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "no check landed between a check and its refund"
    );
}
