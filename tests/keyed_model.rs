//! `KeyedLimiter` against a sequential model: a `HashMap` of arrival times
//! fed through the same pure GCRA function. Growth, migration, housekeeping
//! sweeps and `evict_idle` all happen under the limiter; none may change a
//! single decision while time moves forward (eviction is lossless).

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use turnstile_rl::{Gcra, KeyedLimiter, ManualClock, Quota};

#[derive(Clone, Debug)]
enum Op {
    Check { key: u16, cost: u64 },
    Advance { micros: u64 },
    EvictIdle,
}

fn op(keys: u16) -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..keys, 1..=3u64).prop_map(|(key, cost)| Op::Check { key, cost }),
        3 => (0..3_000_000u64).prop_map(|micros| Op::Advance { micros }),
        1 => Just(Op::EvictIdle),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn decisions_match_a_sequential_model(
        burst in 1..=4u64,
        per_second in 1..=20u64,
        ops in prop::collection::vec(op(300), 1..600),
    ) {
        let quota = Quota::per_second(per_second).unwrap().burst(burst).unwrap();
        let gcra = Gcra::new(&quota);
        let clock = ManualClock::new();
        let limiter = KeyedLimiter::builder(quota).clock(clock.clone()).build();
        let mut model: HashMap<u16, u64> = HashMap::new();
        for op in ops {
            match op {
                Op::Check { key, cost } => {
                    let now = clock.elapsed().as_nanos() as u64;
                    let tat = model.get(&key).copied().unwrap_or(0);
                    let expected = gcra.check(tat, now, cost);
                    let actual = limiter.check_n(&u64::from(key), cost);
                    match (expected, actual) {
                        (Ok(step), Ok(decision)) => {
                            prop_assert_eq!(decision, step.decision, "key {} at {}", key, now);
                            if let Some(next) = step.next {
                                model.insert(key, next);
                            }
                        }
                        (Err(e), Err(a)) => prop_assert_eq!(e, a),
                        (e, a) => prop_assert!(false, "model {:?}, limiter {:?}", e, a),
                    }
                }
                Op::Advance { micros } => clock.advance(Duration::from_micros(micros)),
                Op::EvictIdle => {
                    let now = clock.elapsed().as_nanos() as u64;
                    let idle = model.values().filter(|&&tat| tat <= now).count();
                    let evicted = limiter.evict_idle();
                    // Housekeeping may have evicted some idle keys already.
                    prop_assert!(evicted <= idle, "evicted {} of {} idle", evicted, idle);
                    model.retain(|_, tat| *tat > now);
                    prop_assert_eq!(limiter.len(), model.len());
                }
            }
            prop_assert!(limiter.len() <= model.len().max(1) + 300);
        }
    }
}
