//! # Idem inbox
//!
//! With at-least-once delivery a consumer sees some messages twice: after a
//! redelivery, a crash before the ack, a replay. The [`Inbox`] records
//! `(subscriber, message_id)` **in the handler's transaction**, so the record
//! and the business effect commit together, and a duplicate finds the record
//! and is skipped. The message is acknowledged only after the commit. Together
//! that is exactly-once *effects*.
//!
//! ```text
//! begin
//!   insert (subscriber, message_id) on conflict do nothing   -- pessimistic mode
//!   if not inserted: rollback, ack, done (duplicate)
//!   apply the business effect
//! commit
//! ack
//! ```
//!
//! [`Consumer`] runs that loop over a [`MessageSource`] (NATS JetStream in
//! `idem-nats`): ack after commit, nak with a growing delay on retryable
//! errors (the database being down included: nothing is acked), and a
//! dead-letter for a message that cannot be decoded or outlived its
//! deliveries — never retried forever, never dropped silently.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_core::inbox::{MessageId, Subscriber};
//! use idem_inbox::{InboxBegun, Committed, Inbox};
//! use idem_sqlite::{SqliteConfig, SqliteStore};
//!
//! # let dir = std::env::temp_dir().join(format!("idem-inbox-doc-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir)?;
//! # let url = format!("sqlite://{}", dir.join("doc.db").display());
//! let store = SqliteStore::connect(&url, SqliteConfig::default()).await?;
//! store.migrate().await?;
//! sqlx::query("CREATE TABLE emails (message_id TEXT)").execute(store.pool()).await?;
//! let inbox = Inbox::new(store.clone());
//! let (mailer, id) = (Subscriber::new("mailer")?, MessageId::new("m-1")?);
//!
//! for delivery in 0..2 {
//!     match inbox.begin(&mailer, &id).await? {
//!         InboxBegun::Fresh(mut claim) => {
//!             // The effect, in the same transaction as the inbox record.
//!             sqlx::query("INSERT INTO emails VALUES ($1)").bind(id.as_str())
//!                 .execute(&mut *claim.tx).await?;
//!             assert_eq!(inbox.commit(claim).await?, Committed::Applied);
//!             // … now acknowledge the message …
//!         }
//!         InboxBegun::Duplicate => assert_eq!(delivery, 1, "the redelivery is skipped"),
//!     }
//! }
//! let sent: i64 = sqlx::query_scalar("SELECT count(*) FROM emails").fetch_one(store.pool()).await?;
//! assert_eq!(sent, 1);
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(()) }
//! ```
//!
//! ## Modes
//! [`InboxMode::Pessimistic`] (the default) records first: a concurrent
//! duplicate waits on the record until the first transaction ends, then skips.
//! [`InboxMode::Optimistic`] runs the handler first and records at the end; a
//! duplicate that raced is rolled back at the record. It is acceptable when
//! the handler only writes to the same database (everything it did rolls back)
//! and concurrent deliveries of one message are rare (one consumer per
//! subscriber, an ack wait longer than processing); it saves holding the
//! record's lock while the handler runs.

mod consumer;

pub use idem_core::position::{Position, PositionStore};

pub use consumer::{
    Consumer, ConsumerConfig, ConsumerStats, Delivery, Handler, HandlerError, InboxMessage,
    MESSAGES_TOTAL, MessageSource, REDELIVERIES_TOTAL, SourceError,
};

use std::time::Duration;

use idem_core::inbox::{InboxStore, MessageId, Subscriber};
use idem_core::{Clock, SharedClock, StoreError};

/// When the inbox record is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InboxMode {
    /// Record first, then run the handler (concurrent duplicates wait).
    #[default]
    Pessimistic,
    /// Run the handler, then record (a raced duplicate rolls back).
    Optimistic,
}

/// What [`Inbox::begin`] found.
#[derive(Debug)]
pub enum InboxBegun<T> {
    /// Apply the message in `claim.tx`, then [`Inbox::commit`].
    Fresh(InboxClaim<T>),
    /// Already applied for this subscriber: acknowledge and skip.
    Duplicate,
}

/// An open transaction for one message.
#[derive(Debug)]
pub struct InboxClaim<T> {
    /// The transaction; the business effect goes here.
    pub tx: T,
    subscriber: Subscriber,
    message_id: MessageId,
    recorded: bool,
}

/// What [`Inbox::commit`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Committed {
    /// The effect and the record committed.
    Applied,
    /// Optimistic mode only: a concurrent delivery recorded it first; this
    /// transaction was rolled back.
    Duplicate,
}

/// The inbox over an [`InboxStore`].
#[derive(Debug, Clone)]
pub struct Inbox<S, C = SharedClock> {
    store: S,
    clock: C,
    retention: Duration,
    mode: InboxMode,
}

impl<S: InboxStore> Inbox<S> {
    /// Default retention: 7 days, longer than any redelivery window.
    pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
    /// Longest retention accepted.
    pub const MAX_RETENTION: Duration = Duration::from_secs(400 * 24 * 3600);

    /// A pessimistic inbox with the default retention, on the store's clock
    /// ([`KeyStore::clock`](idem_core::KeyStore::clock)), which its records'
    /// expiry is judged by.
    pub fn new(store: S) -> Self {
        let clock = store.clock();
        Self::with_clock(store, clock)
    }
}

impl<S: InboxStore, C: Clock> Inbox<S, C> {
    /// An inbox on its own clock.
    pub fn with_clock(store: S, clock: C) -> Self {
        Self {
            store,
            clock,
            retention: Inbox::<S>::DEFAULT_RETENTION,
            mode: InboxMode::default(),
        }
    }

    /// How long records are kept: 1 s to 400 days, refused outside (never
    /// clamped). It must be longer than the broker's redelivery and any
    /// replay window.
    pub fn retention(mut self, retention: Duration) -> Result<Self, idem_core::ConfigError> {
        idem_core::ConfigError::check_duration(
            "Inbox",
            "retention",
            retention,
            Duration::from_secs(1),
            Inbox::<S>::MAX_RETENTION,
        )?;
        self.retention = retention;
        Ok(self)
    }

    /// Pessimistic (default) or optimistic.
    pub fn mode(mut self, mode: InboxMode) -> Self {
        self.mode = mode;
        self
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Opens the message's transaction; in pessimistic mode, records it first.
    ///
    /// # Cancel safety
    /// Cancel safe: the transaction rolls back when dropped.
    pub async fn begin(
        &self,
        subscriber: &Subscriber,
        message_id: &MessageId,
    ) -> Result<InboxBegun<S::Tx>, StoreError> {
        let mut tx = self.store.begin().await?;
        let recorded = match self.mode {
            InboxMode::Optimistic => false,
            InboxMode::Pessimistic => {
                if !self.record(&mut tx, subscriber, message_id).await? {
                    self.store.rollback(tx).await?;
                    return Ok(InboxBegun::Duplicate);
                }
                true
            }
        };
        Ok(InboxBegun::Fresh(InboxClaim {
            tx,
            subscriber: subscriber.clone(),
            message_id: message_id.clone(),
            recorded,
        }))
    }

    /// Commits the effect and the record together.
    pub async fn commit(&self, mut claim: InboxClaim<S::Tx>) -> Result<Committed, StoreError> {
        if !claim.recorded
            && !self
                .record(&mut claim.tx, &claim.subscriber, &claim.message_id)
                .await?
        {
            self.store.rollback(claim.tx).await?;
            return Ok(Committed::Duplicate);
        }
        self.store.commit(claim.tx).await?;
        Ok(Committed::Applied)
    }

    /// Rolls back the effect and the record.
    pub async fn rollback(&self, claim: InboxClaim<S::Tx>) -> Result<(), StoreError> {
        self.store.rollback(claim.tx).await
    }

    async fn record(
        &self,
        tx: &mut S::Tx,
        subscriber: &Subscriber,
        message_id: &MessageId,
    ) -> Result<bool, StoreError> {
        let now = self.clock.now_ms();
        let expires =
            now.saturating_add(i64::try_from(self.retention.as_millis()).unwrap_or(i64::MAX));
        self.store
            .record(tx, subscriber, message_id, now, expires)
            .await
    }

    /// Deletes expired records in batches of `batch_size`, at most `max_batches`.
    pub async fn purge_expired(
        &self,
        batch_size: u32,
        max_batches: u32,
    ) -> Result<u64, StoreError> {
        let mut total = 0;
        for _ in 0..max_batches {
            let n = self
                .store
                .purge_expired_inbox(self.clock.now_ms(), batch_size)
                .await?;
            total += n;
            if n < u64::from(batch_size) {
                break;
            }
        }
        Ok(total)
    }
}
