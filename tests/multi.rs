//! Several limits per key, all or nothing:
//!
//! - single-threaded, a check decides exactly as independent models of each
//!   limit combined (admitted iff every limit admits; a denied request
//!   charges no limit; the binding limit as documented);
//! - four threads on a frozen clock admit exactly what the strictest limit
//!   allows, and leave every limit with exactly the admitted tokens taken.

use std::time::Duration;

use proptest::prelude::*;
use turnstile_rl::{KeyedMultiLimiter, ManualClock, MultiLimiter, Quota, Quotas};

/// One limit as a debt in nanoseconds (how long until it is full).
#[derive(Clone)]
struct Model {
    debt: i128,
    interval: i128,
    tolerance: i128,
}

impl Model {
    fn new(q: &Quota) -> Self {
        Model {
            debt: 0,
            interval: turnstile_rl::__private::interval_nanos(q) as i128,
            tolerance: turnstile_rl::__private::tolerance_nanos(q) as i128,
        }
    }
    /// (allowed, remaining, retry_after in ns) of a check of `n`.
    fn peek(&self, n: u64) -> (bool, u64, i128) {
        let next = self.debt + n as i128 * self.interval;
        if next <= self.tolerance {
            (true, ((self.tolerance - next) / self.interval) as u64, 0)
        } else {
            let remaining = ((self.tolerance - self.debt).max(0) / self.interval) as u64;
            (false, remaining, (next - self.tolerance).max(1))
        }
    }
}

fn quota() -> impl Strategy<Value = Quota> {
    (1u64..=6, 1u64..=400).prop_map(|(burst, ms)| {
        Quota::with_period(Duration::from_millis(ms))
            .unwrap()
            .burst(burst)
            .unwrap()
    })
}

#[derive(Clone, Debug)]
enum Op {
    Advance(u64),
    Check(u64),
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1_000, ..ProptestConfig::default() })]

    #[test]
    fn a_check_is_every_model_combined(
        quotas in prop::collection::vec(quota(), 1..=3),
        ops in prop::collection::vec(prop_oneof![
            2 => (0u64..1_500).prop_map(Op::Advance),
            3 => (1u64..=6).prop_map(Op::Check),
        ], 1..60),
    ) {
        let list = Quotas::new(quotas.clone()).unwrap();
        let clock = ManualClock::new();
        let direct = MultiLimiter::builder(list.clone()).clock(clock.clone()).build();
        let keyed = KeyedMultiLimiter::<u64, _>::builder(list.clone()).clock(clock.clone()).build();
        let mut models: Vec<Model> = quotas.iter().map(Model::new).collect();
        for op in ops {
            match op {
                Op::Advance(ms) => {
                    clock.advance(Duration::from_millis(ms));
                    for m in &mut models {
                        m.debt = (m.debt - ms as i128 * 1_000_000).max(0);
                    }
                }
                Op::Check(n) => {
                    if n > list.min_burst() {
                        prop_assert!(direct.check_n(n).is_err());
                        prop_assert!(keyed.check_n(&1, n).is_err());
                        continue;
                    }
                    let each: Vec<_> = models.iter().map(|m| m.peek(n)).collect();
                    let allowed = each.iter().all(|e| e.0);
                    // The binding limit: the longest wait among those that
                    // deny (the first denier wins ties), or the fewest left.
                    let binding = if allowed {
                        (0..each.len()).min_by_key(|&i| each[i].1).unwrap()
                    } else {
                        let first = each.iter().position(|e| !e.0).unwrap();
                        (0..each.len())
                            .filter(|&i| !each[i].0)
                            .fold(first, |best, i| if each[i].2 > each[best].2 { i } else { best })
                    };
                    if allowed {
                        for m in &mut models {
                            m.debt += n as i128 * m.interval;
                        }
                    }
                    for d in [direct.check_n(n).unwrap(), keyed.check_n(&1, n).unwrap()] {
                        prop_assert_eq!(d.is_allowed(), allowed);
                        prop_assert_eq!(d.binding(), binding);
                        prop_assert_eq!(d.decision().remaining(), each[binding].1);
                        if !allowed {
                            prop_assert_eq!(
                                d.decision().retry_after(),
                                Some(Duration::from_nanos(each[binding].2 as u64))
                            );
                        }
                    }
                    // No limit kept a token of a denied request.
                    for (i, m) in models.iter().enumerate() {
                        prop_assert_eq!(direct.limits()[i].peek().remaining(), m.peek(1).1);
                        prop_assert_eq!(keyed.limits()[i].peek(&1).remaining(), m.peek(1).1);
                    }
                }
            }
        }
    }
}

#[test]
fn a_burst_limit_and_an_hourly_ceiling() {
    let clock = ManualClock::new();
    let limiter = KeyedMultiLimiter::<String, _>::builder("3/s burst 5; 8/h".parse().unwrap())
        .clock(clock.clone())
        .build();
    assert_eq!(
        (0..9).filter(|_| limiter.check("k").is_allowed()).count(),
        5
    );
    let d = limiter.check("k");
    assert_eq!(
        (d.binding(), d.decision().retry_after()),
        (0, Some(Duration::from_nanos(333_333_334)))
    );
    // Three intervals of 333,333,334 ns: three more tokens of the first
    // limit, then the hourly ceiling (8) binds.
    clock.advance(Duration::from_nanos(1_000_000_002));
    assert_eq!(
        (0..9).filter(|_| limiter.check("k").is_allowed()).count(),
        3
    );
    clock.advance(Duration::from_secs(1));
    let first = limiter.limits()[0].peek("k");
    assert!(first.is_allowed());
    let d = limiter.check("k");
    assert!(d.is_denied());
    assert_eq!(d.binding(), 1);
    assert_eq!(d.decision().limit(), 8);
    assert_eq!(
        limiter.limits()[0].peek("k"),
        first,
        "no token burnt on the first"
    );
}
