//! A quota changed while serving: one rule for every limiter (`Quota`'s
//! "Changing a quota while serving"). The same timeline runs through the
//! direct, keyed, keyed multi-limit and multi-limit limiters, a
//! `RedisLimiter` and a `RedisMulti` on a real `redis-server` (client
//! time, one manual clock), and every step must get the same decision from each, with a
//! `retry_after` that a caller who waits exactly that long is admitted by.
#![cfg(feature = "redis")]

use turnstile_test_kit::redis_server::RedisServer;

use std::sync::Arc;
use std::time::Duration;

use turnstile_rl::redis::{RedisBuildError, RedisLimiter, RedisMulti, TimeSource};
use turnstile_rl::{
    DirectLimiter, KeyedLimiter, KeyedMultiLimiter, ManualClock, MultiLimiter, Quota, Quotas,
    QuotasError,
};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// One limiter of each kind, on one clock, all changed together.
struct Limiters {
    direct: DirectLimiter<ManualClock>,
    keyed: KeyedLimiter<u64, ManualClock>,
    keyed_multi: KeyedMultiLimiter<u64, ManualClock>,
    multi: MultiLimiter<ManualClock>,
    redis: RedisLimiter,
    /// The fleet's multi-limit, of one limit here (its buckets are
    /// `quota-change:{k}:0`, beside the single limiter's `quota-change:k`).
    redis_multi: RedisMulti,
}

impl Limiters {
    async fn new(
        server: &RedisServer,
        quota: &str,
        clock: &ManualClock,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let parsed: Quota = quota.parse()?;
        let quotas: Quotas = quota.parse()?;
        let redis = RedisLimiter::builder(parsed)
            .url(server.url())
            .prefix("quota-change:")
            .timeout(Duration::from_secs(2))
            .time_source(TimeSource::Client(Arc::new(clock.clone())))
            .build()
            .await?;
        Ok(Limiters {
            direct: DirectLimiter::builder(parsed).clock(clock.clone()).build(),
            keyed: KeyedLimiter::builder(parsed).clock(clock.clone()).build(),
            keyed_multi: KeyedMultiLimiter::builder(quotas.clone())
                .clock(clock.clone())
                .build(),
            multi: MultiLimiter::builder(quotas.clone())
                .clock(clock.clone())
                .build(),
            redis_multi: redis.multi(quotas)?,
            redis,
        })
    }

    /// Every limiter's quota, through `&self`.
    fn set_quota(&self, quota: &str) -> TestResult {
        let parsed: Quota = quota.parse()?;
        self.direct.set_quota(parsed);
        self.keyed.set_quota(parsed);
        self.keyed_multi.set_quotas(quota.parse()?)?;
        self.multi.set_quotas(quota.parse()?)?;
        self.redis.set_quota(parsed)?;
        self.redis_multi.set_quotas(quota.parse()?)?;
        Ok(())
    }

    /// A check of cost `n` on each: the decisions must agree; returns
    /// (allowed, remaining, retry_after).
    async fn check_n(
        &self,
        n: u64,
        step: &str,
    ) -> Result<(bool, u64, Option<Duration>), Box<dyn std::error::Error>> {
        let direct = self.direct.check_n(n)?;
        let answers = [
            ("keyed", self.keyed.check_n(&1, n)?),
            ("keyed multi", self.keyed_multi.check_n(&1, n)?.decision()),
            ("multi", self.multi.check_n(n)?.decision()),
            ("redis", self.redis.check_n("k", n).await?),
            (
                "redis multi",
                self.redis_multi.check_n("k", n).await?.decision(),
            ),
        ];
        for (name, decision) in answers {
            assert_eq!(
                decision, direct,
                "{step}: {name} disagrees with the direct limiter"
            );
        }
        Ok((
            direct.is_allowed(),
            direct.remaining(),
            direct.retry_after(),
        ))
    }
}

const S: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_smaller_burst_is_one_rule_for_every_limiter_and_its_retry_after_is_honoured(
) -> TestResult {
    let server = RedisServer::start()?;
    // Whole microseconds (T = 6 s), so Redis rounds nothing; the clock
    // starts well after 0, as a real one does.
    let clock = ManualClock::starting_at(Duration::from_secs(1_000));
    let limiters = Limiters::new(&server, "10/min", &clock).await?;

    // The timeline: spend all 10 of 10/min (TAT = now + 60 s)...
    assert_eq!(limiters.check_n(10, "spend 10").await?, (true, 0, None));
    // ...then a burst of 2 (tau' = 12 s): the 60 s owed stay owed, and the
    // first token comes when the debt is within 12 s, plus one T: 54 s.
    limiters.set_quota("10/min burst 2")?;
    let wait = Some(54 * S);
    assert_eq!(
        limiters.check_n(1, "right after the change").await?,
        (false, 0, wait)
    );

    // Six seconds on (where the old direct limiter, which clamped, said
    // yes): still 48 s to wait, the same for all.
    clock.advance(6 * S);
    assert_eq!(
        limiters.check_n(1, "6 s later").await?,
        (false, 0, Some(48 * S))
    );

    // One microsecond short of the advertised time: denied, 1 µs to go.
    clock.advance(48 * S - Duration::from_micros(1));
    let short = (false, 0, Some(Duration::from_micros(1)));
    assert_eq!(limiters.check_n(1, "1 us short").await?, short);

    // Exactly the advertised time: admitted, the new bucket now empty.
    clock.advance(Duration::from_micros(1));
    assert_eq!(
        limiters.check_n(1, "at the advertised time").await?,
        (true, 0, None)
    );
    let next = limiters.check_n(1, "the next one").await?;
    assert_eq!(next, (false, 0, Some(6 * S)), "then one token per T = 6 s");
    clock.advance(6 * S);
    assert_eq!(limiters.check_n(1, "one T later").await?, (true, 0, None));

    // A larger burst: what was spent stays spent, the room above it is
    // there at once (TAT = now + 12 s, two tokens owed; tau'' = 60 s: this
    // one admitted, 7 left).
    limiters.set_quota("10/min")?;
    assert_eq!(
        limiters.check_n(1, "burst back to 10").await?,
        (true, 7, None)
    );
    Ok(())
}

/// A bad change is an error and changes nothing, for every limiter that
/// can refuse one: another number of limits, or a quota the Redis script
/// cannot hold in whole microseconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_change_is_an_error_not_a_panic() -> TestResult {
    let server = RedisServer::start()?;
    let clock = ManualClock::starting_at(Duration::from_secs(1_000));
    let limiters = Limiters::new(&server, "10/min", &clock).await?;
    assert!(limiters
        .keyed_multi
        .set_quotas("10/min; 100/h".parse()?)
        .is_err());
    assert!(limiters.multi.set_quotas("10/min; 100/h".parse()?).is_err());
    // 2,000,000/s: T = 500 ns, under the script's microsecond.
    assert!(limiters.redis.set_quota("2000000/s".parse()?).is_err());
    assert_eq!(limiters.redis.quota(), "10/min".parse()?);
    assert_eq!(limiters.redis.quota_version(), 0);
    assert_eq!(limiters.keyed_multi.quota_version(), 0);
    // The fleet's multi-limit: another count, or a quota the script cannot
    // hold, is refused and changes nothing (quotas, version, buckets).
    assert!(matches!(
        limiters.redis_multi.set_quotas("10/min; 100/h".parse()?),
        Err(RedisBuildError::Quotas(QuotasError::CountChanged {
            limits: 1,
            given: 2
        }))
    ));
    assert!(matches!(
        limiters.redis_multi.set_quotas("2000000/s".parse()?),
        Err(RedisBuildError::Unrepresentable { .. })
    ));
    assert_eq!(limiters.redis_multi.quotas(), "10/min".parse()?);
    assert_eq!(limiters.redis_multi.quota_version(), 0);
    assert_eq!(limiters.check_n(10, "unchanged").await?, (true, 0, None));
    Ok(())
}

/// Two limits: the fleet's multi-limit and the local keyed one take the
/// same decisions (binding limit, remaining, waits) through changes to
/// each limit, a smaller burst on one and a larger rate on the other,
/// since each Redis bucket is keyed by its limit's position and keeps its
/// state across the change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_multi_limit_follows_a_change_as_the_keyed_multi_limiter_does() -> TestResult {
    let server = RedisServer::start()?;
    let clock = ManualClock::starting_at(Duration::from_secs(1_000));
    let quotas: Quotas = "10/min; 30/h".parse()?;
    let local = KeyedMultiLimiter::builder(quotas.clone())
        .clock(clock.clone())
        .build();
    let redis = RedisLimiter::builder("1/s".parse()?)
        .url(server.url())
        .prefix("quota-change-two:")
        .timeout(Duration::from_secs(2))
        .time_source(TimeSource::Client(Arc::new(clock.clone())))
        .build()
        .await?
        .multi(quotas)?;
    let same = |step: &'static str| {
        let (local, redis) = (&local, &redis);
        async move {
            let l = local.check_n(&1, 2)?;
            let r = redis.check_n("k", 2).await?;
            assert_eq!(r, l, "{step}");
            assert_eq!(
                redis.peek_n("k", 1).await?,
                local.peek_n(&1, 1)?,
                "{step}: peek"
            );
            Ok::<_, Box<dyn std::error::Error>>(l)
        }
    };
    for _ in 0..5 {
        assert!(same("spend 10").await?.is_allowed());
    }
    let spent = same("the 11th and 12th").await?;
    assert_eq!((spent.is_denied(), spent.binding()), (true, 0));

    // Burst 4 on the first, twice the rate on the second: the 60 s owed
    // stay owed, and both answer the same wait.
    let changed: Quotas = "10/min burst 4; 60/h".parse()?;
    local.set_quotas(changed.clone())?;
    redis.set_quotas(changed.clone())?;
    assert_eq!((redis.quotas(), redis.quota_version()), (changed, 1));
    let d = same("right after the change").await?;
    // 60 s owed, 2 x 6 s more for this request, 24 s tolerated: 48 s.
    assert_eq!(d.decision().retry_after(), Some(Duration::from_secs(48)));
    clock.advance(Duration::from_secs(48));
    assert!(same("at the advertised time").await?.is_allowed());
    clock.advance(Duration::from_secs(7));
    assert!(same("7 s on").await?.is_denied(), "17 s owed + 12 s > 24 s");
    assert_eq!(redis.refund("k", 2).await?, local.refund(&1, 2)?);
    assert!(
        same("after a refund").await?.is_allowed(),
        "5 s owed + 12 s <= 24 s"
    );
    Ok(())
}
