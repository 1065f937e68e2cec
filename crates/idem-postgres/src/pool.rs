//! [`PgDialect`](crate::PgDialect): connection setup, the pool, the client-side deadline of
//! every call, `BEGIN` (with its lock wait) and `COMMIT`, and the glue the
//! shared statements of [`idem_sql`] run through (`map`, `bounded`,
//! `bounded_write`, `purge`).

use std::future::Future;
use std::str::FromStr;
use std::time::Duration;

use idem_core::{SharedClock, StoreError};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::conns::{Conns, Lease};
use crate::errors::{connection_lost, map_err_waited};
use crate::{PgClock, PgConfig, PgTx, map_err};

/// PostgreSQL as [`idem_sql::SqlStore`] runs on it ([`Dialect`](idem_sql::Dialect)):
/// the pool, the key transactions' writers and the claims' readers (kept
/// beside the pool, with Idem's statements prepared), the client-side
/// deadlines and the database server's clock. [`PgStore`](crate::PgStore)
/// is the store on it. Cheap to clone; clones share the pool.
#[derive(Debug, Clone)]
pub struct PgDialect {
    pub(crate) pool: PgPool,
    /// The claims' read-first connections.
    pub(crate) readers: std::sync::Arc<Conns>,
    /// The key transactions' connections ([`PgTx`]).
    pub(crate) writers: std::sync::Arc<Conns>,
    clock: PgClock,
    /// `clock`, as [`KeyStore::clock`](idem_core::KeyStore::clock) hands it out.
    pub(crate) shared_clock: SharedClock,
    pub(crate) lock_timeout: Duration,
    statement_timeout: Duration,
}

/// What the client waits beyond `statement_timeout` for the server's answer.
const NETWORK_MARGIN: Duration = Duration::from_secs(1);

fn millis(d: Duration) -> String {
    format!("{}ms", d.as_millis().max(1))
}

impl PgDialect {
    /// Connects to `url` (`postgres://…`).
    pub(crate) async fn open(url: &str, config: PgConfig) -> Result<Self, StoreError> {
        config
            .validate()
            .map_err(|e| StoreError::Database { source: e.into() })?;
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| StoreError::Database { source: e.into() })?
            .options([
                ("lock_timeout", millis(config.lock_timeout)),
                ("statement_timeout", millis(config.statement_timeout)),
                (
                    "idle_in_transaction_session_timeout",
                    millis(config.idle_in_transaction_timeout),
                ),
                // The default since PostgreSQL 9.1, set for business code;
                // Idem's literals do not depend on it (see `inline`).
                ("standard_conforming_strings", "on".into()),
            ]);
        let pool = PgPoolOptions::new()
            .max_connections(config.max_connections)
            .acquire_timeout(config.acquire_timeout)
            // No ping before each use: it would cost a round trip per call.
            // The pool serves autocommit statements and business
            // transactions; a connection that died while idle (a restart)
            // fails its next call once, as unavailable, and is replaced.
            // Key transactions run on the store's own connections (`conns`).
            .test_before_acquire(false)
            .connect_with(options.clone())
            .await;
        let pool = match pool {
            Ok(pool) => pool,
            // The pool retried until its timeout and kept only "timed out";
            // one direct attempt says why (refused, unknown database, …).
            Err(sqlx::Error::PoolTimedOut) => {
                use sqlx::ConnectOptions;
                let cause =
                    match tokio::time::timeout(config.acquire_timeout, options.connect()).await {
                        Ok(Err(e)) => e.to_string(),
                        Ok(Ok(_)) => {
                            "the server accepted a connection only after the pool gave up".into()
                        }
                        Err(_) => format!("no answer within {:?}", config.acquire_timeout),
                    };
                return Err(StoreError::Unavailable {
                    source: format!("cannot connect to PostgreSQL: {cause}").into(),
                });
            }
            Err(e) => return Err(map_err(e)),
        };
        let clock = PgClock::start(
            &options,
            pool.clone(),
            config.statement_timeout + NETWORK_MARGIN,
        )
        .await?;
        Ok(Self {
            pool,
            readers: std::sync::Arc::new(Conns::readers(
                options.clone(),
                config.max_connections,
                config.acquire_timeout,
            )),
            writers: std::sync::Arc::new(Conns::writers(
                options,
                config.max_connections,
                config.acquire_timeout,
                crate::keys::prepared(),
            )),
            shared_clock: SharedClock::new(clock.clone()),
            clock,
            lock_timeout: config.lock_timeout,
            statement_timeout: config.statement_timeout,
        })
    }

    /// How long a store call may take before the client gives up on the
    /// server: `statement_timeout` plus a network margin.
    pub fn deadline(&self) -> Duration {
        self.statement_timeout + NETWORK_MARGIN
    }

    /// The deadline of a store call that may wait `wait` for a row lock: a
    /// wait past the statement timeout raises it for the transaction (see
    /// `begin_waiting`), and the deadline follows.
    pub(crate) fn deadline_waiting(&self, wait: Duration) -> Duration {
        if wait < self.statement_timeout {
            self.deadline()
        } else {
            wait + self.deadline()
        }
    }

    /// Runs one store call under `deadline` (a store call's
    /// [`Dialect::bounded`](idem_sql::dialect::Dialect::bounded) is this with [`PgStore::deadline`], a claim's
    /// [`Dialect::bounded_claim`](idem_sql::dialect::Dialect::bounded_claim) with [`PgStore::deadline_waiting`] its
    /// policy's wait); past it the call is abandoned — its transaction, if
    /// any, rolls back when the connection is dropped — and reported as
    /// `Unavailable`. Not for a message with `COMMIT`, whose outcome is
    /// unknown when its answer is lost (the keys' `commit_with`).
    pub(crate) async fn within<T>(
        &self,
        deadline: Duration,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(deadline, call).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Unavailable {
                source: format!("PostgreSQL did not answer within {deadline:?}").into(),
            }),
        }
    }

    /// One autocommit statement that writes (it is its own transaction),
    /// under the deadline. Like a `COMMIT`: once it may have been sent, a
    /// broken connection or a missing answer leaves its outcome unknown.
    pub(crate) async fn write_within<T>(
        &self,
        statement: impl Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, StoreError> {
        let deadline = self.deadline();
        match tokio::time::timeout(deadline, statement).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) if connection_lost(&e) || matches!(e, sqlx::Error::Protocol(_)) => {
                Err(StoreError::OutcomeUnknown { source: e.into() })
            }
            Ok(Err(e)) => Err(map_err(e)),
            Err(_) => Err(StoreError::OutcomeUnknown {
                source: format!("PostgreSQL did not answer a write within {deadline:?}").into(),
            }),
        }
    }

    /// The database server's clock, which every lease, takeover and expiry
    /// on this store is judged by ([`KeyStore::clock`](idem_core::KeyStore::clock) hands it out as
    /// a [`SharedClock`]); see [`clock`](crate::clock) for what it assumes.
    pub fn database_clock(&self) -> &PgClock {
        &self.clock
    }

    /// `BEGIN`, with the `SET LOCAL`s a lock wait other than the pool's
    /// needs, as one simple-query message (no extra round trip).
    pub(crate) fn begin_statement(&self, wait: Duration) -> String {
        if wait == self.lock_timeout {
            "BEGIN".into()
        } else if wait < self.statement_timeout {
            format!("BEGIN; SET LOCAL lock_timeout = '{}'", millis(wait))
        } else {
            // A wait as long as the statement timeout would be cut short
            // by it (as "unavailable" instead of "in flight").
            format!(
                "BEGIN; SET LOCAL lock_timeout = '{}'; SET LOCAL statement_timeout = '{}'",
                millis(wait),
                millis(wait + self.statement_timeout)
            )
        }
    }

    /// Opens a key transaction on a writer with `message` (`BEGIN` and
    /// whatever goes with it), and says whether the message returned a row.
    ///
    /// The message is sent from a task of its own, which keeps the
    /// connection and its slot until the server answered, even when the
    /// caller gave up meanwhile (the connection is then closed, which ends
    /// the transaction) — but not past the call's deadline: a connection
    /// gone silent is closed then and its slot freed. An idle connection
    /// found dead is replaced once: a message on a broken connection ran
    /// nothing that could commit.
    pub(crate) async fn begin_writer(
        &self,
        message: String,
        wait: Duration,
    ) -> Result<(PgTx, bool), StoreError> {
        let (writers, deadline) = (self.writers.clone(), self.deadline());
        let bound = self.deadline_waiting(wait);
        let task = tokio::spawn(async move {
            match tokio::time::timeout(bound, send_begin(&writers, &message, deadline)).await {
                Ok(sent) => sent,
                Err(_) => {
                    // Silenced with its neighbours, likely: see `Conns::fetch_optional`.
                    writers.forget_idle();
                    Err(crate::conns::silent(bound))
                }
            }
        });
        match task.await {
            Ok(Ok((lease, row))) => Ok((PgTx::new(lease, self.writers.clone(), deadline), row)),
            Ok(Err(e)) => Err(map_err_waited(e, wait)),
            Err(e) => Err(StoreError::Unavailable {
                source: format!("the BEGIN task failed: {e}").into(),
            }),
        }
    }
}

/// `message` on a writer: the lease and whether a row came back. A server
/// error ends the transaction it may have opened before the writer goes back.
async fn send_begin(
    writers: &std::sync::Arc<Conns>,
    message: &str,
    deadline: Duration,
) -> Result<(Lease, bool), sqlx::Error> {
    let mut fresh_only = false;
    loop {
        let mut lease = writers.acquire(fresh_only).await?;
        match sqlx::Executor::fetch_optional(&mut lease.conn, sqlx::raw_sql(message)).await {
            Ok(row) => return Ok((lease, row.is_some())),
            Err(e) if lease.reused && !fresh_only && connection_lost(&e) => {
                writers.forget_idle();
                fresh_only = true;
            }
            // Business code deallocated Idem's prepared statements on this
            // connection: it is closed (which ends the transaction the
            // message began) and the message sent once more on a new one.
            Err(e) if !fresh_only && crate::errors::lost_prepared(&e) => {
                drop(lease);
                fresh_only = true;
            }
            Err(e) => {
                if !connection_lost(&e) {
                    crate::tx::roll_back(lease, writers.clone(), deadline).await;
                }
                return Err(e);
            }
        }
    }
}
