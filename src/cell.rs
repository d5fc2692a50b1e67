//! The cell: one bucket's whole state in one `AtomicU64`, updated by a
//! compare-and-swap loop around an algorithm's pure decision function.
//!
//! The cell lives inline in a slot of the keyed map's table, so the same
//! word also says where the slot is in its life. Every value of the word
//! means one thing:
//!
//! ```text
//! 0                       EMPTY      never filled
//! 1 ..= 2^63 - 4          live       the bucket's state is `word - 1`
//! 2^63 - 3                BUSY       an insert has claimed the slot and is writing its key
//! 2^63 - 2                COPIED     frozen, and the bucket now lives in the successor table
//! 2^63 - 1                TOMBSTONE  evicted or reset: no update lands again
//! FROZEN bit (2^63) | EMPTY, COPIED or TOMBSTONE: a migration froze the slot
//! BUSY | FROZEN           COPYING    a migration is copying the live bucket (a BUSY slot
//!                                    is never frozen, so the word is free for this)
//! ```
//!
//! So an algorithm's state must stay below [`STATE_END`] (`2^63 - 4`): a
//! GCRA TAT reaches it 292 years after its clock's origin, and the packed
//! window algorithms keep their top bit clear. EMPTY is `0` so that a new
//! table is zeroed memory, which the OS hands out lazily.
//!
//! # Orderings
//!
//! Updates, claims and denials are `Relaxed`, and that is enough:
//! - an update publishes no other memory: the `u64` *is* the bucket, so
//!   there is nothing for an Acquire to make visible;
//! - all read-modify-writes of one atomic are totally ordered (its
//!   modification order), so a CAS from `old` succeeds only if no other
//!   update landed since `old` was read: no update is ever lost;
//! - a denial writes nothing: it is the decision on the state its load
//!   returned, which is one of the cell's states in its modification
//!   order, so it takes its place in the cell's history right after the
//!   write that stored that state. Every decision on a cell therefore fits
//!   one order of its history. (Not because states only grow: a refund, a
//!   multi-limit rollback, a reset and a quota change lower them, and a
//!   denial may rest on the state just before one of those.) A change made
//!   on another thread is seen by a later check the way any memory is:
//!   once that change happens-before the check;
//! - an evictor's claim, a reset and a migration's COPYING mark are CASes
//!   on the same atomic, so each either lands before an update (whose CAS
//!   then fails and sees it) or after (and its own CAS fails).
//!
//! The slot's key is the one other piece of memory, and the word publishes
//! it: the insert that claimed the slot (BUSY) writes the key and then
//! stores the first live word with `Release`; readers load the word with
//! `Acquire` before they read the key ([`word`](Cell::word)). Later
//! updates are read-modify-writes of the same atomic, which continue that
//! release sequence, so an Acquire load that reads any later word sees the
//! key too. [`finish_copy`](Cell::finish_copy) is `Release` for the same
//! reason: a reader that sees COPIED goes on to read the successor's copy.

use crate::algorithms::Algorithm;
use crate::decision::Decision;
use crate::sync::{AtomicU64, Ordering};

/// The first state an algorithm may not produce: the words from here on
/// are the map's (see the module docs).
pub(crate) const STATE_END: u64 = (1 << 63) - 4;

pub(crate) const EMPTY: u64 = 0;
pub(crate) const BUSY: u64 = STATE_END + 1;
pub(crate) const COPIED: u64 = STATE_END + 2;
pub(crate) const TOMBSTONE: u64 = STATE_END + 3;
pub(crate) const FROZEN: u64 = 1 << 63;
pub(crate) const COPYING: u64 = BUSY | FROZEN;

const _: () = assert!(TOMBSTONE == FROZEN - 1);

/// One bucket, and the life of the slot that holds it.
#[derive(Debug)]
pub(crate) struct Cell {
    /// The bucket's CAS loop is here; the slot-life transitions that the
    /// map makes on the same word are in `crate::map::raw::lifecycle`.
    pub(crate) word: AtomicU64,
}

/// What a word says about its slot, the FROZEN bit aside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Never filled: the end of every probe chain through it.
    Empty,
    /// Claimed by an insert that has not published its key yet.
    Busy,
    /// Frozen, and being copied to the successor by the one thread that
    /// won the right to (its key is published).
    Copying,
    /// A live bucket with this state.
    Live(u64),
    /// The bucket moved to the successor table.
    Copied,
    /// Evicted or reset.
    Dead,
}

impl Seen {
    /// Reads a word: what the slot holds, and whether it is frozen.
    #[inline]
    pub(crate) fn of(word: u64) -> (Seen, bool) {
        let frozen = word & FROZEN != 0;
        let seen = match word & !FROZEN {
            EMPTY => Seen::Empty,
            BUSY if frozen => Seen::Copying,
            BUSY => Seen::Busy,
            COPIED => Seen::Copied,
            TOMBSTONE => Seen::Dead,
            live => Seen::Live(live - 1),
        };
        (seen, frozen)
    }
}

/// Why an operation found no bucket in this cell: the caller goes back to
/// the map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gone {
    /// Evicted or reset: the key is absent from that instant on.
    Dead,
    /// Frozen by a migration: the bucket is (or is about to be) in the
    /// successor table, with the state it had here.
    Moved,
}

/// One admission as it landed on a cell: the clock reading it was decided
/// at and the state it wrote. What a rollback needs to take it out again
/// (see `crate::multi`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Charge {
    pub(crate) now: u64,
    pub(crate) after: u64,
}

/// What one update did, in two words so that it travels in registers: the
/// state its decision rested on, and the state it wrote (`NOTHING` when it
/// denied). The `Decision`, six words, is built from it once the CAS loop
/// is over ([`decision`](Outcome::decision)): built inside the loop and
/// carried out of it, it went through the stack and was read back wider
/// than it was written, a failed store forwarding (issue 34).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Outcome {
    before: u64,
    after: u64,
}

/// What [`Cell::update_from`] does with an admission its loop decided.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Attempt {
    /// Land it with the CAS.
    Cas,
    /// Landed another way: this is the outcome.
    Done(Outcome),
    /// Not landed: load the word and decide again.
    Reload,
}

/// `Outcome::after` of a denial: no state is this large (they end at
/// [`STATE_END`]).
const NOTHING: u64 = u64::MAX;

impl Outcome {
    /// A decision on `before` that wrote `after` (`None`: it denied).
    #[inline]
    pub(crate) fn new(before: u64, after: Option<u64>) -> Self {
        Outcome {
            before,
            after: after.unwrap_or(NOTHING),
        }
    }

    /// The state the admission wrote, `None` for a denial.
    #[inline]
    pub(crate) fn admitted(self) -> Option<u64> {
        (self.after != NOTHING).then_some(self.after)
    }

    /// Whether the request was admitted.
    #[cfg(test)]
    pub(crate) fn is_allowed(self) -> bool {
        self.after != NOTHING
    }

    /// The answer, for a request of `cost` decided at `now` by `algorithm`.
    #[inline]
    pub(crate) fn decision<A: Algorithm>(self, algorithm: &A, now: u64, cost: u64) -> Decision {
        algorithm.decision(self.before, now, cost, self.admitted())
    }

    /// The admission as a multi-limit rollback needs it, if there was one,
    /// decided at `now`.
    #[inline]
    pub(crate) fn charge(self, now: u64) -> Option<Charge> {
        self.admitted().map(|after| Charge { now, after })
    }
}

/// CAS retries taken by all cells of the process: read by `stats()`, and
/// by the stress tests to assert that they really raced. Written only
/// when a CAS fails, never on an uncontended check.
static CAS_RETRIES: crate::striped::Striped = crate::striped::Striped::new();

/// The process-wide CAS retry count.
pub(crate) fn cas_retries() -> u64 {
    CAS_RETRIES.sum()
}

/// Out of line: inlined, its thread-local lookup was hoisted above the
/// CAS it follows, work between the load and the CAS that does not decide
/// the CAS.
#[cold]
#[inline(never)]
pub(crate) fn count_retry() {
    CAS_RETRIES.add();
    probe!(CAS_RETRY);
}

/// The live word for `state`.
#[inline]
pub(crate) fn live(state: u64) -> u64 {
    debug_assert!(state < STATE_END, "an algorithm produced a reserved state");
    state + 1
}

/// The state in the word of a cell no map holds (a direct limiter's):
/// never claimed, frozen or copied, so always live. Decoding it as
/// [`updatable`] does cost a direct check a tenth of its instructions.
#[inline(always)]
pub(crate) fn unshared(word: u64) -> Result<u64, Gone> {
    debug_assert!(
        (1..BUSY).contains(&word),
        "a direct limiter's cell is always live"
    );
    Ok(word - 1)
}

/// The state in `word` if it is a live, unfrozen bucket; otherwise why not.
#[inline]
fn updatable(word: u64) -> Result<u64, Gone> {
    match Seen::of(word) {
        (Seen::Live(state), false) => Ok(state),
        (Seen::Dead, _) => Err(Gone::Dead),
        // Copying or copied: the bucket is the successor's now. EMPTY and
        // BUSY are never handed out as a bucket.
        _ => {
            probe!(UPDATE_MET_FROZEN);
            Err(Gone::Moved)
        }
    }
}

impl Cell {
    /// A live cell holding `state` (a direct limiter's, which no map holds).
    pub(crate) fn new(state: u64) -> Self {
        Cell {
            word: AtomicU64::new(live(state)),
        }
    }

    /// An EMPTY cell (loom's atomics cannot be zeroed memory).
    #[cfg(turnstile_loom)]
    pub(crate) fn empty() -> Self {
        Cell {
            word: AtomicU64::new(EMPTY),
        }
    }

    /// Decides a request of `cost` (already checked) at `now`: one CAS
    /// loop that computes only the state it writes
    /// ([`admit`](crate::algorithms::sealed::Sealed::admit)), and returns
    /// what the caller needs to build the answer after it.
    #[inline]
    pub(crate) fn update<A: Algorithm>(
        &self,
        algorithm: &A,
        now: u64,
        cost: u64,
    ) -> Result<Outcome, Gone> {
        let current = self.word.load(Ordering::Relaxed);
        self.update_from(current, updatable, algorithm, now, cost, |_, _| {
            Attempt::Cas
        })
    }

    /// [`update`](Cell::update) from the word `current`, just loaded,
    /// read by `state_of` (`updatable` for a map's cell, [`unshared`] for a
    /// direct limiter's), in which each admission `state -> next` is first
    /// offered to `attempt` (a direct limiter's add: `crate::direct`).
    /// Always inlined: its outcome then stays in registers, and an
    /// `attempt` that always says [`Attempt::Cas`] costs nothing.
    #[inline(always)]
    pub(crate) fn update_from<A: Algorithm>(
        &self,
        mut current: u64,
        state_of: impl Fn(u64) -> Result<u64, Gone>,
        algorithm: &A,
        now: u64,
        cost: u64,
        mut attempt: impl FnMut(u64, u64) -> Attempt,
    ) -> Result<Outcome, Gone> {
        loop {
            let state = state_of(current)?;
            let Some(next) = algorithm.admit(state, now, cost) else {
                return Ok(Outcome::new(state, None));
            };
            match attempt(state, next) {
                Attempt::Cas => {}
                Attempt::Done(outcome) => return Ok(outcome),
                Attempt::Reload => {
                    current = self.word.load(Ordering::Relaxed);
                    continue;
                }
            }
            // Weak: a spurious failure only costs one more trip round the
            // loop, and the weak form is a plain LL/SC on ARM.
            match self.word.compare_exchange_weak(
                current,
                live(next),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(Outcome::new(state, Some(next))),
                Err(actual) => {
                    count_retry();
                    current = actual;
                }
            }
        }
    }

    /// The word now, for [`update_from`](Cell::update_from) or
    /// [`add`](Cell::add).
    #[inline]
    pub(crate) fn load(&self) -> u64 {
        self.word.load(Ordering::Relaxed)
    }

    /// Adds `amount` to the state, whatever it is, and returns the state
    /// it was added to. Only for a cell no map holds (a direct limiter's,
    /// never claimed, frozen or copied: on a map's cell the add would turn
    /// a reserved word into another), and only with amounts whose sum in
    /// flight keeps the state below [`STATE_END`] (see `crate::direct`).
    /// Relaxed, as an update's CAS: the word publishes nothing else.
    #[inline]
    pub(crate) fn add(&self, amount: u64) -> u64 {
        self.word
            .fetch_add(amount, Ordering::Relaxed)
            .wrapping_sub(1)
    }

    /// The leased limiter's take (`crate::leased`): [`modify`](Cell::modify)
    /// with a strong CAS, so that a failure is always another thread's
    /// write, never a spurious one: the take grows its leases on a lost
    /// race, and one thread alone must never see one. Returns the state
    /// `change` decided on, the state it wrote (`None`: it asked for
    /// nothing), and whether a CAS lost to another write. Always inlined,
    /// as [`update_from`](Cell::update_from) is: its answer then stays in
    /// registers.
    #[inline(always)]
    pub(crate) fn take(
        &self,
        mut change: impl FnMut(u64) -> Option<u64>,
    ) -> Result<(u64, Option<u64>, bool), Gone> {
        let mut current = self.word.load(Ordering::Relaxed);
        let mut lost = false;
        loop {
            let state = updatable(current)?;
            let Some(next) = change(state) else {
                return Ok((state, None, lost));
            };
            // Relaxed, as in `update`: the word publishes nothing else.
            match self.word.compare_exchange(
                current,
                live(next),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok((state, Some(next), lost)),
                Err(actual) => {
                    count_retry();
                    lost = true;
                    current = actual;
                }
            }
        }
    }

    /// Claims the cell for eviction if `claimable(state)`: after a
    /// successful claim no update can ever land on it again. Returns false
    /// if the state was not claimable, or the cell was already claimed or
    /// frozen (so it is not the key's bucket any more).
    pub(crate) fn try_claim(&self, claimable: impl Fn(u64) -> bool) -> bool {
        self.claim(claimable) == Ok(true)
    }

    /// [`try_claim`](Cell::try_claim) that says why it failed: `Ok(false)`
    /// when the state was not claimable.
    pub(crate) fn claim(&self, claimable: impl Fn(u64) -> bool) -> Result<bool, Gone> {
        let mut current = self.word.load(Ordering::Relaxed);
        loop {
            let state = updatable(current)?;
            if !claimable(state) {
                return Ok(false);
            }
            match self.word.compare_exchange(
                current,
                TOMBSTONE,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(true),
                // An update landed first: judge its state afresh.
                Err(actual) => current = actual,
            }
        }
    }

    /// Replaces the state with `change(state)` when that is `Some`, in one
    /// CAS loop, so the change lands atomically between whole decisions and
    /// is applied to the state current at that instant. Returns the state
    /// it wrote, or `None` when `change` asked for nothing.
    pub(crate) fn modify(&self, change: impl Fn(u64) -> Option<u64>) -> Result<Option<u64>, Gone> {
        let mut current = self.word.load(Ordering::Relaxed);
        loop {
            let state = updatable(current)?;
            let Some(next) = change(state) else {
                return Ok(None);
            };
            // Relaxed, as in `update`: the word publishes nothing else.
            match self.word.compare_exchange_weak(
                current,
                live(next),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(Some(next)),
                Err(actual) => {
                    count_retry();
                    current = actual;
                }
            }
        }
    }

    /// The bucket's state now, for reads that write nothing (peeks, eviction
    /// sampling).
    pub(crate) fn state(&self) -> Result<u64, Gone> {
        match Seen::of(self.word.load(Ordering::Relaxed)) {
            (Seen::Live(state), _) => Ok(state),
            (Seen::Dead, _) => Err(Gone::Dead),
            _ => Err(Gone::Moved),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithms::Gcra;

    #[test]
    fn two_threads_share_one_bucket_exactly() {
        let gcra = Gcra::new(&"1/h burst 50".parse().unwrap());
        let cell = Cell::new(0);
        let admitted: usize = std::thread::scope(|s| {
            let workers: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        (0..40)
                            .filter(|_| cell.update(&gcra, 0, 1).unwrap().is_allowed())
                            .count()
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).sum()
        });
        assert_eq!(admitted, 50);
    }

    #[test]
    fn a_claimed_cell_refuses_updates() {
        let gcra = Gcra::new(&"1/s".parse().unwrap());
        let cell = Cell::new(0);
        assert!(
            !cell.try_claim(|state| state != 0),
            "not claimable: unchanged"
        );
        assert!(cell.try_claim(|state| state == 0));
        assert!(!cell.try_claim(|_| true), "claimed once");
        assert_eq!(cell.update(&gcra, 0, 1), Err(Gone::Dead));
        assert_eq!(cell.state(), Err(Gone::Dead));
    }

    #[test]
    fn every_word_reads_back() {
        assert_eq!(Seen::of(0), (Seen::Empty, false));
        assert_eq!(Seen::of(FROZEN), (Seen::Empty, true));
        assert_eq!(Seen::of(live(0)), (Seen::Live(0), false));
        let last = STATE_END - 1;
        assert_eq!(Seen::of(live(last) | FROZEN), (Seen::Live(last), true));
        assert_eq!(Seen::of(BUSY), (Seen::Busy, false));
        assert_eq!(Seen::of(COPYING), (Seen::Copying, true));
        assert_eq!(Seen::of(COPIED | FROZEN), (Seen::Copied, true));
        assert_eq!(Seen::of(TOMBSTONE), (Seen::Dead, false));
    }
}
