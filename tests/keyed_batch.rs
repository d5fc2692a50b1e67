//! `check_batch` against one-by-one checks: the same decisions, in order.
//!
//! Two limiters with the same quota, bound, overflow policy, clock and
//! hasher keys (`hasher_seed`, so that `EvictFullest` picks the same victims
//! in both): one is fed each batch through `check_batch_n`, the other the
//! same keys one `check_n` at a time. Every decision, every error and the
//! number of tracked keys must match, across repeated keys, costs (bad ones
//! included), idle keys evicted as the clock moves between batches, and a
//! bound small enough that the batches overflow it.

use std::time::Duration;

use proptest::prelude::*;
use turnstile_rl::__private::HasherSeed as _;
use turnstile_rl::{BatchError, Decision, KeyedLimiter, ManualClock, OverflowPolicy, Quota};

#[derive(Clone, Debug)]
enum Step {
    /// Move the clock forward (0 to 3 ms: keys go idle at `burst * T`).
    Advance(u64),
    /// A batch of (key, cost); `unit` sends it through `check_batch`
    /// (cost 1 each) instead.
    Batch {
        pairs: Vec<(u64, u64)>,
        unit: bool,
    },
    /// Keys and costs of different lengths.
    Mismatch(Vec<u64>),
    EvictIdle,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        1 => (0u64..3_000_000).prop_map(Step::Advance),
        4 => (prop::collection::vec((0u64..24, 0u64..7), 0..80), any::<bool>())
            .prop_map(|(pairs, unit)| Step::Batch { pairs, unit }),
        1 => prop::collection::vec(0u64..24, 0..5).prop_map(Step::Mismatch),
        1 => Just(Step::EvictIdle),
    ]
}

fn policy() -> impl Strategy<Value = OverflowPolicy> {
    prop_oneof![
        Just(OverflowPolicy::EvictFullest),
        Just(OverflowPolicy::Deny),
        Just(OverflowPolicy::AllowUntracked),
    ]
}

type Limiter = KeyedLimiter<u64, ManualClock>;

fn limiter(quota: Quota, clock: &ManualClock, max_keys: usize, policy: OverflowPolicy) -> Limiter {
    KeyedLimiter::builder(quota)
        .clock(clock.clone())
        .max_keys(max_keys)
        .overflow(policy)
        .hasher_seed(0x5eed)
        .build()
}

/// What one-by-one checks give for a batch: the first bad cost's error
/// (and nothing checked), or each `check_n` in order.
fn one_by_one(limiter: &Limiter, keys: &[u64], costs: &[u64]) -> Result<Vec<Decision>, BatchError> {
    if keys.len() != costs.len() {
        return Err(BatchError::LengthMismatch {
            keys: keys.len(),
            costs: costs.len(),
        });
    }
    // Validate first, as the batch does: an error decides nothing.
    for (index, &cost) in costs.iter().enumerate() {
        if let Err(source) = limiter.peek_n(&0, cost) {
            return Err(BatchError::Cost { index, source });
        }
    }
    Ok(keys
        .iter()
        .zip(costs)
        .map(|(key, &cost)| limiter.check_n(key, cost).expect("validated"))
        .collect())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn batches_decide_as_one_by_one_checks(
        per_second in 1u64..2_000,
        burst in 1u64..6,
        max_keys in 1usize..12,
        policy in policy(),
        steps in prop::collection::vec(step(), 1..40),
    ) {
        let quota = Quota::per_second(per_second).and_then(|q| q.burst(burst)).unwrap();
        let clock = ManualClock::new();
        let batched = limiter(quota, &clock, max_keys, policy);
        let single = limiter(quota, &clock, max_keys, policy);
        let mut out = Vec::new();
        for step in &steps {
            match step {
                Step::Advance(nanos) => clock.advance(Duration::from_nanos(*nanos)),
                Step::Batch { pairs, unit } => {
                    let keys: Vec<u64> = pairs.iter().map(|p| p.0).collect();
                    let (costs, got) = if *unit {
                        batched.check_batch(&keys, &mut out);
                        (vec![1; keys.len()], Ok(()))
                    } else {
                        let costs: Vec<u64> = pairs.iter().map(|p| p.1).collect();
                        let got = batched.check_batch_n(&keys, &costs, &mut out);
                        (costs, got)
                    };
                    let expected = one_by_one(&single, &keys, &costs);
                    match (got, expected) {
                        (Ok(()), Ok(expected)) => {
                            prop_assert_eq!(&out, &expected, "keys {:?} costs {:?}", keys, costs);
                        }
                        (Err(got), Err(expected)) => prop_assert_eq!(got, expected),
                        (got, expected) => prop_assert!(false, "batch {:?}, one by one {:?}", got, expected),
                    }
                }
                Step::Mismatch(keys) => {
                    let costs = vec![1; keys.len() + 1];
                    let got = batched.check_batch_n(keys, &costs, &mut out);
                    prop_assert_eq!(got, one_by_one(&single, keys, &costs).map(|_| ()));
                }
                Step::EvictIdle => prop_assert_eq!(batched.evict_idle(), single.evict_idle()),
            }
            prop_assert_eq!(batched.len(), single.len());
            prop_assert!(batched.len() <= max_keys);
        }
    }
}

/// Four threads, a frozen clock, batches that repeat keys and overlap
/// between threads: every key admits exactly its burst, however the
/// batches interleave with each other's inserts and updates.
#[test]
fn four_threads_of_batches_admit_exactly_the_burst() {
    const THREADS: usize = 4;
    const KEYS: u64 = 5_000;
    const BURST: u64 = 20;
    const BATCH: usize = 32;
    let limiter = KeyedLimiter::builder(Quota::per_hour(1).unwrap().burst(BURST).unwrap())
        .clock(ManualClock::new())
        .build();
    let start = std::sync::Barrier::new(THREADS);
    let admitted: Vec<Vec<u64>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS as u64)
            .map(|t| {
                let (limiter, start) = (&limiter, &start);
                s.spawn(move || {
                    let mut admitted = vec![0u64; KEYS as usize];
                    let mut out = Vec::new();
                    // Each thread walks every key 2 * BURST times, in
                    // batches of BATCH where each key appears twice in a
                    // row, starting from its own offset.
                    let walk: Vec<u64> = (0..KEYS * BURST)
                        .map(|i| (i / 2 + t * KEYS / THREADS as u64) % KEYS)
                        .collect();
                    start.wait();
                    for _ in 0..2 {
                        for batch in walk.chunks(BATCH) {
                            limiter.check_batch(batch, &mut out);
                            assert_eq!(out.len(), batch.len());
                            for (key, decision) in batch.iter().zip(&out) {
                                if decision.is_allowed() {
                                    admitted[*key as usize] += 1;
                                }
                            }
                        }
                    }
                    admitted
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    for key in 0..KEYS as usize {
        let total: u64 = admitted.iter().map(|a| a[key]).sum();
        assert_eq!(total, BURST, "key {key}");
    }
    assert_eq!(limiter.len(), KEYS as usize);
}

/// The batch applies the bound: past `max_keys`, new keys in a batch meet
/// the overflow policy exactly as single checks do, in slice order.
#[test]
fn a_batch_past_the_bound_is_refused_in_order() {
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::builder("1/min".parse().unwrap())
        .clock(clock)
        .max_keys(3)
        .overflow(OverflowPolicy::Deny)
        .build();
    let mut out = Vec::new();
    limiter.check_batch(&[1u64, 2, 1, 3, 4, 5, 3], &mut out);
    let allowed: Vec<bool> = out.iter().map(|d| d.is_allowed()).collect();
    assert_eq!(allowed, [true, true, false, true, false, false, false]);
    assert_eq!(limiter.len(), 3);
}

/// String keys: a batch of owned keys is looked up without cloning them
/// for keys already tracked.
#[test]
fn string_keys_in_a_batch() {
    let limiter = KeyedLimiter::<String>::new("2/min".parse().unwrap());
    let keys: Vec<String> = ["a", "b", "a", "a"].iter().map(|s| s.to_string()).collect();
    let mut out = Vec::new();
    limiter.check_batch(&keys, &mut out);
    let remaining: Vec<u64> = out.iter().map(|d| d.remaining()).collect();
    assert_eq!(remaining, [1, 1, 0, 0]);
    assert!(out[3].is_denied());
    limiter.check_batch(&keys[..0], &mut out);
    assert!(out.is_empty(), "an empty batch clears the decisions");
}
