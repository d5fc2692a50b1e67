//! Pinning a map's own epoch collector from any thread, cheaply.
//!
//! Each map owns its `Collector` (so one map's garbage never waits on
//! another's readers, and loom models stay independent). Pinning one needs a
//! `LocalHandle` registered for the current thread; registering allocates,
//! so each thread keeps its handles in a small cache. A handle keeps its
//! collector's bookkeeping alive, so a dropped map's handle is never
//! mistaken for a new map's, and the cache is bounded.

use crossbeam_epoch::{Collector, Guard};

/// Handles a thread keeps; a thread that uses more maps than this re-registers
/// (an allocation) on a miss, which stays correct.
#[cfg(not(turnstile_loom))]
const CACHED_HANDLES: usize = 8;

/// Pins `collector` on this thread.
#[cfg(not(turnstile_loom))]
#[inline]
pub(crate) fn pin(collector: &Collector) -> Guard {
    use crossbeam_epoch::LocalHandle;
    use std::cell::RefCell;

    thread_local! {
        static HANDLES: RefCell<Vec<LocalHandle>> = const { RefCell::new(Vec::new()) };
    }

    HANDLES
        .try_with(|handles| {
            let mut handles = handles.borrow_mut();
            if let Some(handle) = handles.iter().find(|h| h.collector() == collector) {
                return handle.pin();
            }
            if handles.len() == CACHED_HANDLES {
                handles.remove(0);
            }
            let handle = collector.register();
            let guard = handle.pin();
            handles.push(handle);
            guard
        })
        // During thread teardown the cache is gone: a one-off handle works.
        .unwrap_or_else(|_| collector.register().pin())
}

/// Under loom every model is a fresh world: no thread-local cache survives
/// between executions, so register each time.
#[cfg(turnstile_loom)]
pub(crate) fn pin(collector: &Collector) -> Guard {
    collector.register().pin()
}
