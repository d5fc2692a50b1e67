//! What the adv2 attack tests share: a clock that moves a step per
//! reading, and a small deterministic generator.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use turnstile_rl::Clock;

/// A clock that moves `step` nanoseconds on every reading until frozen:
/// time passes only as fast as checks are made, however loaded the host.
#[derive(Clone)]
pub struct Ticking {
    pub now: Arc<AtomicU64>,
    step: Arc<AtomicU64>,
}

impl Ticking {
    /// A clock at `start` moving `step` a reading.
    pub fn new(start: u64, step: u64) -> Self {
        Ticking {
            now: Arc::new(AtomicU64::new(start)),
            step: Arc::new(AtomicU64::new(step)),
        }
    }

    /// Stops the clock: every later reading is the last one.
    pub fn freeze(&self) {
        self.step.store(0, Ordering::Relaxed);
    }
}

impl Clock for Ticking {
    fn now(&self) -> u64 {
        // Relaxed: a test reading, ordered by nothing but itself.
        let step = self.step.load(Ordering::Relaxed);
        self.now.fetch_add(step, Ordering::Relaxed) + step
    }
}

/// A small deterministic generator (xorshift64*).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
