//! The readers: connections kept beside the sqlx pool for the claim's
//! read-first step (a replay is that read alone).
//!
//! sqlx's pool pings every connection when it comes back — one more round
//! trip to the connection's worker thread per read. A local file cannot
//! hang up, so these go back without one. At most `max_connections` reads
//! run at once; connections are opened on first use with the pool's
//! connect options (WAL, `synchronous = FULL`, `busy_timeout`, …) and
//! closed when their worker fails.
//!
//! A read whose caller gives up (a client hanging up, a deadline) puts its
//! connection back at once: the connection's worker runs its commands in
//! order, so the abandoned `SELECT` ends (and its read snapshot with it)
//! before the next caller's statement starts.

use std::time::Duration;

use idem_sql::kept::Kept;
use sqlx::sqlite::{SqliteArguments, SqliteRow};
use sqlx::{ConnectOptions, Sqlite, SqliteConnection, SqlitePool};
use tokio::sync::OwnedSemaphorePermit;

#[derive(Debug)]
pub(crate) struct Readers {
    pool: SqlitePool,
    kept: Kept<SqliteConnection>,
}

/// A reader out of [`Readers`], with its slot; dropped, it goes back.
struct Lease<'a> {
    readers: &'a Readers,
    /// `None` once found broken.
    conn: Option<SqliteConnection>,
    _slot: OwnedSemaphorePermit,
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.readers.kept.put(conn);
        }
    }
}

impl Readers {
    pub(crate) fn new(pool: SqlitePool, max: u32, acquire_timeout: Duration) -> Self {
        Self {
            pool,
            kept: Kept::new(max, acquire_timeout),
        }
    }

    /// Runs `query` on a reader and returns its row, if any.
    ///
    /// # Cancel safety
    /// Cancel safe: see the module docs.
    pub(crate) async fn fetch_optional<'q>(
        &self,
        query: sqlx::query::Query<'q, Sqlite, SqliteArguments<'q>>,
    ) -> Result<Option<SqliteRow>, sqlx::Error> {
        let slot = self.kept.slot().await?;
        let idle = self.kept.take(|_| true);
        let conn = match idle {
            Some(conn) => conn,
            None => self.pool.connect_options().connect().await?,
        };
        let mut lease = Lease {
            readers: self,
            conn: Some(conn),
            _slot: slot,
        };
        let Some(conn) = lease.conn.as_mut() else {
            return Err(sqlx::Error::WorkerCrashed);
        };
        let row = query.fetch_optional(conn).await;
        if let Err(e) = &row
            && !matches!(e, sqlx::Error::Database(_))
        {
            lease.conn = None;
        }
        row
    }
}
