//! [`SqliteTx`]: the open transaction a claim hands to business code.

use sqlx::SqliteConnection;
use tokio::sync::OwnedMutexGuard;

use crate::writer::Lease;

/// An open SQLite transaction handed to business code. Dereferences to the
/// connection, so `sqlx::query(…).execute(&mut **tx)` works through a guard;
/// `begin()` on it opens a savepoint, as inside a sqlx `Transaction`.
///
/// The connection is the store's writer (see the crate docs): Idem sends
/// `BEGIN IMMEDIATE` with its claim and `COMMIT` with the record it stores,
/// one message each. Dropped while open — business code that panicked, a
/// future cancelled — it is rolled back in a task of its own, which holds
/// the writer until the rollback answered.
pub struct SqliteTx {
    // Field order matters: the writer goes to its rollback before the gate
    // lets the next request with the same key in (which then queues for the
    // writer behind the rollback).
    pub(crate) lease: Lease,
    pub(crate) _gate: Option<OwnedMutexGuard<()>>,
}

impl SqliteTx {
    pub(crate) fn new(lease: Lease, gate: Option<OwnedMutexGuard<()>>) -> Self {
        Self { lease, _gate: gate }
    }

    fn conn(&self) -> &SqliteConnection {
        self.lease.conn_ref()
    }

    fn conn_mut(&mut self) -> &mut SqliteConnection {
        self.lease.conn()
    }
}

impl std::fmt::Debug for SqliteTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteTx").finish_non_exhaustive()
    }
}

impl std::ops::Deref for SqliteTx {
    type Target = SqliteConnection;
    fn deref(&self) -> &SqliteConnection {
        self.conn()
    }
}

impl std::ops::DerefMut for SqliteTx {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        self.conn_mut()
    }
}
