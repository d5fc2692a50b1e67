//! `WindowCounters`: envoyproxy/ratelimit's fixed windows, in this process.
//!
//! The peer counts each descriptor in a window aligned to the Unix clock
//! (`now / unit * unit`), adds every hit to the window's counter (refused
//! ones too, unless `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`), and calls a
//! descriptor over its limit when the counter after the hits exceeds it.
//! These counters are its Redis `INCRBY`, held here: one counter per cache
//! key (`domain_key_value_..._`), reset when its window passes.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const SHARDS: usize = 16;

/// The fixed-window counters of every limit of the service.
#[derive(Debug)]
pub struct WindowCounters {
    shards: Vec<Mutex<HashMap<String, Window>>>,
    max_per_shard: usize,
}

#[derive(Clone, Copy, Debug)]
struct Window {
    /// Unix second the window starts at.
    start: u64,
    /// Its length in seconds.
    length: u64,
    count: u64,
}

/// One descriptor's part of a request, counted in a fixed window.
#[derive(Clone, Debug)]
pub struct WindowHit {
    /// The peer's cache key without its window suffix.
    pub key: String,
    /// The window's length in seconds (the limit's unit).
    pub length: u64,
    /// The hits to add (`0` only looks).
    pub hits: u64,
    /// The limit (`requests_per_unit`).
    pub limit: u64,
}

/// What the counter read, as the peer's `limitBeforeIncrease` and
/// `limitAfterIncrease`, and the time left in the window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowCount {
    /// The counter before this request's hits (the peer's unsigned
    /// subtraction `after - hits`, wrapping as there).
    pub before: u64,
    /// The counter after them.
    pub after: u64,
    /// Until the window's edge, in whole seconds as the peer answers.
    pub until_reset: Duration,
    /// Answered by the local over-limit cache (`LOCAL_CACHE_SIZE_IN_BYTES`),
    /// with no Redis call and no hit counted there.
    pub cached: bool,
}

impl WindowCount {
    /// The count of `hit` that reads `after` at `now`.
    pub fn at(hit: &WindowHit, after: u64, now: u64) -> WindowCount {
        WindowCount {
            before: after.wrapping_sub(hit.hits),
            after,
            until_reset: Duration::from_secs(hit.length - now % hit.length),
            cached: false,
        }
    }

    /// The count of `hit` the over-limit cache answers: over the limit
    /// before its hits (so they all count as over, as the peer counts
    /// them), at `now`.
    pub fn over_by_cache(hit: &WindowHit, now: u64) -> WindowCount {
        let before = hit.limit.saturating_add(1);
        WindowCount {
            cached: true,
            ..WindowCount::at(hit, before.saturating_add(hit.hits), now)
        }
    }
}

/// What each descriptor is charged under `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`,
/// given the counts before the request (the peer's `getHitsAddend`): all
/// its hits, unless another descriptor of the request would go over and
/// this one would not.
pub(crate) fn charges(hits: &[WindowHit], current: &[u64]) -> Vec<u64> {
    let over: Vec<bool> = hits
        .iter()
        .zip(current)
        .map(|(h, c)| c + h.hits > h.limit)
        .collect();
    let any_over = over.iter().any(|o| *o);
    hits.iter()
        .zip(&over)
        .map(|(h, &o)| if !any_over || o { h.hits } else { 0 })
        .collect()
}

impl WindowCounters {
    /// Counters for at most about `max_keys` keys (expired windows are
    /// dropped first when a shard is full, then arbitrary ones).
    pub fn new(max_keys: usize) -> WindowCounters {
        WindowCounters {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            max_per_shard: max_keys.div_ceil(SHARDS).max(1),
        }
    }

    /// Counts one request's windowed descriptors at once, as the peer's
    /// `DoLimit` does: with `stop_when_over`, when any of them would go
    /// over, only those that would are incremented.
    pub fn count(&self, hits: &[WindowHit], stop_when_over: bool) -> Vec<WindowCount> {
        let now = unix_now();
        let adds: Vec<u64> = if stop_when_over {
            let current: Vec<u64> = hits.iter().map(|h| self.add(h, 0, now)).collect();
            charges(hits, &current)
        } else {
            hits.iter().map(|h| h.hits).collect()
        };
        hits.iter()
            .zip(adds)
            .map(|(h, add)| WindowCount::at(h, self.add(h, add, now), now))
            .collect()
    }

    /// Adds `n` to `hit`'s counter in the window of `now`; the new count.
    fn add(&self, hit: &WindowHit, n: u64, now: u64) -> u64 {
        let start = now / hit.length * hit.length;
        let mut hasher = DefaultHasher::new();
        hit.key.hash(&mut hasher);
        let shard = &self.shards[hasher.finish() as usize % SHARDS];
        let mut map = shard.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(window) = map.get_mut(&hit.key) {
            if window.start != start || window.length != hit.length {
                *window = Window {
                    start,
                    length: hit.length,
                    count: 0,
                };
            }
            window.count = window.count.saturating_add(n);
            return window.count;
        }
        if map.len() >= self.max_per_shard {
            map.retain(|_, w| w.start + w.length > now);
            while map.len() >= self.max_per_shard {
                let Some(victim) = map.keys().next().cloned() else {
                    break;
                };
                map.remove(&victim);
            }
        }
        map.insert(
            hit.key.clone(),
            Window {
                start,
                length: hit.length,
                count: n,
            },
        );
        n
    }
}

/// Unix seconds now.
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(key: &str, hits: u64, limit: u64) -> WindowHit {
        WindowHit {
            key: key.into(),
            length: 365 * 86_400,
            hits,
            limit,
        }
    }

    #[test]
    fn refused_hits_count_unless_stopped() {
        let counters = WindowCounters::new(100);
        let first = counters.count(&[hit("a", 4, 3)], false)[0];
        assert_eq!((first.before, first.after), (0, 4));
        assert_eq!(counters.count(&[hit("a", 1, 3)], false)[0].after, 5);
        // Stopped: the descriptor that stays within is not charged when
        // another of the request goes over; the one over still is.
        let stopped = WindowCounters::new(100);
        let both = stopped.count(&[hit("x", 1, 10), hit("y", 4, 3)], true);
        assert_eq!((both[0].after, both[1].after), (0, 4));
        assert_eq!(
            both[0].before,
            0u64.wrapping_sub(1),
            "wraps as the peer's uint64"
        );
    }

    #[test]
    fn a_full_shard_forgets_rather_than_grows() {
        let counters = WindowCounters::new(SHARDS);
        for i in 0..1000 {
            counters.count(&[hit(&format!("k{i}"), 1, 5)], false);
        }
        let held: usize = counters
            .shards
            .iter()
            .map(|s| s.lock().expect("lock").len())
            .sum();
        assert!(held <= SHARDS, "{held} held");
    }
}
