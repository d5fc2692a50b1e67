//! envoyproxy/ratelimit's local over-limit cache
//! (`LOCAL_CACHE_SIZE_IN_BYTES`): keys Redis has answered over their
//! limit are answered over their limit here, with no Redis call, until
//! their refusal ends.
//!
//! It never refuses what Redis would admit. A fixed window's count only
//! grows until the window ends, and its key names the window, so a key
//! over its limit stays over for the rest of it. A GCRA key refused a
//! single hit stays refused until the decision's `retry_after`, counted
//! from before the call was sent (Redis read its clock later): other
//! instances' admissions only push that later, and a refusal costs
//! nothing in Redis, so skipping the call changes nothing there.
//!
//! Bounded by bytes as the peer's `freecache` is: each entry counts its
//! key's length plus [`ENTRY_BYTES`]. A full shard first drops its ended
//! entries; if that frees no room, the new key is not cached (a missed
//! shortcut, never a wrong answer).

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use turnstile_rl::Decision;

const SHARDS: usize = 16;

/// What one entry costs besides its key: the map's slot, the instant, the
/// decision and the string's header, rounded up.
pub const ENTRY_BYTES: usize = 96;

/// The smallest cache, whatever the size asked: `freecache`'s (the peer's
/// cache) 512 KiB. The peer's own integration test asks for 1,000 bytes
/// and gets this; 1,000 bytes would hold a few keys at most here.
pub const MIN_BYTES: usize = 512 * 1024;

/// The keys known over their limit, until when.
#[derive(Debug)]
pub struct OverLimitCache {
    shards: Vec<Mutex<Shard>>,
    bytes_per_shard: usize,
    hits: AtomicU64,
    misses: AtomicU64,
    expired: AtomicU64,
}

/// The cache's statistics, as the peer's `freecache` keeps them and the
/// peer exports them (`ratelimit.localcache.*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups that found a key over its limit.
    pub hits: u64,
    /// Lookups that found none (ended ones included).
    pub misses: u64,
    /// Lookups that found a key whose refusal had ended.
    pub expired: u64,
    /// Keys held now.
    pub entries: u64,
}

#[derive(Debug, Default)]
struct Shard {
    entries: HashMap<String, OverLimit>,
    bytes: usize,
}

/// A key's refusal: until when, and the decision that refused it (GCRA).
#[derive(Clone, Copy, Debug)]
pub struct OverLimit {
    /// When the refusal ends.
    pub until: Instant,
    /// The GCRA decision Redis refused with (`None` for a fixed window).
    pub decision: Option<Decision>,
}

impl OverLimitCache {
    /// A cache of about `size_in_bytes`, at least [`MIN_BYTES`] as the
    /// peer's; `None` for 0 (the peer's default: off).
    pub fn new(size_in_bytes: usize) -> Option<OverLimitCache> {
        (size_in_bytes > 0).then(|| OverLimitCache::exactly(size_in_bytes.max(MIN_BYTES)))
    }

    fn exactly(size_in_bytes: usize) -> OverLimitCache {
        OverLimitCache {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            bytes_per_shard: size_in_bytes.div_ceil(SHARDS),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            expired: AtomicU64::new(0),
        }
    }

    /// The statistics now.
    pub fn stats(&self) -> CacheStats {
        let entries = self
            .shards
            .iter()
            .map(|s| {
                s.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entries
                    .len() as u64
            })
            .sum();
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            expired: self.expired.load(Ordering::Relaxed),
            entries,
        }
    }

    fn shard(&self, key: &str) -> std::sync::MutexGuard<'_, Shard> {
        let mut hasher = DefaultHasher::new();
        key.hash(&mut hasher);
        // A panic never leaves a shard half-written: poisoning carries no meaning.
        self.shards[hasher.finish() as usize % SHARDS]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// `key`'s refusal, if it still holds at `now`.
    pub fn get(&self, key: &str, now: Instant) -> Option<OverLimit> {
        let mut shard = self.shard(key);
        let Some(entry) = shard.entries.get(key).copied() else {
            self.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        if entry.until > now {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Some(entry);
        }
        shard.remove(key);
        self.expired.fetch_add(1, Ordering::Relaxed);
        self.misses.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// Remembers that `key` is over its limit until `entry.until`.
    pub fn insert(&self, key: &str, entry: OverLimit, now: Instant) {
        if entry.until <= now {
            return;
        }
        let cost = key.len() + ENTRY_BYTES;
        let mut shard = self.shard(key);
        shard.remove(key);
        if shard.bytes + cost > self.bytes_per_shard {
            let ended: Vec<String> = shard
                .entries
                .iter()
                .filter(|(_, e)| e.until <= now)
                .map(|(k, _)| k.clone())
                .collect();
            for k in ended {
                shard.remove(&k);
            }
            if shard.bytes + cost > self.bytes_per_shard {
                return;
            }
        }
        shard.bytes += cost;
        shard.entries.insert(key.to_owned(), entry);
    }
}

impl Shard {
    fn remove(&mut self, key: &str) {
        if self.entries.remove(key).is_some() {
            self.bytes -= key.len() + ENTRY_BYTES;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn until(at: Instant) -> OverLimit {
        OverLimit {
            until: at,
            decision: None,
        }
    }

    #[test]
    fn an_entry_holds_until_its_end_then_goes() {
        let cache = OverLimitCache::new(1 << 20).unwrap();
        let now = Instant::now();
        let end = now + Duration::from_secs(5);
        cache.insert("k", until(end), now);
        assert!(cache.get("k", now).is_some());
        assert!(cache.get("k", end - Duration::from_nanos(1)).is_some());
        assert!(cache.get("k", end).is_none());
        assert!(cache.get("k", now).is_none(), "gone once ended");
        assert!(OverLimitCache::new(0).is_none(), "0 is off, as the peer's");
    }

    #[test]
    fn lookups_are_counted_as_freecache_counts_them() {
        let cache = OverLimitCache::new(1 << 20).unwrap();
        let now = Instant::now();
        let end = now + Duration::from_secs(5);
        assert!(cache.get("k", now).is_none());
        cache.insert("k", until(end), now);
        assert!(cache.get("k", now).is_some());
        assert!(cache.get("k", end).is_none(), "ended");
        let stats = cache.stats();
        assert_eq!(
            stats,
            CacheStats {
                hits: 1,
                misses: 2,
                expired: 1,
                entries: 0
            }
        );
    }

    #[test]
    fn a_small_size_is_the_peers_minimum() {
        // The peer's integration test's 1,000 bytes hold what 512 KiB hold.
        let cache = OverLimitCache::new(1_000).unwrap();
        let now = Instant::now();
        let later = now + Duration::from_secs(60);
        let keys: Vec<String> = (0..1_000)
            .map(|i| format!("another_key2_local_{i}_1796414460"))
            .collect();
        for k in &keys {
            cache.insert(k, until(later), now);
        }
        assert!(keys.iter().all(|k| cache.get(k, now).is_some()));
    }

    #[test]
    fn a_full_cache_drops_ended_entries_then_refuses_new_ones() {
        // One entry per shard at most.
        let cache = OverLimitCache::exactly(SHARDS * (ENTRY_BYTES + 8));
        let now = Instant::now();
        let later = now + Duration::from_secs(60);
        let keys: Vec<String> = (0..200).map(|i| format!("key{i:05}")).collect();
        for k in &keys {
            cache.insert(k, until(later), now);
        }
        let held = keys.iter().filter(|k| cache.get(k, now).is_some()).count();
        assert!((1..=SHARDS).contains(&held), "{held}");
        // Once those end, new keys take their room.
        let after = later + Duration::from_secs(1);
        for k in &keys {
            cache.insert(k, until(after + Duration::from_secs(60)), after);
        }
        let held = keys
            .iter()
            .filter(|k| cache.get(k, after).is_some())
            .count();
        assert!((1..=SHARDS).contains(&held), "{held}");
    }
}
