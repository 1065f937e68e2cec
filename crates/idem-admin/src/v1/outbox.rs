//! The outbox and the inbox: `GET /admin/v1/outbox`, `GET
//! /admin/v1/outbox/messages`, `POST /admin/v1/outbox/requeue`, `GET
//! /admin/v1/inbox`, `GET /admin/v1/inbox/messages`.

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Extension, Router};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use idem_core::admin::{
    InboxEntry, InboxFilter, OutboxEntry, OutboxFilter, OutboxRequeue, OutboxState,
};
use idem_http::IdemTx;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Audit, V1, action, conflict, cursor, limit, param, read, record, required, text};
use crate::auth::Actor;
use crate::backend::AdminBackend;
use crate::respond::{db_error, internal, not_found, ok, rfc3339};

/// The routes.
pub fn routes<B: AdminBackend>(store: &B) -> Router<V1<B>> {
    Router::new()
        .route("/admin/v1/outbox", get(figures::<B>))
        .route("/admin/v1/outbox/messages", get(messages::<B>))
        .route(
            "/admin/v1/outbox/requeue",
            post(requeue::<B>).layer(action(store, "outbox.requeue")),
        )
        .route("/admin/v1/inbox", get(inbox_one::<B>))
        .route("/admin/v1/inbox/messages", get(inbox_list::<B>))
}

/// An outbox message as JSON: the payload as text when it is UTF-8, else
/// base64.
pub fn message_json(m: &OutboxEntry) -> Value {
    let text = std::str::from_utf8(&m.payload).ok();
    json!({
        "id": m.id,
        "message_id": m.message_id,
        "topic": m.topic,
        "message_key": m.message_key,
        "state": m.state.as_str(),
        "attempts": m.attempts,
        "last_error": m.last_error,
        "created_at": rfc3339(m.created_at_ms),
        "available_at": rfc3339(m.available_at_ms),
        "sent_at": m.sent_at_ms.map(rfc3339),
        "payload": text,
        "payload_base64": text.is_none().then(|| STANDARD.encode(&m.payload)),
        "headers": m.headers,
    })
}

/// An inbox record as JSON.
pub fn inbox_json(e: &InboxEntry) -> Value {
    json!({
        "subscriber": e.subscriber,
        "message_id": e.message_id,
        "processed_at": rfc3339(e.processed_at_ms),
        "expires_at": rfc3339(e.expires_at_ms),
    })
}

async fn figures<B: AdminBackend>(State(st): State<V1<B>>) -> Response {
    match st.relay.get() {
        Some(d) => match d.stats().await {
            Ok(s) => ok(&crate::outbox::stats_json(&s)),
            Err(e) => db_error(e),
        },
        None => match crate::outbox::store_stats_json(&st.store).await {
            Ok(v) => ok(&v),
            Err(e) => internal(format!("{e:#}")),
        },
    }
}

#[derive(Debug, Deserialize)]
struct MessagesQuery {
    state: Option<String>,
    topic: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

async fn messages<B: AdminBackend>(
    State(st): State<V1<B>>,
    Query(q): Query<MessagesQuery>,
) -> Response {
    let filter = (|| {
        Ok::<_, Response>(OutboxFilter {
            state: param(
                q.state.as_deref(),
                "state",
                "pending, dead or sent",
                OutboxState::parse,
            )?,
            topic: param(q.topic.as_deref(), "topic", "1 to 255 characters", text)?,
            before_id: cursor(q.cursor.as_deref())?,
            limit: limit(q.limit.as_deref())?,
        })
    })();
    let fetch = |f: OutboxFilter| async move { st.store.list_outbox(&f).await };
    super::list_page(filter, |f| f.limit, fetch, message_json, |m| m.id).await
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RequeueBody {
    message_id: String,
}

async fn requeue<B: AdminBackend>(
    State(st): State<V1<B>>,
    Extension(tx): Extension<IdemTx<B::Tx>>,
    actor: Option<Extension<Actor>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let b: RequeueBody = match super::body(&body) {
        Ok(b) => b,
        Err(r) => return r,
    };
    if idem_core::outbox::MessageId::new(b.message_id.clone()).is_err() {
        return crate::respond::invalid("message_id: not a message id (1 to 255 visible ASCII)");
    }
    let Ok(mut tx) = tx.lock().await else {
        return internal("transaction finished");
    };
    match B::requeue_outbox(&mut tx, &b.message_id, super::now_ms(&st.store)).await {
        Ok(OutboxRequeue::Requeued) => {}
        Ok(OutboxRequeue::NotFound) => return not_found("No such outbox message"),
        Ok(OutboxRequeue::NotDead(state)) => {
            return conflict(
                "not-dead",
                "The message is not dead",
                &format!("it is {state}; only a dead message is requeued"),
            );
        }
        Err(e) => return db_error(e),
    }
    let audit = Audit {
        action: "outbox.requeue",
        target: b.message_id.clone(),
        detail: json!({"message_id": b.message_id}),
    };
    if let Err(r) = record::<B>(&mut tx, actor.as_ref().map(|a| &a.0), &headers, audit).await {
        return r;
    }
    ok(&json!({"requeued": true, "message_id": b.message_id}))
}

#[derive(Debug, Deserialize)]
struct InboxQuery {
    subscriber: Option<String>,
    message_id: Option<String>,
}

const SUBSCRIBER: &str = "a subscriber name, 1 to 255 characters";
const MESSAGE: &str = "a message id, 1 to 255 characters";

async fn inbox_one<B: AdminBackend>(
    State(st): State<V1<B>>,
    Query(q): Query<InboxQuery>,
) -> Response {
    let (sub, msg) = match (
        required(q.subscriber.as_deref(), "subscriber", SUBSCRIBER, text),
        required(q.message_id.as_deref(), "message_id", MESSAGE, text),
    ) {
        (Ok(s), Ok(m)) => (s, m),
        (Err(r), _) | (_, Err(r)) => return r,
    };
    match read(st.store.inbox_entry(&sub, &msg)).await {
        Ok(e) => ok(&json!({
            "subscriber": sub,
            "message_id": msg,
            "seen": e.is_some(),
            "processed_at": e.as_ref().map(|e| rfc3339(e.processed_at_ms)),
            "expires_at": e.as_ref().map(|e| rfc3339(e.expires_at_ms)),
        })),
        Err(r) => r,
    }
}

#[derive(Debug, Deserialize)]
struct InboxListQuery {
    subscriber: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

async fn inbox_list<B: AdminBackend>(
    State(st): State<V1<B>>,
    Query(q): Query<InboxListQuery>,
) -> Response {
    let filter = match (|| {
        Ok::<_, Response>(InboxFilter {
            subscriber: param(q.subscriber.as_deref(), "subscriber", SUBSCRIBER, text)?,
            before: cursor(q.cursor.as_deref())?,
            limit: limit(q.limit.as_deref())?,
        })
    })() {
        Ok(f) => f,
        Err(r) => return r,
    };
    match read(st.store.list_inbox(&filter)).await {
        Ok(rows) => super::page(&rows, filter.limit, inbox_json, |e| {
            (
                e.processed_at_ms,
                e.subscriber.clone(),
                e.message_id.clone(),
            )
        }),
        Err(r) => r,
    }
}
