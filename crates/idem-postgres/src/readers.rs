//! Connections for the claim's read-first step, kept beside the sqlx pool.
//!
//! A replay is one indexed read. sqlx's pool pings every connection when it
//! comes back — one more round trip, which would double what a replay costs
//! the database and the client. These connections go back without one: a
//! read that completed leaves its connection idle and clean, and one that
//! failed, timed out or was cancelled takes its connection with it (dropped,
//! so closed) instead of returning it.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use sqlx::ConnectOptions;
use sqlx::PgConnection;
use sqlx::Postgres;
use sqlx::postgres::{PgArguments, PgConnectOptions, PgRow};
use sqlx::query::Query;
use tokio::sync::Semaphore;

/// A connection is closed instead of kept once it is this old (as sqlx's
/// pool does by default), so server-side state does not live forever.
const MAX_LIFETIME: Duration = Duration::from_secs(30 * 60);

pub(crate) struct Readers {
    options: PgConnectOptions,
    idle: Mutex<Vec<(PgConnection, Instant)>>,
    slots: Semaphore,
    acquire_timeout: Duration,
}

// Not derived: the connect options hold the password.
impl std::fmt::Debug for Readers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Readers")
            .field("idle", &self.lock().len())
            .field("free_slots", &self.slots.available_permits())
            .finish_non_exhaustive()
    }
}

impl Readers {
    /// At most `max` connections at once, opened on first use.
    pub(crate) fn new(options: PgConnectOptions, max: u32, acquire_timeout: Duration) -> Self {
        Self {
            options,
            idle: Mutex::new(Vec::new()),
            slots: Semaphore::new(max as usize),
            acquire_timeout,
        }
    }

    /// Runs the read `query()` builds and returns its row, if any.
    ///
    /// An idle connection the server or the network closed shows up here as
    /// a lost connection; a read is safe to send again, once, on a new one.
    ///
    /// # Cancel safety
    /// Cancel safe: a cancelled read drops its connection.
    pub(crate) async fn fetch_optional<'q>(
        &self,
        query: impl Fn() -> Query<'q, Postgres, PgArguments>,
    ) -> Result<Option<PgRow>, sqlx::Error> {
        let _slot = tokio::time::timeout(self.acquire_timeout, self.slots.acquire())
            .await
            .map_err(|_| sqlx::Error::PoolTimedOut)?
            .map_err(|_| sqlx::Error::PoolClosed)?;
        let mut retried = false;
        loop {
            let idle = self.lock().pop();
            let reused = idle.is_some();
            let (mut conn, born) = match idle {
                Some(idle) => idle,
                None => (self.options.connect().await?, Instant::now()),
            };
            match query().fetch_optional(&mut conn).await {
                Ok(row) => {
                    if born.elapsed() < MAX_LIFETIME {
                        self.lock().push((conn, born));
                    }
                    return Ok(row);
                }
                Err(e) if reused && !retried && crate::connection_lost(&e) => retried = true,
                Err(e) => return Err(e),
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(PgConnection, Instant)>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
