//! The upstream's handlers: create, list, show and patch payments, the
//! request count and its stats.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::memory::{MAX_PAYMENTS, MAX_STORED_BYTES, Mode, Upstream};
use idem_admin::respond::{invalid, not_found, ok, problem};

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

pub(super) async fn create(
    State(up): State<Upstream>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
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
            res.extensions_mut().insert(idem_httpd::CloseWithoutAnswer);
            res
        }
        Ok(res) => res,
        Err(_) => idem_admin::respond::problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "Internal error",
            None,
        ),
    }
}

pub(super) async fn list(
    State(up): State<Upstream>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
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

pub(super) async fn show(State(up): State<Upstream>, Path(id): Path<String>) -> Response {
    let store = up.store();
    match store.by_id.get(&id).and_then(|i| store.payments.get(*i)) {
        Some(p) => ok(&Value::Object(p.clone())),
        None => not_found("No such payment"),
    }
}

pub(super) async fn patch(
    State(up): State<Upstream>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
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

pub(super) async fn stats(State(up): State<Upstream>) -> Response {
    let payments = up.store().payments.len();
    ok(&json!({
        "requests": up.0.requests.load(Ordering::Relaxed),
        "payments": payments,
    }))
}

pub(super) async fn count(State(up): State<Upstream>, req: Request, next: Next) -> Response {
    if req.uri().path() != "/_upstream/stats" {
        up.0.requests.fetch_add(1, Ordering::Relaxed);
    }
    next.run(req).await
}
