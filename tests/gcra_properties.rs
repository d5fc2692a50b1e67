//! Properties of the pure GCRA function (`Gcra::check`, the TAT threaded by
//! hand) and of `DirectLimiter`, which must decide exactly as the pure
//! function does.
//!
//! - (a) it never admits more than `B + floor(elapsed / T)` tokens in any
//!   window of a timeline, for any quota;
//! - (b) it never panics, whatever the `u64`s (times, costs, bursts, TATs),
//!   and a clock that steps back never grants what the latest reading
//!   would have denied;
//! - (c) it agrees with the tutorials' `f64` token bucket
//!   (`reference::SeedTokenBucket`) wherever the exact
//!   token count is not within rounding distance of the decision boundary
//!   (measured: see `f64_token_bucket_agrees_away_from_the_boundary`);
//! - (d) the figures of every `Decision` are consistent.

use std::time::Duration;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{FileFailurePersistence, TestRunner};
use turnstile_rl::algorithms::Step;
use turnstile_rl::{CostError, Decision, DirectLimiter, Gcra, ManualClock, Quota};
use turnstile_test_kit::reference::SeedTokenBucket;

/// 2,000 cases a property; failures are kept in `proptest-regressions/`
/// (committed) and re-run first.
fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 2_000,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/gcra_properties.txt",
        ))),
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------

/// Bursts: mostly small (where windows are tight), sometimes anything.
fn burst() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 1u64..=8,
        2 => 1u64..=1_000,
        1 => 1u64..=u64::MAX,
        1 => Just(u64::MAX),
    ]
}

/// Any valid quota: burst `B`, then an emission interval `T` anywhere in
/// `1..=u64::MAX / B` (so `B * T` fits), built both ways a user builds one:
/// an exact interval (`1 per T`), or `count / period` rounded up.
fn quota() -> impl Strategy<Value = Quota> {
    burst().prop_flat_map(|b| {
        let max_t = u64::MAX / b;
        let exact = prop_oneof![
            4 => 1..=max_t.min(1_000),
            2 => 1..=max_t.min(10_000_000_000),
            1 => 1..=max_t,
            1 => Just(max_t),
        ]
        .prop_map(move |t| Quota::with_period(Duration::from_nanos(t)).and_then(|q| q.burst(b)));
        // count / period: T = ceil(period / count), which must stay <= max_t.
        let rounded = (1u64..=1_000, 1u64..=1_000_000).prop_map(move |(count, spread)| {
            let period = count.saturating_mul(spread.min(max_t)).max(count);
            Quota::new(count, Duration::from_nanos(period)).and_then(|q| q.burst(b))
        });
        prop_oneof![3 => exact, 1 => rounded].prop_filter_map("quota out of range", Result::ok)
    })
}

/// A step of a timeline: how far the clock moves (in units that make sense
/// for `T`), and a cost in `1..=B`.
fn step(t: u64, b: u64) -> impl Strategy<Value = (u64, u64)> {
    let delta = prop_oneof![
        3 => Just(0u64),
        3 => 0..=t.saturating_mul(2),
        3 => (0u64..=8).prop_map(move |k| k.saturating_mul(t)),
        1 => any::<u64>(),
    ];
    let cost = prop_oneof![
        4 => Just(1u64),
        2 => 1..=b.min(4),
        1 => 1..=b,
    ];
    (delta, cost)
}

/// Where a timeline starts: at the origin, later, or near the end of time.
fn start() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => Just(0u64),
        3 => 0u64..=1_000_000_000_000,
        1 => any::<u64>(),
        1 => (0u64..=1_000).prop_map(|k| u64::MAX - k),
    ]
}

/// A quota and a non-decreasing timeline of `(time, cost)` on it.
fn forward_timeline(len: usize) -> impl Strategy<Value = (Quota, Vec<(u64, u64)>)> {
    quota().prop_flat_map(move |q| {
        let steps = prop::collection::vec(
            step(turnstile_rl::__private::interval_nanos(&q), q.burst_size()),
            1..=len,
        );
        (Just(q), start(), steps).prop_map(|(q, start, steps)| {
            let mut now = start;
            let timeline = steps
                .into_iter()
                .map(|(delta, cost)| {
                    now = now.saturating_add(delta);
                    (now, cost)
                })
                .collect();
            (q, timeline)
        })
    })
}

/// A quota and a timeline whose clock may also step back, by any amount.
fn wild_timeline(len: usize) -> impl Strategy<Value = (Quota, Vec<(u64, u64)>)> {
    quota().prop_flat_map(move |q| {
        let t = turnstile_rl::__private::interval_nanos(&q);
        let moves = prop::collection::vec(
            (
                step(t, q.burst_size()),
                prop_oneof![3 => Just(0u64), 1 => 0..=t.saturating_mul(3), 1 => any::<u64>()],
            ),
            1..=len,
        );
        (Just(q), start(), moves).prop_map(|(q, start, moves)| {
            let mut now = start;
            let timeline = moves
                .into_iter()
                .map(|((forward, cost), back)| {
                    now = now.saturating_add(forward).saturating_sub(back);
                    (now, cost)
                })
                .collect();
            (q, timeline)
        })
    })
}

/// TATs worth testing: anything, and the values next to the end of time.
fn tat(t: u64) -> impl Strategy<Value = u64> {
    prop_oneof![
        2 => any::<u64>(),
        2 => 0u64..=1_000_000_000_000,
        1 => (0u64..=3, 0u64..=2).prop_map(move |(k, j)| u64::MAX.saturating_sub(k.saturating_mul(t)).saturating_sub(j)),
        1 => Just(Gcra::TAT_END - 1),
    ]
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Runs `timeline` through the pure function from a full bucket (TAT 0).
fn run(g: &Gcra, timeline: &[(u64, u64)]) -> Vec<Step> {
    let mut tat = 0;
    timeline
        .iter()
        .map(|&(now, cost)| {
            let step = g.check(tat, now, cost).expect("costs in 1..=B are valid");
            if let Some(next) = step.next {
                tat = next;
            }
            step
        })
        .collect()
}

/// The end-of-clock denial: the new TAT cannot be recorded (it would reach
/// `Gcra::TAT_END`), which `Gcra` reports as a wait of `u64::MAX` ns.
fn is_end_of_clock(d: &Decision) -> bool {
    d.retry_after() == Some(Duration::from_nanos(u64::MAX))
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Checks the rate bound on every window `[i, j]` of a run, with `clock[k]`
/// the time to measure window lengths by. Windows that reach an
/// end-of-clock denial are skipped (see property (b)).
fn assert_rate_bound(
    q: &Quota,
    timeline: &[(u64, u64)],
    clock: &[u64],
    steps: &[Step],
) -> Result<(), TestCaseError> {
    let (b, t) = (
        u128::from(q.burst_size()),
        u128::from(turnstile_rl::__private::interval_nanos(q)),
    );
    let stop = steps
        .iter()
        .position(|s| is_end_of_clock(&s.decision))
        .unwrap_or(steps.len());
    for i in 0..stop {
        let mut admitted: u128 = 0;
        for j in i..stop {
            if steps[j].decision.is_allowed() {
                admitted += u128::from(timeline[j].1);
            }
            let elapsed = u128::from(clock[j] - clock[i]);
            prop_assert!(
                admitted <= b + elapsed / t,
                "window [{i}, {j}]: admitted {admitted} > B {b} + {elapsed} ns / T {t}"
            );
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// (a) the rate bound, (b) extremes and backwards clocks, (d) Decision figures
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(config())]

    /// (a) For any quota and any non-decreasing timeline, every window
    /// `[t_i, t_j]` admits at most `B + floor((t_j - t_i) / T)` tokens.
    #[test]
    fn never_admits_more_than_burst_plus_elapsed_over_t((q, timeline) in forward_timeline(24)) {
        let steps = run(&Gcra::new(&q), &timeline);
        let times: Vec<u64> = timeline.iter().map(|&(now, _)| now).collect();
        assert_rate_bound(&q, &timeline, &times, &steps)?;
    }

    /// (b) A clock that steps back, by any amount, grants nothing: the rate
    /// bound still holds when windows are measured on the *latest time seen
    /// so far*, which is what a correct clock would have read.
    ///
    /// Why this is the right statement: comparing decision by decision with a
    /// run on clamped times is wrong, because the two runs' states diverge
    /// (a request denied because of a backwards reading leaves tokens that a
    /// later, larger request may then use: fewer requests, more tokens, still
    /// within the quota). What must hold is the quota itself. The proof: any
    /// decision at `t_k` leaves `TAT >= t_k` (an allow adds `n*T` to at least
    /// `t_k`; a rate denial needs `TAT > t_k`), so before window `[i, j]` the
    /// TAT is at least the latest time `M_i`, each admission adds `n*T`, and
    /// the last one leaves `TAT <= t_k + tau <= M_j + tau`.
    ///
    /// The one exception is the end of the clock: a reading so close to
    /// `u64::MAX` ns (584 years) that no TAT can be recorded is denied
    /// without moving the TAT, so `TAT >= M` no longer holds after it. Such
    /// windows are skipped; the single-step property below covers them.
    #[test]
    fn backwards_clock_stays_within_the_quota_of_the_latest_time_seen((q, timeline) in wild_timeline(24)) {
        let steps = run(&Gcra::new(&q), &timeline);
        let latest: Vec<u64> = timeline
            .iter()
            .scan(0u64, |max, &(now, _)| {
                *max = (*max).max(now);
                Some(*max)
            })
            .collect();
        assert_rate_bound(&q, &timeline, &latest, &steps)?;
    }

    /// (b) One step, same state: a reading `d` ns behind the latest `m` is
    /// denied whenever `m` denies (unless `m` hits the end of the clock, a
    /// denial that says nothing about the rate), and its wait is at most the
    /// wait at `m` plus `d`.
    #[test]
    fn a_backwards_reading_never_turns_a_denial_into_an_allow(
        (q, tat, m, back, cost) in quota().prop_flat_map(|q| {
            let t = turnstile_rl::__private::interval_nanos(&q);
            (Just(q), tat(t), any::<u64>(), any::<u64>(), 1..=q.burst_size())
        })
    ) {
        let g = Gcra::new(&q);
        let back = back % (m.saturating_add(1)).max(1);
        let now = m - back;
        let at_m = g.check(tat, m, cost).unwrap().decision;
        let at_now = g.check(tat, now, cost).unwrap().decision;
        if at_m.is_denied() && !is_end_of_clock(&at_m) {
            prop_assert!(at_now.is_denied(), "m {m} denied, {back} ns earlier allowed: {at_now:?}");
        }
        if at_now.is_denied() && !is_end_of_clock(&at_m) {
            let wait_m = at_m.retry_after().map_or(0, nanos);
            let wait_now = at_now.retry_after().map_or(0, nanos);
            prop_assert!(wait_now <= wait_m.saturating_add(back).max(1));
        }
    }

    /// (b) No `u64` panics: any quota, TAT (even past `Gcra::TAT_END`), time and cost.
    /// Costs of 0 or above `B` are errors; every answer is well formed.
    #[test]
    fn never_panics_on_any_u64(
        q in quota(),
        tat in prop_oneof![any::<u64>(), Just(u64::MAX), Just(0u64)],
        now in prop_oneof![any::<u64>(), Just(u64::MAX), Just(0u64)],
        cost in prop_oneof![any::<u64>(), Just(u64::MAX), Just(0u64), 1u64..=4],
    ) {
        let g = Gcra::new(&q);
        let b = q.burst_size();
        match g.check(tat, now, cost) {
            Err(CostError::Zero) => prop_assert_eq!(cost, 0),
            Err(CostError::ExceedsCapacity { cost: c, capacity: burst }) => {
                prop_assert!(c == cost && burst == b && cost > b);
            }
            Err(other) => prop_assert!(false, "unexpected error {other:?}"),
            Ok(step) => {
                prop_assert!(cost >= 1 && cost <= b);
                prop_assert_eq!(step.next.is_some(), step.decision.is_allowed());
                if let Some(next) = step.next {
                    prop_assert!(next < Gcra::TAT_END);
                    prop_assert!(u128::from(next) >= u128::from(now) + u128::from(cost) * u128::from(turnstile_rl::__private::interval_nanos(&q)));
                }
                prop_assert!(step.decision.remaining() <= b);
            }
        }
    }

    /// (b) The limiter itself, on a manual clock jumping anywhere (u64::MAX,
    /// backwards): no panic, and errors exactly for the impossible costs.
    #[test]
    fn direct_limiter_never_panics_on_wild_clocks(
        q in quota(),
        moves in prop::collection::vec((any::<u64>(), prop_oneof![any::<u64>(), 0u64..=3]), 1..=16),
    ) {
        let clock = ManualClock::new();
        let limiter = DirectLimiter::builder(q).clock(clock.clone()).build();
        for (now, cost) in moves {
            clock.set_nanos(now);
            let answer = limiter.check_n(cost);
            prop_assert_eq!(answer.is_err(), cost == 0 || cost > q.burst_size());
            let _ = limiter.check();
        }
    }

    /// (d) Decision figures, on any state and time: an allow has no wait and
    /// at most `tau` to reset; a denial has a wait > 0, and checking again
    /// after exactly that wait, on the same state, passes; `remaining <= B`;
    /// a full bucket that admits `n` has exactly `B - n` left.
    #[test]
    fn decision_invariants(
        (q, tat, now, cost) in quota().prop_flat_map(|q| {
            let t = turnstile_rl::__private::interval_nanos(&q);
            (Just(q), tat(t), prop_oneof![any::<u64>(), 0u64..=1_000_000_000_000, tat(t)], 1..=q.burst_size())
        })
    ) {
        let g = Gcra::new(&q);
        let (b, t) = (q.burst_size(), turnstile_rl::__private::interval_nanos(&q));
        let d = g.check(tat, now, cost).unwrap().decision;
        prop_assert!(d.remaining() <= b);
        prop_assert_eq!(d.limit(), b);
        if d.is_allowed() {
            prop_assert_eq!(d.retry_after(), None);
            prop_assert!(nanos(d.reset_after()) <= turnstile_rl::__private::tolerance_nanos(&q));
            prop_assert!(u128::from(nanos(d.reset_after())) >= u128::from(cost) * u128::from(t));
            if tat <= now {
                prop_assert_eq!(d.remaining(), b - cost, "full bucket");
            }
        } else {
            let wait = d.retry_after().map(nanos);
            prop_assert!(wait.is_some_and(|w| w > 0));
            let wait = wait.unwrap_or(u64::MAX);
            if !is_end_of_clock(&d) {
                let later = now.checked_add(wait);
                prop_assert!(later.is_some(), "a finite wait must stay on the clock");
                let again = g.check(tat, later.unwrap_or(u64::MAX), cost).unwrap().decision;
                prop_assert!(again.is_allowed(), "denied {d:?}, then after the wait {again:?}");
            }
            if tat <= now {
                // Full bucket, valid cost: only the end of the clock denies.
                prop_assert!(is_end_of_clock(&d));
            }
        }
    }

    /// `DirectLimiter` on a `ManualClock` decides exactly as the pure
    /// function with the TAT threaded by hand, figure for figure, forwards,
    /// backwards, with valid and invalid costs.
    #[test]
    fn direct_limiter_equals_the_pure_function(
        (q, timeline) in wild_timeline(32),
        odd_costs in prop::collection::vec(prop_oneof![8 => Just(None), 1 => Just(Some(0u64)), 1 => Just(Some(u64::MAX))], 32),
    ) {
        let g = Gcra::new(&q);
        let clock = ManualClock::new();
        let limiter = DirectLimiter::builder(q).clock(clock.clone()).build();
        let mut tat = 0;
        for (k, &(now, cost)) in timeline.iter().enumerate() {
            let cost = odd_costs[k].unwrap_or(cost);
            clock.set_nanos(now);
            let expected = g.check(tat, now, cost);
            let got = if cost == 1 && k % 2 == 0 { Ok(limiter.check()) } else { limiter.check_n(cost) };
            prop_assert_eq!(got, expected.map(|s| s.decision), "step {} at {} cost {}", k, now, cost);
            if let Ok(Step { next: Some(next), .. }) = expected {
                tat = next;
            }
        }
    }
}

/// (d), at the edge: a denial whose new TAT would be exactly `Gcra::TAT_END`
/// (`max(TAT, now) + n*T == TAT_END`) can never be recorded, so no wait
/// helps: it reports the end of the clock (`u64::MAX` ns) rather than a
/// finite wait that would be denied again. Found by proptest (the
/// regression is committed in `proptest-regressions/`).
#[test]
fn retry_after_that_would_land_on_the_end_of_time() -> Result<(), Box<dyn std::error::Error>> {
    let g = Gcra::new(&Quota::per_second(1)?.burst(2)?);
    let t = 1_000_000_000;
    let tat = Gcra::TAT_END - t;
    let now = tat - 2 * t - 1;
    let d = g.check(tat, now, 1)?.decision;
    assert!(d.is_denied());
    assert!(is_end_of_clock(&d), "{d:?}");
    Ok(())
}

// ---------------------------------------------------------------------------
// (c) GCRA against the tutorials' f64 token bucket
// ---------------------------------------------------------------------------

/// The tutorials' token bucket as plain arithmetic, operation for operation the
/// same as `SeedTokenBucket::allow_request` (so the same bits), but with
/// its state visible.
#[derive(Debug, Clone, Copy)]
struct F64Bucket {
    capacity: f64,
    rate: f64,
    state: Option<(f64, f64)>,
}

impl F64Bucket {
    fn allow(&mut self, now_nanos: u64, tokens: f64) -> bool {
        let now = now_nanos as f64 / 1e9;
        let (current, last) = self.state.unwrap_or((self.capacity, now));
        let elapsed = (now - last).max(0.0);
        let updated = self.capacity.min(current + elapsed * self.rate);
        let allowed = updated >= tokens;
        self.state = Some((if allowed { updated - tokens } else { updated }, now));
        allowed
    }
}

/// A quota whose `T` is exact (`period = count * T`), with the `f64` rate a
/// user of the tutorials would write for it: `count / period_in_seconds`.
fn exact_quota() -> impl Strategy<Value = (Quota, f64)> {
    (
        1u64..=1_000,
        prop_oneof![
            1u64..=1_000,
            1_000u64..=10_000_000_000,
            (1u64..=100).prop_map(|k| k * 10_000_000)
        ],
        1u64..=1_000,
    )
        .prop_filter_map("quota out of range", |(count, t, burst)| {
            let period = count.checked_mul(t)?;
            let quota = Quota::new(count, Duration::from_nanos(period))
                .ok()?
                .burst(burst)
                .ok()?;
            Some((quota, count as f64 / (period as f64 / 1e9)))
        })
}

/// Timelines in whole nanoseconds, up to about 100 days (`2^53` ns, where an
/// `f64` still holds nanoseconds exactly), with steps that are simple
/// fractions of `T`, the way real traffic and real tests land on the
/// boundary (1.1 s at 2/s is 2.2 tokens), and arbitrary nanoseconds.
fn f64_timeline(t: u64, b: u64, len: usize) -> impl Strategy<Value = (u64, Vec<(u64, u64)>)> {
    let delta = prop_oneof![
        2 => Just(0u64),
        3 => (0u64..=3 * b, 1u64..=10).prop_map(move |(k, div)| k.saturating_mul(t) / div),
        2 => 0..=t.saturating_mul(2),
    ];
    let cost = prop_oneof![3 => Just(1u64), 1 => 1..=b];
    let start = prop_oneof![Just(0u64), 0u64..=86_400_000_000_000, 0u64..=(1u64 << 53)];
    (start, prop::collection::vec((delta, cost), 1..=len)).prop_map(|(start, steps)| {
        let mut now = start;
        let timeline = steps
            .into_iter()
            .map(|(delta, cost)| {
                now = now.saturating_add(delta).min(1 << 53);
                (now, cost)
            })
            .collect();
        (start, timeline)
    })
}

/// How one timeline compared.
#[derive(Debug, Default, Clone, Copy)]
struct Comparison {
    decisions: u64,
    /// Set at the first disagreement (the runs' states diverge after it):
    /// how far the exact token count was from the cost, in tokens, and the
    /// epsilon it was allowed.
    disagreement: Option<(f64, f64)>,
    /// Whether the f64 bucket was the one that allowed.
    f64_allowed: bool,
}

/// Runs one timeline on the GCRA and on the f64 bucket, up to the first
/// disagreement.
fn compare(q: &Quota, rate: f64, timeline: &[(u64, u64)]) -> Comparison {
    let g = Gcra::new(q);
    let (b, t, tau) = (
        q.burst_size(),
        turnstile_rl::__private::interval_nanos(q),
        turnstile_rl::__private::tolerance_nanos(q),
    );
    let mut f64_bucket = F64Bucket {
        capacity: b as f64,
        rate,
        state: None,
    };
    let mut tat = 0u64;
    let mut out = Comparison::default();
    for &(now, cost) in timeline {
        // The exact token count before this decision, in nanoseconds of
        // credit: B*T - max(0, TAT - now); the boundary is at cost * T.
        let credit = tau - tat.saturating_sub(now).min(tau);
        let distance = (i128::from(credit) - i128::from(cost) * i128::from(t)).unsigned_abs()
            as f64
            / t as f64;
        let step = g.check(tat, now, cost).expect("valid cost");
        let seed_allows = f64_bucket.allow(now, cost as f64);
        out.decisions += 1;
        if step.decision.is_allowed() != seed_allows {
            // Rounding of f64 seconds and of the products and sums: a few
            // ulps of the largest magnitudes involved, per step.
            let scale = b as f64 + (now as f64 / 1e9) * rate;
            let epsilon = 1e-12 * (1.0 + scale);
            out.disagreement = Some((distance, epsilon));
            out.f64_allowed = seed_allows;
            return out;
        }
        if let Some(next) = step.next {
            tat = next;
        }
    }
    out
}

proptest! {
    #![proptest_config(config())]

    /// (c) On quotas with an exact `T`, the GCRA and the tutorials' f64 bucket
    /// make the same decision unless the exact token count is within a
    /// rounding epsilon of the cost (the decision boundary).
    ///
    /// Measured with `measure_f64_disagreement` (ignored; run it with
    /// `cargo test --release --test gcra_properties -- --ignored --nocapture`),
    /// 100,000 timelines of up to 32 decisions per distribution, compared up
    /// to their first disagreement (the states diverge after it):
    ///
    /// | timelines                                   | disagree | decisions compared |
    /// |---------------------------------------------|----------|--------------------|
    /// | boundary-heavy: steps of `k*T/d`, d <= 10   | 41 (0.041 %) | 1,650,589 |
    /// | arbitrary nanoseconds, start within a day   | 7 (0.007 %)  | 1,646,681 |
    /// | seed-like: 1..100 per s or min, whole ms    | 8 (0.008 %)  | 1,647,675 |
    ///
    /// So about 1 decision in 40,000 (boundary-heavy) to 1 in 200,000
    /// differs. Every disagreement found was the same kind: the exact token
    /// count was *exactly* the cost (distance 0: GCRA's `tat' - now == tau`,
    /// allowed), and the f64 sum `tokens + elapsed * rate` came out one ulp
    /// or so short (for example 0.9999999999999998), so the tutorials' bucket
    /// denied. The f64 bucket never allowed where GCRA denied in these runs.
    /// The epsilon below (`1e-12 * (1 + B + now_secs * rate)`) has a wide
    /// margin over that; its `now_secs * rate` term is there because `f64`
    /// seconds stop holding whole nanoseconds after 2^52 ns (about 52 days),
    /// past which the tutorials' bucket is off by `rate * ulp(now)` tokens.
    /// GCRA on integer nanoseconds has no boundary error at all.
    #[test]
    fn f64_token_bucket_agrees_away_from_the_boundary(
        ((q, rate), (start, timeline)) in exact_quota().prop_flat_map(|(q, rate)| {
            (Just((q, rate)), f64_timeline(turnstile_rl::__private::interval_nanos(&q), q.burst_size(), 32))
        })
    ) {
        let _ = start;
        let result = compare(&q, rate, &timeline);
        if let Some((distance, epsilon)) = result.disagreement {
            prop_assert!(
                distance <= epsilon,
                "disagreement {distance} tokens from the boundary (epsilon {epsilon}) on {q} after {} decisions",
                result.decisions
            );
        }
    }

    /// `SeedTokenBucket` is the same f64 arithmetic as the inline model
    /// above, bit for bit, so (c) speaks about the reference type itself.
    #[test]
    fn the_reference_token_bucket_is_the_inline_f64_model(
        ((q, rate), (start, timeline)) in exact_quota().prop_flat_map(|(q, rate)| {
            (Just((q, rate)), f64_timeline(turnstile_rl::__private::interval_nanos(&q), q.burst_size(), 32))
        })
    ) {
        let _ = start;
        let clock = ManualClock::new();
        let b = q.burst_size() as f64;
        let seed = SeedTokenBucket::<u32, _>::with_clock(b, rate, clock.clone()).unwrap();
        let mut model = F64Bucket { capacity: b, rate, state: None };
        for &(now, cost) in &timeline {
            clock.set_nanos(now);
            prop_assert_eq!(seed.allow_request(&7, cost as f64), model.allow(now, cost as f64));
        }
    }
}

/// Measures how often and by how much the GCRA and the f64 bucket differ
/// (the figures quoted on `f64_token_bucket_agrees_away_from_the_boundary`).
#[test]
#[ignore = "a measurement, not a check: run with --ignored --nocapture"]
fn measure_f64_disagreement() {
    let runs = 100_000;
    let accumulate = |start: u64, steps: Vec<(u64, u64)>| {
        let mut now = start;
        let timeline: Vec<(u64, u64)> = steps
            .into_iter()
            .map(|(delta, cost)| {
                now = now.saturating_add(delta).min(1 << 53);
                (now, cost)
            })
            .collect();
        (start, timeline)
    };
    type Case = ((Quota, f64), (u64, Vec<(u64, u64)>));
    let distributions: [(&str, BoxedStrategy<Case>); 3] = [
        (
            "boundary-heavy (steps k*T/d)",
            exact_quota()
                .prop_flat_map(|(q, rate)| {
                    (
                        Just((q, rate)),
                        f64_timeline(
                            turnstile_rl::__private::interval_nanos(&q),
                            q.burst_size(),
                            32,
                        ),
                    )
                })
                .boxed(),
        ),
        (
            "arbitrary nanoseconds",
            exact_quota()
                .prop_flat_map(move |(q, rate)| {
                    let t = turnstile_rl::__private::interval_nanos(&q);
                    let b = q.burst_size();
                    let steps =
                        prop::collection::vec((0..=t.saturating_mul(2), 1..=b.min(3)), 1..=32);
                    (
                        Just((q, rate)),
                        (0u64..=86_400_000_000_000, steps).prop_map(move |(a, s)| accumulate(a, s)),
                    )
                })
                .boxed(),
        ),
        (
            "seed-like (count/s or /min, burst <= 100, whole-ms steps)",
            (
                prop::sample::select(vec![1u64, 2, 4, 5, 10, 20, 50, 100]),
                prop::sample::select(vec![1u64, 60]),
                1u64..=100,
            )
                .prop_filter_map("quota", |(count, secs, burst)| {
                    let q = Quota::new(count, Duration::from_secs(secs))
                        .ok()?
                        .burst(burst)
                        .ok()?;
                    turnstile_rl::__private::period_nanos(&q)
                        .is_multiple_of(count)
                        .then(|| (q, count as f64 / secs as f64))
                })
                .prop_flat_map(move |(q, rate)| {
                    let b = q.burst_size();
                    let cost = prop_oneof![3 => Just(1u64), 1 => 1..=b.min(3)];
                    let steps = prop::collection::vec(
                        ((0u64..=2_000).prop_map(|ms| ms * 1_000_000), cost),
                        1..=32,
                    );
                    (
                        Just((q, rate)),
                        (0u64..=3_600_000, steps)
                            .prop_map(move |(a, s)| accumulate(a * 1_000_000, s)),
                    )
                })
                .boxed(),
        ),
    ];
    for (label, strategy) in distributions {
        let mut runner = TestRunner::deterministic();
        let (mut decisions, mut disagreeing, mut f64_allowed, mut worst, mut worst_relative) =
            (0u64, 0u64, 0u64, 0f64, 0f64);
        for _ in 0..runs {
            let ((q, rate), (_, timeline)) = strategy.new_tree(&mut runner).unwrap().current();
            let result = compare(&q, rate, &timeline);
            decisions += result.decisions;
            if let Some((distance, epsilon)) = result.disagreement {
                disagreeing += 1;
                f64_allowed += u64::from(result.f64_allowed);
                worst = worst.max(distance);
                worst_relative = worst_relative.max(distance / (epsilon / 1e-12));
            }
        }
        eprintln!(
            "{label}: {disagreeing} of {runs} timelines disagree ({:.3} %; f64 allowed in {f64_allowed}), \
             {decisions} decisions compared; worst distance from the boundary {worst:e} tokens \
             ({worst_relative:e} of the scale)",
            100.0 * disagreeing as f64 / runs as f64
        );
    }
}
