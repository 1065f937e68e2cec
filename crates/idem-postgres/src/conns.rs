//! Connections kept beside the sqlx pool for the key engine's hot path:
//! the claim's read-first step (`readers`) and the transactions handed to
//! business code (`writers`, see [`PgTx`](crate::PgTx)).
//!
//! sqlx's pool pings every connection when it comes back — one more round
//! trip per request, which would cost a replay (one indexed read) a second
//! send and a fresh key an eighth. These connections go back without one;
//! what a ping would find out (a connection the server or network ended) is
//! found out by the next statement instead, which is retried on a new
//! connection when nothing it sent could have taken effect.
//!
//! Each read runs in a task of its own that holds its slot and its
//! connection until the server answered: a caller that gives up (a client
//! hanging up, a deadline) does not free the slot while the server still
//! works on the read, so cancelled reads never pile up server sessions
//! beyond `max`. A transaction dropped while open is rolled back the same
//! way, in a task that holds its slot (see `PgTx`'s `Drop`). A read that
//! failed drops its connection; one that lost it finds the idle ones
//! suspect too (a restart, a failover, a proxy's idle limit ends them all at
//! once): they are all dropped and the read is sent once more on a new
//! connection. Connections idle longer than `IDLE_TIMEOUT` or older than
//! `MAX_LIFETIME` are closed, not reused.
//!
//! A writer connection is opened with sqlx's transaction depth at 1 (one
//! `BEGIN` through sqlx's transaction manager, then an `END` it does not
//! see): Idem opens and ends its transactions itself, in the same message as
//! its own statements, and business code that calls `begin()` on the
//! connection inside one gets a `SAVEPOINT`, as it would inside a sqlx
//! `Transaction`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_sql::kept::Kept;
use sqlx::postgres::{PgConnectOptions, PgRow, PgTransactionManager};
use sqlx::{ConnectOptions, PgConnection, TransactionManager};
use tokio::sync::OwnedSemaphorePermit;

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

/// A connection out of [`Conns`], with its slot. Dropped, it is closed;
/// [`Conns::release`] keeps it for the next caller.
pub(crate) struct Lease {
    pub(crate) conn: PgConnection,
    born: Instant,
    /// It sat idle before this use, so it may have died meanwhile.
    pub(crate) reused: bool,
    _slot: OwnedSemaphorePermit,
}

pub(crate) struct Conns {
    options: PgConnectOptions,
    kept: Kept<Idle>,
    /// Writers: sqlx's transaction depth pinned at 1 (see the module docs),
    /// and these statements sent with the `END` that pins it (Idem's
    /// `PREPARE`s).
    writer: Option<&'static str>,
}

// Not derived: the connect options hold the password.
impl std::fmt::Debug for Conns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conns")
            .field("writer", &self.writer.is_some())
            .field("kept", &self.kept)
            .finish_non_exhaustive()
    }
}

impl Conns {
    /// Readers: at most `max` connections at once, opened on first use.
    pub(crate) fn readers(options: PgConnectOptions, max: u32, acquire_timeout: Duration) -> Self {
        Self::new(options, max, acquire_timeout, None)
    }

    /// Writers: at most `max` connections at once, opened on first use,
    /// each set up with `setup` (sent with the `END` that pins sqlx's
    /// transaction depth, in the same message).
    pub(crate) fn writers(
        options: PgConnectOptions,
        max: u32,
        acquire_timeout: Duration,
        setup: &'static str,
    ) -> Self {
        Self::new(options, max, acquire_timeout, Some(setup))
    }

    fn new(
        options: PgConnectOptions,
        max: u32,
        acquire_timeout: Duration,
        writer: Option<&'static str>,
    ) -> Self {
        Self {
            options,
            kept: Kept::new(max, acquire_timeout),
            writer,
        }
    }

    /// A slot (waiting at most the acquire timeout) and a connection: the
    /// most recently used idle one still fit for use, or a new one.
    pub(crate) async fn acquire(&self, fresh_only: bool) -> Result<Lease, sqlx::Error> {
        let slot = self.kept.slot().await?;
        let idle = if fresh_only {
            None
        } else {
            // The oldest sit at the bottom of the stack.
            self.kept
                .take(|c| c.since.elapsed() < IDLE_TIMEOUT && c.born.elapsed() < MAX_LIFETIME)
        };
        if let Some(idle) = idle {
            return Ok(Lease {
                conn: idle.conn,
                born: idle.born,
                reused: true,
                _slot: slot,
            });
        }
        let mut conn = self.options.connect().await?;
        if let Some(setup) = self.writer {
            PgTransactionManager::begin(&mut conn, None).await?;
            // `END`: an empty transaction ended, not a commit of anything.
            let end = format!("END; {setup}");
            sqlx::Executor::execute(&mut conn, sqlx::raw_sql(&end)).await?;
        }
        Ok(Lease {
            conn,
            born: Instant::now(),
            reused: false,
            _slot: slot,
        })
    }

    /// Drops every idle connection (see [`Kept::forget_idle`]).
    pub(crate) fn forget_idle(&self) {
        self.kept.forget_idle();
    }

    /// Keeps a connection that answered its last statement and is outside
    /// any transaction for the next caller (unless it is too old).
    pub(crate) fn release(&self, lease: Lease) {
        if lease.born.elapsed() < MAX_LIFETIME {
            self.kept.put(Idle {
                conn: lease.conn,
                born: lease.born,
                since: Instant::now(),
            });
        }
    }

    /// Runs `sql` with the text parameters `binds` and returns its row, if
    /// any, within `deadline` (the slot wait and a new connection included).
    ///
    /// # Cancel safety
    /// Cancel safe: the read goes on in its own task, which keeps the slot
    /// and returns the connection when the server answers — or, once
    /// `deadline` passed without an answer (a connection gone silent: a
    /// partition, a failover behind the same address), closes the
    /// connection and frees the slot, so silent connections never hold the
    /// store's slots for good; the idle ones are dropped too (what silenced
    /// one likely silenced its neighbours).
    pub(crate) async fn fetch_optional(
        self: &Arc<Self>,
        sql: &'static str,
        binds: [String; 3],
        deadline: Duration,
    ) -> Result<Option<PgRow>, sqlx::Error> {
        let this = self.clone();
        let task = tokio::spawn(async move {
            match tokio::time::timeout(deadline, this.read(sql, &binds)).await {
                Ok(read) => read,
                Err(_) => {
                    this.forget_idle();
                    Err(silent(deadline))
                }
            }
        });
        task.await
            .unwrap_or_else(|e| Err(sqlx::Error::Protocol(format!("the read task failed: {e}"))))
    }

    async fn read(&self, sql: &str, binds: &[String; 3]) -> Result<Option<PgRow>, sqlx::Error> {
        let mut fresh_only = false;
        loop {
            let mut lease = self.acquire(fresh_only).await?;
            let query = binds
                .iter()
                .fold(sqlx::query(sql), |q, bind| q.bind(bind.as_str()));
            match query.fetch_optional(&mut lease.conn).await {
                Ok(row) => {
                    self.release(lease);
                    return Ok(row);
                }
                Err(e) if lease.reused && crate::errors::connection_lost(&e) => {
                    self.forget_idle();
                    fresh_only = true;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// The error of a call a connection did not answer within `deadline`
/// (its connection is closed): unavailable, and retryable.
pub(crate) fn silent(deadline: Duration) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("PostgreSQL did not answer within {deadline:?}; the connection was closed"),
    ))
}
