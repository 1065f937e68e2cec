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
//! - [`Policy`]: per-operation TTL and bounded wait.
//! - [`Clock`] and the rest of [`clock`]: the time every lease, takeover and
//!   expiry is judged by — the host's ([`SystemClock`]) or a database
//!   server's, followed from samples ([`ReferenceClock`]); a store names the
//!   one its records are judged by ([`KeyStore::clock`]).
//! - [`Engine`]: claim, run the mutation in the same transaction, store, replay.
//! - [`KeyStore`] and the rest of [`keys`] (record states, [`Completion`],
//!   [`StoredRecord`], the pure [`keys::decide`]): the capability a backend
//!   implements (`idem-sqlite`, `idem-postgres`), handing its open transaction
//!   to business code.
//!
//! The other capabilities each have a module, the store trait beside its
//! types:
//!
//! - [`outbox`]: [`outbox::OutboxMessage`], [`outbox::MessageId`],
//!   [`outbox::Topic`], the [`outbox::OutboxStore`] a dispatcher claims
//!   through and the [`outbox::OutboxWriter`] the `Outbox` of `idem-outbox`
//!   writes through: messages written in the business transaction.
//! - [`position`]: [`position::Position`] and the [`position::PositionStore`]:
//!   a log consumer's offsets, kept with its effects (Kafka).
//! - [`inbox`]: [`inbox::Subscriber`] and the [`inbox::InboxStore`]: messages
//!   applied once per subscriber.
//! - [`webhooks`]: [`webhooks::NewReceipt`], [`webhooks::Receipt`] and the
//!   [`webhooks::WebhookStore`]: webhook deliveries stored before they are
//!   acknowledged.
//! - [`steps`]: runs and steps of operations that call other systems —
//!   [`steps::RunRecord`], [`steps::StepRecord`], leases with a
//!   [`steps::Fence`], derived downstream keys ([`steps::StepKey`]) and the
//!   [`steps::RunStore`] the `idem-steps` executor works through.
//! - [`leased`]: keys claimed with a lease and committed at once, for work
//!   outside the database (the gateway's forwards): [`leased::LeaseToken`],
//!   the pure [`leased::leased_decision`] and the [`leased::LeasedKeyStore`].
//! - [`Backoff`] (retry delays), [`headers`] (how header lists are stored) and
//!   [`failpoint`] (crash points for the drills, compiled in with the
//!   `failpoints` feature only) serve all of them, as do [`RoundLoop`],
//!   [`Rounds`] and [`Pause`] ("run rounds until shutdown", the shape of the
//!   dispatcher's, consumer's, processor's and collector's loops) and
//!   [`ConfigError`] (what every library `*Config`'s `validate()` returns).
//! - [`labels`]: metric label values a request chooses (a task's queue),
//!   kept only for names that have state, at most 500 at a time, the rest
//!   recorded as `(other)`.
//!
//! ```
//! use idem_core::{IdempotencyKey, KeyError};
//! let key = IdempotencyKey::from_header(br#""order-42""#).unwrap();
//! assert_eq!(key.as_str(), "order-42");
//! assert_eq!(IdempotencyKey::from_header(b""), Err(KeyError::Empty));
//! ```

pub mod admin;
pub mod clock;
pub mod failpoint;
pub mod headers;
pub mod inbox;
pub mod keys;
pub mod labels;
pub mod leased;
pub mod outbox;
pub mod position;
pub mod steps;
pub mod tasks;
pub mod webhooks;

mod backoff;
mod config;
mod derive;
mod engine;
mod error;
mod fingerprint;
mod idempotency_key;
mod policy;
mod redact;
mod rounds;
mod scope;

pub use backoff::Backoff;
pub use clock::{Clock, ClockSample, ManualClock, ReferenceClock, SharedClock, SystemClock};
pub use config::{ConfigError, duration_text, duration_within};
pub use engine::{Aborted, Begun, BoxFuture, Claimed, Engine, Finished, Outcome};
pub use error::{BoxError, Error, ErrorChain, KeyError, ScopeError, StoreError};
pub use fingerprint::{Fingerprint, FingerprintSpec, RequestParts};
pub use idempotency_key::{IdempotencyKey, short_hash};
pub use keys::{Completion, KeyStore, RecordState, ResourceRef, StoredRecord, StoredResponse};
pub use policy::{ClaimMode, Policy};
pub use redact::without_credentials;
#[cfg(feature = "tokio")]
pub use rounds::Polling;
pub use rounds::{Pause, RoundLoop, Rounds};
pub use scope::{NAME_MAX_LEN, Operation, Scope, Tenant};

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
