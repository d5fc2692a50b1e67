//! Adversary (adv2): `QuantaClock` reads the TSC inline (`src/clock.rs`,
//! `tsc::read` and `scale`) instead of through `quanta::Clock::raw` and
//! `delta_as_nanos`. Its readings must be quanta's, up to the constant
//! between the two clocks' origins: no drift over time, on any thread (the
//! scheduler moves these threads between both cores), and no step back
//! that quanta's own readings do not also take.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use turnstile_rl::{Clock, QuantaClock};

/// Four threads read both clocks, interleaved (ours, quanta's, ours),
/// for two seconds. The offset between them (quanta's minus ours) is
/// fixed when both read one TSC at one scale: each quanta reading lies
/// between the two of ours around it, shifted by that offset, give or
/// take the read's own rounding (2 ns). Steps back are counted for both.
#[test]
fn the_inline_reading_is_quantas_on_every_thread_over_time() {
    const THREADS: usize = 4;
    let ours = QuantaClock::new();
    let theirs = quanta::Clock::new();
    let origin = theirs.raw();
    // The offset, from the narrowest of 1,000 triples (ours, quanta's,
    // ours): quanta's reading on our scale lies within half its width.
    let (offset, width) = (0..1_000)
        .map(|_| {
            let a = ours.now();
            let q = theirs.delta_as_nanos(origin, theirs.raw());
            let b = ours.now();
            ((a + b) as i128 / 2 - q as i128, b - a)
        })
        .min_by_key(|&(_, width)| width)
        .unwrap();
    let start = Barrier::new(THREADS);
    let results: Vec<(u64, i128, i128, u64, u64)> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..THREADS)
            .map(|_| {
                let (ours, theirs, start) = (&ours, &theirs, &start);
                s.spawn(move || {
                    start.wait();
                    let began = Instant::now();
                    let (mut reads, mut low, mut high) = (0u64, i128::MAX, i128::MIN);
                    let (mut ours_back, mut theirs_back) = (0, 0);
                    let (mut last_ours, mut last_theirs) = (0, 0);
                    while began.elapsed() < Duration::from_secs(2) {
                        let a = ours.now();
                        let q = theirs.delta_as_nanos(origin, theirs.raw());
                        let b = ours.now();
                        // quanta's reading, on our scale.
                        let q = q as i128 + offset;
                        low = low.min(q - a as i128);
                        high = high.max(q - b as i128);
                        ours_back += u64::from(a < last_ours || b < a);
                        theirs_back += u64::from((q as u64) < last_theirs);
                        last_ours = b;
                        last_theirs = q as u64;
                        reads += 1;
                    }
                    (reads, low, high, ours_back, theirs_back)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let end = ours.now();
    eprintln!("offset {offset} ns, known within {width} ns");
    for (reads, low, high, ours_back, theirs_back) in results {
        eprintln!(
            "{reads} reads; quanta minus ours from {low} ns (before) to {high} ns (after); \
             steps back: ours {ours_back}, quanta's {theirs_back}"
        );
        assert!(reads > 1_000, "the thread hardly read");
        // Between ours before and ours after, give or take the offset's
        // own uncertainty, 2 ns of rounding and the scale's 1 ns per 2^40
        // ticks (a nanosecond is more than one tick).
        let slack = width as i128 / 2 + 2 + (end >> 40) as i128;
        assert!(low >= -slack, "quanta's reading {low} ns before ours");
        assert!(high <= slack, "quanta's reading {high} ns after ours");
        assert!(
            ours_back <= theirs_back + 1,
            "ours stepped back {ours_back} times, quanta's {theirs_back}"
        );
    }
}
