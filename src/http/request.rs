//! What key extraction works on and what it yields: a borrowed view of a
//! request ([`RequestParts`]), the key it counts against ([`HttpKey`]),
//! and why no key could be taken ([`KeyError`]).
//!
//! Both the extractors (`key.rs`) and client-address resolution
//! (`client_ip.rs`) use these; they live here, apart from both, so that
//! `client_ip.rs` needs nothing from `key.rs`, which uses `ClientIp`: the
//! three files import one way only.

use std::fmt;

use bytes::Bytes;
use http::{Extensions, HeaderMap, Method, Uri};

/// The key a request counts against, as bytes: what a local map hashes and
/// what a remote store is sent.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct HttpKey(Bytes);

impl HttpKey {
    /// A key of these bytes.
    pub fn new(bytes: impl Into<Bytes>) -> Self {
        HttpKey(bytes.into())
    }

    /// The key's bytes (for a remote store).
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// `prefix` then `value`, in one allocation.
    pub(super) fn prefixed(prefix: &str, value: &[u8]) -> Self {
        let mut bytes = Vec::with_capacity(prefix.len() + value.len());
        bytes.extend_from_slice(prefix.as_bytes());
        bytes.extend_from_slice(value);
        HttpKey(bytes.into())
    }
}

impl fmt::Debug for HttpKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HttpKey({:?})", String::from_utf8_lossy(&self.0))
    }
}

/// So a limiter that takes `&impl AsRef<[u8]>` (a remote one) takes an
/// `HttpKey` as is.
impl AsRef<[u8]> for HttpKey {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl From<String> for HttpKey {
    fn from(s: String) -> Self {
        HttpKey(s.into())
    }
}

impl From<&'static str> for HttpKey {
    fn from(s: &'static str) -> Self {
        HttpKey(Bytes::from_static(s.as_bytes()))
    }
}

impl From<Vec<u8>> for HttpKey {
    fn from(v: Vec<u8>) -> Self {
        HttpKey(v.into())
    }
}

impl From<Bytes> for HttpKey {
    fn from(b: Bytes) -> Self {
        HttpKey(b)
    }
}

/// Why no key could be taken from a request.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The request does not carry the key (no header, an empty one, no
    /// extension).
    #[error("missing {what}")]
    Missing {
        /// What was looked for, for example `header "x-api-key"`.
        what: String,
    },
    /// The header's value is not visible ASCII text.
    #[error("{what} is not visible ASCII text")]
    NotText {
        /// The header.
        what: String,
    },
    /// The value is longer than the extractor accepts.
    #[error("{what} is {len} bytes long, more than the {max} accepted")]
    TooLong {
        /// The header.
        what: String,
        /// Its length.
        len: usize,
        /// The most accepted.
        max: usize,
    },
    /// A trusted proxy sent a forwarded header that cannot be read.
    #[error("unreadable {header} header from a trusted proxy: {reason}")]
    BadForwarded {
        /// `forwarded`, `x-forwarded-for` or `x-real-ip`.
        header: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The server did not give the layer the connection's peer address: a
    /// deployment mistake (see [`ClientIp::peer_addr_from`](crate::http::ClientIp::peer_addr_from)), answered with
    /// `500`.
    #[error("{}", NO_PEER_ADDR)]
    NoPeerAddr,
    /// A custom extractor's refusal.
    #[error("{0}")]
    Rejected(String),
}

/// How to fix a missing peer address, for the setup the crate was built
/// with: without the `axum` feature, axum's `ConnectInfo` is not read, so
/// serving with connect info alone is not the fix.
#[cfg(feature = "axum")]
const NO_PEER_ADDR: &str = "the rate limiter cannot see the peer address: \
    serve axum with into_make_service_with_connect_info::<SocketAddr>(); \
    under tonic, set ClientIp::peer_addr_from to read its TcpConnectInfo; \
    give other servers a turnstile_rl::http::PeerAddr extension \
    or a ClientIp::peer_addr_from lookup; KeyExtractor::global() needs no address";
#[cfg(not(feature = "axum"))]
const NO_PEER_ADDR: &str = "the rate limiter cannot see the peer address: \
    under axum, enable turnstile's \"axum\" feature (it reads ConnectInfo<SocketAddr>) \
    and serve with into_make_service_with_connect_info::<SocketAddr>(); \
    under tonic, set ClientIp::peer_addr_from to read its TcpConnectInfo; \
    give other servers a turnstile_rl::http::PeerAddr extension \
    or a ClientIp::peer_addr_from lookup; KeyExtractor::global() needs no address";

/// A borrowed view of a request, for custom extractors.
#[derive(Clone, Copy, Debug)]
pub struct RequestParts<'a> {
    /// The method.
    pub method: &'a Method,
    /// The URI.
    pub uri: &'a Uri,
    /// The headers.
    pub headers: &'a HeaderMap,
    /// The extensions (set by the server and by outer layers).
    pub extensions: &'a Extensions,
}

impl<'a> RequestParts<'a> {
    /// The view of `request`.
    pub fn of<B>(request: &'a http::Request<B>) -> Self {
        RequestParts {
            method: request.method(),
            uri: request.uri(),
            headers: request.headers(),
            extensions: request.extensions(),
        }
    }
}
