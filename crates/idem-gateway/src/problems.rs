//! The gateway's own answers, as RFC 9457 problems with the stable type
//! URIs of `idem_http` (`https://idem.dev/problems/<slug>`).

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use idem_core::leased::OnUnknown;
use idem_http::{Rejection, RequestOutcome};

/// A problem with `detail`, and `Retry-After` in seconds when given.
pub fn problem(
    status: StatusCode,
    slug: &str,
    title: &str,
    detail: &str,
    retry_after: Option<u64>,
) -> Response {
    let mut res = idem_http::problem::<Body>(status, slug, title, Some(detail), None);
    if let Some(secs) = retry_after
        && let Ok(v) = HeaderValue::from_str(&secs.max(1).to_string())
    {
        res.headers_mut().insert(header::RETRY_AFTER, v);
    }
    res
}

/// A rejection of the HTTP layer's contract, marked with its outcome.
pub fn reject(rejection: Rejection) -> Response {
    RequestOutcome::of(&rejection).mark(rejection.into_response())
}

/// What an unknown outcome means for the client's retry, by policy (and,
/// on a `verify` route, whether its lookup failed or found nothing).
pub fn unknown_then(policy: OnUnknown, landing_secs: u64, lookup_failed: bool) -> String {
    match policy {
        OnUnknown::Reject => "the upstream may have acted on the request; this route keeps the \
             key, so a retry gets 409 outcome-unknown until an operator resolves it (idem keys \
             resolve) — nothing is forwarded again by itself"
            .into(),
        OnUnknown::Verify if lookup_failed => format!(
            "the upstream may have acted on the request and its lookup failed; a retry with the \
             same Idempotency-Key asks the upstream again, gets the result if it landed, and \
             forwards the request again only once it is known it did not (not before {landing_secs} s)"
        ),
        OnUnknown::Verify => format!(
            "the upstream may have acted on the request and its lookup has not found it (yet); \
             a retry with the same Idempotency-Key asks the upstream again, gets the result if \
             it landed, and forwards the request again only once it is known it did not (after \
             {landing_secs} s)"
        ),
        OnUnknown::Reforward => "the upstream may have acted on the request; a retry with the \
             same Idempotency-Key forwards it again with the same derived key, which this \
             upstream deduplicates"
            .into(),
    }
}

/// 409 `outcome-unknown` to a retry: the first forward's outcome is
/// unknown. A `reject` route waits for an operator (no `Retry-After`); a
/// `verify` route verifies again after `retry_after`.
pub fn outcome_unknown(policy: OnUnknown, retry_after: Option<u64>) -> Response {
    let detail = match policy {
        OnUnknown::Verify => {
            "an earlier request with this Idempotency-Key was forwarded and its answer was lost; \
             the upstream's lookup has not found it (yet), and it may still land there: retry \
             later, and you get its result, or it is forwarded again once it is known it did not \
             land"
        }
        _ => {
            "an earlier request with this Idempotency-Key was forwarded and its answer was lost; \
             this route does not forward it again by itself: an operator resolves it (idem keys \
             resolve), and then retries get the resolution"
        }
    };
    let res = problem(
        StatusCode::CONFLICT,
        "outcome-unknown",
        "The outcome of the request is unknown",
        detail,
        retry_after,
    );
    RequestOutcome::OutcomeUnknown.mark(res)
}

/// 409 `request-in-flight`: the upstream says an earlier attempt with the
/// key is still running there; nothing stored.
pub fn upstream_in_progress(status: u16, retry_after: u64) -> Response {
    let res = problem(
        StatusCode::CONFLICT,
        "request-in-flight",
        "A request with this Idempotency-Key is in progress",
        &format!(
            "the upstream answered {status}: an earlier attempt with this key is still running \
             there; nothing was stored, so a retry after the given time gets the upstream's real \
             answer"
        ),
        Some(retry_after),
    );
    RequestOutcome::InFlight.mark(res)
}

/// 503 `gateway-busy`: the answer bytes the gateway may hold are taken;
/// nothing was sent.
pub fn busy() -> Response {
    let res = problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "gateway-busy",
        "The gateway is busy",
        "the gateway holds as many answer bytes as it may (max_held_bytes); nothing was sent \
         upstream; retry later",
        Some(1),
    );
    RequestOutcome::AtCapacity.mark(res)
}

/// 400: a `verify` route's request lacks the value its lookup needs.
pub fn unverifiable(why: &str) -> Response {
    let res = problem(
        StatusCode::BAD_REQUEST,
        "unverifiable-request",
        "The request cannot be verified",
        &format!("{why}; nothing was sent"),
        None,
    );
    RequestOutcome::UnreadableBody.mark(res)
}

/// 400 `invalid-path`: a path whose `..` climbs above the root (an
/// upstream with a base path reads it outside what the routes name), or
/// that upstreams may read differently (a control character, a bad escape).
pub fn invalid_path(why: &str) -> Response {
    let res = problem(
        StatusCode::BAD_REQUEST,
        "invalid-path",
        "The path is not valid",
        &format!("{why}; nothing was sent"),
        None,
    );
    RequestOutcome::UnreadableBody.mark(res)
}
