//! envoyproxy/ratelimit's fixed windows in Redis, counted as it counts
//! them: the same keys (`CACHE_KEY_PREFIX` + `domain_key_value_..._` + the
//! window's start in Unix seconds), `INCRBY` then `EXPIRE` of the unit
//! plus up to `EXPIRATION_JITTER_MAX_SECONDS`, every windowed descriptor
//! of a request in **one pipeline** (one round trip; two with
//! `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`, whose `GET`s come first, as
//! there). A fleet moving from the peer keeps its counts mid-window.
//!
//! The pipelines go through the service's one Redis limiter
//! ([`RedisLimiter::query`]): its connection, timeout and circuit breaker,
//! so an outage that fixed windows see opens the breaker GCRA limits use,
//! and the other way round.
//!
//! On a Redis Cluster a pipeline's keys must share a hash slot, so each
//! pass is split there into one pipeline per slot its keys fall in, all
//! in flight at once (as the peer's Cluster client groups its pipeline)
//! and asking the breaker once ([`RedisLimiter::query_each`]): still one
//! round trip of waiting per pass.

use std::collections::hash_map::RandomState;
use std::collections::BTreeMap;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Instant;

use turnstile_rl::redis::{slot, RedisCallError, RedisLimiter};

use crate::over_limit_cache::{OverLimit, OverLimitCache};
use crate::settings::FailurePolicyName;
use crate::window::{charges, unix_now, WindowCount, WindowCounters, WindowHit};

/// The service's fixed windows in Redis, on the service's one Redis
/// limiter's call path.
pub struct RedisWindows {
    redis: Arc<RedisLimiter>,
    prefix: String,
    jitter_max_secs: u64,
    policy: FailurePolicyName,
    /// The counts of `--redis-failure-policy local`.
    local: WindowCounters,
    /// `LOCAL_CACHE_SIZE_IN_BYTES`: keys over their limit in this window.
    cache: Option<Arc<OverLimitCache>>,
}

impl std::fmt::Debug for RedisWindows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisWindows")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// The Redis settings of fixed windows.
#[derive(Clone, Debug)]
pub struct RedisWindowSettings {
    /// `CACHE_KEY_PREFIX`.
    pub prefix: String,
    /// `EXPIRATION_JITTER_MAX_SECONDS`.
    pub jitter_max_secs: u64,
    /// What a request gets when Redis cannot answer.
    pub policy: FailurePolicyName,
    /// The local fallback's size.
    pub max_keys: usize,
    /// The local over-limit cache, if on.
    pub cache: Option<Arc<OverLimitCache>>,
}

impl RedisWindows {
    /// Windows counted through `redis`, the service's limiter.
    pub fn new(settings: RedisWindowSettings, redis: Arc<RedisLimiter>) -> RedisWindows {
        RedisWindows {
            redis,
            prefix: settings.prefix,
            jitter_max_secs: settings.jitter_max_secs,
            policy: settings.policy,
            local: WindowCounters::new(settings.max_keys),
            cache: settings.cache,
        }
    }

    /// Counts one request's windowed descriptors; when Redis cannot answer,
    /// the failure policy decides (open: within, closed: over, local: this
    /// process's counts).
    pub async fn count(&self, hits: &[WindowHit], stop_when_over: bool) -> Vec<WindowCount> {
        if hits.is_empty() {
            return Vec::new();
        }
        let now = unix_now();
        match self.count_in_redis(hits, stop_when_over, now).await {
            Ok(counts) => counts,
            Err(error) => {
                tracing::debug!(%error, "fixed windows: Redis did not answer, the failure policy decides");
                self.fallback(hits, stop_when_over, now)
            }
        }
    }

    async fn count_in_redis(
        &self,
        hits: &[WindowHit],
        stop_when_over: bool,
        now: u64,
    ) -> Result<Vec<WindowCount>, RedisCallError> {
        let keys: Vec<String> = hits
            .iter()
            .map(|h| format!("{}{}{}", self.prefix, h.key, now / h.length * h.length))
            .collect();
        // Keys the cache knows over their limit take no Redis call.
        let sent = Instant::now();
        let cached: Vec<bool> = keys
            .iter()
            .map(|key| {
                self.cache
                    .as_ref()
                    .is_some_and(|c| c.get(&cache_key(key), sent).is_some())
            })
            .collect();
        let asked: Vec<usize> = (0..hits.len()).filter(|&i| !cached[i]).collect();
        let adds: Vec<u64> = if !stop_when_over {
            asked.iter().map(|&i| hits[i].hits).collect()
        } else if asked.len() < hits.len() {
            // As the peer: one descriptor over in the cache, no other is charged.
            vec![0; asked.len()]
        } else {
            let all: Vec<&str> = keys.iter().map(String::as_str).collect();
            let current: Vec<Option<u64>> = self
                .query_by_slot(&all, |pipe, i| {
                    pipe.get(all[i]);
                })
                .await?;
            let current: Vec<u64> = current.into_iter().map(Option::unwrap_or_default).collect();
            charges(hits, &current)
        };
        let mut afters: Vec<u64> = Vec::new();
        if !asked.is_empty() {
            let asked_keys: Vec<&str> = asked.iter().map(|&i| keys[i].as_str()).collect();
            afters = self
                .query_by_slot(&asked_keys, |pipe, at| {
                    let (key, hit) = (asked_keys[at], &hits[asked[at]]);
                    let jitter = match self.jitter_max_secs {
                        0 => 0,
                        max => RandomState::new().hash_one(key) % max,
                    };
                    pipe.incr(key, adds[at])
                        .expire(key, (hit.length + jitter) as i64)
                        .ignore();
                })
                .await?;
        }
        let mut afters = afters.into_iter();
        let mut counts = Vec::with_capacity(hits.len());
        for (i, hit) in hits.iter().enumerate() {
            if cached[i] {
                counts.push(WindowCount::over_by_cache(hit, now));
                continue;
            }
            let count = WindowCount::at(hit, afters.next().unwrap_or_default(), now);
            if let Some(cache) = self.cache.as_ref().filter(|_| count.after > hit.limit) {
                // Over until the window's edge (the key names the window).
                let until = sent + count.until_reset;
                cache.insert(
                    &cache_key(&keys[i]),
                    OverLimit {
                        until,
                        decision: None,
                    },
                    sent,
                );
            }
            counts.push(count);
        }
        Ok(counts)
    }

    /// One reply per key of `keys`, in their order: `command(pipe, i)`
    /// adds key `i`'s commands (one reply not ignored) to a pipeline. One
    /// pipeline on one server; on a Cluster one per hash slot, sent
    /// together ([`RedisLimiter::query_each`]: one breaker call for the
    /// pass, as GCRA's batch). Any pipeline's failure fails the whole
    /// pass, which the failure policy then decides (as one failed
    /// pipeline did).
    async fn query_by_slot<T: redis::FromRedisValue + Default>(
        &self,
        keys: &[&str],
        command: impl Fn(&mut redis::Pipeline, usize),
    ) -> Result<Vec<T>, RedisCallError> {
        let groups = slot_groups(keys, self.redis.is_cluster());
        let pipes: Vec<redis::Pipeline> = groups
            .iter()
            .map(|group| {
                let mut pipe = redis::pipe();
                for &i in group {
                    command(&mut pipe, i);
                }
                pipe
            })
            .collect();
        let replies: Vec<Vec<T>> = self.redis.query_each(&pipes).await?;
        let mut out: Vec<Option<T>> = std::iter::repeat_with(|| None).take(keys.len()).collect();
        for (group, reply) in groups.iter().zip(replies) {
            for (&i, value) in group.iter().zip(reply) {
                out[i] = Some(value);
            }
        }
        Ok(out.into_iter().map(Option::unwrap_or_default).collect())
    }

    fn fallback(&self, hits: &[WindowHit], stop_when_over: bool, now: u64) -> Vec<WindowCount> {
        match self.policy {
            FailurePolicyName::Local => self.local.count(hits, stop_when_over),
            FailurePolicyName::Open => hits
                .iter()
                .map(|h| WindowCount::at(h, h.hits.min(h.limit), now))
                .collect(),
            FailurePolicyName::Closed => hits
                .iter()
                .map(|h| WindowCount::at(h, h.limit.saturating_add(h.hits.max(1)), now))
                .collect(),
        }
    }
}

/// Positions in `keys` grouped so each group's keys share a Cluster hash
/// slot, in order within a group: all in one group when not a Cluster.
fn slot_groups(keys: &[&str], cluster: bool) -> Vec<Vec<usize>> {
    if !cluster {
        return vec![(0..keys.len()).collect()];
    }
    let mut by_slot: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
    for (i, key) in keys.iter().enumerate() {
        by_slot.entry(slot(key.as_bytes())).or_default().push(i);
    }
    by_slot.into_values().collect()
}

/// A fixed window's key in the over-limit cache (GCRA keys there start
/// otherwise, so the two never meet).
fn cache_key(redis_key: &str) -> String {
    format!("w:{redis_key}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_grouped_by_slot_on_a_cluster_only() {
        // "foo" and "bar" are in different slots; a hash tag joins keys.
        let keys = ["foo", "bar", "{foo}x", "{bar}y"];
        assert_eq!(slot_groups(&keys, false), vec![vec![0, 1, 2, 3]]);
        let groups = slot_groups(&keys, true);
        assert_eq!(groups.len(), 2, "{groups:?}");
        assert!(groups.contains(&vec![0, 2]), "{groups:?}");
        assert!(groups.contains(&vec![1, 3]), "{groups:?}");
    }
}
