//! A counting global allocator, so memory is measured in heap bytes the
//! program holds, not RSS guesses. A test or bench installs it with
//!
//! ```ignore
//! #[global_allocator]
//! static HEAP: turnstile_test_kit::heap::Counting = turnstile_test_kit::heap::Counting;
//! ```
//!
//! (a library cannot install it for everyone that links the kit).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts live heap bytes and their peak.
#[derive(Debug)]
pub struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(bytes: usize) {
    pause_if_armed(bytes);
    // `try_with`: allocations during thread teardown must not panic.
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
    let live = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

// SAFETY: forwards every call to the system allocator unchanged; the
// counters are side effects only.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's obligations pass through to System.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's obligations pass through to System.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's obligations pass through to System.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            grew(new_size);
        }
        new
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's obligations pass through to System.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// An allocation of `size` bytes made by a thread that armed [`pause_at`]
/// waits there until [`release`]: a stand-in for the OS descheduling that
/// thread at that exact point, so a test can replay a race deterministically.
static PAUSED: AtomicUsize = AtomicUsize::new(0);
static RELEASED: AtomicUsize = AtomicUsize::new(0);

std::thread_local! {
    static ARMED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn pause_if_armed(bytes: usize) {
    // `try_with`: allocations during thread teardown must not panic.
    let armed = ARMED.try_with(|armed| armed.get()).unwrap_or(0);
    if armed == 0 || armed != bytes {
        return;
    }
    let _ = ARMED.try_with(|armed| armed.set(0));
    PAUSED.fetch_add(1, Ordering::SeqCst);
    while RELEASED.load(Ordering::SeqCst) < PAUSED.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
}

/// Makes this thread's next allocation of exactly `size` bytes wait until
/// [`release`] is called (once).
pub fn pause_at(size: usize) {
    ARMED.with(|armed| armed.set(size));
}

/// Whether some armed thread is waiting in its allocation now.
pub fn is_paused() -> bool {
    RELEASED.load(Ordering::SeqCst) < PAUSED.load(Ordering::SeqCst)
}

/// Lets the waiting thread go on.
pub fn release() {
    RELEASED.fetch_add(1, Ordering::SeqCst);
}

std::thread_local! {
    /// Allocations (and reallocations) this thread made: per thread, so
    /// other tests' threads running meanwhile do not count.
    static ALLOCATIONS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many allocations and reallocations the calling thread has made.
pub fn allocations() -> u64 {
    ALLOCATIONS.with(std::cell::Cell::get)
}

/// Heap bytes held now.
pub fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// The most heap bytes held since the last [`reset_peak`].
pub fn peak() -> usize {
    PEAK.load(Ordering::Relaxed)
}

/// Starts a new peak measurement from what is held now.
pub fn reset_peak() {
    PEAK.store(live(), Ordering::Relaxed);
}

/// Bytes in mebibytes, for printing.
pub fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1 << 20) as f64
}
