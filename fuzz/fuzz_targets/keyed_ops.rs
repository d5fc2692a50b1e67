//! `KeyedLimiter` on a manual clock against a sequential model: a `HashMap`
//! of arrival times fed through the pure GCRA. Growth, migration,
//! housekeeping sweeps, `evict_idle` and floods of fresh keys all happen
//! under the limiter. While it is under its bound every decision equals the
//! model's (idle eviction is lossless); once it has been full, a tracked key
//! may have been forgotten by `EvictFullest`, and then (and only then) its
//! decision may instead be a fresh bucket's. `len()` never exceeds
//! `max_keys`, and nothing panics. Peek, refund, reset and clear follow the
//! same model: a peek changes nothing, a refund is `TAT := max(TAT - n*T,
//! now)`, a reset or clear leaves full buckets.
#![no_main]

use std::collections::HashMap;
use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use turnstile_rl::{Gcra, KeyedLimiter, ManualClock, Quota};

/// Fresh keys one input may flood the limiter with, in all.
const FLOOD_KEYS: u64 = 2_000;

#[derive(Arbitrary, Debug)]
enum Op {
    /// Check key `key % 64` with cost `cost % 8` (0 and above-burst costs
    /// are errors, which must match too).
    Check {
        key: u8,
        cost: u8,
    },
    /// Move the clock forward by this many microseconds.
    Advance(u16),
    /// Move the clock forward by this many milliseconds.
    AdvanceFar(u16),
    EvictIdle,
    /// Check `1 + n % 200` keys never seen before, cost 1 each.
    Flood(u8),
    /// Peek at key `key % 64` with cost `cost % 8`: the model's decision,
    /// and nothing changes.
    Peek {
        key: u8,
        cost: u8,
    },
    /// Refund `cost % 8` tokens to key `key % 64`.
    Refund {
        key: u8,
        cost: u8,
    },
    /// Forget key `key % 64`.
    Reset(u8),
    /// Forget every key.
    Clear,
}

#[derive(Arbitrary, Debug)]
struct Input {
    per_second: u8,
    burst: u8,
    max_keys: u8,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    // On a thread of its own: each thread registers one epoch handle
    // (`src/map/pin.rs`), and only the thread's end drops it. `join` waits
    // for the thread's whole exit, its thread-local destructors included
    // (the scope's implicit wait does not), so every input ends with its
    // memory freed or still reachable from the crate's collector (a
    // retired table waiting for the epoch): libFuzzer's leak check then
    // holds for each input, and the exit-time check never races a thread
    // still tearing down.
    std::thread::scope(|s| {
        if let Err(panic) = s.spawn(|| run(&input)).join() {
            std::panic::resume_unwind(panic);
        }
    });
});

fn run(input: &Input) {
    let per_second = 1 + u64::from(input.per_second % 50);
    let burst = 1 + u64::from(input.burst % 6);
    let max_keys = 16 + usize::from(input.max_keys % 49);
    let quota = Quota::per_second(per_second)
        .and_then(|q| q.burst(burst))
        .unwrap();
    let gcra = Gcra::new(&quota);
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::<u64, _>::builder(quota)
        .clock(clock.clone())
        .max_keys(max_keys)
        .build();
    assert_eq!(limiter.max_keys(), max_keys);
    let mut model: HashMap<u64, u64> = HashMap::new();
    let mut next_fresh = 1_000u64;
    let mut ever_full = false;
    for op in &input.ops {
        let now = clock.elapsed().as_nanos() as u64;
        match *op {
            Op::Check { key, cost } => {
                let key = u64::from(key % 64);
                let cost = u64::from(cost % 8);
                let tat = model.get(&key).copied().unwrap_or(0);
                let expected = gcra.check(tat, now, cost);
                let actual = limiter.check_n(&key, cost);
                match (expected, actual) {
                    (Ok(step), Ok(decision)) if decision == step.decision => {
                        if let Some(next) = step.next {
                            model.insert(key, next);
                        }
                    }
                    (Ok(step), Ok(decision)) => {
                        // Only a key forgotten at the bound may differ, and
                        // then it decides as a fresh bucket.
                        let fresh = gcra.check(0, now, cost).unwrap();
                        assert!(
                            ever_full && decision == fresh.decision,
                            "key {key} cost {cost} at {now} (TAT {tat}, full before: {ever_full}): \
                             model {:?}, fresh {:?}, limiter {decision:?}",
                            step.decision,
                            fresh.decision,
                        );
                        match fresh.next {
                            Some(next) => model.insert(key, next),
                            None => model.remove(&key),
                        };
                    }
                    (Err(e), Err(a)) => assert_eq!(e, a),
                    (e, a) => panic!("model {e:?}, limiter {a:?}"),
                }
            }
            Op::Peek { key, cost } => {
                let key = u64::from(key % 64);
                let cost = u64::from(cost % 8);
                let tat = model.get(&key).copied().unwrap_or(0);
                let len = limiter.len();
                match (gcra.check(tat, now, cost), limiter.peek_n(&key, cost)) {
                    (Ok(step), Ok(decision)) if decision == step.decision => {}
                    (Ok(_), Ok(decision)) => {
                        // Only a key forgotten at the bound: a fresh bucket.
                        let fresh = gcra.check(0, now, cost).unwrap();
                        assert!(ever_full && decision == fresh.decision, "peek {key} {cost}");
                        model.remove(&key);
                    }
                    (Err(e), Err(a)) => assert_eq!(e, a),
                    (e, a) => panic!("peek: model {e:?}, limiter {a:?}"),
                }
                assert_eq!(limiter.len(), len, "a peek inserted or removed a key");
            }
            Op::Refund { key, cost } => {
                let key = u64::from(key % 64);
                let cost = u64::from(cost % 8);
                let actual = limiter.refund(&key, cost);
                if cost == 0 || cost > burst {
                    assert!(actual.is_err(), "refund of {cost}, burst {burst}");
                    continue;
                }
                // TAT := max(TAT - cost*T, now), when TAT > now.
                let interval = turnstile_rl::__private::interval_nanos(&quota);
                let expected = match model.get(&key).copied() {
                    Some(tat) if tat > now => {
                        model.insert(key, tat.saturating_sub(cost * interval).max(now));
                        true
                    }
                    _ => false,
                };
                if actual != Ok(expected) {
                    // Only a key forgotten at the bound: nothing to refund.
                    assert!(
                        ever_full && actual == Ok(false),
                        "refund {key} {cost}: {actual:?}"
                    );
                    model.remove(&key);
                }
            }
            Op::Reset(key) => {
                let key = u64::from(key % 64);
                let _ = limiter.reset(&key);
                model.remove(&key);
                let fresh = gcra.check(0, now, 1).unwrap();
                assert_eq!(limiter.peek(&key), fresh.decision, "reset {key}");
            }
            Op::Clear => {
                let before = limiter.len();
                assert_eq!(limiter.clear(), before);
                assert_eq!(limiter.len(), 0);
                model.clear();
            }
            Op::Advance(micros) => clock.advance(Duration::from_micros(u64::from(micros))),
            Op::AdvanceFar(millis) => clock.advance(Duration::from_millis(u64::from(millis))),
            Op::EvictIdle => {
                let before = limiter.len();
                let evicted = limiter.evict_idle();
                assert!(evicted <= before, "evicted {evicted} of {before}");
                assert_eq!(limiter.len(), before - evicted);
                // Every key still tracked is busy: at most the model's busy
                // keys plus the flood keys (cost 1, busy until now + T).
                let busy = model.values().filter(|&&tat| tat > now).count();
                let flood = usize::try_from(next_fresh - 1_000).unwrap();
                assert!(limiter.len() <= busy + flood);
            }
            Op::Flood(n) => {
                // At most FLOOD_KEYS fresh keys an input, to keep runs fast.
                let n = (1 + u64::from(n % 200)).min(FLOOD_KEYS + 1_000 - next_fresh);
                for _ in 0..n {
                    let key = next_fresh;
                    next_fresh += 1;
                    let fresh = gcra.check(0, now, 1).unwrap();
                    assert_eq!(limiter.check(&key), fresh.decision, "fresh key {key}");
                    let len = limiter.len();
                    assert!(len <= max_keys, "{len} keys, bound {max_keys}");
                    ever_full |= len == max_keys;
                }
            }
        }
        let len = limiter.len();
        assert!(len <= max_keys, "{len} keys, bound {max_keys}");
        ever_full |= len == max_keys;
    }
}
