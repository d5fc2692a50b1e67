//! Adversary (adv2): `LeasedLimiter`'s over-admission bound
//! (`src/leased.rs`, "The bound") attacked with many threads on this
//! 2-core host, a clock that jumps back and forth under them, one stripe
//! and many, a lease at the burst, costs up to the burst, a burst of 1,
//! the shortest and longest time to live, and readings across the 2^58 ns
//! end of a lease's tick.
//!
//! Every admission is counted at the clock reading its own check used (a
//! clock that records, per thread, the reading it last returned: a check
//! reads the clock once), and every window `[a, b]` of readings is held
//! to the bound: the time half, `B + floor((b - a + ttl + U)/T)`, for any
//! readings; the token half, `B + floor((b - a)/T) + S*(L - 1)`, where the
//! clock moves only between phases (ordered readings).

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use turnstile_rl::leased::{LEASE_TICK, MAX_LEASE_TTL, MIN_LEASE_TTL};
use turnstile_rl::{Clock, LeasedLimiter, Quota};
use turnstile_test_kit::watchdog::Watchdog;

mod adv2_kit;
use adv2_kit::Rng;

const THREADS: usize = 32;

thread_local! {
    /// The reading this thread's last clock read returned.
    static LAST_READING: Cell<u64> = const { Cell::new(0) };
    /// This thread's jitter generator.
    static JITTER: Cell<u64> = const { Cell::new(0) };
}

/// A clock that remembers, per thread, the reading it returned. Set from
/// outside (the phased test), or *jumping*: each reading moves a shared
/// time forward by `advance` and returns it less a random jitter of up to
/// `back` nanoseconds, so successive readings (on one thread or across
/// threads) jump back and forth while time moves as fast as checks are
/// made, however loaded the machine.
#[derive(Clone, Default)]
struct Recording {
    time: Arc<AtomicU64>,
    advance: u64,
    back: u64,
}

impl Clock for Recording {
    fn now(&self) -> u64 {
        let reading = if self.advance == 0 {
            self.time.load(Ordering::Relaxed)
        } else {
            let time = self.time.fetch_add(self.advance, Ordering::Relaxed);
            let jitter = JITTER.with(|state| {
                let mut rng = Rng(state.get() | 1);
                let jitter = rng.below(self.back + 1);
                state.set(rng.0);
                jitter
            });
            time - jitter
        };
        LAST_READING.with(|last| last.set(reading));
        reading
    }
}

impl Recording {
    fn set(&self, nanos: u64) {
        self.time.store(nanos, Ordering::Relaxed);
    }
}

/// One attack's settings.
#[derive(Clone, Copy, Debug)]
struct Attack {
    quota: &'static str,
    max_lease: u64,
    ttl: Duration,
    stripes: usize,
    adaptive: bool,
    most_cost: u64,
    /// Readings start at `base`, time moves `advance` a reading, and each
    /// reading jumps back by up to `back`.
    base: u64,
    advance: u64,
    back: u64,
}

/// The largest excess of admissions in a window of readings `[a, a + w]`
/// over `most(w)`, for each `w` of `lengths` and every `a` an admission's
/// reading: two pointers per length.
fn worst_window(
    at: &BTreeMap<u64, u64>,
    lengths: &[u64],
    most: impl Fn(u64) -> u64,
) -> (i64, String) {
    let readings: Vec<(u64, u64)> = at.iter().map(|(&r, &n)| (r, n)).collect();
    let mut worst = (i64::MIN, String::new());
    for &w in lengths {
        let (mut end, mut sum) = (0, 0);
        for (i, &(a, count)) in readings.iter().enumerate() {
            while end < readings.len() && readings[end].0 <= a.saturating_add(w) {
                sum += readings[end].1;
                end += 1;
            }
            let excess = sum as i64 - most(w) as i64;
            if excess > worst.0 {
                worst = (
                    excess,
                    format!("{sum} admitted at readings in [{a}, {a} + {w}]"),
                );
            }
            let _ = i;
            sum -= count;
        }
    }
    worst
}

/// Thirty-two threads check (random costs up to `most_cost`) while this
/// thread moves the clock to random readings of the grid, back and forth,
/// for `run`. Admitted tokens by reading, and the CAS races lost.
fn jump_and_count(attack: Attack, run: Duration) -> (BTreeMap<u64, u64>, u64, u64) {
    let quota: Quota = attack.quota.parse().unwrap();
    let clock = Recording {
        time: Arc::new(AtomicU64::new(attack.base + attack.back)),
        advance: attack.advance,
        back: attack.back,
    };
    let limiter = LeasedLimiter::builder(quota)
        .clock(clock.clone())
        .max_lease(attack.max_lease)
        .lease_ttl(attack.ttl)
        .stripes(attack.stripes)
        .adaptive(attack.adaptive)
        .build()
        .unwrap();
    let dog = Watchdog::start(
        "thirty-two threads on a jumping clock",
        Duration::from_secs(20),
        Duration::from_secs(120),
    );
    let stop = AtomicBool::new(false);
    let start = Barrier::new(THREADS + 1);
    let mut checks = 0;
    let mut at = BTreeMap::<u64, u64>::new();
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS as u64)
            .map(|thread| {
                let (limiter, stop, start, dog) = (&limiter, &stop, &start, &dog);
                s.spawn(move || {
                    JITTER.with(|state| state.set(thread + 1));
                    let mut rng = Rng(thread + 1);
                    let mut admitted = Vec::new();
                    let mut checks = 0u64;
                    start.wait();
                    while !stop.load(Ordering::Relaxed) {
                        let cost = 1 + rng.below(attack.most_cost);
                        let decision = limiter.check_n(cost).unwrap();
                        let reading = LAST_READING.with(Cell::get);
                        if decision.is_allowed() {
                            admitted.push((reading, cost));
                            assert!(decision.remaining() <= decision.limit());
                            assert_eq!(decision.retry_after(), None);
                        } else {
                            assert!(decision.retry_after().is_some_and(|r| !r.is_zero()));
                        }
                        checks += 1;
                        if checks.is_multiple_of(64) {
                            dog.tick();
                        }
                    }
                    (admitted, checks)
                })
            })
            .collect();
        start.wait();
        std::thread::sleep(run);
        stop.store(true, Ordering::Relaxed);
        for worker in workers {
            let (admitted, made) = worker.join().unwrap();
            checks += made;
            for (reading, cost) in admitted {
                *at.entry(reading).or_default() += cost;
            }
        }
    });
    dog.finish();
    let races = turnstile_rl::__private::lease_races(&limiter);
    (at, races, checks)
}

/// The time half of the bound holds for any readings, in every window:
/// at most `B + floor((w + ttl + U)/T)`.
#[test]
fn thirty_two_threads_on_a_jumping_clock_stay_within_the_time_bound() {
    const MS: u64 = 1_000_000;
    let attacks = [
        // One stripe for 32 threads, the shortest life.
        Attack {
            quota: "1000/s burst 20",
            max_lease: 8,
            ttl: MIN_LEASE_TTL,
            stripes: 1,
            adaptive: false,
            most_cost: 2,
            base: 5 * MS,
            advance: 50_000,
            back: 20_000,
        },
        // A lease at the burst, costs up to the burst, many stripes.
        Attack {
            quota: "1000/s burst 20",
            max_lease: 20,
            ttl: Duration::from_millis(3),
            stripes: 64,
            adaptive: false,
            most_cost: 20,
            base: 5 * MS,
            advance: 50_000,
            back: 100_000,
        },
        // A burst of 1, adaptive.
        Attack {
            quota: "1000/s burst 1",
            max_lease: 1,
            ttl: MIN_LEASE_TTL,
            stripes: 4,
            adaptive: true,
            most_cost: 1,
            base: 5 * MS,
            advance: 50_000,
            back: 20_000,
        },
        // A fast quota whose interval is near the tick: T = 10 µs.
        Attack {
            quota: "100000/s burst 64",
            max_lease: 64,
            ttl: MIN_LEASE_TTL,
            stripes: 2,
            adaptive: false,
            most_cost: 3,
            base: 5 * MS,
            advance: 500,
            back: 20_000,
        },
        // Readings on both sides of the last tick (2^58 ns).
        Attack {
            quota: "100000/s burst 64",
            max_lease: 64,
            ttl: Duration::from_micros(100),
            stripes: 2,
            adaptive: false,
            most_cost: 3,
            base: (1 << 58) - 2 * MS,
            advance: 500,
            back: 200_000,
        },
    ];
    let (mut all_races, mut most_over_exact) = (0, i64::MIN);
    for attack in attacks {
        let quota: Quota = attack.quota.parse().unwrap();
        let t = turnstile_rl::__private::interval_nanos(&quota);
        let burst = quota.burst_size();
        let life = (attack.ttl + LEASE_TICK).as_nanos() as u64;
        let (at, races, checks) = jump_and_count(attack, Duration::from_secs(1));
        let back = attack.back;
        let lengths = [
            0,
            attack.advance,
            life,
            t / 2,
            t,
            2 * t,
            t + life,
            5 * t,
            20 * t,
            100 * t,
            back,
            2 * back,
            10 * back,
        ];
        let (excess, window) = worst_window(&at, &lengths, |w| burst + (w + life) / t);
        let (over_exact, _) = worst_window(&at, &lengths, |w| burst + w / t);
        eprintln!(
            "{attack:?}: {checks} checks, {} readings admitted at, {races} races; worst excess \
             over the exact limiter {over_exact}, over the time bound {excess}",
            at.len()
        );
        assert!(
            excess <= 0,
            "{attack:?}: {window}, over the time bound by {excess}"
        );
        assert!(at.len() > 100, "{attack:?}: admissions at too few readings");
        let last_tick_end = 1 << 58;
        if attack.base < last_tick_end && attack.base + attack.back > last_tick_end - 4_000_000 {
            assert!(
                at.range(..last_tick_end).next().is_some()
                    && at.range(last_tick_end..).next().is_some(),
                "{attack:?}: admissions not on both sides of 2^58 ns"
            );
        }
        all_races += races;
        most_over_exact = most_over_exact.max(over_exact);
    }
    assert!(all_races > 0, "no CAS lost: the threads never raced");
    // Jittered readings keep every window below the exact limiter's
    // bound here (a reading behind the bucket's is denied): the phased
    // test below, and tests/leased.rs, are the ones that use the slack.
    eprintln!("worst excess over the exact limiter in any attack: {most_over_exact}");
}

/// The token half, with ordered readings (the clock moves forward only
/// between phases): 32 threads on two stripes, leases at the burst that
/// live an hour, costs up to the burst. Every window admits at most
/// `B + floor(w/T) + S*(L - 1)`.
#[test]
fn thirty_two_threads_with_ordered_readings_stay_within_the_token_bound() {
    const MS: u64 = 1_000_000;
    let quota: Quota = "1000/s burst 16".parse().unwrap();
    let clock = Recording::default();
    clock.set(MS);
    let limiter = LeasedLimiter::builder(quota)
        .clock(clock.clone())
        .max_lease(16)
        .lease_ttl(MAX_LEASE_TTL)
        .stripes(2)
        .adaptive(false)
        .build()
        .unwrap();
    let slack = limiter.over_admission_bound();
    assert_eq!(slack, 2 * 15, "two stripes of 15");
    let dog = Watchdog::start(
        "phases of thirty-two threads",
        Duration::from_secs(20),
        Duration::from_secs(120),
    );
    let start = Barrier::new(THREADS + 1);
    let end = Barrier::new(THREADS + 1);
    let stop = AtomicBool::new(false);
    let phase = AtomicU64::new(0);
    let admitted = AtomicU64::new(0);
    let mut at = BTreeMap::<u64, u64>::new();
    let mut worst = i64::MIN;
    std::thread::scope(|s| {
        for thread in 0..THREADS as u64 {
            let (limiter, start, end, stop, phase, admitted, dog) =
                (&limiter, &start, &end, &stop, &phase, &admitted, &dog);
            s.spawn(move || loop {
                start.wait();
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let mut rng = Rng(phase.load(Ordering::Relaxed) << 8 | thread | 1);
                let checks = if rng.below(3) == 0 { rng.below(3) } else { 0 };
                let tokens: u64 = (0..checks)
                    .map(|_| 1 + rng.below(16))
                    .filter(|&cost| limiter.check_n(cost).unwrap().is_allowed())
                    .sum();
                admitted.fetch_add(tokens, Ordering::Relaxed);
                dog.tick();
                end.wait();
            });
        }
        let mut rng = Rng(0x0bd3);
        let mut time = MS;
        let began = Instant::now();
        while began.elapsed() < Duration::from_secs(3) {
            time += [0, MS / 10, MS, 5 * MS, 16 * MS][rng.below(5) as usize];
            clock.set(time);
            phase.fetch_add(1, Ordering::Relaxed);
            start.wait();
            end.wait();
            *at.entry(time).or_default() += admitted.swap(0, Ordering::Relaxed);
            // Check the windows ending here only (the earlier ones were).
            let mut sum = 0;
            for (&a, &count) in at.iter().rev() {
                sum += count;
                let exact = 16 + (time - a) / MS;
                worst = worst.max(sum as i64 - exact as i64);
                assert!(
                    sum <= exact + slack,
                    "{sum} admitted at readings in [{a}, {time}]: exact {exact}, slack {slack}"
                );
            }
        }
        stop.store(true, Ordering::Relaxed);
        start.wait();
    });
    dog.finish();
    eprintln!(
        "{} phases; worst excess over the exact limiter {worst}",
        at.len()
    );
    assert!(
        worst > 0,
        "no window used the slack: the test could not fail"
    );
}
