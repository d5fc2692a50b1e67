//! What several groups share besides keys: a watchdog that stops watching
//! when its test ends, the table sizes the map promises, a recorder of the
//! capacities a thread sees, the workers' progress counter, the quotas of
//! hot and churn keys, and the top-up that makes a hot key's count exact.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

use turnstile_rl::Quota;
use turnstile_test_kit::watchdog::Watchdog;

/// A watchdog for one test: aborts the process if no worker reports
/// progress for 30 s, or if the test runs longer than `limit`. Stops
/// watching when dropped, so that a failed assertion fails its test only.
pub struct Dog(Watchdog);

impl std::ops::Deref for Dog {
    type Target = Watchdog;
    fn deref(&self) -> &Watchdog {
        &self.0
    }
}

impl Drop for Dog {
    fn drop(&mut self) {
        self.0.finish();
    }
}

pub fn watchdog(what: &'static str, limit: Duration) -> Dog {
    Dog(Watchdog::start(what, Duration::from_secs(30), limit))
}

/// What a table holding `live` keys below the bound gets: three slots per
/// two keys, rounded up to a power of two (at least 16).
pub fn pow2_table(live: usize) -> usize {
    (live + live / 2).max(16).next_power_of_two()
}

/// The table a map of `max_keys` uses once it holds `max_keys` keys:
/// `capacity_for(max_keys)` capped at 7/4 slots per key (at least 16).
pub fn bound_table(max_keys: usize) -> usize {
    pow2_table(max_keys).min((max_keys * 7 / 4).max(16).max(max_keys + max_keys / 2))
}

/// Records the distinct capacities a thread sees.
pub struct Seen {
    last: usize,
    pub all: BTreeSet<usize>,
}
impl Seen {
    pub fn new() -> Self {
        Seen {
            last: 0,
            all: BTreeSet::new(),
        }
    }
    pub fn saw(&mut self, capacity: usize) {
        if capacity != self.last {
            self.last = capacity;
            self.all.insert(capacity);
        }
    }
}

/// Checks made by a test's workers: the thread driving the clock waits for
/// them between its steps, so the race happens even when the workers are
/// slow to be scheduled (2 shared cores).
pub static PROGRESS: AtomicU64 = AtomicU64::new(0);

pub fn wait_progress(last: &mut u64, n: u64) {
    let start = std::time::Instant::now();
    while PROGRESS.load(Ordering::Relaxed) < *last + n && start.elapsed() < Duration::from_secs(2) {
        thread::yield_now();
    }
    *last = PROGRESS.load(Ordering::Relaxed);
}

/// A hot key's burst under [`hot_quota`].
pub const HOT_BURST: u64 = 20;

/// Quota for hot keys: an hour per request, so on a test's clock a hot key
/// admits its burst and nothing more.
pub fn hot_quota() -> Quota {
    format!("1/h burst {HOT_BURST}").parse().unwrap()
}

/// Quota for churn keys: idle 1 ms after their one request.
pub fn fast_quota() -> Quota {
    "1000/s burst 1".parse().unwrap()
}

/// After a race, checks each hot key `burst` more times, alone, adding
/// what is admitted to its count in `admitted`. A hot thread starved by
/// the scheduler may have checked a key fewer times than its burst (seen
/// under load: 19 checks, so 19 admitted); topped up, every key admits
/// exactly its burst in all, unless the race lost or doubled an admission.
/// Asserts first that the race itself admitted hot checks.
pub fn top_up(
    what: &str,
    admitted: &[AtomicU64],
    burst: u64,
    mut check: impl FnMut(usize) -> bool,
) {
    let raced: u64 = admitted.iter().map(|a| a.load(Ordering::Relaxed)).sum();
    assert!(
        raced > 0,
        "{what}: not reached: no hot check admitted during the race"
    );
    for (i, count) in admitted.iter().enumerate() {
        for _ in 0..burst {
            if check(i) {
                count.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
