//! The demo's routes, generic over the backend.

use std::collections::HashMap;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Extension, Router};
use bytes::Bytes;
use idem_core::{Clock, Operation, Policy, ResourceRef, Tenant};
use idem_http::{IdemTx, IdempotencyLayer, RouteConfig, TenantSource};
use idem_outbox::Outbox;
use serde_json::json;

use idem_admin::respond::{db_error, internal, invalid, json_response, ok, within};

pub use crate::app::DECLINED_CUSTOMERS;
use crate::app::{App, emit, no_payment, pay, read_request};
use crate::config::DemoConfig;
use crate::events::Event;
use crate::input::{new_id, now_ms, parse_refund, valid_id, valid_text};
use crate::output::{payment_json, refund_json, refund_location};
use crate::sql::{DemoSql, PaymentKey, RefundRow};

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
    crate::baseline::mount(Router::new(), config.bench_routes)
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
