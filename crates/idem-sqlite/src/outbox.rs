//! The outbox on SQLite: [`enqueue`] in the caller's transaction, and the
//! dispatcher's side as [`OutboxStore`](idem_core::outbox::OutboxStore) for
//! [`SqliteStore`](crate::SqliteStore), from [`idem_sql::outbox`].
//!
//! One dispatcher per database file: SQLite has no `SKIP LOCKED`, and one
//! writer at a time anyway. Leases still protect against a dispatcher that
//! died with messages claimed.

use idem_core::StoreError;
use idem_core::outbox::OutboxMessage;
use sqlx::SqliteConnection;

use crate::SqliteDialect;

/// Writes `message` to the outbox on `conn`, normally the open transaction
/// of the business write it belongs to (a [`SqliteTx`](crate::SqliteTx)
/// derefs to one). It is published only if that transaction commits.
/// Returns the message's outbox id.
pub async fn enqueue(
    conn: &mut SqliteConnection,
    message: &OutboxMessage,
    now_ms: i64,
) -> Result<i64, StoreError> {
    idem_sql::outbox::enqueue::<SqliteDialect>(conn, message, now_ms).await
}
