//! The contract between an algorithm and the engine that runs it.
//!
//! One engine (the atomic cell, the keyed map, eviction) serves every
//! algorithm whose whole state fits in one `u64`: an algorithm is a pure
//! function `(state, now, cost) -> (new state, Decision)` plus a test for
//! "this state is the same as no state at all", which is what makes
//! eviction lossless.

use crate::error::CostError;
use crate::Decision;

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

pub(crate) mod sealed {
    pub trait Sealed {}
}
