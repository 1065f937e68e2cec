//! [`PgTx`]: the open transaction a claim hands to business code.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgConnection;

use crate::conns::{Conns, Lease};

/// An open PostgreSQL transaction handed to business code. Dereferences to the
/// connection, so `sqlx::query(…).execute(&mut **tx)` works through a guard;
/// `begin()` on it opens a savepoint, as inside a sqlx `Transaction`.
///
/// The connection is one of the store's writers (see the crate docs): Idem
/// sends `BEGIN` with its claim and `COMMIT` with the record it stores, one
/// message each. Dropped while open — business code that panicked, a future
/// cancelled — it is rolled back in a task of its own, which holds the
/// connection's slot until the server answered, then keeps the connection.
pub struct PgTx {
    lease: Option<Lease>,
    writers: Arc<Conns>,
    /// How long the `ROLLBACK` of a dropped transaction may take.
    deadline: Duration,
    /// Close the connection when the transaction ends instead of keeping
    /// it (it carried a large message).
    close_after: bool,
}

impl PgTx {
    pub(crate) fn new(lease: Lease, writers: Arc<Conns>, deadline: Duration) -> Self {
        Self {
            lease: Some(lease),
            writers,
            deadline,
            close_after: false,
        }
    }

    /// The connection, leaving the transaction to the caller to end: it is
    /// no longer rolled back on drop.
    pub(crate) fn into_lease(mut self) -> Lease {
        // Always `Some` until taken here or by `Drop`.
        self.lease.take().unwrap_or_else(|| unreachable!())
    }

    /// The connection is closed, not kept, when the transaction ends.
    pub(crate) fn close_after(&mut self) {
        self.close_after = true;
    }

    pub(crate) fn closes_after(&self) -> bool {
        self.close_after
    }

    pub(crate) fn writers(&self) -> &Arc<Conns> {
        &self.writers
    }

    fn conn(&self) -> &PgConnection {
        match &self.lease {
            Some(lease) => &lease.conn,
            None => unreachable!("a PgTx holds its connection until it is consumed"),
        }
    }

    fn conn_mut(&mut self) -> &mut PgConnection {
        match &mut self.lease {
            Some(lease) => &mut lease.conn,
            None => unreachable!("a PgTx holds its connection until it is consumed"),
        }
    }
}

impl Drop for PgTx {
    fn drop(&mut self) {
        let Some(lease) = self.lease.take() else {
            return;
        };
        // Without a runtime the connection is closed, which ends the
        // transaction on the server as surely.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (writers, deadline) = (self.writers.clone(), self.deadline);
            runtime.spawn(roll_back(lease, writers, deadline));
        }
    }
}

/// `ROLLBACK` on a leased writer, then keeps it; a connection that does not
/// answer in time is closed (the server then ends the transaction).
pub(crate) async fn roll_back(mut lease: Lease, writers: Arc<Conns>, deadline: Duration) {
    let rolled_back = tokio::time::timeout(
        deadline,
        sqlx::Executor::execute(&mut lease.conn, sqlx::raw_sql("ROLLBACK")),
    )
    .await;
    if let Ok(Ok(_)) = rolled_back {
        writers.release(lease);
    }
}

impl std::fmt::Debug for PgTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTx").finish_non_exhaustive()
    }
}

impl std::ops::Deref for PgTx {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        self.conn()
    }
}

impl std::ops::DerefMut for PgTx {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.conn_mut()
    }
}
