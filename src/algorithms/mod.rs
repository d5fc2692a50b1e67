//! The algorithms the engine runs: the [`Algorithm`] contract, GCRA (the
//! default) and the classic window counters, behind the same [`Decision`].
//!
//! One engine (the atomic cell, the keyed map, eviction) serves every
//! algorithm whose whole state fits in one `u64`: an algorithm is a pure
//! function `(state, now, cost) -> (new state, Decision)` plus a test for
//! "this state is the same as no state at all", which is what makes
//! eviction lossless. [`FromQuota`] builds one from a [`Quota`], so a
//! limiter takes its quota once:
//!
//! ```
//! use turnstile_rl::algorithms::FixedWindow;
//! use turnstile_rl::KeyedLimiter;
//!
//! let limiter = KeyedLimiter::<u64>::builder("100/min".parse()?)
//!     .algorithm_for::<FixedWindow>()?
//!     .build();
//! assert!(limiter.check(&7).is_allowed());
//! # Ok::<(), turnstile_rl::QuotaError>(())
//! ```
//!
//! GCRA ([`Gcra`]) is the default and the one to pick unless you have a
//! reason not to. The windows are here for comparison, and for users whose
//! clients already expect window semantics. The exact sliding log cannot
//! live in one word: it is a limiter of its own,
//! [`SlidingLog`](crate::SlidingLog), compared here because it answers the
//! same question.
//!
//! | algorithm | state per key | at a window boundary | bursts |
//! |-----------|---------------|----------------------|--------|
//! | [`Gcra`] | one `u64` (packed cell) | no boundary: tokens come back one every `T` | up to the quota's `burst`, then one per `T` |
//! | [`FixedWindow`] | one `u64` (packed cell): window index (39 bits) and count (24 bits) | the count starts afresh, so `2 * limit` can pass in a moment straddling it | the whole `limit` at once, anywhere in the window |
//! | [`SlidingWindow`] | one `u64` (packed cell): window index (31 bits), previous and current counts (16 bits each) | the previous window's count fades out linearly, so the spike is gone; it is an estimate that assumes the previous window's requests were spread evenly | `limit` at once from an idle start, then as the estimate allows |
//! | [`SlidingLog`](crate::SlidingLog) | one entry per distinct request time, up to `limit` entries of 16 bytes, behind a `Mutex` | exact: no more than `limit` in any window of one period | the whole `limit` at once, then each slot frees exactly one period after it was taken |
//!
//! At a window boundary, limit 100 a minute with 150 requests at 59.9 s and
//! 150 at 60.1 s: the fixed window admits 200 (100 in each minute), GCRA, the
//! sliding log and the sliding-window counter admit 100.
//!
//! # Quotas for windows
//!
//! A window algorithm counts [`Quota::count`] requests per
//! [`Quota::period`]; the quota's burst is a GCRA notion and is ignored. `"100/min burst 10"` is a window of one minute and
//! a limit of 100.
//!
//! # The horizon
//!
//! The packed algorithms store the window index `now / period` in a fixed
//! number of bits, and an index must never wrap around to alias an old
//! window. So `period * 2^bits` must reach a horizon of 50 years (of 365.25
//! days) of clock time: the fixed window (39 bits) needs a period of at least
//! about 2.87 ms, the sliding window (31 bits) at least about 0.735 s. A
//! shorter period is a [`QuotaError::DoesNotFit`] at
//! construction. A clock that does run past `2^bits` windows gets denials,
//! never a wrapped index.

mod fixed_window;
mod gcra;
mod sliding_window;
mod window;

use crate::decision::Decision;
use crate::error::{CostError, QuotaError};
use crate::quota::Quota;

pub use fixed_window::FixedWindow;
pub use gcra::Gcra;
pub use sliding_window::SlidingWindow;

/// What one decision does to the state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    /// The state to store, or `None` to leave the state as it was (a
    /// denial, usually). Always below `2^63 - 4`: the keyed map keeps the
    /// words above that for its own bookkeeping.
    pub next: Option<u64>,
    /// The answer for the caller.
    pub decision: Decision,
}

/// A rate-limit algorithm whose whole state is one `u64`.
///
/// State `0` must mean "nothing recorded": a fresh bucket starts there, and
/// a missing key in a keyed limiter behaves as state `0`. This trait is
/// sealed: the engine's guarantees (no lost update, lossless eviction)
/// depend on each implementation's exact properties, which the crate's
/// tests, fuzz targets and loom models check for the algorithms it ships.
pub trait Algorithm: Send + Sync + sealed::Sealed {
    /// Rejects a cost that can never be met (zero, or above the limit).
    fn check_cost(&self, cost: u64) -> Result<(), CostError>;

    /// The decision for a request of `cost` (already checked by
    /// [`check_cost`](Algorithm::check_cost)) at time `now` on `state`.
    /// Pure, total and saturating: no input panics or wraps.
    fn decide(&self, state: u64, now: u64, cost: u64) -> Step;

    /// Whether `state` at `now` decides every future request exactly as
    /// state `0` would, so that forgetting it changes nothing.
    fn is_idle(&self, state: u64, now: u64) -> bool;
}

/// An algorithm that a [`Quota`] alone configures, so that a keyed limiter's
/// builder can take the quota once and the algorithm by name
/// ([`KeyedLimiterBuilder::algorithm_for`](crate::KeyedLimiterBuilder::algorithm_for)).
///
/// ```
/// use turnstile_rl::algorithms::{FixedWindow, FromQuota};
/// use turnstile_rl::{Quota, QuotaError};
///
/// let quota: Quota = "100/min".parse()?;
/// assert_eq!(FixedWindow::from_quota(&quota)?, FixedWindow::new(&quota)?);
/// // A window's count has a bound; the error says which, and why.
/// let huge = Quota::per_minute(FixedWindow::MAX_LIMIT + 1)?;
/// assert!(matches!(
///     FixedWindow::from_quota(&huge),
///     Err(QuotaError::DoesNotFit { algorithm: "fixed window", .. })
/// ));
/// # Ok::<(), QuotaError>(())
/// ```
pub trait FromQuota: Algorithm + Sized {
    /// The algorithm of `quota`, or [`QuotaError::DoesNotFit`] naming the
    /// bound the quota exceeds (GCRA holds every quota).
    fn from_quota(quota: &Quota) -> Result<Self, QuotaError>;
}

impl FromQuota for Gcra {
    fn from_quota(quota: &Quota) -> Result<Self, QuotaError> {
        Ok(Gcra::new(quota))
    }
}

impl FromQuota for FixedWindow {
    fn from_quota(quota: &Quota) -> Result<Self, QuotaError> {
        FixedWindow::new(quota)
    }
}

impl FromQuota for SlidingWindow {
    fn from_quota(quota: &Quota) -> Result<Self, QuotaError> {
        SlidingWindow::new(quota)
    }
}

pub(crate) mod sealed {
    use crate::decision::Decision;

    /// Words of an algorithm's parameters (see `to_words`).
    pub const WORDS: usize = 3;

    /// Keeps [`Algorithm`](super::Algorithm) to the crate's own algorithms,
    /// and gives each one's parameters as words, so a limiter can hold them
    /// in atomics and change them while checks read them (`crate::live`).
    pub trait Sealed: Copy {
        /// The parameters as words.
        fn to_words(&self) -> [u64; WORDS];
        /// The parameters back from [`to_words`](Sealed::to_words)'s words.
        fn from_words(words: [u64; WORDS]) -> Self;

        /// [`decide`](super::Algorithm::decide)'s `next` alone: the state
        /// an admission writes, `None` for a denial. What a cell's CAS
        /// loop computes between its load and its compare-exchange, and
        /// nothing more (DESIGN.md, "A check's fixed cost"): the figures
        /// of the answer are [`decision`](Sealed::decision)'s, built once
        /// the loop is over. A request is admitted exactly when this is
        /// `Some`, for every algorithm the crate ships.
        #[inline]
        fn admit(&self, state: u64, now: u64, cost: u64) -> Option<u64>
        where
            Self: super::Algorithm,
        {
            self.decide(state, now, cost).next
        }

        /// [`decide`](super::Algorithm::decide)'s `decision`, given `next`,
        /// what [`admit`](Sealed::admit) returned for the same arguments.
        #[inline]
        fn decision(&self, state: u64, now: u64, cost: u64, next: Option<u64>) -> Decision
        where
            Self: super::Algorithm,
        {
            debug_assert_eq!(next, self.admit(state, now, cost));
            self.decide(state, now, cost).decision
        }

        /// Whether the admission `state -> next` at `now` (what
        /// [`admit`](Sealed::admit) decided) may be made by adding
        /// `next - state` to the state, whatever it is: whether, when the
        /// state is `x` instead, admitting is `x -> x + (next - state)`
        /// (GCRA under load: TAT at or past now). An add cannot fail where
        /// a CAS retries (see `crate::direct`'s "Admitting with an add").
        #[inline]
        fn additive(&self, _state: u64, _now: u64, _next: u64) -> bool {
            false
        }

        /// Whether the admission that writes `next` at `now` leaves room
        /// for `tokens` more of cost 1: where a direct limiter tries an
        /// add (`crate::direct`, "Near the boundary"), so that the adds of
        /// other threads landing before its own do not overshoot the
        /// bucket. Only asked of an [`additive`](Sealed::additive)
        /// admission.
        #[inline]
        fn leaves_room(&self, _next: u64, _now: u64, _tokens: u64) -> bool {
            false
        }

        /// The state after taking the add of an
        /// [`additive`](Sealed::additive) admission of `cost`, made as an admission at `reading` that wrote
        /// `after`, out of `state` at `now`; `None` to leave `state` as it
        /// is. Only called when `additive` gave an amount.
        #[inline]
        fn taken_back(
            &self,
            _state: u64,
            _reading: u64,
            _after: u64,
            _now: u64,
            _cost: u64,
        ) -> Option<u64> {
            None
        }
    }
}
