//! [`Outbox`], the write side: messages enqueued in the business transaction.

use idem_core::outbox::{OutboxMessage, OutboxWriter};
use idem_core::{Clock, SharedClock, StoreError};

/// Writes messages to the outbox in the caller's transaction, on its own
/// clock — the entry point mirroring `idem_inbox::Inbox`. A message is
/// published by the [`Dispatcher`](crate::Dispatcher) if and only if the
/// transaction it was enqueued in commits.
///
/// The backends' free functions (`idem_sqlite::outbox::enqueue`,
/// `idem_postgres::outbox::enqueue`) remain the low-level form, for a plain
/// connection and an explicit time.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use idem_core::KeyStore;
/// use idem_core::outbox::{OutboxMessage, Topic};
/// use idem_outbox::Outbox;
/// use idem_sqlite::{SqliteConfig, SqliteStore};
///
/// # let dir = std::env::temp_dir().join(format!("idem-outbox-entry-doc-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir)?;
/// # let url = format!("sqlite://{}", dir.join("doc.db").display());
/// let store = SqliteStore::connect(&url, SqliteConfig::default()).await?;
/// store.migrate().await?;
/// let outbox = Outbox::new(store.clone());
///
/// let mut tx = store.begin().await?;
/// // … the state change, on `tx` …
/// let event = OutboxMessage::new(Topic::new("orders.shipped")?, "order-7", br#"{"id":7}"#.to_vec())?;
/// outbox.enqueue(&mut tx, &event).await?;
/// store.commit(tx).await?; // the event is published iff this commits
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Outbox<S, C = SharedClock> {
    store: S,
    clock: C,
}

impl<S: OutboxWriter> Outbox<S> {
    /// An outbox on the store's clock ([`KeyStore::clock`](idem_core::KeyStore::clock)),
    /// the one the relay judges a message's availability by.
    pub fn new(store: S) -> Self {
        let clock = store.clock();
        Self::with_clock(store, clock)
    }
}

impl<S: OutboxWriter, C: Clock> Outbox<S, C> {
    /// An outbox on its own clock (tests use a
    /// [`ManualClock`](idem_core::ManualClock)).
    pub fn with_clock(store: S, clock: C) -> Self {
        Self { store, clock }
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Writes `message` in `tx`, stamped with the outbox's clock. It is
    /// published only if `tx` commits; rolled back, it never existed.
    /// Returns the message's outbox id.
    ///
    /// # Cancel safety
    /// Cancelling leaves `tx` in an unknown state: roll it back (or drop it,
    /// which rolls it back).
    pub async fn enqueue(
        &self,
        tx: &mut S::Tx,
        message: &OutboxMessage,
    ) -> Result<i64, StoreError> {
        self.store.enqueue(tx, message, self.clock.now_ms()).await
    }
}
