//! Process-wide event counts kept in per-thread stripes: what `stats()`
//! and the stress tests read to know a race happened (CAS retries, raced
//! rollbacks).
//!
//! The events counted are races: the threads that have them are exactly
//! the ones already contending for a line, and one shared counter would
//! add a second contended line to each event. So each thread adds to its
//! own stripe (threads are spread over the stripes in the order they
//! first count), and a read sums them. `std` atomics even under loom:
//! loom's cannot live in a static, and the models count their races with
//! probes instead.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

use crossbeam_utils::CachePadded;

const STRIPES: usize = 8;

/// One process-wide count, in stripes.
pub(crate) struct Striped([CachePadded<AtomicU64>; STRIPES]);

impl Striped {
    pub(crate) const fn new() -> Self {
        Striped([const { CachePadded::new(AtomicU64::new(0)) }; STRIPES])
    }

    /// Counts one event on this thread's stripe.
    #[inline]
    pub(crate) fn add(&self) {
        static THREADS: AtomicUsize = AtomicUsize::new(0);
        std::thread_local! {
            static STRIPE: usize = THREADS.fetch_add(1, Relaxed) % STRIPES;
        }
        // A thread whose locals are gone (exiting) counts on stripe 0.
        let stripe = STRIPE.try_with(|stripe| *stripe).unwrap_or(0);
        // Relaxed: a count publishes nothing; a reader wants a number, not
        // what happened before it.
        self.0[stripe].fetch_add(1, Relaxed);
    }

    /// Every event counted so far.
    pub(crate) fn sum(&self) -> u64 {
        self.0.iter().map(|stripe| stripe.load(Relaxed)).sum()
    }
}
