//! `application/problem+json` (RFC 9457) bodies for the responses the layer
//! writes itself: 429, a refused key, a limiter that failed.

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};

/// The media type of the bodies.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// A problem response: `status`, and a body with `type` `about:blank`, the
/// status's reason as `title`, `detail`, and `extra` members.
pub(crate) fn response<B: From<Bytes>>(
    status: StatusCode,
    detail: &str,
    extra: serde_json::Map<String, serde_json::Value>,
) -> Response<B> {
    let mut body = serde_json::Map::new();
    body.insert("type".into(), "about:blank".into());
    body.insert(
        "title".into(),
        status.canonical_reason().unwrap_or("Error").into(),
    );
    body.insert("status".into(), status.as_u16().into());
    body.insert("detail".into(), detail.into());
    body.extend(extra);
    // Serialising a Value cannot fail (its keys are strings).
    let bytes = serde_json::to_vec(&serde_json::Value::Object(body)).unwrap_or_default();
    let mut response = Response::new(B::from(Bytes::from(bytes)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    response
}
