//! `Quotas`: several limits on the same requests, all of which must admit
//! each one (for example `"10/s burst 20; 1000/h"`: short bursts, and a
//! ceiling over the hour).
//!
//! # Text form
//!
//! ```text
//! quotas := quota { ";" quota }         (see `Quota` for one quota; at most MAX_LIMITS)
//! ```

use std::fmt;
use std::str::FromStr;

use crate::error::QuotasError;
use crate::quota::Quota;

/// The most limits one check combines: each is one more cell to charge.
pub const MAX_LIMITS: usize = 8;

/// A non-empty list of at most [`MAX_LIMITS`] quotas, all applied to every
/// request.
///
/// ```
/// use turnstile_rl::{Quota, Quotas, QuotasError};
///
/// let quotas: Quotas = "10/s burst 20; 1000/h".parse()?;
/// assert_eq!(quotas.len(), 2);
/// assert_eq!(quotas.as_slice()[1], Quota::per_hour(1000).unwrap());
/// assert_eq!(quotas.to_string(), "10/s burst 20; 1000/h");
///
/// assert_eq!("".parse::<Quotas>(), Err(QuotasError::Empty));
/// assert!(matches!(
///     "10/s; 5/fortnight".parse::<Quotas>(),
///     Err(QuotasError::Quota { index: 1, .. })
/// ));
/// # Ok::<(), QuotasError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Quotas {
    // Invariant: 1 ..= MAX_LIMITS quotas.
    quotas: Vec<Quota>,
}

impl Quotas {
    /// The list of `quotas`: an error if it is empty or longer than
    /// [`MAX_LIMITS`].
    ///
    /// ```
    /// use turnstile_rl::{Quota, Quotas, QuotasError};
    ///
    /// let quotas = Quotas::new([Quota::per_second(10)?, Quota::per_hour(1000)?]).unwrap();
    /// assert_eq!(quotas.min_burst(), 10);
    /// assert_eq!(Quotas::new([]), Err(QuotasError::Empty));
    /// # Ok::<(), turnstile_rl::QuotaError>(())
    /// ```
    pub fn new(quotas: impl IntoIterator<Item = Quota>) -> Result<Quotas, QuotasError> {
        let quotas: Vec<Quota> = quotas.into_iter().collect();
        match quotas.len() {
            0 => Err(QuotasError::Empty),
            count if count > MAX_LIMITS => Err(QuotasError::TooMany {
                count,
                max: MAX_LIMITS,
            }),
            _ => Ok(Quotas { quotas }),
        }
    }

    /// The quotas, in the order given.
    pub fn as_slice(&self) -> &[Quota] {
        &self.quotas
    }

    /// The first quota.
    pub fn first(&self) -> Quota {
        // Invariant: never empty, so this never indexes out of bounds.
        self.quotas[0]
    }

    /// How many quotas (at least 1).
    #[allow(clippy::len_without_is_empty)] // never empty, by construction
    pub fn len(&self) -> usize {
        self.quotas.len()
    }

    /// The smallest burst: the largest cost every limit can ever admit.
    pub fn min_burst(&self) -> u64 {
        self.quotas.iter().map(Quota::burst_size).min().unwrap_or(1)
    }
}

impl From<Quota> for Quotas {
    fn from(quota: Quota) -> Self {
        Quotas {
            quotas: vec![quota],
        }
    }
}

impl FromStr for Quotas {
    type Err = QuotasError;

    fn from_str(text: &str) -> Result<Quotas, QuotasError> {
        if text.trim().is_empty() {
            return Err(QuotasError::Empty);
        }
        let parts: Vec<&str> = text.split(';').collect();
        if parts.len() > MAX_LIMITS {
            return Err(QuotasError::TooMany {
                count: parts.len(),
                max: MAX_LIMITS,
            });
        }
        let quotas = parts
            .iter()
            .enumerate()
            .map(|(index, part)| {
                part.parse().map_err(|source| QuotasError::Quota {
                    index,
                    text: part.trim().to_owned(),
                    source,
                })
            })
            .collect::<Result<Vec<Quota>, _>>()?;
        Quotas::new(quotas)
    }
}

impl fmt::Display for Quotas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, quota) in self.quotas.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{quota}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::QuotaError;

    #[test]
    fn bad_lists_are_typed_errors() {
        assert_eq!("  ".parse::<Quotas>(), Err(QuotasError::Empty));
        assert_eq!(Quotas::new([]), Err(QuotasError::Empty));
        assert_eq!(
            "10/s;".parse::<Quotas>(),
            Err(QuotasError::Quota {
                index: 1,
                text: String::new(),
                source: QuotaError::Empty
            })
        );
        assert!(matches!(
            "1/s;".repeat(9).trim_end_matches(';').parse::<Quotas>(),
            Err(QuotasError::TooMany { count: 9, max: 8 })
        ));
        assert!(matches!(
            "0/s".parse::<Quotas>(),
            Err(QuotasError::Quota {
                index: 0,
                source: QuotaError::ZeroCount,
                ..
            })
        ));
    }

    #[test]
    fn lists_round_trip() {
        let quotas: Quotas = " 10/s burst 20 ;1000/h ".parse().unwrap();
        assert_eq!(quotas.to_string().parse::<Quotas>().unwrap(), quotas);
        assert_eq!(quotas.min_burst(), 20);
        assert_eq!(Quotas::from(Quota::per_second(3).unwrap()).len(), 1);
    }
}
