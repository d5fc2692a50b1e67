//! Leases: local batching of Redis tokens, for fewer round trips. What they
//! do and the error bound they keep are in the docs of
//! `RedisLimiterBuilder::lease`.

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::clock::saturating_nanos;
use crate::decision::Decision;

/// One gateway's unspent tokens of one key.
#[derive(Debug, Clone, Copy)]
struct Lease {
    tokens: u64,
    expires: Instant,
    /// When the Redis bucket was full again, as of the grant.
    resets: Instant,
}

/// The local leases of one limiter.
#[derive(Debug)]
pub(crate) struct Leases {
    /// Tokens asked of Redis per round trip.
    size: u64,
    ttl: Duration,
    map: Mutex<LeaseMap>,
}

#[derive(Debug, Default)]
struct LeaseMap {
    leases: HashMap<Vec<u8>, Lease>,
    /// Keys whose lease is being fetched from Redis now, and how the
    /// checks waiting for it hear that it arrived.
    fetching: HashMap<Vec<u8>, Arc<Notify>>,
    /// Sweep when the map is larger than this.
    sweep_above: usize,
}

/// A lease fetch in flight: dropping it (once the reply is kept, or the
/// call failed) wakes the checks waiting for it.
#[derive(Debug)]
pub(crate) struct FetchGuard<'a> {
    leases: &'a Leases,
    key: Vec<u8>,
}

impl Drop for FetchGuard<'_> {
    fn drop(&mut self) {
        if let Some(notify) = self.leases.lock().fetching.remove(&self.key) {
            notify.notify_waiters();
        }
    }
}

/// The smallest map size that triggers a sweep.
const MIN_SWEEP: usize = 1_024;

impl Leases {
    pub(crate) fn new(size: u64, ttl: Duration) -> Self {
        Leases {
            size,
            ttl,
            map: Mutex::new(LeaseMap {
                leases: HashMap::new(),
                fetching: HashMap::new(),
                sweep_above: MIN_SWEEP,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, LeaseMap> {
        // Every write leaves a valid map: poisoning carries no meaning.
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Tokens asked of Redis per round trip.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// Tokens to ask of Redis for a request of cost `n`.
    pub(crate) fn want(&self, n: u64) -> u64 {
        self.size.max(n)
    }

    /// Spends `n` leased tokens of `key` at `now`, if this gateway holds
    /// that many: the decision, or `None` to ask Redis.
    pub(crate) fn spend(
        &self,
        key: &[u8],
        n: u64,
        now: Instant,
        limit: u64,
        interval: NonZeroU64,
    ) -> Option<Decision> {
        let mut map = self.lock();
        let lease = map.leases.get_mut(key)?;
        if lease.expires <= now || lease.tokens < n {
            // Expired tokens are dropped: stricter, never looser.
            if lease.expires <= now {
                map.leases.remove(key);
            }
            return None;
        }
        lease.tokens -= n;
        let left = lease.tokens;
        let reset = saturating_nanos(lease.resets.saturating_duration_since(now));
        if left == 0 {
            map.leases.remove(key);
        }
        Some(Decision::allowed(
            limit,
            left.saturating_mul(interval.get()),
            interval,
            reset,
        ))
    }

    /// The fetch of `key`'s next lease in flight now, if any.
    pub(crate) fn in_flight(&self, key: &[u8]) -> Option<Arc<Notify>> {
        self.lock().fetching.get(key).cloned()
    }

    /// For a check of `key` that found no tokens: this check fetches its
    /// next lease (the guard), unless another already is (`None`). Checks
    /// that run out while it is on its way wait for it, so a key costs one
    /// Redis call per lease, not one per check that found it empty.
    pub(crate) fn fetch(&self, key: &[u8]) -> Option<FetchGuard<'_>> {
        let mut map = self.lock();
        if map.fetching.contains_key(key) {
            return None;
        }
        map.fetching.insert(key.to_vec(), Arc::new(Notify::new()));
        Some(FetchGuard {
            leases: self,
            key: key.to_vec(),
        })
    }

    /// Waits until the fetch `notify` stands for is over (or `timeout`).
    pub(crate) async fn wait(&self, key: &[u8], notify: &Notify, timeout: Duration) {
        let notified = notify.notified();
        tokio::pin!(notified);
        // Registered before looking again, so a fetch that ends in between
        // is not missed.
        notified.as_mut().enable();
        let still = self
            .lock()
            .fetching
            .get(key)
            .is_some_and(|n| std::ptr::eq(&**n, notify));
        if still {
            let _ = tokio::time::timeout(timeout, notified).await;
        }
    }

    /// Keeps `extra` tokens that Redis granted beyond the cost, capped so
    /// that this gateway never holds more than `size − 1` of a key.
    /// Returns the tokens kept.
    pub(crate) fn keep(&self, key: &[u8], extra: u64, now: Instant, reset_after: Duration) -> u64 {
        if extra == 0 {
            return 0;
        }
        let cap = self.size - 1;
        let mut map = self.lock();
        if map.leases.len() > map.sweep_above {
            map.leases.retain(|_, lease| lease.expires > now);
            map.sweep_above = (map.leases.len() * 2).max(MIN_SWEEP);
        }
        let lease = map.leases.entry(key.to_vec()).or_insert(Lease {
            tokens: 0,
            expires: now,
            resets: now,
        });
        if lease.expires <= now {
            lease.tokens = 0;
        }
        // Tokens above the cap are dropped (they stay taken in Redis):
        // the bound holds even when two checks of one key lease at once.
        lease.tokens = lease.tokens.saturating_add(extra).min(cap);
        lease.expires = now + self.ttl;
        lease.resets = now + reset_after;
        lease.tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: NonZeroU64 = NonZeroU64::MIN;

    #[test]
    fn leased_tokens_are_spent_then_asked_for_again() {
        let leases = Leases::new(10, Duration::from_secs(1));
        let now = Instant::now();
        assert_eq!(leases.spend(b"k", 1, now, 100, T), None);
        assert_eq!(leases.want(1), 10);
        assert_eq!(leases.keep(b"k", 9, now, Duration::ZERO), 9);
        for left in (0..9).rev() {
            let d = leases.spend(b"k", 1, now, 100, T).unwrap();
            assert!(d.is_allowed());
            assert_eq!(d.remaining(), left);
        }
        assert_eq!(leases.spend(b"k", 1, now, 100, T), None);
    }

    #[test]
    fn a_gateway_never_holds_more_than_k_minus_1_and_expired_tokens_go() {
        let leases = Leases::new(10, Duration::from_secs(1));
        let now = Instant::now();
        assert_eq!(leases.keep(b"k", 9, now, Duration::ZERO), 9);
        assert_eq!(leases.keep(b"k", 9, now, Duration::ZERO), 9);
        assert_eq!(leases.spend(b"k", 10, now, 100, T), None);
        let later = now + Duration::from_secs(1);
        assert_eq!(leases.spend(b"k", 1, later, 100, T), None);
        assert_eq!(leases.keep(b"k", 3, later, Duration::ZERO), 3);
    }
}
