//! Stored webhook deliveries: `GET /admin/webhooks`, `GET
//! /admin/webhooks/receipt`, `POST /admin/webhooks/replay`, `GET
//! /admin/webhooks/stats`, and the JSON shapes `idem webhooks` prints too.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post};
use idem_core::webhooks::{Receipt, ReceiptState, Requeue, WebhookStore};
use idem_core::{Clock, KeyStore, SharedClock};
use idem_webhooks::{Endpoint, Receiver, find_receipt, replay_receipt};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::respond::{db_error, invalid, json_response, not_found, ok, rfc3339};

/// A receipt as JSON; with `body`, the body too (as text when it is UTF-8).
pub fn receipt_json(r: &Receipt, body: bool) -> Value {
    let mut v = json!({
        "endpoint": r.receipt.endpoint,
        "delivery_id": r.receipt.delivery_id,
        "event_type": r.receipt.event_type,
        "state": r.state.as_str(),
        "attempts": r.attempts,
        "last_error": r.last_error,
        "entity_id": r.receipt.entity_id,
        "entity_version": r.receipt.entity_version,
        "received_at": rfc3339(r.received_at_ms),
        "finished_at": r.finished_at_ms.map(rfc3339),
    });
    if body {
        // Receipts stored before signatures were filtered out on receipt
        // still hold them: never show them.
        let headers: Vec<&(String, String)> = r
            .receipt
            .headers
            .iter()
            .filter(|(n, _)| !idem_webhooks::is_secret_header(n))
            .collect();
        v["headers"] = json!(headers);
        v["body"] = match std::str::from_utf8(&r.receipt.body) {
            Ok(s) => json!(s),
            Err(_) => json!(null),
        };
        v["body_bytes"] = json!(r.receipt.body.len());
    }
    v
}

/// What a replay did, as JSON.
pub fn replay_json(endpoint: &str, delivery: &str, outcome: Requeue) -> (StatusCode, Value) {
    let (status, result, message) = match outcome {
        Requeue::Requeued => (
            StatusCode::ACCEPTED,
            "requeued",
            "the delivery will be processed again".to_owned(),
        ),
        Requeue::AlreadyQueued => (
            StatusCode::OK,
            "already_queued",
            "the delivery is waiting for a worker".to_owned(),
        ),
        Requeue::AlreadyFinished(s) => (
            StatusCode::OK,
            "no_op",
            format!("the delivery is {s}; replaying it would apply it twice, so nothing was done"),
        ),
        Requeue::NotFound => (
            StatusCode::NOT_FOUND,
            "not_found",
            "no such delivery".to_owned(),
        ),
    };
    (
        status,
        json!({"endpoint": endpoint, "delivery_id": delivery, "result": result, "message": message}),
    )
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    endpoint: Option<String>,
    state: Option<String>,
    limit: Option<u32>,
}

#[derive(Debug, Deserialize)]
struct OneQuery {
    endpoint: String,
    delivery: String,
}

type St<S> = (S, Arc<Receiver<S, SharedClock>>);

async fn list<S: WebhookStore>(
    State((store, _)): State<St<S>>,
    Query(q): Query<ListQuery>,
) -> Response {
    let state = match q.state.as_deref().map(ReceiptState::parse) {
        Some(None) => {
            return invalid("state must be received, processed, failed, dead or stale");
        }
        Some(s) => s,
        None => None,
    };
    if q.endpoint
        .as_deref()
        .is_some_and(|e| !Endpoint::valid_name(e))
    {
        return invalid("endpoint must be 1 to 64 characters of [A-Za-z0-9_-]");
    }
    let limit = q.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return invalid("limit must be between 1 and 1000");
    }
    match store
        .list_receipts(q.endpoint.as_deref(), state, limit)
        .await
    {
        Ok(rs) => {
            ok(&json!({"data": rs.iter().map(|r| receipt_json(r, false)).collect::<Vec<_>>()}))
        }
        Err(e) => db_error(e),
    }
}

async fn show<S: WebhookStore>(
    State((store, _)): State<St<S>>,
    Query(q): Query<OneQuery>,
) -> Response {
    match find_receipt(&store, &q.endpoint, &q.delivery).await {
        Ok(Some(r)) => ok(&receipt_json(&r, true)),
        Ok(None) => not_found("No such delivery"),
        Err(e) => db_error(e),
    }
}

async fn replay<S: WebhookStore + KeyStore>(
    State((store, _)): State<St<S>>,
    Query(q): Query<OneQuery>,
) -> Response {
    // Requeued by the clock the workers' claims are judged by.
    let now = store.clock().now_ms();
    match replay_receipt(&store, &q.endpoint, &q.delivery, now).await {
        Ok((delivery, outcome)) => {
            let (status, body) = replay_json(&q.endpoint, &delivery, outcome);
            json_response(status, &body, None, None)
        }
        Err(e) => db_error(e),
    }
}

async fn stats<S: WebhookStore>(State((_, receiver)): State<St<S>>) -> Response {
    let counters: serde_json::Map<String, Value> = receiver
        .counters()
        .map(|(name, c)| {
            (
                name.to_owned(),
                json!({
                    "accepted": c.accepted.load(Ordering::Relaxed),
                    "duplicates": c.duplicates.load(Ordering::Relaxed),
                    "rejected_signature": c.rejected_signature.load(Ordering::Relaxed),
                    "too_large": c.too_large.load(Ordering::Relaxed),
                }),
            )
        })
        .collect();
    ok(&Value::Object(counters))
}

/// The webhook admin routes over `store`, with `receiver`'s counters.
pub fn router<S: WebhookStore + KeyStore>(
    store: S,
    receiver: Arc<Receiver<S, SharedClock>>,
) -> Router {
    Router::new()
        .route("/admin/webhooks", get(list::<S>))
        .route("/admin/webhooks/receipt", get(show::<S>))
        .route("/admin/webhooks/replay", post(replay::<S>))
        .route("/admin/webhooks/stats", get(stats::<S>))
        .with_state((store, receiver))
}
