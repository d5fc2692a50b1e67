//! Cache hints: a key's home slot fetched ahead of its lookup (batches),
//! and the eviction window's lines fetched together.

use super::RawMap;
use crate::map::pin::Guard;
use crate::sync::Ordering;

impl<K> RawMap<K> {
    /// Starts fetching the home slot of `hash` in the root table into the
    /// cache: the slot `find` reads first, which holds the key's bucket in
    /// the common case. A hint only: nothing is read or written that a
    /// lookup can observe.
    #[inline]
    pub(crate) fn prefetch_slot(&self, hash: u64, guard: &Guard) {
        // SAFETY: as in `capacity`: the root is never null and is retired
        // only through the pin, which waits for `guard`'s.
        let t = unsafe { self.root.load(Ordering::Acquire, guard).deref() };
        prefetch(std::ptr::from_ref(&t.slots[t.home(hash)]).cast());
    }
}

/// Asks the CPU to bring the cache line holding `addr` into L1, where the
/// target has an instruction for it (x86_64, aarch64); nothing elsewhere.
#[inline(always)]
pub(super) fn prefetch(addr: *const u8) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch is a hint: it never faults (any address, even
        // a dangling or unmapped one, is allowed), writes nothing and has
        // no effect a program can observe but timing. SSE, which provides
        // it, is part of the x86_64 baseline.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(addr.cast()) };
    }
    #[cfg(target_arch = "aarch64")]
    {
        // SAFETY: `prfm` is a hint: it never faults on any address, writes
        // nothing, touches no flags and no stack (the options say so).
        unsafe {
            core::arch::asm!(
                "prfm pldl1keep, [{addr}]",
                addr = in(reg) addr,
                options(nostack, readonly, preserves_flags)
            )
        };
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = addr;
}
