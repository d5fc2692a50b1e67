//! Children forked at random moments of a churning limiter (threads
//! checking new keys, `evict_idle` or `clear` in a loop, so that a
//! migration is under way at almost every fork) go on as any process:
//! none hangs, each keeps the state of every key its parent had charged
//! (but the documented loss, a bucket whose copy was in flight with no
//! copy placed: at most one per thread of the parent), drops each stored
//! key once, and admits its own new keys exactly; a grandchild forked
//! while the child's own threads churn does the same. Bounded by time
//! (`FORK_CHURN_SECS`, 4 s a case by default; `FORK_CHURN_VERBOSE` names
//! each lost key), and it asserts that it forked children while the
//! parent's `evict_idle` was inside its migration of the whole table. Its
//! own binary: it forks the whole process.

#![cfg(target_os = "linux")]

mod fork_kit;

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use turnstile_rl::{KeyedLimiter, ManualClock, Quota};

use fork_kit::wait_for;

/// The cases take turns: each forks the whole process.
static SERIAL: Mutex<()> = Mutex::new(());

/// Keys stored by the limiter: `id` is what they hash and compare; each
/// clone (the copy a limiter stores) gets a serial of its own, and its
/// drop is marked in [`DROPPED`]: a serial dropped twice is a key the map
/// dropped twice.
#[derive(Debug)]
struct Counted {
    id: u64,
    serial: u64,
}

/// Serials handed out so far (0 is a caller's own key, not counted).
static SERIALS: AtomicU64 = AtomicU64::new(1);
/// Serials whose key was dropped, one bit each.
static DROPPED: [AtomicU64; 1 << 20] = [const { AtomicU64::new(0) }; 1 << 20];
/// Set when a serial is dropped twice.
static DROPPED_TWICE: AtomicBool = AtomicBool::new(false);

impl Counted {
    fn new(id: u64) -> Self {
        Counted { id, serial: 0 }
    }
}

impl Clone for Counted {
    fn clone(&self) -> Self {
        Counted {
            id: self.id,
            serial: SERIALS.fetch_add(1, SeqCst),
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        let serial = self.serial as usize;
        if serial == 0 || serial >= DROPPED.len() * 64 {
            return;
        }
        let bit = 1 << (serial % 64);
        if DROPPED[serial / 64].fetch_or(bit, SeqCst) & bit != 0 {
            DROPPED_TWICE.store(true, SeqCst);
        }
    }
}

impl Hash for Counted {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.id.hash(state);
    }
}

impl PartialEq for Counted {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for Counted {}

type Limiter = KeyedLimiter<Counted, ManualClock>;

/// Keys charged once before the churn starts (ids `0..TRACKED`).
const TRACKED: u64 = 200;
/// Burst of the quota: a tracked key has `BURST - 1` tokens left.
const BURST: usize = 3;
/// Threads that check new keys in the parent (and in each child).
const CHECKERS: usize = 3;
/// Keys each churn cycles through.
const CHURN_KEYS: u64 = 200_000;
/// New keys a child checks on its own (through several migrations).
const CHILD_NEW_KEYS: u64 = 1_000;

/// Exit statuses of a child: `0..=LOSS_LIMIT` is the number of tracked
/// keys it found refilled (lost), the rest are failures.
const LOSS_LIMIT: i32 = 40;
const WRONG_STATE: i32 = 50;
const NEW_KEY_WRONG: i32 = 51;
const DROPPED_TWICE_EXIT: i32 = 52;
const PANICKED: i32 = 53;
const GRANDCHILD_FAILED: i32 = 54;
const GRANDCHILD_HUNG: i32 = 55;
const TOO_MANY_KEYS: i32 = 56;
/// Added to a child's loss count when its parent's `evict_idle` or
/// `clear` thread was inside its call at the fork: inside a migration of
/// the whole table, every chunk of which it had claimed.
const FORKED_MID_EVICTION: i32 = 64;
/// Added when the child's repair finished a migration its parent's
/// vanished threads had under way (`__private::fork_repairs`).
const REPAIR_FINISHED_A_MIGRATION: i32 = 128;
/// The flags above, beside a loss count or a failure.
const FLAGS: i32 = FORKED_MID_EVICTION | REPAIR_FINISHED_A_MIGRATION;

/// Whether the churn's `evict_idle`/`clear` thread is inside its call (a
/// child reads its parent's value at the fork).
static EVICTING: AtomicBool = AtomicBool::new(false);

fn quota() -> Quota {
    "1/h burst 3".parse().expect("a valid quota")
}

/// How long each case churns.
fn churn_time() -> Duration {
    let secs = std::env::var("FORK_CHURN_SECS")
        .ok()
        .and_then(|secs| secs.parse().ok())
        .unwrap_or(4);
    Duration::from_secs(secs)
}

/// Writes to the real standard error (the harness's capture lives in the
/// parent).
fn tell(message: &str) {
    // SAFETY: `write` reads `message.len()` bytes from a live `&str`.
    unsafe { libc::write(2, message.as_ptr().cast(), message.len()) };
}

/// What churns a limiter until `stop`: keys from `base` on (new ones,
/// then the same [`CHURN_KEYS`] again) on [`CHECKERS`] threads, and
/// `evict_idle` (every fourth call `clear`, if `clear`) in a loop on
/// another, which advances the clock after each call if `advance`.
fn churn(
    limiter: &Arc<Limiter>,
    base: u64,
    stop: &Arc<AtomicBool>,
    clear: bool,
    advance: bool,
) -> Vec<thread::JoinHandle<()>> {
    let mut threads = Vec::new();
    let next_key = Arc::new(AtomicU64::new(0));
    for _ in 0..CHECKERS {
        let (limiter, next_key, stop) = (limiter.clone(), next_key.clone(), stop.clone());
        threads.push(thread::spawn(move || {
            while !stop.load(SeqCst) {
                // Within a range: new keys at first, then the same keys
                // again, so that the default bound is never reached.
                let n = next_key.fetch_add(1, SeqCst);
                let _ = limiter.check(&Counted::new(base + n % CHURN_KEYS));
            }
        }));
    }
    let (limiter, stop) = (limiter.clone(), stop.clone());
    threads.push(thread::spawn(move || {
        let mut round = 0u64;
        while !stop.load(SeqCst) {
            round += 1;
            EVICTING.store(true, SeqCst);
            if clear && round.is_multiple_of(4) {
                let _ = limiter.clear();
            } else {
                let _ = limiter.evict_idle();
            }
            EVICTING.store(false, SeqCst);
            if advance {
                limiter.clock().advance(Duration::from_millis(50));
            }
        }
    }));
    threads
}

/// The checks of a forked process: the tracked keys (if `exact`) have
/// `BURST - 1` tokens left but for the lost ones, the process's own new
/// keys get exactly the burst, and so on. Returns the exit status.
fn child_checks(limiter: &Arc<Limiter>, exact: bool, first_key: u64, depth: u32) -> i32 {
    let mid_eviction = if EVICTING.load(SeqCst) {
        FORKED_MID_EVICTION
    } else {
        0
    };
    let mut lost = 0;
    if exact {
        for id in 0..TRACKED {
            let key = Counted::new(id);
            let admitted = (0..BURST + 1)
                .filter(|_| limiter.check(&key).is_allowed())
                .count();
            // A tracked key entered with `left` tokens: it admits exactly
            // that many now, or the full burst if it was lost.
            let left = if depth == 0 { BURST - 1 } else { 0 };
            if admitted == BURST {
                lost += 1;
                if std::env::var("FORK_CHURN_VERBOSE").is_ok() {
                    tell(&format!(
                        "fork churn: depth {depth}: tracked key {id} lost\n"
                    ));
                }
            } else if admitted != left {
                tell(&format!(
                    "fork churn: depth {depth}: tracked key {id} admitted {admitted}, expected {left}\n"
                ));
                return WRONG_STATE;
            }
        }
    }
    // The child's own new keys, on its one thread: exactly the burst each.
    for id in first_key..first_key + CHILD_NEW_KEYS {
        let key = Counted::new(id);
        let admitted = (0..BURST + 1)
            .filter(|_| limiter.check(&key).is_allowed())
            .count();
        if admitted != BURST {
            tell(&format!(
                "fork churn: depth {depth}: new key {id} admitted {admitted}\n"
            ));
            return NEW_KEY_WRONG;
        }
    }
    if limiter.len() > limiter.max_keys() {
        tell(&format!(
            "fork churn: depth {depth}: {} keys held, max {}\n",
            limiter.len(),
            limiter.max_keys()
        ));
        return TOO_MANY_KEYS;
    }
    if depth == 0 {
        // Churn on the child's own threads, and fork a grandchild in it.
        let stop = Arc::new(AtomicBool::new(false));
        let threads = churn(limiter, first_key + 10_000_000, &stop, false, false);
        thread::sleep(Duration::from_millis(2));
        let pid = fork_kit::fork(|| run_child(limiter, exact, first_key + 20_000_000, 1));
        let status = wait_for(pid);
        stop.store(true, SeqCst);
        for thread in threads {
            if thread.join().is_err() {
                return PANICKED;
            }
        }
        match status {
            None => {
                tell("fork churn: a grandchild hung\n");
                return GRANDCHILD_HUNG;
            }
            Some(status) if libc::WIFEXITED(status) => {
                let code = libc::WEXITSTATUS(status);
                if code & !FLAGS > LOSS_LIMIT {
                    return GRANDCHILD_FAILED;
                }
            }
            Some(_) => return GRANDCHILD_FAILED,
        }
    }
    if DROPPED_TWICE.load(SeqCst) {
        return DROPPED_TWICE_EXIT;
    }
    let finished = if depth == 0 && turnstile_rl::__private::fork_repairs().1 > 0 {
        REPAIR_FINISHED_A_MIGRATION
    } else {
        0
    };
    lost.min(LOSS_LIMIT) | mid_eviction | finished
}

/// A forked process's whole run: its checks, then the limiter's drop (its
/// keys dropped once each); returns the exit status.
fn run_child(limiter: &Arc<Limiter>, exact: bool, first_key: u64, depth: u32) -> i32 {
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        child_checks(limiter, exact, first_key, depth)
    }));
    let code = run.unwrap_or(PANICKED);
    if code & !FLAGS > LOSS_LIMIT {
        return code;
    }
    // The map's keys, dropped (each once) as the tables that hold them
    // are freed: by the clear's migration and the unpins after it.
    let _ = limiter.clear();
    for id in 0..1_000 {
        let _ = limiter.check(&Counted::new(u64::MAX - 1 - id));
    }
    if DROPPED_TWICE.load(SeqCst) {
        tell(&format!("fork churn: depth {depth}: a key dropped twice\n"));
        return DROPPED_TWICE_EXIT;
    }
    code
}

/// One case: churns a limiter and forks children until `churn_time` is
/// up; returns (children, children forked inside the parent's
/// `evict_idle` or `clear`, children whose repair finished a migration,
/// tracked keys lost).
fn fork_under_churn(max_keys: Option<usize>, clear: bool, advance: bool) -> (u64, u64, u64, u64) {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut builder = KeyedLimiter::<Counted>::builder(quota()).clock(ManualClock::new());
    if let Some(max_keys) = max_keys {
        builder = builder.max_keys(max_keys);
    }
    let limiter = Arc::new(builder.build());
    // Tracked keys are exact only if nothing evicts them: no clear, no
    // moving clock, room for them all.
    let exact = !clear && !advance && max_keys.is_none();
    if exact {
        for id in 0..TRACKED {
            assert!(limiter.check(&Counted::new(id)).is_allowed());
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let threads = churn(&limiter, 1_000_000, &stop, clear, advance);
    let started = Instant::now();
    let (mut children, mut mid_eviction, mut finished, mut lost) = (0, 0, 0, 0);
    let mut failure = None;
    while started.elapsed() < churn_time() && failure.is_none() {
        thread::sleep(Duration::from_micros(500 + children % 7 * 300));
        let first_key = 100_000_000 * (children + 1);
        let pid = fork_kit::fork(|| run_child(&limiter, exact, first_key, 0));
        children += 1;
        match wait_for(pid) {
            None => {
                failure = Some(format!(
                    "child {children} hung (killed after {:?})",
                    fork_kit::LIMIT
                ))
            }
            Some(status) if libc::WIFEXITED(status) => {
                let code = libc::WEXITSTATUS(status);
                if code & FORKED_MID_EVICTION != 0 {
                    mid_eviction += 1;
                }
                if code & REPAIR_FINISHED_A_MIGRATION != 0 {
                    finished += 1;
                }
                let rest = code & !FLAGS;
                if rest > LOSS_LIMIT {
                    failure = Some(format!("child {children} failed: exit {code}"));
                } else if rest as usize > CHECKERS + 1 {
                    failure = Some(format!(
                        "child {children} lost {rest} tracked keys, more than the parent's {} threads",
                        CHECKERS + 1
                    ));
                } else {
                    lost += rest as u64;
                }
            }
            Some(status) => failure = Some(format!("child {children} died: status {status:#x}")),
        }
    }
    stop.store(true, SeqCst);
    for thread in threads {
        thread.join().expect("a churning thread panicked");
    }
    if let Some(failure) = failure {
        panic!("{failure}");
    }
    eprintln!(
        "max_keys {max_keys:?}, clear {clear}, moving clock {advance}: {children} children, \
         {mid_eviction} forked inside evict_idle or clear, {finished} whose repair finished a \
         migration, {lost} tracked keys lost"
    );
    (children, mid_eviction, finished, lost)
}

#[test]
fn children_forked_under_churn_keep_every_charged_key() {
    let (children, mid_eviction, finished, _) = fork_under_churn(None, false, false);
    assert!(children > 0);
    assert!(mid_eviction > 0, "no child was forked inside a migration");
    assert!(
        finished > 0,
        "no child's repair finished a migration its parent had under way"
    );
}

#[test]
fn children_forked_under_clear_at_a_tiny_bound_go_on() {
    let (children, _, _, _) = fork_under_churn(Some(64), true, true);
    assert!(children > 0);
}

#[test]
fn children_forked_under_clear_at_a_bound_of_a_thousand_go_on() {
    let (children, _, _, _) = fork_under_churn(Some(1_000), true, false);
    assert!(children > 0);
}

#[test]
fn children_forked_under_a_moving_clock_go_on() {
    let (children, _, _, _) = fork_under_churn(None, true, true);
    assert!(children > 0);
}
