//! The JSON shapes of stored webhook deliveries and of a replay's outcome,
//! which `/admin/v1/webhooks/…` ([`crate::v1::webhooks`]) answers and
//! `idem webhooks` prints too.

use axum::http::StatusCode;
use idem_core::webhooks::{Receipt, Requeue};
use serde_json::{Value, json};

use crate::respond::rfc3339;

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
