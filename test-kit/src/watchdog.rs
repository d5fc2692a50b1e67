//! Watchdog for the attack tests: aborts the process (printing `what`) if
//! the shared progress counter has not moved for `stall`, or if the whole
//! run exceeds `limit`. Call `tick()` from workers.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A progress counter shared by the workers, watched by a thread of its own.
#[derive(Clone, Debug)]
pub struct Watchdog {
    progress: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
}

impl Watchdog {
    /// Starts watching: abort on no progress for `stall`, or on a run
    /// longer than `limit`.
    pub fn start(what: &'static str, stall: Duration, limit: Duration) -> Self {
        let dog = Watchdog {
            progress: Arc::new(AtomicU64::new(0)),
            done: Arc::new(AtomicBool::new(false)),
        };
        let (progress, done) = (dog.progress.clone(), dog.done.clone());
        std::thread::spawn(move || {
            let start = Instant::now();
            let mut last = u64::MAX;
            let mut last_change = Instant::now();
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
                let now = progress.load(Ordering::Relaxed);
                if now != last {
                    last = now;
                    last_change = Instant::now();
                }
                if last_change.elapsed() > stall {
                    eprintln!("WATCHDOG: {what}: no progress for {stall:?} (progress={now}): HANG");
                    std::process::abort();
                }
                if start.elapsed() > limit {
                    eprintln!("WATCHDOG: {what}: exceeded {limit:?} (progress={now})");
                    std::process::abort();
                }
            }
        });
        dog
    }

    /// Records progress.
    #[inline]
    pub fn tick(&self) {
        self.progress.fetch_add(1, Ordering::Relaxed);
    }

    /// Stops the watch (the run ended).
    pub fn finish(&self) {
        self.done.store(true, Ordering::Relaxed);
    }
}
