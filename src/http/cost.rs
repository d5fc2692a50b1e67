//! Weighted requests: [`CostExtractor`] says how many tokens a request
//! takes, next to the [`KeyExtractor`](super::KeyExtractor) that says whose
//! they are; [`BadCost`] is why a request did not say.

use std::fmt;
use std::sync::Arc;

use http::header::HeaderName;

use super::request::RequestParts;

/// Why a request's cost could not be read. The layer answers `400 Bad
/// Request` with a problem+json body naming it (counted as
/// `outcome="bad_cost"`); the service never sees the request.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BadCost {
    /// The request does not carry its cost (no header, no extension).
    #[error("missing {what}: the request's cost")]
    Missing {
        /// What was looked for, for example `header "x-batch-size"`.
        what: String,
    },
    /// The value is not a whole number of tokens.
    #[error("{what} is {value:?}, not a whole number of tokens")]
    NotANumber {
        /// Where the cost was read.
        what: String,
        /// The value found (lossy UTF-8).
        value: String,
    },
    /// A custom extractor's refusal.
    #[error("{0}")]
    Rejected(String),
}

type CostFn = dyn Fn(&RequestParts<'_>) -> Result<u64, BadCost> + Send + Sync;

/// Takes the cost of a request: how many tokens it spends, for endpoints
/// whose requests do not weigh the same (a batch endpoint's item count, a
/// GraphQL query's complexity, an upload's bytes, a model call's tokens).
/// Given to [`RateLimitLayerBuilder::cost`](super::RateLimitLayerBuilder::cost);
/// without one, every request costs 1.
///
/// | extractor | cost |
/// |-----------|------|
/// | [`CostExtractor::header`] | the header's value, a decimal number |
/// | [`CostExtractor::extension`] | what your function returns for a value an outer layer put in the extensions |
/// | [`CostExtractor::custom`] | whatever your closure returns |
///
/// The body is not read (the layer decides before the service streams
/// it): a cost that depends on it (a GraphQL query's complexity) is worked
/// out by a layer before this one and put in the extensions.
///
/// One cost is charged to every limit of a multi-limit layer, all or
/// nothing. A cost of 0 is a `400`; a cost above a limit's capacity (its
/// burst, the most it ever admits at once) can never be admitted and is
/// answered `413 Content Too Large`, without `Retry-After` (see the
/// [module docs](super#weighted-requests)).
///
/// ```
/// use axum::http::HeaderName;
/// use turnstile_rl::http::CostExtractor;
///
/// // A batch endpoint: the client says how many items it sends.
/// let items = CostExtractor::header(HeaderName::from_static("x-batch-size"));
///
/// // A GraphQL query's complexity, scored by a layer in front of this one.
/// #[derive(Clone)]
/// struct Complexity(u64);
/// let complexity = CostExtractor::extension(|c: &Complexity| c.0);
/// # let _ = (items, complexity);
/// ```
#[derive(Clone)]
pub struct CostExtractor {
    what: String,
    extract: Arc<CostFn>,
}

impl fmt::Debug for CostExtractor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CostExtractor")
            .field("source", &self.what)
            .finish_non_exhaustive()
    }
}

impl CostExtractor {
    /// The value of header `name`, a decimal number (surrounding spaces
    /// allowed): `Content-Length` for an upload's bytes, or a header the
    /// client sets.
    pub fn header(name: HeaderName) -> Self {
        let what = format!("header {:?}", name.as_str());
        let source = what.clone();
        let extract = move |parts: &RequestParts<'_>| {
            let value = parts
                .headers
                .get(&name)
                .ok_or_else(|| BadCost::Missing { what: what.clone() })?;
            let text = value.as_bytes().trim_ascii();
            std::str::from_utf8(text)
                .ok()
                .filter(|t| t.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|t| t.parse::<u64>().ok())
                .ok_or_else(|| BadCost::NotANumber {
                    what: what.clone(),
                    value: String::from_utf8_lossy(text).into_owned(),
                })
        };
        CostExtractor {
            what: source,
            extract: Arc::new(extract),
        }
    }

    /// A value of type `T` that an outer layer put in the request's
    /// extensions, turned into a cost by `cost`. A request without it is a
    /// [`BadCost::Missing`].
    pub fn extension<T>(cost: impl Fn(&T) -> u64 + Send + Sync + 'static) -> Self
    where
        T: Send + Sync + 'static,
    {
        let what = format!("extension {}", std::any::type_name::<T>());
        let source = what.clone();
        let extract = move |parts: &RequestParts<'_>| {
            parts
                .extensions
                .get::<T>()
                .map(&cost)
                .ok_or_else(|| BadCost::Missing { what: what.clone() })
        };
        CostExtractor {
            what: source,
            extract: Arc::new(extract),
        }
    }

    /// Your own function.
    pub fn custom(
        extract: impl Fn(&RequestParts<'_>) -> Result<u64, BadCost> + Send + Sync + 'static,
    ) -> Self {
        CostExtractor {
            what: "custom".to_owned(),
            extract: Arc::new(extract),
        }
    }

    /// The cost of a request, or why it has none.
    pub fn cost(&self, parts: &RequestParts<'_>) -> Result<u64, BadCost> {
        (self.extract)(parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::client_ip::tests::request;

    #[test]
    fn header_costs_are_whole_numbers() {
        let extractor = CostExtractor::header(HeaderName::from_static("x-cost"));
        let cost = |headers: &[(&str, &[u8])]| {
            let request = request("192.0.2.1:1", headers);
            extractor.cost(&RequestParts::of(&request))
        };
        assert_eq!(cost(&[("x-cost", b" 12 ")]), Ok(12));
        assert_eq!(cost(&[("x-cost", b"0")]), Ok(0));
        assert_eq!(
            cost(&[]),
            Err(BadCost::Missing {
                what: "header \"x-cost\"".into()
            })
        );
        for bad in [
            &b"-3"[..],
            b"+3",
            b"1.5",
            b"",
            b"99999999999999999999",
            b"\xff",
        ] {
            assert!(
                matches!(cost(&[("x-cost", bad)]), Err(BadCost::NotANumber { .. })),
                "{bad:?}"
            );
        }
        assert_eq!(
            cost(&[("x-cost", b"lots")]).unwrap_err().to_string(),
            "header \"x-cost\" is \"lots\", not a whole number of tokens"
        );
    }
}
