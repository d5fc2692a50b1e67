//! turnstile's pure GCRA against an exact reference model in u128
//! arithmetic: any interval, any burst, any timeline (times repeat, jump,
//! go backwards), any cost. Every decision and every figure must agree, and
//! nothing may panic or overflow.
#![no_main]

use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use turnstile_rl::{CostError, Gcra, Quota};

#[path = "common.rs"]
mod common;

#[derive(Arbitrary, Debug)]
struct Input {
    interval: u64,
    burst: u64,
    tat: u64,
    ops: Vec<(u64, u64)>,
}

/// What the model expects of one decision.
#[derive(Debug, PartialEq)]
struct Expected {
    next: Option<u64>,
    allowed: bool,
    remaining: u64,
    reset_after: u64,
    retry_after: Option<u64>,
}

/// DESIGN.md's GCRA, written the obvious way on u128, where nothing wraps.
fn model(t: u64, burst: u64, tat: u64, now: u64, cost: u64) -> Result<Expected, CostError> {
    if cost == 0 {
        return Err(CostError::Zero);
    }
    if cost > burst {
        return Err(CostError::ExceedsCapacity {
            cost,
            capacity: burst,
        });
    }
    let (t, tau, now) = (
        u128::from(t),
        u128::from(burst) * u128::from(t),
        u128::from(now),
    );
    let base = u128::from(tat).max(now);
    let next = base + u128::from(cost) * t;
    // The largest storable TAT is one below `Gcra::TAT_END`.
    let storable = next < u128::from(Gcra::TAT_END);
    let narrow = |x: u128| u64::try_from(x).unwrap_or(u64::MAX);
    if next - now <= tau && storable {
        Ok(Expected {
            next: Some(narrow(next)),
            allowed: true,
            remaining: narrow((tau - (next - now)) / t),
            reset_after: narrow(next - now),
            retry_after: None,
        })
    } else {
        let retry = if next - now > tau && storable {
            narrow(next - now - tau)
        } else {
            u64::MAX
        };
        Ok(Expected {
            next: None,
            allowed: false,
            remaining: narrow((tau - (base - now).min(tau)) / t),
            reset_after: narrow(base - now),
            retry_after: Some(retry.max(1)),
        })
    }
}

fuzz_target!(|input: Input| {
    let Ok(quota) =
        Quota::with_period(Duration::from_nanos(input.interval)).and_then(|q| q.burst(input.burst))
    else {
        return;
    };
    let gcra = Gcra::new(&quota);
    let (t, burst) = (
        turnstile_rl::__private::interval_nanos(&quota),
        quota.burst_size(),
    );
    let mut tat = input.tat.min(Gcra::TAT_END - 1);
    for &(now, cost) in &input.ops {
        let expected = model(t, burst, tat, now, cost);
        let actual = gcra.check(tat, now, cost).map(|step| {
            let d = step.decision;
            assert_eq!(d.limit(), burst);
            Expected {
                next: step.next,
                allowed: d.is_allowed(),
                remaining: d.remaining(),
                reset_after: common::nanos(d.reset_after()),
                retry_after: d.retry_after().map(common::nanos),
            }
        });
        assert_eq!(
            actual, expected,
            "T={t} B={burst} TAT={tat} now={now} cost={cost}"
        );
        if let Ok(Expected {
            next: Some(next), ..
        }) = expected
        {
            tat = next;
        }
    }
});
