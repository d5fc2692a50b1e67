//! `LeasedLimiter` (`src/leased.rs`): exact with one thread, over-admitting
//! never more than its stated bound with many, bad settings refused with a
//! typed error, and no hang when attacked.
//!
//! The bound is tested on a manual clock stepped between *phases*: the
//! clock stands still while every thread checks, and moves only once all
//! have stopped, so each admission's clock reading is its phase's time and
//! readings are ordered (the condition of the bound's token half).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use turnstile_rl::leased::{MAX_LEASE, MAX_LEASE_TTL, MAX_STRIPES, MIN_LEASE_TTL};
use turnstile_rl::{
    Clock, DirectLimiter, LeaseError, LeasedLimiter, ManualClock, QuantaClock, Quota,
};
use turnstile_test_kit::watchdog::Watchdog;
use turnstile_test_kit::within::within;

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const MS: u64 = 1_000_000;

/// One thread, adaptive leases (the default): the same sequence of costs
/// and clock steps gets the same decisions, figures and all, from a
/// `LeasedLimiter` and a `DirectLimiter` reading one clock.
#[test]
fn one_thread_decides_exactly_as_the_direct_limiter() {
    for quota in ["10/s burst 20", "1000/s", "3/min", "1000000/s burst 64"] {
        let quota: Quota = quota.parse().unwrap();
        let clock = ManualClock::new();
        let leased = LeasedLimiter::builder(quota)
            .clock(clock.clone())
            .max_lease(quota.burst_size().min(16))
            .build()
            .unwrap();
        let direct = DirectLimiter::builder(quota).clock(clock.clone()).build();
        let mut rng = Rng(0x5eed ^ quota.burst_size());
        let interval = turnstile_rl::__private::interval_nanos(&quota);
        let (mut allowed, mut denied) = (0, 0);
        for step in 0..20_000 {
            // Mostly bursts at one reading, sometimes a refill.
            match rng.below(10) {
                0 => clock.advance(Duration::from_nanos(rng.below(3 * interval))),
                1 => clock.advance(Duration::from_nanos(rng.below(interval / 4 + 1))),
                _ => {}
            }
            let cost = 1 + rng.below(quota.burst_size().min(4));
            let expected = direct.check_n(cost).unwrap();
            let got = leased.check_n(cost).unwrap();
            assert_eq!(got, expected, "{quota}, step {step}, cost {cost}");
            if got.is_allowed() {
                allowed += 1;
            } else {
                denied += 1;
            }
        }
        assert!(allowed > 100 && denied > 100, "{quota}: {allowed} {denied}");
    }
}

/// Beyond the last tick a lease word holds (2^58 ns), nothing is leased:
/// even with fixed leases of 8, the limiter is exact there.
#[test]
fn past_the_last_tick_it_leases_nothing() {
    let quota: Quota = "1000/s burst 20".parse().unwrap();
    let clock = ManualClock::new();
    clock.set_nanos(1 << 58);
    let leased = LeasedLimiter::builder(quota)
        .clock(clock.clone())
        .max_lease(8)
        .adaptive(false)
        .build()
        .unwrap();
    let direct = DirectLimiter::builder(quota).clock(clock.clone()).build();
    for _ in 0..30 {
        assert_eq!(leased.check(), direct.check());
    }
    // Before it, the same fixed leases do lease: the first check's
    // decision counts the 7 tokens its lease kept as its caller's.
    clock.set_nanos((1 << 58) - 2 * MS);
    let early = LeasedLimiter::builder(quota)
        .clock(clock.clone())
        .max_lease(8)
        .adaptive(false)
        .build()
        .unwrap();
    assert_eq!(early.check().remaining(), 19);
}

/// A lease that outlives its time to live is dropped, not spent: the
/// tokens it held are gone (spurious denials, never extra admissions).
#[test]
fn an_expired_lease_is_dropped_not_spent() {
    let clock = ManualClock::new();
    let limiter = LeasedLimiter::builder("1/s burst 10".parse().unwrap())
        .clock(clock.clone())
        .max_lease(5)
        .lease_ttl(Duration::from_millis(10))
        .stripes(1)
        .adaptive(false)
        .build()
        .unwrap();
    // A take of 5: one admitted, four kept.
    assert!(limiter.check().is_allowed());
    assert_eq!((0..4).filter(|_| limiter.check().is_allowed()).count(), 4);
    // Another lease of 5, one admitted; then the clock passes its TTL.
    assert!(limiter.check().is_allowed());
    clock.advance(Duration::from_millis(11));
    // Its four are gone; the bucket held 0 more: denied, with the
    // bucket's own wait (a token every second since it emptied at 0).
    let denied = limiter.check();
    assert!(denied.is_denied());
    assert_eq!(denied.retry_after(), Some(Duration::from_millis(989)));
    // Within the TTL, a lease is spent to its last token.
    clock.advance(Duration::from_secs(5));
    assert!(limiter.check().is_allowed());
    clock.advance(Duration::from_millis(9));
    assert_eq!((0..10).filter(|_| limiter.check().is_allowed()).count(), 4);
}

/// Every setting out of range is a typed error that says its range.
#[test]
fn bad_settings_are_errors_not_panics() {
    let quota: Quota = "100/s burst 50".parse().unwrap();
    let build = |f: &dyn Fn(
        turnstile_rl::LeasedLimiterBuilder<ManualClock>,
    ) -> turnstile_rl::LeasedLimiterBuilder<ManualClock>| {
        f(LeasedLimiter::builder(quota).clock(ManualClock::new()))
            .build()
            .map(|_| ())
    };
    assert_eq!(build(&|b| b.max_lease(0)), Err(LeaseError::ZeroLease));
    assert_eq!(
        build(&|b| b.max_lease(51)),
        Err(LeaseError::LeaseAboveBurst {
            lease: 51,
            burst: 50
        })
    );
    let huge: Quota = "1/s burst 1000000".parse().unwrap();
    let err = LeasedLimiter::builder(huge)
        .max_lease(MAX_LEASE + 1)
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "a lease of 65537 tokens is more than a stripe holds: at most 65536"
    );
    assert!(LeasedLimiter::builder(huge)
        .max_lease(MAX_LEASE)
        .build()
        .is_ok());
    assert_eq!(
        build(&|b| b.lease_ttl(Duration::ZERO)),
        Err(LeaseError::TtlTooShort {
            ttl: Duration::ZERO,
            min: MIN_LEASE_TTL
        })
    );
    assert_eq!(
        build(&|b| b.lease_ttl(Duration::MAX)),
        Err(LeaseError::TtlTooLong {
            ttl: Duration::MAX,
            max: MAX_LEASE_TTL
        })
    );
    assert_eq!(
        build(&|b| b.stripes(0)),
        Err(LeaseError::Stripes {
            stripes: 0,
            max: MAX_STRIPES
        })
    );
    assert!(build(&|b| b.stripes(usize::MAX)).is_err());
    assert_eq!(
        LeaseError::ZeroLease.to_string(),
        "a lease of 0 tokens leases nothing: give 1 for an exact limiter, or more to scale"
    );
    assert_eq!(
        build(&|b| b.max_lease(51)).unwrap_err().to_string(),
        "a lease of 51 tokens is above the burst (50): a lease is taken from the bucket in \
         one step, so it must fit in it"
    );
    // The edges of each range build, and round as documented.
    let edge = LeasedLimiter::builder(quota)
        .max_lease(50)
        .lease_ttl(MIN_LEASE_TTL)
        .stripes(MAX_STRIPES - 1)
        .build()
        .unwrap();
    assert_eq!(edge.stripes(), MAX_STRIPES);
    let edge = LeasedLimiter::builder(quota)
        .lease_ttl(MAX_LEASE_TTL)
        .build()
        .unwrap();
    assert_eq!(
        edge.max_lease(),
        50,
        "the default lease, capped at the burst"
    );
    // Costs are checked as a DirectLimiter checks them.
    assert!(edge.check_n(0).is_err());
    assert!(edge.check_n(51).is_err());
}

/// Admissions per phase time, and the check of every window ending at the
/// latest phase against the exact limiter's bound plus the stated slack.
struct Windows {
    /// (phase time, admissions at it), times increasing.
    phases: Vec<(u64, u64)>,
    burst: u64,
    interval: u64,
    slack: u64,
    /// The largest excess over the exact bound seen in any window.
    worst: i64,
}

impl Windows {
    fn record(&mut self, time: u64, admitted: u64) {
        match self.phases.last_mut() {
            Some((last, count)) if *last == time => *count += admitted,
            _ => self.phases.push((time, admitted)),
        }
        let (end, _) = *self.phases.last().unwrap();
        let mut sum = 0;
        for &(start, count) in self.phases.iter().rev() {
            sum += count;
            let exact = self.burst + (end - start) / self.interval;
            self.worst = self.worst.max(sum as i64 - exact as i64);
            assert!(
                sum <= exact + self.slack,
                "{sum} admitted at readings in [{start}, {end}]: the exact limiter admits at \
                 most {exact}, the stated slack is {}",
                self.slack
            );
        }
    }
}

/// Sixteen threads on four stripes, the clock stepped between phases by
/// random amounts around the emission interval and the lease TTL: in every
/// window of readings, admissions stay within the exact limiter's bound
/// plus `over_admission_bound()`; and with fixed leases the slack is
/// really used (some window admits more than the exact limiter would), so
/// the test can fail.
#[test]
fn many_threads_stay_within_the_bound_in_every_window() {
    for adaptive in [false, true] {
        let worst = within(
            Duration::from_secs(120),
            "the phased bound test",
            move || phased_bound(adaptive),
        );
        if !adaptive {
            assert!(
                worst > 0,
                "fixed leases never carried a token across a window"
            );
        }
        eprintln!("adaptive {adaptive}: worst excess over the exact limiter {worst}");
    }
}

fn phased_bound(adaptive: bool) -> i64 {
    const THREADS: usize = 16;
    let quota: Quota = "1000/s burst 20".parse().unwrap();
    let clock = ManualClock::new();
    let limiter = LeasedLimiter::builder(quota)
        .clock(clock.clone())
        .max_lease(8)
        .lease_ttl(Duration::from_millis(10))
        .stripes(4)
        .adaptive(adaptive)
        .build()
        .unwrap();
    let mut windows = Windows {
        phases: Vec::new(),
        burst: 20,
        interval: MS,
        slack: limiter.over_admission_bound(),
        worst: i64::MIN,
    };
    assert_eq!(windows.slack, 11, "min(ceil(10.001 ms / 1 ms), 4 * 7)");
    let start = Barrier::new(THREADS + 1);
    let end = Barrier::new(THREADS + 1);
    let admitted = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let phase = AtomicU64::new(0);
    std::thread::scope(|s| {
        for thread in 0..THREADS as u64 {
            let (limiter, start, end, admitted, stop, phase) =
                (&limiter, &start, &end, &admitted, &stop, &phase);
            s.spawn(move || loop {
                start.wait();
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let mut rng = Rng((phase.load(Ordering::Relaxed) << 8 | thread) + 1);
                // A light phase leaves leases unspent for the next ones.
                let checks = match phase.load(Ordering::Relaxed) % 3 {
                    0 => rng.below(4),
                    _ => u64::from(rng.below(8) == 0),
                };
                // Tokens, not requests: a cost of 2 is two.
                let tokens: u64 = (0..checks)
                    .map(|_| 1 + rng.below(2))
                    .filter(|&cost| limiter.check_n(cost).unwrap().is_allowed())
                    .sum();
                admitted.fetch_add(tokens, Ordering::Relaxed);
                end.wait();
            });
        }
        let mut rng = Rng(0xfeed + u64::from(adaptive));
        let began = Instant::now();
        let mut time = 0;
        loop {
            let enough = began.elapsed() > Duration::from_secs(2)
                && (adaptive || windows.worst > 0)
                || began.elapsed() > Duration::from_secs(60);
            if enough {
                stop.store(true, Ordering::Relaxed);
                start.wait();
                break;
            }
            time += [0, 100_000, MS, 3 * MS, 9 * MS, 25 * MS][rng.below(6) as usize];
            clock.set_nanos(time);
            phase.fetch_add(1, Ordering::Relaxed);
            start.wait();
            end.wait();
            windows.record(time, admitted.swap(0, Ordering::Relaxed));
        }
    });
    windows.worst
}

/// The adversary's frozen clock: sixteen threads on a clock that never
/// moves, fixed and adaptive leases, the shortest and the longest time to
/// live, four stripes and one. Everything is taken at one reading, so nothing beyond the burst
/// may pass, ever, however the threads interleave. Rounds repeat (bounded
/// in time) until the threads have really raced: CAS retries counted.
#[test]
fn a_frozen_clock_admits_at_most_the_burst() {
    const BURST: u64 = 100_000;
    let quota = Quota::per_second(1_000)
        .and_then(|q| q.burst(BURST))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut rounds, mut raced) = (0, 0);
    while raced == 0 {
        assert!(
            Instant::now() < deadline,
            "sixteen threads never raced for one word in {rounds} rounds"
        );
        rounds += 1;
        // One stripe for sixteen threads, and four.
        for (adaptive, ttl, stripes) in [
            (false, MIN_LEASE_TTL, 4),
            (true, MIN_LEASE_TTL, 4),
            (false, MAX_LEASE_TTL, 4),
            (true, MAX_LEASE_TTL, 4),
            (false, MIN_LEASE_TTL, 1),
            (true, MAX_LEASE_TTL, 1),
        ] {
            let limiter = LeasedLimiter::builder(quota)
                .clock(ManualClock::starting_at(Duration::from_secs(7)))
                .max_lease(64)
                .lease_ttl(ttl)
                .stripes(stripes)
                .adaptive(adaptive)
                .build()
                .unwrap();
            let (admitted, races) = within(Duration::from_secs(120), "frozen clock", move || {
                let admitted = drain_with_sixteen_threads(&limiter);
                (admitted, turnstile_rl::__private::lease_races(&limiter))
            });
            raced += races;
            assert!(admitted <= BURST, "{admitted} admitted at one reading");
            // Under-admission is what the stripes hold and what installs
            // dropped: the bucket was spent almost whole.
            assert!(admitted > BURST / 2, "{admitted} admitted");
        }
    }
    eprintln!("{rounds} rounds until the threads raced");
}

/// Sixteen threads check `limiter` from one start until each is denied
/// (its stripe's lease and the bucket both spent); the admissions.
fn drain_with_sixteen_threads<C: Clock>(limiter: &LeasedLimiter<C>) -> u64 {
    const THREADS: usize = 16;
    let admitted = AtomicU64::new(0);
    let start = Barrier::new(THREADS);
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                start.wait();
                let mut mine = 0;
                while limiter.check().is_allowed() {
                    mine += 1;
                }
                admitted.fetch_add(mine, Ordering::Relaxed);
            });
        }
    });
    admitted.into_inner()
}

/// The adversary on the real clock: sixteen threads on this 2-core host
/// hammer one leased limiter for a while (bounded in time, a watchdog
/// aborting on a hang), at the shortest time to live. The whole run is a
/// window of readings from the clock's origin to the last reading, and
/// admits at most the exact bound for it plus the time slack
/// (`ceil((ttl + U)/T)`: the real clock's readings are not ordered, so the
/// token half of the bound does not apply). The threads raced: the
/// limiter counted lost CASes.
#[test]
fn sixteen_threads_on_the_real_clock_stay_within_the_time_bound() {
    const THREADS: usize = 16;
    let quota: Quota = "1000000/s burst 1000".parse().unwrap();
    let limiter = LeasedLimiter::builder(quota)
        .clock(QuantaClock::new())
        .max_lease(64)
        .lease_ttl(MIN_LEASE_TTL)
        .build()
        .unwrap();
    let slack = (MIN_LEASE_TTL + turnstile_rl::leased::LEASE_TICK)
        .as_nanos()
        .div_ceil(1_000) as u64;
    assert!(limiter.over_admission_bound() <= slack);
    let dog = Watchdog::start(
        "sixteen threads on one leased limiter",
        Duration::from_secs(20),
        Duration::from_secs(120),
    );
    let admitted = AtomicU64::new(0);
    let checks = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let began = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                let (mut mine, mut made) = (0, 0);
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..256 {
                        mine += u64::from(limiter.check().is_allowed());
                    }
                    made += 256;
                    dog.tick();
                }
                admitted.fetch_add(mine, Ordering::Relaxed);
                checks.fetch_add(made, Ordering::Relaxed);
            });
        }
        // Two seconds at least, and on until the threads have raced.
        while began.elapsed() < Duration::from_secs(2)
            || turnstile_rl::__private::lease_races(&limiter) == 0
                && began.elapsed() < Duration::from_secs(60)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        stop.store(true, Ordering::Relaxed);
    });
    dog.finish();
    let end = limiter.clock().now();
    let (admitted, checks) = (admitted.into_inner(), checks.into_inner());
    let exact = 1_000 + end / 1_000;
    assert!(
        admitted <= exact + slack,
        "{admitted} admitted in {end} ns: exact {exact}, slack {slack}"
    );
    let raced = turnstile_rl::__private::lease_races(&limiter);
    assert!(raced > 0, "no CAS lost in {checks} checks");
    eprintln!("{checks} checks, {admitted} admitted (exact bound {exact}), {raced} CAS retries");
}

/// The adversary's clock jumps back and forth: each phase reads a random
/// time in the first 200 ms, in no order. The token half of the bound
/// needs ordered readings and does not apply; the time half holds for any
/// readings: for every window `[a, b]` of readings, what was admitted at
/// readings in it is at most `B + floor((b - a + ttl + U)/T)`. The
/// shortest time to live makes that one token beyond the exact limiter's
/// bound, so a lease spent past its life fails the test.
#[test]
fn a_clock_jumping_back_and_forth_stays_within_the_time_bound() {
    const THREADS: u64 = 8;
    let quota: Quota = "1000/s burst 20".parse().unwrap();
    let ttl = MIN_LEASE_TTL;
    let clock = ManualClock::new();
    let limiter = LeasedLimiter::builder(quota)
        .clock(clock.clone())
        .max_lease(8)
        .lease_ttl(ttl)
        .stripes(2)
        .adaptive(false)
        .build()
        .unwrap();
    let life = (ttl + turnstile_rl::leased::LEASE_TICK).as_nanos() as u64;
    // Admissions (tokens) by reading.
    let mut at = std::collections::BTreeMap::<u64, u64>::new();
    let mut rng = Rng(0xbac4);
    let began = Instant::now();
    while began.elapsed() < Duration::from_secs(2) {
        let time = rng.below(200) * MS + rng.below(3) * 400_000;
        clock.set_nanos(time);
        let tokens: u64 = std::thread::scope(|s| {
            let threads: Vec<_> = (0..THREADS)
                .map(|thread| {
                    let limiter = &limiter;
                    s.spawn(move || {
                        let mut rng = Rng(time ^ thread << 40 | 1);
                        (0..rng.below(4))
                            .map(|_| 1 + rng.below(2))
                            .filter(|&cost| limiter.check_n(cost).unwrap().is_allowed())
                            .sum::<u64>()
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).sum()
        });
        *at.entry(time).or_default() += tokens;
    }
    let readings: Vec<(u64, u64)> = at.into_iter().collect();
    let mut worst = i64::MIN;
    for (i, &(a, _)) in readings.iter().enumerate() {
        let mut sum = 0;
        for &(b, count) in &readings[i..] {
            sum += count;
            let most = 20 + (b - a + life) / MS;
            assert!(
                sum <= most,
                "{sum} admitted at readings in [{a}, {b}]: the time bound is {most}"
            );
            worst = worst.max(sum as i64 - (20 + (b - a) / MS) as i64);
        }
    }
    eprintln!(
        "{} readings; worst excess over the exact limiter {worst}",
        readings.len()
    );
}
