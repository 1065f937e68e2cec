//! Runs of multi-step operations: `GET /admin/v1/runs`, `GET
//! /admin/v1/runs/{id}`, `POST /admin/v1/runs/{id}/resolve`, `POST
//! /admin/v1/runs/{id}/resume`.

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Extension, Router};
use idem_core::Operation;
use idem_core::admin::{LeaseEnd, RunPageFilter};
use idem_core::steps::{RunId, RunRecord, RunState, StepKind, StepRecord};
use idem_http::IdemTx;
use idem_steps::{Resolution, ResolveError};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Audit, V1, action, conflict, cursor, limit, param, read, record};
use crate::auth::Actor;
use crate::backend::AdminBackend;
use crate::respond::{db_error, internal, invalid, not_found, ok, rfc3339};

/// The routes.
pub fn routes<B: AdminBackend>(store: &B) -> Router<V1<B>> {
    Router::new()
        .route("/admin/v1/runs", get(list::<B>))
        .route("/admin/v1/runs/{id}", get(show::<B>))
        .route(
            "/admin/v1/runs/{id}/resolve",
            post(resolve::<B>).layer(action(store, "runs.resolve")),
        )
        .route(
            "/admin/v1/runs/{id}/resume",
            post(resume::<B>).layer(action(store, "runs.resume")),
        )
}

/// A run as listed.
pub fn run_json(r: &RunRecord) -> Value {
    json!({
        "id": r.id.as_str(),
        "operation": r.scope.operation.as_str(),
        "tenant": r.scope.tenant.as_str(),
        "key": r.scope.key.as_str(),
        "state": r.state.as_str(),
        "holder": r.holder,
        "fence": r.fence.0,
        "locked_until": rfc3339(r.locked_until_ms),
        "failure": r.failure.as_ref().map(|f| json!({"reason": f.reason, "step": f.step, "detail": f.detail})),
        "blocked_step": r.blocked_step,
        "attention": r.attention,
        "no_return": r.no_return,
        "takeovers": r.takeovers,
        "recovery_point": r.recovery_point,
        "deadline": rfc3339(r.deadline_ms),
        "created_at": rfc3339(r.created_at_ms),
        "updated_at": rfc3339(r.updated_at_ms),
        "finished_at": r.finished_at_ms.map(rfc3339),
    })
}

/// A step of a run: its derived key, the message id of a send, its result
/// and failure, and whether it is a compensation.
pub fn step_json(s: &StepRecord) -> Value {
    let send = matches!(s.kind, StepKind::Send | StepKind::AtMostOnce);
    json!({
        "name": s.name,
        "kind": s.kind.as_str(),
        "state": s.state.as_str(),
        "attempts": s.attempts,
        "failures": s.failures,
        "fence": s.fence.0,
        "derived_key": s.key,
        "message_id": send.then_some(s.key.as_str()),
        "result": s.result.as_deref().map(|r| {
            serde_json::from_slice::<Value>(r).unwrap_or_else(|_| String::from_utf8_lossy(r).into())
        }),
        "failure": s.error,
        "compensation": matches!(s.kind, StepKind::Undo | StepKind::UndoPhase),
        "started_at": s.started_at_ms.map(rfc3339),
        "finished_at": s.finished_at_ms.map(rfc3339),
    })
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    state: Option<String>,
    operation: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

async fn list<B: AdminBackend>(State(st): State<V1<B>>, Query(q): Query<ListQuery>) -> Response {
    let filter = (|| {
        Ok::<_, Response>(RunPageFilter {
            state: param(
                q.state.as_deref(),
                "state",
                "running, compensating, needs_attention, completed or failed",
                RunState::parse,
            )?,
            operation: param(
                q.operation.as_deref(),
                "operation",
                "an operation: 1 to 64 characters of [A-Za-z0-9._:-]",
                |s| Operation::new(s).ok(),
            )?,
            before: cursor(q.cursor.as_deref())?,
            limit: limit(q.limit.as_deref())?,
        })
    })();
    let fetch = |f: RunPageFilter| async move { st.store.list_runs_page(&f).await };
    super::list_page(
        filter,
        |f| f.limit,
        fetch,
        run_json,
        |r| (r.created_at_ms, r.id.as_str().to_owned()),
    )
    .await
}

fn run_id(id: &str) -> Result<RunId, Response> {
    RunId::parse(id).map_err(|_| invalid("id: not a run id (run_…)"))
}

async fn show<B: AdminBackend>(State(st): State<V1<B>>, Path(id): Path<String>) -> Response {
    let id = match run_id(&id) {
        Ok(id) => id,
        Err(r) => return r,
    };
    match read(st.store.load_run(&id)).await {
        Ok(Some(r)) => {
            let mut v = run_json(&r);
            v["steps"] = r.steps.iter().map(step_json).collect();
            ok(&v)
        }
        Ok(None) => not_found("No such run"),
        Err(r) => r,
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveBody {
    #[serde(rename = "as")]
    resolution: String,
}

async fn resolve<B: AdminBackend>(
    State(st): State<V1<B>>,
    Path(id): Path<String>,
    Extension(tx): Extension<IdemTx<B::Tx>>,
    actor: Option<Extension<Actor>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let id = match run_id(&id) {
        Ok(id) => id,
        Err(r) => return r,
    };
    let b: ResolveBody = match super::body(&body) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let how = match b.resolution.as_str() {
        "sent" => Resolution::Sent,
        "not_sent" => Resolution::NotSent,
        _ => return invalid("as: sent or not_sent"),
    };
    let run = match read(st.store.load_run(&id)).await {
        Ok(Some(r)) => r,
        Ok(None) => return not_found("No such run"),
        Err(r) => return r,
    };
    let Ok(mut tx) = tx.lock().await else {
        return internal("transaction finished");
    };
    let done = match idem_steps::resolve_in::<B>(&mut tx, run, how, super::now_ms(&st.store)).await
    {
        Ok(done) => done,
        Err(ResolveError::NotFound(_)) => return not_found("No such run"),
        Err(e @ ResolveError::NotBlocked { .. }) => {
            return conflict(
                "not-needs-attention",
                "The run does not need attention",
                &e.to_string(),
            );
        }
        Err(e @ ResolveError::ValueNeeded { .. }) => {
            return conflict("value-needed", "The step needs a value", &e.to_string());
        }
        Err(e @ ResolveError::Changed(_)) => {
            return conflict("run-changed", "The run changed meanwhile", &e.to_string());
        }
        Err(ResolveError::Store(e)) => return db_error(e),
        Err(e) => return internal(e),
    };
    let answer = json!({"run": done.run.as_str(), "step": done.step,
                        "state": done.state.as_str(), "resolved_as": b.resolution});
    let audit = Audit {
        action: "runs.resolve",
        target: done.run.as_str().to_owned(),
        detail: answer.clone(),
    };
    if let Err(r) = record::<B>(&mut tx, actor.as_ref().map(|a| &a.0), &headers, audit).await {
        return r;
    }
    ok(&answer)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResumeBody {}

async fn resume<B: AdminBackend>(
    State(st): State<V1<B>>,
    Path(id): Path<String>,
    Extension(tx): Extension<IdemTx<B::Tx>>,
    actor: Option<Extension<Actor>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let id = match run_id(&id) {
        Ok(id) => id,
        Err(r) => return r,
    };
    if !body.is_empty()
        && let Err(r) = super::body::<ResumeBody>(&body)
    {
        return r;
    }
    let Ok(mut tx) = tx.lock().await else {
        return internal("transaction finished");
    };
    match B::end_run_lease(&mut tx, &id, super::now_ms(&st.store)).await {
        Ok(LeaseEnd::Ended) => {}
        Ok(LeaseEnd::NotFound) => return not_found("No such run"),
        Ok(LeaseEnd::Final(state)) => {
            return conflict(
                "run-final",
                "The run is final",
                &format!("it is {state}; there is nothing to resume"),
            );
        }
        Ok(LeaseEnd::NeedsAttention) => {
            return conflict(
                "needs-attention",
                "The run waits for an operator",
                "resolve its blocked step instead (POST …/resolve)",
            );
        }
        Err(e) => return db_error(e),
    }
    let audit = Audit {
        action: "runs.resume",
        target: id.as_str().to_owned(),
        detail: json!({"run": id.as_str()}),
    };
    if let Err(r) = record::<B>(&mut tx, actor.as_ref().map(|a| &a.0), &headers, audit).await {
        return r;
    }
    ok(&json!({"resumed": true, "run": id.as_str()}))
}
