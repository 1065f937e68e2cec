//! [`SqliteDialect`](crate::SqliteDialect): connection setup, the pool, `BEGIN IMMEDIATE` and
//! `COMMIT`, and the glue the shared statements of [`idem_sql`] run
//! through (`map`, `bounded`, `bounded_write`, `purge`).

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use idem_core::StoreError;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Sqlite, SqlitePool, Transaction};

use crate::errors::outcome_unknown;
use crate::readers::Readers;
use crate::writer::Writer;
use idem_sql::dialect::Dialect;

use crate::{SqliteConfig, gate, map_err};

/// SQLite as [`idem_sql::SqlStore`] runs on it ([`Dialect`](idem_sql::Dialect)):
/// the pool, the key transactions' writer and its per-key gates, the
/// readers of the claims' read first. [`SqliteStore`](crate::SqliteStore)
/// is the store on it. Cheap to clone; clones share the pool.
#[derive(Debug, Clone)]
pub struct SqliteDialect {
    pub(crate) pool: SqlitePool,
    pub(crate) gates: Arc<gate::Gates>,
    /// The claims' read-first connections ([`crate::readers`]).
    pub(crate) readers: Arc<Readers>,
    /// The key engine's transactions' connection ([`crate::writer`]).
    pub(crate) writer: Arc<Writer>,
    pub(crate) busy_timeout: Duration,
}

impl SqliteDialect {
    /// Opens (creating if missing) the database at `url` (`sqlite://path` or
    /// `sqlite::memory:` is refused: a key store must be durable).
    pub(crate) async fn open(url: &str, config: SqliteConfig) -> Result<Self, StoreError> {
        config
            .validate()
            .map_err(|e| StoreError::Database { source: e.into() })?;
        if url.contains(":memory:") || url.contains("mode=memory") {
            return Err(StoreError::Database {
                source: "an in-memory SQLite database is not durable; use a file".into(),
            });
        }
        if file_path(url).is_some_and(str::is_empty) {
            return Err(StoreError::Database {
                source: "an empty SQLite path is a temporary database, not durable; name a file \
                         (sqlite://idem.db)"
                    .into(),
            });
        }
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::Database { source: e.into() })?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(config.busy_timeout)
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(config.max_connections)
            .acquire_timeout(config.acquire_timeout)
            // A local file cannot hang up: no ping before each use.
            .test_before_acquire(false)
            .connect_with(options)
            .await
            .map_err(map_err)?;
        Ok(Self::from_pool(pool, config.busy_timeout))
    }

    /// Wraps a pool you configured yourself (the store on it:
    /// `SqliteStore::new(SqliteDialect::from_pool(pool, busy_timeout))`). It
    /// must use WAL, `synchronous = FULL` and a busy timeout equal to
    /// `busy_timeout` for the guarantees of the crate docs.
    pub fn from_pool(pool: SqlitePool, busy_timeout: Duration) -> Self {
        let options = pool.options();
        let readers = Readers::new(
            pool.clone(),
            options.get_max_connections(),
            options.get_acquire_timeout(),
        );
        Self {
            readers: Arc::new(readers),
            writer: Arc::new(Writer::new(pool.clone(), busy_timeout)),
            pool,
            gates: Arc::default(),
            busy_timeout,
        }
    }

    /// `BEGIN IMMEDIATE`, in a task of its own: sqlx 0.8's `begin_with` is not
    /// cancel safe, and a caller dropped between the worker's `BEGIN` and the
    /// `Transaction` being built (a client hanging up, a timeout) would hand
    /// the connection back to the pool still holding the database's write
    /// lock — every later write would then wait for it in vain. In a task,
    /// the begin always completes; unawaited, its transaction is dropped
    /// there and rolled back.
    pub(crate) async fn begin_immediate(&self) -> Result<Transaction<'static, Sqlite>, StoreError> {
        let pool = self.pool.clone();
        let task = tokio::spawn(async move { pool.begin_with("BEGIN IMMEDIATE").await });
        match task.await {
            Ok(begun) => begun.map_err(|e| self.map(e)),
            Err(e) => Err(StoreError::Unavailable {
                source: format!("the BEGIN task failed: {e}").into(),
            }),
        }
    }

    /// Commits. A commit that fails with an I/O error (the WAL's sync may or
    /// may not have reached the disk) or whose worker thread died is
    /// [`StoreError::OutcomeUnknown`](idem_core::StoreError::OutcomeUnknown); a busy or full database did not commit.
    pub(crate) async fn commit_tx(
        &self,
        tx: Transaction<'static, Sqlite>,
    ) -> Result<(), StoreError> {
        match tx.commit().await {
            Ok(()) => Ok(()),
            Err(e) if outcome_unknown(&e) => Err(StoreError::OutcomeUnknown { source: e.into() }),
            Err(e) => Err(self.map(e)),
        }
    }
}

/// The file an `sqlite:` URL names (`sqlite://PATH?…` or `sqlite:PATH`), or
/// `None` for another scheme.
pub fn file_path(url: &str) -> Option<&str> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    Some(rest.split('?').next().unwrap_or(rest))
}
