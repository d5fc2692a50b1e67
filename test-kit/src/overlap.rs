//! Stress rounds whose threads overlap however the scheduler runs them.
//!
//! A round of a fixed count of operations per thread finished, on a loaded
//! machine, inside one time slice per thread: the threads ran one after
//! another and raced nothing. Here each worker goes on until every worker
//! has made its count since all the round's threads had started, so each
//! one is still running while the others make theirs.

use std::sync::atomic::{AtomicU64, Ordering};

/// Runs `work(t, i)` for `i` = 0, 1, ... on `workers` threads (`t` = 0 to
/// `workers - 1`) and, if given, `background()` in a loop on one more,
/// until every worker has made `each` calls since all the threads had
/// started.
pub fn overlapping(
    workers: u64,
    each: u64,
    work: impl Fn(u64, u64) + Sync,
    background: Option<&(dyn Fn() + Sync)>,
) {
    let threads = workers + u64::from(background.is_some());
    let started = AtomicU64::new(0);
    let all_started = || started.load(Ordering::Relaxed) == threads;
    // Workers that have not yet made their `each` calls.
    let short = AtomicU64::new(workers);
    let done = || short.load(Ordering::Relaxed) == 0;
    std::thread::scope(|s| {
        for t in 0..workers {
            let (work, started, short) = (&work, &started, &short);
            s.spawn(move || {
                started.fetch_add(1, Ordering::Relaxed);
                let mut counted = 0;
                for i in 0.. {
                    work(t, i);
                    if counted < each {
                        if all_started() {
                            counted += 1;
                            if counted == each {
                                short.fetch_sub(1, Ordering::Relaxed);
                            }
                        }
                    } else if done() {
                        break;
                    }
                }
            });
        }
        if let Some(background) = background {
            s.spawn(|| {
                started.fetch_add(1, Ordering::Relaxed);
                while !done() {
                    background();
                    std::thread::yield_now();
                }
            });
        }
    });
}
