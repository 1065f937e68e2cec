//! # idemkit
//!
//! Make duplicate delivery harmless: a repeated business intent never
//! produces a second business effect, and the caller still gets a
//! consistent answer. The idempotency key record is written in the same
//! database transaction as the business mutation, so both commit or neither
//! does.
//!
//! ## An axum route behind the `Idempotency-Key` contract
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use axum::{Router, routing::post};
//! use idemkit::http::{IdempotencyLayer, RouteConfig, TenantSource};
//! use idemkit::sqlite::{SqliteConfig, SqliteStore};
//! use idemkit::{Collector, CollectorConfig, Operation, Tenant};
//!
//! let url = "sqlite://app.db?mode=rwc";
//! # let dir = std::env::temp_dir().join(format!("idemkit-front-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir)?;
//! # let url = &format!("sqlite://{}?mode=rwc", dir.join("app.db").display());
//! let store = SqliteStore::connect(url, SqliteConfig::default()).await?;
//! store.migrate().await?; // idem's tables; without them every request is a 500
//!
//! // Deletes expired key records. Without it the key table grows forever.
//! let collector = Collector::new(store.clone(), CollectorConfig::default())?;
//! tokio::spawn(async move { collector.run(Duration::from_secs(60), std::future::pending()).await });
//!
//! // One tenant here; `TenantSource::Extension` takes it from your auth middleware.
//! let tenant = TenantSource::Static(Tenant::new("acme")?);
//! let config = RouteConfig::required(Operation::new("orders.create")?, tenant);
//! let app: Router = Router::new()
//!     .route("/orders", post(|| async { "created" }).layer(IdempotencyLayer::new(store, config)));
//! # use tower::ServiceExt as _;
//! # let send = |app: Router| async move {
//! #     let req = axum::http::Request::post("/orders")
//! #         .header("idempotency-key", "order-1")
//! #         .body(axum::body::Body::empty())?;
//! #     let res = app.oneshot(req).await?;
//! #     Ok::<_, Box<dyn std::error::Error>>((res.status(), res.headers().get("idempotent-replayed").cloned()))
//! # };
//! # let (first, replayed) = send(app.clone()).await?;
//! # assert_eq!((first.as_u16(), replayed), (200, None));
//! # let (again, replayed) = send(app).await?;
//! # assert_eq!((again.as_u16(), replayed.as_ref().map(|v| v.as_bytes())), (200, Some(&b"true"[..])));
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(()) }
//! ```
//!
//! A request without an `Idempotency-Key` is refused (`400`); a retry with
//! the same key and body gets the stored answer (`Idempotent-Replayed:
//! true`) without running the handler again; the same key with another body
//! is a `422`. A handler that writes to the database takes the layer's
//! transaction (`Extension<IdemTx<SqliteTx>>`) so its rows and the key
//! commit together: `examples/axum-layer` is the whole service, with the
//! tenant set by an authentication middleware.
//!
//! ## Run the `Collector`
//!
//! **If you use this crate as a library, run a [`Collector`].** Key records
//! (and inbox records, webhook receipts, sent outbox messages, finished
//! runs) are kept until they expire and then until something deletes them.
//! `idem serve` runs a collector; in your own application nothing else
//! does, and without one the key table grows forever. One collector per
//! database is enough.
//!
//! ## Map
//!
//! The parts sit behind cargo features, the way sqlx gates its drivers.
//! Every module below has its own page.
//!
//! | feature | module | what |
//! |---|---|---|
//! | (always) | the crate root, [`keys`] | keys, scopes, fingerprints, the [`Engine`] (`begin`/`finish`) and the [`KeyStore`] trait |
//! | (always) | the crate root | [`Collector`]: expired keys, inbox records, receipts and sent outbox rows purged in bounded batches |
//! | (always) | [`outbox`], [`inbox`], [`webhooks`] | each capability's types and store trait (`OutboxMessage`, `Subscriber`, `Receipt`, …) |
//! | (always) | [`steps`], [`patterns`] | runs and steps (`RunStore`, `StepKey`, `Fence`, …); the idempotent database patterns |
//! | (always) | [`tasks`] | polling agents' tasks: names, derived task ids and action keys, `TaskStore` |
//! | `sqlite` (default) | `sqlite` | `SqliteStore`, the embedded backend (one file) |
//! | `postgres` | `postgres` | `PgStore`, the production backend |
//! | `http` (default) | `http` | `IdempotencyLayer`, the tower layer for axum and hyper |
//! | `outbox` | [`outbox`] as well | `Outbox::enqueue` in your transaction, and the `Dispatcher` relaying it |
//! | `inbox` | [`inbox`] as well | the `Inbox` and `Consumer`: effects once per subscriber |
//! | `nats` | `nats` | NATS JetStream `NatsPublisher` and `NatsSource` |
//! | `webhooks` | [`webhooks`] as well | signature schemes, `Receiver`, `Processor`, `Forward` |
//! | `webhooks-axum` | [`webhooks`] as well | the receive route for axum (`webhooks::route`) |
//! | `steps` | [`steps`] as well | `Runs`, `Workflow`, `Run` (phases, calls, sends, compensations), `Recovery`, `resolve` |
//! | `steps-http` | [`steps`] as well | `WorkflowService`: a multi-step operation behind the `Idempotency-Key` contract |
//! | `tasks` | [`tasks`] as well | `Tasks`: observations that become tasks once, cursors, fenced claims, actions once |
//! | `tasks-http` | [`tasks`] as well | the task API over HTTP as an axum router (`tasks::http::router`) |
//! | `gateway` | `gateway` | `Gateway`: the `Idempotency-Key` contract in front of an HTTP API that has none, as an axum router (needs a store with leases: `SqliteStore`, `PgStore`) |
//! | `client` | `client` | `Client`: the retrying client, one key per intent, retries with that key (`idem-client`) |
//! | `admin` | `admin` | `admin::router`: the admin API (`/admin/v1`) and console as an axum router (`idem-admin`; no broker: `async-nats` only comes with `nats`) |
//!
//! The conformance drill (`idem-drill`) is a crate of its own.
//!
//! ## Depending on it
//!
//! idemkit is not on crates.io yet. From a clone of the repository (the path
//! is relative to your project), or by git without a clone:
//!
//! ```toml
//! [dependencies]
//! idemkit = { path = "../idem/crates/idemkit", features = ["sqlite", "http"] }
//! # or: idemkit = { git = "https://github.com/idem-rs/idem", features = ["sqlite", "http"] }
//! # once it is published: idemkit = { version = "0.1", features = ["sqlite", "http"] }
//! sqlx = { version = "0.8.6", default-features = false, features = ["runtime-tokio", "sqlite"] }
//! ```
//!
//! Your own queries run on the transaction Idem hands you, so they need the
//! same `sqlx` as Idem: 0.8.6 or a later 0.8, without default features, with
//! `runtime-tokio` and the driver's feature. For PostgreSQL:
//! `default-features = false, features = ["postgres", "http"]` on idemkit and
//! `postgres` instead of `sqlite` on sqlx.
//!
//! ## Without HTTP: the engine
//!
//! The layer is built on the [`Engine`]: claim a key in a transaction,
//! write your effect in it, finish with the answer to store. For work that
//! does not arrive over HTTP (a queue consumer, a cron job):
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use idemkit::sqlite::{SqliteConfig, SqliteStore};
//! use idemkit::{Begun, Completion, Engine, Finished, FingerprintSpec, IdempotencyKey, Operation, Policy,
//!            RequestParts, Scope, StoredResponse, Tenant};
//! # let dir = std::env::temp_dir().join(format!("idem-facade-doc-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir)?;
//! # let url = format!("sqlite://{}", dir.join("doc.db").display());
//! let store = SqliteStore::connect(&url, SqliteConfig::default()).await?;
//! store.migrate().await?;
//! let engine = Engine::new(store);
//!
//! let op = Operation::new("emails.send")?;
//! let scope = Scope::new(Tenant::new("acme")?, op.clone(), IdempotencyKey::new("welcome-42")?);
//! let fp = FingerprintSpec::default().fingerprint(&RequestParts {
//!     method: "SEND", operation: &op, target: "user/42", json: false, body: b"welcome",
//! });
//! let Begun::Fresh(claimed) = engine.begin(&scope, &fp, &Policy::default()).await? else {
//!     unreachable!("a new key is claimed");
//! };
//! // … record the email in `claimed.tx`, in the same transaction …
//! let sent = StoredResponse { status: 200, headers: vec![], body: b"sent".to_vec() };
//! let finished = engine.finish(claimed, &Completion::completed(sent)).await?;
//! assert!(matches!(finished, Finished::Committed));
//!
//! // The duplicate finds the stored outcome instead of sending again.
//! assert!(matches!(engine.begin(&scope, &fp, &Policy::default()).await?, Begun::Replay(_)));
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(()) }
//! ```

pub use idem_core::*;
/// The database patterns that make a write idempotent by itself (a
/// state-machine transition, a versioned update, an absolute upsert), from
/// `idem-sql`.
pub use idem_sql::patterns;

mod collector;
pub use collector::{Collected, Collector, CollectorConfig, KEYS_PURGED_TOTAL};

// The backends and the layer are whole crates, inlined so that each has a
// module page here with its own docs (a bare `pub use` shows one line).
#[cfg(feature = "admin")]
#[doc(inline)]
pub use idem_admin as admin;
#[cfg(feature = "client")]
#[doc(inline)]
pub use idem_client as client;
#[cfg(feature = "gateway")]
#[doc(inline)]
pub use idem_gateway as gateway;
#[cfg(feature = "http")]
#[doc(inline)]
pub use idem_http as http;
#[cfg(feature = "nats")]
#[doc(inline)]
pub use idem_nats as nats;
#[cfg(feature = "postgres")]
#[doc(inline)]
pub use idem_postgres as postgres;
#[cfg(feature = "sqlite")]
#[doc(inline)]
pub use idem_sqlite as sqlite;

/// The outbox: messages written in the business transaction
/// ([`idem_core::outbox`]) and, with the `outbox` feature, the dispatcher that
/// relays them (`idem_outbox`).
pub mod outbox {
    pub use idem_core::outbox::*;
    #[cfg(feature = "outbox")]
    pub use idem_outbox::*;
}

/// The inbox: messages applied once per subscriber ([`idem_core::inbox`])
/// and, with the `inbox` feature, the `Inbox` and `Consumer` (`idem_inbox`).
pub mod inbox {
    pub use idem_core::inbox::*;
    #[cfg(feature = "inbox")]
    pub use idem_inbox::*;
}

/// Webhooks: receipts and their store ([`idem_core::webhooks`]) and, with the
/// `webhooks` feature, signature schemes, receiver and workers
/// (`idem_webhooks`).
pub mod webhooks {
    pub use idem_core::webhooks::*;
    #[cfg(feature = "webhooks")]
    pub use idem_webhooks::*;
}

/// Tasks for polling agents: the types and the store ([`idem_core::tasks`])
/// and, with the `tasks` feature, the service (`idem_tasks`).
pub mod tasks {
    pub use idem_core::tasks::*;
    #[cfg(feature = "tasks")]
    pub use idem_tasks::*;
}

/// Runs and steps of operations that call other systems: the types and the
/// store ([`idem_core::steps`]) and, with the `steps` feature, the executor
/// (`idem_steps`).
pub mod steps {
    pub use idem_core::steps::*;
    #[cfg(feature = "steps")]
    pub use idem_steps::*;
}
