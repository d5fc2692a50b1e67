//! A key that holds its thread inside a limiter's pin: its `Eq`, which a
//! lookup calls under the pin when it meets the key, stalls at a gate once
//! the gate is armed. The pin tests hold a reader in place with it while a
//! table is retired or the process forks.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

/// Where a [`StallingKey`]'s `Eq` stalls.
#[derive(Debug)]
pub struct Gate {
    armed: AtomicBool,
    stalled: AtomicBool,
    open: AtomicBool,
}

impl Gate {
    /// A gate not armed.
    pub const fn new() -> Self {
        Gate {
            armed: AtomicBool::new(false),
            stalled: AtomicBool::new(false),
            open: AtomicBool::new(false),
        }
    }

    /// The next `Eq` of a key on this gate stalls until [`Gate::open`].
    pub fn arm(&self) {
        self.armed.store(true, SeqCst);
    }

    /// Whether a key's `Eq` has stalled here.
    pub fn is_stalled(&self) -> bool {
        self.stalled.load(SeqCst)
    }

    /// Lets the stalled `Eq` go on.
    pub fn open(&self) {
        self.open.store(true, SeqCst);
    }
}

impl Default for Gate {
    fn default() -> Self {
        Gate::new()
    }
}

/// A key whose `Eq` stalls at its gate once the gate is armed.
#[derive(Clone, Debug)]
pub struct StallingKey {
    /// What the key hashes and compares.
    pub id: u64,
    /// Where its `Eq` stalls.
    pub gate: &'static Gate,
}

impl Hash for StallingKey {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.id.hash(h)
    }
}

impl PartialEq for StallingKey {
    fn eq(&self, other: &Self) -> bool {
        if self.gate.armed.swap(false, SeqCst) {
            self.gate.stalled.store(true, SeqCst);
            while !self.gate.open.load(SeqCst) {
                std::thread::yield_now();
            }
        }
        self.id == other.id
    }
}

impl Eq for StallingKey {}
