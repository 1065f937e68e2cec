//! The answers of the task API: the JSON views of a task and its timeline,
//! and the problem document of every refusal.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, UNIX_EPOCH};

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use idem_core::StoreError;
use idem_core::tasks::{TaskEvent, TaskRecord};
use idem_http::{problem, problem_with};
use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

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
            let status = StatusCode::CONFLICT;
            let body = Shown::new(json!({
                "type": format!("{}cursor-moved", idem_http::TYPE_BASE),
                "title": "The cursor is not where the observation expected",
                "status": status.as_u16(),
                "detail": "read the cursor again (current) and observe from there; nothing was written",
            }))
            .text("current", current.as_deref());
            let mut res = answer(status, &body);
            res.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/problem+json"),
            );
            res
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
        TasksError::AttemptInFlight => problem(
            StatusCode::CONFLICT,
            "attempt-in-flight",
            "Another ask of this claim was told go",
            Some(
                "the action was told go under this claim to another ask (or one this report's \
                 Idempotency-Key does not name), which may still be performing it: only that \
                 ask reports not-sent; nothing was written. Report done if the other system has \
                 it; else leave the task: its next claim checks again",
            ),
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

/// A task as the API, the admin API and `idem tasks` show it: its
/// `payload` and `result` are the stored JSON text, every digit of it.
pub fn task_json(t: &TaskRecord) -> Shown<'_> {
    Shown::new(json!({
        "id": t.id,
        "queue": t.queue,
        "key": t.key,
        "state": t.state.as_str(),
        "priority": t.priority,
        "run_at": rfc3339(t.run_at_ms),
        "attempt": t.attempt,
        "max_attempts": t.max_attempts,
        "fence": t.fence,
        "holder": t.holder,
        "lease_expires_at": t.lease_expires_at_ms.map(rfc3339),
        "last_error": t.last_error,
        "created_at": rfc3339(t.created_at_ms),
        "finished_at": t.finished_at_ms.map(rfc3339),
    }))
    .text("payload", Some(&t.payload))
    .text("result", t.result.as_deref())
}

/// A JSON object as an answer shows it: values, and stored JSON texts (a
/// payload, a result, a cursor) written as they are stored, so no number
/// goes through an `f64` — a [`Value`] would round
/// `123456789012345678901234567890`. It serializes as that object (with
/// `serde_json`: the texts verbatim) and displays as its JSON.
#[derive(Clone, Debug)]
pub struct Shown<'a> {
    members: Map<String, Value>,
    texts: BTreeMap<&'static str, Option<&'a RawValue>>,
}

impl<'a> Shown<'a> {
    /// The members of `object` (a JSON object; any other value has none).
    pub(crate) fn new(object: Value) -> Self {
        let members = match object {
            Value::Object(members) => members,
            _ => Map::new(),
        };
        Self {
            members,
            texts: BTreeMap::new(),
        }
    }

    /// With member `name` the stored JSON `text` as it is (`null` when
    /// there is none, or it is not JSON — no text Idem stored).
    pub(crate) fn text(mut self, name: &'static str, text: Option<&'a str>) -> Self {
        let raw = text.and_then(|t| serde_json::from_str::<&RawValue>(t).ok());
        self.members.insert(name.to_owned(), Value::Null);
        self.texts.insert(name, raw);
        self
    }

    /// With member `name` set to `value` (the tenant, a timeline). A
    /// stored text of that name (`payload`, `result`) stays.
    pub fn with(mut self, name: &str, value: impl Into<Value>) -> Self {
        if !self.texts.contains_key(name) {
            self.members.insert(name.to_owned(), value.into());
        }
        self
    }
}

impl Serialize for Shown<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.members.len()))?;
        for (name, value) in &self.members {
            match self.texts.get(name.as_str()) {
                Some(text) => map.serialize_entry(name, text)?,
                None => map.serialize_entry(name, value)?,
            }
        }
        map.end()
    }
}

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&serde_json::to_string(self).map_err(|_| fmt::Error)?)
    }
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

pub(super) fn answer(status: StatusCode, body: &impl Serialize) -> Response {
    match serde_json::to_string(body) {
        Ok(text) => (status, [(header::CONTENT_TYPE, "application/json")], text).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "an answer did not serialize");
            problem(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "Internal error",
                None,
                None,
            )
        }
    }
}

pub(super) fn replayed(mut res: Response) -> Response {
    res.headers_mut()
        .insert("idempotent-replayed", HeaderValue::from_static("true"));
    res
}

pub(super) fn name<T, E: std::fmt::Display>(made: Result<T, E>) -> Result<T, Response> {
    made.map_err(|e| invalid(&e.to_string()))
}
