//! `LeasedLimiter`: one bucket hot on many cores, whose throughput grows
//! with them, at the price of a proven, bounded over-admission. Opt-in:
//! [`DirectLimiter`](crate::DirectLimiter) stays the exact default.
//!
//! # Why
//!
//! Every admission of an exact limiter writes the bucket's one word, and a
//! word written by every core moves between them at a fixed rate (measured
//! from outside on 16 cores: a plain CAS loop on one word did 28 M checks
//! a second on 1 thread and 11 M on 16). No exact limiter passes that
//! line's limit. A leased limiter writes it once per *lease*: a thread
//! takes up to `max_lease` tokens from the shared bucket in one CAS, keeps
//! the ones its request did not need in a counter of its own (its
//! *stripe*), and admits its next requests from there, writing only that
//! counter's cache line, which no other core touches.
//!
//! # The protocol
//!
//! The shared bucket is GCRA on one word, as a `DirectLimiter`'s. Beside it
//! sit `stripes` (a power of two) cache-padded lease words; a thread uses
//! the stripe of its index (threads are numbered in the order they first
//! check any leased limiter), so memory is fixed when the limiter is built
//! and no thread-local needs a destructor. A lease word packs the tokens it
//! holds (16 bits) and the tick of the clock reading it was taken at
//! (48 bits; one tick is [`LEASE_TICK`], 1.024 µs). A check of cost `n`
//! at clock reading `r`:
//!
//! 1. **Spend**: if its stripe's lease is *live* at `r` (its tick `s`
//!    satisfies `s*U <= r < s*U + ttl`, `U` the tick) and holds at least
//!    `n` tokens, takes `n` out of it with a CAS on the stripe. Admitted.
//! 2. **Take**: otherwise, one CAS loop on the shared bucket takes `m`
//!    tokens at reading `r`, exactly as an admission of cost `m` would:
//!    `m` is the stripe's lease size if the bucket holds that many (else
//!    as many as it holds), and at least `n`; if the bucket does not hold
//!    `n`, the request is denied by the bucket, exactly as a
//!    `DirectLimiter` denies it.
//! 3. **Install**: the `m - n` tokens left over go into the stripe, tick
//!    `floor(r/U)`, unless the stripe holds a live lease already (another
//!    thread of the stripe took one at the same time): then a lease of the
//!    same tick is merged with it, up to `max_lease - 1` tokens, and of
//!    two leases of different ticks the larger is kept. The tokens not
//!    kept are dropped.
//!
//! Tokens are never returned to the bucket: a lease that is no longer
//! live is dropped (replaced by the next install). That keeps the bound
//! below free of a return's own race with the refill (a refund is
//! `max(TAT - k*T, now)`, and which `now` is right for tokens taken at
//! another reading is the multi-limit rollback's whole proof,
//! `crate::multi`), at the cost of under-admission, bounded the same way.
//!
//! **Adaptive size.** A stripe's lease size starts at 1: a take of exactly
//! the request's cost, so the limiter *is* the exact limiter, decision for
//! decision. It doubles (up to `max_lease`) after a take whose strong CAS
//! lost to another thread's write on the shared word, and halves at each
//! take once no take of the stripe has lost for [`CALM`] of the clock:
//! leases grow only where the shared line is contended, and fall back
//! once it is not. (Shrinking by one at every take that did not lose, the
//! first design, never let a lease grow: at two threads a take of a small
//! lease loses less than half the time, so the size sat at 1 and 2, and
//! the leased limiter was no faster than the exact one.) The CAS is strong
//! (`compare_exchange`), so a failure is always another write, never a
//! spurious one, and one thread alone never grows a lease.
//!
//! # The bound
//!
//! Write `T` for the emission interval, `B` for the burst, `L` for
//! `max_lease`, `S` for `stripes`, `U` for [`LEASE_TICK`], and count
//! admissions by the clock reading each check was decided at. The exact
//! limiter admits at most `B + floor(w/T)` tokens at readings in any
//! window `[a, a + w]`.
//!
//! **Time: for any window of length `w`, a leased limiter admits at most
//! `B + floor((w + ttl + U)/T)`, that is at most `ceil((ttl + U)/T)`
//! tokens more than the exact limiter.** Unconditionally.
//!
//! *Proof.* Every token admitted was taken from the shared bucket, at most
//! once: a take's CAS moves its `m` tokens out of the bucket's word; `n`
//! of them are admitted at once, and the rest are only ever in one
//! stripe's word, where each spend's CAS removes what it admits (merges
//! and drops only lower the count). (i) *The bucket's takes obey GCRA's
//! window bound*: a take at reading `t` of `m` tokens writes
//! `max(TAT, t) + m*T <= t + B*T`, and every write of the word raises it
//! (no refund, reset or return ever lowers it). So in the word's
//! modification order, the first take at a reading in `[c, c + v]` leaves
//! it at `>= c + m*T`, each later one raises it by its own `m*T`, and the
//! last leaves it `<= c + v + B*T`: the takes at readings in a window of
//! length `v` hold at most `B + floor(v/T)` tokens. (ii) *A token spent at
//! reading `r` was taken at a reading `t0` in `(r - ttl, r + U)`*: its
//! lease's tick is `s = floor(t0/U)` (a merge joins only leases of the
//! same tick), so `s*U <= t0 < s*U + U`, and the spend needed
//! `s*U <= r < s*U + ttl`. So every token admitted at a reading in
//! `[a, a + w]` was taken at a reading in `(a - ttl, a + w + U)`, a window
//! shorter than `w + ttl + U`, and (i) bounds those. ∎
//!
//! **Tokens: with ordered readings, a window admits at most `S * (L - 1)`
//! tokens more than the exact limiter.** "Ordered readings": no check
//! acts on a reading older than one another check has already acted on;
//! exactly true on a clock that moves only while no check is in progress
//! (the tests' manual clock, stepped between phases), and true of a real
//! clock except for a check descheduled between its clock read and its
//! CAS, each of which can add up to `L - 1` more.
//!
//! *Proof.* Tokens admitted at readings in `[a, b]` were taken at readings
//! in `[a, b]` (at most the exact bound, by (i)) or before `a`. With
//! ordered readings every take before `a` and its install ended before
//! any check at `a` or later began, so the tokens taken before `a` that
//! are still spendable are those in the stripes then: at most `L - 1` in
//! each (an install writes at most `L - 1`, a merge caps at `L - 1`). ∎
//!
//! So in any window, over-admission is at most
//! `min(ceil((ttl + U)/T), S * (L - 1))` with ordered readings, and
//! `ceil((ttl + U)/T)` always. The default time to live,
//! `max(L*T, 1 ms)`, makes the first about `L` tokens for quotas slower
//! than `L` per millisecond.
//!
//! Two cases are exact. A clock that never moves admits at most `B`,
//! ever: every take was at its one reading, and (i) with `v = 0` bounds
//! them all (the frozen-clock tests). And one thread alone never loses a
//! take's CAS, so its leases stay one token and it *is* the exact limiter;
//! a thread left alone after others stopped is exact again once its
//! stripe has spent or outlived its lease, and its size has halved back to
//! one (`log2(L)` takes after [`CALM`] without a lost race).
//!
//! **Under-admission.** Tokens dropped (a lease that expired unspent, the
//! smaller of two leases installed at once, a merge's excess over
//! `L - 1`) and tokens in the stripes of threads that stopped checking
//! are spent by no one: spurious denials, at most `L - 1` tokens a drop.
//! Two installs meet only when two threads of one stripe take at once,
//! rare while each thread has a stripe of its own (at most `S` threads).
//! [`DirectLimiter`] drops nothing.
//!
//! [`DirectLimiter`]: crate::DirectLimiter
//!
//! # What a check costs
//!
//! A check served from a lease is a clock read, a load and a CAS of a line
//! only its own threads write; the shared word is written once per lease
//! and never read otherwise. The decision's figures come from the
//! bucket's state as of the stripe's last take (a copy kept on the
//! stripe's line, aged to this check's reading), plus the lease's tokens
//! left. So `remaining` and `reset_after` are this stripe's view: they do
//! not see what other stripes took from the bucket since its last take,
//! and overstate what this caller can still spend by that much (never
//! understate it, on a clock that moves forward): an estimate, where a
//! `DirectLimiter`'s are exact. Reading the shared word on every check to
//! correct them would put back the line every core contends for. A denial
//! is the bucket's own, with its exact `retry_after`.
//!
//! # What it does not do
//!
//! No `reset`, `refund`, `set_quota` or multi-limit rollback: each lowers
//! the bucket's word, and (i) rests on no write ever lowering it (a lowered
//! word lets takes at readings in one window hold more than its bound,
//! and a refund's `now` for tokens leased at another reading is the
//! multi-limit rollback's question again). Build a new limiter instead.
//! No `Algorithm` parameter: the bound is GCRA's.
//!
//! Beyond the clock's 2^58 ns (9.1 years after its origin) a lease's tick
//! no longer fits its 48 bits: from then on the limiter leases nothing and
//! is exact.

use std::fmt;
use std::sync::atomic::{AtomicU64 as PlainU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use crossbeam_utils::CachePadded;

use crate::algorithms::sealed::Sealed;
use crate::algorithms::{Algorithm, Gcra};
use crate::cell::Cell;
use crate::clock::{saturating_nanos, Clock, DefaultClock};
use crate::decision::Decision;
use crate::error::{CostError, LeaseError};
use crate::quota::Quota;
use crate::sync::{AtomicU64, Ordering};

/// The largest lease: a stripe holds at most `MAX_LEASE - 1` tokens, in
/// the 16 bits its word gives them.
pub const MAX_LEASE: u64 = 1 << TOKEN_BITS;

/// The resolution of a lease's time of take: 2^10 ns. Part of the time
/// bound (see the module docs), as `U`.
pub const LEASE_TICK: Duration = Duration::from_nanos(1 << TICK_SHIFT);

/// The shortest lease time to live: ten ticks, so rounding a take's reading
/// down to its tick costs a lease at most a tenth of its life.
pub const MIN_LEASE_TTL: Duration = Duration::from_nanos(10 << TICK_SHIFT);

/// The longest lease time to live. Past it the time bound stops meaning
/// anything a service would want.
pub const MAX_LEASE_TTL: Duration = Duration::from_secs(3_600);

/// The most stripes.
pub const MAX_STRIPES: usize = 1 << 10;

/// How long a stripe's takes must go without losing a race on the shared
/// word before its lease size starts to fall back (halving at each take).
pub const CALM: Duration = Duration::from_millis(1);

/// The default largest lease (capped at the burst).
pub const DEFAULT_MAX_LEASE: u64 = 64;

/// The shortest default time to live: `max_lease * T` is nanoseconds for
/// fast quotas, shorter than a thread's gap between two checks.
pub const DEFAULT_MIN_LEASE_TTL: Duration = Duration::from_millis(1);

const CALM_NANOS: u64 = CALM.as_nanos() as u64;
const TICK_SHIFT: u32 = 10;
const TOKEN_BITS: u32 = 16;
const TICK_BITS: u32 = 64 - TOKEN_BITS;
const TICK_MASK: u64 = (1 << TICK_BITS) - 1;

const _: () = assert!(MAX_STRIPES.is_power_of_two());
const _: () = assert!(TICK_BITS + TICK_SHIFT < 64);

/// A stripe's lease, packed: tokens in the top 16 bits, the tick of its
/// take below. `Lease(0)` holds nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Lease(u64);

impl Lease {
    fn new(tokens: u64, tick: u64) -> Self {
        debug_assert!(tokens < MAX_LEASE && tick <= TICK_MASK);
        Lease(tokens << TICK_BITS | tick)
    }

    fn tokens(self) -> u64 {
        self.0 >> TICK_BITS
    }

    fn tick(self) -> u64 {
        self.0 & TICK_MASK
    }

    /// The tokens spendable at reading `now`: all of them while the lease
    /// is live (`s*U <= now < s*U + ttl`), none otherwise.
    #[inline]
    fn spendable(self, now: u64, ttl: u64) -> u64 {
        let start = self.tick() << TICK_SHIFT;
        if now >= start && now - start < ttl {
            self.tokens()
        } else {
            0
        }
    }

    /// This lease with `cost` tokens fewer (it holds at least `cost`).
    fn spent(self, cost: u64) -> Self {
        Lease(self.0 - (cost << TICK_BITS))
    }
}

/// The tick a lease taken at reading `now` records, `None` past the last
/// tick the word holds (2^58 ns): no lease then.
#[inline]
fn tick_of(now: u64) -> Option<u64> {
    let tick = now >> TICK_SHIFT;
    (tick <= TICK_MASK).then_some(tick)
}

/// One stripe: alone on its cache line, written only by its own threads.
#[derive(Debug)]
struct Stripe {
    /// The lease ([`Lease`]), taken from and spent by CAS.
    lease: AtomicU64,
    /// How many tokens the next take asks for: a heuristic (see "Adaptive
    /// size"), so a plain relaxed word that no model needs to explore.
    size: PlainU64,
    /// The reading of the last take that lost a race, for the fallback.
    lost_at: PlainU64,
    /// The bucket's state after this stripe's last take: the figures of a
    /// decision served from the lease. Only a figure, never a decision's
    /// ground.
    tat: PlainU64,
    /// CASes this stripe's threads lost, on the stripe or the bucket:
    /// what the stress tests read to know they raced. Written only on a
    /// lost race, on a line those threads write anyway.
    races: PlainU64,
}

impl Stripe {
    fn new(size: u64) -> Self {
        Stripe {
            lease: AtomicU64::new(0),
            size: PlainU64::new(size),
            lost_at: PlainU64::new(0),
            tat: PlainU64::new(0),
            races: PlainU64::new(0),
        }
    }

    /// Takes `cost` tokens from the lease if it is live at `now` and holds
    /// them: the tokens it has left, or `None` when it cannot serve.
    #[inline]
    fn spend(&self, now: u64, ttl: u64, cost: u64) -> Option<u64> {
        // Relaxed: the lease word publishes nothing; what a spend may take
        // is decided by its own value (its modification order) and the
        // spender's reading, nothing else.
        let mut current = self.lease.load(Ordering::Relaxed);
        loop {
            let lease = Lease(current);
            let tokens = lease.spendable(now, ttl);
            if tokens < cost {
                return None;
            }
            match self.lease.compare_exchange_weak(
                current,
                lease.spent(cost).0,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(tokens - cost),
                Err(actual) => {
                    self.raced();
                    probe!(LEASE_SPEND_RACED);
                    current = actual;
                }
            }
        }
    }

    /// Puts `left` tokens taken at `now` (tick `tick`) into the stripe (see
    /// "Install" in the module docs).
    fn install(&self, left: u64, tick: u64, now: u64, ttl: u64, most: u64) {
        let mut current = self.lease.load(Ordering::Relaxed);
        loop {
            let held = Lease(current);
            let next = if held.spendable(now, ttl) == 0 {
                Lease::new(left, tick)
            } else if held.tick() == tick {
                // Taken in the same tick: one lease, capped.
                probe!(LEASE_MERGED);
                Lease::new((held.tokens() + left).min(most), tick)
            } else if held.tokens() < left {
                probe!(LEASE_DROPPED);
                Lease::new(left, tick)
            } else {
                probe!(LEASE_DROPPED);
                return;
            };
            // Relaxed, as a spend's; weak, as the cell's update: a
            // spurious failure costs one more trip round the loop.
            match self.lease.compare_exchange_weak(
                current,
                next.0,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(actual) => {
                    self.raced();
                    probe!(LEASE_INSTALL_RACED);
                    current = actual;
                }
            }
        }
    }

    /// Counts a lost race, here and in the process's CAS retries.
    #[cold]
    #[inline(never)]
    fn raced(&self) {
        crate::cell::count_retry();
        self.races.fetch_add(1, Relaxed);
    }

    /// The next take's size after a take at `now` that `lost` a CAS or
    /// did not (see "Adaptive size").
    #[inline]
    fn adapt(&self, lost: bool, now: u64, max_lease: u64) {
        let size = self.size.load(Relaxed);
        let next = if lost {
            probe!(LEASE_GREW);
            self.lost_at.store(now, Relaxed);
            size.saturating_mul(2).min(max_lease)
        } else if size > 1 && now.saturating_sub(self.lost_at.load(Relaxed)) >= CALM_NANOS {
            size / 2
        } else {
            return;
        };
        if next != size {
            self.size.store(next, Relaxed);
        }
    }
}

/// This thread's number, from 0 in the order threads first check a leased
/// limiter: its stripe is this modulo the stripes. A `usize`, so the
/// thread-local has no destructor. Under loom, one per model thread (so a
/// model's two threads take consecutive numbers: two stripes of two).
#[inline]
fn thread_index() -> usize {
    static THREADS: AtomicUsize = AtomicUsize::new(0);
    #[cfg(turnstile_loom)]
    use loom::thread_local;
    #[cfg(not(turnstile_loom))]
    use std::thread_local;
    thread_local! {
        static INDEX: usize = THREADS.fetch_add(1, Relaxed);
    }
    // A thread whose locals are gone (exiting) uses stripe 0.
    INDEX.try_with(|index| *index).unwrap_or(0)
}

/// One bucket shared by every thread, that hands out leases of its tokens
/// so that its throughput grows with cores: GCRA, lock-free, `Send +
/// Sync`, over-admitting at most the bound the [module docs](crate::leased)
/// prove. Opt-in: [`DirectLimiter`](crate::DirectLimiter) is exact.
///
/// ```
/// use std::time::Duration;
/// use turnstile_rl::LeasedLimiter;
///
/// // One limit for a whole service, checked by every worker thread.
/// let limiter = LeasedLimiter::builder("1000000/s burst 10000".parse()?)
///     .max_lease(32)
///     .lease_ttl(Duration::from_millis(1))
///     .build()?;
/// assert!(limiter.check().is_allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct LeasedLimiter<C: Clock = DefaultClock> {
    /// The shared bucket, alone on its line (as a `DirectLimiter`'s).
    cell: CachePadded<Cell>,
    stripes: Box<[CachePadded<Stripe>]>,
    /// `stripes.len() - 1` (a power of two's).
    mask: usize,
    gcra: Gcra,
    /// The emission interval `T`, in nanoseconds.
    interval: u64,
    max_lease: u64,
    /// In nanoseconds.
    ttl: u64,
    adaptive: bool,
    clock: C,
}

impl LeasedLimiter {
    /// A builder for `quota` on the default (quanta) clock, with
    /// [`DEFAULT_MAX_LEASE`] (at most the burst), the default time to
    /// live (`max(max_lease * T, 1 ms)`), twice the cores' stripes, and
    /// adaptive leases.
    pub fn builder(quota: Quota) -> LeasedLimiterBuilder {
        LeasedLimiterBuilder {
            quota,
            clock: DefaultClock::new(),
            max_lease: None,
            ttl: None,
            stripes: None,
            adaptive: true,
        }
    }
}

impl<C: Clock> LeasedLimiter<C> {
    /// Decides one request of cost 1.
    #[inline]
    pub fn check(&self) -> Decision {
        // Cost 1 is always valid: the burst is at least 1.
        self.decide(1)
    }

    /// Decides one request of cost `n`: an error, not a denial, when `n`
    /// is 0 or above the burst.
    #[inline]
    pub fn check_n(&self, n: u64) -> Result<Decision, CostError> {
        self.gcra.check_cost(n)?;
        Ok(self.decide(n))
    }

    #[inline]
    fn decide(&self, cost: u64) -> Decision {
        let now = self.clock.now();
        let stripe = &self.stripes[thread_index() & self.mask];
        match stripe.spend(now, self.ttl, cost) {
            Some(left) => {
                let tat = stripe.tat.load(Relaxed);
                self.gcra.leased_decision(tat, now, left)
            }
            None => self.take(stripe, now, cost),
        }
    }

    /// Steps 2 and 3 of the protocol: a take from the shared bucket, and
    /// the install of what the request did not need. Inlined, as the
    /// direct check is: out of line, its answer went through the stack.
    #[inline(always)]
    fn take(&self, stripe: &Stripe, now: u64, cost: u64) -> Decision {
        let tick = tick_of(now);
        let size = match tick {
            Some(_) => stripe.size.load(Relaxed).max(cost),
            None => cost,
        };
        let mut took = cost;
        let taken = self.cell.take(|state| {
            let (amount, next) = self.lease_from(state, now, cost, size)?;
            took = amount;
            Some(next)
        });
        // A leased limiter's cell is no map's: never claimed or frozen.
        let Ok((before, after, lost)) = taken else {
            unreachable!("a leased limiter's cell is never tombstoned")
        };
        let Some(after) = after else {
            return self.gcra.decision(before, now, cost, None);
        };
        if lost {
            // The cell counted its retries; the stripe counts the take.
            stripe.races.fetch_add(1, Relaxed);
        }
        if self.adaptive {
            stripe.adapt(lost, now, self.max_lease);
        }
        let left = took - cost;
        if let (Some(tick), true) = (tick, left > 0) {
            stripe.tat.store(after, Relaxed);
            stripe.install(left, tick, now, self.ttl, self.max_lease - 1);
        }
        self.gcra.leased_decision(after, now, left)
    }

    /// What a take of a lease of `size` (at least `cost`) takes from a
    /// bucket at `state`: as many tokens as it holds up to `size`, and at
    /// least `cost`; `None` when it does not hold `cost`. A lease of the
    /// cost alone (one thread's, always) is one admission, as a
    /// `DirectLimiter`'s; a larger one counts what the bucket holds (a
    /// division) only when it does not hold the whole lease.
    #[inline]
    fn lease_from(&self, state: u64, now: u64, cost: u64, size: u64) -> Option<(u64, u64)> {
        if size > cost {
            if let Some(next) = self.gcra.admit(state, now, size) {
                return Some((size, next));
            }
            let amount = self.gcra.available(state, now).min(size);
            if amount > cost {
                if let Some(next) = self.gcra.admit(state, now, amount) {
                    return Some((amount, next));
                }
            }
        }
        self.gcra.admit(state, now, cost).map(|next| (cost, next))
    }

    /// The quota this limiter enforces.
    pub fn quota(&self) -> Quota {
        self.gcra.quota()
    }

    /// The largest lease a stripe takes (`L` in the bound).
    pub fn max_lease(&self) -> u64 {
        self.max_lease
    }

    /// How long a lease stays spendable after its take (`ttl` in the
    /// bound).
    pub fn lease_ttl(&self) -> Duration {
        Duration::from_nanos(self.ttl)
    }

    /// The number of stripes (`S` in the bound).
    pub fn stripes(&self) -> usize {
        self.stripes.len()
    }

    /// The most tokens this limiter admits beyond the exact limiter in any
    /// window of clock readings (module docs, "The bound"):
    /// `ceil((ttl + LEASE_TICK) / T)` always; with ordered readings also
    /// at most `stripes * (max_lease - 1)`, and this returns the smaller.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile_rl::{LeasedLimiter, ManualClock};
    ///
    /// let limiter = LeasedLimiter::builder("1000/s".parse()?)
    ///     .clock(ManualClock::new())
    ///     .max_lease(8)
    ///     .lease_ttl(Duration::from_millis(10))
    ///     .stripes(4)
    ///     .build()?;
    /// // 10.001024 ms at 1 ms a token: 11; four stripes of 7: 28.
    /// assert_eq!(limiter.over_admission_bound(), 11);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn over_admission_bound(&self) -> u64 {
        let life = self.ttl + (1 << TICK_SHIFT);
        let in_time = life.div_ceil(self.interval);
        let in_tokens = (self.stripes.len() as u64).saturating_mul(self.max_lease - 1);
        in_time.min(in_tokens)
    }

    /// The clock this limiter reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// CASes lost by this limiter's checks so far, on the stripes or the
    /// bucket (`crate::__private::lease_races`).
    pub(crate) fn races(&self) -> u64 {
        self.stripes.iter().map(|s| s.races.load(Relaxed)).sum()
    }
}

impl<C: Clock> fmt::Debug for LeasedLimiter<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeasedLimiter")
            .field("gcra", &self.gcra)
            .field("max_lease", &self.max_lease)
            .field("lease_ttl", &self.lease_ttl())
            .field("stripes", &self.stripes.len())
            .field("adaptive", &self.adaptive)
            .field("state", &self.cell.state().unwrap_or(0))
            .finish_non_exhaustive()
    }
}

/// Builds a [`LeasedLimiter`]: `LeasedLimiter::builder(quota)`.
#[derive(Debug)]
pub struct LeasedLimiterBuilder<C = DefaultClock> {
    quota: Quota,
    clock: C,
    max_lease: Option<u64>,
    ttl: Option<Duration>,
    stripes: Option<usize>,
    adaptive: bool,
}

impl<C: Clock> LeasedLimiterBuilder<C> {
    /// Reads time from `clock` (a [`ManualClock`](crate::ManualClock) in tests).
    pub fn clock<C2: Clock>(self, clock: C2) -> LeasedLimiterBuilder<C2> {
        LeasedLimiterBuilder {
            quota: self.quota,
            clock,
            max_lease: self.max_lease,
            ttl: self.ttl,
            stripes: self.stripes,
            adaptive: self.adaptive,
        }
    }

    /// The largest lease a stripe takes in one step (`L`): 1 to the burst,
    /// and at most [`MAX_LEASE`]. 1 makes an exact limiter.
    pub fn max_lease(mut self, tokens: u64) -> Self {
        self.max_lease = Some(tokens);
        self
    }

    /// How long a lease stays spendable after its take: from
    /// [`MIN_LEASE_TTL`] to [`MAX_LEASE_TTL`].
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// The number of stripes (`S`): 1 to [`MAX_STRIPES`], rounded up to a
    /// power of two. Threads beyond it share stripes (and their leases).
    pub fn stripes(mut self, stripes: usize) -> Self {
        self.stripes = Some(stripes);
        self
    }

    /// Whether leases start at one token and grow only under contention
    /// (the default, exact for one thread) or are always `max_lease`
    /// (the worst case for the bound, which tests use).
    pub fn adaptive(mut self, adaptive: bool) -> Self {
        self.adaptive = adaptive;
        self
    }

    /// The limiter, starting full, or which setting is out of range.
    pub fn build(self) -> Result<LeasedLimiter<C>, LeaseError> {
        let burst = self.quota.burst_size();
        let max_lease = match self.max_lease {
            None => DEFAULT_MAX_LEASE.min(burst),
            Some(0) => return Err(LeaseError::ZeroLease),
            Some(lease) if lease > MAX_LEASE => {
                return Err(LeaseError::LeaseTooLarge {
                    lease,
                    max: MAX_LEASE,
                })
            }
            Some(lease) if lease > burst => {
                return Err(LeaseError::LeaseAboveBurst { lease, burst })
            }
            Some(lease) => lease,
        };
        let ttl = match self.ttl {
            Some(ttl) if ttl < MIN_LEASE_TTL => {
                return Err(LeaseError::TtlTooShort {
                    ttl,
                    min: MIN_LEASE_TTL,
                })
            }
            Some(ttl) if ttl > MAX_LEASE_TTL => {
                return Err(LeaseError::TtlTooLong {
                    ttl,
                    max: MAX_LEASE_TTL,
                })
            }
            Some(ttl) => ttl,
            None => Duration::from_nanos(self.quota.interval_nanos())
                .saturating_mul(u32::try_from(max_lease).unwrap_or(u32::MAX))
                .clamp(DEFAULT_MIN_LEASE_TTL, MAX_LEASE_TTL),
        };
        let stripes = match self.stripes {
            Some(stripes) if stripes == 0 || stripes > MAX_STRIPES => {
                return Err(LeaseError::Stripes {
                    stripes,
                    max: MAX_STRIPES,
                })
            }
            Some(stripes) => stripes.next_power_of_two(),
            None => std::thread::available_parallelism()
                .map_or(1, |cores| cores.get())
                .saturating_mul(2)
                .min(MAX_STRIPES)
                .next_power_of_two(),
        };
        let size = if self.adaptive { 1 } else { max_lease };
        Ok(LeasedLimiter {
            cell: CachePadded::new(Cell::new(0)),
            stripes: (0..stripes)
                .map(|_| CachePadded::new(Stripe::new(size)))
                .collect(),
            mask: stripes - 1,
            gcra: Gcra::new(&self.quota),
            interval: self.quota.interval_nanos(),
            max_lease,
            ttl: saturating_nanos(ttl),
            adaptive: self.adaptive,
            clock: self.clock,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lease size doubles on a lost race up to the most, holds while
    /// races are recent, and halves at each take once none has been lost
    /// for `CALM`, down to a single token.
    #[test]
    fn lease_sizes_grow_on_lost_races_and_fall_back_when_calm() {
        let stripe = Stripe::new(1);
        let calm = CALM_NANOS;
        let sizes: Vec<u64> = [
            (true, 10),
            (true, 11),
            (true, 12),
            (true, 13),
            (true, 14),
            (false, 15),
            (false, 14 + calm - 1),
            (false, 14 + calm),
            (false, 14 + calm),
            (true, 20 + calm),
            (false, 21 + calm),
        ]
        .into_iter()
        .map(|(lost, now)| {
            stripe.adapt(lost, now, 12);
            stripe.size.load(Relaxed)
        })
        .collect();
        assert_eq!(sizes, [2, 4, 8, 12, 12, 12, 12, 6, 3, 6, 6]);
        for _ in 0..5 {
            stripe.adapt(false, 30 * calm, 12);
        }
        assert_eq!(stripe.size.load(Relaxed), 1);
        // A reading behind the last loss (another core's) is not calm.
        stripe.adapt(true, 40 * calm, 12);
        stripe.adapt(false, 39 * calm, 12);
        assert_eq!(stripe.size.load(Relaxed), 2);
    }

    /// A lease word round-trips, is spendable only within its life, and
    /// an install merges, keeps the larger, or replaces as documented.
    #[test]
    fn leases_live_from_their_tick_for_their_ttl() {
        let lease = Lease::new(MAX_LEASE - 1, TICK_MASK);
        assert_eq!((lease.tokens(), lease.tick()), (MAX_LEASE - 1, TICK_MASK));
        let lease = Lease::new(5, 3);
        let ttl = 10_000;
        assert_eq!(lease.spendable(3 << TICK_SHIFT, ttl), 5);
        assert_eq!(
            lease.spendable((3 << TICK_SHIFT) - 1, ttl),
            0,
            "before its tick"
        );
        assert_eq!(lease.spendable((3 << TICK_SHIFT) + ttl - 1, ttl), 5);
        assert_eq!(lease.spendable((3 << TICK_SHIFT) + ttl, ttl), 0, "expired");
        assert_eq!(tick_of(u64::MAX), None);
        assert_eq!(tick_of((1 << 58) - 1), Some(TICK_MASK));

        let stripe = Stripe::new(1);
        let now = 3 << TICK_SHIFT;
        stripe.install(4, 3, now, ttl, 7);
        stripe.install(5, 3, now, ttl, 7);
        assert_eq!(
            Lease(stripe.lease.load(Ordering::Relaxed)),
            Lease::new(7, 3)
        );
        let later = now + (1 << TICK_SHIFT);
        stripe.install(2, 4, later, ttl, 7);
        assert_eq!(
            Lease(stripe.lease.load(Ordering::Relaxed)),
            Lease::new(7, 3)
        );
        assert_eq!(stripe.spend(later, ttl, 6), Some(1));
        stripe.install(2, 4, later, ttl, 7);
        assert_eq!(
            Lease(stripe.lease.load(Ordering::Relaxed)),
            Lease::new(2, 4)
        );
        stripe.install(3, 30, 30 << TICK_SHIFT, ttl, 7);
        assert_eq!(
            Lease(stripe.lease.load(Ordering::Relaxed)),
            Lease::new(3, 30)
        );
    }
}
