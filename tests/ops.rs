//! Peek, reset, clear, refund, quota changes and gauges on the local
//! limiters, on a manual clock:
//!
//! - peek never changes a later decision (property, direct and keyed);
//! - reset and refund decide exactly as a sequential model of the bucket's
//!   debt, and never let more through than the quota allows from their
//!   instant on (property against the model);
//! - refunds racing checks on four threads lose nothing;
//! - a quota change keeps what was spent (table of cases);
//! - the gauges count what happened.

use std::time::Duration;

use proptest::prelude::*;
use turnstile_rl::{
    CostError, Decision, DirectLimiter, KeyedLimiter, ManualClock, OverflowPolicy, Quota,
};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 1_000,
        ..ProptestConfig::default()
    }
}

fn keyed(quota: &str) -> (KeyedLimiter<u64, ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::builder(quota.parse().unwrap())
        .clock(clock.clone())
        .build();
    (limiter, clock)
}

/// One step of a timeline on one key.
#[derive(Clone, Debug)]
enum Op {
    Advance(u64),
    Check(u64),
    Peek(u64),
    Refund(u64),
    Reset,
}

fn op(burst: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u64..3_000).prop_map(Op::Advance),
        4 => (1..=burst).prop_map(Op::Check),
        2 => (1..=burst).prop_map(Op::Peek),
        2 => (1..=burst).prop_map(Op::Refund),
        1 => Just(Op::Reset),
    ]
}

/// Small quotas (milliseconds), where every op moves the bucket visibly.
fn quota_and_ops() -> impl Strategy<Value = (Quota, Vec<Op>)> {
    (1u64..=6, 1u64..=500).prop_flat_map(|(burst, interval_ms)| {
        let quota = Quota::with_period(Duration::from_millis(interval_ms))
            .unwrap()
            .burst(burst)
            .unwrap();
        (Just(quota), prop::collection::vec(op(burst), 1..60))
    })
}

/// The bucket as a debt, in nanoseconds: how long until it is full. Written
/// apart from the crate's TAT arithmetic, in i128.
struct Model {
    debt: i128,
    interval: i128,
    tolerance: i128,
}

impl Model {
    fn new(quota: &Quota) -> Self {
        Model {
            debt: 0,
            interval: turnstile_rl::__private::interval_nanos(quota) as i128,
            tolerance: turnstile_rl::__private::tolerance_nanos(quota) as i128,
        }
    }
    fn advance(&mut self, by: i128) {
        self.debt = (self.debt - by).max(0);
    }
    /// (allowed, remaining) of a check of `n`; applied when `apply`.
    fn check(&mut self, n: u64, apply: bool) -> (bool, u64) {
        let next = self.debt + n as i128 * self.interval;
        if next <= self.tolerance {
            if apply {
                self.debt = next;
            }
            (true, ((self.tolerance - next) / self.interval) as u64)
        } else {
            (
                false,
                ((self.tolerance - self.debt).max(0) / self.interval) as u64,
            )
        }
    }
    fn refund(&mut self, n: u64) -> bool {
        let given = self.debt > 0;
        self.debt = (self.debt - n as i128 * self.interval).max(0);
        given
    }
}

fn figures(d: Decision) -> (bool, u64) {
    (d.is_allowed(), d.remaining())
}

proptest! {
    #![proptest_config(config())]

    /// A timeline with peeks decides every check, refund and reset exactly
    /// as the same timeline without them.
    #[test]
    fn peek_never_changes_a_later_decision((quota, ops) in quota_and_ops()) {
        let clocks = [ManualClock::new(), ManualClock::new()];
        let direct = [
            DirectLimiter::builder(quota).clock(clocks[0].clone()).build(),
            DirectLimiter::builder(quota).clock(clocks[1].clone()).build(),
        ];
        let keyed: Vec<KeyedLimiter<u64, ManualClock>> = clocks
            .iter()
            .map(|c| KeyedLimiter::builder(quota).clock(c.clone()).build())
            .collect();
        for op in &ops {
            match *op {
                Op::Advance(ms) => clocks.iter().for_each(|c| c.advance(Duration::from_millis(ms))),
                Op::Check(n) => {
                    prop_assert_eq!(direct[0].check_n(n), direct[1].check_n(n));
                    prop_assert_eq!(keyed[0].check_n(&1, n), keyed[1].check_n(&1, n));
                }
                Op::Peek(n) => {
                    // Only the first of each pair peeks, twice, and sees the
                    // same answer both times and the same as a check would.
                    let seen = direct[0].peek_n(n).unwrap();
                    prop_assert_eq!(direct[0].peek_n(n).unwrap(), seen);
                    let seen = keyed[0].peek_n(&1, n).unwrap();
                    prop_assert_eq!(keyed[0].peek_n(&1, n).unwrap(), seen);
                    prop_assert_eq!(keyed[0].peek_n(&2, n).unwrap().remaining(), quota.burst_size() - n);
                }
                Op::Refund(n) => {
                    prop_assert_eq!(direct[0].refund(n), direct[1].refund(n));
                    prop_assert_eq!(keyed[0].refund(&1, n), keyed[1].refund(&1, n));
                }
                Op::Reset => {
                    prop_assert_eq!(direct[0].reset(), direct[1].reset());
                    prop_assert_eq!(keyed[0].reset(&1), keyed[1].reset(&1));
                }
            }
        }
        prop_assert_eq!(keyed[0].len(), keyed[1].len(), "peek inserted nothing");
    }

    /// Checks, peeks, refunds and resets decide exactly as the debt model,
    /// and after each refund or reset at `t`, the tokens admitted up to any
    /// later `u` (before the next refund or reset) stay within
    /// `B + (u - t) / T`: what the quota allows from that instant on.
    #[test]
    fn reset_and_refund_follow_the_model((quota, ops) in quota_and_ops()) {
        let clock = ManualClock::new();
        let direct = DirectLimiter::builder(quota).clock(clock.clone()).build();
        let keyed: KeyedLimiter<u64, ManualClock> = KeyedLimiter::builder(quota).clock(clock.clone()).build();
        let mut model = Model::new(&quota);
        let (interval, tolerance) = (turnstile_rl::__private::interval_nanos(&quota) as u128, turnstile_rl::__private::tolerance_nanos(&quota) as u128);
        // (instant of the last refund or reset, tokens admitted since)
        let mut since: Option<(u64, u128)> = None;
        for op in &ops {
            let now = clock.elapsed().as_nanos() as u64;
            match *op {
                Op::Advance(ms) => {
                    clock.advance(Duration::from_millis(ms));
                    model.advance(ms as i128 * 1_000_000);
                }
                Op::Check(n) => {
                    let expected = model.check(n, true);
                    prop_assert_eq!(figures(direct.check_n(n).unwrap()), expected);
                    prop_assert_eq!(figures(keyed.check_n(&1, n).unwrap()), expected);
                    if let (true, Some((t, admitted))) = (expected.0, since.as_mut()) {
                        *admitted += n as u128;
                        prop_assert!(
                            *admitted * interval <= tolerance + (now - *t) as u128,
                            "{} tokens in {} ns after a refund or reset", admitted, now - *t
                        );
                    }
                }
                Op::Peek(n) => {
                    let expected = model.check(n, false);
                    prop_assert_eq!(figures(direct.peek_n(n).unwrap()), expected);
                    prop_assert_eq!(figures(keyed.peek_n(&1, n).unwrap()), expected);
                }
                Op::Refund(n) => {
                    let expected = model.refund(n);
                    prop_assert_eq!(direct.refund(n), Ok(expected));
                    prop_assert_eq!(keyed.refund(&1, n), Ok(expected));
                    since = Some((now, 0));
                }
                Op::Reset => {
                    let was_used = model.debt > 0;
                    model.debt = 0;
                    let direct_used = direct.reset();
                    prop_assert!(!was_used || direct_used);
                    let _ = keyed.reset(&1);
                    since = Some((now, 0));
                }
            }
        }
    }
}

#[test]
fn costs_that_can_never_be_met_are_errors_not_panics() {
    let (limiter, _) = keyed("10/s");
    let direct = DirectLimiter::builder("10/s".parse().unwrap())
        .clock(ManualClock::new())
        .build();
    for n in [0, 11, u64::MAX] {
        assert!(limiter.peek_n(&1, n).is_err());
        assert!(limiter.refund(&1, n).is_err());
        assert!(direct.peek_n(n).is_err());
        assert!(direct.refund(n).is_err());
    }
    assert_eq!(limiter.refund(&1, 0), Err(CostError::ZeroRefund));
    assert_eq!(
        direct.refund(11),
        Err(CostError::RefundAboveCapacity {
            refund: 11,
            capacity: 10
        })
    );
    let gold: Quota = "100/s".parse().unwrap();
    assert!(limiter.refund_with(&1, &gold, 101).is_err());
    assert!(limiter.peek_n_with(&1, &gold, 0).is_err());
    assert!(limiter.is_empty());
}

#[test]
fn peek_does_not_insert_and_reads_a_missing_key_as_full() {
    let (limiter, clock) = keyed("2/s burst 5");
    let d = limiter.peek(&9);
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 4);
    assert_eq!(d.reset_after(), Duration::from_millis(500));
    assert!(limiter.is_empty());
    for _ in 0..5 {
        let _ = limiter.check(&9);
    }
    let d = limiter.peek(&9);
    assert!(d.is_denied());
    assert_eq!(d.retry_after(), Some(Duration::from_millis(500)));
    clock.advance(Duration::from_millis(1_100));
    assert_eq!(limiter.peek_n(&9, 2).unwrap().remaining(), 0);
    assert!(limiter.peek_n(&9, 3).unwrap().is_denied());
    // An evicted key peeks as full, as it checks.
    clock.advance(Duration::from_secs(5));
    assert_eq!(limiter.evict_idle(), 1);
    assert_eq!(limiter.peek(&9).remaining(), 4);
}

#[test]
fn refund_is_exact_and_never_fuller_than_full() {
    let (limiter, clock) = keyed("1/s burst 4");
    assert_eq!(limiter.check_n(&1, 3).unwrap().remaining(), 1);
    assert_eq!(limiter.refund(&1, 2), Ok(true));
    assert_eq!(limiter.peek(&1).remaining(), 2, "one token still spent");
    assert_eq!(
        limiter.refund(&1, 4),
        Ok(true),
        "gives back the one, no more"
    );
    assert_eq!(limiter.peek(&1).remaining(), 3, "full");
    assert_eq!(limiter.refund(&1, 1), Ok(false), "already full");
    // A bucket that refilled by itself in between: the refund is a no-op.
    let _ = limiter.check_n(&1, 4).unwrap();
    clock.advance(Duration::from_secs(4));
    assert_eq!(limiter.refund(&1, 4), Ok(false));
    assert_eq!(limiter.check_n(&1, 4).unwrap().remaining(), 0);
    // Half refilled: only the part still owed comes back.
    clock.advance(Duration::from_secs(2));
    assert_eq!(limiter.refund(&1, 4), Ok(true));
    assert_eq!(limiter.check_n(&1, 4).unwrap().remaining(), 0);
    assert!(limiter.check(&1).is_denied());
}

#[test]
fn reset_and_clear_forget_keys() {
    let (limiter, _) = keyed("1/h");
    for key in 0..100u64 {
        assert!(limiter.check(&key).is_allowed());
    }
    assert!(limiter.reset(&7));
    assert!(!limiter.reset(&7), "already gone");
    assert_eq!(limiter.len(), 99);
    assert!(limiter.check(&7).is_allowed(), "full again");
    assert!(limiter.check(&8).is_denied(), "others kept");
    assert_eq!(limiter.clear(), 100);
    assert!(limiter.is_empty());
    assert!((0..100u64).all(|key| limiter.check(&key).is_allowed()));
    assert_eq!(limiter.stats().resets, 101);
}

/// Four threads each take a token and give it back, over and over, on one
/// frozen bucket: every refund lands, so the bucket ends full, and no
/// thread is ever denied more than the others' tokens in flight explain.
#[test]
fn refunds_racing_checks_lose_nothing() {
    const THREADS: u64 = 4;
    const ROUNDS: u64 = 20_000;
    let (limiter, _) = keyed("1/h burst 4");
    let direct = DirectLimiter::builder("1/h burst 4".parse().unwrap())
        .clock(ManualClock::new())
        .build();
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                for _ in 0..ROUNDS {
                    // Burst 4, four threads, one token each in flight at most.
                    assert!(limiter.check(&1).is_allowed());
                    assert_eq!(limiter.refund(&1, 1), Ok(true));
                    assert!(direct.check().is_allowed());
                    assert_eq!(direct.refund(1), Ok(true));
                }
            });
        }
    });
    assert_eq!(limiter.peek(&1).remaining(), 3, "full again");
    assert_eq!(direct.peek().remaining(), 3, "full again");
}

/// `set_quota` keeps what each caller spent, one rule for every limiter
/// (`Quota`'s "Changing a quota while serving"). Each row: old quota,
/// tokens spent at 0, new quota, then what the direct and the keyed
/// limiter both answer at 0.
#[test]
fn a_quota_change_keeps_the_spent_part() {
    struct Case {
        old: &'static str,
        spent: u64,
        new: &'static str,
        both: (bool, u64),
    }
    let cases = [
        // Unused: the new quota's full burst.
        Case {
            old: "10/s",
            spent: 0,
            new: "20/s",
            both: (true, 19),
        },
        // Half spent (0.5 s owed) of 10/s: 20/s reads 10 spent.
        Case {
            old: "10/s",
            spent: 5,
            new: "20/s",
            both: (true, 9),
        },
        // All spent (1 s owed): no fresh burst under a larger quota.
        Case {
            old: "10/s",
            spent: 10,
            new: "100/s burst 100",
            both: (false, 0),
        },
        // Larger burst, same rate: the spent tokens stay spent.
        Case {
            old: "10/s burst 20",
            spent: 10,
            new: "10/s burst 40",
            both: (true, 29),
        },
        // Smaller burst than spent: the debt beyond it is kept; denied.
        Case {
            old: "10/s burst 20",
            spent: 10,
            new: "10/s burst 5",
            both: (false, 0),
        },
        // Smaller burst than what is left: spent part kept.
        Case {
            old: "10/s burst 20",
            spent: 2,
            new: "10/s burst 5",
            both: (true, 2),
        },
    ];
    for (row, case) in cases.iter().enumerate() {
        let direct = DirectLimiter::builder(case.old.parse().unwrap())
            .clock(ManualClock::new())
            .build();
        let (limiter, _) = keyed(case.old);
        if case.spent > 0 {
            assert!(direct.check_n(case.spent).unwrap().is_allowed());
            assert!(limiter.check_n(&1, case.spent).unwrap().is_allowed());
        }
        direct.set_quota(case.new.parse().unwrap());
        limiter.set_quota(case.new.parse().unwrap());
        assert_eq!(figures(direct.check()), case.both, "direct, row {row}");
        assert_eq!(figures(limiter.check(&1)), case.both, "keyed, row {row}");
    }
}

/// What a smaller burst does later: the debt beyond the new burst is
/// waited out, the same by the direct and the keyed limiter, and the
/// advertised wait is exactly enough (`tests/quota_change.rs` runs the
/// issue's timeline through every limiter, Redis too).
#[test]
fn a_debt_beyond_the_new_burst_is_waited_out_alike() {
    let clock = ManualClock::new();
    let direct = DirectLimiter::builder("10/s burst 20".parse().unwrap())
        .clock(clock.clone())
        .build();
    let limiter: KeyedLimiter<u64, ManualClock> =
        KeyedLimiter::builder("10/s burst 20".parse().unwrap())
            .clock(clock.clone())
            .build();
    let _ = direct.check_n(10).unwrap();
    let _ = limiter.check_n(&1, 10).unwrap();
    direct.set_quota("10/s burst 5".parse().unwrap());
    limiter.set_quota("10/s burst 5".parse().unwrap());
    let wait = Some(Duration::from_millis(600));
    assert_eq!(direct.peek().retry_after(), wait);
    assert_eq!(limiter.peek(&1).retry_after(), wait);
    clock.advance(Duration::from_millis(599));
    assert!(direct.check().is_denied());
    assert!(limiter.check(&1).is_denied());
    clock.advance(Duration::from_millis(1));
    assert!(direct.check().is_allowed());
    assert!(limiter.check(&1).is_allowed());
}

#[test]
fn stats_count_evictions_and_overflows() {
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::builder("1/s".parse().unwrap())
        .clock(clock.clone())
        .max_keys(3)
        .build();
    for key in 0..5u64 {
        assert!(limiter.check(&key).is_allowed());
    }
    let stats = limiter.stats();
    assert_eq!(stats.keys_held, 3);
    assert_eq!(stats.max_keys, 3);
    assert_eq!(stats.overflow_evictions, 2);
    clock.advance(Duration::from_secs(2));
    assert_eq!(limiter.evict_idle(), 3);
    assert_eq!(limiter.stats().idle_evictions, 3);
    assert_eq!(limiter.stats().keys_held, 0);

    let open = KeyedLimiter::builder("1/s".parse().unwrap())
        .clock(clock.clone())
        .max_keys(1)
        .overflow(OverflowPolicy::AllowUntracked)
        .build();
    let _ = open.check(&1u64);
    let _ = open.check(&2);
    let _ = open.check(&3);
    assert_eq!(open.stats().overflow_untracked, 2);
    assert_eq!(open.stats().overflow_refusals, 0);
}

/// `Stats::record` exports the gauges and counters through `metrics`.
#[cfg(feature = "metrics")]
#[test]
fn stats_export_through_the_metrics_facade() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let (limiter, _) = keyed("1/s");
    let _ = limiter.check(&1);
    let _ = limiter.check(&2);
    assert!(limiter.reset(&2));
    metrics::with_local_recorder(&recorder, || limiter.stats().record("login"));
    let mut seen = 0;
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let label = |name: &str| {
            key.labels()
                .find(|l| l.key() == name)
                .map(|l| l.value().to_owned())
        };
        if key.name() == "turnstile_process_cas_retries_total" {
            assert_eq!(label("limiter"), None, "process-wide: no limiter label");
            continue;
        }
        assert_eq!(label("limiter").as_deref(), Some("login"));
        match (key.name(), value) {
            ("turnstile_keys_held", DebugValue::Gauge(v)) => {
                assert_eq!(v.into_inner(), 1.0);
                seen += 1;
            }
            ("turnstile_evictions_total", DebugValue::Counter(n)) => {
                let expected = u64::from(label("reason").as_deref() == Some("reset"));
                assert_eq!(n, expected, "{key:?}");
                seen += 1;
            }
            _ => {}
        }
    }
    assert_eq!(seen, 4, "one gauge and three eviction counters");
}

/// A per-key quota change through `check_with` keeps the key's TAT too: a
/// caller upgraded mid-burst keeps what it spent, read in the new terms.
#[test]
fn a_per_key_quota_change_through_check_with_keeps_the_spent_part() {
    let (limiter, clock) = keyed("10/min");
    let gold: Quota = "20/min".parse().unwrap();
    for _ in 0..10 {
        assert!(limiter.check(&1).is_allowed());
    }
    assert!(limiter.check(&1).is_denied());
    // One minute owed: twenty tokens of gold, no fresh burst.
    assert!(limiter.check_with(&1, &gold).is_denied());
    clock.advance(Duration::from_secs(3));
    let d = limiter.check_with(&1, &gold);
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 0);
    assert_eq!(
        limiter.peek_n_with(&1, &gold, 1).unwrap().retry_after(),
        Some(Duration::from_secs(3))
    );
    assert_eq!(limiter.refund_with(&1, &gold, 1), Ok(true));
    assert!(limiter.peek_n_with(&1, &gold, 1).unwrap().is_allowed());
}
