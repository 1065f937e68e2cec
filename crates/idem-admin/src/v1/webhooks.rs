//! Webhook receipts: `GET /admin/v1/webhooks/receipts`, `GET
//! /admin/v1/webhooks/receipt`, `POST /admin/v1/webhooks/replay`; and `GET
//! /admin/v1/webhooks/stats`, the counters of a [`Receiver`] running in this
//! process ([`stats_routes`], mounted where the receiver is).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Extension, Router};
use idem_core::SharedClock;
use idem_core::admin::ReceiptFilter;
use idem_core::webhooks::{ReceiptState, Requeue, WebhookStore};
use idem_http::IdemTx;
use idem_webhooks::{Endpoint, Receiver, delivery_forms, find_receipt};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::{Audit, V1, action, cursor, limit, param, read, record, required, text};
use crate::auth::Actor;
use crate::backend::AdminBackend;
use crate::respond::{db_error, internal, json_response, not_found, ok};
use crate::webhooks::{receipt_json, replay_json};

const ENDPOINT: &str = "an endpoint name: 1 to 64 characters of [A-Za-z0-9_-]";
const DELIVERY: &str = "a delivery id, 1 to 255 characters";

fn endpoint(s: &str) -> Option<String> {
    Endpoint::valid_name(s).then(|| s.to_owned())
}

/// The routes.
pub fn routes<B: AdminBackend>(store: &B) -> Router<V1<B>> {
    Router::new()
        .route("/admin/v1/webhooks/receipts", get(list::<B>))
        .route("/admin/v1/webhooks/receipt", get(show::<B>))
        .route(
            "/admin/v1/webhooks/replay",
            post(replay::<B>).layer(action(store, "webhooks.replay")),
        )
}

/// `GET /admin/v1/webhooks/stats`: per endpoint of `receiver`, the
/// deliveries it `accepted`, the `duplicates`, those refused with a bad
/// signature (`rejected_signature`) and those over the body limit
/// (`too_large`), since this process started. An object keyed by endpoint
/// name; `{}` when no endpoint is configured.
pub fn stats_routes<S: WebhookStore>(receiver: Arc<Receiver<S, SharedClock>>) -> Router {
    async fn stats<S: WebhookStore>(
        State(receiver): State<Arc<Receiver<S, SharedClock>>>,
    ) -> Response {
        let counters: Map<String, Value> = receiver
            .counters()
            .map(|(name, c)| {
                let n = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
                (
                    name.to_owned(),
                    json!({
                        "accepted": n(&c.accepted),
                        "duplicates": n(&c.duplicates),
                        "rejected_signature": n(&c.rejected_signature),
                        "too_large": n(&c.too_large),
                    }),
                )
            })
            .collect();
        ok(&Value::Object(counters))
    }
    Router::new()
        .route("/admin/v1/webhooks/stats", get(stats::<S>))
        .with_state(receiver)
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    endpoint: Option<String>,
    state: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

async fn list<B: AdminBackend>(State(st): State<V1<B>>, Query(q): Query<ListQuery>) -> Response {
    let filter = (|| {
        Ok::<_, Response>(ReceiptFilter {
            endpoint: param(q.endpoint.as_deref(), "endpoint", ENDPOINT, endpoint)?,
            state: param(
                q.state.as_deref(),
                "state",
                "received, processed, failed, dead or stale",
                ReceiptState::parse,
            )?,
            before_id: cursor(q.cursor.as_deref())?,
            limit: limit(q.limit.as_deref())?,
        })
    })();
    let fetch = |f: ReceiptFilter| async move { st.store.list_receipts_page(&f).await };
    super::list_page(
        filter,
        |f| f.limit,
        fetch,
        |r| receipt_json(r, false),
        |r| r.id,
    )
    .await
}

#[derive(Debug, Deserialize)]
struct OneQuery {
    endpoint: Option<String>,
    delivery_id: Option<String>,
}

async fn show<B: AdminBackend>(State(st): State<V1<B>>, Query(q): Query<OneQuery>) -> Response {
    let (ep, delivery) = match (
        required(q.endpoint.as_deref(), "endpoint", ENDPOINT, endpoint),
        required(q.delivery_id.as_deref(), "delivery_id", DELIVERY, text),
    ) {
        (Ok(e), Ok(d)) => (e, d),
        (Err(r), _) | (_, Err(r)) => return r,
    };
    match read(find_receipt(&st.store, &ep, &delivery)).await {
        Ok(Some(r)) => ok(&receipt_json(&r, true)),
        Ok(None) => not_found("No such delivery"),
        Err(r) => r,
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayBody {
    endpoint: String,
    delivery_id: String,
}

async fn replay<B: AdminBackend>(
    State(st): State<V1<B>>,
    Extension(tx): Extension<IdemTx<B::Tx>>,
    actor: Option<Extension<Actor>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let b: ReplayBody = match super::body(&body) {
        Ok(b) => b,
        Err(r) => return r,
    };
    if endpoint(&b.endpoint).is_none() {
        return crate::respond::invalid(&format!("endpoint: {ENDPOINT}"));
    }
    if text(&b.delivery_id).is_none() {
        return crate::respond::invalid(&format!("delivery_id: {DELIVERY}"));
    }
    let Ok(mut tx) = tx.lock().await else {
        return internal("transaction finished");
    };
    let now = super::now_ms(&st.store);
    let mut found = None;
    for id in delivery_forms(&b.endpoint, &b.delivery_id) {
        match B::replay_receipt_in(&mut tx, &b.endpoint, &id, now).await {
            Ok(Requeue::NotFound) => {}
            Ok(outcome) => {
                found = Some((id, outcome));
                break;
            }
            Err(e) => return db_error(e),
        }
    }
    let Some((delivery, outcome)) = found else {
        return not_found("No such delivery");
    };
    let (status, answer) = replay_json(&b.endpoint, &delivery, outcome);
    let audit = Audit {
        action: "webhooks.replay",
        target: format!("{}/{}", b.endpoint, delivery),
        detail: json!({"endpoint": b.endpoint, "delivery_id": delivery,
                       "result": answer["result"]}),
    };
    if let Err(r) = record::<B>(&mut tx, actor.as_ref().map(|a| &a.0), &headers, audit).await {
        return r;
    }
    json_response(status, &answer, None, None)
}
