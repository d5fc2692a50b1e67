//! Shared by the model targets (included with `#[path]`): a decision's
//! durations in the nanoseconds the models compute.

use std::time::Duration;

/// A decision's duration in nanoseconds; turnstile's fit in a u64 by design.
pub fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).expect("decision durations fit in u64 nanoseconds")
}
