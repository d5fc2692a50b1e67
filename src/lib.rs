//! turnstile: a lock-free, in-process, keyed rate-limiter engine.
//!
//! Every bucket is one `AtomicU64` holding GCRA's theoretical arrival time,
//! updated by a compare-and-swap loop around a pure integer function: a
//! `check` is a clock read, a load, a few additions and one CAS, with no lock
//! anywhere on the path.
//!
//! # Quick start
//!
//! ```
//! use turnstile_rl::{DirectLimiter, Quota};
//!
//! let limiter = DirectLimiter::new("10/s burst 20".parse()?);
//! let decision = limiter.check();
//! if decision.is_allowed() {
//!     // serve the request; decision.remaining() tokens are left
//! } else {
//!     // answer 429 with Retry-After: decision.retry_after()
//! }
//! # Ok::<(), turnstile_rl::QuotaError>(())
//! ```
//!
//! # What a user holds
//!
//! - [`Quota`]: `"100/min"`, `"10/s burst 20"`, `Quota::per_minute(100)?`.
//! - [`DirectLimiter`]: one bucket, shared by every caller.
//! - [`LeasedLimiter`] (opt-in): one bucket hot on many cores, whose
//!   threads take leases of its tokens so that throughput grows with
//!   cores, over-admitting at most a proven bound (see [`leased`]).
//! - [`KeyedLimiter`]: one bucket per key, in a lock-free map that bounds
//!   its memory (`max_keys`) and forgets idle keys by itself; see
//!   [`keyed`] for what runs when, and its constants.
//! - [`Decision`]: allowed or denied, `remaining`, `retry_after`,
//!   `reset_after`, `limit`.
//! - [`Clock`]: where "now" comes from; [`ManualClock`] for tests.
//! - [`algorithms`]: the [`Algorithm`] contract, [`Gcra`], and the fixed
//!   window and sliding-window counter beside it, behind the same `Decision`.
//! - [`SlidingLog`]: the exact sliding log, a limiter of its own (behind a
//!   mutex: its state does not fit in one word).
//! - `http` (feature `tower`): a tower `RateLimitLayer` with `429`,
//!   `Retry-After`, the IETF RateLimit headers and metrics.
//! - `until_ready` and `until_n_ready` (feature `tokio`): wait for a token
//!   instead of being refused; see `Jitter`.
//! - `redis::RedisLimiter` (feature `redis`): the same quotas and decisions
//!   from a shared Redis, for fleets of gateways, with a timeout, a circuit
//!   breaker, a failure policy, leases and metrics.
//!
//! # Semantics
//!
//! A quota is a burst `B >= 1` and an emission interval `T` (period / count,
//! rounded up to whole nanoseconds, so rounding never admits more). A request
//! of cost `n` at `now` passes iff `max(TAT, now) + n*T - now <= B*T`. Costs
//! of 0 or above `B` are errors ([`CostError`]), not denials. Every operation
//! saturates: no input panics or wraps into an allow. A clock that goes
//! backwards by `d` grants nothing on a bucket it finds; on a key that
//! another thread's later reading has just evicted as idle, it can admit at
//! most `d / T` more than the quota, once (see [`clock`] and [`keyed`]).
//!
//! # Consistency guarantees
//!
//! - **Per key, every check is atomic.** An allowed request is one
//!   successful CAS on its key's cell; a denial is decided on one load of
//!   it. Concurrent checks of one key behave as if they ran one at a time,
//!   and none is lost: not to another updater, not to the table growing or
//!   shrinking under it, not to eviction (the loom models in `loom-tests/`
//!   check each of these).
//! - **Eviction of idle keys is lossless** while the clock moves forward: a
//!   bucket is evicted only once it is full again, which is what a missing
//!   key is. Internals and constants: [`keyed`].
//! - **The one lossy path is the bound.** When `max_keys` keys are live and
//!   none is idle, [`OverflowPolicy::EvictFullest`] forgets the bucket
//!   closest to full among a sample; the other policies refuse or admit the
//!   new key without tracking it instead.
//! - Keys are independent: there is no cross-key ordering.
//! - **[`LeasedLimiter`] is the one opt-in exception to exactness**: its
//!   threads spend tokens leased from the bucket earlier, so a window of
//!   clock readings can admit up to `over_admission_bound()` tokens more
//!   than the exact limiter would (proof and constants: [`leased`]).
//! - **A quota changes while serving** (`set_quota(&self)`), read whole by
//!   each check: a check is decided wholly at one quota, and every bucket is
//!   kept by one rule for every limiter (see [`Quota`], "Changing a quota
//!   while serving").

// The unit tests are plain `#[cfg(test)]` and never built with
// `--cfg turnstile_loom` (scripts/loom.sh): that cfg swaps in loom's atomics
// (`sync`), which panic outside a `loom::model` ("cannot access Loom
// execution state"), so every test that touches a cell, a map, a limiter or
// a `ManualClock` would fail for that alone; with loom.sh's second cfg,
// `crossbeam_loom`, the dev-dependencies do not even build. The loom models
// in `loom-tests/` test that code; refusing the build keeps the unit tests
// from ever half-running.
#[cfg(all(test, turnstile_loom))]
compile_error!(
    "unit tests do not build under --cfg turnstile_loom: scripts/loom.sh runs the loom models"
);

/// Counts a rare interleaving for the loom models (`crate::probe`); empty
/// in every other build. Defined before the modules that use it.
macro_rules! probe {
    ($name:ident) => {{
        #[cfg(turnstile_loom)]
        crate::probe::hit(&crate::probe::$name);
    }};
}

pub mod algorithms;
mod cell;
pub mod clock;
mod decision;
mod direct;
mod error;
#[cfg(feature = "tower")]
pub mod http;
pub mod keyed;
pub mod leased;
mod live;
mod map;
mod multi;
#[cfg(turnstile_loom)]
#[doc(hidden)]
pub mod probe;
mod quota;
mod quotas;
#[cfg(feature = "redis")]
pub mod redis;
mod resets;
mod sliding_log;
mod stats;
mod striped;
mod sync;
#[cfg(feature = "tokio")]
mod wait;

#[doc(hidden)]
pub mod __private;

pub use algorithms::{Algorithm, Gcra};
pub use clock::{Clock, DefaultClock, ManualClock, MonotonicClock, QuantaClock, RecentClock};
pub use decision::Decision;
pub use direct::{DirectLimiter, DirectLimiterBuilder};
pub use error::{BatchError, CostError, LeaseError, QuotaError, QuotasError};
pub use keyed::{KeyedLimiter, KeyedLimiterBuilder, OverflowPolicy};
pub use leased::{LeasedLimiter, LeasedLimiterBuilder};
pub use multi::{
    KeyedMultiLimiter, KeyedMultiLimiterBuilder, MultiDecision, MultiLimiter, MultiLimiterBuilder,
};
pub use quota::Quota;
pub use quotas::{Quotas, MAX_LIMITS};
pub use sliding_log::{SlidingLog, SlidingLogBuilder};
pub use stats::Stats;
#[cfg(feature = "tokio")]
pub use wait::Jitter;

/// The README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
