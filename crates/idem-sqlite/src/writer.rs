//! The writer: one connection kept beside the sqlx pool for the key
//! engine's transactions (claims, [`KeyStore::begin`](idem_core::KeyStore::begin)),
//! queued in process.
//!
//! SQLite lets one transaction write at a time. Claims that each took a
//! pooled connection would queue on the database's write lock, whose busy
//! handler sleeps (1, 2, 5, 10 ms …) and wakes late; each connection's page
//! cache would be stale at every turn; and sqlx pings every pooled
//! connection when it comes back — one more round trip per request. Here the
//! claims queue on an in-process lock instead (FIFO, bounded by the store's
//! `busy_timeout`), the one connection's cache stays warm, and it goes back
//! without a ping. Other processes on the file, and the store's other writes
//! (relays, leases, runs), still meet it at the database's write lock.
//!
//! The connection is taken from the pool (so the pool's `after_connect`
//! runs on it) and detached; the pool may open a replacement. sqlx's
//! transaction depth is pinned at 1 on it (one `BEGIN` through sqlx's
//! transaction manager, then a `COMMIT` it does not see): Idem sends
//! `BEGIN IMMEDIATE` and `COMMIT` itself, each in one message with its own
//! statements (see [`keys`](crate::keys)), and business code that calls
//! `begin()` on the connection inside one gets a `SAVEPOINT`, as it would
//! inside a sqlx `Transaction`.
//!
//! A [`Lease`] dropped before its transaction ended (business code that
//! panicked, a cancelled future) is rolled back in a task of its own that
//! holds the writer until the `ROLLBACK` answered, then keeps the
//! connection; without a runtime, or when the rollback fails, the
//! connection is closed instead, which rolls back as surely.

use std::sync::Arc;
use std::time::Duration;

use idem_core::StoreError;
use sqlx::sqlite::SqliteTransactionManager;
use sqlx::{SqliteConnection, SqlitePool, TransactionManager};
use tokio::sync::{Mutex, OwnedMutexGuard};

type Slot = OwnedMutexGuard<Option<SqliteConnection>>;

/// The writer connection and its queue.
#[derive(Debug)]
pub(crate) struct Writer {
    pool: SqlitePool,
    slot: Arc<Mutex<Option<SqliteConnection>>>,
    /// How long a claim queues for the writer (the store's `busy_timeout`).
    wait: Duration,
}

impl Writer {
    pub(crate) fn new(pool: SqlitePool, wait: Duration) -> Self {
        Self {
            pool,
            slot: Arc::default(),
            wait,
        }
    }

    /// The writer, once the transactions queued before this one ended
    /// (waiting at most `busy_timeout`), outside any transaction.
    ///
    /// # Cancel safety
    /// Cancel safe: a connection being opened when the caller gives up is
    /// dropped (closed).
    pub(crate) async fn acquire(&self) -> Result<Lease, StoreError> {
        let mut slot = tokio::time::timeout(self.wait, self.slot.clone().lock_owned())
            .await
            .map_err(|_| StoreError::Unavailable {
                source: format!(
                    "database is locked (the writer was not free within {:?})",
                    self.wait
                )
                .into(),
            })?;
        if slot.is_none() {
            *slot = Some(self.open().await?);
        }
        Ok(Lease { slot: Some(slot) })
    }

    async fn open(&self) -> Result<SqliteConnection, StoreError> {
        let mut conn = self.pool.acquire().await.map_err(crate::map_err)?.detach();
        SqliteTransactionManager::begin(&mut conn, None)
            .await
            .map_err(crate::map_err)?;
        sqlx::Executor::execute(&mut conn, "COMMIT")
            .await
            .map_err(crate::map_err)?;
        Ok(conn)
    }
}

/// The writer, held: its connection until [`Lease::release`],
/// [`Lease::roll_back`] or drop.
pub struct Lease {
    /// `Some` until released or dropped.
    slot: Option<Slot>,
}

impl Lease {
    pub(crate) fn conn(&mut self) -> &mut SqliteConnection {
        self.slot
            .as_mut()
            .and_then(|slot| slot.as_mut())
            .unwrap_or_else(|| unreachable!("a lease holds its connection until it is consumed"))
    }

    pub(crate) fn conn_ref(&self) -> &SqliteConnection {
        self.slot
            .as_ref()
            .and_then(|slot| slot.as_ref())
            .unwrap_or_else(|| unreachable!("a lease holds its connection until it is consumed"))
    }

    /// Gives the writer back after its transaction ended (`COMMIT` or
    /// `ROLLBACK` answered), keeping the connection unless business code
    /// left sqlx's transaction depth moved.
    pub(crate) fn release(mut self) {
        if let Some(mut slot) = self.slot.take()
            && slot.as_ref().is_some_and(|c| !pinned(c))
        {
            *slot = None;
        }
    }

    /// Gives the writer back closed: its state is unknown (a worker that
    /// died, an I/O error). Closing ends any transaction.
    pub(crate) fn discard(mut self) {
        if let Some(mut slot) = self.slot.take() {
            *slot = None;
        }
    }

    /// `ROLLBACK` (nothing to roll back is fine), then gives the writer back.
    pub(crate) async fn roll_back(mut self) {
        if let Some(slot) = self.slot.take() {
            roll_back(slot).await;
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let Some(mut slot) = self.slot.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(roll_back(slot));
            }
            Err(_) => *slot = None,
        }
    }
}

/// Rolls back whatever the connection has open and keeps it, or closes it
/// when the rollback failed.
async fn roll_back(mut slot: Slot) {
    let Some(conn) = slot.as_mut() else { return };
    let kept = match sqlx::Executor::execute(&mut *conn, sqlx::query("ROLLBACK")).await {
        Ok(_) => true,
        // SQLITE_ERROR: "cannot rollback - no transaction is active".
        Err(sqlx::Error::Database(e)) => primary_code(&*e) == 1,
        Err(_) => false,
    };
    if !kept || !pinned(conn) {
        *slot = None;
    }
}

/// sqlx's depth on the writer is 1 (see the module docs).
fn pinned(conn: &SqliteConnection) -> bool {
    SqliteTransactionManager::get_transaction_depth(conn) == 1
}

/// A database error's primary result code (the low byte of an extended one).
pub(crate) fn primary_code(e: &dyn sqlx::error::DatabaseError) -> i64 {
    e.code().and_then(|c| c.parse::<i64>().ok()).unwrap_or(0) & 0xff
}
