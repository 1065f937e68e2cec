//! A tiny payments service: `POST /v1/payments` charges once per
//! `Idempotency-Key` (the Idem layer, on SQLite), `GET /v1/payments?customer=`
//! lists a customer's payments, so a drill can count the effects.

use axum::Router;
use axum::extract::{Extension, Json, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use idemkit::http::{IdemTx, IdempotencyLayer, RouteConfig, TenantSource};
use idemkit::sqlite::{SqliteConfig, SqliteStore, SqliteTx};
use idemkit::{Operation, Tenant};
use serde::Deserialize;
use serde_json::{Value, json};

/// The body of `POST /v1/payments`.
#[derive(Deserialize)]
pub struct NewPayment {
    amount: i64,
    currency: String,
    customer: String,
}

/// Opens (or creates) the database at `url`: Idem's key table and ours.
pub async fn open(url: &str) -> Result<SqliteStore, Box<dyn std::error::Error>> {
    let store = SqliteStore::connect(url, SqliteConfig::default()).await?;
    store.migrate().await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS payments (id INTEGER PRIMARY KEY, \
         customer TEXT NOT NULL, amount INTEGER NOT NULL, currency TEXT NOT NULL)",
    )
    .execute(store.pool())
    .await?;
    Ok(store)
}

/// The service: the charge runs in the transaction the layer opened, so
/// the payment and the stored answer commit together.
pub fn app(store: SqliteStore) -> Result<Router, Box<dyn std::error::Error>> {
    let config = RouteConfig::required(
        Operation::new("payments.create")?,
        TenantSource::Static(Tenant::new("shop")?),
    );
    let create = post(charge_once).layer(IdempotencyLayer::new(store.clone(), config));
    Ok(Router::new()
        .route("/v1/payments", create.merge(get(list)))
        .with_state(store))
}

/// The same service without the layer: every request charges again (what
/// the drill is there to catch).
pub fn app_without_idempotency(store: SqliteStore) -> Router {
    Router::new()
        .route("/v1/payments", post(charge_every_time).get(list))
        .with_state(store)
}

async fn charge_once(
    Extension(tx): Extension<IdemTx<SqliteTx>>,
    Json(p): Json<NewPayment>,
) -> (StatusCode, Json<Value>) {
    let Ok(mut tx) = tx.lock().await else {
        return (StatusCode::INTERNAL_SERVER_ERROR, Json(json!({})));
    };
    answer(insert(&p).fetch_one(&mut **tx).await, &p)
}

async fn charge_every_time(
    State(store): State<SqliteStore>,
    Json(p): Json<NewPayment>,
) -> (StatusCode, Json<Value>) {
    answer(insert(&p).fetch_one(store.pool()).await, &p)
}

fn insert(
    p: &NewPayment,
) -> sqlx::query::QueryScalar<'_, sqlx::Sqlite, i64, sqlx::sqlite::SqliteArguments<'_>> {
    sqlx::query_scalar(
        "INSERT INTO payments (customer, amount, currency) VALUES (?, ?, ?) RETURNING id",
    )
    .bind(&p.customer)
    .bind(p.amount)
    .bind(&p.currency)
}

fn answer(id: Result<i64, sqlx::Error>, p: &NewPayment) -> (StatusCode, Json<Value>) {
    match id {
        Ok(id) => (
            StatusCode::CREATED,
            Json(json!({"id": format!("pay_{id}"), "amount": p.amount,
                        "currency": p.currency, "customer": p.customer})),
        ),
        // A 5xx rolls the key back with the insert: a retry charges again.
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, Json(json!({}))),
    }
}

/// The query of `GET /v1/payments`.
#[derive(Deserialize)]
pub struct ByCustomer {
    customer: String,
}

async fn list(State(store): State<SqliteStore>, Query(q): Query<ByCustomer>) -> Json<Value> {
    let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM payments WHERE customer = ?")
        .bind(&q.customer)
        .fetch_all(store.pool())
        .await
        .unwrap_or_default();
    Json(json!({ "data": ids }))
}
