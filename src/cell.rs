//! The cell: one bucket's whole state in one `AtomicU64`, updated by a
//! compare-and-swap loop around an algorithm's pure decision function.
//!
//! # Orderings
//!
//! Every access is `Relaxed`, and that is enough:
//! - the cell publishes no other memory: the `u64` *is* the bucket, so there
//!   is nothing for an Acquire to make visible;
//! - all read-modify-writes of one atomic are totally ordered (its
//!   modification order), so a CAS from `old` succeeds only if no other
//!   update landed since `old` was read: no update is ever lost;
//! - a denial writes nothing and may rest on a load that is already stale.
//!   That is still correct: updates only move an algorithm's state towards
//!   "more used" at a given `now` (GCRA's TAT only grows), so a request
//!   denied on an older state would be denied on the newer one too;
//! - the evictor's claim is a CAS to [`TOMBSTONE`] on the same atomic, so it
//!   either lands before an update (the update's CAS fails and it sees the
//!   tombstone) or after (the evictor's CAS fails). Keeping the *node*
//!   alive while someone reads it is the epoch's job, not the cell's.

use crate::algorithm::{Algorithm, TOMBSTONE};
use crate::sync::{AtomicU64, Ordering};
use crate::Decision;

/// One bucket. State `0` is a full bucket for every algorithm.
#[derive(Debug)]
pub(crate) struct Cell {
    state: AtomicU64,
}

/// The cell was claimed by an evictor; the caller must go back to the map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tombstoned;

/// One admission as it landed on a cell: the clock reading it was decided
/// at and the state it wrote. What a rollback needs to take it out again
/// (see `crate::multi`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Charge {
    pub(crate) now: u64,
    pub(crate) after: u64,
}

/// CAS retries taken by all cells of the process: read by `stats()`, and by
/// the stress tests to assert that they really raced. Written only when a
/// CAS fails, never on an uncontended check. (Not under loom, whose atomics
/// cannot live in a static, and whose models count their own races.)
#[cfg(not(turnstile_loom))]
pub(crate) static CAS_RETRIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[inline]
fn count_retry() {
    #[cfg(not(turnstile_loom))]
    CAS_RETRIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    #[cfg(turnstile_loom)]
    crate::probe::hit(&crate::probe::CAS_RETRY);
}

impl Cell {
    pub(crate) fn new(state: u64) -> Self {
        Cell {
            state: AtomicU64::new(state),
        }
    }

    /// Decides a request of `cost` (already checked) at `now`.
    #[inline]
    pub(crate) fn update<A: Algorithm>(
        &self,
        algorithm: &A,
        now: u64,
        cost: u64,
    ) -> Result<Decision, Tombstoned> {
        // Inlined, the unused charge record costs nothing.
        self.charge(algorithm, now, cost)
            .map(|(decision, _)| decision)
    }

    /// [`update`](Cell::update) that also reports the admission it made
    /// (its reading and the state it wrote), for the multi-limit rollback.
    #[inline]
    pub(crate) fn charge<A: Algorithm>(
        &self,
        algorithm: &A,
        now: u64,
        cost: u64,
    ) -> Result<(Decision, Option<Charge>), Tombstoned> {
        let mut current = self.state.load(Ordering::Relaxed);
        loop {
            if current == TOMBSTONE {
                return Err(Tombstoned);
            }
            let step = algorithm.decide(current, now, cost);
            let Some(next) = step.next else {
                return Ok((step.decision, None));
            };
            debug_assert_ne!(next, TOMBSTONE, "an algorithm produced the tombstone");
            // Weak: a spurious failure only costs one more trip round the
            // loop, and the weak form is a plain LL/SC on ARM.
            match self.state.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    let charge = Charge { now, after: next };
                    return Ok((step.decision, Some(charge)));
                }
                Err(actual) => {
                    count_retry();
                    current = actual;
                }
            }
        }
    }

    /// Claims the cell for eviction if `claimable(state)`: after a
    /// successful claim no update can ever land on it again. Returns false if
    /// the state was not claimable or the cell was already claimed.
    pub(crate) fn try_claim(&self, claimable: impl Fn(u64) -> bool) -> bool {
        let mut current = self.state.load(Ordering::Relaxed);
        loop {
            if current == TOMBSTONE || !claimable(current) {
                return false;
            }
            match self.state.compare_exchange(
                current,
                TOMBSTONE,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                // An update landed first: judge its state afresh.
                Err(actual) => current = actual,
            }
        }
    }

    /// Replaces the state with `change(state)` when that is `Some`, in one
    /// CAS loop, so the change lands atomically between whole decisions and
    /// is applied to the state current at that instant. Returns the state
    /// it wrote, or `None` when `change` asked for nothing.
    pub(crate) fn modify(
        &self,
        change: impl Fn(u64) -> Option<u64>,
    ) -> Result<Option<u64>, Tombstoned> {
        let mut current = self.state.load(Ordering::Relaxed);
        loop {
            if current == TOMBSTONE {
                return Err(Tombstoned);
            }
            let Some(next) = change(current) else {
                return Ok(None);
            };
            debug_assert_ne!(next, TOMBSTONE, "a change produced the tombstone");
            // Relaxed, as in `update`: the word publishes nothing else.
            match self.state.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(Some(next)),
                Err(actual) => {
                    count_retry();
                    current = actual;
                }
            }
        }
    }

    /// The raw state (for sampling eviction candidates and for tests).
    pub(crate) fn load(&self) -> u64 {
        self.state.load(Ordering::Relaxed)
    }
}

#[cfg(all(test, not(turnstile_loom)))]
mod tests {
    use super::*;
    use crate::Gcra;

    #[test]
    fn two_threads_share_one_bucket_exactly() {
        let gcra = Gcra::new(&"1/h burst 50".parse().unwrap());
        let cell = Cell::new(0);
        let admitted: usize = std::thread::scope(|s| {
            let workers: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        (0..40)
                            .filter(|_| cell.update(&gcra, 0, 1).unwrap().is_allowed())
                            .count()
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).sum()
        });
        assert_eq!(admitted, 50);
    }

    #[test]
    fn a_claimed_cell_refuses_updates() {
        let gcra = Gcra::new(&"1/s".parse().unwrap());
        let cell = Cell::new(0);
        assert!(
            !cell.try_claim(|state| state != 0),
            "not claimable: unchanged"
        );
        assert!(cell.try_claim(|state| state == 0));
        assert!(!cell.try_claim(|_| true), "claimed once");
        assert_eq!(cell.update(&gcra, 0, 1), Err(Tombstoned));
        assert_eq!(cell.load(), TOMBSTONE);
    }
}
