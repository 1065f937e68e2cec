//! RFC 9457 problem responses with stable type URIs.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};

/// Base of every problem `type` URI Idem emits.
pub const TYPE_BASE: &str = "https://idem.dev/problems/";

/// A client-facing failure of the idempotency layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rejection {
    /// The route requires a key and none was sent (400).
    MissingKey,
    /// The key is empty, too long, not visible ASCII, or badly quoted (400).
    MalformedKey,
    /// The tenant could not be resolved (401).
    TenantUnresolved,
    /// The key was used with a different request (422).
    FingerprintMismatch,
    /// Another request with this key is running (409 + Retry-After).
    InFlight(Duration),
    /// The request body is over the limit (413).
    BodyTooLarge,
    /// The store cannot be reached (503 + Retry-After).
    StoreUnavailable(Duration),
    /// The response is over the capture limit; everything was rolled back (500).
    ResponseTooLarge,
    /// An internal failure; details are logged, not sent (500).
    Internal,
}

impl Rejection {
    /// `(status, slug, title)`.
    pub fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        match self {
            Self::MissingKey => (
                StatusCode::BAD_REQUEST,
                "missing-idempotency-key",
                "Idempotency-Key header is required",
            ),
            Self::MalformedKey => (
                StatusCode::BAD_REQUEST,
                "malformed-idempotency-key",
                "Idempotency-Key must be 1 to 255 visible ASCII characters",
            ),
            Self::TenantUnresolved => (
                StatusCode::UNAUTHORIZED,
                "tenant-unresolved",
                "The tenant could not be determined",
            ),
            Self::FingerprintMismatch => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency-key-reused",
                "Idempotency-Key was used with a different request",
            ),
            Self::InFlight(_) => (
                StatusCode::CONFLICT,
                "request-in-flight",
                "A request with this Idempotency-Key is still in progress",
            ),
            Self::BodyTooLarge => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "body-too-large",
                "Request body is too large",
            ),
            Self::StoreUnavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "store-unavailable",
                "The idempotency store is unavailable",
            ),
            Self::ResponseTooLarge => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "response-too-large",
                "The response was too large to store for replay",
            ),
            Self::Internal => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "Internal error",
            ),
        }
    }

    /// Renders the problem response.
    pub fn into_response<B: From<Bytes>>(self) -> Response<B> {
        let (status, slug, title) = self.parts();
        let retry = match self {
            Self::InFlight(d) | Self::StoreUnavailable(d) => Some(d.as_secs().max(1)),
            _ => None,
        };
        problem(status, slug, title, None, retry)
    }
}

/// Builds an `application/problem+json` response.
pub fn problem<B: From<Bytes>>(
    status: StatusCode,
    slug: &str,
    title: &str,
    detail: Option<&str>,
    retry_after_secs: Option<u64>,
) -> Response<B> {
    let mut body = serde_json::json!({
        "type": format!("{TYPE_BASE}{slug}"),
        "title": title,
        "status": status.as_u16(),
    });
    if let Some(detail) = detail {
        body["detail"] = detail.into();
    }
    let mut res = Response::new(B::from(Bytes::from(body.to_string())));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    if let Some(secs) = retry_after_secs {
        res.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    res
}
