//! # Idem core
//!
//! The domain of Idem, with no database, network or file I/O: it knows nothing
//! of SQL drivers, brokers or HTTP.
//!
//! - [`IdempotencyKey`], [`Tenant`], [`Operation`] and [`Scope`]: who a key
//!   belongs to; each can only be built valid.
//! - [`Fingerprint`] and [`FingerprintSpec`]: what makes two requests the same
//!   intent (SHA-256 over method, operation, target and canonical body; JSON
//!   numbers compared by exact value, so a different JSON value is always a
//!   different fingerprint).
//! - [`RecordState`], [`StoredRecord`], [`Completion`] and [`decide`]: the record
//!   state machine and the replay / mismatch / in-flight decision.
//! - [`Policy`]: per-operation TTL and bounded wait.
//! - [`KeyStore`]: the capability a backend implements (`idem-sqlite`,
//!   `idem-postgres`), handing its open transaction to business code.
//! - [`Engine`]: claim, run the mutation in the same transaction, store, replay.
//! - [`OutboxMessage`], [`MessageId`], [`Topic`], [`Subscriber`], [`Backoff`]
//!   and the [`OutboxStore`] / [`InboxStore`] capabilities: messages written in
//!   the business transaction, and messages applied once per subscriber;
//!   [`OutboxWriter`], the write side the `Outbox` of `idem-outbox` uses.
//! - [`NewReceipt`], [`Receipt`], [`ReceiptState`] and the [`WebhookStore`]
//!   capability: webhook deliveries stored before they are acknowledged.
//! - [`RoundLoop`], [`Rounds`] and [`Pause`]: "run rounds until shutdown", the
//!   shape of the dispatcher's, consumer's, processor's and collector's loops.
//! - [`ConfigError`]: what every library `*Config`'s `validate()` returns.
//! - [`failpoint`]: crash points for the drills (`IDEM_FAILPOINTS`).
//!
//! ```
//! use idem_core::{IdempotencyKey, KeyError};
//! let key = IdempotencyKey::from_header(br#""order-42""#).unwrap();
//! assert_eq!(key.as_str(), "order-42");
//! assert_eq!(IdempotencyKey::from_header(b""), Err(KeyError::Empty));
//! ```

#[cfg(feature = "conformance")]
pub mod conformance;

pub mod failpoint;

mod clock;
mod config;
mod engine;
mod enqueue;
mod error;
mod fingerprint;
mod key;
mod message;
mod policy;
mod record;
mod rounds;
mod scope;
mod store;
mod webhook;

pub use clock::{Clock, ManualClock, SystemClock};
pub use config::ConfigError;
pub use engine::{Begun, BoxFuture, Claimed, Engine, Outcome};
pub use enqueue::OutboxWriter;
pub use error::{BoxError, Error, ErrorChain, KeyError, ScopeError, StoreError};
pub use fingerprint::{Fingerprint, FingerprintSpec, RequestParts};
pub use key::IdempotencyKey;
pub use message::{
    Backoff, MessageError, MessageId, OutboxColumns, OutboxMessage, OutboxRecord, OutboxStats,
    RESERVED_HEADERS, Subscriber, Topic,
};
pub use policy::Policy;
pub use record::{
    Completion, Decision, RecordColumns, RecordState, ResourceRef, StoredRecord, StoredResponse,
    decide, headers_from_json, headers_to_json,
};
pub use rounds::{Pause, RoundLoop, Rounds};
pub use scope::{NAME_MAX_LEN, Operation, Scope, Tenant};
pub use store::{Claim, InboxStore, KeyStore, OutboxStore, Wake, WebhookStore};
pub use webhook::{Accepted, Finish, NewReceipt, Receipt, ReceiptColumns, ReceiptState, Replay};

/// One schema migration: applied once per database, in `version` order, inside
/// a transaction. Backends and applications list theirs as constants.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Strictly increasing within a component.
    pub version: i64,
    /// Short name for logs.
    pub name: &'static str,
    /// The SQL, possibly several statements.
    pub sql: &'static str,
}
