//! `idem upstream`: a sample payments API that is deliberately **not**
//! idempotent, for tours, tests and benchmarks (what `idem drill` should
//! fail, and what a gateway should fix). Kept in memory, bounded.
//!
//! - `POST /v1/payments` with a JSON object: a new payment `{id, …fields}`,
//!   `201` with it. In [`Mode::Naive`] the `Idempotency-Key` header is
//!   ignored: every POST is a new effect. In [`Mode::CheckThenAct`] the key
//!   is honoured the naive way — look it up, and if absent wait
//!   `delay`, create, and store the answer under the key — so a later retry
//!   is replayed (`Idempotent-Replayed: true`) but concurrent requests with
//!   one key all create a payment. Neither mode compares the payload. In
//!   naive mode `delay` holds the answer after the payment was created. A
//!   payment is created even when the client hangs up.
//!   The body may be a form (`application/x-www-form-urlencoded`, as
//!   Stripe's clients send): its fields become string fields.
//! - With `lose_first_answer` ([`Upstream::losing_first_answers`]): the
//!   first POST with each `Idempotency-Key` creates its payment and then
//!   the connection is closed without an answer — the seed's first failure
//!   case; a POST without a key is answered.
//! - `GET /v1/payments?customer=X` or `?reference=R` → `{"data":[…]}`, the
//!   payments whose field `customer` (`reference`) is that string — the
//!   lookup a gateway's `verify` route asks; `GET /v1/payments/{id}`;
//!   `PATCH /v1/payments/{id}` merges a JSON object into the payment (not
//!   `id`).
//! - `GET /_upstream/stats` → `{"requests":N,"payments":M}`: the requests
//!   that reached the routes (this one excluded), for tests that count what
//!   a client sent.
//!
//! Bounds: request bodies ≤ 1 MiB (413); at most [`MAX_PAYMENTS`] payments
//! and [`MAX_STORED_BYTES`] of them, beyond which `POST` answers `507`
//! `upstream-full` (nothing is dropped: a test never loses an effect it
//! counts).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use serde_json::{Map, Value, json};

use crate::respond::{invalid, not_found, ok, problem};

/// Payments kept, at most; beyond, `POST` answers `507`.
pub const MAX_PAYMENTS: usize = 1_000_000;
/// Bytes of payment JSON (and stored answers) kept, at most; beyond, `507`.
pub const MAX_STORED_BYTES: usize = 256 << 20;
/// The largest request body; `413` above.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// How the upstream treats `Idempotency-Key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Ignores the key: every POST is a new payment.
    Naive,
    /// Looks the key up, waits, creates, stores: retries are replayed,
    /// races are not caught.
    CheckThenAct,
}

#[derive(Default)]
struct Store {
    /// Payments in creation order.
    payments: Vec<Map<String, Value>>,
    by_id: HashMap<String, usize>,
    /// Answers stored under their key (check-then-act).
    answers: HashMap<String, Bytes>,
    /// Keys whose first answer was lost (`lose_first_answer`).
    lost: std::collections::HashSet<String>,
    bytes: usize,
}

struct Inner {
    mode: Mode,
    delay: Duration,
    lose_first_answer: bool,
    store: Mutex<Store>,
    requests: AtomicU64,
}

/// The upstream's memory; cheap to clone.
#[derive(Clone)]
pub struct Upstream(Arc<Inner>);

impl Upstream {
    /// An empty upstream. `delay` is the pause between the key lookup and
    /// the write in check-then-act mode.
    pub fn new(mode: Mode, delay: Duration) -> Self {
        Self(Arc::new(Inner {
            mode,
            delay,
            lose_first_answer: false,
            store: Mutex::new(Store::default()),
            requests: AtomicU64::new(0),
        }))
    }

    /// The same upstream, losing the answer of each key's first POST after
    /// committing it.
    pub fn losing_first_answers(mode: Mode, delay: Duration) -> Self {
        Self(Arc::new(Inner {
            mode,
            delay,
            lose_first_answer: true,
            store: Mutex::new(Store::default()),
            requests: AtomicU64::new(0),
        }))
    }

    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.0.store.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn created(body: Bytes, replayed: bool, id: &str) -> Response {
    let mut res = (
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response();
    if let Ok(loc) = HeaderValue::try_from(format!("/v1/payments/{id}")) {
        res.headers_mut().insert(header::LOCATION, loc);
    }
    if replayed {
        res.headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    res
}

fn full() -> Response {
    problem(
        StatusCode::INSUFFICIENT_STORAGE,
        "upstream-full",
        "The sample upstream keeps no more payments",
        None,
    )
}

fn object(body: &Bytes) -> Result<Map<String, Value>, Response> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(invalid("body must be a JSON object")),
        Err(e) => Err(invalid(&format!("body is not valid JSON: {e}"))),
    }
}

/// A JSON object, or a form's fields as strings.
fn fields(headers: &HeaderMap, body: &Bytes) -> Result<Map<String, Value>, Response> {
    let form = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/x-www-form-urlencoded"));
    if !form {
        return object(body);
    }
    if std::str::from_utf8(body).is_err() {
        return Err(invalid("the form is not UTF-8"));
    }
    Ok(form_urlencoded::parse(body)
        .map(|(k, v)| (k.into_owned(), Value::String(v.into_owned())))
        .collect())
}

/// Creates a payment; with `key`, stores the answer under it too.
fn insert(up: &Upstream, fields: Map<String, Value>, key: Option<String>) -> Response {
    let mut store = up.store();
    let id = format!("pay_{}", store.payments.len() + 1);
    let mut payment = Map::new();
    payment.insert("id".into(), Value::String(id.clone()));
    for (k, v) in fields {
        if k != "id" {
            payment.insert(k, v);
        }
    }
    let body = Bytes::from(Value::Object(payment.clone()).to_string());
    let cost = body.len() * if key.is_some() { 2 } else { 1 };
    if store.payments.len() >= MAX_PAYMENTS || store.bytes + cost > MAX_STORED_BYTES {
        return full();
    }
    store.bytes += cost;
    let index = store.payments.len();
    store.payments.push(payment);
    store.by_id.insert(id.clone(), index);
    if let Some(key) = key {
        // The naive store: a second writer of the same key overwrites the
        // first one's answer; both payments stay.
        store.answers.insert(key, body.clone());
    }
    created(body, false, &id)
}

async fn create(State(up): State<Upstream>, headers: HeaderMap, body: Bytes) -> Response {
    let fields = match fields(&headers, &body) {
        Ok(f) => f,
        Err(r) => return r,
    };
    let lose = up.0.lose_first_answer
        && headers
            .get("idempotency-key")
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .is_some_and(|key| up.store().lost.insert(key));
    let key = match up.0.mode {
        Mode::Naive => None,
        Mode::CheckThenAct => headers
            .get("idempotency-key")
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
    };
    // In a task of its own: a client that hangs up (a gateway killed
    // mid-forward) does not cancel the effect, as in a real service.
    let task = tokio::spawn(async move {
        let Some(key) = key else {
            // Naive: the effect at once, the answer after `--delay` (a
            // slow answer to lose).
            let answer = insert(&up, fields, None);
            tokio::time::sleep(up.0.delay).await;
            return answer;
        };
        // Check…
        let stored = up.store().answers.get(&key).cloned();
        if let Some(answer) = stored {
            let id = serde_json::from_slice::<Value>(&answer)
                .ok()
                .and_then(|v| v.get("id").and_then(Value::as_str).map(str::to_owned))
                .unwrap_or_default();
            return created(answer, true, &id);
        }
        // …then act, after a pause that widens the race window.
        tokio::time::sleep(up.0.delay).await;
        insert(&up, fields, Some(key))
    });
    match task.await {
        Ok(mut res) if lose => {
            res.extensions_mut()
                .insert(crate::http_server::CloseWithoutAnswer);
            res
        }
        Ok(res) => res,
        Err(_) => crate::respond::problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "Internal error",
            None,
        ),
    }
}

async fn list(State(up): State<Upstream>, Query(q): Query<HashMap<String, String>>) -> Response {
    let (field, value) = match (q.get("customer"), q.get("reference")) {
        (Some(c), None) => ("customer", c),
        (None, Some(r)) => ("reference", r),
        _ => return invalid("one query parameter, customer or reference, is required"),
    };
    let store = up.store();
    let data: Vec<Value> = store
        .payments
        .iter()
        .filter(|p| p.get(field).and_then(Value::as_str) == Some(value.as_str()))
        .map(|p| Value::Object(p.clone()))
        .collect();
    ok(&json!({ "data": data }))
}

async fn show(State(up): State<Upstream>, Path(id): Path<String>) -> Response {
    let store = up.store();
    match store.by_id.get(&id).and_then(|i| store.payments.get(*i)) {
        Some(p) => ok(&Value::Object(p.clone())),
        None => not_found("No such payment"),
    }
}

async fn patch(State(up): State<Upstream>, Path(id): Path<String>, body: Bytes) -> Response {
    let fields = match object(&body) {
        Ok(f) => f,
        Err(r) => return r,
    };
    let mut store = up.store();
    let added: usize = body.len();
    if store.bytes + added > MAX_STORED_BYTES {
        return full();
    }
    let Some(index) = store.by_id.get(&id).copied() else {
        return not_found("No such payment");
    };
    store.bytes += added;
    let Some(payment) = store.payments.get_mut(index) else {
        return not_found("No such payment");
    };
    for (k, v) in fields {
        if k != "id" {
            payment.insert(k, v);
        }
    }
    ok(&Value::Object(payment.clone()))
}

async fn stats(State(up): State<Upstream>) -> Response {
    let payments = up.store().payments.len();
    ok(&json!({
        "requests": up.0.requests.load(Ordering::Relaxed),
        "payments": payments,
    }))
}

async fn count(State(up): State<Upstream>, req: Request, next: Next) -> Response {
    if req.uri().path() != "/_upstream/stats" {
        up.0.requests.fetch_add(1, Ordering::Relaxed);
    }
    next.run(req).await
}

/// The upstream's routes, with `/healthz` and problem+json errors
/// ([`crate::routes::service`]), every request counted.
pub fn app(up: Upstream) -> Router {
    let routes = Router::new()
        .route("/v1/payments", post(create).get(list))
        .route("/v1/payments/{id}", get(show).patch(patch))
        .route("/_upstream/stats", get(stats))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(up.clone());
    crate::routes::service(
        routes,
        crate::admin::Auth::new(None, Default::default(), Default::default()),
        None,
    )
    .layer(axum::middleware::from_fn_with_state(up, count))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    async fn call(
        app: &Router,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: &str,
    ) -> (StatusCode, bool, Value) {
        let mut req = axum::http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json");
        if let Some(k) = key {
            req = req.header("idempotency-key", k);
        }
        let res = app
            .clone()
            .oneshot(req.body(Body::from(body.to_owned())).unwrap())
            .await
            .unwrap();
        let status = res.status();
        let replayed = res.headers().get("idempotent-replayed").is_some();
        let bytes = res.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            replayed,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    const PAY: &str = r#"{"amount":1,"customer":"c1"}"#;

    #[tokio::test]
    async fn naive_mode_makes_a_payment_per_post_whatever_the_key() {
        let app = app(Upstream::new(Mode::Naive, Duration::ZERO));
        for _ in 0..2 {
            let (status, replayed, _) = call(&app, "POST", "/v1/payments", Some("k"), PAY).await;
            assert_eq!((status, replayed), (StatusCode::CREATED, false));
        }
        let (_, _, list) = call(&app, "GET", "/v1/payments?customer=c1", None, "").await;
        assert_eq!(list["data"].as_array().unwrap().len(), 2);
        let (_, _, stats) = call(&app, "GET", "/_upstream/stats", None, "").await;
        assert_eq!(stats["requests"], 3, "the stats route is not counted");
    }

    #[tokio::test]
    async fn check_then_act_replays_a_later_retry_and_patch_changes_the_payment() {
        let app = app(Upstream::new(Mode::CheckThenAct, Duration::ZERO));
        let (_, _, first) = call(&app, "POST", "/v1/payments", Some("k"), PAY).await;
        let (status, replayed, again) = call(&app, "POST", "/v1/payments", Some("k"), PAY).await;
        assert_eq!((status, replayed), (StatusCode::CREATED, true));
        assert_eq!(again, first);
        let path = format!("/v1/payments/{}", first["id"].as_str().unwrap());
        let (status, _, patched) = call(&app, "PATCH", &path, None, r#"{"amount":5}"#).await;
        assert_eq!((status, &patched["amount"]), (StatusCode::OK, &json!(5)));
        let (_, _, replay) = call(&app, "POST", "/v1/payments", Some("k"), PAY).await;
        assert_eq!(replay["amount"], 1, "the stored answer, not the resource");
        for bad in ["[1]", "{"] {
            let (status, _, _) = call(&app, "POST", "/v1/payments", None, bad).await;
            assert_eq!(status, StatusCode::BAD_REQUEST);
        }
        let big = format!(r#"{{"x":"{}"}}"#, "a".repeat(MAX_BODY_BYTES));
        let (status, _, _) = call(&app, "POST", "/v1/payments", None, &big).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    }

    #[tokio::test]
    async fn forms_are_payments_too_references_are_looked_up_and_first_answers_can_be_lost() {
        let up = Upstream::losing_first_answers(Mode::Naive, Duration::ZERO);
        let app = app(up);
        let form = |key: Option<&str>| {
            let mut req = axum::http::Request::builder()
                .method("POST")
                .uri("/v1/payments")
                .header("content-type", "application/x-www-form-urlencoded");
            if let Some(k) = key {
                req = req.header("idempotency-key", k);
            }
            req.body(Body::from("amount=1000&reference=ord%201"))
                .unwrap()
        };
        let lost = app.clone().oneshot(form(Some("k1"))).await.unwrap();
        assert!(
            lost.extensions()
                .get::<crate::http_server::CloseWithoutAnswer>()
                .is_some(),
            "the first answer of a key is lost"
        );
        let again = app.clone().oneshot(form(Some("k1"))).await.unwrap();
        assert_eq!(again.status(), StatusCode::CREATED);
        assert!(
            again
                .extensions()
                .get::<crate::http_server::CloseWithoutAnswer>()
                .is_none()
        );
        let unkeyed = app.clone().oneshot(form(None)).await.unwrap();
        assert!(
            unkeyed
                .extensions()
                .get::<crate::http_server::CloseWithoutAnswer>()
                .is_none(),
            "no key: answered"
        );
        let (status, _, found) =
            call(&app, "GET", "/v1/payments?reference=ord%201", None, "").await;
        assert_eq!(status, StatusCode::OK);
        let data = found["data"].as_array().unwrap();
        assert_eq!(data.len(), 3, "naive: every POST is a payment, lost or not");
        assert_eq!(data[0]["amount"], "1000", "form fields are strings");
        let (status, _, _) = call(&app, "GET", "/v1/payments", None, "").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let (status, _, _) =
            call(&app, "GET", "/v1/payments?reference=a&customer=b", None, "").await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "one or the other");
    }
}
