//! `SlidingLog` on a manual clock against the plainest model of its docs: a
//! list of every admitted request `(time, cost)`, and a request of cost `n`
//! at `now` passes iff the costs logged in `(now - period, now]` plus `n`
//! are at most the limit. Time moves forward only (repeats and jumps
//! included). Decisions and every figure must agree; nothing may panic.
#![no_main]

use std::collections::VecDeque;
use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use turnstile_rl::SlidingLog;
use turnstile_rl::{CostError, ManualClock, Quota};

#[path = "common.rs"]
mod common;

#[derive(Arbitrary, Debug)]
enum Time {
    Same,
    Forward(u16),
    Further(u32),
    Far(u64),
}

#[derive(Arbitrary, Debug)]
struct Input {
    count: u16,
    period: u64,
    ops: Vec<(Time, u16)>,
}

#[derive(Debug, PartialEq)]
struct Expected {
    allowed: bool,
    remaining: u64,
    reset_after: u64,
    retry_after: Option<u64>,
}

fuzz_target!(|input: Input| {
    let Ok(quota) = Quota::new(u64::from(input.count), Duration::from_nanos(input.period)) else {
        return;
    };
    let (limit, period) = (quota.count(), turnstile_rl::__private::period_nanos(&quota));
    let clock = ManualClock::new();
    let log = SlidingLog::builder(quota).clock(clock.clone()).build();
    assert_eq!(log.limit(), limit);
    assert_eq!(log.window(), quota.period());
    // Every admitted request, oldest first, never merged or dropped.
    let mut admitted: VecDeque<(u64, u64)> = VecDeque::new();
    let mut now = 0u64;
    for (time, cost) in &input.ops {
        now = match *time {
            Time::Same => now,
            Time::Forward(d) => now.saturating_add(u64::from(d)),
            Time::Further(d) => now.saturating_add(u64::from(d)),
            Time::Far(d) => now.saturating_add(d),
        };
        clock.set_nanos(now);
        let cost = u64::from(*cost);
        // An entry at `t` counts while `now < t + period`; it leaves at
        // `t + period`, never if that is past the clock's range.
        let leaves = |t: u64| u128::from(t) + u128::from(period);
        let until = |t: u64| match u64::try_from(leaves(t)) {
            Ok(end) => end - now,
            Err(_) => u64::MAX,
        };
        let live: Vec<(u64, u64)> = admitted
            .iter()
            .copied()
            .filter(|&(t, _)| leaves(t) > u128::from(now))
            .collect();
        let used: u64 = live.iter().map(|&(_, c)| c).sum();
        let expected = if cost == 0 {
            Err(CostError::Zero)
        } else if cost > limit {
            Err(CostError::ExceedsCapacity {
                cost,
                capacity: limit,
            })
        } else if used + cost <= limit {
            Ok(Expected {
                allowed: true,
                remaining: limit - used - cost,
                reset_after: until(now),
                retry_after: None,
            })
        } else {
            // Free the oldest until the cost fits.
            let needed = used + cost - limit;
            let mut freed = 0;
            let mut retry = u64::MAX;
            for &(t, c) in &live {
                freed += c;
                if freed >= needed {
                    retry = until(t);
                    break;
                }
            }
            Ok(Expected {
                allowed: false,
                remaining: limit - used,
                reset_after: live.last().map_or(0, |&(t, _)| until(t)),
                retry_after: Some(retry.max(1)),
            })
        };
        let actual = log.check_n(cost).map(|d| {
            assert_eq!(d.limit(), limit);
            Expected {
                allowed: d.is_allowed(),
                remaining: d.remaining(),
                reset_after: common::nanos(d.reset_after()),
                retry_after: d.retry_after().map(common::nanos),
            }
        });
        assert_eq!(
            actual, expected,
            "limit={limit} period={period} now={now} cost={cost} log={admitted:?}"
        );
        if matches!(expected, Ok(Expected { allowed: true, .. })) {
            admitted.push_back((now, cost));
        }
        // Keep the model small: drop what has left for good (time only
        // moves forward).
        while admitted
            .front()
            .is_some_and(|&(t, _)| leaves(t) <= u128::from(now))
        {
            admitted.pop_front();
        }
    }
});
