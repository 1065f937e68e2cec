//! The outbox on SQLite: [`enqueue`] in the caller's transaction, and the
//! dispatcher's side as [`OutboxStore`](idem_core::outbox::OutboxStore) for
//! [`SqliteStore`], from [`idem_sql::outbox`].
//!
//! One dispatcher per database file: SQLite has no `SKIP LOCKED`, and one
//! writer at a time anyway. Leases still protect against a dispatcher that
//! died with messages claimed.

use sqlx::SqliteConnection;

use crate::pool::id_list;
use crate::{SqliteStore, SqliteTx, map_err};

idem_sql::outbox_store!(
    /// Writes `message` to the outbox on `conn`, normally the open transaction of
    /// the business write it belongs to (a [`SqliteTx`] derefs to
    /// one). It is published only if that transaction commits. Returns the
    /// message's outbox id.
    SqliteStore,
    SqliteTx,
    SqliteConnection,
    sqlite
);
