//! [`SqliteTx`]: the open transaction a claim hands to business code.

use std::ops::{Deref, DerefMut};

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

impl std::fmt::Debug for SqliteTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteTx").finish_non_exhaustive()
    }
}

impl Deref for SqliteTx {
    type Target = SqliteConnection;
    fn deref(&self) -> &SqliteConnection {
        &self.tx
    }
}

impl DerefMut for SqliteTx {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        &mut self.tx
    }
}
