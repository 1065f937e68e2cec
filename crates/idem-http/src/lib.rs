//! # Idem over HTTP
//!
//! [`IdempotencyLayer`] puts the `Idempotency-Key` contract in front of any tower
//! service (an axum `Router`, a `MethodRouter`, a hyper service). For each
//! unsafe request it parses the key, resolves the tenant, fingerprints the
//! request, claims the key in a database transaction, and hands that open
//! transaction to the handler as an [`IdemTx`] request extension. The handler's
//! writes and the stored response commit together; a retry gets the stored
//! response with `Idempotent-Replayed: true`.
//!
//! ```
//! use axum::{Extension, Router, body::Body, http::{Request, StatusCode}, routing::post};
//! use idem_core::{Operation, Tenant};
//! use idem_http::{IdemTx, IdempotencyLayer, RouteConfig, TenantSource};
//! use idem_sqlite::{SqliteConfig, SqliteStore, SqliteTx};
//! use tower::ServiceExt;
//!
//! async fn create_order(Extension(tx): Extension<IdemTx<SqliteTx>>) -> StatusCode {
//!     let Ok(mut tx) = tx.lock().await else { return StatusCode::INTERNAL_SERVER_ERROR };
//!     match sqlx::query("INSERT INTO orders DEFAULT VALUES").execute(&mut **tx).await {
//!         Ok(_) => StatusCode::CREATED,
//!         // A 5xx rolls back the key together with the insert: a retry runs again.
//!         Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = std::env::temp_dir().join(format!("idem-http-doc-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir)?;
//! # let url = format!("sqlite://{}", dir.join("orders.db").display());
//! let store = SqliteStore::connect(&url, SqliteConfig::default()).await?;
//! store.migrate().await?;
//! sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY)").execute(store.pool()).await?;
//!
//! let config = RouteConfig::required(
//!     Operation::new("orders.create")?,
//!     TenantSource::Static(Tenant::new("acme")?),
//! );
//! let app = Router::new().route(
//!     "/orders",
//!     post(create_order).layer(IdempotencyLayer::new(store.clone(), config)),
//! );
//!
//! let request = || Request::post("/orders").header("idempotency-key", "order-1").body(Body::empty());
//! let first = app.clone().oneshot(request()?).await?;
//! let retry = app.oneshot(request()?).await?;
//! assert_eq!(first.status(), StatusCode::CREATED);
//! assert_eq!(retry.status(), StatusCode::CREATED);
//! assert_eq!(retry.headers()["idempotent-replayed"], "true");
//! let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders").fetch_one(store.pool()).await?;
//! assert_eq!(orders, 1);
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(()) }
//! ```
//!
//! Failures are `application/problem+json` ([`Rejection`]): missing key 400,
//! malformed key 400, mismatch 422, in flight 409 + `Retry-After`, body too
//! large 413, store unavailable 503 + `Retry-After` (nothing was written),
//! outcome unknown 503 + `Retry-After` (the commit was sent but not
//! acknowledged: retry with the same key to learn the outcome), handler
//! timeout 503 + `Retry-After` (rolled back). Every response the layer
//! produces carries a [`RequestOutcome`] extension saying what it did.
//!
//! The layer handles a request in two steps, usable on their own (a gateway
//! in front of another service reuses the first): [`admit`] checks the key
//! header, the tenant, the body limit and computes the fingerprint — an
//! [`Admitted`] request or a [`Rejection`], nothing written —; [`execute`]
//! claims the key through the [`Engine`](idem_core::Engine) (or replays it),
//! runs the handler in the transaction and stores and commits, or rolls back.
//!
//! The key serialises requests with **one** key: two requests with
//! different keys run concurrently, each in its own transaction. An invariant
//! that spans keys — "refunds never exceed the payment" — is the handler's
//! job, with the database's tools: a conditional update
//! (`UPDATE … SET refunded = refunded + $1 WHERE id = $2 AND refunded + $1
//! <= amount`, nothing moved → a business error) and a `CHECK` constraint.
//!
//! What is stored: 2xx and 3xx responses as completed; 4xx responses whose
//! status is in [`RouteConfig::store_client_errors`] (default 402, 409, 410,
//! 422) as failed; everything else (400 validation errors, 5xx, a panic) rolls
//! the key back with the handler's writes, so a retry executes again. A handler
//! can override this with a [`Disposition`] response extension.
//!
//! Response bodies are buffered to be stored; one above
//! [`RouteConfig::max_response_bytes`] (default 1 MiB) is rolled back and
//! answered with 500 `response-too-large`, because committing an effect whose
//! answer cannot be replayed would break the contract for the retry.

mod admission;
mod body;
mod budget;
mod config;
mod execution;
mod outcome;
mod problem;
mod service;
mod tx;

use http::HeaderName;

pub use admission::{Admitted, Keyed, admit};
pub use body::{DeclaredLimit, DeclaredLimitLayer, declared_over, read_body};
pub use budget::{
    BODY_BUDGET_REFUSALS, BODY_BYTES_BUFFERED, BodyBudget, OverBudget, Peer, Reservation,
};
pub use config::{Disposition, NEVER_REPLAYED, RouteConfig, RouteConfigError, TenantSource};
pub use execution::{execute, replay, stored_response};
pub use outcome::{REQUEST_DURATION, REQUESTS_TOTAL, RequestOutcome};
pub use problem::{Rejection, TYPE_BASE, problem, problem_with, store_problem};
pub use service::{
    Idempotency, IdempotencyLayer, ResponseFuture, record_admitted, record_answered, request_span,
};
pub use tx::{IdemTx, TxFinished};

/// The header carrying the key.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// Set to `true` on replayed responses.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
