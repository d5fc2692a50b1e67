//! Watchdog for the attack tests: aborts the process (printing `what`) if
//! the shared progress counter has not moved for `stall`, or if the whole
//! run exceeds `limit`. Call `tick()` from workers.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone)]
pub struct Watchdog {
    progress: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
}

impl Watchdog {
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

    #[inline]
    pub fn tick(&self) {
        self.progress.fetch_add(1, Ordering::Relaxed);
    }

    pub fn finish(&self) {
        self.done.store(true, Ordering::Relaxed);
    }
}

/// Tiny deterministic RNG.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}
