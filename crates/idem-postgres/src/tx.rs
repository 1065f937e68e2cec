//! [`PgTx`]: the open transaction a claim hands to business code.

use sqlx::{PgConnection, Postgres, Transaction};

/// An open PostgreSQL transaction handed to business code. Dereferences to the
/// connection, so `sqlx::query(…).execute(&mut **tx)` works through a guard.
pub struct PgTx {
    pub(crate) tx: Transaction<'static, Postgres>,
}

idem_sql::tx_guard!(PgTx, PgConnection);
