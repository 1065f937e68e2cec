//! [`SqliteTx`]: the open transaction a claim hands to business code.

use sqlx::{Sqlite, SqliteConnection, Transaction};
use tokio::sync::OwnedMutexGuard;

/// An open SQLite transaction handed to business code. Dereferences to the
/// connection, so `sqlx::query(…).execute(&mut **tx)` works through a guard.
pub struct SqliteTx {
    // Field order matters: the transaction is dropped (rolled back) before the
    // gate lets the next request with the same key in.
    pub(crate) tx: Transaction<'static, Sqlite>,
    pub(crate) _gate: Option<OwnedMutexGuard<()>>,
}

idem_sql::tx_guard!(SqliteTx, SqliteConnection);
