//! The answers of the task API: the JSON views of a task and its timeline,
//! and the problem document of every refusal.

use std::time::{Duration, UNIX_EPOCH};

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use idem_core::StoreError;
use idem_core::tasks::{TaskEvent, TaskRecord};
use idem_http::{problem, problem_with};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::TasksError;

pub(super) fn invalid(detail: &str) -> Response {
    problem(
        StatusCode::BAD_REQUEST,
        "invalid-request",
        "The request is invalid",
        Some(detail),
        None,
    )
}

/// The answer to a refused operation.
pub(super) fn refused(e: TasksError) -> Response {
    match e {
        TasksError::Invalid(detail) => invalid(&detail),
        TasksError::KeyReused => problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency-key-reused",
            "The task key was used with another payload",
            Some("a task's key names one payload; use another key for another task"),
            None,
        ),
        TasksError::CursorMoved { current } => {
            let current = current
                .and_then(|c| serde_json::from_str::<Value>(&c).ok())
                .unwrap_or(Value::Null);
            let mut extra = serde_json::Map::new();
            extra.insert("current".into(), current);
            problem_with(
                StatusCode::CONFLICT,
                "cursor-moved",
                "The cursor is not where the observation expected",
                Some("read the cursor again (current) and observe from there; nothing was written"),
                extra,
            )
        }
        TasksError::LeaseLost {
            fence,
            current,
            state,
        } => {
            let mut extra = serde_json::Map::new();
            extra.insert("fence".into(), current.into());
            extra.insert("state".into(), state.into());
            problem_with(
                StatusCode::CONFLICT,
                "lease-lost",
                "This worker no longer holds the task",
                Some(&format!(
                    "fence {fence} is not the task's live claim (the task is {state} at fence {current}); nothing was written"
                )),
                extra,
            )
        }
        TasksError::ResultMismatch => problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "result-mismatch",
            "The task was completed with another result",
            Some("this fence completed the task already, with another result"),
            None,
        ),
        TasksError::NoAttempt => problem(
            StatusCode::CONFLICT,
            "no-attempt",
            "The action was never attempted",
            Some("ask POST /v1/tasks/{id}/actions/{name} before reporting its result"),
            None,
        ),
        TasksError::AskKeyReused => problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency-key-reused",
            "The ask's key was used with another body",
            Some(
                "this Idempotency-Key asked about the action under this claim with another mode; \
                 nothing was written: another ask needs another key",
            ),
            None,
        ),
        TasksError::NotApplicable { state, what } => problem(
            StatusCode::CONFLICT,
            "not-applicable",
            "The action does not apply to the task",
            Some(&format!("the task is {state}; {what}")),
            None,
        ),
        TasksError::NotFound => not_found(),
        TasksError::Store(e) => store_error(e),
    }
}

pub(super) fn store_error(e: StoreError) -> Response {
    idem_http::store_problem(e)
}

pub(super) fn not_found() -> Response {
    problem(
        StatusCode::NOT_FOUND,
        "not-found",
        "No such task",
        None,
        None,
    )
}

pub(super) fn body<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, Response> {
    serde_json::from_slice(bytes).map_err(|e| invalid(&format!("body: {e}")))
}

pub(super) fn duration(what: &str, text: &str) -> Result<Duration, Response> {
    humantime::parse_duration(text).map_err(|e| {
        invalid(&format!(
            "{what}: {text:?} is not a duration such as 30s ({e})"
        ))
    })
}

/// Unix milliseconds as RFC 3339 (UTC, milliseconds).
pub fn rfc3339(ms: i64) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_millis(at).to_string()
}

/// A task as the API, the admin API and `idem tasks` show it.
pub fn task_json(t: &TaskRecord) -> Value {
    json!({
        "id": t.id,
        "queue": t.queue,
        "key": t.key,
        "state": t.state.as_str(),
        "payload": serde_json::from_str::<Value>(&t.payload).unwrap_or(Value::Null),
        "priority": t.priority,
        "run_at": rfc3339(t.run_at_ms),
        "attempt": t.attempt,
        "max_attempts": t.max_attempts,
        "fence": t.fence,
        "holder": t.holder,
        "lease_expires_at": t.lease_expires_at_ms.map(rfc3339),
        "result": t.result.as_deref().and_then(|r| serde_json::from_str::<Value>(r).ok()),
        "last_error": t.last_error,
        "created_at": rfc3339(t.created_at_ms),
        "finished_at": t.finished_at_ms.map(rfc3339),
    })
}

/// An entry of a task's timeline as it is shown.
pub fn event_json(e: &TaskEvent) -> Value {
    json!({
        "seq": e.seq,
        "kind": e.kind,
        "actor": e.actor,
        "fence": e.fence,
        "at": rfc3339(e.at_ms),
        "detail": e.detail,
    })
}

pub(super) fn answer(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

pub(super) fn replayed(mut res: Response) -> Response {
    res.headers_mut()
        .insert("idempotent-replayed", HeaderValue::from_static("true"));
    res
}

pub(super) fn name<T, E: std::fmt::Display>(made: Result<T, E>) -> Result<T, Response> {
    made.map_err(|e| invalid(&e.to_string()))
}
