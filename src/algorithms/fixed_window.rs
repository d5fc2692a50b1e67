//! The fixed-window counter, packed into one `u64`: see [`FixedWindow`].

use std::num::NonZeroU64;
use std::time::Duration;

use super::window::{min_period_nanos, nanos_until, packed_window};
use crate::algorithms::{sealed, Algorithm, Step};
use crate::decision::Decision;
use crate::error::{CostError, QuotaError};
use crate::quota::Quota;

/// One bucket's state: window index (39 bits) and count (low 24); the top
/// bit is always clear (the map's cell reserves it, see `crate::cell`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct State(u64);

impl State {
    const COUNT_BITS: u32 = 24;
    const INDEX_BITS: u32 = 39;
    const COUNT_MASK: u64 = (1 << Self::COUNT_BITS) - 1;
    /// The first window index that cannot be stored.
    const INDEX_END: u64 = 1 << Self::INDEX_BITS;

    fn new(index: u64, count: u64) -> State {
        debug_assert!(index < Self::INDEX_END && count <= MAX_LIMIT);
        State(index << Self::COUNT_BITS | count)
    }

    fn index(self) -> u64 {
        self.0 >> Self::COUNT_BITS
    }

    fn count(self) -> u64 {
        self.0 & Self::COUNT_MASK
    }
}

/// The largest limit: four below the all-ones count, so even the last
/// window's fullest state stays below the cell's reserved words.
const MAX_LIMIT: u64 = State::COUNT_MASK - 4;
/// The shortest window whose index fits in 39 bits for the whole horizon.
const MIN_PERIOD: u64 = min_period_nanos(State::INDEX_BITS);

const _: () = assert!(State::COUNT_BITS + State::INDEX_BITS == u64::BITS - 1);
// The largest state (last index, count MAX_LIMIT) is below STATE_END.
const _: () =
    assert!((State::INDEX_END - 1) << State::COUNT_BITS | MAX_LIMIT < crate::cell::STATE_END);
const _: () = assert!(MIN_PERIOD > 2_860_000 && MIN_PERIOD < 2_880_000);

/// The fixed-window counter: at most `limit` requests in each window of one
/// period, counted afresh at each window's start.
///
/// Runs on the same engine as GCRA: one `u64` per bucket, lock-free.
///
/// ```
/// use turnstile_rl::algorithms::FixedWindow;
/// use turnstile_rl::{DirectLimiter, ManualClock, Quota};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let limiter = DirectLimiter::builder(Quota::per_minute(100)?)
///     .clock(clock.clone())
///     .algorithm_for::<FixedWindow>()?
///     .build();
/// assert_eq!(limiter.check_n(100).map(|d| d.is_allowed()), Ok(true));
/// assert!(limiter.check().is_denied());
/// clock.advance(Duration::from_secs(60));
/// assert!(limiter.check().is_allowed());
/// # Ok::<(), turnstile_rl::QuotaError>(())
/// ```
///
/// Time is cut into windows of one period: window `i` is
/// `[i * period, (i + 1) * period)`. Each bucket counts the requests of its
/// current window; a request of cost `n` passes iff `count + n <= limit`, and
/// the count starts afresh in each window. That is the whole algorithm, and
/// also its weakness: `limit` requests at the end of one window and `limit`
/// at the start of the next all pass, `2 * limit` in a moment (the seed's
/// 200 out of a limit of 100 a minute).
///
/// # State
///
/// `index << 24 | count`: the window index `now / period` in 39 bits above
/// the count's low 24, the top bit clear. State `0` (window 0, count 0) is the empty
/// bucket: a count of 0 means nothing recorded in any window. The limit is at
/// most `2^24 - 5`, so no state reaches the words the keyed map reserves;
/// the period is at least
/// [`HORIZON / 2^39`](crate::algorithms#the-horizon) (about 2.87 ms), so the index
/// never wraps within 50 years of the clock's origin, and past `2^39`
/// windows every request is denied instead.
///
/// # A clock that steps backwards
///
/// A reading in a window before the recorded one is counted against the
/// recorded window, as if it had arrived at that window's start. Real time
/// is at least there, and a later window could only have a fresher (lower)
/// count, so this never grants what a correct reading would refuse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FixedWindow {
    // Invariant: period >= MIN_PERIOD, 1 <= limit <= MAX_LIMIT.
    period: NonZeroU64,
    limit: u64,
}

impl FixedWindow {
    /// The largest limit a fixed window holds: 16,777,211 requests per
    /// window (the count has 24 bits, a few values reserved).
    pub const MAX_LIMIT: u64 = MAX_LIMIT;

    /// A fixed window of `quota.period()` admitting `quota.count()` requests
    /// (the burst does not apply to windows).
    ///
    /// [`QuotaError::DoesNotFit`] if the count is above 16,777,211 (24 bits,
    /// less one value kept for the tombstone) or the period is shorter than
    /// about 2.87 ms (2^39 windows must span 50 years).
    pub fn new(quota: &Quota) -> Result<FixedWindow, QuotaError> {
        let (period, limit) = packed_window(
            quota,
            "fixed window",
            MAX_LIMIT,
            "24 bits",
            State::INDEX_BITS,
        )?;
        Ok(FixedWindow { period, limit })
    }

    /// The most requests a window admits.
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

    /// The window a request at `now` counts against on `state`, and the
    /// count already in it; `None` past the horizon.
    fn current(&self, state: State, now: u64) -> Option<(u64, u64)> {
        let index = now / self.period;
        if index >= State::INDEX_END {
            return None;
        }
        Some(match state.index() {
            // The recorded window, or (backwards clock) one after now's.
            recorded if recorded >= index => (recorded, state.count()),
            // An older window: over, its count no longer matters.
            _ => (index, 0),
        })
    }
}

impl sealed::Sealed for FixedWindow {
    fn to_words(&self) -> [u64; sealed::WORDS] {
        super::window::to_words(self.period, self.limit)
    }

    fn from_words(words: [u64; sealed::WORDS]) -> Self {
        let (period, limit) = super::window::from_words(words);
        FixedWindow { period, limit }
    }
}

impl Algorithm for FixedWindow {
    #[inline]
    fn check_cost(&self, cost: u64) -> Result<(), CostError> {
        CostError::check(cost, self.limit)
    }

    #[inline]
    fn decide(&self, state: u64, now: u64, cost: u64) -> Step {
        let (limit, one) = (self.limit, NonZeroU64::MIN);
        let Some((index, used)) = self.current(State(state), now) else {
            // Past the horizon no index can be stored: deny, whatever the
            // state, and forever.
            return Step {
                next: None,
                decision: Decision::denied(limit, 0, one, u64::MAX, u64::MAX),
            };
        };
        let period = u128::from(self.period.get());
        let window_end = nanos_until((u128::from(index) + 1) * period, now);
        match used.checked_add(cost) {
            Some(total) if total <= limit => Step {
                next: Some(State::new(index, total).0),
                decision: Decision::allowed(limit, limit - total, one, window_end),
            },
            _ => {
                // The count starts afresh at the window's end, where any
                // cost up to the limit passes, unless that window is
                // already past the horizon or the cost can never pass.
                let retry = if index + 1 < State::INDEX_END && cost <= limit {
                    window_end
                } else {
                    u64::MAX
                };
                Step {
                    next: None,
                    decision: Decision::denied(
                        limit,
                        limit.saturating_sub(used),
                        one,
                        window_end,
                        retry,
                    ),
                }
            }
        }
    }

    #[inline]
    fn is_idle(&self, state: u64, now: u64) -> bool {
        match self.current(State(state), now) {
            // Past the horizon every state is denied alike.
            None => true,
            // Later readings fall in this window or later ones, where the
            // state counts nothing: exactly state 0. A recorded window after
            // now's (backwards clock) is not idle: it would be counted against.
            Some((index, used)) => used == 0 && index == now / self.period,
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

    fn window(text: &str) -> FixedWindow {
        FixedWindow::new(&text.parse().unwrap()).unwrap()
    }

    /// Runs `count` checks of cost 1 at `now`, returning (allowed, new state).
    fn burst_at(w: &FixedWindow, mut state: u64, now: u64, count: usize) -> (usize, u64) {
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
    fn seed_boundary_spike_admits_200_of_100_per_minute() {
        let w = window("100/min");
        let (first, state) = burst_at(&w, 0, 59_900 * MS, 150);
        let (second, _) = burst_at(&w, state, 60_100 * MS, 150);
        assert_eq!((first, second), (100, 100));
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
        assert_eq!(allowed, 200);
    }

    #[test]
    fn boundaries_are_half_open() {
        let w = window("3/s");
        let (n, state) = burst_at(&w, 0, 0, 4);
        assert_eq!(n, 3);
        // The last nanosecond of window 0 is still window 0.
        assert_eq!(burst_at(&w, state, S - 1, 1).0, 0);
        // The first nanosecond of window 1 counts afresh.
        let (n, state) = burst_at(&w, state, S, 4);
        assert_eq!(n, 3);
        assert_eq!(state, State::new(1, 3).0);
        // Skipping windows: the old count is simply over.
        assert_eq!(burst_at(&w, state, 10 * S + 5, 4).0, 3);
    }

    #[test]
    fn decision_figures() {
        let w = window("10/s");
        let step = w.check(0, 250 * MS, 4).unwrap();
        let d = step.decision;
        assert!(d.is_allowed());
        assert_eq!((d.limit(), d.remaining()), (10, 6));
        assert_eq!(d.reset_after(), Duration::from_millis(750));
        assert_eq!(d.retry_after(), None);

        // 4 used: a cost of 7 waits for the window's end, 6 still fits.
        let state = step.next.unwrap();
        let d = w.check(state, 400 * MS, 7).unwrap().decision;
        assert!(d.is_denied());
        assert_eq!(d.remaining(), 6);
        assert_eq!(d.retry_after(), Some(Duration::from_millis(600)));
        assert_eq!(d.reset_after(), Duration::from_millis(600));
        assert!(w.check(state, 400 * MS, 6).unwrap().decision.is_allowed());
    }

    #[test]
    fn cost_errors_change_nothing() {
        let w = window("10/s burst 3");
        assert_eq!(w.check(0, 0, 0), Err(CostError::Zero));
        // The burst does not apply: the limit is the count.
        assert_eq!(w.limit(), 10);
        assert_eq!(
            w.check(0, 0, 11),
            Err(CostError::ExceedsCapacity {
                cost: 11,
                capacity: 10
            })
        );
        assert_eq!(
            w.check(0, 0, u64::MAX),
            Err(CostError::ExceedsCapacity {
                cost: u64::MAX,
                capacity: 10
            })
        );
        assert!(w.check(0, 0, 10).unwrap().decision.is_allowed());
    }

    #[test]
    fn quotas_that_do_not_fit_name_the_bound() {
        let err = FixedWindow::new(&"16777212/h".parse().unwrap()).unwrap_err();
        assert!(matches!(
            err,
            QuotaError::DoesNotFit {
                algorithm: "fixed window",
                ..
            }
        ));
        let message = err.to_string();
        assert!(message.contains("16777211"), "{message}");
        assert!(message.contains("16777212/h"), "{message}");
        assert_eq!(window("16777211/h").limit(), MAX_LIMIT);

        let message = FixedWindow::new(&"1/2ms".parse().unwrap())
            .unwrap_err()
            .to_string();
        assert!(message.contains("2.870148ms"), "{message}");
        assert!(message.contains("39 bits"), "{message}");
        let shortest = Quota::new(1, Duration::from_nanos(MIN_PERIOD)).unwrap();
        assert!(FixedWindow::new(&shortest).is_ok());
        let too_short = Quota::new(1, Duration::from_nanos(MIN_PERIOD - 1)).unwrap();
        assert!(FixedWindow::new(&too_short).is_err());
    }

    #[test]
    fn backwards_clock_grants_nothing() {
        let w = window("2/s");
        let (_, state) = burst_at(&w, 0, 5 * S + 100 * MS, 2);
        // A reading in window 4 counts against window 5: denied, and the
        // wait runs to window 5's end.
        let d = w.check(state, 4 * S + 900 * MS, 1).unwrap().decision;
        assert!(d.is_denied());
        assert_eq!(d.retry_after(), Some(Duration::from_millis(1_100)));
        assert!(!w.is_idle(state, 4 * S));
        // A backwards reading with room left records into the newer window.
        let (_, state) = burst_at(&w, 0, 5 * S, 1);
        assert_eq!(w.check(state, 0, 1).unwrap().next, Some(State::new(5, 2).0));
    }

    #[test]
    fn extreme_inputs_never_panic_or_wrap() {
        for text in ["16777211/20ms", "1/2.870148ms", "1000/min", "7/100d"] {
            let w = window(text);
            for state in [
                0,
                1,
                u64::MAX,
                u64::MAX - 1,
                State::new(State::INDEX_END - 1, MAX_LIMIT).0,
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
        let w = window("1/2.870148ms");
        let end = State::INDEX_END * MIN_PERIOD;
        let d = w.decide(0, end, 1).decision;
        assert!(d.is_denied());
        assert_eq!(d.retry_after(), Some(Duration::from_nanos(u64::MAX)));
        assert!(w.is_idle(State::new(7, 1).0, end));
        // The last window before the horizon still counts, but nothing
        // comes after it.
        let step = w.decide(0, end - 1, 1);
        assert_eq!(step.next, Some(State::new(State::INDEX_END - 1, 1).0));
        let d = w.decide(step.next.unwrap(), end - 1, 1).decision;
        assert_eq!(d.retry_after(), Some(Duration::from_nanos(u64::MAX)));
        // The longest period: one window for all of time.
        let longest = Quota::new(1, Duration::from_nanos(u64::MAX)).unwrap();
        let w = FixedWindow::new(&longest).unwrap();
        assert!(w.decide(0, u64::MAX, 1).decision.is_allowed());
    }

    /// A state near `now`'s window: recorded a few windows before or after.
    fn near(w: &FixedWindow) -> impl Strategy<Value = (u64, u64)> {
        let period = w.period.get();
        let limit = w.limit;
        (
            0..40 * period,
            0u64..4,
            0..=limit,
            any::<bool>(),
            any::<u64>(),
            0u8..8,
        )
            .prop_map(move |(now, back, count, ahead, raw, pick)| {
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
                    State::new(index, count).0
                };
                (state, now)
            })
    }

    proptest! {
        /// An idle state decides every later request as state 0 does, and a
        /// state that is not idle already differs on the next request.
        #[test]
        fn idle_means_behaves_as_state_zero(
            (state, now) in near(&window("5/10ms")),
            later in prop::collection::vec((0u64..100_000_000, 1u64..=5), 1..8),
        ) {
            let w = window("5/10ms");
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
        fn retry_after_is_exact((state, now) in near(&window("5/10ms")), cost in 1u64..=5) {
            let w = window("5/10ms");
            let d = w.decide(state, now, cost).decision;
            let retry = retry_nanos(d);
            if d.is_allowed() || retry == u64::MAX {
                return Ok(());
            }
            prop_assert!(w.decide(state, now + retry - 1, cost).decision.is_denied());
            prop_assert!(w.decide(state, now + retry, cost).decision.is_allowed());
        }
    }
}
