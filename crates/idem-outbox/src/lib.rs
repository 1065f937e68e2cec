//! # Idem outbox
//!
//! A service that changes state and publishes an event writes the event to the
//! outbox **in the same transaction** (`idem_sqlite::outbox::enqueue`,
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

mod dispatcher;

pub use dispatcher::{
    ConfigError, Dispatcher, DispatcherConfig, DispatcherStats, Polling, RunOnce,
};

use idem_core::{BoxError, OutboxRecord};
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
