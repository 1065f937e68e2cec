//! The demo's routes, generic over the backend.

use std::collections::HashMap;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::header::{CONTENT_TYPE, LOCATION};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use bytes::Bytes;
use idem_core::{Clock, Operation, Policy, ResourceRef, Tenant};
use idem_http::{IdemTx, IdempotencyLayer, RouteConfig, TenantSource};
use idem_outbox::Outbox;
use serde_json::json;

use super::sql::{DemoSql, PaymentKey, PaymentRow, RefundRow};
use super::{
    DemoConfig, Event, PaymentOut, event_message, new_id, now_ms, parse_payment, parse_refund,
    payment_json, refund_json, refund_location, valid_id, valid_text,
};
use crate::respond::{db_error, internal, invalid, json_response, ok, within};

/// Customers whose id starts with this get `402 card-declined`.
pub const DECLINED_CUSTOMERS: &str = "cus_decline";

pub(super) struct App<S> {
    pub(super) store: S,
    // Shared: axum clones the state for every request.
    pub(super) tenant: std::sync::Arc<TenantSource>,
    /// Where events go, when they are on.
    outbox: Option<Outbox<S>>,
    read_timeout: Duration,
    /// The routes without the layer (the baseline) bound their body and
    /// their time as the layer does.
    pub(super) max_body_bytes: usize,
    pub(super) handler_timeout: Duration,
}

// Not derived: a derive would ask `S: Clone` of the state twice over.
impl<S: Clone> Clone for App<S> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            tenant: self.tenant.clone(),
            outbox: self.outbox.clone(),
            read_timeout: self.read_timeout,
            max_body_bytes: self.max_body_bytes,
            handler_timeout: self.handler_timeout,
        }
    }
}

fn no_payment() -> Response {
    crate::respond::not_found("No such payment")
}

/// Writes the event to the outbox in the request's transaction, when
/// events are on (else it is not even made).
async fn emit<S: DemoSql>(
    app: &App<S>,
    tx: &mut S::Tx,
    event: impl FnOnce() -> Event,
) -> Result<(), Response> {
    let Some(outbox) = &app.outbox else {
        return Ok(());
    };
    let message = event_message(&event()).map_err(internal)?;
    outbox
        .enqueue(tx, &message)
        .await
        .map(drop)
        .map_err(db_error)
}

/// A read route's tenant, once every id in its path could be one the demo
/// issued (anything else cannot exist: 404 without asking the database).
fn read_request<S>(app: &App<S>, headers: &HeaderMap, ids: &[&str]) -> Result<Tenant, Response> {
    let mut parts = axum::http::Request::new(()).into_parts().0;
    parts.headers = headers.clone();
    let tenant = app.tenant.resolve(&parts).map_err(|r| r.into_response())?;
    if !ids.iter().all(|id| valid_id(id)) {
        return Err(no_payment());
    }
    Ok(tenant)
}

fn payment_answer(status: StatusCode, row: &PaymentRow) -> Response {
    let body = match serde_json::to_vec(&PaymentOut::of(row)) {
        Ok(body) => body,
        Err(e) => return internal(e),
    };
    let mut res = (status, [(CONTENT_TYPE, "application/json")], body).into_response();
    if let Ok(location) = HeaderValue::try_from(format!("/v1/payments/{}", row.0)) {
        res.headers_mut().insert(LOCATION, location);
    }
    res.extensions_mut().insert(ResourceRef {
        kind: "payment".into(),
        id: row.0.clone(),
    });
    res
}

async fn create<S: DemoSql>(
    State(app): State<App<S>>,
    Extension(tx): Extension<IdemTx<S::Tx>>,
    Extension(tenant): Extension<Tenant>,
    body: Bytes,
) -> Response {
    let Ok(mut tx) = tx.lock().await else {
        return internal("transaction finished");
    };
    pay::<S>(&app, &mut tx, &tenant, &body).await
}

/// What `POST /v1/payments` does in the request's transaction `tx`: the
/// validation, the insert, the event, the answer. The baseline route
/// ([`super::baseline`]) does the same in a plain transaction.
pub(super) async fn pay<S: DemoSql>(
    app: &App<S>,
    tx: &mut S::Tx,
    tenant: &Tenant,
    body: &Bytes,
) -> Response {
    let p = match parse_payment(body) {
        Ok(p) => p,
        Err(r) => return r,
    };
    // Stripe-style test cards: these customers' cards are declined. A 402
    // is a business answer: stored with the key and replayed, nothing paid.
    if p.customer.starts_with(DECLINED_CUSTOMERS) {
        return idem_http::problem(
            StatusCode::PAYMENT_REQUIRED,
            "card-declined",
            "The card was declined",
            Some(
                "customers whose id starts with cus_decline are declined (a test rule of the demo)",
            ),
            None,
        );
    }
    let row: PaymentRow = (
        new_id("pay"),
        p.amount,
        p.currency,
        p.customer,
        p.reference,
        0,
        now_ms(),
    );
    match S::insert_payment(tx, tenant.as_str(), &row).await {
        Ok(true) => {
            let event = || Event::Created {
                tenant: tenant.to_string(),
                payment_id: row.0.clone(),
                amount: row.1,
            };
            if let Err(r) = emit(app, tx, event).await {
                return r;
            }
            payment_answer(StatusCode::CREATED, &row)
        }
        // The business natural key: this reference was used before.
        Ok(false) => {
            let Some(reference) = row.4.as_deref() else {
                return internal("a payment without a reference conflicted");
            };
            match S::payment_in(tx, tenant.as_str(), PaymentKey::Reference, reference).await {
                Ok(Some(old)) if old.1 == row.1 && old.2 == row.2 && old.3 == row.3 => {
                    payment_answer(StatusCode::OK, &old)
                }
                Ok(Some(old)) => idem_http::problem(
                    StatusCode::CONFLICT,
                    "reference-conflict",
                    "This reference belongs to a different payment",
                    Some(&format!("payment {}", old.0)),
                    None,
                ),
                Ok(None) => internal("the conflicting payment is gone"),
                Err(e) => db_error(e),
            }
        }
        Err(e) => db_error(e),
    }
}

async fn refund<S: DemoSql>(
    State(app): State<App<S>>,
    Extension(tx): Extension<IdemTx<S::Tx>>,
    Extension(tenant): Extension<Tenant>,
    Path(payment_id): Path<String>,
    body: Bytes,
) -> Response {
    if !valid_id(&payment_id) {
        return no_payment();
    }
    let amount = match parse_refund(&body) {
        Ok(a) => a,
        Err(r) => return r,
    };
    let Ok(mut tx) = tx.lock().await else {
        return internal("transaction finished");
    };
    // The conditional update first: when it moves no row, nothing was
    // written and the 422 (which is stored) commits nothing.
    match S::add_refund(&mut tx, tenant.as_str(), &payment_id, amount).await {
        Ok(true) => {}
        Ok(false) => {
            return match S::payment_in(&mut tx, tenant.as_str(), PaymentKey::Id, &payment_id).await
            {
                Ok(Some(p)) => idem_http::problem(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "refund-exceeds-payment",
                    "The refund is larger than what remains of the payment",
                    Some(&format!("{} remains refundable", p.1 - p.5)),
                    None,
                ),
                Ok(None) => no_payment(),
                Err(e) => db_error(e),
            };
        }
        Err(e) => return db_error(e),
    }
    let row: RefundRow = (new_id("re"), payment_id, amount, now_ms());
    if let Err(e) = S::insert_refund(&mut tx, tenant.as_str(), &row).await {
        return db_error(e);
    }
    let event = || Event::Refunded {
        tenant: tenant.to_string(),
        payment_id: row.1.clone(),
        amount,
    };
    if let Err(r) = emit(&app, &mut tx, event).await {
        return r;
    }
    json_response(
        StatusCode::CREATED,
        &refund_json(&row),
        Some(refund_location(&row)),
        Some(ResourceRef {
            kind: "refund".into(),
            id: row.0.clone(),
        }),
    )
}

async fn show_refund<S: DemoSql>(
    State(app): State<App<S>>,
    headers: HeaderMap,
    Path((payment_id, id)): Path<(String, String)>,
) -> Response {
    let tenant = match read_request(&app, &headers, &[&payment_id, &id]) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let read = app.store.refund(tenant.as_str(), &payment_id, &id);
    found(app.read_timeout, read, refund_json).await
}

/// A bounded read of one row, as JSON; 404 when there is none.
async fn found<T>(
    limit: Duration,
    read: impl Future<Output = Result<Option<T>, idem_core::StoreError>>,
    shape: fn(&T) -> serde_json::Value,
) -> Response {
    match within(limit, read).await {
        Ok(Some(row)) => ok(&shape(&row)),
        Ok(None) => no_payment(),
        Err(r) => r,
    }
}

async fn show<S: DemoSql>(
    State(app): State<App<S>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let tenant = match read_request(&app, &headers, &[&id]) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let read = app.store.payment(tenant.as_str(), &id);
    found(app.read_timeout, read, payment_json).await
}

async fn list<S: DemoSql>(
    State(app): State<App<S>>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let tenant = match read_request(&app, &headers, &[]) {
        Ok(t) => t,
        Err(r) => return r,
    };
    // A customer's payments, or the one payment of a `reference` (the
    // client's natural key: how a caller whose charge went unanswered finds
    // out whether it happened, without charging again).
    let (name, value) = match (q.get("customer"), q.get("reference")) {
        (Some(c), None) => ("customer", c),
        (None, Some(r)) => ("reference", r),
        (Some(_), Some(_)) => return invalid("give customer or reference, not both"),
        (None, None) => return invalid("query parameter customer or reference is required"),
    };
    if !valid_text(value) {
        return invalid(&format!(
            "{name} must be 1 to 255 characters without control characters"
        ));
    }
    let rows = if name == "customer" {
        within(
            app.read_timeout,
            app.store.payments_of(tenant.as_str(), value),
        )
        .await
    } else {
        let read = app.store.payment_by_reference(tenant.as_str(), value);
        within(app.read_timeout, read).await.map(Vec::from_iter)
    };
    match rows {
        Ok(rows) => ok(&json!({"data": rows.iter().map(payment_json).collect::<Vec<_>>()})),
        Err(r) => r,
    }
}

async fn effects<S: DemoSql>(
    State(app): State<App<S>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let tenant = match read_request(&app, &headers, &[&id]) {
        Ok(t) => t,
        Err(r) => return r,
    };
    match within(app.read_timeout, app.store.effects(tenant.as_str(), &id)).await {
        Ok((l, n)) => ok(&json!({"ledger_entries": l, "notifications": n})),
        Err(r) => r,
    }
}

/// The demo router. The tenant comes from `X-Tenant-Id`, trusted here only
/// because this is a demo; `default` when absent. Keys expire by the
/// store's clock, the one every process on the database reads.
pub fn router<S: DemoSql>(store: S, config: &DemoConfig) -> Router {
    let clock = store.clock();
    router_with_clock(store, config, clock)
}

/// The demo router on another clock (tests pass a TTL without sleeping).
pub fn router_with_clock<S: DemoSql, C: Clock + Clone>(
    store: S,
    config: &DemoConfig,
    clock: C,
) -> Router {
    let tenant = TenantSource::TrustedHeader {
        name: axum::http::HeaderName::from_static("x-tenant-id"),
        default: Tenant::new("default").ok(),
    };
    let route = |op: &'static str| {
        let op = Operation::new(op).unwrap_or_else(|e| panic!("operation name {op}: {e}"));
        let mut cfg = RouteConfig::required(op, tenant.clone());
        cfg.max_request_bytes = config.max_body_bytes;
        cfg.policy = Policy {
            mode: config.claim_mode,
            ..Policy::with_ttl(config.key_ttl)
        };
        cfg.handler_timeout = config.handler_timeout;
        IdempotencyLayer::new(store.clone(), cfg).with_clock(clock.clone())
    };
    super::baseline::mount(Router::new(), config.bench_routes)
        .route(
            "/v1/payments",
            post(create::<S>)
                .layer(route("payments.create"))
                .get(list::<S>),
        )
        .route("/v1/payments/{id}", get(show::<S>))
        .route(
            "/v1/payments/{id}/refunds",
            post(refund::<S>).layer(route("refunds.create")),
        )
        .route(
            "/v1/payments/{id}/refunds/{refund_id}",
            get(show_refund::<S>),
        )
        .route("/v1/payments/{id}/effects", get(effects::<S>))
        .with_state(App {
            outbox: config.events.then(|| Outbox::new(store.clone())),
            store,
            tenant: tenant.into(),
            read_timeout: config.read_timeout,
            max_body_bytes: config.max_body_bytes,
            handler_timeout: config.handler_timeout,
        })
}
