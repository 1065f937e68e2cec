//! # Idem
//!
//! Idem makes duplicate delivery harmless: a repeated business intent never
//! produces a second business effect, and the caller still gets a consistent
//! answer. The idempotency key record is written in the same database
//! transaction as the business mutation, so both commit or neither does.
//!
//! This crate gathers the parts behind cargo features, the way sqlx gates its
//! drivers:
//!
//! | feature | module | what |
//! |---|---|---|
//! | (always) | the crate root, [`keys`] | [`idem_core`]: keys, scopes, fingerprints, [`Engine`], [`KeyStore`] |
//! | (always) | [`outbox`], [`inbox`], [`webhooks`] | each capability's types and store trait (`OutboxMessage`, `Subscriber`, `Receipt`, …) |
//! | (always) | the crate root | [`Collector`]: expired keys, inbox records, receipts and sent outbox rows purged in bounded batches |
//! | `sqlite` (default) | `idemkit::sqlite` | `SqliteStore`, the embedded backend |
//! | `postgres` | `idemkit::postgres` | `PgStore`, the production backend |
//! | `http` (default) | `idemkit::http` | `IdempotencyLayer` for axum and hyper |
//! | `outbox` | [`outbox`] as well | `Outbox::enqueue` in your transaction, and the `Dispatcher` relaying it |
//! | `inbox` | [`inbox`] as well | the `Inbox` and `Consumer`: effects once per subscriber |
//! | `nats` | `idemkit::nats` | NATS JetStream `NatsPublisher` and `NatsSource` |
//! | `webhooks` | [`webhooks`] as well | signature schemes, `Receiver`, `Processor`, `Forward` |
//! | (always) | [`steps`], [`patterns`] | runs and steps (`RunStore`, `StepKey`, `Fence`, …); the idempotent database patterns |
//! | `steps` | [`steps`] as well | `Runs`, `Workflow`, `Run` (phases, calls, sends, compensations), `Recovery`, `resolve` |
//! | `steps-http` | [`steps`] as well | `WorkflowService`: a multi-step operation behind the `Idempotency-Key` contract |
//! | `gateway` | `idemkit::gateway` | `Gateway`: the `Idempotency-Key` contract in front of an HTTP API that has none, as an axum router (needs a store with leases: `SqliteStore`, `PgStore`) |
//!
//! ```toml
//! [dependencies]
//! idemkit = { version = "0.1", default-features = false, features = ["postgres", "http"] }
//! ```
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

mod collector;
pub use collector::{Collected, Collector, CollectorConfig, KEYS_PURGED_TOTAL};

#[cfg(feature = "gateway")]
pub use idem_gateway as gateway;
#[cfg(feature = "http")]
pub use idem_http as http;
#[cfg(feature = "nats")]
pub use idem_nats as nats;
#[cfg(feature = "postgres")]
pub use idem_postgres as postgres;
#[cfg(feature = "sqlite")]
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

/// Runs and steps of operations that call other systems: the types and the
/// store ([`idem_core::steps`]) and, with the `steps` feature, the executor
/// (`idem_steps`).
pub mod steps {
    pub use idem_core::steps::*;
    #[cfg(feature = "steps")]
    pub use idem_steps::*;
}
