//! Several limits on the same requests, all or nothing: [`MultiLimiter`]
//! (one bucket per limit) and [`KeyedMultiLimiter`] (one per limit and key).
//!
//! # How a check is atomic: charge, then roll back
//!
//! The limits live in separate cells, one word each, so no single CAS
//! covers them. A check of cost `n` charges them in order, each with its
//! own ordinary check (one CAS, at its own clock reading `t`). If limit `i`
//! denies, the charges already made on limits `0..i` are rolled back and
//! the request is denied; when all admit, the request is admitted.
//!
//! The rollback of one charge is one CAS loop on the bucket the charge
//! landed on, if that bucket still exists (see "Which bucket" below): with
//! `c` the state it finds and `t_r` a clock reading taken after loading
//! `c`,
//!
//! ```text
//! TAT := min(c, c - n*T + (t_r - t))
//! ```
//!
//! A plain refund (`c - n*T`) on a frozen clock; on a moving clock it gives
//! back `n*T` less the time the check took, and never more than `n*T`.
//!
//! **Claim.** The requests a limit admits for good (charged and never
//! rolled back) are a sequence that the limit alone would admit, fed those
//! requests and its resets in the order they landed, at their own
//! readings: no interleaving admits more than any single limit allows.
//!
//! **Assumption.** The clock is monotonic across threads: a reading taken
//! after another (in real time) is not smaller. A thread that reads the
//! clock and then stores a state, and a thread that loads that state and
//! then reads the clock, see the readings in that order. A clock whose
//! threads disagree by up to `δ` loosens the claim by `δ/T` of a token per
//! rollback, as it loosens a single limit's decisions (see [`clock`]).
//!
//! [`clock`]: crate::clock
//!
//! **Proof.** One limit, emission interval `T`. An admission of cost `m`
//! at reading `u` maps the state `x` to `a(x) = max(x, u) + m*T`: monotone
//! (a larger state stays larger) and growing by at least `m*T`. A
//! composition of such maps is `h(x) = max(x + S, G)` where `S` is the sum
//! of their `m*T` and `G = max_j(u_j + S_j)`, `S_j` the costs from map `j`
//! on.
//!
//! Call *ideal* the state of a bucket that saw only the charges still in
//! it (made on it and not rolled back yet), each at its reading, in the
//! order they landed. The invariant, for each bucket: the real state is at
//! least the ideal one (compared as buckets at the present instant, where
//! every state at or before now is the same full bucket).
//!
//! - A bucket starts full, real and ideal alike. A reset (or a removal of
//!   any kind) ends a bucket; the limit's next bucket is a new one, and no
//!   rollback of a charge made on an earlier bucket ever reaches it (see
//!   "Which bucket").
//! - An admission applies the same monotone map to both: kept.
//! - A rollback of a charge `X` (cost `n`, reading `t`) finds `c`. Let
//!   `J_p` be the ideal state just before `X`'s place, and `h` the
//!   composition of the charges after it (sum `S`, term `G`). The ideal
//!   with `X` is `J = h(max(J_p, t) + n*T)`, without it `J' = h(J_p) =
//!   max(J_p + S, G)`. By the invariant `c >= J`, so
//!   - `J_p + S <= J - n*T <= c - n*T` (as `h(x) >= x + S`);
//!   - every charge after `X` in `c` read the clock before its store, so
//!     before our load of `c`, so `u_j <= t_r` and `G <= t_r + S`; and
//!     `J >= t + n*T + S`, so `S <= c - t - n*T`, hence
//!     `G <= c - n*T + (t_r - t)`;
//!   - and `J' <= J <= c` (`h` is monotone).
//!
//!   So `J' <= min(c, c - n*T + (t_r - t))`, the state written: kept.
//!   (If instead `c < J`, the invariant says both are at or before `t_r`,
//!   and so is `J' <= J`: any state written is at least that full
//!   bucket.)
//! - A rollback that does nothing on a bucket that still exists (see
//!   "Which bucket" for when) leaves its charge in both: the request counts
//!   as admitted for good by this limit, which only makes it stricter.
//!
//! At the end the real state is at least the ideal state of the charges
//! admitted for good. Each of them was admitted against a real state at
//! least the ideal one of the charges in the cell then, which is at least
//! the ideal one of those that stayed (fewer charges, monotone maps); the
//! limit alone, deciding on that smaller state at the same reading and
//! cost, admits it too. ∎
//!
//! The rule uses only `c`, `t` and `t_r`, deliberately. A rollback that
//! restores the state its charge replaced when it finds the state its
//! charge wrote (the "nobody built on it" case) is not safe: another
//! rollback below it and an admission at a later reading can bring the
//! state back to that value (ABA), and restoring then admits up to
//! `(t_r - t)/T` of a token too much. Bounding `S` by `c - TAT1` (`TAT1`
//! the state the charge wrote) fails the same way once a charge below `X`
//! is rolled back first. The unit tests hold both counterexamples.
//!
//! **What it costs.** When the real state was exact, the state written
//! exceeds `J'` by at most `t_r - t`: a denied check keeps at most the
//! time it took itself, `(t_r - t)/T` of a token (nanoseconds to
//! microseconds, against intervals of milliseconds and more), and only
//! while the limit holds a backlog (a bucket that was full at `t` is
//! exact). On a frozen clock `t_r = t` and the rollback is exact. The
//! other way, a check that meets a charge about to be rolled back may be
//! denied where a one-word scheme would have admitted it: conservative,
//! and only while another request is between its charge and its
//! rollback. The Redis multi-limit check has neither: one script decides
//! every limit at once.
//!
//! The stress tests (a frozen clock with exact counts, and a moving clock
//! that checks every limit's bound and that rollbacks raced), the model
//! test of the rule in this file, and the loom models in `loom-tests/`
//! check this.
//!
//! # Which bucket
//!
//! A rollback takes its charge out of the bucket the charge landed on, and
//! once that bucket is gone it does nothing. The rule above knows only the
//! state it finds: applied to a bucket that never held the charge, it
//! hands out tokens that were never taken. So with a check held between
//! its charge of limit 0 (burst 2) and its denial by limit 1 while another
//! thread resets the key and is admitted once, applying the rollback to
//! whatever held the key gave limit 0 three admissions since the reset
//! (the unit tests below replay it).
//!
//! - **Keyed.** A bucket is the slot its charge landed on. The check keeps
//!   each limit's map pinned until it ends, so that slot is neither freed
//!   nor reused meanwhile, and a slot that has died never lives again: a
//!   rollback's CAS on it lands only while it holds the same bucket. A dead
//!   slot (reset, cleared, evicted idle or to make room) means the bucket
//!   is gone, and the rollback does nothing. A frozen slot means that a
//!   migration is moving the bucket to a successor table; the rollback
//!   does nothing there either, because the map cannot tell the copy from
//!   a new bucket of the same key (the copy reset, the key inserted
//!   again), and lowering the wrong one admits too much. That costs the
//!   denied check `n` tokens of that one limit, given back at the limit's
//!   rate, and only when a migration freezes that very bucket within one
//!   check (each bucket is frozen once per migration): never an admission
//!   too many.
//! - **Direct.** The one cell holds a new bucket after each reset. A word
//!   beside it counts resets and the rollbacks in flight
//!   (`crate::resets`): a rollback acts only if no reset has begun since
//!   its charge, and a reset waits for the rollbacks already under way to
//!   land before it writes. A charge that a reset overlaps is never rolled
//!   back, at the same cost as above, and only while a reset runs.
//!
//! # The binding limit
//!
//! The [`MultiDecision`] names the limit that decided: on a denial the one
//! with the longest `retry_after` (the denying limit, and any other that
//! would deny too, by a peek after the rollback); on an admission the one
//! with the fewest tokens `remaining`.

// Each limit's charge and rollback.
pub(crate) mod charge;

use std::borrow::Borrow;
use std::cell::OnceCell;
use std::hash::Hash;

use std::marker::PhantomData;

use crate::algorithms::{Algorithm, Gcra};
use crate::clock::{Clock, DefaultClock};
use crate::decision::Decision;
use crate::direct::DirectLimiter;
use crate::error::{CostError, QuotasError};
use crate::keyed::{KeyedLimiter, OverflowPolicy, DEFAULT_MAX_KEYS};
use crate::map::Pinned;
use crate::quota::Quota;
use crate::quotas::{Quotas, MAX_LIMITS};
use crate::stats::Stats;

/// The answer to a check against several limits: the [`Decision`] of the
/// binding limit, and which limit that is.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[must_use = "a MultiDecision says whether the request may pass"]
pub struct MultiDecision {
    decision: Decision,
    binding: usize,
}

impl MultiDecision {
    /// The binding limit's decision: allowed only if every limit admitted.
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// The binding limit's position in the [`Quotas`] list: on a denial the
    /// one with the longest wait, on an admission the one with the fewest
    /// tokens left.
    ///
    /// ```
    /// use turnstile_rl::MultiLimiter;
    ///
    /// let limiter = MultiLimiter::new("10/s burst 20; 5/min".parse()?);
    /// let d = limiter.check();
    /// assert_eq!((d.binding(), d.decision().remaining()), (1, 4));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn binding(&self) -> usize {
        self.binding
    }

    /// Whether the request may pass (every limit admitted it).
    pub fn is_allowed(&self) -> bool {
        self.decision.is_allowed()
    }

    /// Whether the request was refused (by at least one limit).
    pub fn is_denied(&self) -> bool {
        self.decision.is_denied()
    }
}

/// A single limit's decision as the answer of a list of one limit (the
/// binding limit is limit 0): how one-limit limiters answer the HTTP
/// layer's `Limiter` trait, which speaks in [`MultiDecision`]s.
impl From<Decision> for MultiDecision {
    fn from(decision: Decision) -> Self {
        MultiDecision {
            decision,
            binding: 0,
        }
    }
}

/// Charge-then-roll-back over `count` limits, see the module docs.
///
/// Each limit's quota is read once, by `quota(i)` right before its charge,
/// and that one reading decides the charge and its rollback (a check that
/// races `set_quotas` may see some limits changed and not yet the others,
/// each whole). A charge `R` is what its rollback needs besides the quota:
/// the admission and the bucket it landed on. `roll_back` returns whether
/// the limit's state had moved since the charge (counted for the tests,
/// which assert that the race happened).
///
/// The last limit is decided by `decide`, the single check, not charged:
/// no limit after it can deny, so its admission is never rolled back. With
/// one limit, the whole check is a single check. (Charging every limit, and
/// reading all eight quotas up front, made the one-limit check 1.6 times
/// slower than a single check: the charge record went through the stack and
/// was read back wider than it was written, a failed store forwarding on
/// every check; see BENCHMARKS.md.)
fn check_all<R: Copy>(
    count: usize,
    quota: impl Fn(usize) -> Gcra,
    charge: impl Fn(usize, &Gcra) -> (Decision, Option<R>),
    decide: impl Fn(usize, &Gcra) -> Decision,
    roll_back: impl Fn(usize, &Gcra, &R) -> bool,
    peek: impl Fn(usize) -> Decision,
) -> MultiDecision {
    let mut charges: [Option<(R, Gcra)>; MAX_LIMITS] = [None; MAX_LIMITS];
    let mut tightest: Option<MultiDecision> = None;
    // `count >= 1`: Quotas is never empty.
    let last = count.saturating_sub(1);
    for i in 0..count {
        let gcra = quota(i);
        let decision = if i < last {
            let (decision, charged) = charge(i, &gcra);
            if let (Some(slot), Some(charged)) = (charges.get_mut(i), charged) {
                *slot = Some((charged, gcra));
            }
            decision
        } else {
            decide(i, &gcra)
        };
        if decision.is_denied() {
            for (j, charged) in charges.iter().enumerate().take(i) {
                if let Some((charged, gcra)) = charged {
                    if roll_back(j, gcra, charged) {
                        count_raced_rollback();
                    }
                }
            }
            return longest_wait(count, i, decision, peek);
        }
        #[cfg(test)]
        tests::between_charges();
        if tightest.is_none_or(|t| decision.remaining() < t.decision.remaining()) {
            tightest = Some(MultiDecision {
                decision,
                binding: i,
            });
        }
    }
    // `count >= 1`, so `tightest` is set; the fallback only keeps this
    // total.
    tightest.unwrap_or_else(|| MultiDecision {
        decision: peek(0),
        binding: 0,
    })
}

#[inline]
fn count_raced_rollback() {
    charge::RACES.moved.add();
    probe!(MULTI_ROLLBACK_RACED);
}

/// The denial with the longest wait among limit `denier`'s and the peeks
/// of the others.
fn longest_wait(
    count: usize,
    denier: usize,
    decision: Decision,
    peek: impl Fn(usize) -> Decision,
) -> MultiDecision {
    let mut binding = MultiDecision {
        decision,
        binding: denier,
    };
    for j in (0..count).filter(|&j| j != denier) {
        let other = peek(j);
        if other.is_denied() && other.retry_after() > binding.decision.retry_after() {
            binding = MultiDecision {
                decision: other,
                binding: j,
            };
        }
    }
    binding
}

/// The binding decision among every limit's (a peek, or one script call
/// that decided all limits at once).
pub(crate) fn peek_all(count: usize, peek: impl Fn(usize) -> Decision) -> MultiDecision {
    let decisions: Vec<Decision> = (0..count).map(&peek).collect();
    match decisions.iter().position(Decision::is_denied) {
        Some(denier) => longest_wait(count, denier, decisions[denier], |j| decisions[j]),
        None => {
            let (binding, decision) = decisions
                .iter()
                .enumerate()
                .min_by_key(|(_, d)| d.remaining())
                .map(|(i, d)| (i, *d))
                .unwrap_or((0, decisions[0]));
            MultiDecision { decision, binding }
        }
    }
}

/// Each limit's quota, read once for a whole `check_n` (its cost is checked
/// against them all, then its charges and rollbacks use them), `peek_n` or
/// `refund`. A `check` of cost 1 reads each quota as it charges that limit
/// instead (`check_all`).
type Snapshot = [Gcra; MAX_LIMITS];

/// What a multi-limiter needs of each of its limits to read, change and
/// count its quota: the direct and the keyed limiter alike.
trait Limit {
    fn gcra(&self) -> Gcra;
    fn set(&self, quota: Quota);
    fn version(&self) -> u64;
}

impl<C: Clock> Limit for DirectLimiter<C> {
    fn gcra(&self) -> Gcra {
        self.algorithm()
    }
    fn set(&self, quota: Quota) {
        self.set_quota(quota);
    }
    fn version(&self) -> u64 {
        self.quota_version()
    }
}

impl<K: Hash + Eq + Send + Sync + 'static, C: Clock> Limit for KeyedLimiter<K, C> {
    fn gcra(&self) -> Gcra {
        self.algorithm()
    }
    fn set(&self, quota: Quota) {
        self.set_quota(quota);
    }
    fn version(&self) -> u64 {
        self.quota_version()
    }
}

/// Reads the quota of each of `limits` (`1 ..= MAX_LIMITS` of them).
fn snapshot(limits: &[impl Limit]) -> Snapshot {
    let first = limits[0].gcra();
    std::array::from_fn(|i| match limits.get(i) {
        Some(limit) if i > 0 => limit.gcra(),
        _ => first,
    })
}

/// Gives each of `limits` its quota of `quotas`, in order; an error,
/// changing nothing, for another number of quotas.
fn set_each(limits: &[impl Limit], quotas: &Quotas) -> Result<(), QuotasError> {
    if quotas.len() != limits.len() {
        return Err(QuotasError::CountChanged {
            limits: limits.len(),
            given: quotas.len(),
        });
    }
    for (limit, quota) in limits.iter().zip(quotas.as_slice()) {
        limit.set(*quota);
    }
    Ok(())
}

/// The quotas of `limits` now (each as its bucket: [`Gcra::quota`]).
fn quotas_now(limits: &[impl Limit]) -> Quotas {
    Quotas::new(snapshot(limits)[..limits.len()].iter().map(Gcra::quota))
        .expect("a multi-limiter has 1 ..= MAX_LIMITS limits")
}

/// A number that moves whenever a quota of `limits` changes.
fn version_of(limits: &[impl Limit]) -> u64 {
    limits.iter().map(Limit::version).sum()
}

/// Rejects a cost that some limit of `gcras` can never admit, naming the
/// smallest burst.
fn check_cost(gcras: &[Gcra], n: u64) -> Result<(), CostError> {
    match gcras
        .iter()
        .map(|gcra| gcra.check_cost(n))
        .find(Result::is_err)
    {
        Some(Err(CostError::ExceedsCapacity { cost, .. })) => Err(CostError::ExceedsCapacity {
            cost,
            capacity: gcras
                .iter()
                .map(|g| g.quota().burst_size())
                .min()
                .unwrap_or(0),
        }),
        Some(error) => error,
        None => Ok(()),
    }
}

/// Several limits on one shared bucket each (a whole service): a request
/// passes only if every limit admits it, and a denied request takes
/// nothing from any limit.
///
/// ```
/// use turnstile_rl::{ManualClock, MultiLimiter};
///
/// let limiter = MultiLimiter::builder("10/s burst 20; 25/h".parse()?).clock(ManualClock::new()).build();
/// let admitted = (0..30).filter(|_| limiter.check().is_allowed()).count();
/// assert_eq!(admitted, 20, "the burst of the first limit binds");
/// let d = limiter.check();
/// assert_eq!(d.binding(), 0, "the first limit denies, the second would admit");
/// assert_eq!(limiter.limits()[1].peek().remaining(), 4, "and kept no denied token");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct MultiLimiter<C: Clock = DefaultClock> {
    limits: Vec<DirectLimiter<C>>,
}

impl MultiLimiter {
    /// The limiter for `quotas` on the default clock.
    pub fn new(quotas: Quotas) -> Self {
        Self::builder(quotas).build()
    }

    /// A builder to choose the clock, as [`KeyedMultiLimiter::builder`]
    /// does.
    pub fn builder(quotas: Quotas) -> MultiLimiterBuilder {
        MultiLimiterBuilder {
            quotas,
            clock: DefaultClock::new(),
        }
    }
}

/// Builds a [`MultiLimiter`]: `MultiLimiter::builder(quotas)`. Every limit
/// gets the same clock.
#[derive(Debug)]
pub struct MultiLimiterBuilder<C = DefaultClock> {
    quotas: Quotas,
    clock: C,
}

impl<C: Clock + Clone> MultiLimiterBuilder<C> {
    /// Reads time from `clock` (a [`ManualClock`](crate::ManualClock) in
    /// tests), in every limit.
    pub fn clock<C2: Clock + Clone>(self, clock: C2) -> MultiLimiterBuilder<C2> {
        MultiLimiterBuilder {
            quotas: self.quotas,
            clock,
        }
    }

    /// The limiter.
    pub fn build(self) -> MultiLimiter<C> {
        let limits = self
            .quotas
            .as_slice()
            .iter()
            .map(|quota| {
                DirectLimiter::builder(*quota)
                    .clock(self.clock.clone())
                    .build()
            })
            .collect();
        MultiLimiter { limits }
    }
}

impl<C: Clock> MultiLimiter<C> {
    /// Decides one request of cost 1 against every limit.
    ///
    /// ```
    /// use turnstile_rl::MultiLimiter;
    ///
    /// let limiter = MultiLimiter::new("1/s; 100/h".parse()?);
    /// assert!(limiter.check().is_allowed());
    /// assert!(limiter.check().is_denied());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check(&self) -> MultiDecision {
        // Cost 1 is within every burst.
        // Each limit's quota is read as it is charged.
        self.decide(|i| self.limits[i].gcra(), 1)
    }

    /// Decides one request of cost `n`: all limits admit all `n` tokens, or
    /// none is charged. An error, not a denial, when `n` is 0 or above the
    /// smallest burst.
    ///
    /// ```
    /// use turnstile_rl::{CostError, MultiLimiter};
    ///
    /// let limiter = MultiLimiter::new("10/s burst 20; 1000/h".parse()?);
    /// assert_eq!(limiter.check_n(5).unwrap().decision().remaining(), 15);
    /// assert_eq!(
    ///     limiter.check_n(21),
    ///     Err(CostError::ExceedsCapacity { cost: 21, capacity: 20 })
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_n(&self, n: u64) -> Result<MultiDecision, CostError> {
        // Every quota read up front: the cost is checked against them all.
        let gcras = self.snapshot();
        check_cost(&gcras[..self.limits.len()], n)?;
        Ok(self.decide(|i| gcras[i], n))
    }

    /// The decision a check of cost `n` would get now, taking nothing.
    ///
    /// ```
    /// use turnstile_rl::MultiLimiter;
    ///
    /// let limiter = MultiLimiter::new("5/s; 100/h".parse()?);
    /// assert_eq!(limiter.peek_n(1)?.decision().remaining(), 4);
    /// assert_eq!(limiter.peek_n(1)?.binding(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peek_n(&self, n: u64) -> Result<MultiDecision, CostError> {
        check_cost(&self.snapshot()[..self.limits.len()], n)?;
        Ok(peek_all(self.limits.len(), |i| self.peek_one(i, n)))
    }

    /// Gives `n` tokens back to every limit (see [`DirectLimiter::refund`]).
    /// Returns whether any limit took some back.
    ///
    /// ```
    /// use turnstile_rl::MultiLimiter;
    ///
    /// let limiter = MultiLimiter::new("5/s; 100/h".parse()?);
    /// let _ = limiter.check_n(2)?;
    /// assert!(limiter.refund(2)?);
    /// assert_eq!(limiter.peek_n(1)?.decision().remaining(), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn refund(&self, n: u64) -> Result<bool, CostError> {
        check_cost(&self.snapshot()[..self.limits.len()], n).map_err(CostError::for_refund)?;
        Ok(self
            .limits
            .iter()
            .fold(false, |any, limit| limit.refund(n).unwrap_or(false) | any))
    }

    /// Fills every limit's bucket again. Returns whether any was in use.
    ///
    /// ```
    /// use turnstile_rl::MultiLimiter;
    ///
    /// let limiter = MultiLimiter::new("1/s; 100/h".parse()?);
    /// let _ = limiter.check();
    /// assert!(limiter.reset());
    /// assert!(limiter.check().is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reset(&self) -> bool {
        self.limits
            .iter()
            .fold(false, |any, limit| limit.reset() | any)
    }

    /// Changes every limit's quota while the limiter serves, limit by limit
    /// (each as [`DirectLimiter::set_quota`] does, keeping its bucket). A
    /// check racing the change may see some limits changed and not yet the
    /// others, each of them whole. An error, changing nothing, when
    /// `quotas` has another number of limits than the limiter.
    ///
    /// ```
    /// use turnstile_rl::{MultiLimiter, QuotasError};
    ///
    /// let limiter = MultiLimiter::new("1/s; 100/h".parse()?);
    /// limiter.set_quotas("5/s; 100/h".parse()?)?;
    /// assert_eq!(limiter.check().decision().remaining(), 4);
    /// assert!(matches!(
    ///     limiter.set_quotas("5/s".parse()?),
    ///     Err(QuotasError::CountChanged { limits: 2, given: 1 })
    /// ));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_quotas(&self, quotas: Quotas) -> Result<(), QuotasError> {
        set_each(&self.limits, &quotas)
    }

    /// The quotas enforced now, in order (each as its bucket:
    /// [`Gcra::quota`]).
    pub fn quotas(&self) -> Quotas {
        quotas_now(&self.limits)
    }

    /// A number that moves whenever a limit's quota changes.
    pub fn quota_version(&self) -> u64 {
        version_of(&self.limits)
    }

    /// One limiter per quota, in order (to peek at each one).
    pub fn limits(&self) -> &[DirectLimiter<C>] {
        &self.limits
    }

    fn snapshot(&self) -> Snapshot {
        snapshot(&self.limits)
    }

    fn decide(&self, quota: impl Fn(usize) -> Gcra, n: u64) -> MultiDecision {
        check_all(
            self.limits.len(),
            quota,
            // The cost was checked against every limit's burst.
            |i, gcra| self.limits[i].charge(gcra, n),
            |i, gcra| self.limits[i].decide(gcra, n),
            |i, gcra, &(charge, generation)| self.limits[i].roll_back(gcra, &charge, generation, n),
            |i| self.peek_one(i, n),
        )
    }

    fn peek_one(&self, i: usize, n: u64) -> Decision {
        self.limits[i]
            .peek_n(n)
            .unwrap_or_else(|_| self.limits[i].peek())
    }
}

/// Several limits per key, all or nothing: one [`KeyedLimiter`] per limit.
///
/// ```
/// use turnstile_rl::{KeyedMultiLimiter, ManualClock, OverflowPolicy};
///
/// let limiter = KeyedMultiLimiter::<String, _>::builder("10/s burst 20; 1000/h".parse()?)
///     .clock(ManualClock::new())
///     .max_keys(100_000)
///     .overflow(OverflowPolicy::Deny)
///     .build();
/// let d = limiter.check("alice");
/// assert!(d.is_allowed());
/// assert_eq!((d.binding(), d.decision().remaining()), (0, 19));
/// assert!(limiter.peek("bob").is_allowed());
/// assert_eq!(limiter.stats().keys_held, 2, "alice, in each of two limits");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct KeyedMultiLimiter<K, C: Clock = DefaultClock> {
    limits: Vec<KeyedLimiter<K, C>>,
}

/// Builds a [`KeyedMultiLimiter`]: `KeyedMultiLimiter::builder(quotas)`.
/// Every limit gets the same clock, bound and overflow policy.
#[derive(Debug)]
pub struct KeyedMultiLimiterBuilder<K, C = DefaultClock> {
    quotas: Quotas,
    clock: C,
    max_keys: usize,
    overflow: OverflowPolicy,
    keys: PhantomData<fn() -> K>,
}

impl<K, C> KeyedMultiLimiterBuilder<K, C>
where
    K: Hash + Eq + Send + Sync + 'static,
    C: Clock + Clone,
{
    /// Reads time from `clock` (a [`ManualClock`](crate::ManualClock) in
    /// tests), in every limit.
    pub fn clock<C2: Clock + Clone>(self, clock: C2) -> KeyedMultiLimiterBuilder<K, C2> {
        KeyedMultiLimiterBuilder {
            quotas: self.quotas,
            clock,
            max_keys: self.max_keys,
            overflow: self.overflow,
            keys: PhantomData,
        }
    }

    /// Tracks at most `max_keys` keys at once in each limit (see
    /// [`KeyedLimiterBuilder::max_keys`](crate::KeyedLimiterBuilder::max_keys)).
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// What each limit does with a new key when `max_keys` are tracked
    /// (see [`OverflowPolicy`]). A request one limit refuses for room is
    /// denied and takes nothing from the others.
    pub fn overflow(mut self, policy: OverflowPolicy) -> Self {
        self.overflow = policy;
        self
    }

    /// The limiter.
    pub fn build(self) -> KeyedMultiLimiter<K, C> {
        let limits = self
            .quotas
            .as_slice()
            .iter()
            .map(|quota| {
                KeyedLimiter::builder(*quota)
                    .clock(self.clock.clone())
                    .max_keys(self.max_keys)
                    .overflow(self.overflow)
                    .build()
            })
            .collect();
        KeyedMultiLimiter { limits }
    }
}

impl<K> KeyedMultiLimiter<K>
where
    K: Hash + Eq + Send + Sync + 'static,
{
    /// The limiter for `quotas` per key on the default clock, with
    /// [`DEFAULT_MAX_KEYS`](crate::keyed::DEFAULT_MAX_KEYS) per limit and
    /// [`OverflowPolicy::EvictFullest`].
    pub fn new(quotas: Quotas) -> Self {
        Self::builder(quotas).build()
    }

    /// A builder to choose the clock, the bound and the overflow policy, as
    /// [`KeyedLimiter::builder`] does.
    pub fn builder(quotas: Quotas) -> KeyedMultiLimiterBuilder<K> {
        KeyedMultiLimiterBuilder {
            quotas,
            clock: DefaultClock::new(),
            max_keys: DEFAULT_MAX_KEYS,
            overflow: OverflowPolicy::default(),
            keys: PhantomData,
        }
    }
}

impl<K, C> KeyedMultiLimiter<K, C>
where
    K: Hash + Eq + Send + Sync + 'static,
    C: Clock,
{
    /// Decides one request of cost 1 for `key` against every limit.
    pub fn check<Q>(&self, key: &Q) -> MultiDecision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // Cost 1 is within every burst.
        // Each limit's quota is read as it is charged.
        self.decide(|i| self.limits[i].gcra(), key, 1)
    }

    /// Decides one request of cost `n` for `key`: every limit admits all
    /// `n` tokens, or none is charged. An error, not a denial, when `n` is 0
    /// or above the smallest burst.
    ///
    /// ```
    /// use turnstile_rl::KeyedMultiLimiter;
    ///
    /// let limiter = KeyedMultiLimiter::<u64>::new("10/s; 15/h".parse()?);
    /// assert!(limiter.check_n(&1, 10)?.is_allowed());
    /// let d = limiter.check_n(&1, 10)?;
    /// assert!(d.is_denied());
    /// assert_eq!(d.binding(), 1, "both deny; the hourly limit's wait is longer");
    /// assert!(limiter.check_n(&1, 11).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_n<Q>(&self, key: &Q, n: u64) -> Result<MultiDecision, CostError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // Every quota read up front: the cost is checked against them all.
        let gcras = self.snapshot();
        check_cost(&gcras[..self.limits.len()], n)?;
        Ok(self.decide(|i| gcras[i], key, n))
    }

    /// The decision a check of cost 1 for `key` would get now, taking
    /// nothing and inserting nothing.
    ///
    /// ```
    /// use turnstile_rl::KeyedMultiLimiter;
    ///
    /// let limiter = KeyedMultiLimiter::<String>::new("10/s; 5/min".parse()?);
    /// let d = limiter.peek("alice");
    /// assert_eq!((d.binding(), d.decision().remaining()), (1, 4));
    /// assert!(limiter.limits().iter().all(|l| l.is_empty()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peek<Q>(&self, key: &Q) -> MultiDecision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        peek_all(self.limits.len(), |i| self.limits[i].peek(key))
    }

    /// The decision a check of cost `n` for `key` would get now.
    ///
    /// ```
    /// use turnstile_rl::KeyedMultiLimiter;
    ///
    /// let limiter = KeyedMultiLimiter::<u64>::new("10/s; 15/h".parse()?);
    /// let _ = limiter.check_n(&1, 8)?;
    /// let d = limiter.peek_n(&1, 2)?;
    /// assert_eq!((d.binding(), d.decision().remaining()), (0, 0));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peek_n<Q>(&self, key: &Q, n: u64) -> Result<MultiDecision, CostError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        check_cost(&self.snapshot()[..self.limits.len()], n)?;
        Ok(peek_all(self.limits.len(), |i| self.peek_one(i, key, n)))
    }

    /// Gives `n` tokens of `key` back to every limit (see
    /// [`KeyedLimiter::refund`]). Returns whether any limit took some back.
    ///
    /// ```
    /// use turnstile_rl::KeyedMultiLimiter;
    ///
    /// let limiter = KeyedMultiLimiter::<u64>::new("10/s; 15/h".parse()?);
    /// let _ = limiter.check_n(&1, 10)?;
    /// assert!(limiter.refund(&1, 10)?);
    /// assert!(limiter.check_n(&1, 10)?.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn refund<Q>(&self, key: &Q, n: u64) -> Result<bool, CostError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        check_cost(&self.snapshot()[..self.limits.len()], n).map_err(CostError::for_refund)?;
        Ok(self.limits.iter().fold(false, |any, limit| {
            limit.refund(key, n).unwrap_or(false) | any
        }))
    }

    /// Forgets `key` in every limit. Returns whether any tracked it.
    ///
    /// ```
    /// use turnstile_rl::KeyedMultiLimiter;
    ///
    /// let limiter = KeyedMultiLimiter::<u64>::new("1/s; 15/h".parse()?);
    /// let _ = limiter.check(&1);
    /// assert!(limiter.check(&1).is_denied());
    /// assert!(limiter.reset(&1));
    /// assert!(limiter.check(&1).is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reset<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.limits
            .iter()
            .fold(false, |any, limit| limit.reset(key) | any)
    }

    /// Forgets every key in every limit. Returns how many buckets went.
    ///
    /// ```
    /// use turnstile_rl::KeyedMultiLimiter;
    ///
    /// let limiter = KeyedMultiLimiter::<u64>::new("10/s; 5/min".parse()?);
    /// let _ = limiter.check(&1);
    /// assert_eq!(limiter.clear(), 2, "one bucket in each of two limits");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn clear(&self) -> usize {
        self.limits.iter().map(KeyedLimiter::clear).sum()
    }

    /// Forgets every idle bucket of every limit now (see
    /// [`KeyedLimiter::evict_idle`]). Returns how many went.
    pub fn evict_idle(&self) -> usize {
        self.limits.iter().map(KeyedLimiter::evict_idle).sum()
    }

    /// The limits' gauges and counters added up: `keys_held` counts
    /// buckets (a key tracked by each of two limits counts twice),
    /// `capacity` the slots of every limit's table, `max_keys` the bound of
    /// every limit together; each limit's own figures are in
    /// [`limits`](KeyedMultiLimiter::limits)`()[i].stats()`.
    ///
    /// ```
    /// use turnstile_rl::{KeyedMultiLimiter, OverflowPolicy};
    ///
    /// let limiter = KeyedMultiLimiter::<u64>::builder("10/s; 100/h".parse()?)
    ///     .max_keys(1)
    ///     .overflow(OverflowPolicy::Deny)
    ///     .build();
    /// let _ = limiter.check(&1);
    /// assert!(limiter.check(&2).is_denied(), "no room in the first limit");
    /// let stats = limiter.stats();
    /// assert_eq!((stats.keys_held, stats.max_keys, stats.overflow_refusals), (2, 2, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stats(&self) -> Stats {
        self.limits
            .iter()
            .map(KeyedLimiter::stats)
            .fold(Stats::default(), |sum, one| Stats {
                keys_held: sum.keys_held + one.keys_held,
                capacity: sum.capacity + one.capacity,
                max_keys: sum.max_keys + one.max_keys,
                idle_evictions: sum.idle_evictions + one.idle_evictions,
                overflow_evictions: sum.overflow_evictions + one.overflow_evictions,
                overflow_refusals: sum.overflow_refusals + one.overflow_refusals,
                overflow_untracked: sum.overflow_untracked + one.overflow_untracked,
                resets: sum.resets + one.resets,
                // Process-wide already: the same figure in every limit.
                process_cas_retries: one.process_cas_retries,
            })
    }

    /// Changes every limit's quota while the limiter serves, limit by
    /// limit (each as [`KeyedLimiter::set_quota`] does: every key keeps its
    /// buckets). A check racing the change may see some limits changed and
    /// not yet the others, each of them whole. An error, changing nothing,
    /// when `quotas` has another number of limits than the limiter.
    ///
    /// ```
    /// use turnstile_rl::KeyedMultiLimiter;
    ///
    /// let limiter = KeyedMultiLimiter::<u64>::new("10/s burst 20; 1000/h".parse()?);
    /// let _ = limiter.check_n(&1, 5)?;
    /// limiter.set_quotas("10/s burst 40; 1000/h".parse()?)?;
    /// assert_eq!(limiter.check(&1).decision().remaining(), 34, "40 - 5 spent - 1");
    /// assert!(limiter.set_quotas("10/s".parse()?).is_err(), "two limits, one quota");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_quotas(&self, quotas: Quotas) -> Result<(), QuotasError> {
        set_each(&self.limits, &quotas)
    }

    /// The quotas enforced now, in order (each as its bucket:
    /// [`Gcra::quota`]).
    pub fn quotas(&self) -> Quotas {
        quotas_now(&self.limits)
    }

    /// A number that moves whenever a limit's quota changes.
    pub fn quota_version(&self) -> u64 {
        version_of(&self.limits)
    }

    /// One keyed limiter per quota, in order (to peek at each, or read its
    /// [`stats`](KeyedLimiter::stats)).
    pub fn limits(&self) -> &[KeyedLimiter<K, C>] {
        &self.limits
    }

    fn snapshot(&self) -> Snapshot {
        snapshot(&self.limits)
    }

    fn decide<Q>(&self, quota: impl Fn(usize) -> Gcra, key: &Q, n: u64) -> MultiDecision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // Each limit's map stays pinned from its charge to the end, so the
        // cell a charge landed on is still that bucket's, or dead, when its
        // rollback comes (see "Which bucket" in the module docs).
        let pins: [OnceCell<Pinned<'_, K>>; MAX_LIMITS] = std::array::from_fn(|_| OnceCell::new());
        check_all(
            self.limits.len(),
            quota,
            // The cost was checked against every limit's burst.
            |i, gcra| {
                let map = pins[i].get_or_init(|| self.limits[i].pin());
                self.limits[i].charge(map, gcra, key, n)
            },
            // Pins the last limit's map for its own check only.
            |i, gcra| self.limits[i].decide(key, n, gcra),
            |i, gcra, &(charge, cell)| self.limits[i].roll_back(gcra, cell, &charge, n),
            |i| self.peek_one(i, key, n),
        )
    }

    fn peek_one<Q>(&self, i: usize, key: &Q, n: u64) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.limits[i]
            .peek_n(key, n)
            .unwrap_or_else(|_| self.limits[i].peek(key))
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::algorithms::Gcra;
    use crate::cell::Charge;
    use crate::clock::ManualClock;
    use crate::quota::Quota;

    thread_local! {
        /// What another thread does in the window a check on this thread
        /// holds open between two of its charges: run once, by the next
        /// check to charge a limit here.
        static BETWEEN_CHARGES: RefCell<Option<Box<dyn FnOnce()>>> = RefCell::new(None);
    }

    /// The seam `check_all` calls after each charge (tests only). Taken
    /// before it runs, so the checks it makes do not run it again.
    pub(super) fn between_charges() {
        if let Some(steps) = BETWEEN_CHARGES.with(|b| b.borrow_mut().take()) {
            steps();
        }
    }

    /// Runs `steps` right after the next check on this thread charges its
    /// first limit, before it charges the second.
    fn after_first_charge(steps: impl FnOnce() + 'static) {
        BETWEEN_CHARGES.with(|b| *b.borrow_mut() = Some(Box::new(steps)));
    }

    /// Limit 0 burst 2, limit 1 burst 1, both a token an hour.
    const HELD_ACROSS_RESET: &str = "1/h burst 2; 1/h burst 1";

    /// Issue 21, item 4: a check is held between its charge of limit 0 and
    /// its charge of limit 1 while another resets the key and is admitted
    /// once; the held check is then denied by limit 1 and rolls back. Its
    /// charge went with the bucket the reset forgot: the rollback must take
    /// nothing from the new bucket, which holds only the other's charge. So
    /// limit 0 (burst 2) has exactly one token left.
    #[test]
    fn a_keyed_rollback_held_across_a_reset_takes_nothing_from_the_new_bucket() {
        let keyed = Arc::new(
            KeyedMultiLimiter::<u64, _>::builder(HELD_ACROSS_RESET.parse().unwrap())
                .clock(ManualClock::new())
                .build(),
        );
        let other = keyed.clone();
        after_first_charge(move || {
            assert!(other.reset(&7));
            assert!(other.check(&7).is_allowed());
        });
        assert_eq!(keyed.check(&7).binding(), 1, "denied by limit 1");
        let left = (0..3)
            .filter(|_| keyed.limits()[0].check(&7).is_allowed())
            .count();
        assert_eq!(left, 1, "keyed: limit 0 admits one more since the reset");
    }

    /// The same for a direct limiter, whose one cell outlives a reset: the
    /// bucket a charge went to ends at the next reset of that cell.
    #[test]
    fn a_direct_rollback_held_across_a_reset_takes_nothing_from_the_new_bucket() {
        let direct = Arc::new(
            MultiLimiter::builder(HELD_ACROSS_RESET.parse().unwrap())
                .clock(ManualClock::new())
                .build(),
        );
        let other = direct.clone();
        after_first_charge(move || {
            assert!(other.reset());
            assert!(other.check().is_allowed());
        });
        assert_eq!(direct.check().binding(), 1, "denied by limit 1");
        let left = (0..3)
            .filter(|_| direct.limits()[0].check().is_allowed())
            .count();
        assert_eq!(left, 1, "direct: limit 0 admits one more since the reset");
    }

    /// The interval of the model limit, in nanoseconds.
    const T: u64 = 1_000;

    fn model_gcra() -> Gcra {
        Gcra::new(
            &Quota::with_period(Duration::from_nanos(T))
                .unwrap()
                .burst(64)
                .unwrap(),
        )
    }

    /// A rollback rule: (state found, the charge's reading, the state it
    /// replaced, the state it wrote, rollback reading, cost) -> new state.
    type Rule = fn(u64, u64, u64, u64, u64, u64) -> u64;

    /// The rule this module uses.
    fn ours(c: u64, t: u64, _before: u64, after: u64, t_r: u64, n: u64) -> u64 {
        let charge = Charge { now: t, after };
        model_gcra().rolled_back(c, &charge, t_r, n).unwrap_or(c)
    }

    /// A plain refund at the rollback's reading (the rule before this one).
    fn refund(c: u64, _t: u64, _before: u64, _after: u64, t_r: u64, n: u64) -> u64 {
        c.saturating_sub(n * T).max(t_r).min(c)
    }

    /// Restore the replaced state when the written one is found, else bound
    /// the later admissions by `c - TAT1` (rejected: see the module docs).
    fn restore_or_shift(c: u64, _t: u64, before: u64, after: u64, t_r: u64, n: u64) -> u64 {
        if c == after {
            return before;
        }
        c.min(c.saturating_sub(n * T).max(t_r + c.saturating_sub(after)))
    }

    #[derive(Clone, Copy, Debug)]
    enum Op {
        /// Move the clock on by this much.
        Advance(u64),
        /// A charge of this cost (admitted if the limit admits it).
        Charge(u64),
        /// Roll back the outstanding charge at this position (modulo).
        RollBack(usize),
    }

    /// Runs `ops` on one limit with `rule`, checking after each step that
    /// the real state is at least the ideal one (that of the charges still
    /// in the cell, each at its reading, in landing order), as buckets at
    /// the present instant. Returns the first violation. On a frozen clock
    /// with `exact`, also checks that the two are equal.
    fn run(rule: Rule, ops: &[Op], exact: bool) -> Result<(), String> {
        let gcra = model_gcra();
        let (mut now, mut state) = (0u64, 0u64);
        // (reading, cost, replaced, written), in landing order.
        let mut charges: Vec<(u64, u64, u64, u64)> = Vec::new();
        let mut outstanding: Vec<usize> = Vec::new();
        let mut removed = vec![false; ops.len()];
        for (step, op) in ops.iter().enumerate() {
            match *op {
                Op::Advance(d) => now += d,
                Op::Charge(n) => {
                    if let Some(next) = gcra.check(state, now, n).unwrap().next {
                        outstanding.push(charges.len());
                        charges.push((now, n, state, next));
                        state = next;
                    }
                }
                Op::RollBack(i) if !outstanding.is_empty() => {
                    let k = outstanding.remove(i % outstanding.len());
                    let (t, n, before, after) = charges[k];
                    removed[k] = true;
                    state = rule(state, t, before, after, now, n);
                }
                Op::RollBack(_) => {}
            }
            let ideal = charges
                .iter()
                .enumerate()
                .filter(|(k, _)| !removed[*k])
                .fold(0, |x, (_, &(u, m, _, _))| x.max(u) + m * T);
            let (real, ideal) = (state.max(now), ideal.max(now));
            if real < ideal || (exact && real != ideal) {
                return Err(format!(
                    "after step {step} ({op:?}) at {now}: state {real}, ideal {ideal}"
                ));
            }
        }
        Ok(())
    }

    /// A charge below ours is rolled back first, then an admission at a
    /// later reading lands on the bucket our charge had left.
    const BELOW_FIRST: &[Op] = &[
        Op::Charge(1),   // A at 0
        Op::Charge(1),   // X at 0, on top of A
        Op::RollBack(0), // A rolled back
        Op::Advance(1_500),
        Op::Charge(1),   // B at 1500
        Op::RollBack(0), // X rolled back
    ];

    /// The state comes back to the one our charge wrote (ABA): another
    /// rollback below it, then an admission at a later reading.
    const ABA: &[Op] = &[
        Op::Charge(1), // W at 0, for good
        Op::Advance(800),
        Op::Charge(1),   // A at 800
        Op::Charge(1),   // X at 800
        Op::RollBack(1), // A
        Op::Advance(1_000),
        Op::Charge(1),   // B at 1800: lands on the state X wrote
        Op::RollBack(1), // X finds that state
    ];

    #[test]
    fn the_rollback_survives_the_interleavings_that_break_the_others() {
        for (name, ops) in [("below first", BELOW_FIRST), ("aba", ABA)] {
            assert_eq!(run(ours, ops, false), Ok(()), "{name}");
            assert!(run(refund, ops, false).is_err(), "{name}: refund");
            assert!(
                run(restore_or_shift, ops, false).is_err(),
                "{name}: restore or shift"
            );
        }
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            2 => (0u64..=1_500).prop_map(Op::Advance),
            4 => (1u64..=3).prop_map(Op::Charge),
            3 => (0usize..8).prop_map(Op::RollBack),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 4_000, ..ProptestConfig::default() })]

        /// Any interleaving of charges, rollbacks and clock moves on one
        /// limit leaves it at least as full as the charges still in it.
        #[test]
        fn no_interleaving_leaves_more_room_than_the_charges_kept(
            ops in prop::collection::vec(op(), 1..80),
        ) {
            prop_assert_eq!(run(ours, &ops, false), Ok(()));
        }

        /// On a frozen clock the rollback is exact.
        #[test]
        fn a_frozen_clock_rolls_back_exactly(
            ops in prop::collection::vec(prop_oneof![
                4 => (1u64..=3).prop_map(Op::Charge),
                3 => (0usize..8).prop_map(Op::RollBack),
            ], 1..80),
        ) {
            prop_assert_eq!(run(ours, &ops, true), Ok(()));
        }
    }

    /// Three threads check one key (and one direct limiter) against two
    /// limits while a fourth moves the clock on in small steps: the second
    /// limit (burst 1) denies most checks after the first has charged, so
    /// rollbacks race admissions at later readings. Every limit admits at
    /// most `burst + t/T` over `[0, t]`, and rollbacks did race.
    #[test]
    fn a_moving_clock_never_admits_more_than_any_limit() {
        const THREADS: usize = 3;
        const STEP: u64 = 250;
        let quota = |ns: u64, burst: u64| {
            Quota::with_period(Duration::from_nanos(ns))
                .unwrap()
                .burst(burst)
                .unwrap()
        };
        let raced_before = charge::RACES.moved.sum();
        for (first, second) in [
            (quota(1_000, 4), quota(800, 1)),
            (quota(2_000, 8), quota(1_000, 2)),
        ] {
            for _round in 0..10 {
                let quotas = Quotas::new(vec![first, second]).unwrap();
                let max_cost = quotas.min_burst().min(2);
                let clock = ManualClock::new();
                let direct = MultiLimiter::builder(quotas.clone())
                    .clock(clock.clone())
                    .build();
                let keyed = KeyedMultiLimiter::<u64, _>::builder(quotas.clone())
                    .clock(clock.clone())
                    .build();
                let done = AtomicBool::new(false);
                let admitted: Vec<(u64, u64)> = std::thread::scope(|s| {
                    let ticker = s.spawn(|| {
                        while !done.load(Ordering::Relaxed) {
                            clock.advance(Duration::from_nanos(STEP));
                            for _ in 0..50 {
                                std::hint::spin_loop();
                            }
                        }
                    });
                    let workers: Vec<_> = (0..THREADS)
                        .map(|w| {
                            let (direct, keyed) = (&direct, &keyed);
                            s.spawn(move || {
                                let (mut a, mut b) = (0, 0);
                                for i in 0..20_000u64 {
                                    let n = if (i + w as u64).is_multiple_of(3) {
                                        max_cost
                                    } else {
                                        1
                                    };
                                    if direct.check_n(n).unwrap().is_allowed() {
                                        a += n;
                                    }
                                    if keyed.check_n(&7, n).unwrap().is_allowed() {
                                        b += n;
                                    }
                                }
                                (a, b)
                            })
                        })
                        .collect();
                    let admitted = workers.into_iter().map(|w| w.join().unwrap()).collect();
                    done.store(true, Ordering::Relaxed);
                    ticker.join().unwrap();
                    admitted
                });
                // Every admission read the clock no later than this.
                let elapsed = clock.now();
                let direct_total: u64 = admitted.iter().map(|a| a.0).sum();
                let keyed_total: u64 = admitted.iter().map(|a| a.1).sum();
                for q in [first, second] {
                    let bound = q.burst_size() + elapsed / q.interval_nanos();
                    assert!(
                        direct_total <= bound,
                        "direct: {direct_total} > {bound} ({q:?})"
                    );
                    assert!(
                        keyed_total <= bound,
                        "keyed: {keyed_total} > {bound} ({q:?})"
                    );
                }
            }
        }
        let raced = charge::RACES.moved.sum() - raced_before;
        assert!(raced > 0, "no rollback met a state moved since its charge");
    }
}
