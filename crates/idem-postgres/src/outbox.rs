//! The outbox on PostgreSQL: [`enqueue`] in the caller's transaction, and the
//! dispatcher's side as [`OutboxStore`](idem_core::outbox::OutboxStore) for [`PgStore`](crate::PgStore) (this backend's part of what idem-sql writes once), from
//! [`idem_sql::outbox`].
//!
//! Several dispatchers may share one database: claims take rows with
//! `FOR UPDATE SKIP LOCKED` and lease them; a message is never claimed while an
//! earlier message with the same key is pending, so a key's messages are
//! published in write order whichever dispatcher holds them. Each enqueue
//! sends `NOTIFY idem_outbox` (delivered at commit) as a wake-up hint.

use std::time::Duration;

use idem_core::StoreError;
use idem_core::outbox::OutboxMessage;
use sqlx::PgConnection;
use sqlx::postgres::PgListener;

use crate::PgDialect;

/// The notification channel enqueues signal.
pub const CHANNEL: &str = "idem_outbox";

/// Writes `message` to the outbox on `conn`, normally the open transaction
/// of the business write it belongs to (a [`PgTx`](crate::PgTx) derefs to
/// one). It is published only if that transaction commits. One round trip,
/// the wake-up notification included. Returns the message's outbox id.
pub async fn enqueue(
    conn: &mut PgConnection,
    message: &OutboxMessage,
    now_ms: i64,
) -> Result<i64, StoreError> {
    idem_sql::outbox::enqueue::<PgDialect>(conn, message, now_ms).await
}

/// Wakes a dispatcher when messages are written (a hint: notifications can be
/// missed across reconnects, so the dispatcher also polls).
pub struct OutboxListener(Option<PgListener>);

impl std::fmt::Debug for OutboxListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("OutboxListener").finish_non_exhaustive()
    }
}

impl idem_core::outbox::Wake for OutboxListener {
    /// Waits for a notification, at most `max`.
    ///
    /// # Cancel safety
    /// Cancel safe: a notification not yet received stays queued.
    async fn wait(&mut self, max: Duration) {
        let Some(listener) = self.0.as_mut() else {
            tokio::time::sleep(max).await;
            return;
        };
        match tokio::time::timeout(max, listener.recv()).await {
            Ok(Ok(_)) | Err(_) => {}
            Ok(Err(e)) => {
                // The connection broke; sqlx reconnects on the next call.
                // Until then this is plain polling.
                tracing::debug!(
                    error = &e as &dyn std::error::Error,
                    "outbox listener lost its connection"
                );
                tokio::time::sleep(max).await;
            }
        }
    }
}

impl PgDialect {
    /// A listener on [`CHANNEL`]. When it cannot connect, it degrades to
    /// sleeping (the dispatcher polls either way).
    pub async fn outbox_listener(&self) -> OutboxListener {
        let listener = async {
            let mut l = PgListener::connect_with(&self.pool).await?;
            l.listen(CHANNEL).await?;
            Ok::<_, sqlx::Error>(l)
        }
        .await;
        match listener {
            Ok(l) => OutboxListener(Some(l)),
            Err(e) => {
                tracing::warn!(
                    error = &e as &dyn std::error::Error,
                    "outbox listener unavailable; polling only"
                );
                OutboxListener(None)
            }
        }
    }
}
