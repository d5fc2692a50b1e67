//! Adversary 5's stress of the keyed map's one-CAS copy (7e50904: a
//! migration's chunk hashes a live bucket's key, then takes the bucket
//! straight to COPYING with one CAS; an update landing first makes the CAS
//! fail and the chunk read again; a key whose `Hash` panics is buried):
//!
//! - [`exact`]: hot keys checked, peeked and refunded by many threads while
//!   churn grows, compacts and shrinks the table under them: each admits
//!   exactly its burst (plus its refunds).
//! - [`hostile_hash`]: hot keys whose `Hash` panics, sleeps or re-enters
//!   the limiter inside the chunks that copy them: no key split, lost or
//!   dropped twice.
//!
//! Each race is bounded by time (1.2 to 1.5 s; under 3 s for the binary) and
//! asserts the cases it names were reached; `within` fails a hang. The
//! deterministic case (a chunk parked in the key's `Hash` while other
//! operations land on the bucket, and a fork then) is
//! `tests/adv5_fork_parked_hash.rs`, a binary of its own because it forks.

mod exact;
mod hostile_hash;
