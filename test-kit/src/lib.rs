//! What turnstile's tests, benches and command-line program share, kept out
//! of the library so that depending on `turnstile` pulls none of it.
//!
//! - [`reference`](mod@reference): the tutorials' floating-point token bucket, the model
//!   GCRA is tested and benchmarked against.
//! - [`redis_server`]: a real `redis-server` (or a 3-master Cluster) on free
//!   loopback ports, stopped on drop.
//! - `http_server` (feature `http`): an axum app served on a free loopback port.
//! - [`heap`]: a counting global allocator, and a pause point for replaying
//!   races at one allocation.
//! - [`keys`]: deterministic key generators.
//! - [`watchdog`], [`within`]: a hang fails the test instead of stalling it.
//! - [`overlap`]: stress rounds whose threads overlap on a loaded machine.
//! - [`stall`]: a key whose `Eq` holds its thread inside a limiter's pin.

pub mod heap;
#[cfg(feature = "http")]
pub mod http_server;
pub mod keys;
pub mod overlap;
pub mod redis_server;
pub mod reference;
pub mod stall;
pub mod watchdog;
pub mod within;
