//! Pinning the epoch on any thread, cheaply: one collector for every map.
//!
//! Every map of the process retires its tables to one collector of the
//! crate's own, and each thread keeps one handle on it in a thread-local,
//! so a pin is a thread-local access and crossbeam's own pin, whatever the
//! number of maps a thread uses (issue 22: a collector per map, with a
//! cache of 8 handles per thread, re-registered and allocated on every
//! check of a ninth map, 390 ns instead of 20).
//!
//! Why one collector is enough: a map's garbage waits only on threads
//! pinned *now*, and every pin in this crate lasts one operation (a check,
//! a batch, a multi-limit check, a housekeeping step: none sleeps, and the
//! only user code inside one is a key's `Hash`, `Eq`, `Clone` and `Drop`),
//! so sharing the epoch with other maps delays a retired table by the
//! length of an operation, not of a map's life. The handle of a thread
//! that sleeps is not pinned and holds nothing back, and its own bag holds
//! no table (a retired table is flushed to the collector at once), so
//! nothing needs to forget a dropped map. A collector of our own, not
//! crossbeam's default: another library's long pin or slow deferred drop
//! never stalls a check.
//!
//! Under loom the same code runs with loom's statics and thread-locals,
//! which loom makes afresh for every execution, so each model explores this
//! very pin, with a collector of its own.

use crossbeam_epoch::{Collector, Guard, LocalHandle};

#[cfg(not(turnstile_loom))]
use std::thread_local;

#[cfg(turnstile_loom)]
use loom::thread_local;

/// The crate's collector, made on first use and never dropped.
#[cfg(not(turnstile_loom))]
fn collector() -> &'static Collector {
    static COLLECTOR: std::sync::OnceLock<Collector> = std::sync::OnceLock::new();
    COLLECTOR.get_or_init(Collector::new)
}

/// One collector per loom execution (loom drops its statics when the
/// execution ends, which frees what the model left behind).
#[cfg(turnstile_loom)]
fn collector() -> &'static Collector {
    loom::lazy_static! {
        static ref COLLECTOR: Collector = Collector::new();
    }
    &COLLECTOR
}

thread_local! {
    /// This thread's registration: made (and allocated) once per thread,
    /// unregistered when the thread exits.
    static HANDLE: LocalHandle = collector().register();
}

/// Pins the crate's collector on the current thread.
#[inline]
pub(crate) fn pin() -> Guard {
    HANDLE
        .try_with(LocalHandle::pin)
        // The thread-local is gone while the thread exits (a key dropped by
        // another thread-local's destructor): a handle for this pin only.
        .unwrap_or_else(|_| collector().register().pin())
}
