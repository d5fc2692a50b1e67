//! Regression, found by an adversarial review: a key type whose `Clone`
//! (the `ToOwned` that makes the stored key) or `Eq` panics must not leak
//! the `len` reservation `admit` takes before inserting. It used to: `len()`
//! then counted keys that did not exist, and at `max_keys` the limiter
//! refused every fresh key forever. The reservation is now a guard given
//! back on unwind (`Reservation` in `src/keyed.rs`).

use std::hash::{Hash, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};

use turnstile_rl::{KeyedLimiter, ManualClock, OverflowPolicy, Quota};

static ARMED: AtomicBool = AtomicBool::new(false);

#[derive(PartialEq, Eq)]
struct Bomb(u64);
impl Hash for Bomb {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.0.hash(h)
    }
}
impl Clone for Bomb {
    fn clone(&self) -> Self {
        if ARMED.load(Ordering::Relaxed) {
            panic!("hostile clone");
        }
        Bomb(self.0)
    }
}

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn run(policy: OverflowPolicy) -> (usize, bool) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let clock = ManualClock::new();
    let limiter: KeyedLimiter<Bomb, ManualClock> =
        KeyedLimiter::builder("10/s".parse::<Quota>().unwrap())
            .clock(clock.clone())
            .max_keys(4)
            .overflow(policy)
            .build();
    std::panic::set_hook(Box::new(|_| {}));
    ARMED.store(true, Ordering::Relaxed);
    for i in 0..4 {
        let r = catch_unwind(AssertUnwindSafe(|| limiter.check(&Bomb(i))));
        assert!(r.is_err(), "clone should have panicked");
    }
    ARMED.store(false, Ordering::Relaxed);
    let _ = std::panic::take_hook();
    // No key was ever stored; an hour later every one would be idle anyway.
    clock.advance(std::time::Duration::from_secs(3600));
    let evicted = limiter.evict_idle();
    assert_eq!(evicted, 0);
    let len = limiter.len();
    let tracked = limiter.check(&Bomb(1000)).is_allowed();
    // AllowUntracked admits untracked: see whether the key became tracked.
    let tracked = tracked && limiter.len() > len;
    (len, tracked)
}

/// `len` is 0 after the panics and a fresh key is admitted (before the
/// fix: `len` 4 and every fresh key refused, forever).
#[test]
fn a_panicking_clone_gives_its_reservation_back_deny() {
    let (len, admitted) = run(OverflowPolicy::Deny);
    assert_eq!(len, 0, "len() counts {len} keys that were never stored");
    assert!(admitted, "fresh key refused: limiter permanently full");
}

/// The same with the default policy (before the fix: nothing live to
/// evict, so every fresh key was refused after 16 attempts).
#[test]
fn a_panicking_clone_gives_its_reservation_back_evict_fullest() {
    let (len, admitted) = run(OverflowPolicy::EvictFullest);
    assert_eq!(len, 0, "len() counts {len} keys that were never stored");
    assert!(admitted, "fresh key refused: limiter permanently full");
}

thread_local! {
    static EQ_CALLS_UNTIL_PANIC: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Keys with one shared hash, whose `Eq` panics on its Nth call when armed.
#[derive(Clone)]
struct Touchy(u64);
impl Hash for Touchy {
    fn hash<H: Hasher>(&self, h: &mut H) {
        0u8.hash(h)
    }
}
impl PartialEq for Touchy {
    fn eq(&self, o: &Self) -> bool {
        let left = EQ_CALLS_UNTIL_PANIC.with(|c| c.get());
        if left > 0 {
            EQ_CALLS_UNTIL_PANIC.with(|c| c.set(left - 1));
            if left == 1 {
                panic!("hostile eq");
            }
        }
        self.0 == o.0
    }
}
impl Eq for Touchy {}

/// The same through `Eq` (it leaked too): the lookup compares the new key with
/// the 3 keys on its chain, `admit` reserves, and the insert's probe
/// compares again; a panic there (4th call) used to keep the reservation,
/// and with `max_keys` 4 the limiter was full with 3 keys, for good.
#[test]
fn a_panicking_eq_in_the_insert_probe_gives_its_reservation_back() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let limiter: KeyedLimiter<Touchy, ManualClock> =
        KeyedLimiter::builder("10/s".parse::<Quota>().unwrap())
            .clock(ManualClock::new())
            .max_keys(4)
            .overflow(OverflowPolicy::Deny)
            .build();
    for i in 0..3 {
        assert!(limiter.check(&Touchy(i)).is_allowed());
    }
    std::panic::set_hook(Box::new(|_| {}));
    EQ_CALLS_UNTIL_PANIC.with(|c| c.set(4));
    let r = catch_unwind(AssertUnwindSafe(|| limiter.check(&Touchy(100))));
    EQ_CALLS_UNTIL_PANIC.with(|c| c.set(0));
    let _ = std::panic::take_hook();
    assert!(r.is_err(), "eq should have panicked");
    assert_eq!(limiter.len(), 3, "len() counts a key that was never stored");
    assert!(
        limiter.check(&Touchy(200)).is_allowed(),
        "4th key refused at max_keys 4"
    );
}
