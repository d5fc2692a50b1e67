//! Regression, found by an adversarial review of the stale-clock fix: a
//! fresh bucket decided at a clock reading taken early in `admit`, then
//! inserted after another thread had inserted the key, used it and evicted
//! it as idle at a later reading, started in the past and admitted more
//! than GCRA allows. The fresh state is now decided right before each
//! attempt to publish the node (`RawMap::insert`'s `state`), after the
//! probe that found the key absent; a stall in between makes the CAS fail
//! (the key's chain changed) and the next attempt reads the clock again.
//!
//! Made deterministic with a clock that holds back the stalled thread's
//! second reading until released, as a preemption would.

use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

use turnstile_rl::{Clock, KeyedLimiter, ManualClock, Quota};

use turnstile_test_kit::watchdog;
use watchdog::Watchdog;

#[derive(Clone)]
struct SecondReadingStalls {
    time: ManualClock,
    gate: Arc<(Mutex<(bool, bool)>, Condvar)>, // (stalled, released)
}

thread_local! {
    static READS_UNTIL_STALL: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

impl Clock for SecondReadingStalls {
    fn now(&self) -> u64 {
        let now = self.time.now();
        let left = READS_UNTIL_STALL.with(|r| r.get());
        if left > 0 {
            READS_UNTIL_STALL.with(|r| r.set(left - 1));
            if left == 1 {
                let (state, wake) = &*self.gate;
                let mut s = state.lock().unwrap();
                s.0 = true;
                wake.notify_all();
                while !s.1 {
                    s = wake.wait(s).unwrap();
                }
            }
        }
        now
    }
}

/// Quota 1/s burst 3. A's check of a fresh key reads 10 s twice and stalls
/// after the second reading. Meanwhile the key is inserted and its 3
/// tokens used at 10 s; at 13 s it is full again and evicted as idle. A
/// resumes and inserts a bucket decided at 10 s: admitted. At 13 s three
/// more are admitted. Over [10 s, 13 s] GCRA allows burst + 3 s / 1 s = 6;
/// 7 are admitted.
#[test]
fn a_fresh_bucket_is_decided_after_any_later_eviction() {
    let dog = Watchdog::start("stale", Duration::from_secs(10), Duration::from_secs(30));
    let time = ManualClock::new();
    let clock = SecondReadingStalls {
        time: time.clone(),
        gate: Arc::new((Mutex::new((false, false)), Condvar::new())),
    };
    let limiter = Arc::new(
        KeyedLimiter::builder("1/s burst 3".parse::<Quota>().unwrap())
            .clock(clock.clone())
            .build(),
    );
    // Take the housekeeping tick now so none runs below.
    time.set(Duration::from_secs(10));
    let _ = limiter.check(&999u64);
    let a = {
        let limiter = limiter.clone();
        thread::spawn(move || {
            READS_UNTIL_STALL.with(|r| r.set(2));
            limiter.check(&1u64).is_allowed() // reads 10 s, misses, re-reads 10 s, stalls
        })
    };
    {
        let (state, wake) = &*clock.gate;
        let mut s = state.lock().unwrap();
        while !s.0 {
            s = wake.wait(s).unwrap();
        }
    }
    dog.tick();
    let mut admitted = 0;
    for _ in 0..3 {
        admitted += limiter.check(&1u64).is_allowed() as u32;
    }
    assert_eq!(admitted, 3);
    time.set(Duration::from_secs(13));
    assert!(limiter.evict_idle() >= 1, "the key is idle at 13 s");
    {
        let (state, wake) = &*clock.gate;
        state.lock().unwrap().1 = true;
        wake.notify_all();
    }
    let a_admitted = a.join().unwrap();
    admitted += a_admitted as u32;
    for _ in 0..3 {
        admitted += limiter.check(&1u64).is_allowed() as u32;
    }
    dog.finish();
    assert!(
        admitted <= 6,
        "{admitted} admissions for key 1 over [10 s, 13 s]; GCRA allows 3 + 3 = 6 \
         (the stalled check was admitted: {a_admitted})"
    );
}
