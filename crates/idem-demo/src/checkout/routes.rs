//! The checkout's routes: stock set to absolute values (`PUT`, idempotent
//! by nature, no key), orders created by runs (`POST`, key required) and
//! read with their steps.

use std::collections::HashMap;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use axum::routing::{get, post_service};
use bytes::Bytes;
use idem_core::steps::RunRecord;
use idem_core::{Policy, Tenant};
use idem_http::{RouteConfig, TenantSource};
use idem_sql::patterns::{Upsert, Value, Versioned, VersionedUpdate};
use idem_steps::{Runs, WorkflowService};
use serde_json::{Value as Json, json};

use idem_admin::respond::{invalid, json_response, not_found, ok, within, written_within};

use super::order::{NewOrder, order_json, run_of, valid_sku};
use super::saga::Checkout;
use crate::config::DemoConfig;
use crate::input::{now_ms, valid_id, valid_text};
use crate::sql::{OrderRow, StockRow};
use crate::store::Store;

/// The most stock one SKU may hold.
pub const MAX_STOCK: i64 = 1_000_000_000_000;

struct App<S> {
    store: S,
    tenant: TenantSource,
    read_timeout: Duration,
    stock: Upsert,
    versioned: Versioned,
}

impl<S: Clone> Clone for App<S> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            tenant: self.tenant.clone(),
            read_timeout: self.read_timeout,
            stock: self.stock.clone(),
            versioned: self.versioned.clone(),
        }
    }
}

fn tenant_of<S>(app: &App<S>, headers: &HeaderMap) -> Result<Tenant, Response> {
    let mut parts = axum::http::Request::new(()).into_parts().0;
    parts.headers = headers.clone();
    app.tenant.resolve(&parts).map_err(|r| r.into_response())
}

fn stock_answer(status: StatusCode, row: &StockRow) -> Response {
    let mut res = json_response(
        status,
        &json!({"sku": row.0, "available": row.1, "reserved": row.2}),
        None,
        None,
    );
    if let Ok(etag) = HeaderValue::try_from(format!("\"{}\"", row.3)) {
        res.headers_mut().insert(header::ETAG, etag);
    }
    res
}

fn no_sku() -> Response {
    not_found("No such SKU")
}

/// `If-Match: "N"`: the version the writer read.
fn if_match(headers: &HeaderMap) -> Result<Option<i64>, Response> {
    let mut values = headers.get_all(header::IF_MATCH).iter();
    let (Some(v), None) = (values.next(), values.next()) else {
        return match headers.get(header::IF_MATCH) {
            None => Ok(None),
            Some(_) => Err(invalid("If-Match was sent more than once")),
        };
    };
    v.to_str()
        .ok()
        .and_then(|s| {
            s.trim()
                .strip_prefix('"')?
                .strip_suffix('"')?
                .parse::<i64>()
                .ok()
        })
        .filter(|n| *n > 0)
        .map(Some)
        .ok_or_else(|| invalid("If-Match must be the ETag of the stock, such as \"3\""))
}

/// `PUT /v1/inventory/{sku}` `{"available": N}`: sets the stock to N — an
/// absolute value, so repeating it changes nothing. With `If-Match`, only
/// over the version read (`412` otherwise).
async fn put_stock<S: Store>(
    State(app): State<App<S>>,
    headers: HeaderMap,
    Path(sku): Path<String>,
    body: Bytes,
) -> Response {
    let tenant = match tenant_of(&app, &headers) {
        Ok(t) => t,
        Err(r) => return r,
    };
    if !valid_sku(&sku) {
        return invalid("sku must be 1 to 64 characters of A-Z, a-z, 0-9, '.', '_' or '-'");
    }
    let available = match serde_json::from_slice::<Json>(&body) {
        Ok(v) => match v.get("available").and_then(Json::as_i64) {
            Some(n) if (0..=MAX_STOCK).contains(&n) => n,
            _ => {
                return invalid(&format!(
                    "available must be an integer between 0 and {MAX_STOCK}"
                ));
            }
        },
        Err(e) => return invalid(&format!("body is not valid JSON: {e}")),
    };
    let expected = match if_match(&headers) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let write = async {
        let mut tx = app.store.begin().await?;
        let key = [Value::Text(tenant.as_str()), Value::Text(&sku)];
        let now = Value::Int(now_ms());
        let outcome = match expected {
            None => {
                app.stock
                    .write(&mut tx, &key, &[Value::Int(available), now])
                    .await?;
                None
            }
            Some(v) => Some(
                app.versioned
                    .update(
                        &mut tx,
                        &key,
                        v,
                        &[("available", Value::Int(available)), ("updated_at_ms", now)],
                    )
                    .await?,
            ),
        };
        app.store.commit(tx).await?;
        Ok::<_, idem_core::StoreError>(outcome)
    };
    match written_within(app.read_timeout, write).await {
        Ok(None | Some(VersionedUpdate::Updated { .. })) => {}
        Ok(Some(VersionedUpdate::Stale { current })) => {
            return idem_http::problem(
                StatusCode::PRECONDITION_FAILED,
                "precondition-failed",
                "The stock changed since it was read",
                Some(&format!("it is at version {current}; read it again")),
                None,
            );
        }
        Ok(Some(VersionedUpdate::Missing)) => {
            return idem_http::problem(
                StatusCode::PRECONDITION_FAILED,
                "precondition-failed",
                "There is no such stock to update",
                Some("If-Match names a version of a SKU that does not exist"),
                None,
            );
        }
        Err(r) => return r,
    }
    match within(app.read_timeout, app.store.stock(tenant.as_str(), &sku)).await {
        Ok(Some(row)) => stock_answer(StatusCode::OK, &row),
        Ok(None) => idem_admin::respond::internal("the stock just written is gone"),
        Err(r) => r,
    }
}

async fn show_stock<S: Store>(
    State(app): State<App<S>>,
    headers: HeaderMap,
    Path(sku): Path<String>,
) -> Response {
    let tenant = match tenant_of(&app, &headers) {
        Ok(t) => t,
        Err(r) => return r,
    };
    if !valid_sku(&sku) {
        return no_sku();
    }
    match within(app.read_timeout, app.store.stock(tenant.as_str(), &sku)).await {
        Ok(Some(row)) => stock_answer(StatusCode::OK, &row),
        Ok(None) => no_sku(),
        Err(r) => r,
    }
}

fn no_order() -> Response {
    not_found("No such order")
}

fn row_json(row: &OrderRow) -> Json {
    let o = NewOrder {
        customer: row.1.clone(),
        sku: row.2.clone(),
        quantity: row.3,
        amount: row.4,
        currency: row.5.clone(),
        email: row.6.clone(),
    };
    order_json(
        &row.0,
        &row.7,
        &o,
        row.9.as_deref(),
        row.8.as_deref(),
        row.10,
    )
}

fn steps_json(run: Option<&RunRecord>) -> Json {
    let steps: Vec<Json> = run
        .map(|r| {
            r.steps
                .iter()
                .map(|s| json!({"name": s.name, "state": s.state.as_str(), "attempts": s.attempts}))
                .collect()
        })
        .unwrap_or_default();
    Json::Array(steps)
}

/// `GET /v1/orders/{id}`: the order and its run's steps.
async fn show_order<S: Store>(
    State(app): State<App<S>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let tenant = match tenant_of(&app, &headers) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let Some(run_id) = run_of(&id).filter(|_| valid_id(&id)) else {
        return no_order();
    };
    let read = async {
        let order = app.store.order(tenant.as_str(), &id).await?;
        let run = match &order {
            Some(_) => app.store.load_run(&run_id).await?,
            None => None,
        };
        Ok((order, run))
    };
    match within(app.read_timeout, read).await {
        Ok((Some(order), run)) => {
            let run = run.filter(|r| r.scope.tenant == tenant);
            let mut body = row_json(&order);
            body["steps"] = steps_json(run.as_ref());
            if let Some(r) = &run {
                body["run"] = json!({"id": r.id.as_str(), "state": r.state.as_str()});
            }
            ok(&body)
        }
        Ok((None, _)) => no_order(),
        Err(r) => r,
    }
}

/// `GET /v1/orders?customer=C`.
async fn list_orders<S: Store>(
    State(app): State<App<S>>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let tenant = match tenant_of(&app, &headers) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let Some(customer) = q.get("customer") else {
        return invalid("query parameter customer is required");
    };
    if !valid_text(customer) {
        return invalid("customer must be 1 to 255 characters without control characters");
    }
    match within(
        app.read_timeout,
        app.store.orders_of(tenant.as_str(), customer),
    )
    .await
    {
        Ok(rows) => ok(&json!({"data": rows.iter().map(row_json).collect::<Vec<_>>()})),
        Err(r) => r,
    }
}

/// The stock routes, and — with `runs` (the checkout's workflow registered)
/// — the order routes and the checkout page (`/checkout`).
pub fn router<S: Store>(
    store: S,
    runs: Option<Runs<S>>,
    config: &DemoConfig,
    respond_within: Duration,
) -> anyhow::Result<Router> {
    let tenant = TenantSource::TrustedHeader {
        name: axum::http::HeaderName::from_static("x-tenant-id"),
        default: Tenant::new("default").ok(),
    };
    let app = App {
        store: store.clone(),
        tenant: tenant.clone(),
        read_timeout: config.read_timeout,
        stock: Upsert::new(
            "demo_inventory",
            &["tenant_id", "sku"],
            &["available", "updated_at_ms"],
        )?
        .bumping("version")?,
        versioned: Versioned::new("demo_inventory", &["tenant_id", "sku"], "version")?,
    };
    // The stock's body is read by the handler: bounded like every other.
    let mut router = Router::new()
        .route(
            "/v1/inventory/{sku}",
            get(show_stock::<S>).put(put_stock::<S>),
        )
        .layer(DefaultBodyLimit::max(config.max_body_bytes))
        .layer(idem_http::DeclaredLimitLayer::new(config.max_body_bytes));
    let orders = runs.is_some();
    if let Some(runs) = runs {
        let mut route = RouteConfig::required(Checkout::operation()?, tenant);
        route.max_request_bytes = config.max_body_bytes;
        route.policy = Policy::with_ttl(config.key_ttl);
        let service = WorkflowService::new(runs, route)?.respond_within(respond_within)?;
        router = router
            .route("/v1/orders", post_service(service).get(list_orders::<S>))
            .route("/v1/orders/{id}", get(show_order::<S>));
    }
    let router = router.with_state(app);
    Ok(if orders {
        router.merge(super::page::router())
    } else {
        router
    })
}
