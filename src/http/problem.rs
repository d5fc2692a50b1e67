//! `application/problem+json` (RFC 9457) bodies for the responses the layer
//! writes itself: 429, a refused key, a limiter that failed.

use std::fmt::Write;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};

/// The media type of the bodies.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// What a body adds to the standard members, after `detail`.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Members<'a> {
    /// A 429: the binding policy and `Retry-After`, in seconds.
    Throttled { policy: &'a str, retry_after: u64 },
    /// A cost above a policy's capacity: no wait can meet it.
    TooCostly {
        policy: &'a str,
        cost: u64,
        capacity: u64,
    },
}

/// A problem response: `status`, and a body with `type` `about:blank`, the
/// status's reason as `title`, `status`, `detail`, and the `members` of a
/// 429 (`policy`, `retry_after`) or of a cost that can never be met
/// (`policy`, `cost`, `capacity`). Written directly (strings escaped by serde_json), in
/// the RFC's member order; a refused request costs no JSON tree.
pub(crate) fn response(
    status: StatusCode,
    detail: &str,
    members: Option<Members<'_>>,
) -> Response<Bytes> {
    let title = status.canonical_reason().unwrap_or("Error");
    let mut body = String::with_capacity(128 + detail.len());
    let _ = write!(
        body,
        "{{\"type\":\"about:blank\",\"title\":{},\"status\":{},\"detail\":{}",
        json_string(title),
        status.as_u16(),
        json_string(detail),
    );
    match members {
        Some(Members::Throttled {
            policy,
            retry_after,
        }) => {
            let _ = write!(
                body,
                ",\"policy\":{},\"retry_after\":{retry_after}",
                json_string(policy)
            );
        }
        Some(Members::TooCostly {
            policy,
            cost,
            capacity,
        }) => {
            let _ = write!(
                body,
                ",\"policy\":{},\"cost\":{cost},\"capacity\":{capacity}",
                json_string(policy)
            );
        }
        None => {}
    }
    body.push('}');
    let mut response = Response::new(Bytes::from(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    response
}

/// `s` as a JSON string literal, quoted and escaped.
fn json_string(s: &str) -> serde_json::Value {
    serde_json::Value::String(s.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_json_with_escaped_strings() {
        let response = response(
            StatusCode::TOO_MANY_REQUESTS,
            "say \"hi\"\n",
            Some(Members::Throttled {
                policy: "a\\b",
                retry_after: 7,
            }),
        );
        assert_eq!(response.headers()[CONTENT_TYPE], PROBLEM_JSON);
        let body = response.body();
        assert_eq!(
            std::str::from_utf8(body).unwrap(),
            r#"{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"say \"hi\"\n","policy":"a\\b","retry_after":7}"#
        );
        let parsed: serde_json::Value = serde_json::from_slice(body).unwrap();
        assert_eq!(parsed["detail"], "say \"hi\"\n");
    }
}
