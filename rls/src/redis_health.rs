//! Redis' state as a log reads it: lost, breaker opened, breaker closed,
//! back. `RedisLimiter` counts these in its metrics; [`RedisHealth`] turns
//! two readings of them into the events between, and [`log_redis_health`]
//! reads the service's one Redis path once a second.

use std::sync::Arc;
use std::time::Duration;

use turnstile_rl::redis::MetricsSnapshot;

use crate::engine::Engine;

/// What happened to a Redis limit between two readings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedisEvent {
    /// Calls started failing (errors or timeouts).
    Lost,
    /// The breaker opened: calls are no longer sent.
    BreakerOpened,
    /// The breaker closed after a successful probe.
    BreakerClosed,
    /// Calls succeed again after failing.
    Back,
}

/// One limit's last reading, and whether Redis was lost at it.
#[derive(Clone, Debug, Default)]
pub struct RedisHealth {
    last: MetricsSnapshot,
    lost: bool,
}

impl RedisHealth {
    /// The events between the last reading and `now`, in the order they
    /// happen in an outage.
    pub fn observe(&mut self, now: MetricsSnapshot) -> Vec<RedisEvent> {
        let failures = |m: &MetricsSnapshot| m.redis_errors + m.timeouts;
        let successes = |m: &MetricsSnapshot| m.redis_calls.saturating_sub(failures(m));
        let mut events = Vec::new();
        let failed = failures(&now) > failures(&self.last);
        let succeeded = successes(&now) > successes(&self.last);
        if failed && !self.lost {
            events.push(RedisEvent::Lost);
            self.lost = true;
        }
        if now.breaker_opened > self.last.breaker_opened {
            events.push(RedisEvent::BreakerOpened);
        }
        if now.breaker_closed > self.last.breaker_closed {
            events.push(RedisEvent::BreakerClosed);
        }
        // Back: a success and no failure since the last reading.
        if self.lost && succeeded && !failed {
            events.push(RedisEvent::Back);
            self.lost = false;
        }
        self.last = now;
        events
    }
}

/// Logs the Redis events of the service's Redis (one connection and
/// breaker for every GCRA limit) every `interval`, forever.
pub async fn log_redis_health(engine: Arc<Engine>, interval: Duration) {
    let mut health = RedisHealth::default();
    let mut ticks = tokio::time::interval(interval);
    loop {
        ticks.tick().await;
        let Some(metrics) = engine.redis_metrics() else {
            return;
        };
        for event in health.observe(metrics) {
            match event {
                RedisEvent::Lost => {
                    tracing::error!("Redis lost: calls fail, the failure policy decides")
                }
                RedisEvent::BreakerOpened => {
                    tracing::warn!("Redis breaker opened: no calls until a probe succeeds")
                }
                RedisEvent::BreakerClosed => tracing::info!("Redis breaker closed"),
                RedisEvent::Back => tracing::info!("Redis back: calls succeed again"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_reads_lost_opened_closed_back() {
        let mut health = RedisHealth::default();
        let mut m = MetricsSnapshot::default();
        m.redis_calls = 5;
        assert!(health.observe(m).is_empty(), "healthy calls say nothing");
        m.redis_calls = 8;
        m.redis_errors = 2;
        m.timeouts = 1;
        m.breaker_opened = 1;
        assert_eq!(
            health.observe(m),
            [RedisEvent::Lost, RedisEvent::BreakerOpened]
        );
        m.redis_calls = 9;
        m.redis_errors = 3;
        assert!(health.observe(m).is_empty(), "still lost: said once");
        m.redis_calls = 11;
        m.breaker_closed = 1;
        assert_eq!(
            health.observe(m),
            [RedisEvent::BreakerClosed, RedisEvent::Back]
        );
    }
}
