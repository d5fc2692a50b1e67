//! The pure sliding-window counter (`SlidingWindow::check`) against a model
//! written from its docs alone, unpacked and in u128: the exact inequality
//! `prev * (period - elapsed) + (cur + n) * period <= limit * period`, the
//! backwards-clock rule (decided at the recorded window's start), the
//! horizon, and `retry_after` found by bisection over the model's own
//! decisions rather than in closed form. Decisions, every figure and the new
//! packed state must agree.
#![no_main]

use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use turnstile_rl::algorithms::SlidingWindow;
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
    count: u16,
    period: u64,
    ops: Vec<(Time, u16)>,
}

/// The documented window-index bits: 2^31 windows, then every request is denied.
const INDEX_END: u128 = 1 << 31;

#[derive(Clone, Copy, Debug, PartialEq)]
struct State {
    index: u128,
    prev: u128,
    cur: u128,
}

#[derive(Debug, PartialEq)]
struct Expected {
    next: Option<State>,
    allowed: bool,
    remaining: u64,
    reset_after: u64,
    retry_after: Option<u64>,
}

fn sat(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

struct Model {
    limit: u128,
    period: u128,
}

impl Model {
    /// Where a request at `t` falls: the effective time (a backwards reading
    /// moves to the recorded window's start) and the counts rolled to it.
    /// `None` past the horizon.
    fn at(&self, s: State, t: u128) -> Option<(u128, State)> {
        if t / self.period >= INDEX_END {
            return None;
        }
        let t = t.max(s.index * self.period);
        let index = t / self.period;
        let rolled = if index == s.index {
            s
        } else if index == s.index + 1 {
            State {
                index,
                prev: s.cur,
                cur: 0,
            }
        } else {
            State {
                index,
                prev: 0,
                cur: 0,
            }
        };
        Some((t, rolled))
    }

    fn fits(&self, at: State, t: u128, n: u128) -> bool {
        let elapsed = t - at.index * self.period;
        at.prev * (self.period - elapsed) + (at.cur + n) * self.period <= self.limit * self.period
    }

    /// Cost-1 requests that would pass one after another at `t`.
    fn remaining(&self, at: State, t: u128) -> u128 {
        // Monotone in k: bisect for the largest k that fits.
        let (mut lo, mut hi) = (0u128, self.limit + 1);
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            if self.fits(at, t, mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    }

    fn passes(&self, s: State, t: u128, n: u128) -> bool {
        self.at(s, t).is_some_and(|(t, at)| self.fits(at, t, n))
    }

    fn reset(&self, at: State, cur: u128, now: u128) -> u64 {
        let time = if at.prev == 0 && cur == 0 {
            0
        } else if cur == 0 {
            (at.index + 1) * self.period
        } else {
            (at.index + 2) * self.period
        };
        sat(time.saturating_sub(now))
    }

    fn check(&self, s: State, now: u64, cost: u64) -> Result<Expected, CostError> {
        if cost == 0 {
            return Err(CostError::Zero);
        }
        let n = u128::from(cost);
        if n > self.limit {
            return Err(CostError::ExceedsCapacity {
                cost,
                capacity: sat(self.limit),
            });
        }
        let now = u128::from(now);
        let Some((t, at)) = self.at(s, now) else {
            return Ok(Expected {
                next: None,
                allowed: false,
                remaining: 0,
                reset_after: u64::MAX,
                retry_after: Some(u64::MAX),
            });
        };
        if self.fits(at, t, n) {
            let next = State {
                cur: at.cur + n,
                ..at
            };
            return Ok(Expected {
                next: Some(next),
                allowed: true,
                remaining: sat(self.remaining(next, t)),
                reset_after: self.reset(at, at.cur + n, now),
                retry_after: None,
            });
        }
        // The earliest time it passes if nothing else arrives: the estimate
        // only falls, and two windows on everything has rolled out, so bisect
        // (t, t_max] where t_max is that point (or the horizon's edge).
        let horizon_last = INDEX_END * self.period - 1;
        let hi_time = ((at.index + 2) * self.period).min(horizon_last);
        let retry = if hi_time > t && self.passes(at, hi_time, n) {
            let (mut lo, mut hi) = (t, hi_time);
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                if self.passes(at, mid, n) {
                    hi = mid;
                } else {
                    lo = mid;
                }
            }
            sat(hi - now)
        } else {
            u64::MAX
        };
        Ok(Expected {
            next: None,
            allowed: false,
            remaining: sat(self.remaining(at, t)),
            reset_after: self.reset(at, at.cur, now),
            retry_after: Some(retry.max(1)),
        })
    }
}

fn unpack(s: u64) -> State {
    // The documented packing: `index << 32 | prev << 16 | cur`.
    State {
        index: u128::from(s >> 32),
        prev: u128::from(s >> 16 & 0xFFFF),
        cur: u128::from(s & 0xFFFF),
    }
}

fuzz_target!(|input: Input| {
    let Ok(quota) = Quota::new(u64::from(input.count), Duration::from_nanos(input.period)) else {
        return;
    };
    let Ok(window) = SlidingWindow::new(&quota) else {
        return;
    };
    let model = Model {
        limit: u128::from(quota.count()),
        period: u128::from(turnstile_rl::__private::period_nanos(&quota)),
    };
    assert_eq!(u128::from(window.limit()), model.limit);
    assert_eq!(window.window(), quota.period());
    let mut state = 0u64;
    let mut now = 0u64;
    for (time, cost) in &input.ops {
        now = match *time {
            Time::Same => now,
            Time::Forward(d) => now.saturating_add(u64::from(d)),
            Time::Far(d) => now.saturating_add(d),
            Time::Set(t) => t,
        };
        let cost = u64::from(*cost);
        let s = unpack(state);
        let expected = model.check(s, now, cost);
        let step = window.check(state, now, cost);
        let actual = step.map(|step| {
            let d = step.decision;
            assert_eq!(u128::from(d.limit()), model.limit);
            Expected {
                next: step.next.map(unpack),
                allowed: d.is_allowed(),
                remaining: d.remaining(),
                reset_after: common::nanos(d.reset_after()),
                retry_after: d.retry_after().map(common::nanos),
            }
        });
        assert_eq!(
            actual, expected,
            "limit={} period={} state={s:?} now={now} cost={cost}",
            model.limit, model.period
        );
        if let Ok(Some(next)) = step.map(|s| s.next) {
            state = next;
        }
    }
});
