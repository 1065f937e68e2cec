//! Key records: `GET /admin/v1/keys`, `GET /admin/v1/key`, `POST
//! /admin/v1/keys/release`.

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Extension, Router};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use idem_core::admin::{KeyDetail, KeyFilter, KeyRelease, KeySummary, ReleaseRequest};
use idem_core::{IdempotencyKey, Operation, RecordState, Scope, StoredResponse, Tenant};
use idem_http::IdemTx;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Audit, V1, action, conflict, cursor, limit, param, read, record, required};
use crate::auth::Actor;
use crate::backend::AdminBackend;
use crate::respond::{db_error, internal, not_found, ok, rfc3339};

const TENANT: &str = "a tenant: 1 to 64 characters of [A-Za-z0-9._:-]";
const OPERATION: &str = "an operation: 1 to 64 characters of [A-Za-z0-9._:-]";
const KEY: &str = "an idempotency key: 1 to 255 visible ASCII characters";

/// The routes.
pub fn routes<B: AdminBackend>(store: &B) -> Router<V1<B>> {
    Router::new()
        .route("/admin/v1/keys", get(list::<B>))
        .route("/admin/v1/key", get(show::<B>))
        .route(
            "/admin/v1/keys/release",
            post(release::<B>).layer(action(store, "keys.release")),
        )
}

/// A key record as listed.
pub fn key_json(k: &KeySummary) -> Value {
    json!({
        "tenant": k.tenant,
        "operation": k.operation,
        "key": k.key,
        "state": k.state.as_str(),
        "fingerprint": k.fingerprint.to_hex(),
        "status": k.status,
        "created_at": rfc3339(k.created_at_ms),
        "updated_at": rfc3339(k.updated_at_ms),
        "expires_at": rfc3339(k.expires_at_ms),
        "locked_until": k.locked_until_ms.map(rfc3339),
        "leased": k.leased,
    })
}

/// A stored response: the body as text when it is UTF-8, else base64.
pub fn response_json(r: &StoredResponse) -> Value {
    let text = std::str::from_utf8(&r.body).ok();
    json!({
        "status": r.status,
        "headers": r.headers,
        "body": text,
        "body_base64": text.is_none().then(|| STANDARD.encode(&r.body)),
        "body_bytes": r.body.len(),
    })
}

/// A key record with what it stores.
pub fn detail_json(d: &KeyDetail) -> Value {
    let mut v = key_json(&d.summary);
    v["response"] = d.response.as_ref().map_or(Value::Null, response_json);
    v["resource"] = d
        .resource
        .as_ref()
        .map_or(Value::Null, |r| json!({"type": r.kind, "id": r.id}));
    v["recovery_point"] = json!(d.recovery_point);
    v["on_unknown"] = json!(d.on_unknown.map(|p| p.as_str()));
    v
}

fn tenant(s: &str) -> Option<Tenant> {
    Tenant::new(s).ok()
}
fn operation(s: &str) -> Option<Operation> {
    Operation::new(s).ok()
}
fn key(s: &str) -> Option<IdempotencyKey> {
    IdempotencyKey::new(s).ok()
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    tenant: Option<String>,
    operation: Option<String>,
    prefix: Option<String>,
    state: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

async fn list<B: AdminBackend>(State(st): State<V1<B>>, Query(q): Query<ListQuery>) -> Response {
    let filter = (|| {
        Ok::<_, Response>(KeyFilter {
            tenant: param(q.tenant.as_deref(), "tenant", TENANT, tenant)?,
            operation: param(q.operation.as_deref(), "operation", OPERATION, operation)?,
            prefix: param(
                q.prefix.as_deref(),
                "prefix",
                "1 to 255 visible ASCII characters",
                |s| {
                    (!s.is_empty()
                        && s.len() <= 255
                        && s.bytes().all(|b| (0x20..0x7f).contains(&b)))
                    .then(|| s.to_owned())
                },
            )?,
            state: param(
                q.state.as_deref(),
                "state",
                "pending, completed or failed",
                RecordState::parse,
            )?,
            after: cursor(q.cursor.as_deref())?,
            limit: limit(q.limit.as_deref())?,
        })
    })();
    let fetch = |f: KeyFilter| async move { st.store.list_keys(&f).await };
    super::list_page(
        filter,
        |f| f.limit,
        fetch,
        key_json,
        |k| (k.tenant.clone(), k.operation.clone(), k.key.clone()),
    )
    .await
}

#[derive(Debug, Deserialize)]
struct OneQuery {
    tenant: Option<String>,
    operation: Option<String>,
    key: Option<String>,
}

fn scope_of(t: Option<&str>, o: Option<&str>, k: Option<&str>) -> Result<Scope, Response> {
    Ok(Scope::new(
        required(t, "tenant", TENANT, tenant)?,
        required(o, "operation", OPERATION, operation)?,
        required(k, "key", KEY, key)?,
    ))
}

async fn show<B: AdminBackend>(State(st): State<V1<B>>, Query(q): Query<OneQuery>) -> Response {
    let scope = match scope_of(
        q.tenant.as_deref(),
        q.operation.as_deref(),
        q.key.as_deref(),
    ) {
        Ok(s) => s,
        Err(r) => return r,
    };
    match read(st.store.key_detail(&scope)).await {
        Ok(Some(d)) => ok(&detail_json(&d)),
        Ok(None) => not_found("No such key record"),
        Err(r) => r,
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleaseBody {
    tenant: Option<String>,
    operation: Option<String>,
    key: Option<String>,
    #[serde(default)]
    force: bool,
    #[serde(default)]
    upstream_checked: bool,
}

async fn release<B: AdminBackend>(
    State(st): State<V1<B>>,
    Extension(tx): Extension<IdemTx<B::Tx>>,
    actor: Option<Extension<Actor>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let b: ReleaseBody = match super::body(&body) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let scope = match scope_of(
        b.tenant.as_deref(),
        b.operation.as_deref(),
        b.key.as_deref(),
    ) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let Ok(mut tx) = tx.lock().await else {
        return internal("transaction finished");
    };
    let now = super::now_ms(&st.store);
    let request = ReleaseRequest {
        force: b.force,
        upstream_checked: b.upstream_checked,
    };
    let outcome = match B::release_key(&mut tx, &scope, request, now).await {
        Ok(o) => o,
        Err(e) => return db_error(e),
    };
    if let Some(refusal) = release_refusal(&outcome, b.force, ReleaseHints::API) {
        return match refusal.slug {
            "not-found" => not_found("No such key record"),
            slug => conflict(slug, refusal.title, &refusal.detail),
        };
    }
    let target = format!(
        "{}/{}/{}",
        scope.tenant.as_str(),
        scope.operation.as_str(),
        scope.key.as_str()
    );
    let audit = Audit {
        action: "keys.release",
        target,
        detail: json!({"tenant": scope.tenant.as_str(), "operation": scope.operation.as_str(),
                       "key": scope.key.as_str(), "force": b.force,
                       "upstream_checked": b.upstream_checked}),
    };
    if let Err(r) = record::<B>(&mut tx, actor.as_ref().map(|a| &a.0), &headers, audit).await {
        return r;
    }
    let mut answer = json!({"released": true, "tenant": scope.tenant.as_str(),
               "operation": scope.operation.as_str(), "key": scope.key.as_str()});
    if b.force {
        answer["warning"] = json!(FORCED_WARNING);
    }
    ok(&answer)
}

/// What a forced release cannot stop.
pub const FORCED_WARNING: &str = "a forward the holder already sent keeps running upstream and \
    may still land there; its answer is not stored (its token writes nothing)";

/// How an operator asks for more, in the words of their surface.
#[derive(Debug, Clone, Copy)]
pub struct ReleaseHints {
    /// How to force (`send "force": true`, `add --force`).
    pub force: &'static str,
    /// How to confirm the upstream was checked.
    pub checked: &'static str,
}

impl ReleaseHints {
    /// The admin API's JSON fields.
    pub const API: Self = Self {
        force: "send \"force\": true",
        checked: "send \"upstream_checked\": true",
    };
    /// `idem keys release`'s flags.
    pub const CLI: Self = Self {
        force: "add --force",
        checked: "add --upstream-checked",
    };
}

/// Why a release released nothing, as a problem's slug, title and detail.
pub struct Refusal {
    /// `not-found`, `not-pending`, `not-releasable`, `lease-live`,
    /// `upstream-unchecked`.
    pub slug: &'static str,
    /// The problem's title.
    pub title: &'static str,
    /// What to do.
    pub detail: String,
}

/// The refusal of a release that did nothing, `None` once released.
pub fn release_refusal(outcome: &KeyRelease, force: bool, hints: ReleaseHints) -> Option<Refusal> {
    let (slug, title, detail) = match outcome {
        KeyRelease::Released => return None,
        KeyRelease::NotFound => (
            "not-found",
            "No such key record",
            "no record for this key".into(),
        ),
        KeyRelease::NotPending(state) => (
            "not-pending",
            "The key record is not pending",
            format!("it is {state}: its answer is stored and replayed; nothing to release"),
        ),
        KeyRelease::NotReleasable => (
            "not-releasable",
            "The key record is not held by a lease",
            "it is held by an open transaction or a multi-step run: resolve the run instead".into(),
        ),
        KeyRelease::LeaseLive(until) => (
            "lease-live",
            "The key record's lease is live",
            format!(
                "its holder may still be forwarding until {}: a forward already sent keeps running \
                 upstream and may still land there even after a release; {} to release it anyway",
                rfc3339(*until),
                hints.force
            ),
        ),
        KeyRelease::UpstreamUnchecked(policy) => (
            "upstream-unchecked",
            "Check the upstream before releasing this key",
            format!(
                "the key's route {} keeps unknown outcomes because its upstream does not \
                 deduplicate: after a release the next retry forwards the request again, a second \
                 effect if the first landed{}; look the request up upstream, then {}",
                policy.map_or("(of an older version)".to_owned(), |p| format!(
                    "(on_unknown = \"{p}\")"
                )),
                if force {
                    " or if the forward still running lands"
                } else {
                    ""
                },
                hints.checked
            ),
        ),
    };
    Some(Refusal {
        slug,
        title,
        detail,
    })
}
