//! Key extraction: [`KeyExtractor`] and the bad-key policy [`OnBadKey`]
//! (the user-facing docs are on `KeyExtractor`).

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::header::HeaderName;
use http::{HeaderMap, StatusCode};

use super::client_ip::ClientIp;
#[cfg(doc)]
use super::client_ip::PeerAddr;
use super::request::{HttpKey, KeyError, RequestParts};

/// What to do with a request whose key is missing or malformed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnBadKey {
    /// Answer with this status (and a problem+json body); the service never
    /// sees the request.
    Reject(StatusCode),
    /// Count the request against its client address instead.
    PeerIp,
}

impl Default for OnBadKey {
    fn default() -> Self {
        OnBadKey::Reject(StatusCode::BAD_REQUEST)
    }
}

type ExtractFn = dyn Fn(&RequestParts<'_>) -> Result<HttpKey, KeyError> + Send + Sync;

#[derive(Clone)]
enum Source {
    Header(HeaderName),
    Extension(Arc<ExtractFn>),
    PeerIp,
    Global,
    Custom(Arc<ExtractFn>),
}

/// Takes the key from a request: who a request counts against, and what
/// happens when a request does not say.
///
/// | extractor | key | typical use |
/// |-----------|-----|-------------|
/// | [`KeyExtractor::header`] | `key:` + the header's value | API keys |
/// | [`KeyExtractor::extension`] | `user:` + what your function returns | a user id set by your auth layer |
/// | [`KeyExtractor::peer_ip`] | `ip:` + the client's address or prefix | anonymous traffic (`/login`) |
/// | [`KeyExtractor::global`] | one key for every request | a global budget ([`DirectLimiter`](crate::DirectLimiter)) |
/// | [`KeyExtractor::custom`] | whatever your closure returns, as is | anything else |
///
/// The prefixes keep kinds apart: an API key that reads `ip:203.0.113.7`
/// cannot spend that address's bucket.
///
/// # Client addresses, proxies and NAT
///
/// The peer address comes from the connection: a [`PeerAddr`] or
/// `SocketAddr` extension, and with the `axum` feature axum's
/// `ConnectInfo<SocketAddr>` (what `into_make_service_with_connect_info`
/// sets); anything else through [`ClientIp::peer_addr_from`]. `X-Forwarded-For` and `Forwarded`
/// (RFC 7239) are read **only when the peer is a trusted proxy**
/// ([`ClientIp::trust`]); anyone else could write any address there. The
/// chain is walked from the right (the hop nearest to us), skipping trusted
/// proxies; the first untrusted address is the client. `Forwarded` wins
/// when both headers are present; its quoted values may hold commas and
/// semicolons (`host="a,b"`). `X-Real-IP` from a trusted proxy wins over
/// both when [`ClientIp::x_real_ip`] is on.
///
/// A trusted proxy that does not know its client, or will not tell, names
/// it `unknown` or an obfuscated `_name` (RFC 7239: `Forwarded:
/// for=unknown`, `for="_hidden"`; `X-Forwarded-For: unknown`): the chain
/// ends at that proxy, and the request counts against the proxy's own
/// address (the peer's, when the peer wrote it; else the trusted hop that
/// forwarded it). Everyone behind it shares one bucket, rather than each
/// request being refused. [`ClientIp::reject_unknown`] makes it a bad key
/// instead.
///
/// One IPv6 host usually owns a whole /64, so an IPv6 client is keyed by
/// its prefix ([`ClientIp::ipv6_prefix`], default 64): otherwise it could
/// take a fresh bucket for every request. IPv4-mapped IPv6 addresses count
/// as IPv4. Keying by address punishes everyone behind one NAT; prefer an
/// API key or a user id where there is one.
///
/// # Missing and malformed keys
///
/// No header, an empty, non-text (bytes outside visible ASCII) or oversized
/// value ([`KeyExtractor::max_len`], by default [`DEFAULT_MAX_KEY_LEN`]
/// bytes), a missing extension, or a forwarded header from a trusted
/// proxy that cannot be read (not an address, nor an unnamed client as
/// above): each is a
/// [`KeyError`], handled by [`OnBadKey`]:
///
/// - [`OnBadKey::Reject`] (the default, with `400 Bad Request`): the
///   request is answered with that status and an `application/problem+json`
///   body naming the problem, and never reaches the service;
/// - [`OnBadKey::PeerIp`]: the request counts against its client address
///   instead (for a garbage forwarded header, the proxy's own address).
///
/// A server that does not tell the layer the peer address at all is
/// misconfigured: such requests get `500` whatever the policy, so the
/// mistake shows at once.
///
/// ```
/// use axum::http::{HeaderName, StatusCode};
/// use turnstile_rl::http::{ClientIp, KeyExtractor, OnBadKey};
///
/// // API keys; a request without one counts against its address instead.
/// let by_api_key = KeyExtractor::header(HeaderName::from_static("x-api-key"))
///     .on_bad_key(OnBadKey::PeerIp);
///
/// // Client addresses behind a load balancer in 10.0.0.0/8.
/// let by_ip = KeyExtractor::peer_ip()
///     .client_ip(ClientIp::new().trust(["10.0.0.0/8".parse()?]));
///
/// // A user id that an authentication layer put in the extensions.
/// #[derive(Clone)]
/// struct UserId(u64);
/// let by_user = KeyExtractor::extension(|user: &UserId| user.0.to_string())
///     .on_bad_key(OnBadKey::Reject(StatusCode::UNAUTHORIZED));
/// # let _ = (by_api_key, by_ip, by_user);
/// # Ok::<(), ipnet::AddrParseError>(())
/// ```
#[derive(Clone)]
pub struct KeyExtractor {
    source: Source,
    client_ip: ClientIp,
    on_bad_key: OnBadKey,
    max_len: usize,
}

impl fmt::Debug for KeyExtractor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let source = match &self.source {
            Source::Header(name) => format!("header {name:?}"),
            Source::Extension(_) => "extension".to_owned(),
            Source::PeerIp => "peer ip".to_owned(),
            Source::Global => "global".to_owned(),
            Source::Custom(_) => "custom".to_owned(),
        };
        f.debug_struct("KeyExtractor")
            .field("source", &source)
            .field("client_ip", &self.client_ip)
            .field("on_bad_key", &self.on_bad_key)
            .field("max_len", &self.max_len)
            .finish()
    }
}

/// The longest header key accepted unless set otherwise.
pub const DEFAULT_MAX_KEY_LEN: usize = 256;

impl KeyExtractor {
    fn with(source: Source) -> Self {
        KeyExtractor {
            source,
            client_ip: ClientIp::new(),
            on_bad_key: OnBadKey::default(),
            max_len: DEFAULT_MAX_KEY_LEN,
        }
    }

    /// The value of header `name` (an API key), as `key:<value>`.
    pub fn header(name: HeaderName) -> Self {
        Self::with(Source::Header(name))
    }

    /// A value of type `T` that an outer layer (authentication) put in the
    /// request's extensions, turned into a key by `key`, as `user:<key>`.
    pub fn extension<T, K>(key: impl Fn(&T) -> K + Send + Sync + 'static) -> Self
    where
        T: Send + Sync + 'static,
        K: AsRef<[u8]>,
    {
        let what = format!("extension {}", std::any::type_name::<T>());
        Self::with(Source::Extension(Arc::new(move |parts| {
            parts
                .extensions
                .get::<T>()
                .map(|value| HttpKey::prefixed("user:", key(value).as_ref()))
                .ok_or_else(|| KeyError::Missing { what: what.clone() })
        })))
    }

    /// The client's address (see [`ClientIp`]), as `ip:<address>` or
    /// `ip:<network>/<prefix>`.
    pub fn peer_ip() -> Self {
        Self::with(Source::PeerIp)
    }

    /// The same key (`global`) for every request: one budget for the whole
    /// route, usually with a [`DirectLimiter`](crate::DirectLimiter). Needs
    /// no peer address and never refuses a request for its key.
    pub fn global() -> Self {
        Self::with(Source::Global)
    }

    /// Your own function; its key is used as is.
    pub fn custom(
        extract: impl Fn(&RequestParts<'_>) -> Result<HttpKey, KeyError> + Send + Sync + 'static,
    ) -> Self {
        Self::with(Source::Custom(Arc::new(extract)))
    }

    /// How client addresses are found (trusted proxies, prefixes, where the
    /// peer address is).
    pub fn client_ip(mut self, client_ip: ClientIp) -> Self {
        self.client_ip = client_ip;
        self
    }

    /// What to do when the key is missing or malformed.
    pub fn on_bad_key(mut self, policy: OnBadKey) -> Self {
        self.on_bad_key = policy;
        self
    }

    /// The longest header value accepted as a key (default
    /// [`DEFAULT_MAX_KEY_LEN`]).
    pub fn max_len(mut self, bytes: usize) -> Self {
        self.max_len = bytes;
        self
    }

    /// The key of a request, with the bad-key policy applied: `Err` holds
    /// the status to answer with and why.
    pub fn key(&self, parts: &RequestParts<'_>) -> Result<HttpKey, (StatusCode, KeyError)> {
        let error = match self.extract(parts) {
            Ok(key) => return Ok(key),
            Err(KeyError::NoPeerAddr) => {
                return Err((StatusCode::INTERNAL_SERVER_ERROR, KeyError::NoPeerAddr))
            }
            Err(error) => error,
        };
        match self.on_bad_key {
            OnBadKey::Reject(status) => Err((status, error)),
            OnBadKey::PeerIp => {
                let ip = match self.client_ip.client(parts) {
                    Ok(ip) => ip,
                    // A garbage chain: the proxy's own address carries it.
                    Err(KeyError::BadForwarded { .. }) => self
                        .client_ip
                        .peer(parts.extensions)
                        .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e))?,
                    Err(e) => return Err((StatusCode::INTERNAL_SERVER_ERROR, e)),
                };
                Ok(self.client_ip.key_of(ip))
            }
        }
    }

    /// The key as the source gives it, without the policy.
    pub fn extract(&self, parts: &RequestParts<'_>) -> Result<HttpKey, KeyError> {
        match &self.source {
            Source::Header(name) => self.header_key(name, parts.headers),
            Source::Extension(f) | Source::Custom(f) => f(parts),
            Source::PeerIp => self
                .client_ip
                .client(parts)
                .map(|ip| self.client_ip.key_of(ip)),
            Source::Global => Ok(HttpKey::from(Bytes::from_static(b"global"))),
        }
    }

    fn header_key(&self, name: &HeaderName, headers: &HeaderMap) -> Result<HttpKey, KeyError> {
        let what = || format!("header {:?}", name.as_str());
        let value = headers
            .get(name)
            .ok_or_else(|| KeyError::Missing { what: what() })?;
        let bytes = value.as_bytes().trim_ascii();
        if bytes.is_empty() {
            return Err(KeyError::Missing { what: what() });
        }
        if bytes.len() > self.max_len {
            return Err(KeyError::TooLong {
                what: what(),
                len: bytes.len(),
                max: self.max_len,
            });
        }
        if !bytes.iter().all(|b| b.is_ascii_graphic() || *b == b' ') {
            return Err(KeyError::NotText { what: what() });
        }
        Ok(HttpKey::prefixed("key:", bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::client_ip::tests::request;

    #[test]
    fn header_keys_are_checked() {
        let extractor = KeyExtractor::header(HeaderName::from_static("x-api-key")).max_len(8);
        let key = |headers: &[(&str, &[u8])]| {
            let request = request("192.0.2.1:1", headers);
            extractor.extract(&RequestParts::of(&request))
        };
        assert_eq!(key(&[("x-api-key", b" k1 ")]), Ok(HttpKey::from("key:k1")));
        assert!(matches!(key(&[]), Err(KeyError::Missing { .. })));
        assert!(matches!(
            key(&[("x-api-key", b"  ")]),
            Err(KeyError::Missing { .. })
        ));
        assert!(matches!(
            key(&[("x-api-key", b"123456789")]),
            Err(KeyError::TooLong { len: 9, max: 8, .. })
        ));
        assert!(matches!(
            key(&[("x-api-key", b"k\xe9y")]),
            Err(KeyError::NotText { .. })
        ));
    }

    #[test]
    fn bad_keys_follow_the_policy() {
        let request = request("192.0.2.1:1", &[]);
        let parts = RequestParts::of(&request);
        let name = HeaderName::from_static("x-api-key");
        let reject = KeyExtractor::header(name.clone());
        assert!(matches!(
            reject.key(&parts),
            Err((StatusCode::BAD_REQUEST, KeyError::Missing { .. }))
        ));
        let fallback = KeyExtractor::header(name).on_bad_key(OnBadKey::PeerIp);
        assert_eq!(fallback.key(&parts), Ok(HttpKey::from("ip:192.0.2.1")));
        let blind = http::Request::new(());
        let no_peer = KeyExtractor::peer_ip().on_bad_key(OnBadKey::PeerIp);
        assert_eq!(
            no_peer.key(&RequestParts::of(&blind)),
            Err((StatusCode::INTERNAL_SERVER_ERROR, KeyError::NoPeerAddr))
        );
    }
}
