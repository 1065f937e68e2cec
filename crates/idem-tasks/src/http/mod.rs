//! The task API over HTTP, as an axum [`Router`] ([`router`]): JSON in and
//! out, every refusal `application/problem+json`, nothing changed by a
//! refused request.
//!
//! | route | does |
//! |---|---|
//! | `POST /v1/queues/{queue}/tasks` | creates the task keyed by `Idempotency-Key` (`201`; the same key again: the same task, `Idempotent-Replayed: true`; another payload: `422`) |
//! | `POST /v1/pollers/{poller}/observations` | moves the cursor from `expected` to `value` and creates the tasks, in one transaction (`409 cursor-moved` with `current` otherwise) |
//! | `GET /v1/pollers/{poller}` | the cursor |
//! | `POST /v1/queues/{queue}/claims` | claims up to `max` tasks for `worker` for `lease` (`Idempotency-Key` required: a retried claim is answered as the first); with `wait`, a long poll |
//! | `GET /v1/tasks/{id}` | the task |
//! | `POST /v1/tasks/{id}/heartbeat`, `…/complete`, `…/fail` | the holder of `fence` renews, completes, fails (`409 lease-lost` for anyone else) |
//! | `POST /v1/tasks/{id}/actions/{name}` | the action's key and `go`, `done` or `unknown` (`go` once per fence: again only for the exact replay of that ask, its `Idempotency-Key` and body) |
//! | `POST /v1/tasks/{id}/actions/{name}/result` | `done` or `not-sent` (answered `ask`: the next ask goes) |

// A refusal is the answer itself: handlers return it as they get it.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use axum::Router;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Extension, body::Bytes};
use idem_core::steps::RunStore;
use idem_core::tasks::{
    ActionDecision, ActionMode, ActionName, ActionOutcome, PollerName, QueueName, TaskId,
    TaskRecord, TaskStore, WorkerName,
};
use idem_core::{IdempotencyKey, Operation, Policy, Scope, StoreError, Tenant};
use idem_http::{IdemTx, IdempotencyLayer, RouteConfig, TenantSource, problem};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::{JsonText, Observation, TaskSpec, Tasks, TasksError};

mod answers;

pub use answers::{Shown, event_json, rfc3339, task_json};
use answers::{answer, body, duration, invalid, name, not_found, refused, replayed, store_error};

/// How the routes find the tenant and bound a request.
#[derive(Clone, Debug)]
pub struct HttpConfig {
    /// Where a request's tenant comes from.
    pub tenant: TenantSource,
    /// The largest request body read (default 1 MiB).
    pub max_body_bytes: usize,
    /// How long a claim's key is kept, for retries of a lost answer
    /// (default 1 h).
    pub claim_key_ttl: Duration,
}

impl HttpConfig {
    /// Tenants from `tenant`, 1 MiB bodies, claim keys kept an hour.
    pub fn new(tenant: TenantSource) -> Self {
        Self {
            tenant,
            max_body_bytes: 1 << 20,
            claim_key_ttl: Duration::from_secs(3600),
        }
    }
}

struct App<S> {
    tasks: Tasks<S>,
    tenant: TenantSource,
    /// The claims' operation, for a long poll's look at the key's record.
    claims: Operation,
    max_body_bytes: usize,
}

impl<S: Clone> Clone for App<S> {
    fn clone(&self) -> Self {
        Self {
            tasks: self.tasks.clone(),
            tenant: self.tenant.clone(),
            claims: self.claims.clone(),
            max_body_bytes: self.max_body_bytes,
        }
    }
}

/// The routes over `tasks`.
pub fn router<S: TaskStore + RunStore>(
    tasks: Tasks<S>,
    config: HttpConfig,
) -> Result<Router, TasksError> {
    let operation = Operation::new("tasks.claim").map_err(TasksError::invalid)?;
    let mut claims = RouteConfig::required(operation.clone(), config.tenant.clone());
    claims.max_request_bytes = config.max_body_bytes;
    claims.policy = Policy::with_ttl(config.claim_key_ttl);
    let layer = IdempotencyLayer::new(tasks.store().clone(), claims);
    let app = App {
        tasks,
        tenant: config.tenant,
        claims: operation,
        max_body_bytes: config.max_body_bytes,
    };
    let long_poll = axum::middleware::from_fn_with_state(app.clone(), long_poll::<S>);
    Ok(Router::new()
        .route("/v1/queues/{queue}/tasks", post(create::<S>))
        .route(
            "/v1/queues/{queue}/claims",
            post(claim::<S>).layer(layer).layer(long_poll),
        )
        .route("/v1/pollers/{poller}/observations", post(observe::<S>))
        .route("/v1/pollers/{poller}", get(poller::<S>))
        .route("/v1/tasks/{id}", get(show::<S>))
        .route("/v1/tasks/{id}/heartbeat", post(heartbeat::<S>))
        .route("/v1/tasks/{id}/complete", post(complete::<S>))
        .route("/v1/tasks/{id}/fail", post(fail::<S>))
        .route("/v1/tasks/{id}/actions/{name}", post(action::<S>))
        .route(
            "/v1/tasks/{id}/actions/{name}/result",
            post(action_result::<S>),
        )
        .layer(DefaultBodyLimit::max(config.max_body_bytes))
        .layer(idem_http::DeclaredLimitLayer::new(config.max_body_bytes))
        .with_state(app))
}

fn tenant_of<S>(app: &App<S>, headers: &HeaderMap) -> Result<Tenant, Response> {
    let mut parts = axum::http::Request::new(()).into_parts().0;
    parts.headers = headers.clone();
    app.tenant.resolve(&parts).map_err(|r| r.into_response())
}
macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(r) => return r,
        }
    };
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewTaskBody {
    payload: JsonText,
    run_at: Option<String>,
    priority: Option<i64>,
    max_attempts: Option<u32>,
}

impl NewTaskBody {
    fn spec(self) -> Result<TaskSpec, Response> {
        let run_at_ms = match self.run_at {
            None => None,
            Some(text) => {
                let at = humantime::parse_rfc3339_weak(&text).map_err(|e| {
                    invalid(&format!("run_at: {text:?} is not an RFC 3339 time ({e})"))
                })?;
                let ms = at
                    .duration_since(UNIX_EPOCH)
                    .map_err(|_| invalid("run_at: before 1970"))?
                    .as_millis();
                Some(i64::try_from(ms).map_err(|_| invalid("run_at: too far ahead"))?)
            }
        };
        Ok(TaskSpec {
            payload: self.payload,
            run_at_ms,
            priority: self.priority.unwrap_or(0),
            max_attempts: self.max_attempts,
        })
    }
}

async fn create<S: TaskStore + RunStore>(
    State(app): State<App<S>>,
    Path(queue): Path<String>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Response {
    let tenant = tri!(tenant_of(&app, &headers));
    let queue = tri!(name(QueueName::new(queue)));
    let key = match headers.get("idempotency-key") {
        None => {
            return problem(
                StatusCode::BAD_REQUEST,
                "missing-idempotency-key",
                "Idempotency-Key is required",
                Some(
                    "a task is created under its observation's natural key, sent as Idempotency-Key",
                ),
                None,
            );
        }
        Some(v) => tri!(name(IdempotencyKey::from_header(v.as_bytes()))),
    };
    let spec = tri!(tri!(body::<NewTaskBody>(&bytes)).spec());
    match app.tasks.create(&tenant, &queue, &key, &spec).await {
        Ok((t, true)) => answer(StatusCode::CREATED, &task_json(&t)),
        Ok((t, false)) => replayed(answer(StatusCode::CREATED, &task_json(&t))),
        Err(e) => refused(e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CursorBody {
    expected: Option<JsonText>,
    value: JsonText,
}

/// A task of an observation: its queue and key, and a task's fields (not
/// flattened: a payload read as written cannot go through serde's buffer).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ObservedTask {
    queue: String,
    key: String,
    payload: JsonText,
    run_at: Option<String>,
    priority: Option<i64>,
    max_attempts: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ObservationBody {
    cursor: CursorBody,
    #[serde(default)]
    tasks: Vec<ObservedTask>,
}

async fn observe<S: TaskStore + RunStore>(
    State(app): State<App<S>>,
    Path(poller): Path<String>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Response {
    let tenant = tri!(tenant_of(&app, &headers));
    let poller = tri!(name(PollerName::new(poller)));
    let b: ObservationBody = tri!(body(&bytes));
    let limit = app.tasks.config().max_tasks_per_observation;
    if b.tasks.len() > limit {
        return invalid(&format!("tasks: at most {limit} per observation"));
    }
    let mut tasks = Vec::with_capacity(b.tasks.len());
    for (i, t) in b.tasks.into_iter().enumerate() {
        let at = |e: String| invalid(&format!("tasks[{i}].{e}"));
        let queue = tri!(QueueName::new(t.queue).map_err(|e| at(e.to_string())));
        let key = tri!(IdempotencyKey::new(t.key).map_err(|e| at(format!("key: {e}"))));
        let spec = NewTaskBody {
            payload: t.payload,
            run_at: t.run_at,
            priority: t.priority,
            max_attempts: t.max_attempts,
        };
        tasks.push((queue, key, tri!(spec.spec())));
    }
    let observation = Observation {
        expected: b.cursor.expected,
        value: b.cursor.value,
        tasks,
    };
    match app.tasks.observe(&tenant, &poller, &observation).await {
        Ok(observed) => answer(
            StatusCode::OK,
            &Shown::new(json!({
                "poller": poller.as_str(),
                "repeated": observed.repeated,
                "tasks": observed.tasks.iter().map(|(t, created)| json!({
                    "id": t.id, "queue": t.queue, "key": t.key,
                    "state": t.state.as_str(), "created": created,
                })).collect::<Vec<_>>(),
            }))
            .text("cursor", Some(&observed.cursor)),
        ),
        Err(e) => refused(e),
    }
}

async fn poller<S: TaskStore + RunStore>(
    State(app): State<App<S>>,
    Path(poller): Path<String>,
    headers: HeaderMap,
) -> Response {
    let tenant = tri!(tenant_of(&app, &headers));
    let poller = tri!(name(PollerName::new(poller)));
    match app.tasks.poller(&tenant, &poller).await {
        Ok(Some(p)) => answer(
            StatusCode::OK,
            &Shown::new(json!({
                "poller": p.poller,
                "version": p.version,
                "updated_at": rfc3339(p.updated_at_ms),
            }))
            .text("cursor", Some(&p.cursor)),
        ),
        Ok(None) => problem(
            StatusCode::NOT_FOUND,
            "not-found",
            "No such poller",
            Some("a poller exists from its first observation on"),
            None,
        ),
        Err(e) => refused(e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClaimBody {
    worker: String,
    lease: String,
    #[serde(default = "one")]
    max: u32,
    /// Read by [`long_poll`], before the key is claimed.
    #[serde(default, rename = "wait")]
    _wait: Option<serde::de::IgnoredAny>,
}

/// A claim with `"wait": "10s"` waits here — before its key is claimed, in
/// no transaction — until a task of the queue is due or the wait ends,
/// reading every 100 ms. A retry of a claim whose key is recorded does not
/// wait: the layer answers it at once, as the first was answered.
async fn long_poll<S: TaskStore + RunStore>(
    State(app): State<App<S>>,
    Path(queue): Path<String>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let (parts, body) = req.into_parts();
    let bytes = match idem_http::read_body(body, app.max_body_bytes).await {
        Ok(b) => b,
        Err(rejection) => return rejection.into_response(),
    };
    let wait = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|v| v.get("wait").cloned());
    if let Some(wait) = wait {
        let Some(text) = wait.as_str() else {
            return invalid("wait: a duration such as 10s");
        };
        let wait = tri!(duration("wait", text));
        // Bad input is refused at once, not after the wait.
        tri!(claim_args(&app, &bytes));
        let tenant = tri!(app.tenant.resolve(&parts).map_err(|r| r.into_response()));
        let queue = tri!(name(QueueName::new(queue)));
        let key = parts
            .headers
            .get("idempotency-key")
            .and_then(|v| IdempotencyKey::from_header(v.as_bytes()).ok());
        let recorded = match key {
            Some(key) => {
                let scope = Scope::new(tenant.clone(), app.claims.clone(), key);
                // A failed read waits: the claim itself answers the truth.
                matches!(app.tasks.store().fetch(&scope).await, Ok(Some(_)))
            }
            // Refused at once by the layer.
            None => true,
        };
        if !recorded && let Err(e) = app.tasks.wait_for_due(&tenant, &queue, wait).await {
            return refused(e);
        }
    }
    next.run(axum::extract::Request::from_parts(
        parts,
        axum::body::Body::from(bytes),
    ))
    .await
}

fn one() -> u32 {
    1
}

/// A claim's worker, lease and `max`, checked.
fn claim_args<S: TaskStore + RunStore>(
    app: &App<S>,
    bytes: &[u8],
) -> Result<(WorkerName, Duration, u32), Response> {
    let b: ClaimBody = body(bytes)?;
    let worker = name(WorkerName::new(b.worker))?;
    let lease = duration("lease", &b.lease)?;
    app.tasks.check_claim(lease, b.max).map_err(refused)?;
    Ok((worker, lease, b.max))
}

async fn claim<S: TaskStore + RunStore>(
    State(app): State<App<S>>,
    Path(queue): Path<String>,
    Extension(tx): Extension<IdemTx<S::Tx>>,
    Extension(tenant): Extension<Tenant>,
    bytes: Bytes,
) -> Response {
    let queue = tri!(name(QueueName::new(queue)));
    let (worker, lease, max) = tri!(claim_args(&app, &bytes));
    let Ok(mut tx) = tx.lock().await else {
        return store_error(StoreError::Corrupt {
            detail: "the key's transaction is finished".into(),
        });
    };
    match app
        .tasks
        .claim_in(&mut tx, &tenant, &queue, &worker, lease, max)
        .await
    {
        Ok(claimed) => answer(
            StatusCode::OK,
            &BTreeMap::from([(
                "tasks",
                claimed
                    .iter()
                    .map(|t| {
                        Shown::new(json!({
                            "id": t.id,
                            "key": t.key,
                            "attempt": t.attempt,
                            "fence": t.fence,
                            "lease_expires_at": t.lease_expires_at_ms.map(rfc3339),
                        }))
                        .text("payload", Some(&t.payload))
                    })
                    .collect::<Vec<_>>(),
            )]),
        ),
        Err(e) => refused(e),
    }
}

fn task_id(id: &str) -> Result<TaskId, Response> {
    TaskId::parse(id).map_err(|_| not_found())
}

/// What every write of a worker reads first: the tenant, the task's id
/// (an id that is none is a task that is none: `404`) and the body.
fn fenced<S, B: for<'de> Deserialize<'de>>(
    app: &App<S>,
    headers: &HeaderMap,
    id: &str,
    bytes: &[u8],
) -> Result<(Tenant, TaskId, B), Response> {
    Ok((tenant_of(app, headers)?, task_id(id)?, body(bytes)?))
}

async fn show<S: TaskStore + RunStore>(
    State(app): State<App<S>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let tenant = tri!(tenant_of(&app, &headers));
    let id = tri!(task_id(&id));
    match app.tasks.task(&tenant, &id).await {
        Ok(t) => answer(StatusCode::OK, &task_json(&t)),
        Err(e) => refused(e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HeartbeatBody {
    fence: i64,
    lease: String,
}

async fn heartbeat<S: TaskStore + RunStore>(
    State(app): State<App<S>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Response {
    let (tenant, id, b): (_, _, HeartbeatBody) = tri!(fenced(&app, &headers, &id, &bytes));
    let lease = tri!(duration("lease", &b.lease));
    match app.tasks.heartbeat(&tenant, &id, b.fence, lease).await {
        Ok(t) => answer(StatusCode::OK, &task_json(&t)),
        Err(e) => refused(e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CompleteBody {
    fence: i64,
    #[serde(default)]
    result: JsonText,
}

async fn complete<S: TaskStore + RunStore>(
    State(app): State<App<S>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Response {
    let (tenant, id, b): (_, _, CompleteBody) = tri!(fenced(&app, &headers, &id, &bytes));
    match app.tasks.complete(&tenant, &id, b.fence, b.result).await {
        Ok((t, false)) => answer(StatusCode::OK, &task_json(&t)),
        Ok((t, true)) => replayed(answer(StatusCode::OK, &task_json(&t))),
        Err(e) => refused(e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FailBody {
    fence: i64,
    error: String,
    retry_in: Option<String>,
}

async fn fail<S: TaskStore + RunStore>(
    State(app): State<App<S>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Response {
    let (tenant, id, b): (_, _, FailBody) = tri!(fenced(&app, &headers, &id, &bytes));
    let retry_in = match b.retry_in.as_deref() {
        None => None,
        Some(text) => Some(tri!(duration("retry_in", text))),
    };
    match app
        .tasks
        .fail(&tenant, &id, b.fence, &b.error, retry_in)
        .await
    {
        Ok(t) => answer(StatusCode::OK, &task_json(&t)),
        Err(e) => refused(e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ActionBody {
    fence: i64,
    mode: String,
}

/// An action's answer; with the lease's end and how long it has left on
/// the database's clock (`lease_remaining_ms`), so a worker bounds its act
/// by the time it asked plus that, whatever its own clock says.
fn action_answer<S: TaskStore + RunStore>(
    app: &App<S>,
    key: &str,
    decision: ActionDecision,
    t: &TaskRecord,
) -> Response {
    let left = app.tasks.lease_left(t).map(|d| d.as_millis() as u64);
    answer(
        StatusCode::OK,
        &json!({
            "key": key,
            "do": decision.as_str(),
            "task": {"id": t.id, "state": t.state.as_str(), "fence": t.fence,
                     "lease_expires_at": t.lease_expires_at_ms.map(rfc3339)},
            "lease_remaining_ms": left,
        }),
    )
}

async fn action<S: TaskStore + RunStore>(
    State(app): State<App<S>>,
    Path((id, action)): Path<(String, String)>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Response {
    let (tenant, id, b): (_, _, ActionBody) = tri!(fenced(&app, &headers, &id, &bytes));
    let action = tri!(name(ActionName::new(action)));
    let Some(mode) = ActionMode::parse(&b.mode) else {
        return invalid("mode: at-most-once or verify");
    };
    let ask = match headers.get("idempotency-key") {
        None => None,
        Some(v) => Some(tri!(name(IdempotencyKey::from_header(v.as_bytes())))),
    };
    match app
        .tasks
        .action(&tenant, &id, b.fence, &action, mode, ask.as_ref())
        .await
    {
        Ok((key, decision, t)) => action_answer(&app, key.as_str(), decision, &t),
        Err(e) => refused(e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResultBody {
    fence: i64,
    outcome: String,
    #[serde(default)]
    detail: Option<String>,
}

async fn action_result<S: TaskStore + RunStore>(
    State(app): State<App<S>>,
    Path((id, action)): Path<(String, String)>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Response {
    let (tenant, id, b): (_, _, ResultBody) = tri!(fenced(&app, &headers, &id, &bytes));
    let action = tri!(name(ActionName::new(action)));
    let Some(outcome) = ActionOutcome::parse(&b.outcome) else {
        return invalid("outcome: done or not-sent");
    };
    if b.detail.as_ref().is_some_and(|d| d.len() > 4096) {
        return invalid("detail: at most 4096 bytes");
    }
    // The key of the ask reported for: the one told go gives it back.
    let ask = match headers.get("idempotency-key") {
        None => None,
        Some(v) => Some(tri!(name(IdempotencyKey::from_header(v.as_bytes())))),
    };
    match app
        .tasks
        .action_result(
            &tenant,
            &id,
            b.fence,
            &action,
            outcome,
            ask.as_ref(),
            b.detail.as_deref(),
        )
        .await
    {
        Ok((key, decision, t)) => action_answer(&app, key.as_str(), decision, &t),
        Err(e) => refused(e),
    }
}
