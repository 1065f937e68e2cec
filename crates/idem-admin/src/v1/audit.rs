//! The audit log: `GET /admin/v1/audit`.

use axum::Router;
use axum::extract::{Query, State};
use axum::response::Response;
use axum::routing::get;
use idem_core::admin::{AuditEntry, AuditFilter};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{V1, cursor, limit, param};
use crate::backend::AdminBackend;
use crate::respond::rfc3339;

/// The actions written to the audit log.
pub const ACTIONS: &[&str] = &[
    "keys.release",
    "outbox.requeue",
    "webhooks.replay",
    "runs.resolve",
    "runs.resume",
];

/// The routes.
pub fn routes<B: AdminBackend>() -> Router<V1<B>> {
    Router::new().route("/admin/v1/audit", get(list::<B>))
}

/// An audit row as JSON.
pub fn audit_json(e: &AuditEntry) -> Value {
    json!({
        "id": e.id,
        "at": rfc3339(e.at_ms),
        "actor": e.actor,
        "action": e.action,
        "target": e.target,
        "detail": serde_json::from_str::<Value>(&e.detail).unwrap_or_else(|_| json!({})),
        "idempotency_key": e.idempotency_key,
    })
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    action: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

async fn list<B: AdminBackend>(State(st): State<V1<B>>, Query(q): Query<ListQuery>) -> Response {
    let filter = (|| {
        Ok::<_, Response>(AuditFilter {
            action: param(
                q.action.as_deref(),
                "action",
                &format!("one of {}", ACTIONS.join(", ")),
                |s| ACTIONS.contains(&s).then(|| s.to_owned()),
            )?,
            before_id: cursor(q.cursor.as_deref())?,
            limit: limit(q.limit.as_deref())?,
        })
    })();
    let fetch = |f: AuditFilter| async move { st.store.list_audit(&f).await };
    super::list_page(filter, |f| f.limit, fetch, audit_json, |e| e.id).await
}
