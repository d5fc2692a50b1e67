//! gRPC answers: a request with `content-type: application/grpc` is
//! refused with a gRPC status, not an HTTP error page a gRPC client cannot
//! read.
//!
//! A gRPC client reads the outcome of a call from `grpc-status` and
//! `grpc-message`, never from the HTTP status (which must be `200`). The
//! layer answers such a request in the "Trailers-Only" form: `200`,
//! `content-type: application/grpc`, the status in the headers and an
//! empty body. A denial is `RESOURCE_EXHAUSTED`, with the wait in two
//! metadata keys:
//!
//! - `retry-after`: whole seconds, rounded up, as on an HTTP 429;
//! - `grpc-retry-pushback-ms`: milliseconds, rounded up, the key gRPC's own
//!   retry policy (gRFC A6) reads, so a client with retries enabled waits
//!   that long by itself;
//!
//! and exactly, in the status details (`grpc-status-details-bin`), as a
//! `google.rpc.RetryInfo`: the richer error model's retry delay, which
//! tonic-types' `StatusExt::get_details_retry_info` reads.
//!
//! The `RateLimit-Policy` and `RateLimit` fields are metadata too. A
//! refused key is `INVALID_ARGUMENT` (or `UNAUTHENTICATED`,
//! `PERMISSION_DENIED` for `401` and `403` policies), a failed limiter
//! `UNAVAILABLE`, a server without peer addresses `INTERNAL`.

use std::fmt::Write;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::{HeaderMap, Response, StatusCode};

/// `grpc-status`.
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// `grpc-message`.
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// `grpc-retry-pushback-ms` (gRFC A6).
pub(crate) const GRPC_RETRY_PUSHBACK_MS: HeaderName =
    HeaderName::from_static("grpc-retry-pushback-ms");
/// `grpc-status-details-bin`: the status as a `google.rpc.Status`.
pub(crate) const GRPC_STATUS_DETAILS: HeaderName =
    HeaderName::from_static("grpc-status-details-bin");

/// The `Any` type URL of a `google.rpc.RetryInfo`.
const RETRY_INFO_TYPE_URL: &str = "type.googleapis.com/google.rpc.RetryInfo";
/// The longest `google.protobuf.Duration`, in seconds (10,000 years): a
/// longer wait is sent as this, which a decoder accepts.
const MAX_PROTO_DURATION_SECS: u64 = 315_576_000_000;

// The gRPC status codes the layer answers with (grpc/doc/statuscodes.md).
const UNKNOWN: u16 = 2;
const INVALID_ARGUMENT: u16 = 3;
const PERMISSION_DENIED: u16 = 7;
/// `RESOURCE_EXHAUSTED`: the code of a denial.
pub(crate) const RESOURCE_EXHAUSTED: u16 = 8;
const INTERNAL: u16 = 13;
const UNAVAILABLE: u16 = 14;
const UNAUTHENTICATED: u16 = 16;

/// Whether the request is a gRPC call (`application/grpc`, with or without
/// a `+proto` style suffix).
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// The gRPC code closest to an HTTP status the layer answers with.
pub(crate) fn code_of(status: StatusCode) -> u16 {
    match status.as_u16() {
        400 | 422 => INVALID_ARGUMENT,
        401 => UNAUTHENTICATED,
        403 => PERMISSION_DENIED,
        429 => RESOURCE_EXHAUSTED,
        500 => INTERNAL,
        502..=504 => UNAVAILABLE,
        _ => UNKNOWN,
    }
}

/// `response` with a negative `grpc-retry-pushback-ms`, which tells a gRPC
/// client's retry policy not to retry (gRFC A6): for a call no wait can
/// ever admit.
pub(crate) fn never_retry(mut response: Response<Bytes>) -> Response<Bytes> {
    response
        .headers_mut()
        .insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from_static("-1"));
    response
}

/// A Trailers-Only gRPC answer: `code`, `message` (percent-encoded as the
/// gRPC spec asks), an empty body.
pub(crate) fn status_response(code: u16, message: &str) -> Response<Bytes> {
    let mut response = Response::new(Bytes::new());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(GRPC_STATUS, code.into());
    if let Ok(message) = HeaderValue::from_str(&percent_encode(message)) {
        headers.insert(GRPC_MESSAGE, message);
    }
    response
}

/// A wait in whole milliseconds, rounded up (never `0` for a real wait).
pub(crate) fn pushback_ms(wait: Duration) -> u64 {
    let ms = wait.as_millis();
    let ms = ms + u128::from(!wait.subsec_nanos().is_multiple_of(1_000_000));
    u64::try_from(ms).unwrap_or(u64::MAX).max(1)
}

/// The `grpc-status-details-bin` value of a denial: a `google.rpc.Status`
/// with `code`, `message` and one detail, a `google.rpc.RetryInfo` whose
/// `retry_delay` is `wait`; protobuf, in unpadded base64 as gRPC sends
/// binary metadata.
///
/// Encoded by hand (five length-delimited or varint fields), so the layer
/// needs no protobuf runtime; `tests/http_grpc.rs` reads it back with
/// tonic-types through a real tonic client.
pub(crate) fn retry_details(code: u16, message: &str, wait: Duration) -> HeaderValue {
    let mut duration = Vec::with_capacity(16);
    varint_field(
        &mut duration,
        1,
        wait.as_secs().min(MAX_PROTO_DURATION_SECS),
    );
    varint_field(&mut duration, 2, u64::from(wait.subsec_nanos()));
    let mut retry_info = Vec::with_capacity(18);
    bytes_field(&mut retry_info, 1, &duration);
    let mut any = Vec::with_capacity(64);
    bytes_field(&mut any, 1, RETRY_INFO_TYPE_URL.as_bytes());
    bytes_field(&mut any, 2, &retry_info);
    let mut status = Vec::with_capacity(message.len() + 80);
    varint_field(&mut status, 1, u64::from(code));
    bytes_field(&mut status, 2, message.as_bytes());
    bytes_field(&mut status, 3, &any);
    let encoded = base64_unpadded(&status);
    // Base64 is visible ASCII, always a valid header value.
    HeaderValue::from_maybe_shared(Bytes::from(encoded))
        .unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// A protobuf varint.
fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        // The low 7 bits, with the continuation bit.
        out.push((value & 0x7f) as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A varint field (wire type 0).
fn varint_field(out: &mut Vec<u8>, field: u64, value: u64) {
    varint(out, field << 3);
    varint(out, value);
}

/// A length-delimited field (wire type 2).
fn bytes_field(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    varint(out, (field << 3) | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Standard base64 (RFC 4648) without padding.
fn base64_unpadded(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let group = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, &b)| acc | u32::from(b) << (16 - 8 * i));
        // A chunk of n bytes gives n + 1 characters.
        for i in 0..=chunk.len() {
            let index = (group >> (18 - 6 * i)) & 0x3f;
            out.push(char::from(ALPHABET[index as usize]));
        }
    }
    out
}

/// `grpc-message` encoding: bytes outside printable ASCII, and `%`, as
/// `%XX`.
fn percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for &b in message.as_bytes() {
        if (b' '..=b'~').contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_requests_are_recognised_by_content_type() {
        let mut headers = HeaderMap::new();
        assert!(!is_grpc(&headers));
        for (value, grpc) in [
            ("application/grpc", true),
            ("application/grpc+proto", true),
            ("application/json", false),
        ] {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static(value));
            assert_eq!(is_grpc(&headers), grpc, "{value}");
        }
    }

    #[test]
    fn the_layers_statuses_map_to_grpc_codes() {
        assert_eq!(code_of(StatusCode::TOO_MANY_REQUESTS), RESOURCE_EXHAUSTED);
        assert_eq!(code_of(StatusCode::BAD_REQUEST), INVALID_ARGUMENT);
        assert_eq!(code_of(StatusCode::SERVICE_UNAVAILABLE), UNAVAILABLE);
        assert_eq!(code_of(StatusCode::INTERNAL_SERVER_ERROR), INTERNAL);
        assert_eq!(code_of(StatusCode::IM_A_TEAPOT), UNKNOWN);
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(percent_encode("100% \"é\""), "100%25 \"%C3%A9\"");
    }

    #[test]
    fn base64_and_varints_match_their_specifications() {
        // RFC 4648's test vectors, padding dropped.
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg"),
            ("fo", "Zm8"),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg"),
            ("fooba", "Zm9vYmE"),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64_unpadded(plain.as_bytes()), encoded);
        }
        // The protobuf encoding guide's 150 and 300.
        let mut out = Vec::new();
        varint_field(&mut out, 1, 150);
        assert_eq!(out, [0x08, 0x96, 0x01]);
        out.clear();
        varint(&mut out, 300);
        assert_eq!(out, [0xac, 0x02]);
    }

    #[test]
    fn pushback_rounds_up_and_is_never_zero() {
        assert_eq!(pushback_ms(Duration::from_nanos(1)), 1);
        assert_eq!(pushback_ms(Duration::from_micros(1_500)), 2);
        assert_eq!(pushback_ms(Duration::from_secs(20)), 20_000);
        assert_eq!(pushback_ms(Duration::ZERO), 1);
        assert_eq!(pushback_ms(Duration::MAX), u64::MAX);
    }
}
