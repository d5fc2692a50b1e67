//! Every public function that takes a number, fed the extremes (0, 1,
//! `u64::MAX`, `Duration::MAX`) and random values: an `Ok`, an `Err` or a
//! decision, never a panic or an overflow (this test profile keeps overflow
//! checks on).

use std::time::Duration;

use proptest::prelude::*;
use turnstile_rl::algorithms::{FixedWindow, SlidingWindow};
use turnstile_rl::{
    Decision, DirectLimiter, Gcra, KeyedLimiter, ManualClock, OverflowPolicy, Quota, SlidingLog,
};

fn number() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0),
        Just(1),
        Just(2),
        Just(u64::MAX),
        Just(u64::MAX - 1),
        Just(u64::from(u32::MAX)),
        0..1_000u64,
        any::<u64>(),
    ]
}

fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::from_nanos(1)),
        Just(Duration::MAX),
        Just(Duration::from_nanos(u64::MAX)),
        Just(Duration::from_secs(u64::MAX)),
        number().prop_map(Duration::from_nanos),
        (any::<u64>(), 0..1_000_000_000u32).prop_map(|(s, n)| Duration::new(s, n)),
    ]
}

/// Every quota constructor on the same numbers, and the burst on the
/// result: whichever succeed.
fn quotas(n: u64, period: Duration, burst: u64) -> Vec<Quota> {
    let made = [
        Quota::new(n, period),
        Quota::per_second(n),
        Quota::per_minute(n),
        Quota::per_hour(n),
        Quota::with_period(period),
    ];
    let mut quotas = Vec::new();
    for quota in made.into_iter().flatten() {
        touch_quota(&quota);
        if let Ok(bursty) = quota.burst(burst) {
            touch_quota(&bursty);
            quotas.push(bursty);
        }
        quotas.push(quota);
    }
    quotas
}

fn touch_quota(q: &Quota) {
    let _ = (q.count(), q.period(), q.burst_size(), q.emission_interval());
    let _ = (
        turnstile_rl::__private::interval_nanos(q),
        turnstile_rl::__private::period_nanos(q),
        turnstile_rl::__private::tolerance_nanos(q),
    );
    let _ = q.to_string().parse::<Quota>();
}

/// Reads every figure of a decision.
fn touch(d: Decision) {
    let _ = (d.is_allowed(), d.is_denied(), d.remaining(), d.limit());
    let _ = (d.retry_after(), d.reset_after());
    assert_eq!(d.is_allowed(), d.retry_after().is_none());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn pure_algorithms_take_any_numbers(
        n in number(),
        period in duration(),
        burst in number(),
        state in number(),
        now in number(),
        cost in number(),
    ) {
        for quota in quotas(n, period, burst) {
            if let Ok(step) = Gcra::new(&quota).check(state, now, cost) {
                touch(step.decision);
            }
            if let Ok(fixed) = FixedWindow::new(&quota) {
                let _ = (fixed.limit(), fixed.window());
                if let Ok(step) = fixed.check(state, now, cost) {
                    touch(step.decision);
                }
            }
            if let Ok(sliding) = SlidingWindow::new(&quota) {
                let _ = (sliding.limit(), sliding.window());
                if let Ok(step) = sliding.check(state, now, cost) {
                    touch(step.decision);
                }
            }
        }
    }

    #[test]
    fn limiters_take_any_numbers_at_any_time(
        n in number(),
        period in duration(),
        burst in number(),
        times in prop::collection::vec((number(), number()), 1..6),
        max_keys in prop_oneof![Just(0usize), Just(1), Just(usize::MAX), 0..64usize],
        advance in duration(),
    ) {
        for quota in quotas(n, period, burst) {
            let clock = ManualClock::new();
            let direct = DirectLimiter::builder(quota).clock(clock.clone()).build();
            let fixed = FixedWindow::new(&quota)
                .ok()
                .map(|w| DirectLimiter::builder(quota).clock(clock.clone()).algorithm(w).build());
            let sliding = SlidingWindow::new(&quota)
                .ok()
                .map(|w| DirectLimiter::builder(quota).clock(clock.clone()).algorithm(w).build());
            let keyed = KeyedLimiter::<u64, _>::builder(quota)
                .clock(clock.clone())
                .max_keys(max_keys)
                .build();
            let deny = KeyedLimiter::<u64, _>::builder(quota)
                .clock(clock.clone())
                .max_keys(max_keys)
                .overflow(OverflowPolicy::Deny)
                .build();
            let log = SlidingLog::builder(quota).clock(clock.clone()).build();
            let check = |cost: u64| {
                let _ = direct.check_n(cost).map(touch);
                if let Some(fixed) = &fixed {
                    let _ = fixed.check_n(cost).map(touch);
                }
                if let Some(sliding) = &sliding {
                    let _ = sliding.check_n(cost).map(touch);
                }
                let _ = keyed.check_n(&cost, cost).map(touch);
                let _ = deny.check_n(&cost, cost).map(touch);
                let _ = log.check_n(cost).map(touch);
            };
            for &(now, cost) in &times {
                clock.set_nanos(now);
                check(cost);
                check(1);
            }
            let _ = keyed.evict_idle();
            clock.advance(advance);
            clock.advance(Duration::MAX);
            prop_assert_eq!(clock.elapsed(), Duration::from_nanos(u64::MAX));
            check(1);
            check(u64::MAX);
            let _ = (keyed.evict_idle(), keyed.len(), keyed.capacity());
            prop_assert!(keyed.len() <= keyed.max_keys());
        }
    }
}
