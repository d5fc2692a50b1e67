//! `check_batch` / `check_batch_n` against one-by-one checks: two limiters
//! with the same quota, bound, overflow policy, clock and hasher keys (so
//! `EvictFullest` picks the same victims in both); one is fed each batch in
//! one call, the other the same keys one `check_n` at a time. Every
//! decision, every error (bad costs, mismatched lengths: nothing decided)
//! and `len()` must match, with repeated keys, idle keys evicted as the
//! clock moves, floods past a small `max_keys`, and nothing may panic.
#![no_main]

use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use turnstile_rl::__private::HasherSeed as _;
use turnstile_rl::{BatchError, Decision, KeyedLimiter, ManualClock, OverflowPolicy, Quota};

#[derive(Arbitrary, Debug)]
enum Op {
    /// A batch of (key % 32, cost % 8); `unit` sends it through
    /// `check_batch` (cost 1 each) instead.
    Batch {
        pairs: Vec<(u8, u8)>,
        unit: bool,
    },
    /// Keys with one cost more than keys.
    Mismatch(Vec<u8>),
    /// A batch of `1 + n` keys never seen before (past any bound).
    Flood(u8),
    /// Move the clock forward by this many microseconds.
    Advance(u16),
    /// Move the clock forward by this many milliseconds.
    AdvanceFar(u16),
    EvictIdle,
}

#[derive(Arbitrary, Debug)]
struct Input {
    per_second: u8,
    burst: u8,
    max_keys: u8,
    policy: u8,
    seed: u64,
    ops: Vec<Op>,
}

type Limiter = KeyedLimiter<u64, ManualClock>;

fuzz_target!(|input: Input| {
    // On a thread of its own, as in keyed_ops.rs: its end frees the
    // thread's cached epoch handles, so the leak check holds per input.
    std::thread::scope(|s| {
        if let Err(panic) = s.spawn(|| run(&input)).join() {
            std::panic::resume_unwind(panic);
        }
    });
});

fn one_by_one(limiter: &Limiter, keys: &[u64], costs: &[u64]) -> Result<Vec<Decision>, BatchError> {
    if keys.len() != costs.len() {
        return Err(BatchError::LengthMismatch {
            keys: keys.len(),
            costs: costs.len(),
        });
    }
    for (index, &cost) in costs.iter().enumerate() {
        if let Err(source) = limiter.peek_n(&0, cost) {
            return Err(BatchError::Cost { index, source });
        }
    }
    Ok(keys
        .iter()
        .zip(costs)
        .map(|(key, &cost)| limiter.check_n(key, cost).unwrap())
        .collect())
}

fn run(input: &Input) {
    let per_second = 1 + u64::from(input.per_second % 50);
    let burst = 1 + u64::from(input.burst % 6);
    let max_keys = 1 + usize::from(input.max_keys % 40);
    let policy = match input.policy % 3 {
        0 => OverflowPolicy::EvictFullest,
        1 => OverflowPolicy::Deny,
        _ => OverflowPolicy::AllowUntracked,
    };
    let quota = Quota::per_second(per_second)
        .and_then(|q| q.burst(burst))
        .unwrap();
    let clock = ManualClock::new();
    let make = || {
        KeyedLimiter::builder(quota)
            .clock(clock.clone())
            .max_keys(max_keys)
            .overflow(policy)
            .hasher_seed(input.seed)
            .build()
    };
    let (batched, single): (Limiter, Limiter) = (make(), make());
    let mut out = Vec::new();
    let mut fresh = 1_000u64;
    for op in input.ops.iter().take(200) {
        let (keys, costs, unit): (Vec<u64>, Vec<u64>, bool) = match op {
            Op::Batch { pairs, unit } => (
                pairs.iter().map(|p| u64::from(p.0 % 32)).collect(),
                pairs
                    .iter()
                    .map(|p| if *unit { 1 } else { u64::from(p.1 % 8) })
                    .collect(),
                *unit,
            ),
            Op::Mismatch(keys) => {
                let keys: Vec<u64> = keys.iter().map(|&k| u64::from(k % 32)).collect();
                let costs = vec![1; keys.len() + 1];
                (keys, costs, false)
            }
            Op::Flood(n) => {
                let keys: Vec<u64> = (fresh..fresh + 1 + u64::from(*n)).collect();
                fresh += keys.len() as u64;
                let costs = vec![1; keys.len()];
                (keys, costs, true)
            }
            Op::Advance(micros) => {
                clock.advance(Duration::from_micros(u64::from(*micros)));
                continue;
            }
            Op::AdvanceFar(millis) => {
                clock.advance(Duration::from_millis(u64::from(*millis)));
                continue;
            }
            Op::EvictIdle => {
                assert_eq!(batched.evict_idle(), single.evict_idle());
                assert_eq!(batched.len(), single.len());
                continue;
            }
        };
        let got = if unit {
            batched.check_batch(&keys, &mut out);
            Ok(())
        } else {
            batched.check_batch_n(&keys, &costs, &mut out)
        };
        match (got, one_by_one(&single, &keys, &costs)) {
            (Ok(()), Ok(expected)) => assert_eq!(out, expected, "keys {keys:?} costs {costs:?}"),
            (Err(got), Err(expected)) => assert_eq!(got, expected),
            (got, expected) => panic!("batch {got:?}, one by one {expected:?}"),
        }
        assert_eq!(batched.len(), single.len());
        assert!(
            batched.len() <= max_keys,
            "{} keys, bound {max_keys}",
            batched.len()
        );
    }
}
