//! The keyed map's tests, by subject, in one test binary:
//!
//! - [`growth`]: tables growing, shrinking and compacting under checks.
//! - [`bound`]: `max_keys` and its overflow policies, floods at tiny and
//!   odd bounds.
//! - [`sizing`]: the sizes of tables, and the tightest successors.
//! - [`hostile_keys`]: keys whose `Clone`, `Eq`, `Hash` or `Drop` panics,
//!   lies, or uses another limiter.
//! - [`memory`]: heap bytes held, following the live keys.
//! - [`dropped_limiters`]: a dropped limiter gives back all of its memory.
//! - [`clocks`]: stale and far-ahead readings, and the sweep's pace.
//! - [`stress`]: every freeing path raced on many threads.
//!
//! [`keys`] and [`support`] hold what several groups share.
//!
//! Multi-threaded tests bound themselves with a watchdog (`within`, or the
//! kit's `Watchdog`, which aborts the process), so a hang fails within
//! seconds instead of stalling CI, and each asserts that it reached the
//! race it is about.
//!
//! Three tests of the same map keep binaries of their own, because what
//! they measure is the whole process: `tests/idle_thread_memory.rs`,
//! `tests/pin_bystander_reclaims.rs` and `tests/pin_panicking_drop.rs`
//! (each says why at its top).
//!
//! ```text
//! cargo test --test map                  # every group
//! cargo test --test map -- bound::       # one group
//! ```

use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard};

use turnstile_test_kit::heap;

mod bound;
mod clocks;
mod dropped_limiters;
mod growth;
mod hostile_keys;
mod keys;
mod memory;
mod sizing;
mod stress;
mod support;

/// The kit's counting allocator: heap bytes held, and a pause at one
/// allocation.
#[global_allocator]
static HEAP: heap::Counting = heap::Counting;

static SERIAL: Mutex<()> = Mutex::new(());

/// Every test takes this first: the tests run one at a time. The counting
/// allocator and the keys' counters are process-wide, the races need both
/// cores, and a test whose threads pin would hold back another's
/// reclamation. Disarms [`keys::POISON`] too (a test that failed while it
/// was armed leaves it set).
fn serial() -> MutexGuard<'static, ()> {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    keys::POISON.store(false, Ordering::SeqCst);
    guard
}
