//! The sliding-window counter (as Cloudflare describes it), packed into one
//! `u64`: see [`SlidingWindow`].

use std::num::NonZeroU64;
use std::time::Duration;

use super::window::{min_period_nanos, nanos_until, packed_window};
use crate::algorithms::{sealed, Algorithm, Step};
use crate::decision::Decision;
use crate::error::{CostError, QuotaError};
use crate::quota::Quota;

/// One bucket's state: window index (31 bits), previous window's count
/// (next 16), current window's count (low 16); the top bit is always clear
/// (the map's cell reserves it, see `crate::cell`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct State(u64);

impl State {
    const COUNT_BITS: u32 = 16;
    const INDEX_BITS: u32 = 31;
    const COUNT_MASK: u64 = (1 << Self::COUNT_BITS) - 1;
    /// The first window index that cannot be stored.
    const INDEX_END: u64 = 1 << Self::INDEX_BITS;

    fn new(index: u64, prev: u64, cur: u64) -> State {
        debug_assert!(index < Self::INDEX_END && prev <= Self::COUNT_MASK && cur <= MAX_LIMIT);
        // A stored `prev` was a stored `cur`, so at most MAX_LIMIT; the
        // clamp keeps even an arbitrary input state's successor below
        // STATE_END.
        let prev = prev.min(MAX_LIMIT);
        State(index << (2 * Self::COUNT_BITS) | prev << Self::COUNT_BITS | cur)
    }

    fn index(self) -> u64 {
        self.0 >> (2 * Self::COUNT_BITS)
    }

    fn prev(self) -> u64 {
        self.0 >> Self::COUNT_BITS & Self::COUNT_MASK
    }

    fn cur(self) -> u64 {
        self.0 & Self::COUNT_MASK
    }
}

/// The largest limit: one below the all-ones count.
const MAX_LIMIT: u64 = State::COUNT_MASK - 1;
/// The shortest window whose index fits in 31 bits for the whole horizon.
const MIN_PERIOD: u64 = min_period_nanos(State::INDEX_BITS);

const _: () = assert!(2 * State::COUNT_BITS + State::INDEX_BITS == u64::BITS - 1);
// The largest state (last index, both counts full) is below STATE_END.
const _: () = assert!(
    (State::INDEX_END - 1) << (2 * State::COUNT_BITS) | MAX_LIMIT << State::COUNT_BITS | MAX_LIMIT
        < crate::cell::STATE_END
);
const _: () = assert!(MIN_PERIOD > 730_000_000 && MIN_PERIOD < 740_000_000);

/// The sliding-window counter: the previous window's count, weighted by
/// its overlap with the last period, plus the current window's count, at
/// most `limit`.
///
/// Runs on the same engine as GCRA: one `u64` per bucket, lock-free. Limits
/// up to 65,534 per window; periods of at least about 0.735 s.
///
/// ```
/// use turnstile_rl::algorithms::SlidingWindow;
/// use turnstile_rl::{DirectLimiter, ManualClock, Quota};
/// use std::time::Duration;
///
/// let clock = ManualClock::starting_at(Duration::from_millis(59_900));
/// let limiter = DirectLimiter::builder(Quota::per_minute(100)?)
///     .clock(clock.clone())
///     .algorithm_for::<SlidingWindow>()?
///     .build();
/// assert_eq!(limiter.check_n(100).map(|d| d.is_allowed()), Ok(true));
/// // Past the fixed boundary, the previous minute still weighs 59.9/60.
/// clock.set(Duration::from_millis(60_100));
/// assert!(limiter.check().is_denied());
/// # Ok::<(), turnstile_rl::QuotaError>(())
/// ```
///
/// Like the fixed window it counts requests per window of one period, but it
/// also keeps the previous window's count and weighs it by how much of the
/// previous window still lies inside the sliding period ending now. With
/// `elapsed` nanoseconds into the current window, the estimate of the
/// requests in the last period is
///
/// ```text
/// prev * (period - elapsed) / period + cur
/// ```
///
/// and a request of cost `n` passes iff `estimate + n <= limit`. The test is
/// done exactly on integers (u128), multiplied through by the period:
///
/// ```text
/// prev * (period - elapsed) + (cur + n) * period <= limit * period
/// ```
///
/// so no rounding ever admits an extra request. The estimate assumes the
/// previous window's requests were spread evenly; it can be off either way
/// when they were not, but the fixed window's boundary spike is gone: in the
/// seed scenario (100 a minute; 150 requests at 59.9 s, 150 at 60.1 s) the
/// second burst sees `prev = 100` weighted by 59.9/60, an estimate of 99.83,
/// which leaves no room for one more: 100 pass in all (the next one
/// passes at 60.6 s, when the weight has fallen to 59.4/60).
///
/// # Decision figures
///
/// All exact, on integers: `remaining` is the number of cost-1 requests
/// that would pass right now; `reset_after` is the time until both counts
/// have rolled out (the end of the next window if the current count is not
/// 0); a denial's `retry_after` is the *exact* earliest time at which the
/// same request would pass if nothing else arrives. The estimate only falls
/// as time moves on, so that time is solved in closed form: within this
/// window, else within the next (where the current count becomes the
/// previous one), else at the start of the one after.
///
/// # State
///
/// `index << 32 | prev << 16 | cur`: the window index `now / period` in 31
/// bits above the two counts of 16 bits each, the top bit clear. State `0` (window 0, no
/// counts) is the empty bucket. The limit is at most `2^16 - 2`, so no state
/// reaches the words the keyed map reserves; the
/// period is at least [`HORIZON / 2^31`](crate::algorithms#the-horizon) (about 0.735 s),
/// so the index never wraps within 50 years of the clock's origin. For
/// shorter periods or larger limits use GCRA, which has neither bound.
///
/// # A clock that steps backwards
///
/// A reading in a window before the recorded one is decided as if it had
/// arrived at the start of the recorded window, where the previous count
/// weighs fully: real time is at least there, and the estimate only falls
/// as time moves on, so this never grants what a correct reading would
/// refuse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SlidingWindow {
    // Invariant: period >= MIN_PERIOD, 1 <= limit <= MAX_LIMIT.
    period: NonZeroU64,
    limit: u64,
}

/// Where a request falls: the window it counts against and the counts
/// rolled forward to that window.
struct Position {
    index: u64,
    /// Nanoseconds into the window, `< period`.
    elapsed: u64,
    prev: u64,
    cur: u64,
}

impl SlidingWindow {
    /// The largest limit a sliding-window counter holds: 65,534 requests
    /// per window (each count has 16 bits, one value reserved).
    pub const MAX_LIMIT: u64 = MAX_LIMIT;

    /// A sliding window of `quota.period()` admitting `quota.count()`
    /// requests (the burst does not apply to windows).
    ///
    /// [`QuotaError::DoesNotFit`] if the count is above 65,534 (16 bits,
    /// less one value kept for the tombstone) or the period is shorter than
    /// about 0.735 s (2^31 windows must span 50 years); GCRA has neither
    /// bound.
    pub fn new(quota: &Quota) -> Result<SlidingWindow, QuotaError> {
        let (period, limit) = packed_window(
            quota,
            "sliding window",
            MAX_LIMIT,
            "16 bits each",
            State::INDEX_BITS,
        )?;
        Ok(SlidingWindow { period, limit })
    }

    /// The most requests the estimate admits over one period.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The length of one window.
    pub fn window(&self) -> Duration {
        Duration::from_nanos(self.period.get())
    }

    /// The decision for a request of `cost` at `now` on `state`: the whole
    /// algorithm as one pure function, for tests and models.
    pub fn check(&self, state: u64, now: u64, cost: u64) -> Result<Step, CostError> {
        self.check_cost(cost)?;
        Ok(self.decide(state, now, cost))
    }

    /// Where a request at `now` falls on `state`; `None` past the horizon.
    fn position(&self, state: State, now: u64) -> Option<Position> {
        let period = self.period.get();
        if now / period >= State::INDEX_END {
            return None;
        }
        // Backwards clock: a reading before the recorded window counts as
        // that window's start. `state.index() < 2^31`, so this fits in u64
        // for every period that passed `new` with a reachable `now`; u128
        // keeps arbitrary states total.
        let recorded_start = u128::from(state.index()) * u128::from(period);
        let now = u128::from(now).max(recorded_start);
        let period = u128::from(period);
        // Both fit: now / period <= max(u64 / period, index) and the
        // remainder is below the period.
        let index = (now / period) as u64;
        let elapsed = (now % period) as u64;
        let (prev, cur) = match index - state.index() {
            0 => (state.prev(), state.cur()),
            1 => (state.cur(), 0),
            _ => (0, 0),
        };
        Some(Position {
            index,
            elapsed,
            prev,
            cur,
        })
    }

    /// `limit * period - prev * (period - elapsed)`: the room the previous
    /// window leaves, in request-nanoseconds (saturating at 0).
    fn room(&self, at: &Position) -> u128 {
        let period = u128::from(self.period.get());
        let weighted_prev = u128::from(at.prev) * (period - u128::from(at.elapsed));
        (u128::from(self.limit) * period).saturating_sub(weighted_prev)
    }

    /// The absolute time at which the estimate is back to zero, with `cur`
    /// requests in the current window.
    fn reset_time(&self, at: &Position, cur: u64) -> u128 {
        let period = u128::from(self.period.get());
        let windows = match (at.prev, cur) {
            (0, 0) => return 0,
            // `cur` becomes the previous count, which fades out over the next window.
            (_, 1..) => 2,
            (_, 0) => 1,
        };
        (u128::from(at.index) + windows) * period
    }

    /// The earliest absolute time at which a request of `cost` passes from
    /// `at` if nothing else arrives; `None` never (past the horizon, or a
    /// cost above the limit). Exact: the estimate only falls as time moves,
    /// so the first time the test holds is the answer.
    fn earliest(&self, at: &Position, cost: u64) -> Option<u128> {
        let (period, limit) = (u128::from(self.period.get()), u128::from(self.limit));
        let cost = u128::from(cost);
        let start = u128::from(at.index) * period;
        // In this window, at `elapsed' >= elapsed`:
        //   prev * (period - elapsed') <= (limit - cur - cost) * period
        //   <=> period - elapsed' <= floor((limit - cur - cost) * period / prev).
        if let Some(spare) = limit.checked_sub(u128::from(at.cur) + cost) {
            if at.prev == 0 {
                return Some(start + u128::from(at.elapsed));
            }
            let fits = spare * period / u128::from(at.prev);
            if fits >= 1 {
                let from = period.saturating_sub(fits).max(u128::from(at.elapsed));
                return Some(start + from);
            }
        }
        // In the next window `cur` is the previous count and the current is 0:
        //   cur * (period - elapsed') <= (limit - cost) * period.
        let spare = limit.checked_sub(cost)?;
        let next = u128::from(at.index) + 1;
        if next >= u128::from(State::INDEX_END) {
            return None;
        }
        let fits = if at.cur == 0 {
            period
        } else {
            spare * period / u128::from(at.cur)
        };
        if fits >= 1 {
            return Some(next * period + period.saturating_sub(fits));
        }
        // The window after that holds nothing, and the cost is within the limit.
        let after = next + 1;
        (after < u128::from(State::INDEX_END)).then_some(after * period)
    }
}

impl sealed::Sealed for SlidingWindow {
    fn to_words(&self) -> [u64; sealed::WORDS] {
        super::window::to_words(self.period, self.limit)
    }

    fn from_words(words: [u64; sealed::WORDS]) -> Self {
        let (period, limit) = super::window::from_words(words);
        SlidingWindow { period, limit }
    }
}

impl Algorithm for SlidingWindow {
    #[inline]
    fn check_cost(&self, cost: u64) -> Result<(), CostError> {
        CostError::check(cost, self.limit)
    }

    #[inline]
    fn decide(&self, state: u64, now: u64, cost: u64) -> Step {
        let (limit, one) = (self.limit, NonZeroU64::MIN);
        let Some(at) = self.position(State(state), now) else {
            // Past the horizon no index can be stored: deny, whatever the
            // state, and forever.
            return Step {
                next: None,
                decision: Decision::denied(limit, 0, one, u64::MAX, u64::MAX),
            };
        };
        let period = u128::from(self.period.get());
        let room = self.room(&at);
        // Whole requests that fit beside `cur`: floor(room / period) - cur.
        let left = |cur: u64| {
            let left = (room / period).saturating_sub(u128::from(cur));
            u64::try_from(left).unwrap_or(u64::MAX)
        };
        let total = at.cur.saturating_add(cost);
        if u128::from(total) * period <= room {
            // total <= limit <= MAX_LIMIT: the packed `cur` is never all ones.
            let next = State::new(at.index, at.prev, total);
            let reset = nanos_until(self.reset_time(&at, total), now);
            Step {
                next: Some(next.0),
                decision: Decision::allowed(limit, left(total), one, reset),
            }
        } else {
            let reset = nanos_until(self.reset_time(&at, at.cur), now);
            let retry = self
                .earliest(&at, cost)
                .map_or(u64::MAX, |time| nanos_until(time, now));
            Step {
                next: None,
                decision: Decision::denied(limit, left(at.cur), one, reset, retry),
            }
        }
    }

    #[inline]
    fn is_idle(&self, state: u64, now: u64) -> bool {
        match self.position(State(state), now) {
            // Past the horizon every state is denied alike.
            None => true,
            // Both counts have rolled out and the recorded window is not
            // after now's (a backwards clock): every later reading sees the
            // empty counts state 0 sees.
            Some(at) => at.prev == 0 && at.cur == 0 && at.index == now / self.period,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::direct::DirectLimiter;
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000_000_000;

    fn window(text: &str) -> SlidingWindow {
        SlidingWindow::new(&text.parse().unwrap()).unwrap()
    }

    /// Runs `count` checks of cost 1 at `now`, returning (allowed, new state).
    fn burst_at(w: &SlidingWindow, mut state: u64, now: u64, count: usize) -> (usize, u64) {
        let mut allowed = 0;
        for _ in 0..count {
            if let Some(next) = w.check(state, now, 1).unwrap().next {
                state = next;
                allowed += 1;
            }
        }
        (allowed, state)
    }

    fn retry_nanos(d: Decision) -> u64 {
        d.retry_after().map_or(0, |r| r.as_nanos() as u64)
    }

    #[test]
    fn seed_scenario_admits_100_of_100_per_minute() {
        let w = window("100/min");
        let (first, state) = burst_at(&w, 0, 59_900 * MS, 150);
        let (second, state) = burst_at(&w, state, 60_100 * MS, 150);
        assert_eq!((first, second), (100, 0));
        // prev = 100 weighted by 59.9/60 is 99.83: no room for even one.
        let d = w.check(state, 60_100 * MS, 1).unwrap().decision;
        assert_eq!(d.remaining(), 0);
        // One request fits once 100 * (60 s - e) / 60 s + 1 <= 100, at
        // e = 0.6 s: 60.6 s.
        assert_eq!(d.retry_after(), Some(Duration::from_millis(500)));
        assert_eq!(burst_at(&w, state, 60_600 * MS - 1, 1).0, 0);
        assert_eq!(burst_at(&w, state, 60_600 * MS, 2).0, 1);
    }

    #[test]
    fn seed_scenario_on_a_direct_limiter() {
        let clock = ManualClock::new();
        let limiter = DirectLimiter::builder("100/min".parse().unwrap())
            .clock(clock.clone())
            .algorithm(window("100/min"))
            .build();
        clock.set_nanos(59_900 * MS);
        let mut allowed = (0..150).filter(|_| limiter.check().is_allowed()).count();
        clock.set_nanos(60_100 * MS);
        allowed += (0..150).filter(|_| limiter.check().is_allowed()).count();
        assert_eq!(allowed, 100);
    }

    #[test]
    fn decision_figures_and_exact_retry() {
        let w = window("10/s");
        // Window 1 holds prev = 10; at 250 ms in the estimate is 7.5.
        let state = State::new(1, 10, 0).0;
        let now = 1_250 * MS;
        assert!(w.check(state, now, 3).unwrap().decision.is_denied());
        let step = w.check(state, now, 2).unwrap();
        let d = step.decision;
        assert!(d.is_allowed());
        assert_eq!((d.limit(), d.remaining()), (10, 0));
        // The 2 become the previous count, gone at the end of window 2.
        assert_eq!(d.reset_after(), Duration::from_millis(1_750));
        let state = step.next.unwrap();
        assert_eq!(state, State::new(1, 10, 2).0);

        // One more fits when 10 * (1 s - e) + 3 s <= 10 s: e = 300 ms.
        let d = w.check(state, now, 1).unwrap().decision;
        assert_eq!(d.retry_after(), Some(Duration::from_millis(50)));
        assert!(w
            .check(state, 1_300 * MS - 1, 1)
            .unwrap()
            .decision
            .is_denied());
        assert!(w.check(state, 1_300 * MS, 1).unwrap().decision.is_allowed());
        // Nine fit in window 2 when 2 * (1 s - e) + 9 s <= 10 s: e = 500 ms.
        let d = w.check(state, now, 9).unwrap().decision;
        assert_eq!(d.retry_after(), Some(Duration::from_millis(1_250)));
        // Ten need both counts gone: the start of window 3.
        let d = w.check(state, now, 10).unwrap().decision;
        assert_eq!(d.retry_after(), Some(Duration::from_millis(1_750)));
        assert_eq!(d.reset_after(), Duration::from_millis(1_750));
    }

    #[test]
    fn a_steady_stream_under_the_limit_is_not_punished_at_the_boundary() {
        // 10/s, one request every 110 ms for 10 s: all pass.
        let w = window("10/s");
        let mut state = 0;
        for i in 0..90 {
            let step = w.check(state, i * 110 * MS, 1).unwrap();
            assert!(step.decision.is_allowed(), "request {i}");
            state = step.next.unwrap();
        }
        // Exactly at the limit (every 100 ms) the request at 1 s is refused:
        // at a window's start the previous count weighs fully, including
        // the request at 0 that the exact log would just have let go.
        let (allowed, state) = burst_at(&w, 0, 0, 1);
        assert_eq!(allowed, 1);
        let state = (1..10).fold(state, |s, i| {
            w.check(s, i * 100 * MS, 1).unwrap().next.unwrap()
        });
        assert!(w.check(state, S, 1).unwrap().decision.is_denied());
    }

    #[test]
    fn cost_errors_change_nothing() {
        let w = window("10/s burst 3");
        assert_eq!(w.limit(), 10);
        assert_eq!(w.check(0, 0, 0), Err(CostError::Zero));
        assert_eq!(
            w.check(0, 0, 11),
            Err(CostError::ExceedsCapacity {
                cost: 11,
                capacity: 10
            })
        );
        assert!(w.check(0, 0, u64::MAX).is_err());
        assert!(w.check(0, 0, 10).unwrap().decision.is_allowed());
    }

    #[test]
    fn quotas_that_do_not_fit_name_the_bound() {
        let err = SlidingWindow::new(&"65535/min".parse().unwrap()).unwrap_err();
        assert!(matches!(
            err,
            QuotaError::DoesNotFit {
                algorithm: "sliding window",
                ..
            }
        ));
        let message = err.to_string();
        assert!(message.contains("65534"), "{message}");
        assert!(message.contains("GCRA"), "{message}");
        assert_eq!(window("65534/min").limit(), MAX_LIMIT);

        let message = SlidingWindow::new(&"10/500ms".parse().unwrap())
            .unwrap_err()
            .to_string();
        assert!(message.contains("734.757633ms"), "{message}");
        assert!(message.contains("31 bits"), "{message}");
        assert!(message.contains("GCRA"), "{message}");
        let shortest = Quota::new(1, Duration::from_nanos(MIN_PERIOD)).unwrap();
        assert!(SlidingWindow::new(&shortest).is_ok());
        let too_short = Quota::new(1, Duration::from_nanos(MIN_PERIOD - 1)).unwrap();
        assert!(SlidingWindow::new(&too_short).is_err());
    }

    #[test]
    fn backwards_clock_grants_nothing() {
        let w = window("4/s");
        let (_, state) = burst_at(&w, 0, 5 * S + 900 * MS, 4);
        // In window 6 at 100 ms the estimate is 4 * 0.9 = 3.6: nothing fits.
        assert_eq!(burst_at(&w, state, 6 * S + 100 * MS, 1).0, 0);
        // At 800 ms one passes (0.8 + 1 <= 4). A reading back at window
        // 6's start or earlier (even window 2) is decided at window 6's
        // start, where 4 + 1 + 1 > 4: denied, although the same request at
        // 800 ms would pass; it waits until 4 * (1 - e) + 2 <= 4, e = 500 ms.
        let (_, state6) = burst_at(&w, state, 6 * S + 800 * MS, 1);
        assert!(w
            .check(state6, 6 * S + 800 * MS, 1)
            .unwrap()
            .decision
            .is_allowed());
        for back in [6 * S, 5 * S + 950 * MS, 2 * S, 0] {
            let d = w.check(state6, back, 1).unwrap().decision;
            assert!(d.is_denied(), "{back}");
            assert_eq!(retry_nanos(d), 6 * S + 500 * MS - back);
            assert!(!w.is_idle(state6, back));
        }
    }

    #[test]
    fn extreme_inputs_never_panic_or_wrap() {
        for text in ["65534/min", "1/734.757633ms", "3/s", "1/d"] {
            let w = window(text);
            for state in [
                0,
                1,
                u64::MAX,
                u64::MAX - 1,
                State::new(State::INDEX_END - 1, 65535, MAX_LIMIT).0,
            ] {
                for now in [0, 1, u64::MAX / 2, u64::MAX - 1, u64::MAX] {
                    for cost in [1, MAX_LIMIT, u64::MAX] {
                        let step = w.decide(state, now, cost);
                        assert!(step.next.is_none_or(|next| next < crate::cell::STATE_END));
                        let _ = w.is_idle(state, now);
                    }
                }
            }
        }
        // Past the horizon: denied forever, from any state.
        let w = window("1/734.757633ms");
        let end = State::INDEX_END * MIN_PERIOD;
        let d = w.decide(0, end, 1).decision;
        assert!(d.is_denied());
        assert_eq!(d.retry_after(), Some(Duration::from_nanos(u64::MAX)));
        assert!(w.is_idle(State::new(7, 1, 1).0, end));
        // The last window before the horizon still counts; nothing after it.
        let step = w.decide(0, end - 1, 1);
        assert_eq!(step.next, Some(State::new(State::INDEX_END - 1, 0, 1).0));
        let d = w.decide(step.next.unwrap(), end - 1, 1).decision;
        assert_eq!(d.retry_after(), Some(Duration::from_nanos(u64::MAX)));
        // The longest period: one window for all of time.
        let longest = Quota::new(1, Duration::from_nanos(u64::MAX)).unwrap();
        let w = SlidingWindow::new(&longest).unwrap();
        assert!(w.decide(0, u64::MAX, 1).decision.is_allowed());
    }

    /// A state near `now`'s window: recorded a few windows before or after.
    fn near(w: &SlidingWindow) -> impl Strategy<Value = (u64, u64)> {
        let period = w.period.get();
        let limit = w.limit;
        (
            0..40 * period,
            0u64..4,
            (0..=limit, 0..=limit),
            any::<bool>(),
            any::<u64>(),
            0u8..8,
        )
            .prop_map(move |(now, back, (prev, cur), ahead, raw, pick)| {
                let index = now / period;
                let index = if ahead {
                    index + back
                } else {
                    index.saturating_sub(back)
                };
                // Now and then an arbitrary word, tombstone and all.
                let state = if pick == 0 {
                    raw
                } else {
                    State::new(index, prev, cur).0
                };
                (state, now)
            })
    }

    proptest! {
        /// An idle state decides every later request as state 0 does, and a
        /// state that is not idle already differs on the next request.
        #[test]
        fn idle_means_behaves_as_state_zero(
            (state, now) in near(&window("5/s")),
            later in prop::collection::vec((0u64..10 * S, 1u64..=5), 1..8),
        ) {
            let w = window("5/s");
            let idle = w.is_idle(state, now);
            prop_assert_eq!(idle, w.decide(state, now, 1) == w.decide(0, now, 1));
            if idle {
                for (dt, cost) in later {
                    let t = now.saturating_add(dt);
                    prop_assert_eq!(w.decide(state, t, cost), w.decide(0, t, cost));
                }
            }
        }

        /// A denial's retry_after is exact: one nanosecond earlier is still
        /// denied, at retry_after the same request passes.
        #[test]
        fn retry_after_is_exact((state, now) in near(&window("5/s")), cost in 1u64..=5) {
            let w = window("5/s");
            let d = w.decide(state, now, cost).decision;
            let retry = retry_nanos(d);
            if d.is_allowed() || retry == u64::MAX {
                return Ok(());
            }
            prop_assert!(w.decide(state, now + retry - 1, cost).decision.is_denied());
            prop_assert!(w.decide(state, now + retry, cost).decision.is_allowed());
        }

        /// Every allowed decision stores a state whose estimate is within the
        /// limit, and `remaining` more requests of cost 1 all pass at once.
        #[test]
        fn remaining_is_exact((state, now) in near(&window("5/s")), cost in 1u64..=5) {
            let w = window("5/s");
            let step = w.decide(state, now, cost);
            if step.decision.is_denied() {
                return Ok(());
            }
            let mut state = step.next.unwrap();
            for _ in 0..step.decision.remaining() {
                state = w.decide(state, now, 1).next.unwrap();
            }
            prop_assert!(w.decide(state, now, 1).decision.is_denied());
        }
    }
}
