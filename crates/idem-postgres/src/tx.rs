//! [`PgTx`]: the open transaction a claim hands to business code.

use sqlx::{Postgres, Transaction};

/// An open PostgreSQL transaction handed to business code. Dereferences to the
/// connection, so `sqlx::query(…).execute(&mut **tx)` works through a guard.
pub struct PgTx {
    pub(crate) tx: Transaction<'static, Postgres>,
}

impl std::fmt::Debug for PgTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTx").finish_non_exhaustive()
    }
}

impl std::ops::Deref for PgTx {
    type Target = sqlx::PgConnection;
    fn deref(&self) -> &sqlx::PgConnection {
        &self.tx
    }
}

impl std::ops::DerefMut for PgTx {
    fn deref_mut(&mut self) -> &mut sqlx::PgConnection {
        &mut self.tx
    }
}
