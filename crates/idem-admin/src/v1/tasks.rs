//! Polling agents' tasks: `GET /admin/v1/tasks`, `GET /admin/v1/tasks/{id}`
//! (with its timeline), `POST /admin/v1/tasks/{id}/retry`, `POST
//! /admin/v1/tasks/{id}/resolve`.

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Extension, Router};
use idem_core::tasks::{ActionName, QueueName, TaskFilter, TaskId, TaskRecord, TaskState};
use idem_http::IdemTx;
use idem_tasks::http::{Shown, event_json, task_json};
use idem_tasks::{Tasks, TasksConfig, TasksError};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Audit, V1, action, conflict, cursor, limit, param, read, record};
use crate::auth::Actor;
use crate::backend::AdminBackend;
use crate::respond::{db_error, internal, invalid, not_found, ok};

/// The routes.
pub fn routes<B: AdminBackend>(store: &B) -> Router<V1<B>> {
    Router::new()
        .route("/admin/v1/tasks", get(list::<B>))
        .route("/admin/v1/tasks/{id}", get(show::<B>))
        .route(
            "/admin/v1/tasks/{id}/retry",
            post(retry::<B>).layer(action(store, "tasks.retry")),
        )
        .route(
            "/admin/v1/tasks/{id}/resolve",
            post(resolve::<B>).layer(action(store, "tasks.resolve")),
        )
}

/// A task as listed: the API's view (payload and result as stored), with
/// its tenant.
fn listed(t: &TaskRecord) -> Shown<'_> {
    task_json(t).with("tenant", t.tenant.as_str())
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    queue: Option<String>,
    state: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

async fn list<B: AdminBackend>(State(st): State<V1<B>>, Query(q): Query<ListQuery>) -> Response {
    let filter = (|| {
        Ok::<_, Response>(TaskFilter {
            queue: param(
                q.queue.as_deref(),
                "queue",
                "1 to 64 characters of [A-Za-z0-9._-]",
                |s| QueueName::new(s).ok().map(|q| q.as_str().to_owned()),
            )?,
            state: param(
                q.state.as_deref(),
                "state",
                "ready, claimed, done, dead or needs_attention",
                TaskState::parse,
            )?,
            before: cursor(q.cursor.as_deref())?,
            limit: limit(q.limit.as_deref())?,
        })
    })();
    let fetch = |f: TaskFilter| async move { st.store.list_tasks(&f).await };
    super::list_page(
        filter,
        |f| f.limit,
        fetch,
        // Owned (the page outlives no row): the same JSON text.
        |t| serde_json::value::to_raw_value(&listed(t)).ok(),
        |t| (t.created_at_ms, t.id.clone()),
    )
    .await
}

fn task_id(id: &str) -> Result<TaskId, Response> {
    TaskId::parse(id).map_err(|_| invalid("id: not a task id (tsk_…)"))
}

async fn show<B: AdminBackend>(State(st): State<V1<B>>, Path(id): Path<String>) -> Response {
    let id = match task_id(&id) {
        Ok(id) => id,
        Err(r) => return r,
    };
    let found = async {
        let task = st.store.load_task(id.as_str()).await?;
        let events = match &task {
            Some(_) => st.store.task_events(id.as_str()).await?,
            None => vec![],
        };
        Ok((task, events))
    };
    match read(found).await {
        Ok((Some(t), events)) => {
            let timeline: Vec<Value> = events.iter().map(event_json).collect();
            ok(&listed(&t).with("timeline", timeline))
        }
        Ok((None, _)) => not_found("No such task"),
        Err(r) => r,
    }
}

/// What an operator's action answers when it is refused.
fn refused(e: TasksError) -> Response {
    match e {
        TasksError::NotFound => not_found("No such task"),
        e @ TasksError::NotApplicable { .. } => conflict(
            "not-applicable",
            "The action does not apply to the task",
            &e.to_string(),
        ),
        TasksError::Store(e) => db_error(e),
        TasksError::Invalid(detail) => invalid(&detail),
        other => internal(other),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RetryBody {}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveBody {
    action: String,
    #[serde(rename = "as")]
    resolution: String,
}

/// `retry` or `resolve`, in the admin layer's transaction with its audit row.
async fn steer<B: AdminBackend>(
    st: &V1<B>,
    id: &str,
    tx: IdemTx<B::Tx>,
    actor: Option<Extension<Actor>>,
    headers: &HeaderMap,
    resolve: Option<(ActionName, bool)>,
) -> Response {
    let id = match task_id(id) {
        Ok(id) => id,
        Err(r) => return r,
    };
    let tasks = match Tasks::new(st.store.clone(), TasksConfig::default()).await {
        Ok(t) => t,
        Err(e) => return refused(e),
    };
    let Ok(mut tx) = tx.lock().await else {
        return internal("transaction finished");
    };
    let who = super::actor(actor.as_ref().map(|a| &a.0)).to_owned();
    let done = match &resolve {
        None => tasks.retry_in(&mut tx, &id, &who).await,
        Some((name, sent)) => tasks.resolve_in(&mut tx, &id, name, *sent, &who).await,
    };
    let t = match done {
        Ok(t) => t,
        Err(e) => return refused(e),
    };
    let (name, detail) = match &resolve {
        None => (
            "tasks.retry",
            json!({"task": t.id, "state": t.state.as_str(), "fence": t.fence}),
        ),
        Some((a, sent)) => (
            "tasks.resolve",
            json!({"task": t.id, "action": a.as_str(), "resolved_as": if *sent { "sent" } else { "not_sent" },
                   "state": t.state.as_str(), "fence": t.fence}),
        ),
    };
    let audit = Audit {
        action: name,
        target: t.id.clone(),
        detail: detail.clone(),
    };
    if let Err(r) = record::<B>(&mut tx, actor.as_ref().map(|a| &a.0), headers, audit).await {
        return r;
    }
    ok(&listed(&t))
}

async fn retry<B: AdminBackend>(
    State(st): State<V1<B>>,
    Path(id): Path<String>,
    Extension(tx): Extension<IdemTx<B::Tx>>,
    actor: Option<Extension<Actor>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if !body.is_empty()
        && let Err(r) = super::body::<RetryBody>(&body)
    {
        return r;
    }
    steer(&st, &id, tx, actor, &headers, None).await
}

async fn resolve<B: AdminBackend>(
    State(st): State<V1<B>>,
    Path(id): Path<String>,
    Extension(tx): Extension<IdemTx<B::Tx>>,
    actor: Option<Extension<Actor>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let b: ResolveBody = match super::body(&body) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let sent = match b.resolution.as_str() {
        "sent" => true,
        // As the CLI and the task API spell it, and as runs' resolve does.
        "not_sent" | "not-sent" => false,
        _ => return invalid("as: sent or not_sent"),
    };
    let action = match ActionName::new(b.action) {
        Ok(a) => a,
        Err(e) => return invalid(&format!("action: {e}")),
    };
    steer(&st, &id, tx, actor, &headers, Some((action, sent))).await
}
