//! The connection to Redis: one server (through a `ConnectionManager`) or
//! a Cluster. Both reconnect by themselves when Redis comes back.

use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{RedisResult, ScriptInvocation};

/// Where the buckets live.
#[derive(Clone)]
pub(crate) enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Connection::Single(_) => "Connection::Single",
            Connection::Cluster(_) => "Connection::Cluster",
        })
    }
}

/// Connection attempts a call retries after the first fails: none. A
/// retry inside a call only makes it wait (backing off from 10 ms, four
/// retries took about 250 ms against a closed port, and a call with the
/// default timeout ended as a timeout instead of a refused connection);
/// each call tries to connect once, and the circuit breaker, not the
/// call, decides how often Redis is tried while it is away.
const RECONNECT_RETRIES: usize = 0;

impl Connection {
    /// A connection to one server at `url`, made on first use: a limiter
    /// can start while Redis is down (its failure policy decides until
    /// Redis is up).
    pub(crate) fn single(url: &str, timeout: Duration) -> RedisResult<Self> {
        let client = redis::Client::open(url)?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(RECONNECT_RETRIES);
        let manager = ConnectionManager::new_lazy_with_config(client, config)?;
        Ok(Connection::Single(manager))
    }

    /// A connection to the Cluster that `nodes` belong to (it learns the
    /// slot map from them, so the Cluster must be up).
    pub(crate) async fn cluster(nodes: &[String], timeout: Duration) -> RedisResult<Self> {
        let client = ClusterClient::builder(nodes.iter().map(String::as_str))
            .connection_timeout(timeout)
            .response_timeout(timeout)
            .retries(2)
            .build()?;
        Ok(Connection::Cluster(client.get_async_connection().await?))
    }

    /// Whether this is a Cluster: a call's keys must then share a slot.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Connection::Cluster(_))
    }

    /// Runs the script.
    pub(crate) async fn query<T: redis::FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
    ) -> RedisResult<T> {
        match self {
            Connection::Single(manager) => pipe.query_async(&mut manager.clone()).await,
            Connection::Cluster(cluster) => pipe.query_async(&mut cluster.clone()).await,
        }
    }

    pub(crate) async fn invoke(&self, call: &ScriptInvocation<'_>) -> RedisResult<Vec<i64>> {
        match self {
            Connection::Single(manager) => call.invoke_async(&mut manager.clone()).await,
            Connection::Cluster(cluster) => call.invoke_async(&mut cluster.clone()).await,
        }
    }
}

/// Redis Cluster's hash slot of `key`: CRC16 (XMODEM) of its hash tag (the
/// bytes between the first `{` and the next `}`, when not empty) or of the
/// whole key, modulo 16384, as the Cluster specification defines it.
///
/// For callers that send their own commands through
/// [`RedisLimiter::query`](super::RedisLimiter::query): on a Cluster a
/// pipeline's keys must share a slot, so group them by this.
///
/// ```
/// use turnstile_rl::redis::slot;
/// assert_eq!(slot(b"foo"), 12_182);
/// assert_eq!(slot(b"{user1}:a"), slot(b"{user1}:b"));
/// ```
pub fn slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        Some(&rest[..close]).filter(|tag| !tag.is_empty())
    });
    crc16(tagged.unwrap_or(key)) % 16_384
}

/// CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc = 0u16;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_cluster_specification() {
        // The specification's check value, and slots redis-cli reports.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot(b"foo"), 12_182);
        assert_eq!(slot(b"bar"), 5_061);
        // A hash tag picks the slot; an empty one does not count.
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % 16_384);
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
    }
}
