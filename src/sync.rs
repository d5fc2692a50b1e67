//! The one place that names the atomics: std's in normal builds, loom's under
//! `--cfg turnstile_loom`, so the loom models in `loom-tests/` explore every
//! interleaving of the real code rather than of a copy.
//!
//! The cfg is prefixed (`turnstile_loom`, not `loom`) so a RUSTFLAGS switch
//! does not also flip every other crate in the build that knows `cfg(loom)`.

#[cfg(not(turnstile_loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU64, AtomicU8, AtomicUsize, Ordering};

#[cfg(turnstile_loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU64, AtomicU8, AtomicUsize, Ordering};

/// The lock quota changes take turns through (`crate::live`): never taken
/// by a check.
#[cfg(not(turnstile_loom))]
pub(crate) use std::sync::Mutex;

#[cfg(turnstile_loom)]
pub(crate) use loom::sync::Mutex;

/// A read that must try again (`crate::live`): a spin hint, or under loom
/// a yield, so the model lets the writer it waits for run.
#[inline]
pub(crate) fn spin_loop() {
    #[cfg(not(turnstile_loom))]
    std::hint::spin_loop();
    #[cfg(turnstile_loom)]
    yield_now();
}

/// Lets another thread run while this one waits for it (loom must see it).
#[cfg(not(turnstile_loom))]
pub(crate) use std::thread::yield_now;

#[cfg(turnstile_loom)]
pub(crate) use loom::thread::yield_now;

/// An `UnsafeCell` with loom's closure API, so loom can check every access
/// to the map's keys for data races (see `map::raw`). Built only as zeroed
/// memory outside loom, so it has no constructor there.
#[cfg(not(turnstile_loom))]
#[derive(Debug)]
#[repr(transparent)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(turnstile_loom))]
impl<T> UnsafeCell<T> {
    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

#[cfg(turnstile_loom)]
pub(crate) use loom::cell::UnsafeCell;

/// Waits for another thread to finish a step of a few instructions (an
/// insert publishing its key): spins a little, then yields.
#[inline]
pub(crate) fn wait_briefly(attempt: &mut u32) {
    #[cfg(not(turnstile_loom))]
    if *attempt < 64 {
        *attempt += 1;
        std::hint::spin_loop();
        return;
    }
    let _ = attempt;
    yield_now();
}
