//! Keys: who a request counts against, and what happens when a request
//! does not say.
//!
//! | extractor | key | typical use |
//! |-----------|-----|-------------|
//! | [`KeyExtractor::header`] | `key:` + the header's value | API keys |
//! | [`KeyExtractor::extension`] | `user:` + what your function returns | a user id set by your auth layer |
//! | [`KeyExtractor::peer_ip`] | `ip:` + the client's address or prefix | anonymous traffic (`/login`) |
//! | [`KeyExtractor::global`] | one key for every request | a global budget ([`DirectLimiter`](crate::DirectLimiter)) |
//! | [`KeyExtractor::custom`] | whatever your closure returns, as is | anything else |
//!
//! The prefixes keep kinds apart: an API key that reads `ip:203.0.113.7`
//! cannot spend that address's bucket.
//!
//! # Client addresses, proxies and NAT
//!
//! The peer address comes from the connection: a [`PeerAddr`] or
//! `SocketAddr` extension, and with the `axum` feature axum's
//! `ConnectInfo<SocketAddr>` (what `into_make_service_with_connect_info`
//! sets); anything else through [`ClientIp::peer_addr_from`]. `X-Forwarded-For` and `Forwarded`
//! (RFC 7239) are read **only when the peer is a trusted proxy**
//! ([`ClientIp::trust`]); anyone else could write any address there. The
//! chain is walked from the right (the hop nearest to us), skipping trusted
//! proxies; the first untrusted address is the client. `Forwarded` wins
//! when both headers are present; its quoted values may hold commas and
//! semicolons (`host="a,b"`). `X-Real-IP` from a trusted proxy wins over
//! both when [`ClientIp::x_real_ip`] is on.
//!
//! One IPv6 host usually owns a whole /64, so an IPv6 client is keyed by
//! its prefix ([`ClientIp::ipv6_prefix`], default 64): otherwise it could
//! take a fresh bucket for every request. IPv4-mapped IPv6 addresses count
//! as IPv4. Keying by address punishes everyone behind one NAT; prefer an
//! API key or a user id where there is one.
//!
//! # Missing and malformed keys
//!
//! No header, an empty, non-text (bytes outside visible ASCII) or oversized
//! value ([`KeyExtractor::max_len`], default 256 bytes), a missing
//! extension, or a forwarded header from a trusted proxy that cannot be
//! read: each is a [`KeyError`], handled by [`OnBadKey`]:
//!
//! - [`OnBadKey::Reject`] (the default, with `400 Bad Request`): the
//!   request is answered with that status and an `application/problem+json`
//!   body naming the problem, and never reaches the service;
//! - [`OnBadKey::PeerIp`]: the request counts against its client address
//!   instead (for a garbage forwarded header, the proxy's own address).
//!
//! A server that does not tell the layer the peer address at all is
//! misconfigured: such requests get `500` whatever the policy, so the
//! mistake shows at once.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderName, FORWARDED};
use http::{Extensions, HeaderMap, Method, StatusCode, Uri};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

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
    fn prefixed(prefix: &str, value: &[u8]) -> Self {
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
    /// deployment mistake (see [`ClientIp::peer_addr_from`]), answered with
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
    serve axum with into_make_service_with_connect_info::<SocketAddr>(), \
    give other servers a turnstile::http::PeerAddr extension, \
    or set ClientIp::peer_addr_from; KeyExtractor::global() needs no address";
#[cfg(not(feature = "axum"))]
const NO_PEER_ADDR: &str = "the rate limiter cannot see the peer address: \
    under axum, enable turnstile's \"axum\" feature (it reads ConnectInfo<SocketAddr>) \
    and serve with into_make_service_with_connect_info::<SocketAddr>(); \
    give other servers a turnstile::http::PeerAddr extension, \
    or set ClientIp::peer_addr_from; KeyExtractor::global() needs no address";

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

/// The peer address of a connection, as a request extension: insert it in
/// a hand-written hyper server. axum's `ConnectInfo` is read as is with the
/// `axum` feature, or through [`ClientIp::peer_addr_from`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PeerAddr(pub SocketAddr);

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

type PeerAddrFn = dyn Fn(&Extensions) -> Option<SocketAddr> + Send + Sync;

/// How to find a request's client address: where the peer address comes
/// from, which proxies are trusted to forward another, and how much of an
/// address makes a key.
#[derive(Clone)]
pub struct ClientIp {
    trusted: Arc<[IpNet]>,
    ipv4_prefix: u8,
    ipv6_prefix: u8,
    max_hops: usize,
    x_real_ip: bool,
    peer_addr: Arc<PeerAddrFn>,
}

impl fmt::Debug for ClientIp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientIp")
            .field("trusted", &self.trusted)
            .field("ipv4_prefix", &self.ipv4_prefix)
            .field("ipv6_prefix", &self.ipv6_prefix)
            .field("max_hops", &self.max_hops)
            .field("x_real_ip", &self.x_real_ip)
            .finish_non_exhaustive()
    }
}

impl Default for ClientIp {
    fn default() -> Self {
        Self::new()
    }
}

/// The default peer address lookup: a [`PeerAddr`], axum's
/// `ConnectInfo<SocketAddr>` (feature `axum`), or a bare [`SocketAddr`]
/// extension.
fn default_peer_addr(extensions: &Extensions) -> Option<SocketAddr> {
    if let Some(peer) = extensions.get::<PeerAddr>() {
        return Some(peer.0);
    }
    #[cfg(feature = "axum")]
    if let Some(info) = extensions.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(info.0);
    }
    extensions.get::<SocketAddr>().copied()
}

impl ClientIp {
    /// Trusts no proxy; keys IPv4 by /32 and IPv6 by /64; reads the peer
    /// address from a [`PeerAddr`], axum's `ConnectInfo<SocketAddr>`
    /// (feature `axum`) or a [`SocketAddr`] extension.
    pub fn new() -> Self {
        ClientIp {
            trusted: Arc::new([]),
            ipv4_prefix: 32,
            ipv6_prefix: 64,
            max_hops: 16,
            x_real_ip: false,
            peer_addr: Arc::new(default_peer_addr),
        }
    }

    /// Trusts the proxies in these networks to forward the client's
    /// address (for example `"10.0.0.0/8".parse()?`).
    pub fn trust(mut self, proxies: impl IntoIterator<Item = IpNet>) -> Self {
        let mut all = self.trusted.to_vec();
        all.extend(proxies);
        self.trusted = all.into();
        self
    }

    /// Keys IPv6 clients by their first `bits` bits (clamped to 0..=128;
    /// default 64).
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.ipv6_prefix = bits.min(128);
        self
    }

    /// Keys IPv4 clients by their first `bits` bits (clamped to 0..=32;
    /// default 32, one address).
    pub fn ipv4_prefix(mut self, bits: u8) -> Self {
        self.ipv4_prefix = bits.min(32);
        self
    }

    /// The most trusted proxies in a row the chain may hold (default 16);
    /// a longer chain is a [`KeyError::BadForwarded`].
    pub fn max_hops(mut self, hops: usize) -> Self {
        self.max_hops = hops.max(1);
        self
    }

    /// Whether a trusted proxy's `X-Real-IP` names the client (default
    /// off). nginx and others set it to the address they saw; when on and
    /// the peer is a trusted proxy that sent one, it wins over
    /// `Forwarded` and `X-Forwarded-For`. From an untrusted peer it is
    /// never read. An unreadable one is a [`KeyError::BadForwarded`].
    pub fn x_real_ip(mut self, on: bool) -> Self {
        self.x_real_ip = on;
        self
    }

    /// Where the connection's peer address is found, when the default
    /// lookup does not: for tonic, its `TcpConnectInfo`; for axum without
    /// the `axum` feature:
    ///
    /// ```
    /// use std::net::SocketAddr;
    /// use axum::extract::ConnectInfo;
    /// use turnstile::http::ClientIp;
    ///
    /// let client_ip = ClientIp::new()
    ///     .peer_addr_from(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0));
    /// # let _ = client_ip;
    /// ```
    ///
    /// and serve with `into_make_service_with_connect_info::<SocketAddr>()`.
    pub fn peer_addr_from(
        mut self,
        lookup: impl Fn(&Extensions) -> Option<SocketAddr> + Send + Sync + 'static,
    ) -> Self {
        self.peer_addr = Arc::new(lookup);
        self
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|net| net.contains(&ip))
    }

    /// The connection's peer address, IPv4-mapped addresses as IPv4.
    fn peer(&self, extensions: &Extensions) -> Result<IpAddr, KeyError> {
        (self.peer_addr)(extensions)
            .map(|addr| addr.ip().to_canonical())
            .ok_or(KeyError::NoPeerAddr)
    }

    /// The client's address: the peer's, or, when the peer is a trusted
    /// proxy, the nearest untrusted address of the forwarded chain.
    pub fn client(&self, parts: &RequestParts<'_>) -> Result<IpAddr, KeyError> {
        let peer = self.peer(parts.extensions)?;
        if !self.is_trusted(peer) {
            return Ok(peer);
        }
        if self.x_real_ip {
            if let Some(value) = parts.headers.get(&X_REAL_IP) {
                let bad = |reason: String| KeyError::BadForwarded {
                    header: "x-real-ip",
                    reason,
                };
                let text = value.to_str().map_err(|_| bad("not ASCII text".into()))?;
                return parse_node(text.trim())
                    .map(|ip| ip.to_canonical())
                    .map_err(bad);
            }
        }
        if parts.headers.contains_key(FORWARDED) {
            self.walk(parts.headers, FORWARDED, "forwarded", forwarded_for)
        } else {
            self.walk(
                parts.headers,
                X_FORWARDED_FOR,
                "x-forwarded-for",
                |element| parse_node(element.trim()),
            )
        }
        .map(|found| found.unwrap_or(peer))
    }

    /// Walks a forwarded chain from the right; `None` for no header.
    fn walk(
        &self,
        headers: &HeaderMap,
        name: HeaderName,
        label: &'static str,
        parse: impl Fn(&str) -> Result<IpAddr, String>,
    ) -> Result<Option<IpAddr>, KeyError> {
        let bad = |reason: String| KeyError::BadForwarded {
            header: label,
            reason,
        };
        let mut lines = Vec::new();
        for value in headers.get_all(&name) {
            lines.push(value.to_str().map_err(|_| bad("not ASCII text".into()))?);
        }
        let mut leftmost = None;
        let mut hops = 0;
        // `Forwarded` values may quote commas (`host="a,b"`);
        // `X-Forwarded-For` has no quoting.
        let quoting = name == FORWARDED;
        let elements = lines.iter().rev().flat_map(|line| {
            if quoting {
                split_unquoted(line, b',')
            } else {
                line.split(',').collect::<Vec<_>>().into_iter()
            }
            .rev()
        });
        for element in elements {
            let ip = parse(element).map_err(bad)?.to_canonical();
            if !self.is_trusted(ip) {
                return Ok(Some(ip));
            }
            hops += 1;
            if hops > self.max_hops {
                return Err(bad(format!("more than {} trusted proxies", self.max_hops)));
            }
            leftmost = Some(ip);
        }
        // Every hop is trusted: the request started at the leftmost proxy.
        Ok(leftmost)
    }

    /// The key of a client address: `ip:` and the address, or its network
    /// when the prefix is shorter than the address.
    pub fn key_of(&self, ip: IpAddr) -> HttpKey {
        let text = match ip.to_canonical() {
            IpAddr::V4(v4) if self.ipv4_prefix < 32 => {
                network_text(Ipv4Net::new(v4, self.ipv4_prefix).map(|n| n.trunc().into()))
            }
            IpAddr::V6(v6) if self.ipv6_prefix < 128 => {
                network_text(Ipv6Net::new(v6, self.ipv6_prefix).map(|n| n.trunc().into()))
            }
            ip => ip.to_string(),
        };
        HttpKey::prefixed("ip:", text.as_bytes())
    }
}

fn network_text(net: Result<IpNet, ipnet::PrefixLenError>) -> String {
    // The prefix lengths are clamped when set, so this is always Ok; an
    // unspecified address stands in rather than a panic.
    net.map_or_else(
        |_| Ipv6Addr::UNSPECIFIED.to_string(),
        |net: IpNet| net.to_string(),
    )
}

/// `X-Real-IP`, read only when [`ClientIp::x_real_ip`] is on.
pub const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

/// `X-Forwarded-For` (not in `http`'s list of standard headers).
pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// `text` cut at each `sep` outside a quoted string (RFC 7230
/// `quoted-string`, with `\` escapes), so `host="a,b"` stays one piece. An
/// unterminated quote runs to the end; the value parser then refuses it.
fn split_unquoted(text: &str, sep: u8) -> std::vec::IntoIter<&str> {
    let mut pieces = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, &b) in text.as_bytes().iter().enumerate() {
        if escaped {
            escaped = false;
        } else if quoted && b == b'\\' {
            escaped = true;
        } else if b == b'"' {
            quoted = !quoted;
        } else if b == sep && !quoted {
            pieces.push(&text[start..i]);
            start = i + 1;
        }
    }
    pieces.push(&text[start..]);
    pieces.into_iter()
}

/// A `Forwarded` parameter value: a token as is, a quoted string without
/// its quotes and with its `\` escapes undone.
fn unquote(value: &str) -> Result<String, String> {
    let Some(inner) = value.strip_prefix('"') else {
        return Ok(value.to_owned());
    };
    let inner = inner
        .strip_suffix('"')
        .ok_or_else(|| format!("{value:?} has an unterminated quote"))?;
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        out.push(if c == '\\' {
            chars.next().unwrap_or(c)
        } else {
            c
        });
    }
    Ok(out)
}

/// The `for=` node of one `Forwarded` element (`for=...;proto=...;by=...`,
/// pairs split outside quoted strings).
fn forwarded_for(element: &str) -> Result<IpAddr, String> {
    let node = split_unquoted(element, b';')
        .filter_map(|pair| pair.split_once('='))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("for"))
        .map(|(_, value)| value.trim())
        .ok_or_else(|| format!("element {:?} has no for=", element.trim()))?;
    parse_node(&unquote(node)?)
}

/// An address with an optional port: `192.0.2.1`, `192.0.2.1:8080`,
/// `2001:db8::1`, `[2001:db8::1]`, `[2001:db8::1]:8080`. Obfuscated and
/// `unknown` nodes are errors: they name no client.
fn parse_node(node: &str) -> Result<IpAddr, String> {
    let fail = || format!("{node:?} is not an IP address");
    if let Some(rest) = node.strip_prefix('[') {
        let (v6, after) = rest.split_once(']').ok_or_else(fail)?;
        if !(after.is_empty() || after.starts_with(':')) {
            return Err(fail());
        }
        return v6.parse::<Ipv6Addr>().map(IpAddr::V6).map_err(|_| fail());
    }
    if let Ok(ip) = node.parse::<IpAddr>() {
        return Ok(ip);
    }
    match node.split_once(':') {
        Some((v4, port)) if port.parse::<u16>().is_ok() => {
            v4.parse::<Ipv4Addr>().map(IpAddr::V4).map_err(|_| fail())
        }
        _ => Err(fail()),
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

/// Takes the key from a request; see the [module docs](crate::http::key) for the
/// extractors and the bad-key policy.
///
/// ```
/// use axum::http::{HeaderName, StatusCode};
/// use turnstile::http::{ClientIp, KeyExtractor, OnBadKey};
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
            Source::Global => Ok(HttpKey(Bytes::from_static(b"global"))),
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

    fn request(peer: &str, headers: &[(&str, &[u8])]) -> http::Request<()> {
        let mut builder = http::Request::builder();
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let mut request = builder.body(()).unwrap();
        request
            .extensions_mut()
            .insert(PeerAddr(peer.parse().unwrap()));
        request
    }

    fn client(ip: &ClientIp, peer: &str, headers: &[(&str, &[u8])]) -> Result<IpAddr, KeyError> {
        let request = request(peer, headers);
        ip.client(&RequestParts::of(&request))
    }

    #[test]
    fn forwarded_headers_count_only_from_trusted_proxies() {
        let ip = ClientIp::new().trust(["10.0.0.0/8".parse().unwrap()]);
        let xff: &[(&str, &[u8])] = &[("x-forwarded-for", b"198.51.100.7, 10.0.0.2")];
        assert_eq!(
            client(&ip, "203.0.113.9:1", xff),
            Ok("203.0.113.9".parse().unwrap())
        );
        assert_eq!(
            client(&ip, "10.0.0.1:1", xff),
            Ok("198.51.100.7".parse().unwrap())
        );
        // A client's forged entry to the left of the real one is ignored.
        let forged: &[(&str, &[u8])] = &[("x-forwarded-for", b"1.2.3.4, 198.51.100.7")];
        assert_eq!(
            client(&ip, "10.0.0.1:1", forged),
            Ok("198.51.100.7".parse().unwrap())
        );
        // Garbage to the left of the client is never read either.
        let junk: &[(&str, &[u8])] = &[("x-forwarded-for", b"junk, 198.51.100.7")];
        assert_eq!(
            client(&ip, "10.0.0.1:1", junk),
            Ok("198.51.100.7".parse().unwrap())
        );
        // No header from a trusted proxy: the proxy itself.
        assert_eq!(
            client(&ip, "10.0.0.1:1", &[]),
            Ok("10.0.0.1".parse().unwrap())
        );
        // Several header lines form one list, the last line nearest.
        let lines: &[(&str, &[u8])] = &[
            ("x-forwarded-for", b"198.51.100.7"),
            ("x-forwarded-for", b"10.0.0.3"),
        ];
        assert_eq!(
            client(&ip, "10.0.0.1:1", lines),
            Ok("198.51.100.7".parse().unwrap())
        );
    }

    #[test]
    fn rfc7239_forwarded_nodes_parse_and_win_over_xff() {
        let ip = ClientIp::new().trust(["10.0.0.0/8".parse().unwrap()]);
        for (value, want) in [
            (
                &b"for=192.0.2.60;proto=http;by=203.0.113.43"[..],
                "192.0.2.60",
            ),
            (b"for=\"[2001:db8:cafe::17]:4711\"", "2001:db8:cafe::17"),
            (b"For=\"192.0.2.43:47011\", for=10.0.0.5", "192.0.2.43"),
            (b"for=\"[::ffff:192.0.2.1]\"", "192.0.2.1"),
        ] {
            let headers: &[(&str, &[u8])] =
                &[("forwarded", value), ("x-forwarded-for", b"198.51.100.1")];
            assert_eq!(
                client(&ip, "10.0.0.1:1", headers),
                Ok(want.parse().unwrap()),
                "{value:?}"
            );
        }
    }

    /// The examples of RFC 7239 (sections 4, 5.2 and 7.1), and quoted
    /// values holding the separators.
    #[test]
    fn rfc7239_examples_and_quoted_separators() {
        let ip = ClientIp::new().trust(["10.0.0.0/8".parse().unwrap()]);
        let ok: &[(&[u8], &str)] = &[
            (b"for=\"_gazonk\", for=192.0.2.60", "192.0.2.60"),
            (b"For=\"[2001:db8:cafe::17]:4711\"", "2001:db8:cafe::17"),
            (b"for=192.0.2.60;proto=http;by=203.0.113.43", "192.0.2.60"),
            (b"for=192.0.2.43, for=198.51.100.17", "198.51.100.17"),
            (
                b"for=192.0.2.43,for=198.51.100.17;by=203.0.113.60;proto=http;host=example.com",
                "198.51.100.17",
            ),
            (b"for=192.0.2.1;host=\"a,b\"", "192.0.2.1"),
            (b"for=192.0.2.1;host=\"a;b,c\\\"d\"", "192.0.2.1"),
            (b"for=\"192.0.2.2\";by=\"x,y\", for=10.0.0.7", "192.0.2.2"),
        ];
        for (value, want) in ok {
            assert_eq!(
                client(&ip, "10.0.0.1:1", &[("forwarded", value)]),
                Ok(want.parse().unwrap()),
                "{:?}",
                String::from_utf8_lossy(value)
            );
        }
        // The nearest node is obfuscated or unknown: no client named.
        for value in [
            &b"for=192.0.2.43, for=\"_gazonk\""[..],
            b"for=192.0.2.43, for=unknown",
            b"for=\"192.0.2.1",
        ] {
            assert!(
                matches!(
                    client(&ip, "10.0.0.1:1", &[("forwarded", value)]),
                    Err(KeyError::BadForwarded { .. })
                ),
                "{:?}",
                String::from_utf8_lossy(value)
            );
        }
        assert_eq!(
            split_unquoted("a=\"1,2\",b", b',').collect::<Vec<_>>(),
            ["a=\"1,2\"", "b"]
        );
        assert_eq!(unquote("\"a\\\"b\"").as_deref(), Ok("a\"b"));
        assert!(unquote("\"open").is_err());
    }

    #[test]
    fn garbage_forwarded_headers_are_errors_not_panics() {
        let ip = ClientIp::new()
            .trust(["10.0.0.0/8".parse().unwrap()])
            .max_hops(3);
        let cases: &[(&str, &[u8])] = &[
            ("x-forwarded-for", b"not-an-ip"),
            ("x-forwarded-for", b""),
            ("x-forwarded-for", b"1.2.3.4:99999"),
            ("x-forwarded-for", b"[::1"),
            ("x-forwarded-for", b"[::1]x"),
            ("x-forwarded-for", b"\xff\xfe"),
            ("x-forwarded-for", b"10.0.0.1, 10.0.0.2, 10.0.0.3, 10.0.0.4"),
            ("forwarded", b"for=unknown"),
            ("forwarded", b"for=_hidden"),
            ("forwarded", b"proto=https"),
            ("forwarded", b"for=\"[2001:db8::1\""),
        ];
        for case in cases {
            match client(&ip, "10.0.0.1:1", std::slice::from_ref(case)) {
                Err(KeyError::BadForwarded { .. }) => {}
                other => panic!("{case:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn ipv6_clients_are_keyed_by_prefix() {
        let ip = ClientIp::new();
        let key = |addr: &str| ip.key_of(addr.parse().unwrap());
        assert_eq!(
            key("2001:db8:1:2:aaaa::1").as_bytes(),
            b"ip:2001:db8:1:2::/64"
        );
        assert_eq!(key("2001:db8:1:2:bbbb::9"), key("2001:db8:1:2:aaaa::1"));
        assert_ne!(key("2001:db8:1:3::1"), key("2001:db8:1:2::1"));
        assert_eq!(key("::ffff:192.0.2.1").as_bytes(), b"ip:192.0.2.1");
        let wide = ClientIp::new().ipv6_prefix(48).ipv4_prefix(24);
        assert_eq!(
            wide.key_of("2001:db8:1:2::1".parse().unwrap()).as_bytes(),
            b"ip:2001:db8:1::/48"
        );
        assert_eq!(
            wide.key_of("192.0.2.77".parse().unwrap()).as_bytes(),
            b"ip:192.0.2.0/24"
        );
        let exact = ClientIp::new().ipv6_prefix(200);
        assert_eq!(
            exact.key_of("2001:db8::1".parse().unwrap()).as_bytes(),
            b"ip:2001:db8::1"
        );
    }

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
