//! `POST /webhooks/{endpoint}` as an axum route (feature `axum`): body limit
//! → verify → dedupe → persist → `202`, with problem+json errors.
//!
//! ```no_run
//! # async fn demo<S: idem_core::webhooks::WebhookStore>(store: S, endpoints: Vec<idem_webhooks::Endpoint>) {
//! use std::sync::Arc;
//! let receiver = Arc::new(idem_webhooks::Receiver::new(store, endpoints));
//! let app: axum::Router = idem_webhooks::route::router(receiver);
//! # }
//! ```

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use axum::routing::post;
use idem_core::Clock;
use idem_core::webhooks::WebhookStore;
use idem_http::Rejection;

use crate::receiver::{ReceiveError, Received, Receiver};

fn problem(status: StatusCode, slug: &str, title: &str) -> Response {
    idem_http::problem(status, slug, title, None, None)
}

fn unknown_endpoint() -> Response {
    problem(
        StatusCode::NOT_FOUND,
        "unknown-endpoint",
        "No such webhook endpoint",
    )
}

fn accepted(status: StatusCode, outcome: &str, delivery_id: &str) -> Response {
    let body = serde_json::json!({"status": outcome, "delivery_id": delivery_id});
    let mut res = Response::new(Body::from(body.to_string()));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res
}

/// Slack's handshake answered as its documentation shows:
/// `200 {"challenge":"…"}`.
fn challenge_answer(challenge: &str) -> Response {
    let body = serde_json::json!({ "challenge": challenge });
    let mut res = Response::new(Body::from(body.to_string()));
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res
}

async fn receive<S: WebhookStore, C: Clock>(
    State(receiver): State<Arc<Receiver<S, C>>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let Some(endpoint) = receiver.endpoint(&name) else {
        return unknown_endpoint();
    };
    // A body announced over the endpoint's limit is refused unread, one
    // that grows past it while read is cut: a large body is never buffered.
    let body = match idem_http::read_body(body, endpoint.max_body_bytes).await {
        Ok(b) => b,
        Err(Rejection::BodyTooLarge) => {
            receiver.note_too_large(&name);
            return Rejection::BodyTooLarge.into_response();
        }
        Err(_) => {
            return problem(
                StatusCode::BAD_REQUEST,
                "unreadable-body",
                "The request body could not be read",
            );
        }
    };
    match receiver.receive(&name, &headers, &body).await {
        Ok(Received::New { delivery_id }) => {
            accepted(StatusCode::ACCEPTED, "accepted", &delivery_id)
        }
        Ok(Received::Duplicate { delivery_id }) => {
            accepted(StatusCode::OK, "duplicate", &delivery_id)
        }
        Ok(Received::Challenge { challenge }) => challenge_answer(&challenge),
        Err(ReceiveError::BadChallenge) => problem(
            StatusCode::BAD_REQUEST,
            "invalid-challenge",
            "The url_verification request has no usable challenge",
        ),
        // One answer for every forgery: which check failed, or by how much a
        // timestamp missed, would help a forger. The receiver logs the
        // reason (rate-limited).
        Err(ReceiveError::Signature(_)) => problem(
            StatusCode::UNAUTHORIZED,
            "invalid-signature",
            "The webhook signature did not verify",
        ),
        Err(ReceiveError::TooLarge { .. }) => Rejection::BodyTooLarge.into_response(),
        Err(ReceiveError::UnknownEndpoint) => unknown_endpoint(),
        Err(ReceiveError::Store(e)) => idem_http::store_problem(e),
    }
}

/// `POST /webhooks/{endpoint}` for every endpoint of `receiver`.
pub fn router<S: WebhookStore, C: Clock>(receiver: Arc<Receiver<S, C>>) -> Router {
    Router::new()
        .route("/webhooks/{endpoint}", post(receive::<S, C>))
        .with_state(receiver)
}
