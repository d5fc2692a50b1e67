//! The pure fixed window (`FixedWindow::check`) against a model written
//! from its docs alone, unpacked and in u128: any count and period that
//! fit, any timeline (repeats, jumps, backwards readings, the horizon), any
//! cost. Decisions, every figure and the new packed state must agree.
#![no_main]

use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use turnstile_rl::algorithms::FixedWindow;
use turnstile_rl::{CostError, Quota};

#[path = "common.rs"]
mod common;

#[derive(Arbitrary, Debug)]
enum Time {
    Same,
    Forward(u32),
    Far(u64),
    /// Any reading, forwards or backwards.
    Set(u64),
}

#[derive(Arbitrary, Debug)]
struct Input {
    count: u32,
    period: u64,
    ops: Vec<(Time, u32)>,
}

/// The documented window-index bits: 2^39 windows, then every request is denied.
const INDEX_END: u128 = 1 << 39;

#[derive(Debug, PartialEq)]
struct Expected {
    next: Option<(u128, u128)>,
    allowed: bool,
    remaining: u64,
    reset_after: u64,
    retry_after: Option<u64>,
}

fn sat(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

/// The model: state `(window, count)`, initially `(0, 0)`.
fn model(
    limit: u128,
    period: u128,
    state: (u128, u128),
    now: u64,
    cost: u64,
) -> Result<Expected, CostError> {
    if cost == 0 {
        return Err(CostError::Zero);
    }
    if u128::from(cost) > limit {
        return Err(CostError::ExceedsCapacity {
            cost,
            capacity: sat(limit),
        });
    }
    let now128 = u128::from(now);
    let window = now128 / period;
    if window >= INDEX_END {
        return Ok(Expected {
            next: None,
            allowed: false,
            remaining: 0,
            reset_after: u64::MAX,
            retry_after: Some(u64::MAX),
        });
    }
    // A backwards reading counts against the recorded window.
    let (window, used) = if state.0 >= window {
        state
    } else {
        (window, 0)
    };
    let end = sat((window + 1) * period - now128.min((window + 1) * period));
    let total = used + u128::from(cost);
    if total <= limit {
        Ok(Expected {
            next: Some((window, total)),
            allowed: true,
            remaining: sat(limit - total),
            reset_after: end,
            retry_after: None,
        })
    } else {
        let retry = if window + 1 < INDEX_END {
            end
        } else {
            u64::MAX
        };
        Ok(Expected {
            next: None,
            allowed: false,
            remaining: sat(limit.saturating_sub(used)),
            reset_after: end,
            retry_after: Some(retry.max(1)),
        })
    }
}

fuzz_target!(|input: Input| {
    let Ok(quota) = Quota::new(u64::from(input.count), Duration::from_nanos(input.period)) else {
        return;
    };
    let Ok(fixed) = FixedWindow::new(&quota) else {
        return;
    };
    let (limit, period) = (
        u128::from(quota.count()),
        u128::from(turnstile_rl::__private::period_nanos(&quota)),
    );
    assert_eq!(u128::from(fixed.limit()), limit);
    assert_eq!(fixed.window(), quota.period());
    let mut state = 0u64;
    let mut modelled = (0u128, 0u128);
    let mut now = 0u64;
    for (time, cost) in &input.ops {
        now = match *time {
            Time::Same => now,
            Time::Forward(d) => now.saturating_add(u64::from(d)),
            Time::Far(d) => now.saturating_add(d),
            Time::Set(t) => t,
        };
        let cost = u64::from(*cost);
        let expected = model(limit, period, modelled, now, cost);
        let actual = fixed.check(state, now, cost).map(|step| {
            let d = step.decision;
            assert_eq!(u128::from(d.limit()), limit);
            Expected {
                // The documented packing: `index << 24 | count`.
                next: step
                    .next
                    .map(|s| (u128::from(s >> 24), u128::from(s & 0xFF_FFFF))),
                allowed: d.is_allowed(),
                remaining: d.remaining(),
                reset_after: common::nanos(d.reset_after()),
                retry_after: d.retry_after().map(common::nanos),
            }
        });
        assert_eq!(
            actual, expected,
            "limit={limit} period={period} state={modelled:?} now={now} cost={cost}"
        );
        if let Ok(step) = fixed.check(state, now, cost) {
            if let Some(next) = step.next {
                state = next;
                modelled = expected.unwrap().next.unwrap();
            }
        }
    }
});
