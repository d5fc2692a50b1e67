//! What a Redis limiter runs now (its quotas and their scripts), replaced
//! whole while it serves: shared by [`RedisLimiter`](super::RedisLimiter)
//! (one quota) and [`RedisMulti`](super::RedisMulti) (several).
//!
//! A call takes one snapshot (an `Arc` copied out under a read lock held
//! for that copy only, never across a round trip) and runs wholly on it,
//! so a call racing a change is decided wholly at the old quotas or wholly
//! at the new ones.

use std::sync::{Arc, PoisonError, RwLock};

/// A value replaced whole through `&self`, with a version that moves on
/// each replacement (what the HTTP layer compares to re-render its
/// `RateLimit-Policy`).
#[derive(Debug)]
pub(crate) struct Changing<T> {
    now: RwLock<Arc<Versioned<T>>>,
}

/// One snapshot: the value and the number of changes before it.
#[derive(Debug)]
pub(crate) struct Versioned<T> {
    /// Changes so far (0 until the first).
    pub(crate) version: u64,
    value: T,
}

impl<T> std::ops::Deref for Versioned<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T> Changing<T> {
    /// `value` at version 0.
    pub(crate) fn new(value: T) -> Self {
        Changing {
            now: RwLock::new(Arc::new(Versioned { version: 0, value })),
        }
    }

    /// The value now, for one whole call.
    pub(crate) fn get(&self) -> Arc<Versioned<T>> {
        // Nothing panics while the lock is held for writing: a poisoned
        // lock still holds a whole snapshot.
        Arc::clone(&self.now.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Replaces the value, moving the version: calls that begin after this
    /// returns see `value`.
    pub(crate) fn set(&self, value: T) {
        let mut now = self.now.write().unwrap_or_else(PoisonError::into_inner);
        *now = Arc::new(Versioned {
            version: now.version.wrapping_add(1),
            value,
        });
    }
}
