//! The one place that names the atomics: std's in normal builds, loom's under
//! `--cfg turnstile_loom`, so the loom models in `loom-tests/` explore every
//! interleaving of the real code rather than of a copy.
//!
//! The cfg is prefixed (`turnstile_loom`, not `loom`) so a RUSTFLAGS switch
//! does not also flip every other crate in the build that knows `cfg(loom)`.

#[cfg(not(turnstile_loom))]
pub(crate) use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

#[cfg(turnstile_loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Lets another thread run while this one waits for it (loom must see it).
#[cfg(not(turnstile_loom))]
pub(crate) use std::thread::yield_now;

#[cfg(turnstile_loom)]
pub(crate) use loom::thread::yield_now;
