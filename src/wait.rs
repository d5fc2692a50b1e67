//! Waiting for a token instead of being refused (feature `tokio`): for
//! outbound clients of a rate-limited API, batch jobs, crawlers.
//!
//! [`DirectLimiter::until_ready`] and [`KeyedLimiter::until_ready`] check;
//! on a denial they sleep (tokio's timer) for the decision's
//! [`retry_after`](Decision::retry_after), plus an optional [`Jitter`],
//! and check again. The `_n_` variants wait for `n` tokens at once and
//! return a [`CostError`] at once, without waiting, for a cost that could
//! never pass (0, or above the burst): never an endless wait.
//!
//! # Cancel safety
//!
//! The futures are cancel-safe: dropping one before it completes consumes
//! nothing. A check is one atomic step that either takes its tokens *and*
//! ends the future in the same poll (no `.await` comes after it), or takes
//! nothing at all (a denial changes no state). The only `.await` is the
//! sleep between checks, and while sleeping the future holds no
//! reservation. So `tokio::time::timeout(d, limiter.until_ready())` and
//! `select!` are safe: a waiter that gives up has cost no one a token.
//!
//! # Fairness
//!
//! Waiters are not queued: after a sleep, whoever checks first wins, so
//! under contention a waiter can be overtaken. Jitter spreads many
//! waiters' wake-ups so they do not all retry in the same instant.

use std::borrow::Borrow;
use std::convert::Infallible;
use std::hash::Hash;
use std::time::Duration;

use crate::algorithms::Algorithm;
use crate::clock::{saturating_nanos, Clock};
use crate::decision::Decision;
use crate::direct::DirectLimiter;
use crate::error::CostError;
use crate::keyed::KeyedLimiter;

/// Random extra time added to each sleep of a waiter, so that waiters
/// denied together do not all wake together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Jitter {
    max: Duration,
}

impl Jitter {
    /// No jitter: sleep exactly until the next token is due.
    pub const NONE: Jitter = Jitter {
        max: Duration::ZERO,
    };

    /// A uniformly random extra wait between zero and `max`, inclusive.
    pub fn up_to(max: Duration) -> Self {
        Jitter { max }
    }

    fn sample(&self) -> Duration {
        if self.max.is_zero() {
            return Duration::ZERO;
        }
        let max = saturating_nanos(self.max);
        Duration::from_nanos(fastrand::u64(0..=max))
    }
}

/// Checks until allowed, sleeping for each denial's wait. The one `.await`
/// is the sleep: see the module docs on cancel safety.
async fn wait<E>(
    jitter: Jitter,
    mut check: impl FnMut() -> Result<Decision, E>,
) -> Result<Decision, E> {
    loop {
        let decision = check()?;
        match decision.retry_after() {
            None => return Ok(decision),
            Some(wait) => tokio::time::sleep(wait.saturating_add(jitter.sample())).await,
        }
    }
}

fn infallible(result: Result<Decision, Infallible>) -> Decision {
    match result {
        Ok(decision) => decision,
        Err(never) => match never {},
    }
}

impl<C: Clock, A: Algorithm> DirectLimiter<C, A> {
    /// Waits until one request may pass, and takes its token. Cancel-safe.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), turnstile_rl::QuotaError> {
    /// use turnstile_rl::DirectLimiter;
    ///
    /// // An upstream that takes 100 requests a second, one at a time.
    /// let upstream = DirectLimiter::new("100/s burst 1".parse()?);
    /// for _ in 0..5 {
    ///     upstream.until_ready().await; // after the first, about 10 ms each
    ///     // send the request
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn until_ready(&self) -> Decision {
        infallible(wait(Jitter::NONE, || Ok(self.check())).await)
    }

    /// Waits until `n` tokens are free together, and takes them. An error
    /// at once for a cost that could never pass. Cancel-safe.
    pub async fn until_n_ready(&self, n: u64) -> Result<Decision, CostError> {
        self.until_n_ready_with_jitter(n, Jitter::NONE).await
    }

    /// [`until_n_ready`](DirectLimiter::until_n_ready), adding `jitter` to
    /// every sleep.
    pub async fn until_n_ready_with_jitter(
        &self,
        n: u64,
        jitter: Jitter,
    ) -> Result<Decision, CostError> {
        wait(jitter, || self.check_n(n)).await
    }
}

impl<K, C, A> KeyedLimiter<K, C, A>
where
    K: Hash + Eq + Send + Sync + 'static,
    C: Clock,
    A: Algorithm,
{
    /// Waits until one request for `key` may pass, and takes its token.
    /// Cancel-safe.
    pub async fn until_ready<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        infallible(wait(Jitter::NONE, || Ok(self.check(key))).await)
    }

    /// Waits until `n` tokens for `key` are free together, and takes them.
    /// An error at once for a cost that could never pass. Cancel-safe.
    pub async fn until_n_ready<Q>(&self, key: &Q, n: u64) -> Result<Decision, CostError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.until_n_ready_with_jitter(key, n, Jitter::NONE).await
    }

    /// [`until_n_ready`](KeyedLimiter::until_n_ready), adding `jitter` to
    /// every sleep.
    pub async fn until_n_ready_with_jitter<Q>(
        &self,
        key: &Q,
        n: u64,
        jitter: Jitter,
    ) -> Result<Decision, CostError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        wait(jitter, || self.check_n(key, n)).await
    }
}
