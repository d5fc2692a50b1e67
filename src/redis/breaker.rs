//! The circuit breaker (its user-facing docs are on [`BreakerState`]).

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// When the breaker opens and how long it stays open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failures (errors or timeouts) that open the breaker.
    pub failure_threshold: u32,
    /// How long the breaker stays open before one probe call is let through.
    pub cool_down: Duration,
}

/// Consecutive failures that open the breaker unless set: enough that
/// one lost packet or a failover's blip does not open it.
pub const DEFAULT_FAILURE_THRESHOLD: u32 = 5;
/// How long the breaker stays open unless set, before one probe.
pub const DEFAULT_COOL_DOWN: Duration = Duration::from_secs(1);

impl Default for BreakerConfig {
    /// Open after [`DEFAULT_FAILURE_THRESHOLD`] consecutive failures;
    /// probe again after [`DEFAULT_COOL_DOWN`].
    fn default() -> Self {
        BreakerConfig {
            failure_threshold: DEFAULT_FAILURE_THRESHOLD,
            cool_down: DEFAULT_COOL_DOWN,
        }
    }
}

/// The breaker's state, as reported by
/// [`RedisLimiter::breaker_state`](super::RedisLimiter::breaker_state).
///
/// The circuit breaker: once Redis has failed several times in a row, stop
/// asking it for a while, so a dead Redis costs no timeouts.
///
/// ```text
///            N consecutive failures                 cool-down elapsed
///  Closed ───────────────────────────▶ Open ────────────────────────────▶ HalfOpen
///    ▲                                  ▲                                 │  one probe
///    │        probe succeeds            │         probe fails             │  call at a time
///    └──────────────────────────────────┼─────────────────────────────────┘
///                                       └─────────────────────────────────┘
/// ```
///
/// - **Closed**: every check calls Redis; a success resets the count of
///   consecutive failures; the `N`th failure in a row opens the breaker.
/// - **Open**: no check calls Redis (the failure policy decides at once,
///   with no timeout to wait for) until the cool-down has elapsed.
/// - **HalfOpen**: one check, the probe, calls Redis; the others are
///   decided by the failure policy meanwhile. The probe's success closes
///   the breaker, its failure opens it for another cool-down. A probe that
///   never reports (its future was dropped) is replaced by another after
///   the probe window (the call timeout), so the breaker cannot stick.
///
/// The state sits behind a mutex held for a few instructions, once before
/// and once after each Redis call: next to a network round trip of tens of
/// microseconds it costs nothing measurable, and it keeps the transitions
/// exact (one probe, one transition counted per change).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BreakerState {
    /// Redis is called on every check.
    Closed,
    /// Redis is not called; the failure policy decides.
    Open,
    /// One probe call is allowed through to test Redis.
    HalfOpen,
}

/// What the breaker lets a check do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Call Redis.
    Call,
    /// Call Redis as the half-open probe.
    Probe,
    /// Do not call Redis: the failure policy decides.
    Reject,
}

/// A change of state, to count in the metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Transition {
    Opened,
    HalfOpened,
    Closed,
}

#[derive(Debug)]
enum State {
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen { probe_until: Instant },
}

/// The breaker of one limiter.
#[derive(Debug)]
pub(crate) struct Breaker {
    config: BreakerConfig,
    /// How long a probe may run before another one is let through.
    probe_window: Duration,
    state: Mutex<State>,
}

impl Breaker {
    pub(crate) fn new(config: BreakerConfig, probe_window: Duration) -> Self {
        Breaker {
            config,
            probe_window,
            state: Mutex::new(State::Closed { failures: 0 }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock leaves a valid state (each arm
        // writes a whole new state), so poisoning carries no meaning here.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a check at `now` may call Redis.
    pub(crate) fn admit(&self, now: Instant) -> (Admission, Option<Transition>) {
        let mut state = self.lock();
        match *state {
            State::Closed { .. } => (Admission::Call, None),
            State::Open { until } if now >= until => {
                *state = State::HalfOpen {
                    probe_until: now + self.probe_window,
                };
                (Admission::Probe, Some(Transition::HalfOpened))
            }
            State::Open { .. } => (Admission::Reject, None),
            State::HalfOpen { probe_until } if now >= probe_until => {
                *state = State::HalfOpen {
                    probe_until: now + self.probe_window,
                };
                (Admission::Probe, None)
            }
            State::HalfOpen { .. } => (Admission::Reject, None),
        }
    }

    /// A Redis call succeeded.
    pub(crate) fn on_success(&self) -> Option<Transition> {
        let mut state = self.lock();
        let transition = match *state {
            State::Closed { .. } => None,
            State::Open { .. } | State::HalfOpen { .. } => Some(Transition::Closed),
        };
        *state = State::Closed { failures: 0 };
        transition
    }

    /// A Redis call failed at `now`.
    pub(crate) fn on_failure(&self, now: Instant) -> Option<Transition> {
        let mut state = self.lock();
        let open = State::Open {
            until: now + self.config.cool_down,
        };
        match *state {
            State::Closed { failures } => {
                let failures = failures.saturating_add(1);
                if failures >= self.config.failure_threshold {
                    *state = open;
                    Some(Transition::Opened)
                } else {
                    *state = State::Closed { failures };
                    None
                }
            }
            // A failed probe, or a late failure of a call admitted before
            // the breaker opened: open (again) for a full cool-down.
            State::HalfOpen { .. } => {
                *state = open;
                Some(Transition::Opened)
            }
            State::Open { .. } => None,
        }
    }

    /// The state at `now` (an open breaker whose cool-down is over reports
    /// `HalfOpen`: the next check will probe).
    pub(crate) fn state(&self, now: Instant) -> BreakerState {
        match *self.lock() {
            State::Closed { .. } => BreakerState::Closed,
            State::Open { until } if now < until => BreakerState::Open,
            State::Open { .. } | State::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// How long until the breaker lets a probe through (zero unless open).
    pub(crate) fn retry_in(&self, now: Instant) -> Duration {
        match *self.lock() {
            State::Open { until } => until.saturating_duration_since(now),
            State::HalfOpen { probe_until } => probe_until.saturating_duration_since(now),
            State::Closed { .. } => Duration::ZERO,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COOL: Duration = Duration::from_secs(1);
    const PROBE: Duration = Duration::from_millis(50);

    fn breaker() -> Breaker {
        Breaker::new(
            BreakerConfig {
                failure_threshold: 3,
                cool_down: COOL,
            },
            PROBE,
        )
    }

    /// A breaker opened by 3 failures at the returned instant.
    fn opened() -> (Breaker, Instant) {
        let (b, t0) = (breaker(), Instant::now());
        for _ in 0..3 {
            let _ = b.on_failure(t0);
        }
        assert_eq!(b.state(t0), BreakerState::Open);
        (b, t0)
    }

    #[test]
    fn opens_after_consecutive_failures_only() {
        let (b, t0) = (breaker(), Instant::now());
        assert_eq!(b.on_failure(t0), None);
        assert_eq!(b.on_failure(t0), None);
        assert_eq!(b.on_success(), None); // resets the count
        assert_eq!(b.on_failure(t0), None);
        assert_eq!(b.on_failure(t0), None);
        assert_eq!(b.admit(t0), (Admission::Call, None));
        assert_eq!(b.on_failure(t0), Some(Transition::Opened));
        assert_eq!(b.state(t0), BreakerState::Open);
        assert_eq!(b.admit(t0 + COOL / 2), (Admission::Reject, None));
        assert_eq!(b.retry_in(t0 + COOL / 2), COOL / 2);
    }

    #[test]
    fn half_open_lets_one_probe_through_and_its_result_decides() {
        let (b, t0) = opened();
        let later = t0 + COOL;
        assert_eq!(
            b.admit(later),
            (Admission::Probe, Some(Transition::HalfOpened))
        );
        assert_eq!(b.admit(later), (Admission::Reject, None));
        // The probe fails: open for another full cool-down.
        assert_eq!(b.on_failure(later), Some(Transition::Opened));
        assert_eq!(b.admit(later + COOL / 2), (Admission::Reject, None));
        let again = later + COOL;
        assert_eq!(
            b.admit(again),
            (Admission::Probe, Some(Transition::HalfOpened))
        );
        assert_eq!(b.on_success(), Some(Transition::Closed));
        assert_eq!(b.state(again), BreakerState::Closed);
        assert_eq!(b.admit(again), (Admission::Call, None));
    }

    #[test]
    fn a_lost_probe_is_replaced_after_the_probe_window() {
        let (b, t0) = opened();
        let probe_at = t0 + COOL;
        assert_eq!(b.admit(probe_at).0, Admission::Probe);
        assert_eq!(b.admit(probe_at + PROBE / 2).0, Admission::Reject);
        assert_eq!(b.admit(probe_at + PROBE).0, Admission::Probe);
    }
}
