//! # Idem on SQLite
//!
//! [`SqliteStore`] implements [`idem_core::KeyStore`] on one SQLite file. The key
//! record is written in the same transaction as the caller's business writes, so
//! both commit or neither does.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_sqlite::{SqliteStore, SqliteConfig};
//! let dir = std::env::temp_dir().join(format!("idem-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let url = format!("sqlite://{}", dir.join("doc.db").display());
//! let store = SqliteStore::connect(&url, SqliteConfig::default()).await?;
//! store.migrate().await?;
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(()) }
//! ```
//!
//! ## What the guarantees assume
//! - `journal_mode = WAL` and `synchronous = FULL`: a commit is on disk when
//!   `COMMIT` returns, so it survives `kill -9` and power loss. (`NORMAL` in WAL
//!   mode can lose the last commits on power loss; this store never sets it.)
//! - Claims use `BEGIN IMMEDIATE`: the write lock is taken at `BEGIN`, so two
//!   claims never interleave and there is no read-then-upgrade deadlock.
//! - `busy_timeout` bounds how long a transaction waits for the write lock;
//!   beyond it the store answers [`StoreError::Unavailable`] (retryable).
//! - Inside one process, requests with the same key queue on an in-process gate
//!   for at most the policy's wait, and then get "in flight". Several processes
//!   on one file stay correct (the write lock serialises them) but a waiter
//!   then only sees `Busy`. One process per file is the supported layout.
//! - Leases, takeovers and expiries are judged by the host's clock (the
//!   default [`KeyStore::clock`], a
//!   `SystemClock`): every process sharing the file runs on one host and
//!   reads one kernel clock. A file shared by several hosts is not
//!   supported.

mod admin;
mod gate;
mod inbox;
mod leased;
mod migrate;
pub mod outbox;
pub mod patterns;
mod runs;
mod webhooks;

use std::ops::{Deref, DerefMut};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use idem_core::keys::{Claim, RecordColumns, Settled, answered_by_read};
use idem_core::{
    ClaimMode, Completion, ConfigError, Fingerprint, KeyStore, Policy, Scope, StoreError,
    StoredRecord,
};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous,
};
use sqlx::{Row, Sqlite, SqliteConnection, SqlitePool, Transaction};
use tokio::sync::OwnedMutexGuard;

pub use migrate::{MIGRATIONS, migrate_component};

/// Connection settings for [`SqliteStore::connect`], which validates them.
#[derive(Debug, Clone)]
pub struct SqliteConfig {
    /// Connections in the pool (readers run in parallel under WAL). Default 8,
    /// 1 to 10 000.
    pub max_connections: u32,
    /// How long to wait for a free connection before `Unavailable`. Default
    /// 5 s, 10 ms to 1 h.
    pub acquire_timeout: Duration,
    /// How long a transaction waits for the database write lock (`busy_timeout`).
    /// Default 5 s, at most 1 h.
    pub busy_timeout: Duration,
}

impl Default for SqliteConfig {
    fn default() -> Self {
        Self {
            max_connections: 8,
            acquire_timeout: Duration::from_secs(5),
            busy_timeout: Duration::from_secs(5),
        }
    }
}

impl SqliteConfig {
    /// Checks every bound (called by [`SqliteStore::connect`]).
    pub fn validate(&self) -> Result<(), ConfigError> {
        const C: &str = "SqliteConfig";
        let hour = Duration::from_secs(3600);
        ConfigError::check_range(C, "max_connections", self.max_connections, 1, 10_000)?;
        ConfigError::check_duration(
            C,
            "acquire_timeout",
            self.acquire_timeout,
            Duration::from_millis(10),
            hour,
        )?;
        ConfigError::check_duration(C, "busy_timeout", self.busy_timeout, Duration::ZERO, hour)
    }
}

#[cfg(test)]
mod config_tests {
    use super::*;

    #[test]
    fn settings_are_bounded() {
        assert_eq!(SqliteConfig::default().validate(), Ok(()));
        let bad = |c: SqliteConfig| c.validate().unwrap_err().to_string();
        let d = SqliteConfig::default;
        assert_eq!(
            bad(SqliteConfig {
                max_connections: 0,
                ..d()
            }),
            "SqliteConfig.max_connections must be between 1 and 10000, got 0"
        );
        assert_eq!(
            bad(SqliteConfig {
                acquire_timeout: Duration::ZERO,
                ..d()
            }),
            "SqliteConfig.acquire_timeout must be between 10ms and 1h, got 0s"
        );
        assert!(
            bad(SqliteConfig {
                busy_timeout: Duration::from_secs(7200),
                ..d()
            })
            .starts_with("SqliteConfig.busy_timeout")
        );
    }
}

/// The SQLite key store. Cheap to clone; clones share the pool.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    gates: Arc<gate::Gates>,
    busy_timeout: Duration,
}

/// An open SQLite transaction handed to business code. Dereferences to the
/// connection, so `sqlx::query(…).execute(&mut **tx)` works through a guard.
pub struct SqliteTx {
    // Field order matters: the transaction is dropped (rolled back) before the
    // gate lets the next request with the same key in.
    tx: Transaction<'static, Sqlite>,
    _gate: Option<OwnedMutexGuard<()>>,
}

impl std::fmt::Debug for SqliteTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteTx").finish_non_exhaustive()
    }
}

impl Deref for SqliteTx {
    type Target = SqliteConnection;
    fn deref(&self) -> &SqliteConnection {
        &self.tx
    }
}

impl DerefMut for SqliteTx {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        &mut self.tx
    }
}

impl SqliteStore {
    /// Opens (creating if missing) the database at `url` (`sqlite://path` or
    /// `sqlite::memory:` is refused: a key store must be durable).
    pub async fn connect(url: &str, config: SqliteConfig) -> Result<Self, StoreError> {
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

    /// Wraps a pool you configured yourself. It must use WAL, `synchronous =
    /// FULL` and a busy timeout equal to `busy_timeout` for the guarantees above.
    pub fn from_pool(pool: SqlitePool, busy_timeout: Duration) -> Self {
        Self {
            pool,
            gates: Arc::default(),
            busy_timeout,
        }
    }

    /// The pool, for reads outside a key's transaction.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Applies the key store's migrations (idempotent).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        migrate_component(&self.pool, "idem", MIGRATIONS).await
    }

    /// `BEGIN IMMEDIATE`, in a task of its own: sqlx 0.8's `begin_with` is not
    /// cancel safe, and a caller dropped between the worker's `BEGIN` and the
    /// `Transaction` being built (a client hanging up, a timeout) would hand
    /// the connection back to the pool still holding the database's write
    /// lock — every later write would then wait for it in vain. In a task,
    /// the begin always completes; unawaited, its transaction is dropped
    /// there and rolled back.
    async fn begin_immediate(&self) -> Result<Transaction<'static, Sqlite>, StoreError> {
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
    /// [`StoreError::OutcomeUnknown`]; a busy or full database did not commit.
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

    /// The database write lock not being free within `busy_timeout` is not about
    /// this key (the per-key gate already let us in): it means the store is
    /// overloaded or locked by another process, so it is reported as
    /// `Unavailable` (503 + Retry-After over HTTP), not as "in flight".
    pub(crate) fn map(&self, e: sqlx::Error) -> StoreError {
        match map_err(e) {
            StoreError::Busy { .. } => StoreError::Unavailable {
                source: format!("database is locked (waited {:?})", self.busy_timeout).into(),
            },
            other => other,
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

const INSERT_CLAIM: &str = "\
INSERT INTO idem_keys (tenant_id, operation, idempotency_key, request_hash, state,
                       locked_until_ms, created_at_ms, updated_at_ms, expires_at_ms)
VALUES (?1, ?2, ?3, ?4, 'pending', NULL, ?5, ?5, ?6)
ON CONFLICT (tenant_id, operation, idempotency_key) DO UPDATE SET
    request_hash = excluded.request_hash, state = 'pending', status_code = NULL,
    response_headers = NULL, response_body = NULL, resource_type = NULL,
    resource_id = NULL, recovery_point = NULL, locked_until_ms = NULL, lock_token = NULL,
    created_at_ms = excluded.created_at_ms, updated_at_ms = excluded.updated_at_ms,
    expires_at_ms = excluded.expires_at_ms
WHERE idem_keys.expires_at_ms <= excluded.created_at_ms
RETURNING 1";

const SELECT_RECORD: &str = idem_sql::keys::SELECT_RECORD;

/// Optimistic claims: the completed record, inserted at the end of the
/// operation's transaction (which holds the write lock). A record that
/// expired is replaced in the same statement; a live one is left alone.
const INSERT_COMPLETED: &str = "\
INSERT INTO idem_keys (tenant_id, operation, idempotency_key, request_hash, state,
                       status_code, response_headers, response_body, resource_type,
                       resource_id, locked_until_ms, created_at_ms, updated_at_ms, expires_at_ms)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, NULL, ?11, ?11, ?12)
ON CONFLICT (tenant_id, operation, idempotency_key) DO UPDATE SET
    request_hash = excluded.request_hash, state = excluded.state,
    status_code = excluded.status_code, response_headers = excluded.response_headers,
    response_body = excluded.response_body, resource_type = excluded.resource_type,
    resource_id = excluded.resource_id, recovery_point = NULL, locked_until_ms = NULL,
    lock_token = NULL, created_at_ms = excluded.created_at_ms,
    updated_at_ms = excluded.updated_at_ms, expires_at_ms = excluded.expires_at_ms
WHERE idem_keys.expires_at_ms <= excluded.created_at_ms
RETURNING 1";

const UPDATE_COMPLETE: &str = "\
UPDATE idem_keys SET state = ?4, status_code = ?5, response_headers = ?6, response_body = ?7,
       resource_type = ?8, resource_id = ?9, locked_until_ms = NULL, updated_at_ms = ?10
WHERE tenant_id = ?1 AND operation = ?2 AND idempotency_key = ?3 AND state = 'pending'";

impl KeyStore for SqliteStore {
    type Tx = SqliteTx;

    async fn claim(
        &self,
        scope: &Scope,
        fingerprint: &Fingerprint,
        policy: &Policy,
        now_ms: i64,
    ) -> Result<Claim<SqliteTx>, StoreError> {
        // Read first, without the write lock: WAL readers never wait for it.
        if let Some(record) = self.fetch(scope).await?
            && answered_by_read(&record, fingerprint, policy, now_ms)
        {
            return Ok(Claim::Existing(record));
        }
        if policy.mode == ClaimMode::Optimistic {
            return self.begin().await.map(Claim::Claimed);
        }
        let gate = self.gates.enter(scope, policy.wait).await?;
        let mut tx = self.begin_immediate().await?;
        let inserted = sqlx::query(INSERT_CLAIM)
            .bind(scope.tenant.as_str())
            .bind(scope.operation.as_str())
            .bind(scope.key.as_str())
            .bind(&fingerprint.as_bytes()[..])
            .bind(now_ms)
            .bind(policy.expires_at_ms(now_ms))
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| self.map(e))?;
        if inserted.is_some() {
            return Ok(Claim::Claimed(SqliteTx {
                tx,
                _gate: Some(gate),
            }));
        }
        let row = leased::scoped(SELECT_RECORD, scope)
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| self.map(e))?;
        tx.rollback().await.map_err(|e| self.map(e))?;
        match row {
            Some(row) => Ok(Claim::Existing(decode(&row)?)),
            None => Err(StoreError::Corrupt {
                detail: "conflicting key record vanished inside a write transaction".into(),
            }),
        }
    }

    async fn complete(
        &self,
        mut tx: SqliteTx,
        scope: &Scope,
        completion: &Completion,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let (kind, id) = completion.resource_columns();
        let done = sqlx::query(UPDATE_COMPLETE)
            .bind(scope.tenant.as_str())
            .bind(scope.operation.as_str())
            .bind(scope.key.as_str())
            .bind(completion.state.as_str())
            .bind(i64::from(completion.response.status))
            .bind(completion.response.headers_json())
            .bind(&completion.response.body[..])
            .bind(kind)
            .bind(id)
            .bind(now_ms)
            .execute(&mut *tx.tx)
            .await
            .map_err(|e| self.map(e))?;
        if done.rows_affected() != 1 {
            return Err(StoreError::Corrupt {
                detail: "the claimed record is no longer pending".into(),
            });
        }
        self.commit_tx(tx.tx).await
    }

    async fn insert_completed(
        &self,
        mut tx: SqliteTx,
        scope: &Scope,
        fingerprint: &Fingerprint,
        completion: &Completion,
        policy: &Policy,
        now_ms: i64,
    ) -> Result<Settled, StoreError> {
        let inserted = leased::outcome(
            leased::scoped(INSERT_COMPLETED, scope).bind(&fingerprint.as_bytes()[..]),
            completion,
        )
        .bind(now_ms)
        .bind(policy.expires_at_ms(now_ms))
        .fetch_optional(&mut *tx.tx)
        .await
        .map_err(|e| self.map(e))?;
        if inserted.is_some() {
            return self.commit_tx(tx.tx).await.map(|()| Settled::Committed);
        }
        // The transaction holds the write lock: the conflicting record is
        // committed and stays as read until the rollback.
        let row = leased::scoped(SELECT_RECORD, scope)
            .fetch_optional(&mut *tx.tx)
            .await
            .map_err(|e| self.map(e))?;
        tx.tx.rollback().await.map_err(|e| self.map(e))?;
        match row {
            Some(row) => Ok(Settled::Existing(decode(&row)?)),
            None => Err(StoreError::Corrupt {
                detail: "conflicting key record vanished inside a write transaction".into(),
            }),
        }
    }

    async fn begin(&self) -> Result<SqliteTx, StoreError> {
        Ok(SqliteTx {
            tx: self.begin_immediate().await?,
            _gate: None,
        })
    }

    async fn commit(&self, tx: SqliteTx) -> Result<(), StoreError> {
        self.commit_tx(tx.tx).await
    }

    async fn rollback(&self, tx: SqliteTx) -> Result<(), StoreError> {
        tx.tx.rollback().await.map_err(|e| self.map(e))
    }

    async fn fetch(&self, scope: &Scope) -> Result<Option<StoredRecord>, StoreError> {
        let row = leased::scoped(SELECT_RECORD, scope)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.map(e))?;
        row.as_ref().map(decode).transpose()
    }

    async fn purge_expired(&self, now_ms: i64, limit: u32) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "DELETE FROM idem_keys WHERE rowid IN \
             (SELECT rowid FROM idem_keys WHERE expires_at_ms <= ?1 LIMIT ?2)",
        )
        .bind(now_ms)
        .bind(i64::from(limit))
        .execute(&self.pool)
        .await
        .map_err(|e| self.map(e))?;
        Ok(done.rows_affected())
    }
}

/// Reads one column of a stored row; a value of the wrong type is `Corrupt`.
pub(crate) fn column<'r, T>(row: &'r SqliteRow, name: &str) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, <SqliteRow as Row>::Database> + sqlx::Type<<SqliteRow as Row>::Database>,
{
    row.try_get(name).map_err(|e| StoreError::Corrupt {
        detail: format!("column {name}: {e}"),
    })
}

pub(crate) fn decode(row: &SqliteRow) -> Result<StoredRecord, StoreError> {
    record_columns(row)?.decode()
}

/// A key record's columns, read from `row` (the shared part of every
/// query that returns a record).
pub(crate) fn record_columns(row: &SqliteRow) -> Result<RecordColumns, StoreError> {
    Ok(RecordColumns {
        request_hash: column(row, "request_hash")?,
        state: column(row, "state")?,
        status_code: column(row, "status_code")?,
        response_headers: column(row, "response_headers")?,
        response_body: column(row, "response_body")?,
        resource_type: column(row, "resource_type")?,
        resource_id: column(row, "resource_id")?,
        locked_until_ms: column(row, "locked_until_ms")?,
        created_at_ms: column(row, "created_at_ms")?,
        expires_at_ms: column(row, "expires_at_ms")?,
        on_unknown: column(row, "on_unknown")?,
    })
}

fn outcome_unknown(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::WorkerCrashed | sqlx::Error::Io(_) => true,
        sqlx::Error::Database(db) => {
            db.code().and_then(|c| c.parse::<i64>().ok()).unwrap_or(0) & 0xff == 10
        }
        _ => false,
    }
}

/// Classifies a driver error. SQLite result codes: 5 `BUSY`, 6 `LOCKED`,
/// 8 `READONLY`, 10 `IOERR`, 13 `FULL`, 14 `CANTOPEN` (extended codes carry the
/// primary code in their low byte).
pub fn map_err(e: sqlx::Error) -> StoreError {
    match &e {
        sqlx::Error::Database(db) => {
            let code = db.code().and_then(|c| c.parse::<i64>().ok()).unwrap_or(0) & 0xff;
            match code {
                5 | 6 => StoreError::Busy {
                    waited: Duration::ZERO,
                },
                8 | 10 | 13 | 14 => StoreError::Unavailable { source: e.into() },
                _ => StoreError::Database { source: e.into() },
            }
        }
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => StoreError::Unavailable { source: e.into() },
        _ => StoreError::Database { source: e.into() },
    }
}
