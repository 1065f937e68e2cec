//! [`PgStore`]: connection setup, the pool, the client-side deadline of
//! every call, `BEGIN` (with its lock wait) and `COMMIT`, and the glue the
//! shared statements of [`idem_sql`] run through (`map`, `bounded`,
//! `bounded_write`, `purge`).

use std::future::Future;
use std::str::FromStr;
use std::time::Duration;

use idem_core::{SharedClock, StoreError};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres, Transaction};

use crate::errors::{connection_lost, map_err_waited};
use crate::{PgClock, PgConfig, map_err, migrate_component, readers};

/// The PostgreSQL key store. Cheap to clone; clones share the pool.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    pub(crate) readers: std::sync::Arc<readers::Readers>,
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

impl PgStore {
    /// Connects to `url` (`postgres://…`).
    pub async fn connect(url: &str, config: PgConfig) -> Result<Self, StoreError> {
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
            ]);
        let pool = PgPoolOptions::new()
            .max_connections(config.max_connections)
            .acquire_timeout(config.acquire_timeout)
            // No ping before each use: it would cost a round trip per request.
            // A connection that died while idle fails at `BEGIN`, before
            // anything happened, and `begin_waiting` retries on a fresh one.
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
            readers: std::sync::Arc::new(readers::Readers::new(
                options,
                config.max_connections,
                config.acquire_timeout,
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

    /// Runs one store call under [`PgStore::deadline`]; past it the call is
    /// abandoned — its transaction, if any, rolls back when the connection is
    /// dropped — and reported as `Unavailable`. Not for `COMMIT`: see
    /// [`PgStore::commit_tx`].
    pub(crate) async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.within(self.deadline(), call).await
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
    pub(crate) async fn bounded_write<T>(
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

    /// Commits under the deadline. Once `COMMIT` may have been sent, a broken
    /// connection or a missing answer means the outcome is unknown; an error
    /// the server answered with means it rolled back.
    pub(crate) async fn commit_tx(
        &self,
        tx: Transaction<'static, Postgres>,
    ) -> Result<(), StoreError> {
        let deadline = self.deadline();
        match tokio::time::timeout(deadline, tx.commit()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) if connection_lost(&e) || matches!(e, sqlx::Error::Protocol(_)) => {
                Err(StoreError::OutcomeUnknown { source: e.into() })
            }
            Ok(Err(e)) => Err(map_err(e)),
            Err(_) => Err(StoreError::OutcomeUnknown {
                source: format!("PostgreSQL did not answer COMMIT within {deadline:?}").into(),
            }),
        }
    }

    /// The database server's clock, which every lease, takeover and expiry
    /// on this store is judged by ([`KeyStore::clock`](idem_core::KeyStore::clock) hands it out as
    /// a [`SharedClock`]); see [`clock`](crate::clock) for what it assumes.
    pub fn database_clock(&self) -> &PgClock {
        &self.clock
    }

    idem_sql::store_common!(PgPool, crate::MIGRATIONS);

    /// Opens a transaction whose statements wait up to `wait` for row locks.
    pub(crate) async fn begin_waiting(
        &self,
        wait: Duration,
    ) -> Result<Transaction<'static, Postgres>, StoreError> {
        // A pooled connection the server or network closed while it was idle
        // fails here with an I/O error; nothing was sent that could have taken
        // effect, so another try on another connection is safe. A restart or a
        // failover ends every idle connection at once: try until the pool has
        // had the chance to replace each of them.
        let mut lost = 0;
        let tries = self.pool.options().get_max_connections() + 1;
        loop {
            let statement = if wait == self.lock_timeout {
                None
            } else if wait < self.statement_timeout {
                // One simple-query message: no extra round trip.
                Some(format!(
                    "BEGIN; SET LOCAL lock_timeout = '{}'",
                    millis(wait)
                ))
            } else {
                // A wait as long as the statement timeout would be cut short
                // by it (as "unavailable" instead of "in flight").
                Some(format!(
                    "BEGIN; SET LOCAL lock_timeout = '{}'; SET LOCAL statement_timeout = '{}'",
                    millis(wait),
                    millis(wait + self.statement_timeout)
                ))
            };
            match begin_detached(&self.pool, statement).await {
                Ok(tx) => return Ok(tx),
                Err(e) if lost + 1 < tries && connection_lost(&e) => lost += 1,
                Err(e) => return Err(map_err_waited(e, wait)),
            }
        }
    }

    /// A driver error as the shared statements of [`idem_sql`] report it.
    pub(crate) fn map(&self, e: sqlx::Error) -> StoreError {
        map_err(e)
    }
}

/// Ids as PostgreSQL binds a list: an array (`= ANY($n)`).
pub(crate) fn id_list(ids: &[i64]) -> &[i64] {
    ids
}

/// Texts as PostgreSQL binds a list: an array (`= ANY($n)`).
pub(crate) fn text_list(items: Vec<String>) -> Vec<String> {
    items
}

/// Opens a transaction in a task of its own.
///
/// sqlx 0.8's `begin` is not cancel safe: a caller dropped while `BEGIN` is
/// in flight — a client hanging up, a deadline — leaves the pooled connection
/// inside a transaction sqlx does not know about, and that transaction then
/// swallows the next user's autocommit writes (acknowledged, never
/// committed). Run in a task, the begin always completes; when nobody awaits
/// it any more, its `Transaction` is dropped there and rolled back the way
/// sqlx expects.
async fn begin_detached(
    pool: &PgPool,
    statement: Option<String>,
) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
    let pool = pool.clone();
    let task = tokio::spawn(async move {
        match statement {
            None => pool.begin().await,
            Some(statement) => pool.begin_with(statement).await,
        }
    });
    task.await
        .unwrap_or_else(|e| Err(sqlx::Error::Protocol(format!("the BEGIN task failed: {e}"))))
}
