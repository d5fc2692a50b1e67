//! loom models of turnstile's lock-free protocols: every interleaving of the
//! crate's code (atomics through `src/sync.rs`, crossbeam-epoch's pointers
//! under `--cfg crossbeam_loom`), up to `LOOM_MAX_PREEMPTIONS` preemptions.
//! One part runs in another form than in a release build: the pin
//! (`src/map/pin.rs`) takes its fence-on-both-sides form under loom, whose
//! threads cannot be sent `membarrier`; `pin.rs` states why the two forms
//! keep the same promise, and `tests/pin.rs` here models that form.
//!
//! Each model names a race, and asserts after loom has explored it that
//! the race was reached in at least one execution (counted by the crate's
//! `probe` counters, compiled only under `--cfg turnstile_loom`): a model
//! that could pass without its race would be a false pass.
//!
//! Under loom the map's tables start at 2 slots and a migration copies one
//! slot per chunk, so growth, shrinking and chunk hand-offs happen within a
//! couple of keys. Quotas use an interval (100 µs) shorter than the
//! housekeeping tick (1 ms), so a bucket goes idle before any check sweeps
//! the table by itself: the models race exactly the eviction they call.
//!
//! Run with `scripts/loom.sh` (see the README); without both cfgs this
//! file compiles to nothing, so it can never pass by accident.
#![cfg(all(turnstile_loom, crossbeam_loom))]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use loom::thread;
use turnstile_rl::__private::loom_stripe;
use turnstile_rl::algorithms::{Algorithm, FixedWindow};
use turnstile_rl::probe::{self, Probe};
use turnstile_rl::{
    DirectLimiter, KeyedLimiter, LeasedLimiter, ManualClock, MultiLimiter, OverflowPolicy, Quota,
    Quotas,
};

/// Runs `body` under loom on a thread with room for the map's
/// frames: loom's default stack is small, and running out of it is a
/// SIGSEGV, not a test failure.
fn model(body: impl Fn() + Sync + Send + 'static) -> usize {
    model_preempted(usize::MAX, body)
}

/// [`model`] with at most `bound` preemptions (fewer if
/// `LOOM_MAX_PREEMPTIONS` says so): for a model whose race needs only that
/// many, and whose every step is costly to explore.
fn model_preempted(bound: usize, body: impl Fn() + Sync + Send + 'static) -> usize {
    let since = probe::sequence();
    let body = Arc::new(body);
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = builder.preemption_bound.map(|b| b.min(bound));
    // A migration is a few hundred atomic steps.
    builder.max_branches = 100_000;
    builder.check(move || {
        let body = body.clone();
        thread::Builder::new()
            .stack_size(STACK)
            .spawn(move || body())
            .unwrap()
            .join()
            .unwrap();
    });
    since
}

const STACK: usize = 8 << 20;

fn spawn<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> thread::JoinHandle<T> {
    thread::Builder::new().stack_size(STACK).spawn(f).unwrap()
}

/// One request per 100 µs (well under the 1 ms housekeeping tick).
const T: Duration = Duration::from_micros(100);

fn quota(burst: u64) -> Quota {
    Quota::per_second(10_000).unwrap().burst(burst).unwrap()
}

fn keyed(burst: u64, clock: &ManualClock) -> Arc<KeyedLimiter<u64, ManualClock>> {
    Arc::new(
        KeyedLimiter::builder(quota(burst))
            .clock(clock.clone())
            .build(),
    )
}

/// Asserts that `probe` was hit by this model's executions (after `since`,
/// the sequence number `model` returned): a hit by an earlier model in the
/// same process does not count.
fn reached(since: usize, probe: &Probe, race: &str) {
    assert!(
        probe.last() > since,
        "no execution reached {race}: the model passed without its race"
    );
}

/// Two checks, on this thread and another, race for the last token of
/// `limiter`, whose burst is 2 (the first taken here): exactly one passes.
fn race_for_the_last_token<A: Algorithm + 'static>(limiter: &Arc<DirectLimiter<ManualClock, A>>) {
    assert!(limiter.check().is_allowed());
    let other = limiter.clone();
    let a = spawn(move || other.check().is_allowed());
    let b = limiter.check().is_allowed();
    let a = a.join().unwrap();
    assert!(a ^ b, "exactly one of two may take the last token: {a} {b}");
}

/// (a) Two updaters on one cell with one token left: exactly one passes.
/// A fixed window, whose admissions are CASes: GCRA's, under load here,
/// are adds (the next model).
#[test]
fn two_updaters_one_token() {
    let since = model(|| {
        let window = DirectLimiter::builder(Quota::per_second(2).unwrap())
            .clock(ManualClock::new())
            .algorithm_for::<FixedWindow>()
            .unwrap()
            .build();
        race_for_the_last_token(&Arc::new(window));
    });
    reached(since, &probe::CAS_RETRY, "a CAS lost to the other updater");
}

/// A direct limiter under load admits with an add (`crate::direct`,
/// "Admitting with an add"): two checks race for its last token, the add
/// that meets the state the other's wrote does not admit, and is taken
/// back. Exactly one passes, and the bucket holds exactly the one token
/// taken: the take-back left nothing of the add behind, and gave back
/// nothing more.
#[test]
fn direct_adds_race_for_the_last_token() {
    let since = model(|| {
        let clock = ManualClock::new();
        let limiter = Arc::new(
            DirectLimiter::builder(quota(2))
                .clock(clock.clone())
                .build(),
        );
        race_for_the_last_token(&limiter);
        assert_eq!(limiter.peek().retry_after(), Some(T), "empty, exactly");
        clock.advance(T);
        assert!(limiter.check().is_allowed());
        assert!(limiter.check().is_denied());
    });
    reached(
        since,
        &probe::ADD_TAKEN_BACK,
        "an add that met the other's admission, taken back",
    );
}

/// A leased limiter (`crate::leased`) with one stripe, fixed leases of
/// two and a burst of four, on a clock that never moves: everything is
/// taken at one reading, so exactly as much passes as the bucket holds,
/// the four tokens, or fewer where two installs met (a merge keeps at most
/// one token), never more.
fn leased() -> Arc<LeasedLimiter<ManualClock>> {
    Arc::new(
        LeasedLimiter::builder(quota(4))
            .clock(ManualClock::new())
            .max_lease(2)
            .stripes(1)
            .adaptive(false)
            .build()
            .unwrap(),
    )
}

/// Checks `limiter` until a denial: the admissions.
fn drain(limiter: &LeasedLimiter<ManualClock>) -> usize {
    std::iter::from_fn(|| limiter.check().is_allowed().then_some(())).count()
}

/// Two checks race for a lease's last token: the first check took a
/// lease of two and kept one; this thread and another both find it. One
/// spends it, the other (its CAS lost, or finding the lease spent) takes
/// the bucket's last two and keeps one: both pass, one token is left,
/// and the bucket passes nothing more.
#[test]
fn two_spends_race_for_a_leases_last_token() {
    let since = model(|| {
        let limiter = leased();
        assert!(limiter.check().is_allowed());
        let other = limiter.clone();
        let a = spawn(move || other.check().is_allowed());
        assert!(limiter.check().is_allowed());
        assert!(a.join().unwrap());
        assert_eq!(drain(&limiter), 1, "the one token kept, and nothing more");
    });
    reached(
        since,
        &probe::LEASE_SPEND_RACED,
        "a spend that lost the lease's last token to the other",
    );
}

/// Two checks of one stripe find it empty at once and both take a lease
/// from the bucket: one take's CAS loses to the other's, and the second
/// install meets the first's lease (same tick) and merges with it, capped
/// at `max_lease - 1`. Both pass; what the bucket gives in all is at most
/// its four tokens and at least three (one dropped by the cap).
#[test]
fn two_takes_race_and_merge_their_leases() {
    let since = model(|| {
        let limiter = leased();
        let other = limiter.clone();
        let a = spawn(move || other.check().is_allowed());
        assert!(limiter.check().is_allowed());
        assert!(a.join().unwrap());
        let total = 2 + drain(&limiter);
        assert!((3..=4).contains(&total), "{total} passed of a burst of 4");
    });
    reached(
        since,
        &probe::CAS_RETRY,
        "a take that lost the bucket's CAS",
    );
    reached(
        since,
        &probe::LEASE_MERGED,
        "an install that met the other's lease of its tick",
    );
}

/// Two checks on two stripes (each thread its own) find them empty and
/// take leases of two from a bucket of four at once: the takes race on
/// the bucket's word, one CAS loses and takes again from what the other
/// left, and each installs on its own stripe, where nothing merges. On a
/// clock that never moves exactly the four tokens pass, however the two
/// threads share them.
#[test]
fn takes_of_two_stripes_race_on_the_bucket() {
    let since = model(|| {
        let limiter = Arc::new(
            LeasedLimiter::builder(quota(4))
                .clock(ManualClock::new())
                .max_lease(2)
                .stripes(2)
                .adaptive(false)
                .build()
                .unwrap(),
        );
        let other = limiter.clone();
        let a = spawn(move || drain(&other));
        let here = drain(&limiter);
        let there = a.join().unwrap();
        assert_eq!(here + there, 4, "{here} and {there} passed of a burst of 4");
    });
    reached(
        since,
        &probe::CAS_RETRY,
        "a take that lost the bucket's CAS to the other stripe's",
    );
    // On one stripe, some interleaving installs over the other's lease.
    assert!(
        probe::LEASE_MERGED.last() <= since,
        "a lease merged: the two threads shared a stripe"
    );
}

/// Adaptive leases (the default): two checks of one stripe take one token
/// each at once, and the one whose take lost the bucket's CAS doubles the
/// stripe's lease size, so the next take leases two. Whatever the
/// interleaving, on a clock that never moves exactly the burst passes: a
/// lease that grew hands out the tokens it took, no more.
#[test]
fn a_lost_take_grows_the_lease_within_the_burst() {
    let since = model(|| {
        let limiter = Arc::new(
            LeasedLimiter::builder(quota(4))
                .clock(ManualClock::new())
                .max_lease(2)
                .stripes(1)
                .build()
                .unwrap(),
        );
        let other = limiter.clone();
        let a = spawn(move || other.check().is_allowed());
        assert!(limiter.check().is_allowed());
        assert!(a.join().unwrap());
        assert_eq!(2 + drain(&limiter), 4, "exactly the burst");
    });
    reached(
        since,
        &probe::LEASE_GREW,
        "a take that lost the bucket's CAS, growing the lease",
    );
}

/// (b) Two threads inserting the same key: one bucket, both updates counted.
/// The loser either loses the slot's claim or waits for the winner to
/// publish its key (the slot is BUSY: it might hold the loser's key).
#[test]
fn insert_insert_same_key() {
    let since = model(|| {
        let clock = ManualClock::new();
        let limiter = keyed(3, &clock);
        let other = limiter.clone();
        let a = spawn(move || other.check(&7).is_allowed());
        assert!(limiter.check(&7).is_allowed());
        assert!(a.join().unwrap());
        assert_eq!(limiter.len(), 1);
        // Both updates landed on the one bucket: one token of three is left.
        assert_eq!(limiter.check(&7).remaining(), 0);
    });
    reached(
        since,
        &probe::INSERT_LOST_SLOT,
        "an insert losing its slot to the other insert",
    );
    reached(
        since,
        &probe::CONCURRENT_ADMITS,
        "two inserts of the key at once",
    );
    reached(
        since,
        &probe::INSERT_WAITED_FOR_BUSY_SLOT,
        "an insert waiting for the other insert to publish its key",
    );
}

/// (c) An update racing the eviction of its (idle) key: the update is never
/// lost, whichever comes first.
#[test]
fn update_races_eviction() {
    let since = model(|| {
        let clock = ManualClock::new();
        let limiter = keyed(2, &clock);
        assert!(limiter.check(&1).is_allowed());
        // TAT = T: at T the bucket is full again, so idle and evictable.
        clock.set(T);
        let other = limiter.clone();
        let a = spawn(move || other.check(&1).is_allowed());
        limiter.evict_idle();
        assert!(a.join().unwrap());
        // The racing update counted: one token of two is left, then none.
        let last = limiter.check(&1);
        assert!(last.is_allowed());
        assert_eq!(last.remaining(), 0);
        assert!(limiter.check(&1).is_denied());
    });
    reached(
        since,
        &probe::UPDATE_MET_TOMBSTONE,
        "an update finding its cell evicted under it",
    );
}

/// (d) An update racing a migration (growth) that copies its cell: the
/// update either lands before the migration's COPYING mark (whose CAS then
/// fails, and the chunk copies the state it reads again) or fails on the
/// mark and retries in the successor, waiting while the copy lands if it
/// finds the bucket still COPYING (never two buckets, never a lost
/// update).
#[test]
fn update_races_growth() {
    let since = model(|| {
        let clock = ManualClock::new();
        let limiter = keyed(3, &clock);
        assert!(limiter.check(&1).is_allowed());
        let other = limiter.clone();
        // Key 2 finds the smallest table full and starts a migration.
        let a = spawn(move || other.check(&2).is_allowed());
        assert!(limiter.check(&1).is_allowed());
        assert!(a.join().unwrap());
        let last = limiter.check(&1);
        assert!(last.is_allowed());
        assert_eq!(last.remaining(), 0, "an update made during growth was lost");
        assert_eq!(limiter.len(), 2);
    });
    reached(
        since,
        &probe::UPDATE_MET_FROZEN,
        "an update failing on a cell the migration froze",
    );
    reached(
        since,
        &probe::WAITED_FOR_COPY,
        "a check waiting while the migration's copy of its bucket lands",
    );
}

/// (e) A reader holding its slot while the bucket is evicted, left behind by
/// a shrinking migration, and the table retired (and reclaimed at the
/// evicting thread's unpin, which must find the reader pinned): the reader's update
/// meets the tombstone on memory that is still valid, and the key's next
/// decision accounts for it.
#[test]
fn reader_holds_slot_through_retirement() {
    static REACHED: AtomicBool = AtomicBool::new(false);
    // The race: the reader (this thread) is stopped between its lookup and
    // its update while the other thread's eviction and migration run.
    model(|| {
        let start = probe::sequence();
        let clock = ManualClock::new();
        let limiter = keyed(2, &clock);
        assert!(limiter.check(&1).is_allowed());
        assert!(limiter.check(&2).is_allowed());
        // Both idle: evict_idle empties the table, and the shrinking
        // migration that follows leaves both behind and retires the table.
        clock.set(T);
        let other = limiter.clone();
        let evictor = spawn(move || other.evict_idle());
        assert!(limiter.check(&1).is_allowed());
        evictor.join().unwrap();
        let last = limiter.check(&1);
        assert_eq!(last.remaining(), 0, "the reader's update was lost");
        let retired = probe::TABLE_RETIRED.last();
        if retired > start && probe::UPDATE_MET_TOMBSTONE.last() > retired {
            REACHED.store(true, Ordering::Relaxed);
        }
    });
    assert!(
        REACHED.load(Ordering::Relaxed),
        "no execution had the reader meet its cell after its table was retired"
    );
}

/// (f) A shrinking migration racing an insert: the migration closes the
/// table before it sizes the successor from the live keys, so an insert
/// either is counted or goes to the successor; the successor never has
/// fewer slots than keys to hold (this was a hang).
#[test]
fn shrink_races_insert() {
    let since = model(|| {
        let clock = ManualClock::new();
        let limiter = keyed(2, &clock);
        assert!(limiter.check(&1).is_allowed());
        assert!(limiter.check(&2).is_allowed());
        clock.set(T);
        let other = limiter.clone();
        let a = spawn(move || other.check(&3).is_allowed());
        assert_eq!(limiter.evict_idle(), 2);
        assert!(a.join().unwrap());
        assert_eq!(limiter.len(), 1);
        assert_eq!(limiter.check(&3).remaining(), 0, "key 3 lost its state");
    });
    reached(
        since,
        &probe::CLOSED_TABLE_REFUSED_INSERT,
        "an insert refused by a table closed for a shrink",
    );
    reached(
        since,
        &probe::SUCCESSOR_INSTALLED_BY_HELPER,
        "an inserter installing the successor of a table another thread closed",
    );
}

/// (g) Two new keys inserted while a migration starts: the thread going on
/// to the successor freezes the empty slot it passes, so no key can land in
/// the old table behind it; and a key still being inserted into the old
/// table (its slot claimed, its key not yet published) is waited for by the
/// migration that copies it, never copied half-written or twice. The
/// successor holds room for the copies it will receive: a copy lands
/// beside the direct inserts, and once all is done the table's count of
/// filled slots is exact.
#[test]
fn two_inserts_race_migration_start() {
    let since = model(|| {
        let clock = ManualClock::new();
        let limiter = keyed(2, &clock);
        let other = limiter.clone();
        // Keys whose homes (under the models' fixed hasher) are both the
        // first slot of the first table and different slots of its
        // successor: the first key in is then the first chunk migrated.
        let (k, j) = (14, 13);
        let a = spawn(move || other.check(&k).is_allowed());
        assert!(limiter.check(&j).is_allowed());
        assert!(a.join().unwrap());
        assert_eq!(limiter.len(), 2);
        assert_eq!(limiter.check(&k).remaining(), 0);
        assert_eq!(limiter.check(&j).remaining(), 0);
        // Finishes the migration (and makes one more): then every slot
        // reserved in the table, for an insert or a copy, is filled.
        assert_eq!(limiter.evict_idle(), 0);
        limiter.assert_quiescent_accounting();
    });
    reached(
        since,
        &probe::SUCCESSOR_TOOK_COPIES_AND_INSERTS,
        "a successor taking copies and direct inserts in one migration",
    );
    reached(
        since,
        &probe::INSERT_FROZE_EMPTY_SLOT,
        "an insert freezing an empty slot on its way to the successor",
    );
    reached(since, &probe::CONCURRENT_ADMITS, "two new keys at once");
    reached(
        since,
        &probe::MIGRATION_WAITED_FOR_INSERT,
        "a migration waiting for an insert to publish the key it copies",
    );
}

/// (h) Overflow eviction racing an update of its victim, at `max_keys`: the
/// update either lands first (and the evictor picks again) or meets the
/// tombstone and goes back to the map; the bound holds throughout.
#[test]
fn overflow_eviction_races_update() {
    let since = model(|| {
        let clock = ManualClock::new();
        let limiter = Arc::new(
            KeyedLimiter::builder(quota(3))
                .clock(clock.clone())
                .max_keys(1)
                .overflow(OverflowPolicy::EvictFullest)
                .build(),
        );
        assert!(limiter.check(&1).is_allowed());
        let other = limiter.clone();
        let a = spawn(move || other.check(&1).is_allowed());
        assert!(limiter.check(&2).is_allowed(), "the new key is admitted");
        assert!(a.join().unwrap());
        assert_eq!(limiter.len(), 1);
    });
    reached(
        since,
        &probe::UPDATE_MET_TOMBSTONE,
        "an update meeting the overflow eviction's tombstone",
    );
    reached(
        since,
        &probe::EVICTION_LOST,
        "an overflow eviction losing its victim to an update",
    );
}

/// (i) Two new keys race for the last place under `max_keys` with
/// `OverflowPolicy::Deny`: exactly one is tracked, never two.
#[test]
fn max_keys_is_exact() {
    let since = model(|| {
        let clock = ManualClock::new();
        let limiter = Arc::new(
            KeyedLimiter::builder(quota(2))
                .clock(clock.clone())
                .max_keys(1)
                .overflow(OverflowPolicy::Deny)
                .build(),
        );
        let other = limiter.clone();
        let a = spawn(move || other.check(&1).is_allowed());
        let b = limiter.check(&2).is_allowed();
        let a = a.join().unwrap();
        assert!(a ^ b, "exactly one new key gets the last place: {a} {b}");
        assert_eq!(limiter.len(), 1);
    });
    reached(since, &probe::CONCURRENT_ADMITS, "two new keys at once");
}

/// (j) A migration's chunks handed out to two threads: each copies its own,
/// the thread that finishes last swings the root whether or not it started
/// the migration, and a thread that finds every chunk claimed waits for
/// the claimers. No key is lost.
#[test]
fn migration_chunks_are_shared() {
    let since = model(|| {
        let clock = ManualClock::new();
        let limiter = keyed(3, &clock);
        assert!(limiter.check(&1).is_allowed());
        let other = limiter.clone();
        // Key 2 finds the smallest table full and starts a migration ...
        let a = spawn(move || other.check(&2).is_allowed());
        // ... which evict_idle (nothing is idle) finishes or waits for.
        assert_eq!(limiter.evict_idle(), 0);
        assert!(a.join().unwrap());
        assert_eq!(limiter.len(), 2);
        assert_eq!(limiter.check(&1).remaining(), 1);
        assert_eq!(limiter.check(&2).remaining(), 1);
        limiter.assert_quiescent_accounting();
    });
    reached(
        since,
        &probe::CHUNKS_COPIED_BY_TWO_THREADS,
        "two threads copying chunks of one migration",
    );
    reached(
        since,
        &probe::ROOT_SWUNG_BY_HELPER,
        "the root swung by a thread that did not start copying",
    );
    reached(
        since,
        &probe::WAITED_FOR_CLAIMED_CHUNKS,
        "a thread finding every chunk claimed",
    );
}

static MULTI_RACE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static REFUND_RACE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// (k) Several limits, charge then roll back: two checks that the second
/// limit denies, racing on the first limit. The race: one check meets the
/// other's charge on the first limit before it is rolled back (it reports
/// the first limit as binding). In every interleaving both are denied and
/// the first limit ends with exactly the one admitted token taken: no
/// rolled-back charge leaks.
#[test]
fn multi_rollback_meets_a_racing_charge() {
    MULTI_RACE.store(0, std::sync::atomic::Ordering::Relaxed);
    model(|| {
        // First limit: burst 2, 2 h a token; second: burst 1, 1 h a token.
        // A check denied by the first waits 2 h, by the second 1 h.
        let quotas: Quotas = "1/2h burst 2; 1/h burst 1".parse().unwrap();
        let limiter = Arc::new(
            MultiLimiter::builder(quotas)
                .clock(ManualClock::new())
                .build(),
        );
        assert!(limiter.check().is_allowed());
        let other = limiter.clone();
        let a = spawn(move || other.check());
        let b = limiter.check();
        let a = a.join().unwrap();
        for d in [a, b] {
            assert!(d.is_denied());
            if d.binding() == 0 {
                MULTI_RACE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let first = limiter.limits()[0].peek();
        assert!(first.is_allowed(), "a rolled-back charge leaked");
        assert_eq!(first.remaining(), 0, "the admitted token was given back");
    });
    assert!(
        MULTI_RACE.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "no execution met a charge before its rollback"
    );
}

/// (k2) Several limits, two rollbacks racing each other: both checks
/// charge the first limit (it has room for both), the second limit denies
/// both, and each rolls its charge back. The race: a rollback finds the
/// first limit's state moved since its charge (the other check charged on
/// top of it, or rolled back below it). On loom's frozen clock the
/// rollback must be exact: in every interleaving the first limit ends with
/// exactly the one admitted token taken.
#[test]
fn multi_rollbacks_race_each_other() {
    let since = model(|| {
        // First limit: burst 3, 2 h a token; second: burst 1, 1 h a token.
        let quotas: Quotas = "1/2h burst 3; 1/h burst 1".parse().unwrap();
        let limiter = Arc::new(
            MultiLimiter::builder(quotas)
                .clock(ManualClock::new())
                .build(),
        );
        assert!(limiter.check().is_allowed());
        let other = limiter.clone();
        let a = spawn(move || other.check());
        let b = limiter.check();
        let a = a.join().unwrap();
        assert!(a.is_denied() && b.is_denied());
        let first = limiter.limits()[0].peek();
        assert_eq!(
            first.remaining(),
            1,
            "a rolled-back charge leaked or was lost"
        );
    });
    reached(
        since,
        &probe::MULTI_ROLLBACK_RACED,
        "a rollback finding the state moved since its charge",
    );
}

/// (l) A refund racing a check on the last token: a check that lands
/// between another's check and its refund is denied (the race), and in
/// every interleaving the bucket ends holding exactly the tokens not given
/// back.
#[test]
fn refund_races_a_check() {
    REFUND_RACE.store(0, std::sync::atomic::Ordering::Relaxed);
    model(|| {
        let limiter = Arc::new(
            DirectLimiter::builder(quota(1))
                .clock(ManualClock::new())
                .build(),
        );
        let other = limiter.clone();
        let a = spawn(move || {
            if other.check().is_allowed() {
                assert_eq!(other.refund(1), Ok(true), "its own token was still out");
            }
        });
        let b = limiter.check().is_allowed();
        a.join().unwrap();
        if !b {
            REFUND_RACE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        assert_eq!(
            limiter.peek().is_allowed(),
            !b,
            "a refund was lost or doubled"
        );
    });
    assert!(
        REFUND_RACE.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "no check landed between a check and its refund"
    );
}

/// (m) Two first requests of one key at `max_keys(1)`, burst 2: one holds
/// the only place while it moves the key in, or has just published it,
/// when the other finds no room. Under every policy both must be decided on
/// the key's one bucket (both admitted, one token left between them): the
/// second waits for the insert in flight and looks the key up again
/// (under `EvictFullest`, holding the key's claim on its stripe, before it
/// would evict).
fn first_requests_share_one_bucket(policy: OverflowPolicy) -> usize {
    model(move || {
        let limiter = Arc::new(
            KeyedLimiter::builder(quota(2))
                .clock(ManualClock::new())
                .max_keys(1)
                .overflow(policy)
                .build(),
        );
        let other = limiter.clone();
        let a = spawn(move || other.check(&7));
        let b = limiter.check(&7);
        let a = a.join().unwrap();
        assert!(a.is_allowed() && b.is_allowed(), "{policy:?}: {a:?} {b:?}");
        assert_eq!(a.remaining() + b.remaining(), 1, "{policy:?}: two buckets");
        assert_eq!(limiter.len(), 1);
    })
}

#[test]
fn first_requests_at_max_keys_evict_fullest() {
    let since = first_requests_share_one_bucket(OverflowPolicy::EvictFullest);
    reached(
        since,
        &probe::NO_ROOM_WAITED_FOR_INSERT,
        "the request holding the key's claim waiting for the key's insert in flight",
    );
    reached(
        since,
        &probe::NO_ROOM_FOUND_KEY,
        "a check with no room finding its key on looking again",
    );
}

#[test]
fn first_requests_at_max_keys_deny() {
    let since = first_requests_share_one_bucket(OverflowPolicy::Deny);
    reached(
        since,
        &probe::NO_ROOM_WAITED_FOR_INSERT,
        "a check with no room waiting for its key's insert in flight",
    );
    reached(
        since,
        &probe::NO_ROOM_FOUND_KEY,
        "a check with no room finding its key on looking again",
    );
}

#[test]
fn first_requests_at_max_keys_allow_untracked() {
    let since = first_requests_share_one_bucket(OverflowPolicy::AllowUntracked);
    reached(
        since,
        &probe::NO_ROOM_FOUND_KEY,
        "a check with no room finding its key on looking again",
    );
}

/// (n) `clear` racing a migration that an insert starts: the migration's
/// first chunk, claimed by the insert, copies the spent key's bucket with
/// the insert's idle test before `clear` can sweep it. `clear` migrates the
/// table itself, waits for chunks others claimed, and sweeps what they
/// copied into the successor: a key spent before `clear` and untouched
/// since is gone after it.
#[test]
fn clear_races_a_migration_an_insert_starts() {
    let since = model(|| {
        let clock = ManualClock::new();
        let limiter = keyed(1, &clock);
        assert!(limiter.check(&1).is_allowed());
        let other = limiter.clone();
        // Key 2 finds the smallest table half full and starts a migration.
        let a = spawn(move || other.check(&2).is_allowed());
        limiter.clear();
        assert!(a.join().unwrap());
        assert!(
            limiter.check(&1).is_allowed(),
            "the spent key kept its state through clear()"
        );
    });
    reached(
        since,
        &probe::EVICTION_WAITED_FOR_EARLIER_CHUNKS,
        "clear waiting for chunks the insert claimed first",
    );
}

/// Keys of a model that owns heap memory and counts what it makes and
/// drops, so that a key dropped twice or never shows; and whose `Hash`
/// panics while `PANIC_HASH` is set. Checks look keys up by [`Id`], whose
/// `Hash` never panics: the only hash of a stored key is a migration's.
mod keys {
    use std::borrow::Borrow;
    use std::hash::{Hash, Hasher};
    use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};

    pub static LIVE: AtomicIsize = AtomicIsize::new(0);
    pub static PANIC_HASH: AtomicBool = AtomicBool::new(false);

    #[derive(PartialEq, Eq, Debug)]
    pub struct Id(pub u64);

    impl Hash for Id {
        fn hash<H: Hasher>(&self, h: &mut H) {
            self.0.hash(h)
        }
    }

    impl ToOwned for Id {
        type Owned = Owned;
        fn to_owned(&self) -> Owned {
            LIVE.fetch_add(1, Ordering::Relaxed);
            Owned {
                id: Id(self.0),
                _heap: Box::new(self.0),
            }
        }
    }

    #[derive(Debug)]
    pub struct Owned {
        id: Id,
        _heap: Box<u64>,
    }

    impl Borrow<Id> for Owned {
        fn borrow(&self) -> &Id {
            &self.id
        }
    }

    impl PartialEq for Owned {
        fn eq(&self, other: &Self) -> bool {
            self.id == other.id
        }
    }
    impl Eq for Owned {}

    impl Hash for Owned {
        fn hash<H: Hasher>(&self, h: &mut H) {
            if PANIC_HASH.load(Ordering::Relaxed) {
                panic!("a hostile Hash on the migrating thread");
            }
            self.id.hash(h)
        }
    }

    impl Drop for Owned {
        fn drop(&mut self) {
            LIVE.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// (o) A key whose `Hash` panics on the migrating thread, while a reader
/// checks it: the chunk buries the bucket, which is still live (a key is
/// hashed before its COPYING mark), before it counts, or the root could
/// swing past a live bucket and a check on the new root insert a second
/// bucket for the key beside it. Keys own heap memory: every key made is
/// dropped exactly once, by the table that owns it when the limiter goes.
#[test]
fn a_panicking_hash_never_splits_a_key() {
    use keys::{Id, Owned, LIVE, PANIC_HASH};
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use std::sync::atomic::Ordering::Relaxed;

    std::panic::set_hook(Box::new(|_| {}));
    LIVE.store(0, Relaxed);
    let since = model(|| {
        // The previous execution's keys were all dropped once before it
        // ended (a table retired in it is freed by the unpin that retired
        // it, this model's other thread being done; one left retired at
        // the end would be leaked and fail this).
        assert_eq!(LIVE.swap(0, Relaxed), 0, "a key dropped twice or never");
        PANIC_HASH.store(false, Relaxed);
        let clock = ManualClock::new();
        let limiter: Arc<KeyedLimiter<Owned, ManualClock>> =
            Arc::new(KeyedLimiter::builder(quota(2)).clock(clock.clone()).build());
        assert!(limiter.check(&Id(1)).is_allowed());
        PANIC_HASH.store(true, Relaxed);
        let reader = limiter.clone();
        // Races the chunk's burial of key 1's bucket.
        let a = spawn(move || reader.check(&Id(1)));
        // Key 2 starts the migration; its chunks hash key 1 and panic.
        let two = catch_unwind(AssertUnwindSafe(|| limiter.check(&Id(2))));
        let three = catch_unwind(AssertUnwindSafe(|| limiter.check(&Id(3))));
        assert!(
            two.is_err() || three.is_err(),
            "the migration never hashed key 1"
        );
        // On the new root, while the reader's copy may still be in flight.
        // (This and the reader's check race for key 1's last token, unless
        // the bucket was buried.)
        let _ = limiter.check(&Id(1));
        let _ = a.join().unwrap();
        PANIC_HASH.store(false, Relaxed);
        // Key 1 is tracked once (or was buried, lost as if evicted, and
        // came back once): the limiter holds it and the one key of 2 and 3
        // whose insert did not panic.
        assert_eq!(limiter.len(), 2, "a key with two buckets");
    });
    assert_eq!(LIVE.load(Relaxed), 0, "a key dropped twice or never");
    let _ = std::panic::take_hook();
    reached(
        since,
        &probe::PANICKED_CHUNK_BURIED,
        "a panicked chunk burying the bucket",
    );
}

/// (p) Housekeeping: the clock passes the 1 ms tick, so one of two checks
/// of an idle key runs the periodic sweep (and compaction) while the other
/// updates that key. No update is lost: an update that meets the sweep's
/// tombstone goes back to the map, and both land on one bucket. One
/// preemption is the race (the sweep between the other's lookup and its
/// update); a housekeeping step is a sweep and a compaction, whose atomics
/// make each further preemption cost minutes.
#[test]
fn housekeeping_races_an_update() {
    let since = model_preempted(1, || {
        let clock = ManualClock::new();
        let limiter = keyed(2, &clock);
        assert!(limiter.check(&1).is_allowed());
        // Key 1's bucket is full again long before the first tick.
        clock.set(Duration::from_millis(2));
        let other = limiter.clone();
        let a = spawn(move || other.check(&1));
        let b = limiter.check(&1);
        let a = a.join().unwrap();
        assert!(a.is_allowed() && b.is_allowed());
        assert_eq!(a.remaining() + b.remaining(), 1, "an update was lost");
    });
    reached(
        since,
        &probe::HOUSEKEEPING_RAN,
        "a check running the periodic housekeeping step",
    );
    reached(
        since,
        &probe::UPDATE_MET_TOMBSTONE,
        "an update meeting the periodic sweep's tombstone",
    );
}

/// (q) The operations beside `check` racing a migration: `reset` of one
/// key and `peek` of another while the other's insert grows the table. The reset key is forgotten exactly once, the peeked
/// key's state is read, not changed, and no bucket is lost or doubled.
#[test]
fn operations_race_growth() {
    static RACED: AtomicBool = AtomicBool::new(false);
    model(|| {
        let start = probe::sequence();
        let clock = ManualClock::new();
        let limiter = keyed(2, &clock);
        assert!(limiter.check(&1).is_allowed());
        let other = limiter.clone();
        // Key 2 finds the smallest table half full and starts a migration.
        let a = spawn(move || other.check(&2).is_allowed());
        assert!(limiter.reset(&1), "key 1 was tracked");
        // Absent or admitted once: either way a request would be admitted.
        assert!(limiter.peek(&2).is_allowed());
        // The race is this thread's operations meeting the bucket being copied,
        // not the checks after the join.
        if probe::UPDATE_MET_FROZEN.last() > start {
            RACED.store(true, Ordering::Relaxed);
        }
        assert!(a.join().unwrap());
        assert!(!limiter.reset(&1), "a reset key is not tracked");
        assert_eq!(limiter.check(&1).remaining(), 1, "the reset was lost");
        let two = limiter.peek(&2);
        assert!(
            two.is_allowed() && two.remaining() == 0,
            "the insert was lost"
        );
        assert_eq!(limiter.len(), 2);
    });
    assert!(
        RACED.load(Ordering::Relaxed),
        "no execution had an operation meet a bucket the migration froze"
    );
}

/// (r) A batch racing growth: `check_batch` of key 1 twice while another
/// key's insert starts a migration that copies key 1's bucket; both of the
/// batch's decisions count, in order.
#[test]
fn check_batch_races_growth() {
    static RACED: AtomicBool = AtomicBool::new(false);
    model(|| {
        let start = probe::sequence();
        let clock = ManualClock::new();
        let limiter = keyed(3, &clock);
        assert!(limiter.check(&1).is_allowed());
        let other = limiter.clone();
        let a = spawn(move || other.check(&2).is_allowed());
        let mut out = Vec::new();
        limiter.check_batch(&[1, 1], &mut out);
        // The race is the batch meeting the bucket being copied, not the check
        // after the join.
        if probe::UPDATE_MET_FROZEN.last() > start {
            RACED.store(true, Ordering::Relaxed);
        }
        assert!(a.join().unwrap());
        assert_eq!((out[0].remaining(), out[1].remaining()), (1, 0));
        assert!(limiter.check(&1).is_denied(), "a batch's update was lost");
        assert_eq!(limiter.len(), 2);
    });
    assert!(
        RACED.load(Ordering::Relaxed),
        "no execution had the batch's update meet the bucket the migration froze"
    );
}

/// (s) Two first requests of one key on a keyed multi-limiter: both insert
/// the key into each limit's map at once, the second limit (burst 1)
/// admits one of them, and the other's charge on the first limit is rolled
/// back, possibly with the admitted one's charge on top of it. Exactly one
/// charge stays on the first limit. One preemption is the race (one check
/// stopped after its first charge while the other runs whole): four
/// inserts on two maps make each further one cost many minutes.
#[test]
fn keyed_multi_first_requests_race() {
    use turnstile_rl::KeyedMultiLimiter;
    let since = model_preempted(1, || {
        let quotas: Quotas = "10000/s burst 2; 10000/s burst 1".parse().unwrap();
        let limiter = Arc::new(
            KeyedMultiLimiter::<u64>::builder(quotas)
                .clock(ManualClock::new())
                .build(),
        );
        let other = limiter.clone();
        let a = spawn(move || other.check(&1));
        let b = limiter.check(&1);
        let a = a.join().unwrap();
        assert!(
            a.is_allowed() ^ b.is_allowed(),
            "burst 1 on the second limit"
        );
        let first = limiter.limits()[0].peek(&1);
        assert!(
            first.is_allowed() && first.remaining() == 0,
            "the first limit kept other than the admitted request's charge: {first:?}"
        );
    });
    reached(
        since,
        &probe::CONCURRENT_ADMITS,
        "two first requests at once",
    );
    reached(
        since,
        &probe::MULTI_ROLLBACK_RACED,
        "a rollback finding the first limit moved since its charge",
    );
}

/// (t) An overflow eviction at `max_keys(2)` racing the insert that holds
/// the other place: the map holds a drained key and a place reserved for a
/// new key still on its way in when a second new key finds no room. Its
/// eviction must not compare the drained key alone (that would hand the
/// drained key a full burst): it evicts nothing until the insert is in,
/// then evicts one of the two fresh buckets, which are fuller. The new
/// keys fall in different stripes of inserts in flight. One
/// preemption is the race (the insert stopped between its reservation and
/// its publish); each insert here also grows the two-slot table.
#[test]
fn eviction_waits_for_the_place_an_insert_holds() {
    // Two new keys of different stripes: within one stripe the second
    // waits for the first's insert before it evicts (`map::bound`), and
    // the race is between stripes.
    let first = 2u64;
    let second = (3u64..)
        .find(|k| loom_stripe(k) != loom_stripe(&first))
        .unwrap();
    let since = model_preempted(1, move || {
        let limiter = Arc::new(
            KeyedLimiter::builder(quota(2))
                .clock(ManualClock::new())
                .max_keys(2)
                .build(),
        );
        // Drained: further from full than a fresh key after one request.
        assert!(limiter.check(&1).is_allowed());
        assert!(limiter.check(&1).is_allowed());
        let other = limiter.clone();
        let a = spawn(move || other.check(&first).is_allowed());
        let b = limiter.check(&second).is_allowed();
        let a = a.join().unwrap();
        assert!(a && b, "a fresh key with room or a victim is admitted");
        assert!(
            limiter.check(&1).is_denied(),
            "the drained key was evicted and came back with a full burst"
        );
    });
    reached(
        since,
        &probe::EVICTION_FOUND_ONE_OF_TWO_PLACES,
        "an eviction finding one published bucket while the map held two",
    );
}

/// (u) Two first requests of one new key at a full `max_keys(2)` under
/// `EvictFullest` (the default): one of the two buckets tracked before is
/// evicted, not one for each request, and both requests are decided on the
/// new key's one bucket. One request claims the key's stripe and evicts;
/// the other meets the claim (in its announcement, or when it tries to
/// claim) and waits for it, then finds the key. Before the claim, the
/// second request evicted a bucket of its own, then found the key
/// inserted and gave the place back: two buckets forgotten for one key.
#[test]
fn one_new_key_at_the_bound_evicts_once() {
    let since = model(|| {
        let limiter = Arc::new(
            KeyedLimiter::builder(quota(2))
                .clock(ManualClock::new())
                .max_keys(2)
                .build(),
        );
        // Closer to full than a fresh key after one request, so an
        // eviction prefers them to the key's own bucket.
        let faster = Quota::per_second(100_000).unwrap().burst(2).unwrap();
        assert!(limiter.check_with(&1, &faster).is_allowed());
        assert!(limiter.check_with(&2, &faster).is_allowed());
        let other = limiter.clone();
        let a = spawn(move || other.check(&7));
        let b = limiter.check(&7);
        let a = a.join().unwrap();
        assert!(a.is_allowed() && b.is_allowed(), "{a:?} {b:?}");
        assert_eq!(a.remaining() + b.remaining(), 1, "two buckets for one key");
        assert_eq!(
            limiter.stats().overflow_evictions,
            1,
            "one new key evicted more than one bucket"
        );
        assert_eq!(limiter.len(), 2, "a place left empty");
    });
    reached(
        since,
        &probe::CLAIM_TAKEN,
        "a first request finding its key's stripe claimed by the other",
    );
}

/// (s) Tags (`map::raw::tags`; every key is tagged under loom): a key's
/// first check races another key's insert on its chain. The lookup passes
/// the other key's slot by its tag alone, or stops at it while the insert
/// holds it claimed and untagged (the end of the chain, as at an EMPTY
/// slot: no key is ever published past a claimed slot). Either way each
/// key ends with one bucket and its one admission.
#[test]
fn a_lookup_races_an_insert_on_its_chain() {
    let since = model(|| {
        let clock = ManualClock::new();
        let limiter = keyed(2, &clock);
        assert!(limiter.check(&1).is_allowed());
        let other = limiter.clone();
        // Keys 2 and 7 share their home in every table of the models' sizes
        // (the loom hasher's seeds are fixed), and their tags differ.
        let a = spawn(move || other.check(&2).is_allowed());
        assert!(limiter.check(&7).is_allowed());
        assert!(a.join().unwrap());
        assert_eq!(limiter.len(), 3, "a key with two buckets, or none");
        // One admission each of a burst of 2: a request would take the last.
        for key in [1, 2, 7] {
            assert_eq!(limiter.peek(&key).remaining(), 0, "key {key}");
        }
    });
    reached(
        since,
        &probe::LOOKUP_SKIPPED_BY_TAG,
        "a lookup passing another key's slot by its tag",
    );
    reached(
        since,
        &probe::LOOKUP_STOPPED_AT_A_CLAIM,
        "a lookup stopping at a slot claimed and not yet tagged",
    );
}
