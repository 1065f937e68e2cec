//! Connections for the claim's read-first step, kept beside the sqlx pool.
//!
//! A replay is one indexed read. sqlx's pool pings every connection when it
//! comes back — one more round trip, which would double what a replay costs
//! the database and the client. These connections go back without one.
//!
//! Each read runs in a task of its own that holds its slot and its
//! connection until the server answered: a caller that gives up (a client
//! hanging up, a deadline) does not free the slot while the server still
//! works on the read, so cancelled reads never pile up server sessions
//! beyond `max`. A read that failed drops its connection; one that lost it
//! finds the idle ones suspect too (a restart, a failover, a proxy's idle
//! limit ends them all at once): they are all dropped and the read is sent
//! once more on a new connection. Connections idle longer than
//! `IDLE_TIMEOUT` or older than `MAX_LIFETIME` are closed, not reused.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sqlx::ConnectOptions;
use sqlx::PgConnection;
use sqlx::postgres::{PgConnectOptions, PgRow};
use tokio::sync::Semaphore;

/// A connection is closed instead of kept once it is this old (as sqlx's
/// pool does by default), so server-side state does not live forever.
const MAX_LIFETIME: Duration = Duration::from_secs(30 * 60);

/// A connection idle this long is closed instead of used (sqlx's pool
/// default), before a server or proxy idle limit ends it silently.
const IDLE_TIMEOUT: Duration = Duration::from_secs(10 * 60);

struct Idle {
    conn: PgConnection,
    born: Instant,
    since: Instant,
}

pub(crate) struct Readers {
    options: PgConnectOptions,
    idle: Mutex<Vec<Idle>>,
    slots: Arc<Semaphore>,
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
            slots: Arc::new(Semaphore::new(max as usize)),
            acquire_timeout,
        }
    }

    /// Runs `sql` with the text parameters `binds` and returns its row, if any.
    ///
    /// # Cancel safety
    /// Cancel safe: the read goes on in its own task, which keeps the slot
    /// and returns the connection when the server answers.
    pub(crate) async fn fetch_optional(
        self: &Arc<Self>,
        sql: &'static str,
        binds: [String; 3],
    ) -> Result<Option<PgRow>, sqlx::Error> {
        let slot = tokio::time::timeout(self.acquire_timeout, self.slots.clone().acquire_owned())
            .await
            .map_err(|_| sqlx::Error::PoolTimedOut)?
            .map_err(|_| sqlx::Error::PoolClosed)?;
        let this = self.clone();
        let task = tokio::spawn(async move {
            let _slot = slot;
            this.read(sql, &binds).await
        });
        task.await
            .unwrap_or_else(|e| Err(sqlx::Error::Protocol(format!("the read task failed: {e}"))))
    }

    async fn read(&self, sql: &str, binds: &[String; 3]) -> Result<Option<PgRow>, sqlx::Error> {
        let mut fresh_only = false;
        loop {
            let idle = if fresh_only { None } else { self.take_idle() };
            let reused = idle.is_some();
            let (mut conn, born) = match idle {
                Some(idle) => (idle.conn, idle.born),
                None => (self.options.connect().await?, Instant::now()),
            };
            let query = binds
                .iter()
                .fold(sqlx::query(sql), |q, bind| q.bind(bind.as_str()));
            match query.fetch_optional(&mut conn).await {
                Ok(row) => {
                    if born.elapsed() < MAX_LIFETIME {
                        self.lock().push(Idle {
                            conn,
                            born,
                            since: Instant::now(),
                        });
                    }
                    return Ok(row);
                }
                Err(e) if reused && crate::errors::connection_lost(&e) => {
                    // Whatever ended this one likely ended its neighbours.
                    self.lock().clear();
                    fresh_only = true;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The most recently used idle connection still fit for use.
    fn take_idle(&self) -> Option<Idle> {
        let mut idle = self.lock();
        // The oldest sit at the bottom of the stack.
        idle.retain(|c| c.since.elapsed() < IDLE_TIMEOUT && c.born.elapsed() < MAX_LIFETIME);
        idle.pop()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
