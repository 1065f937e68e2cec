//! RFC 9457 problem responses with stable type URIs.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use idem_core::{KeyError, StoreError};

/// Base of every problem `type` URI Idem emits.
pub const TYPE_BASE: &str = "https://idem.dev/problems/";

/// A client-facing failure of the idempotency layer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rejection {
    /// The route requires a key and none was sent (400).
    MissingKey,
    /// The key is empty, too long, not visible ASCII, or badly quoted (400);
    /// the detail says which.
    MalformedKey(KeyError),
    /// The key header was sent more than once (400, same type as a
    /// malformed key).
    KeySentTwice,
    /// The tenant could not be resolved (401).
    TenantUnresolved,
    /// The trusted tenant header was sent more than once (401, same type as
    /// an unresolved tenant): which one was meant is unknowable.
    TenantSentTwice,
    /// The key was used with a different request (422).
    FingerprintMismatch,
    /// Another request with this key is running (409 + Retry-After).
    InFlight(Duration),
    /// The request body is over the limit (413).
    BodyTooLarge,
    /// The request body could not be read: the client broke off or sent a
    /// malformed body (400).
    UnreadableBody,
    /// The store cannot be reached; nothing was written (503 + Retry-After).
    StoreUnavailable(Duration),
    /// `COMMIT` was sent but not acknowledged: the request may have taken
    /// effect. A retry with the same key replays it if it did and executes
    /// it if it did not (503 + Retry-After).
    OutcomeUnknown(Duration),
    /// The handler did not answer within the route's handler timeout; its
    /// writes were rolled back (503 + Retry-After).
    HandlerTimeout(Duration),
    /// The key's multi-step run is stopped at a step an operator must
    /// resolve (an effect whose outcome is unknown); nothing runs until then
    /// (409 + Retry-After).
    NeedsAttention(Duration),
    /// Every slot for running multi-step operations is taken; nothing was
    /// written (503 + Retry-After).
    AtCapacity(Duration),
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
            Self::MalformedKey(_) | Self::KeySentTwice => (
                StatusCode::BAD_REQUEST,
                "malformed-idempotency-key",
                "Idempotency-Key must be 1 to 255 visible ASCII characters",
            ),
            Self::TenantUnresolved | Self::TenantSentTwice => (
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
            Self::UnreadableBody => (
                StatusCode::BAD_REQUEST,
                "unreadable-body",
                "The request body could not be read",
            ),
            Self::StoreUnavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "store-unavailable",
                "The idempotency store is unavailable",
            ),
            Self::OutcomeUnknown(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "outcome-unknown",
                "The outcome of the request is unknown",
            ),
            Self::HandlerTimeout(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "handler-timeout",
                "The request did not finish in time",
            ),
            Self::NeedsAttention(_) => (
                StatusCode::CONFLICT,
                "needs-attention",
                "The request is waiting for an operator",
            ),
            Self::AtCapacity(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "at-capacity",
                "The server is running as many operations as it may",
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

    /// What the client should know beyond the title, if anything.
    pub fn detail(&self) -> Option<String> {
        Some(match self {
            Self::MalformedKey(e) => e.to_string(),
            Self::KeySentTwice => "Idempotency-Key was sent more than once".into(),
            Self::TenantSentTwice => "the tenant header was sent more than once".into(),
            Self::TenantUnresolved => "no tenant for this request: send the credentials the \
                service expects. (To the service's developer: the layer takes the tenant from \
                its RouteConfig's TenantSource: Static, Extension, a Tenant request extension \
                your authentication middleware sets outside the layer, or TrustedHeader.)"
                .into(),
            Self::StoreUnavailable(_) => "nothing was written; retry later".into(),
            Self::OutcomeUnknown(_) => "the commit was sent to the database but not acknowledged: \
                the request may or may not have taken effect; retry with the same \
                Idempotency-Key to get its outcome"
                .into(),
            Self::NeedsAttention(_) => "a step of this request cannot go on by itself (its \
                outcome is unknown, or it failed where it may not be undone); an operator \
                resolves it, and then the request finishes and its answer is replayed to this \
                Idempotency-Key"
                .into(),
            Self::AtCapacity(_) => "nothing was written; retry later".into(),
            Self::HandlerTimeout(d) => format!(
                "the handler did not answer within {} s; its writes were rolled back; \
                 retrying with the same Idempotency-Key is safe",
                d.as_secs().max(1)
            ),
            _ => return None,
        })
    }

    /// The `Retry-After` seconds this rejection carries, if any.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            Self::InFlight(d)
            | Self::StoreUnavailable(d)
            | Self::OutcomeUnknown(d)
            | Self::NeedsAttention(d)
            | Self::AtCapacity(d) => Some(d.as_secs().max(1)),
            Self::HandlerTimeout(_) => Some(1),
            _ => None,
        }
    }

    /// The answer to a store error: 503 `outcome-unknown` when a write was
    /// sent and not acknowledged, 503 `store-unavailable` when a retry can
    /// succeed, 500 otherwise. Logged with its sources, never sent. (A value
    /// the database refused is the caller's input: see [`store_problem`].)
    pub fn for_store(e: &StoreError) -> Rejection {
        let error = e as &(dyn std::error::Error + 'static);
        match e {
            StoreError::OutcomeUnknown { .. } => {
                tracing::warn!(
                    error,
                    "a write was sent and not acknowledged; outcome unknown"
                );
                Rejection::OutcomeUnknown(Duration::from_secs(1))
            }
            e if e.retryable() => {
                tracing::warn!(error, "store unavailable");
                Rejection::StoreUnavailable(Duration::from_secs(1))
            }
            _ => {
                tracing::error!(error, "store failed");
                Rejection::Internal
            }
        }
    }

    /// Renders the problem response.
    pub fn into_response<B: From<Bytes>>(self) -> Response<B> {
        let (status, slug, title) = self.parts();
        problem(
            status,
            slug,
            title,
            self.detail().as_deref(),
            self.retry_after(),
        )
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
    let mut res = problem_with(status, slug, title, detail, serde_json::Map::new());
    if let Some(secs) = retry_after_secs {
        res.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    res
}

/// Builds an `application/problem+json` response with members of its own
/// (RFC 9457 extensions: where a cursor is, a task's fence); they never
/// replace `type`, `title`, `status` or `detail`.
pub fn problem_with<B: From<Bytes>>(
    status: StatusCode,
    slug: &str,
    title: &str,
    detail: Option<&str>,
    extensions: serde_json::Map<String, serde_json::Value>,
) -> Response<B> {
    let mut body = extensions;
    body.insert("type".into(), format!("{TYPE_BASE}{slug}").into());
    body.insert("title".into(), title.into());
    body.insert("status".into(), status.as_u16().into());
    match detail {
        Some(detail) => body.insert("detail".into(), detail.into()),
        None => body.remove("detail"),
    };
    let mut res = Response::new(B::from(Bytes::from(
        serde_json::Value::Object(body).to_string(),
    )));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    res
}

/// A store error in a handler or a route of your own: 400 `invalid-request`
/// when the database refused a value the client sent, else
/// [`Rejection::for_store`]'s answer.
pub fn store_problem<B: From<Bytes>>(e: StoreError) -> Response<B> {
    if let StoreError::InvalidValue { .. } = e {
        tracing::info!(
            error = &e as &(dyn std::error::Error + 'static),
            "the database refused a value of the request"
        );
        return problem(
            StatusCode::BAD_REQUEST,
            "invalid-request",
            "The request is invalid",
            Some("a value is not acceptable"),
            None,
        );
    }
    Rejection::for_store(&e).into_response()
}
