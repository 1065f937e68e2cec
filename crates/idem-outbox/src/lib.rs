//! # Idem outbox
//!
//! A service that changes state and publishes an event writes the event to the
//! outbox **in the same transaction**, with [`Outbox::enqueue`] (or the
//! backends' low-level `idem_sqlite::outbox::enqueue` /
//! `idem_postgres::outbox::enqueue`). The [`Dispatcher`] then publishes what
//! committed — and only that — through a [`Publisher`], waits for the broker's
//! acknowledgement and marks the message sent:
//!
//! - at least once, with the message id fixed at write time (the broker and the
//!   consumers' inboxes drop the duplicates);
//! - in write order per message key, even with several dispatchers and retries:
//!   a message is not published while an earlier one of its key is unsent;
//! - a publish the broker refuses is retried with exponential backoff and
//!   jitter, and after [`DispatcherConfig::max_attempts`] marked dead, never
//!   sent; a broker that cannot be reached costs no attempts: messages wait in
//!   the outbox and go out when it is back;
//! - sent messages are deleted after [`DispatcherConfig::retention`], in
//!   bounded batches;
//! - [`Dispatcher::stats`] gives the lag: pending, age of the oldest pending
//!   message, dead, publish rate.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Mutex;
//! use idem_core::KeyStore;
//! use idem_core::outbox::{OutboxMessage, OutboxRecord, Topic};
//! use idem_outbox::{Dispatcher, DispatcherConfig, Outbox, PublishError, Published, Publisher};
//! use idem_sqlite::{SqliteConfig, SqliteStore};
//!
//! /// A broker stand-in that keeps what it was given (use `idem_nats::NatsPublisher`).
//! #[derive(Default)]
//! struct Recorder(Mutex<Vec<String>>);
//! impl Publisher for Recorder {
//!     async fn publish(&self, r: &OutboxRecord) -> Result<Published, PublishError> {
//!         self.0.lock().unwrap().push(format!("{} {}", r.topic, r.key));
//!         Ok(Published::default())
//!     }
//! }
//!
//! # let dir = std::env::temp_dir().join(format!("idem-outbox-doc-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir)?;
//! # let url = format!("sqlite://{}", dir.join("doc.db").display());
//! let store = SqliteStore::connect(&url, SqliteConfig::default()).await?;
//! store.migrate().await?;
//!
//! // In the business transaction: the event commits with the state change.
//! let mut tx = store.begin().await?;
//! // … sqlx::query("UPDATE orders …").execute(&mut *tx).await? …
//! let event = OutboxMessage::new(Topic::new("orders.shipped")?, "order-7", br#"{"id":7}"#.to_vec())?;
//! Outbox::new(store.clone()).enqueue(&mut tx, &event).await?;
//! store.commit(tx).await?;
//!
//! let dispatcher = Dispatcher::new(store, Recorder::default(), DispatcherConfig::default())?;
//! assert_eq!(dispatcher.run_once().await?.sent, 1);
//! assert_eq!(dispatcher.run_once().await?.claimed, 0, "sent once, marked sent");
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(()) }
//! ```

mod dispatcher;
mod outbox;

pub use dispatcher::{
    Dispatcher, DispatcherConfig, DispatcherStats, PUBLISH_LAG, PUBLISHED_TOTAL, Polling,
    RelayFigures, RunOnce,
};

pub use outbox::Outbox;

/// The settings error, shared by every library config.
pub use idem_core::ConfigError;

use idem_core::BoxError;
use idem_core::outbox::OutboxRecord;
use std::future::Future;

/// What the broker said about a published message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Published {
    /// The broker had it already (same message id within its dedupe window).
    /// Still a success: the message is in the stream once.
    pub duplicate: bool,
    /// The broker's sequence number for it, if it has one.
    pub sequence: Option<u64>,
}

/// Why a publish failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// The broker could not be reached or did not acknowledge in time. Not the
    /// message's fault: it is retried without counting an attempt.
    #[error("broker unavailable")]
    Unavailable {
        /// The client's error.
        #[source]
        source: BoxError,
    },
    /// The broker refused this message (too large, not allowed, …). Counts as
    /// an attempt; after the maximum the message is dead.
    #[error("broker rejected the message: {reason}")]
    Rejected {
        /// What the broker said.
        reason: String,
    },
}

impl PublishError {
    /// Whether the same publish may succeed later without any change.
    pub fn retryable(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }
}

/// Publishes outbox messages to a broker and waits for its acknowledgement.
/// The implementation must send [`OutboxRecord::message_id`] as the broker's
/// deduplication id and report a duplicate acknowledgement as success.
pub trait Publisher: Send + Sync + 'static {
    /// Publishes one message; returns once the broker has it durably.
    ///
    /// # Cancel safety
    /// Not required: a cancelled publish may or may not have reached the broker,
    /// which is why messages carry a stable id.
    fn publish(
        &self,
        record: &OutboxRecord,
    ) -> impl Future<Output = Result<Published, PublishError>> + Send;
}
