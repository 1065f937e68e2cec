//! Responses every route of the server shares: JSON bodies, problem
//! documents for bad input, and the mapping of a store error to its answer.

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use idem_core::{ResourceRef, StoreError};
use serde::Serialize;

/// A JSON answer, with a `Location` and the resource the key layer records.
/// `body` is a [`serde_json::Value`], or a view that writes stored JSON as
/// it is (a task's payload: no number through an `f64`).
pub fn json_response<T: Serialize + ?Sized>(
    status: StatusCode,
    body: &T,
    location: Option<String>,
    resource: Option<ResourceRef>,
) -> Response {
    let text = match serde_json::to_string(body) {
        Ok(text) => text,
        Err(e) => return internal(e),
    };
    let mut res = (status, [(header::CONTENT_TYPE, "application/json")], text).into_response();
    if let Some(loc) = location.and_then(|l| HeaderValue::try_from(l).ok()) {
        res.headers_mut().insert(header::LOCATION, loc);
    }
    if let Some(r) = resource {
        res.extensions_mut().insert(r);
    }
    res
}

/// `200` with a JSON body.
pub fn ok<T: Serialize + ?Sized>(body: &T) -> Response {
    json_response(StatusCode::OK, body, None, None)
}

/// A problem document without `Retry-After`.
pub fn problem(status: StatusCode, slug: &str, title: &str, detail: Option<&str>) -> Response {
    idem_http::problem(status, slug, title, detail, None)
}

/// `400 invalid-request`.
pub fn invalid(detail: &str) -> Response {
    problem(
        StatusCode::BAD_REQUEST,
        "invalid-request",
        "The request is invalid",
        Some(detail),
    )
}

/// `404 not-found`, naming what is missing (`No such payment`).
pub fn not_found(title: &str) -> Response {
    problem(StatusCode::NOT_FOUND, "not-found", title, None)
}

/// `500 internal`; the error is logged, never sent.
pub fn internal(e: impl std::fmt::Display) -> Response {
    tracing::error!(error = %e, "handler failed");
    internal_problem()
}

fn internal_problem() -> Response {
    problem(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "Internal error",
        None,
    )
}

/// A store error in a route: [`idem_http::store_problem`] (400 for a value
/// the database refused, 503 when a retry can succeed or the outcome is
/// unknown, 500 otherwise), the one mapping the layer and the webhook route
/// use too.
pub fn db_error(e: StoreError) -> Response {
    idem_http::store_problem(e)
}

/// A read, bounded: past `limit` it is abandoned and the client gets 503
/// `store-unavailable` (a read writes nothing) instead of waiting on a
/// database that went silent.
pub async fn within<T>(
    limit: Duration,
    read: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, Response> {
    match tokio::time::timeout(limit, read).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(db_error(e)),
        Err(_) => {
            tracing::warn!(?limit, "the database did not answer a read in time");
            Err(idem_http::Rejection::StoreUnavailable(Duration::from_secs(1)).into_response())
        }
    }
}

/// A write that ends in its `COMMIT`, bounded: past `limit` it is abandoned
/// and the client gets 503 `outcome-unknown` (the commit may have been sent
/// and applied; a read's "nothing was written" would be a guess).
pub async fn written_within<T>(
    limit: Duration,
    write: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, Response> {
    match tokio::time::timeout(limit, write).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(db_error(e)),
        Err(_) => {
            tracing::warn!(?limit, "the database did not answer a write in time");
            Err(db_error(StoreError::OutcomeUnknown {
                source: format!("no answer within {limit:?}").into(),
            }))
        }
    }
}

/// The last millisecond RFC 3339 can write (9999-12-31T23:59:59.999Z).
const RFC3339_MAX_MS: i64 = 253_402_300_799_999;

/// A timestamp in milliseconds as RFC 3339 (`2026-12-03T13:19:26.000Z`);
/// one past year 9999 (a record that never expires) is written as its last
/// millisecond (formatting it would fail).
pub fn rfc3339(ms: i64) -> String {
    let ms = ms.clamp(0, RFC3339_MAX_MS);
    let t = std::time::UNIX_EPOCH + Duration::from_millis(ms as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

/// An answer a browser renders (a page, its script or stylesheet, an
/// embedded file): `csp` as its Content-Security-Policy, `cache` as its
/// Cache-Control, no sniffing, no framing, the referrer kept to this
/// origin.
pub fn for_browser(mut res: Response, csp: &'static str, cache: &'static str) -> Response {
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(csp),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    res
}

/// A file embedded in the binary, served [`for_browser`].
pub fn embedded(
    content_type: &'static str,
    body: &'static str,
    csp: &'static str,
    cache: &'static str,
) -> Response {
    for_browser(
        ([(header::CONTENT_TYPE, content_type)], body).into_response(),
        csp,
        cache,
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339_is_total() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(super::rfc3339(-5), "1970-01-01T00:00:00.000Z");
        assert_eq!(super::rfc3339(i64::MAX), "9999-12-31T23:59:59.999Z");
    }
}
