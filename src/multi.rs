//! Several limits on the same requests, all or nothing: [`MultiLimiter`]
//! (one bucket per limit) and [`KeyedMultiLimiter`] (one per limit and key).
//!
//! # How a check is atomic: charge, then roll back
//!
//! The limits live in separate cells, one word each, so no single CAS
//! covers them. A check of cost `n` charges them in order, each with its
//! own ordinary check (one CAS). If limit `i` denies, the charges already
//! made on limits `0..i` are rolled back with a refund of `n`
//! (`TAT := max(TAT - n*T, now)`, one CAS each) and the request is denied:
//! no limit keeps a token of a denied request. When all admit, the request
//! is admitted.
//!
//! **Claim.** While the clock does not move during a check (a frozen clock,
//! or checks that do not overlap in time), the requests a limit admits for
//! good (charged and never rolled back) are exactly a sequence that the
//! limit alone would admit: no interleaving admits more than any single
//! limit allows.
//!
//! **Proof sketch** (one limit, one instant `t`). GCRA's TAT after a run of
//! charges is `max(TAT, t) + sum(n*T)`, a sum of the charges' costs laid end
//! to end after `max(TAT, t)`. At one instant the order of the terms does
//! not matter, and a charge still outstanding at `t` contributes exactly
//! `n*T` to the TAT, so the TAT is always at least `t` plus the cost of
//! every outstanding charge. Subtracting `n*T` for a charge being rolled
//! back therefore leaves the TAT at `t` plus the costs of the others: the
//! TAT the limit would hold had that charge never been made. Each charge
//! admitted for good was admitted against a TAT at least as large as the
//! one without the rolled-back charges, so the limit alone, seeing only the
//! charges admitted for good, admits each of them too. The stress test and
//! the loom model in `loom-tests/` check this with four threads and every
//! interleaving of two.
//!
//! **When time moves during a check, the claim is not proven.** Removing a
//! rolled-back charge shifts every later charge back by its cost, but a
//! later charge that read a later time would, without the rolled-back
//! one, have started at its own arrival instead. The interleaving found:
//! two checks charge the first limit at `t`, the first is rolled back
//! (exact), a third check reading `t + d` charges on top of the second,
//! then the second is rolled back: the limit is left with `d` more
//! headroom (`d / T` of a token) than the admitted requests allow. `d` is
//! at most the time between the second check's clock reading and its
//! rollback (nanoseconds to microseconds on a real clock, against emission
//! intervals of milliseconds and more), so each such race can admit a
//! small fraction of a token early, and only when a request races two
//! denied ones on the same key. The Redis multi-limit check has
//! no such gap: one script decides every limit at once. The other way,
//! a check that meets a charge about to be rolled back may be denied where
//! a one-word scheme would have admitted it: conservative, and only while
//! another request is between its charge and its rollback.
//!
//! # The binding limit
//!
//! The [`MultiDecision`] names the limit that decided: on a denial the one
//! with the longest `retry_after` (the denying limit, and any other that
//! would deny too, by a peek after the rollback); on an admission the one
//! with the fewest tokens `remaining`.

use std::borrow::Borrow;
use std::hash::Hash;

use crate::clock::{Clock, DefaultClock};
use crate::error::CostError;
use crate::{Decision, DirectLimiter, KeyedLimiter, Quotas};

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
    /// use turnstile::MultiLimiter;
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

/// Charge-then-roll-back over `count` limits, see the module docs.
fn check_all(
    count: usize,
    charge: impl Fn(usize) -> Decision,
    roll_back: impl Fn(usize),
    peek: impl Fn(usize) -> Decision,
) -> MultiDecision {
    let mut tightest: Option<MultiDecision> = None;
    for i in 0..count {
        let decision = charge(i);
        if decision.is_denied() {
            (0..i).for_each(&roll_back);
            return longest_wait(count, i, decision, peek);
        }
        if tightest.is_none_or(|t| decision.remaining() < t.decision.remaining()) {
            tightest = Some(MultiDecision {
                decision,
                binding: i,
            });
        }
    }
    // `count >= 1` (Quotas is never empty), so `tightest` is set; the
    // fallback only keeps this total.
    tightest.unwrap_or_else(|| MultiDecision {
        decision: peek(0),
        binding: 0,
    })
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

/// Rejects a cost that some limit can never admit.
fn check_cost(quotas: &Quotas, n: u64) -> Result<(), CostError> {
    match n {
        0 => Err(CostError::Zero),
        n if n > quotas.min_burst() => Err(CostError::ExceedsBurst {
            cost: n,
            burst: quotas.min_burst(),
        }),
        _ => Ok(()),
    }
}

/// Several limits on one shared bucket each (a whole service): a request
/// passes only if every limit admits it, and a denied request takes
/// nothing from any limit.
///
/// ```
/// use turnstile::{ManualClock, MultiLimiter};
///
/// let limiter = MultiLimiter::with_clock("10/s burst 20; 25/h".parse()?, ManualClock::new());
/// let admitted = (0..30).filter(|_| limiter.check().is_allowed()).count();
/// assert_eq!(admitted, 20, "the burst of the first limit binds");
/// let d = limiter.check();
/// assert_eq!(d.binding(), 0, "the first limit denies, the second would admit");
/// assert_eq!(limiter.limits()[1].peek().remaining(), 4, "and kept no denied token");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct MultiLimiter<C: Clock = DefaultClock> {
    quotas: Quotas,
    limits: Vec<DirectLimiter<C>>,
}

impl MultiLimiter {
    /// The limiter for `quotas` on the default clock.
    pub fn new(quotas: Quotas) -> Self {
        Self::with_clock(quotas, DefaultClock::new())
    }
}

impl<C: Clock + Clone> MultiLimiter<C> {
    /// The limiter for `quotas`, every limit reading `clock`.
    pub fn with_clock(quotas: Quotas, clock: C) -> Self {
        let limits = quotas
            .as_slice()
            .iter()
            .map(|quota| DirectLimiter::with_clock(*quota, clock.clone()))
            .collect();
        MultiLimiter { quotas, limits }
    }
}

impl<C: Clock> MultiLimiter<C> {
    /// Decides one request of cost 1 against every limit.
    ///
    /// ```
    /// use turnstile::MultiLimiter;
    ///
    /// let limiter = MultiLimiter::new("1/s; 100/h".parse()?);
    /// assert!(limiter.check().is_allowed());
    /// assert!(limiter.check().is_denied());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check(&self) -> MultiDecision {
        self.decide(1)
    }

    /// Decides one request of cost `n`: all limits admit all `n` tokens, or
    /// none is charged. An error, not a denial, when `n` is 0 or above the
    /// smallest burst.
    ///
    /// ```
    /// use turnstile::{CostError, MultiLimiter};
    ///
    /// let limiter = MultiLimiter::new("10/s burst 20; 1000/h".parse()?);
    /// assert_eq!(limiter.check_n(5).unwrap().decision().remaining(), 15);
    /// assert_eq!(
    ///     limiter.check_n(21),
    ///     Err(CostError::ExceedsBurst { cost: 21, burst: 20 })
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_n(&self, n: u64) -> Result<MultiDecision, CostError> {
        check_cost(&self.quotas, n)?;
        Ok(self.decide(n))
    }

    /// The decision a check of cost `n` would get now, taking nothing.
    ///
    /// ```
    /// use turnstile::MultiLimiter;
    ///
    /// let limiter = MultiLimiter::new("5/s; 100/h".parse()?);
    /// assert_eq!(limiter.peek_n(1)?.decision().remaining(), 4);
    /// assert_eq!(limiter.peek_n(1)?.binding(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peek_n(&self, n: u64) -> Result<MultiDecision, CostError> {
        check_cost(&self.quotas, n)?;
        Ok(peek_all(self.limits.len(), |i| self.peek_one(i, n)))
    }

    /// Gives `n` tokens back to every limit (see [`DirectLimiter::refund`]).
    /// Returns whether any limit took some back.
    ///
    /// ```
    /// use turnstile::MultiLimiter;
    ///
    /// let limiter = MultiLimiter::new("5/s; 100/h".parse()?);
    /// let _ = limiter.check_n(2)?;
    /// assert!(limiter.refund(2)?);
    /// assert_eq!(limiter.peek_n(1)?.decision().remaining(), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn refund(&self, n: u64) -> Result<bool, CostError> {
        check_cost(&self.quotas, n)?;
        Ok(self
            .limits
            .iter()
            .fold(false, |any, limit| limit.refund(n).unwrap_or(false) | any))
    }

    /// Fills every limit's bucket again. Returns whether any was in use.
    ///
    /// ```
    /// use turnstile::MultiLimiter;
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

    /// The quotas, in order.
    pub fn quotas(&self) -> &Quotas {
        &self.quotas
    }

    /// One limiter per quota, in order (to peek at each one).
    pub fn limits(&self) -> &[DirectLimiter<C>] {
        &self.limits
    }

    fn decide(&self, n: u64) -> MultiDecision {
        check_all(
            self.limits.len(),
            // The cost was checked against the smallest burst: never an error.
            |i| {
                self.limits[i]
                    .check_n(n)
                    .unwrap_or_else(|_| self.peek_one(i, n))
            },
            |i| {
                let _ = self.limits[i].refund(n);
            },
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
/// use turnstile::{KeyedMultiLimiter, ManualClock};
///
/// let limiter = KeyedMultiLimiter::<String, _>::with_clock(
///     "10/s burst 20; 1000/h".parse()?,
///     ManualClock::new(),
/// );
/// let d = limiter.check("alice");
/// assert!(d.is_allowed());
/// assert_eq!((d.binding(), d.decision().remaining()), (0, 19));
/// assert!(limiter.peek("bob").is_allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct KeyedMultiLimiter<K, C: Clock = DefaultClock> {
    quotas: Quotas,
    limits: Vec<KeyedLimiter<K, C>>,
}

impl<K> KeyedMultiLimiter<K>
where
    K: Hash + Eq + Send + Sync + 'static,
{
    /// The limiter for `quotas` per key on the default clock.
    pub fn new(quotas: Quotas) -> Self {
        Self::with_clock(quotas, DefaultClock::new())
    }
}

impl<K, C> KeyedMultiLimiter<K, C>
where
    K: Hash + Eq + Send + Sync + 'static,
    C: Clock + Clone,
{
    /// The limiter for `quotas` per key, every limit reading `clock`.
    pub fn with_clock(quotas: Quotas, clock: C) -> Self {
        let limits = quotas
            .as_slice()
            .iter()
            .map(|quota| KeyedLimiter::builder(*quota).clock(clock.clone()).build())
            .collect();
        KeyedMultiLimiter { quotas, limits }
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
        self.decide(key, 1)
    }

    /// Decides one request of cost `n` for `key`: every limit admits all
    /// `n` tokens, or none is charged. An error, not a denial, when `n` is 0
    /// or above the smallest burst.
    ///
    /// ```
    /// use turnstile::KeyedMultiLimiter;
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
        check_cost(&self.quotas, n)?;
        Ok(self.decide(key, n))
    }

    /// The decision a check of cost 1 for `key` would get now, taking
    /// nothing and inserting nothing.
    ///
    /// ```
    /// use turnstile::KeyedMultiLimiter;
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
    /// use turnstile::KeyedMultiLimiter;
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
        check_cost(&self.quotas, n)?;
        Ok(peek_all(self.limits.len(), |i| self.peek_one(i, key, n)))
    }

    /// Gives `n` tokens of `key` back to every limit (see
    /// [`KeyedLimiter::refund`]). Returns whether any limit took some back.
    ///
    /// ```
    /// use turnstile::KeyedMultiLimiter;
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
        check_cost(&self.quotas, n)?;
        Ok(self.limits.iter().fold(false, |any, limit| {
            limit.refund(key, n).unwrap_or(false) | any
        }))
    }

    /// Forgets `key` in every limit. Returns whether any tracked it.
    ///
    /// ```
    /// use turnstile::KeyedMultiLimiter;
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
    /// use turnstile::KeyedMultiLimiter;
    ///
    /// let limiter = KeyedMultiLimiter::<u64>::new("10/s; 5/min".parse()?);
    /// let _ = limiter.check(&1);
    /// assert_eq!(limiter.clear(), 2, "one bucket in each of two limits");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn clear(&self) -> usize {
        self.limits.iter().map(KeyedLimiter::clear).sum()
    }

    /// The quotas, in order.
    pub fn quotas(&self) -> &Quotas {
        &self.quotas
    }

    /// One keyed limiter per quota, in order (to peek at each, or read its
    /// [`stats`](KeyedLimiter::stats)).
    pub fn limits(&self) -> &[KeyedLimiter<K, C>] {
        &self.limits
    }

    fn decide<Q>(&self, key: &Q, n: u64) -> MultiDecision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        check_all(
            self.limits.len(),
            // The cost was checked against the smallest burst: never an error.
            |i| {
                self.limits[i]
                    .check_n(key, n)
                    .unwrap_or_else(|_| self.peek_one(i, key, n))
            },
            |i| {
                let _ = self.limits[i].refund(key, n);
            },
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
