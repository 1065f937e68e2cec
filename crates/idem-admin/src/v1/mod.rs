//! `/admin/v1`: the versioned admin JSON API the console uses
//! (`docs/admin-api.md` is the contract).
//!
//! Every list answers `{"items": […], "next_cursor": …}` with a keyset
//! cursor (opaque: base64url of the last row's sort key); query values are
//! checked and a bad one is `400 invalid-request` naming the parameter.
//! Every POST goes through Idem's own [`IdempotencyLayer`] (key required,
//! tenant `admin`, one operation per action) and writes its audit row in
//! the layer's transaction, the action itself too — so a replay of the
//! request changes nothing and writes no second row. A refusal (4xx) is not
//! stored: it rolls back, audit row included.
//!
//! - [`keys`]: key records — list, show, release.
//! - [`outbox`]: outbox figures and messages, requeue; inbox lookups.
//! - [`webhooks`]: receipts — list, show, replay.
//! - [`runs`]: runs — list, show with steps, resolve, resume.
//! - [`tasks`]: polling agents' tasks — list, show with the timeline,
//!   retry, resolve.
//! - [`audit`]: the audit log; [`overview`]: the dashboard's figures.
//! - [`outcomes`]: the per-minute ring of request outcomes.

pub mod audit;
pub mod keys;
pub mod outbox;
pub mod outcomes;
pub mod overview;
pub mod runs;
pub mod tasks;
pub mod webhooks;

use std::time::Duration;

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use idem_core::admin::{AdminStore, NewAudit};
use idem_core::{Operation, Tenant};
use idem_http::{IdempotencyLayer, RouteConfig, TenantSource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::auth::Actor;
use crate::backend::AdminBackend;
use crate::outbox::RelaySlot;
use crate::respond::{db_error, invalid, ok, problem};

/// The path prefix of this API.
pub const PREFIX: &str = "/admin/v1";
/// The tenant of admin requests' own key records.
pub const TENANT: &str = "admin";
/// The default page size.
pub const DEFAULT_LIMIT: u32 = 50;
/// The longest cursor accepted.
const MAX_CURSOR: usize = 1024;
/// The largest admin request body (a server's buffered-bytes budget and
/// each peer's share must hold one).
pub const MAX_BODY: usize = 64 << 10;
/// How long a read may take.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// What every handler shares.
#[derive(Clone)]
pub struct V1<B: AdminBackend> {
    /// The store.
    pub store: B,
    /// The relay of this process, once it runs.
    pub relay: RelaySlot<B>,
}

/// The routes of `/admin/v1` over `store`.
pub fn router<B: AdminBackend>(store: B, relay: RelaySlot<B>) -> Router {
    let st = V1 {
        store: store.clone(),
        relay,
    };
    Router::new()
        .merge(overview::routes::<B>())
        .merge(keys::routes::<B>(&store))
        .merge(outbox::routes::<B>(&store))
        .merge(webhooks::routes::<B>(&store))
        .merge(runs::routes::<B>(&store))
        .merge(tasks::routes::<B>(&store))
        .merge(audit::routes::<B>())
        .with_state(st)
}

/// The layer of one admin action: key required, tenant `admin`, operation
/// `admin.<action>`, 4xx answers not stored (a refusal changes nothing).
pub fn action<B: AdminBackend>(store: &B, name: &'static str) -> IdempotencyLayer<B> {
    let op = Operation::new(format!("admin.{name}"))
        .unwrap_or_else(|e| panic!("operation admin.{name}: {e}"));
    let tenant = Tenant::new(TENANT).unwrap_or_else(|e| panic!("tenant {TENANT}: {e}"));
    let mut cfg = RouteConfig::required(op, TenantSource::Static(tenant));
    cfg.store_client_errors.clear();
    cfg.max_request_bytes = MAX_BODY;
    IdempotencyLayer::new(store.clone(), cfg)
}

/// A page: `{"items": …, "next_cursor": …}`. `rows` holds up to `limit`
/// rows; a full page carries the cursor of its last row.
pub fn page<T, I: Serialize, K: Serialize>(
    rows: &[T],
    limit: u32,
    item: impl Fn(&T) -> I,
    cursor: impl Fn(&T) -> K,
) -> Response {
    /// Items as they serialize themselves (a task's payload as stored).
    #[derive(Serialize)]
    struct Page<I> {
        items: Vec<I>,
        next_cursor: Option<String>,
    }
    let next_cursor = (rows.len() as u32 >= limit)
        .then(|| rows.last().map(|r| encode_cursor(&cursor(r))))
        .flatten();
    ok(&Page {
        items: rows.iter().map(item).collect(),
        next_cursor,
    })
}

/// A list route's answer: the query's `400` when it was refused, else one
/// page of the rows `fetch` reads (within the read timeout) and the cursor
/// of the next.
pub async fn list_page<F, T, I: Serialize, K: Serialize, Fut>(
    filter: Result<F, Response>,
    limit: fn(&F) -> u32,
    fetch: impl FnOnce(F) -> Fut,
    item: impl Fn(&T) -> I,
    cursor: impl Fn(&T) -> K,
) -> Response
where
    Fut: Future<Output = Result<Vec<T>, idem_core::StoreError>>,
{
    let filter = match filter {
        Ok(f) => f,
        Err(r) => return r,
    };
    let limit = limit(&filter);
    match read(fetch(filter)).await {
        Ok(rows) => page(&rows, limit, item, cursor),
        Err(r) => r,
    }
}

fn encode_cursor<K: Serialize>(k: &K) -> String {
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(k).unwrap_or_default())
}

/// Decodes `?cursor=`: `400` when it is not one this API gave out.
pub fn cursor<K: DeserializeOwned>(given: Option<&str>) -> Result<Option<K>, Response> {
    let Some(text) = given else { return Ok(None) };
    let bad = || invalid("cursor: not a cursor this API returned (pass next_cursor as given)");
    if text.len() > MAX_CURSOR {
        return Err(bad());
    }
    let bytes = URL_SAFE_NO_PAD.decode(text).map_err(|_| bad())?;
    serde_json::from_slice(&bytes).map(Some).map_err(|_| bad())
}

/// `?limit=`: 1 to 200, default 50.
pub fn limit(given: Option<&str>) -> Result<u32, Response> {
    match given {
        None => Ok(DEFAULT_LIMIT),
        Some(s) => s
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=idem_core::admin::MAX_PAGE).contains(n))
            .ok_or_else(|| invalid("limit: must be an integer from 1 to 200")),
    }
}

/// A query value parsed by `parse`, or `400` naming `name` and saying `what`.
pub fn param<T>(
    given: Option<&str>,
    name: &str,
    what: &str,
    parse: impl FnOnce(&str) -> Option<T>,
) -> Result<Option<T>, Response> {
    match given {
        None => Ok(None),
        Some(s) => parse(s)
            .map(Some)
            .ok_or_else(|| invalid(&format!("{name}: {what}"))),
    }
}

/// A required query value.
pub fn required<T>(
    given: Option<&str>,
    name: &str,
    what: &str,
    parse: impl FnOnce(&str) -> Option<T>,
) -> Result<T, Response> {
    param(given, name, what, parse)?.ok_or_else(|| invalid(&format!("{name}: required; {what}")))
}

/// A short free-text filter (a topic, an endpoint, a subscriber): 1 to 255
/// visible characters.
pub fn text(s: &str) -> Option<String> {
    (!s.is_empty() && s.len() <= 255 && !s.chars().any(char::is_control)).then(|| s.to_owned())
}

/// A JSON request body, or `400` saying what is wrong with it.
pub fn body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Response> {
    serde_json::from_slice(bytes).map_err(|e| {
        // The parser's message may quote the body (an unknown field's
        // name): cut it to 300 bytes at a character boundary.
        let mut detail = format!("body: {e}");
        let mut end = detail.len().min(300);
        while !detail.is_char_boundary(end) {
            end -= 1;
        }
        detail.truncate(end);
        invalid(&detail)
    })
}

/// A read under the read timeout.
pub async fn read<T>(
    call: impl Future<Output = Result<T, idem_core::StoreError>>,
) -> Result<T, Response> {
    crate::respond::within(READ_TIMEOUT, call).await
}

/// `409` with its slug.
pub fn conflict(slug: &str, title: &str, detail: &str) -> Response {
    problem(StatusCode::CONFLICT, slug, title, Some(detail))
}

/// The actor of a request: the auth layer's [`Actor`], else `admin`.
pub fn actor(a: Option<&Actor>) -> &str {
    a.map_or("admin", |a| a.0.as_str())
}

/// The request's `Idempotency-Key`, as sent (the layer already checked it).
pub fn idempotency_key(headers: &HeaderMap) -> Option<&str> {
    headers.get("idempotency-key").and_then(|v| v.to_str().ok())
}

/// What an action records in the audit log.
pub struct Audit<'a> {
    /// The action (`keys.release`).
    pub action: &'a str,
    /// Its target.
    pub target: String,
    /// Details.
    pub detail: Value,
}

/// Writes an action's audit row in the request's transaction `tx` (after
/// the action, which succeeded).
pub async fn record<B: AdminBackend>(
    tx: &mut B::Tx,
    actor: Option<&Actor>,
    headers: &HeaderMap,
    audit: Audit<'_>,
) -> Result<(), Response> {
    let now = host_now_ms();
    let detail = audit.detail.to_string();
    let entry = NewAudit {
        at_ms: now,
        actor: self::actor(actor),
        action: audit.action,
        target: &audit.target,
        detail: &detail,
        idempotency_key: idempotency_key(headers),
    };
    <B as AdminStore>::insert_audit(tx, &entry)
        .await
        .map(|_| ())
        .map_err(db_error)
}

/// Now (unix ms) by the store's clock — the database's on PostgreSQL —
/// which an operator's action on a lease or an expiry is judged by, like
/// every process's.
pub fn now_ms<B: AdminBackend>(store: &B) -> i64 {
    idem_core::Clock::now_ms(&store.clock())
}

/// Now (unix ms) by this host's clock: for this process's own request
/// figures and the audit rows' times, which only people read.
pub fn host_now_ms() -> i64 {
    idem_core::Clock::now_ms(&idem_core::SystemClock)
}
