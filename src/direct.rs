//! `DirectLimiter`: one bucket for a whole service or one upstream.
//!
//! # Admitting with an add
//!
//! One bucket checked by every thread is the common case (one limit for a
//! whole service), and there a CAS loop fails and retries whenever another
//! core's admission lands between its load and its compare-exchange
//! (measured at 2 threads: 0.07 to 0.39 retries per check). So when the
//! state just loaded decides the admission by itself, as GCRA's does
//! under load (TAT at or past now: the new TAT is `TAT + n*T`, whatever
//! `now` is), a check admits with one `fetch_add(n*T)` instead, which
//! cannot fail (`Sealed::additive`). The add returns the state `x` it met:
//!
//! - if `x` still admits the request by itself (`additive(x) = n*T`), the
//!   add *is* GCRA's admission on `x` at this reading, exactly the CAS it
//!   replaces, at its place in the word's modification order;
//! - if `x` is at or past now but the request overshoots it (another
//!   admission filled the bucket since the load), the add wrote
//!   `x + n*T = max(x, now) + n*T`: GCRA's admission map at this check's
//!   reading, applied to `x`, exactly a multi-limit charge. It is taken
//!   back as one, by the multi-limit rollback rule and under its proof
//!   (`crate::multi`), and only if no reset began since the check read the
//!   generation before its add (`crate::resets`, "Which bucket" in
//!   `crate::multi`): an add on a bucket that a reset has since replaced
//!   is never taken out of the new one. The request is then decided by
//!   the CAS loop;
//! - if `x` is before now (a refund, reset or take-back lowered the state
//!   since the load: the bucket was full at this reading), the add is not
//!   GCRA's map at this reading, and the rule's proof does not cover
//!   taking it back, so it is left in place: it adds at most
//!   `x + n*T - now < n*T` of debt past now, up to `n` tokens fewer,
//!   never more. The request is then decided by the CAS loop.
//!
//! So no interleaving admits more than the bucket allows. What it costs:
//! between an add that is taken back and its take-back, the state is
//! higher than any admission made it, by `n*T`, and a check that reads it
//! then may be denied where it would have been admitted a moment later
//! (a spurious denial, as a multi-limit check's charge can cause before its
//! rollback): only at the boundary of a full bucket, where two checks race
//! for its last tokens. A take-back keeps at most `now_r - now` of the add
//! (its own reading `now_r` is after the add): zero on a frozen clock, the
//! check's own duration otherwise, as a multi-limit rollback keeps. An add
//! left in a full bucket, or one that a reset overlaps (left in the new
//! bucket), costs up to `n` tokens, only when a refund, reset or take-back
//! lands between a check's load and its add.
//!
//! # Near the boundary
//!
//! A take-back is rare only where the bucket has room: an add overshoots
//! when other threads' adds, landing between this check's load and its
//! own, took the tokens it counted on. At a bucket held at its boundary
//! (every token taken as soon as it is due, by threads that check faster
//! than the rate) nearly every racing add did, and each take-back keeps
//! its check's duration of debt: two threads on a 1,000,000/s bucket held
//! at its boundary admitted 77 to 81 % of the rate, where the CAS loop
//! admits what one thread does. So a check adds only when its admission
//! leaves room for [`ADD_ROOM`] more tokens; for the last ones it runs the
//! CAS loop, which is exact and costs a retry where it races. An
//! overshoot then needs more than `ADD_ROOM` tokens taken by adds in the
//! few nanoseconds between one check's load and its add.
//!
//! The add cannot corrupt the word: this cell is no map's, so it is never
//! claimed, frozen or copied, and the bounds of `additive` (a state and a
//! tolerance below 2^61 ns, an amount of at most 2^32 ns) keep every sum of
//! adds in flight below the reserved words (`crate::algorithms::gcra`). A
//! map's cell takes no add: an add on TOMBSTONE makes it a frozen live
//! word, and on a frozen cell it changes the state a migration is copying.
//! The loom model `direct_adds_race_for_the_last_token` reaches the
//! take-back. Windows are not additive (their new state depends on
//! `now`), and keep the CAS loop.

use std::fmt;

use crossbeam_utils::CachePadded;

/// Tokens an admission must leave in the bucket for a check to make it
/// with an add rather than the CAS loop (see "Near the boundary"). None in
/// the loom models and this module's unit test: they race adds for a
/// bucket's last tokens, to reach the take-back that the room keeps rare.
#[cfg(not(any(test, turnstile_loom)))]
const ADD_ROOM: u64 = 32;
#[cfg(any(test, turnstile_loom))]
const ADD_ROOM: u64 = 0;

use crate::algorithms::{Algorithm, FromQuota, Gcra};
use crate::cell::{unshared, Attempt, Cell, Outcome};
use crate::clock::{Clock, DefaultClock};
use crate::decision::Decision;
use crate::error::{CostError, QuotaError};
use crate::live::Live;
use crate::quota::Quota;
use crate::resets::Resets;

/// One rate-limited bucket, shared by every caller: lock-free, `Send + Sync`,
/// used through `&` or `Arc`.
///
/// GCRA by default; any packed [`Algorithm`] (for example
/// [`FixedWindow`](crate::algorithms::FixedWindow)) through
/// [`builder`](DirectLimiter::builder).
///
/// ```
/// use turnstile_rl::{DirectLimiter, Quota};
///
/// let limiter = DirectLimiter::new(Quota::per_second(50)?);
/// let decision = limiter.check();
/// assert!(decision.is_allowed());
/// assert_eq!(decision.remaining(), 49);
/// # Ok::<(), turnstile_rl::QuotaError>(())
/// ```
pub struct DirectLimiter<C: Clock = DefaultClock, A: Algorithm = Gcra> {
    /// Alone on its cache line (DESIGN.md, "The map": a bucket hot on many
    /// cores): every admission writes it, and beside the quota and the
    /// clock, which every check reads, each admission took that line from
    /// every other core that was about to read them.
    cell: CachePadded<Cell>,
    /// Which bucket the cell holds, for multi-limit rollbacks: a new one
    /// after each reset.
    resets: Resets,
    /// Read whole by every check, changed by `set_quota` (`crate::live`).
    algorithm: Live<A>,
    clock: C,
}

impl DirectLimiter {
    /// A GCRA limiter for `quota` on the default (quanta) clock.
    pub fn new(quota: Quota) -> Self {
        Self::builder(quota).build()
    }

    /// A builder to choose the clock and the algorithm, as
    /// [`KeyedLimiter::builder`](crate::KeyedLimiter::builder) does.
    ///
    /// ```
    /// use turnstile_rl::algorithms::FixedWindow;
    /// use turnstile_rl::{DirectLimiter, ManualClock};
    ///
    /// let limiter = DirectLimiter::builder("3/min".parse()?)
    ///     .clock(ManualClock::new())
    ///     .algorithm_for::<FixedWindow>()?
    ///     .build();
    /// assert_eq!(limiter.check().remaining(), 2);
    /// # Ok::<(), turnstile_rl::QuotaError>(())
    /// ```
    pub fn builder(quota: Quota) -> DirectLimiterBuilder {
        DirectLimiterBuilder {
            quota,
            algorithm: Gcra::new(&quota),
            clock: DefaultClock::new(),
        }
    }
}

impl<C: Clock, A: Algorithm> DirectLimiter<C, A> {
    /// Decides one request of cost 1.
    #[inline]
    pub fn check(&self) -> Decision {
        // Cost 1 is always valid: every algorithm's limit is at least 1.
        self.decide(&self.algorithm.load(), 1)
    }

    /// Decides one request of cost `n`: `n` tokens pass together or not at
    /// all. An error, not a denial, when `n` is 0 or above the burst.
    #[inline]
    pub fn check_n(&self, n: u64) -> Result<Decision, CostError> {
        let algorithm = self.algorithm.load();
        algorithm.check_cost(n)?;
        Ok(self.decide(&algorithm, n))
    }

    /// Decides at the quota `algorithm`, read once for the whole check (or
    /// the last limit's, by a multi-limit check). Always inlined, as the
    /// keyed check path is: out of line, the call cost a check more than
    /// a fifth of its instructions, and its answer went through the stack.
    #[inline(always)]
    pub(crate) fn decide(&self, algorithm: &A, cost: u64) -> Decision {
        let now = self.clock.now();
        // One add at most: after a take-back, the CAS loop decides.
        let mut tried = false;
        let attempt = |state, next| {
            if tried
                || !algorithm.additive(state, now, next)
                || !algorithm.leaves_room(next, now, ADD_ROOM)
            {
                return Attempt::Cas;
            }
            tried = true;
            self.admit_by_add(algorithm, state, next, now, cost)
        };
        match self
            .cell
            .update_from(self.cell.load(), unshared, algorithm, now, cost, attempt)
        {
            // Built after the CAS loop, from what it returned in registers.
            Ok(outcome) => outcome.decision(algorithm, now, cost),
            // A direct limiter has no evictor, so its cell is never claimed.
            Err(_) => unreachable!("a direct limiter's cell is never tombstoned"),
        }
    }

    /// Makes the additive admission `state -> next` with one add (see
    /// "Admitting with an add" in the module docs). When the state the add
    /// met does not admit it so, takes the add back (or leaves it in a
    /// bucket that was full) and has the CAS loop decide.
    #[inline]
    fn admit_by_add(&self, algorithm: &A, state: u64, next: u64, now: u64, cost: u64) -> Attempt {
        let Some(generation) = self.resets.generation() else {
            return Attempt::Cas;
        };
        let amount = next - state;
        let before = self.cell.add(amount);
        let after = before.wrapping_add(amount);
        if algorithm.admit(before, now, cost) == Some(after)
            && algorithm.additive(before, now, after)
        {
            return Attempt::Done(Outcome::new(before, Some(after)));
        }
        if before >= now {
            self.take_back(algorithm, after, now, cost, generation);
        } else {
            // A full bucket at this reading (lowered since the load): the
            // add is left in it (see the module docs).
            crate::cell::count_retry();
            probe!(ADD_LEFT_IN_FULL_BUCKET);
        }
        Attempt::Reload
    }

    /// Takes back an add that wrote `after` and did not admit (it met a
    /// state at or past `now` that the request overshot), if the cell
    /// still holds the bucket of `generation`.
    #[cold]
    #[inline(never)]
    fn take_back(&self, algorithm: &A, after: u64, now: u64, cost: u64, generation: u64) {
        crate::cell::count_retry();
        probe!(ADD_TAKEN_BACK);
        #[cfg(test)]
        tests::TAKEN_BACK.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // The add met a state at or past `now`: it was GCRA's admission at
        // this check's reading, taken back as a multi-limit charge.
        self.resets.roll_back(generation, || {
            let _ = self.cell.modify(|state| {
                // Read after the state, as a multi-limit rollback's.
                algorithm.taken_back(state, now, after, self.clock.now(), cost)
            });
        });
    }

    /// The clock this limiter reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The bucket and the count of its resets: what a multi-limit check
    /// charges and rolls back (`crate::multi`).
    pub(crate) fn bucket(&self) -> (&Cell, &Resets) {
        (&*self.cell, &self.resets)
    }

    /// The algorithm this limiter runs now (a copy: a quota change
    /// replaces it).
    pub fn algorithm(&self) -> A {
        self.algorithm.load()
    }

    /// A number that moves whenever the quota changes (0 until the first
    /// [`set_quota`](DirectLimiter::set_quota)): what the HTTP layer
    /// compares to know its `RateLimit-Policy` is current.
    pub fn quota_version(&self) -> u64 {
        self.algorithm.version()
    }
}

impl<C: Clock, A: Algorithm> DirectLimiter<C, A> {
    /// The decision a [`check`](DirectLimiter::check) would get now, without
    /// taking anything: one load of the cell, no write, so a later check is
    /// decided exactly as if this call had not been made.
    ///
    /// ```
    /// use turnstile_rl::DirectLimiter;
    ///
    /// let limiter = DirectLimiter::new("3/min".parse()?);
    /// assert_eq!(limiter.peek().remaining(), 2);
    /// assert_eq!(limiter.peek().remaining(), 2, "peeking took nothing");
    /// assert_eq!(limiter.check().remaining(), 2);
    /// # Ok::<(), turnstile_rl::QuotaError>(())
    /// ```
    pub fn peek(&self) -> Decision {
        // Cost 1 is always valid: every algorithm's limit is at least 1.
        self.peek_as(&self.algorithm.load(), 1)
    }

    /// [`peek`](DirectLimiter::peek) for a request of cost `n`: an error,
    /// not a denial, when `n` is 0 or above the burst.
    ///
    /// ```
    /// use turnstile_rl::{CostError, DirectLimiter};
    ///
    /// let limiter = DirectLimiter::new("10/s".parse()?);
    /// assert!(limiter.peek_n(10).unwrap().is_allowed());
    /// assert_eq!(limiter.peek_n(0), Err(CostError::Zero));
    /// # Ok::<(), turnstile_rl::QuotaError>(())
    /// ```
    pub fn peek_n(&self, n: u64) -> Result<Decision, CostError> {
        let algorithm = self.algorithm.load();
        algorithm.check_cost(n)?;
        Ok(self.peek_as(&algorithm, n))
    }

    /// Fills the bucket again, as if it had never been used. Returns whether
    /// it was in use. One CAS: a check racing it lands before or after. A
    /// check that read the clock before the reset and lands after it is
    /// decided on the new bucket at that older reading: as any reading `d`
    /// late on a fresh bucket (see `crate::clock`, "A clock that steps
    /// backwards"), it can let up to `d / T` more pass, once.
    ///
    /// The full bucket is a new one: a multi-limit check that charged the
    /// old one and is then denied takes nothing out of it. So a reset waits
    /// for such rollbacks already under way to land first (each is one
    /// CAS); checks never wait for a reset.
    ///
    /// ```
    /// use turnstile_rl::DirectLimiter;
    ///
    /// let limiter = DirectLimiter::new("1/h".parse()?);
    /// let _ = limiter.check();
    /// assert!(limiter.check().is_denied());
    /// assert!(limiter.reset());
    /// assert!(limiter.check().is_allowed());
    /// # Ok::<(), turnstile_rl::QuotaError>(())
    /// ```
    pub fn reset(&self) -> bool {
        let in_use = std::cell::Cell::new(false);
        self.resets.reset(|| {
            // State 0 is a full bucket for every algorithm. Written even
            // when it is there already: the write is what a charge racing
            // the reset orders itself against (see `crate::resets`).
            let _ = self.cell.modify(|state| {
                in_use.set(state != 0);
                Some(0)
            });
        });
        in_use.get()
    }

    fn peek_as(&self, algorithm: &A, cost: u64) -> Decision {
        let now = self.clock.now();
        // A direct cell is never claimed or frozen: `state` is always `Ok`.
        algorithm
            .decide(self.cell.state().unwrap_or(0), now, cost)
            .decision
    }
}

impl<C: Clock> DirectLimiter<C, Gcra> {
    /// Gives back `n` tokens a check took (the request was not served).
    /// Returns whether anything was given back.
    ///
    /// At its instant `now`, one CAS sets `TAT := max(TAT - n*T, now)`:
    /// exact (each token took exactly `T`), never fuller than full, and a
    /// no-op when the bucket has refilled by itself in the meantime. A
    /// refund racing checks lands between two of them, as if applied at its
    /// own instant. An error, not a no-op, when `n` is 0 or above the burst.
    ///
    /// ```
    /// use turnstile_rl::DirectLimiter;
    ///
    /// let limiter = DirectLimiter::new("10/min".parse()?);
    /// assert_eq!(limiter.check_n(3)?.remaining(), 7);
    /// assert!(limiter.refund(3)?);
    /// assert_eq!(limiter.peek().remaining(), 9);
    /// assert!(!limiter.refund(1)?, "already full");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn refund(&self, n: u64) -> Result<bool, CostError> {
        let algorithm = &self.algorithm.load();
        algorithm.check_cost(n).map_err(CostError::for_refund)?;
        let now = self.clock.now();
        Ok(matches!(
            self.cell.modify(|tat| algorithm.refunded(tat, now, n)),
            Ok(Some(_))
        ))
    }

    /// Changes the quota while the limiter serves, through `&self`: checks
    /// that begin after this returns decide at `quota`. Nothing is
    /// rebuilt and the bucket is kept, by the one rule every limiter
    /// follows ([`Quota`]'s "Changing a quota"): what was spent stays
    /// spent, and a caller that spent more than the new burst waits until
    /// its debt is within it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile_rl::{DirectLimiter, ManualClock};
    ///
    /// let clock = ManualClock::new();
    /// let limiter = DirectLimiter::builder("10/s burst 20".parse()?).clock(clock.clone()).build();
    /// let _ = limiter.check_n(10)?; // half the burst spent
    /// limiter.set_quota("10/s burst 40".parse()?);
    /// assert_eq!(limiter.peek().remaining(), 29, "40 - 10 spent - 1");
    /// limiter.set_quota("10/s burst 5".parse()?);
    /// // Spent 10 (1 s owed), more than the new burst of 5 (0.5 s): the
    /// // first token comes when the debt is back within it, plus one T.
    /// assert_eq!(limiter.peek().retry_after(), Some(Duration::from_millis(600)));
    /// clock.advance(Duration::from_millis(600));
    /// assert!(limiter.check().is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_quota(&self, quota: Quota) {
        self.algorithm.store(Gcra::new(&quota));
    }

    /// The quota this limiter enforces now: `burst` requests per the time
    /// an empty bucket takes to fill (see [`Gcra::quota`]).
    pub fn quota(&self) -> Quota {
        self.algorithm.load().quota()
    }
}

/// Builds a [`DirectLimiter`]: `DirectLimiter::builder(quota)`.
#[derive(Debug)]
pub struct DirectLimiterBuilder<C = DefaultClock, A = Gcra> {
    /// The quota given to `builder`, kept for
    /// [`algorithm_for`](DirectLimiterBuilder::algorithm_for).
    quota: Quota,
    algorithm: A,
    clock: C,
}

impl<C: Clock, A: Algorithm> DirectLimiterBuilder<C, A> {
    /// Reads time from `clock` (a [`ManualClock`](crate::ManualClock) in tests).
    pub fn clock<C2: Clock>(self, clock: C2) -> DirectLimiterBuilder<C2, A> {
        DirectLimiterBuilder {
            quota: self.quota,
            algorithm: self.algorithm,
            clock,
        }
    }

    /// Runs the algorithm `A2` configured by the builder's quota instead of
    /// the quota's GCRA; [`QuotaError::DoesNotFit`] when `A2` cannot hold
    /// the quota (a window's limit or period out of its bounds).
    pub fn algorithm_for<A2: FromQuota>(self) -> Result<DirectLimiterBuilder<C, A2>, QuotaError> {
        let algorithm = A2::from_quota(&self.quota)?;
        Ok(self.algorithm(algorithm))
    }

    /// Runs `algorithm` (for example a
    /// [`FixedWindow`](crate::algorithms::FixedWindow) built for another
    /// quota) instead of the quota's GCRA.
    pub fn algorithm<A2: Algorithm>(self, algorithm: A2) -> DirectLimiterBuilder<C, A2> {
        DirectLimiterBuilder {
            quota: self.quota,
            algorithm,
            clock: self.clock,
        }
    }

    /// The limiter, starting full.
    pub fn build(self) -> DirectLimiter<C, A> {
        DirectLimiter {
            cell: CachePadded::new(Cell::new(0)),
            resets: Resets::new(),
            algorithm: Live::new(self.algorithm),
            clock: self.clock,
        }
    }
}

impl<C: Clock, A: Algorithm + fmt::Debug> fmt::Debug for DirectLimiter<C, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DirectLimiter")
            .field("algorithm", &self.algorithm)
            .field("state", &self.cell.state().unwrap_or(0))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use super::DirectLimiter;
    use crate::clock::ManualClock;

    /// Adds taken back so far (see `take_back`).
    pub(super) static TAKEN_BACK: AtomicU64 = AtomicU64::new(0);

    /// Under load (the clock frozen at the bucket's start), two threads
    /// race for a bucket's tokens with adds: exactly the burst passes, and
    /// the bucket is left exactly empty, in every round, until a round has
    /// raced an add that met the other thread's admission and was taken
    /// back.
    #[test]
    fn racing_adds_admit_exactly_the_burst() {
        const BURST: u64 = 64;
        let quota = crate::quota::Quota::per_second(1_000)
            .and_then(|q| q.burst(BURST))
            .unwrap();
        let before = TAKEN_BACK.load(Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut rounds = 0;
        while TAKEN_BACK.load(Ordering::Relaxed) == before {
            assert!(
                Instant::now() < deadline,
                "no add was taken back in {rounds} rounds"
            );
            rounds += 1;
            let limiter = DirectLimiter::builder(quota)
                .clock(ManualClock::new())
                .build();
            let barrier = std::sync::Barrier::new(2);
            let admitted: u64 = std::thread::scope(|s| {
                let threads: Vec<_> = (0..2)
                    .map(|_| {
                        s.spawn(|| {
                            barrier.wait();
                            (0..BURST).filter(|_| limiter.check().is_allowed()).count() as u64
                        })
                    })
                    .collect();
                threads.into_iter().map(|t| t.join().unwrap()).sum()
            });
            assert_eq!(admitted, BURST, "round {rounds}");
            let empty = limiter.peek().retry_after();
            assert_eq!(empty, Some(Duration::from_millis(1)), "round {rounds}");
        }
    }

    /// Shared by `&` or `Arc` across threads: a compile-time check.
    #[test]
    fn limiters_are_send_and_sync() {
        fn shareable<T: Send + Sync>() {}
        shareable::<super::DirectLimiter>();
        shareable::<super::DirectLimiter<crate::clock::RecentClock, crate::algorithms::FixedWindow>>(
        );
    }
}
