//! Client addresses: where a request's peer address comes from, which
//! proxies are trusted to forward another (`X-Real-IP`, `Forwarded`,
//! `X-Forwarded-For`, walked from the right), and how much of an address
//! makes a key. The rules, for users, are in the
//! [`http::key` module docs](crate::http::key#client-addresses-proxies-and-nat).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use http::header::{HeaderName, FORWARDED};
use http::{Extensions, HeaderMap};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use super::request::{HttpKey, KeyError, RequestParts};

/// The peer address of a connection, as a request extension: insert it in
/// a hand-written hyper server. axum's `ConnectInfo` is read as is with the
/// `axum` feature, or through [`ClientIp::peer_addr_from`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PeerAddr(pub SocketAddr);

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
    reject_unknown: bool,
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
            .field("reject_unknown", &self.reject_unknown)
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
            reject_unknown: false,
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

    /// Whether a trusted proxy's `unknown` or obfuscated client (`for=unknown`,
    /// `for=_hidden`, `X-Forwarded-For: unknown`) is a
    /// [`KeyError::BadForwarded`] (on) or counts against that proxy's own
    /// address (default off; see the
    /// [rules](crate::http::KeyExtractor#client-addresses-proxies-and-nat)).
    pub fn reject_unknown(mut self, on: bool) -> Self {
        self.reject_unknown = on;
        self
    }

    /// Where the connection's peer address is found, when the default
    /// lookup does not: for tonic, its `TcpConnectInfo`; for axum without
    /// the `axum` feature:
    ///
    /// ```
    /// use std::net::SocketAddr;
    /// use axum::extract::ConnectInfo;
    /// use turnstile_rl::http::ClientIp;
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
    pub(super) fn peer(&self, extensions: &Extensions) -> Result<IpAddr, KeyError> {
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
                return match parse_node(text.trim()).map_err(bad)? {
                    Node::Ip(ip) => Ok(ip.to_canonical()),
                    Node::Unnamed if self.reject_unknown => Err(bad(unnamed(text))),
                    Node::Unnamed => Ok(peer),
                };
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

    /// Walks a forwarded chain from the right; `None` for no header, or for
    /// an unnamed client of the peer itself.
    fn walk(
        &self,
        headers: &HeaderMap,
        name: HeaderName,
        label: &'static str,
        parse: impl Fn(&str) -> Result<Node, String>,
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
            let ip = match parse(element).map_err(bad)? {
                Node::Ip(ip) => ip.to_canonical(),
                Node::Unnamed if self.reject_unknown => return Err(bad(unnamed(element))),
                // The proxy that wrote it (the hop just walked, or the
                // peer) is as far as the chain names anyone.
                Node::Unnamed => return Ok(leftmost),
            };
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
fn forwarded_for(element: &str) -> Result<Node, String> {
    let node = split_unquoted(element, b';')
        .filter_map(|pair| pair.split_once('='))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("for"))
        .map(|(_, value)| value.trim())
        .ok_or_else(|| format!("element {:?} has no for=", element.trim()))?;
    parse_node(&unquote(node)?)
}

/// A forwarded node: an address, or a proxy saying it does not know its
/// client or will not tell.
enum Node {
    Ip(IpAddr),
    Unnamed,
}

/// Why an unnamed node is refused under [`ClientIp::reject_unknown`].
fn unnamed(node: &str) -> String {
    format!("{:?} names no client", node.trim())
}

/// `unknown` or an obfuscated `_name`, with an optional port (numeric or
/// obfuscated): RFC 7239 section 6's nodes that are not addresses.
fn is_unnamed(node: &str) -> bool {
    let obfuscated = |s: &str| {
        s.strip_prefix('_').is_some_and(|rest| {
            !rest.is_empty()
                && rest
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        })
    };
    let (name, port) = match node.split_once(':') {
        Some((name, port)) => (name, Some(port)),
        None => (node, None),
    };
    (name.eq_ignore_ascii_case("unknown") || obfuscated(name))
        && port.is_none_or(|port| port.parse::<u16>().is_ok() || obfuscated(port))
}

/// A node (see [`is_unnamed`]), or an address with an optional port:
/// `192.0.2.1`, `192.0.2.1:8080`, `2001:db8::1`, `[2001:db8::1]`,
/// `[2001:db8::1]:8080`. Anything else is an error.
fn parse_node(node: &str) -> Result<Node, String> {
    if is_unnamed(node) {
        return Ok(Node::Unnamed);
    }
    parse_ip(node).map(Node::Ip)
}

fn parse_ip(node: &str) -> Result<IpAddr, String> {
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

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A request from `peer` (a [`PeerAddr`] extension) with these headers.
    pub(in crate::http) fn request(peer: &str, headers: &[(&str, &[u8])]) -> http::Request<()> {
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
        // An unterminated quote is garbage.
        assert!(matches!(
            client(&ip, "10.0.0.1:1", &[("forwarded", b"for=\"192.0.2.1")]),
            Err(KeyError::BadForwarded { .. })
        ));
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
            ("forwarded", b"for=unknownx"),
            ("forwarded", b"for=_"),
            ("forwarded", b"for=\"_a b\""),
            ("forwarded", b"for=\"unknown:99999\""),
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

    /// A trusted proxy that names no client (RFC 7239 `unknown` and
    /// obfuscated nodes): the chain ends at that proxy, or it is refused
    /// when asked.
    #[test]
    fn unnamed_clients_count_against_the_proxy_that_sent_them() {
        let lenient = ClientIp::new()
            .trust(["10.0.0.0/8".parse().unwrap()])
            .x_real_ip(true);
        let strict = lenient.clone().reject_unknown(true);
        let cases: &[(&str, &[u8], &str)] = &[
            ("forwarded", b"for=unknown", "10.0.0.1"),
            ("forwarded", b"For=UNKNOWN;proto=https", "10.0.0.1"),
            ("forwarded", b"for=\"_gazonk\"", "10.0.0.1"),
            ("forwarded", b"for=\"_hidden:_port\"", "10.0.0.1"),
            ("forwarded", b"for=\"unknown:8080\"", "10.0.0.1"),
            ("forwarded", b"for=192.0.2.43, for=unknown", "10.0.0.1"),
            // Proxy 10.0.0.5 forwarded to the peer, and did not know its
            // own client: the chain names 10.0.0.5 last.
            ("forwarded", b"for=unknown, for=10.0.0.5", "10.0.0.5"),
            ("x-forwarded-for", b"unknown", "10.0.0.1"),
            (
                "x-forwarded-for",
                b"198.51.100.7, unknown, 10.0.0.9",
                "10.0.0.9",
            ),
            ("x-real-ip", b"unknown", "10.0.0.1"),
        ];
        for (name, value, want) in cases {
            let text = String::from_utf8_lossy(value);
            assert_eq!(
                client(&lenient, "10.0.0.1:1", &[(name, value)]),
                Ok(want.parse().unwrap()),
                "{name}: {text}"
            );
            match client(&strict, "10.0.0.1:1", &[(name, value)]) {
                Err(KeyError::BadForwarded { reason, .. }) => {
                    assert!(reason.ends_with("names no client"), "{reason}")
                }
                other => panic!("{name}: {text}: {other:?}"),
            }
        }
        // An unnamed node to the left of the client is never read.
        let xff: &[(&str, &[u8])] = &[("x-forwarded-for", b"unknown, 198.51.100.7")];
        assert_eq!(
            client(&strict, "10.0.0.1:1", xff),
            Ok("198.51.100.7".parse().unwrap())
        );
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
}
