//! # Idem on PostgreSQL
//!
//! [`PgStore`] implements [`idem_core::KeyStore`] on PostgreSQL. The key record
//! is written in the caller's transaction, so it commits if and only if the
//! business writes commit.
//!
//! ## What the guarantees assume
//! - `READ COMMITTED` (the default). A claim is one `INSERT … ON CONFLICT DO
//!   NOTHING`; a concurrent claim of the same key blocks on the unique index
//!   until the first transaction ends, then sees its committed record and
//!   replays it. A committed record is read without a row lock, so replays of
//!   one hot key run in parallel. A record past its TTL that GC has not deleted
//!   yet is taken over by an `UPDATE … WHERE expires_at_ms <= now`.
//! - That wait is bounded by `lock_timeout`: the pool's default is set as a
//!   startup parameter (no extra round trip); a policy with another wait adds
//!   `SET LOCAL lock_timeout` to the same `BEGIN` message. Beyond it the claim
//!   fails with [`StoreError::Busy`], which the engine turns into "in flight".
//! - `fsync = on` and `synchronous_commit = on` (the defaults): a commit is
//!   durable when `COMMIT` returns.
//!
//! ## Timeouts
//! - Every store call is bounded on the client side by
//!   [`PgConfig::statement_timeout`] plus one second (a claim by its policy's
//!   wait if that is longer): a database that stops answering — a partition,
//!   a proxy that stops forwarding — gives [`StoreError::Unavailable`] within
//!   that time instead of a hang. sqlx does not expose TCP keepalive; this
//!   deadline is what bounds a silent connection.
//! - The same `statement_timeout` is set on every connection (a startup
//!   parameter), and `idle_in_transaction_session_timeout`
//!   ([`PgConfig::idle_in_transaction_timeout`]) makes the server end a
//!   session whose client went silent inside a transaction, releasing its
//!   row locks (the key it claimed) for the retry.
//! - A `COMMIT` whose answer does not arrive — the connection broke after it
//!   was sent, or the deadline passed — is [`StoreError::OutcomeUnknown`]:
//!   it may have committed. Any failure before `COMMIT` was sent rolls back
//!   and is `Unavailable`.
//!
//! ## Clock
//! Processes on several hosts share the database and its leases, so every
//! lease, takeover and expiry is judged by the database server's clock, not
//! by each host's: [`PgStore::connect`] samples the server's
//! `clock_timestamp()`, and [`KeyStore::clock`] hands out a [`PgClock`]
//! that runs on from the sample with the process's monotonic clock (error:
//! half the sample's round trip plus the drift since, resampled every 30 s;
//! see [`clock`]). `Engine::new`, `IdempotencyLayer::new`, `Runs::builder`,
//! the inbox, the outbox's write side and the collector take it by default;
//! pass `store.clock()` to what takes a clock explicitly (the relay's
//! `Dispatcher::with_clock`, the webhook `Processor` and `Receiver`, the
//! gateway's `with_clock`). With it, a host whose wall clock is off takes
//! over no live lease; NTP is not needed on the application hosts.

use std::future::Future;
use std::str::FromStr;
use std::time::Duration;

use idem_core::keys::{Claim, RecordColumns, Settled, answered_by_read};
use idem_core::{
    ClaimMode, Completion, ConfigError, Fingerprint, KeyStore, Migration, Policy, Scope,
    SharedClock, StoreError, StoredRecord,
};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgRow};
use sqlx::{PgPool, Postgres, Row, Transaction};

pub use clock::PgClock;

/// The key store's own migrations.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "idem_keys",
        sql: include_str!("../migrations/0001_idem_keys.sql"),
    },
    Migration {
        version: 2,
        name: "idem_outbox",
        sql: include_str!("../migrations/0002_idem_outbox.sql"),
    },
    Migration {
        version: 3,
        name: "idem_inbox",
        sql: include_str!("../migrations/0003_idem_inbox.sql"),
    },
    Migration {
        version: 4,
        name: "idem_webhooks",
        sql: include_str!("../migrations/0004_idem_webhooks.sql"),
    },
    Migration {
        version: 5,
        name: "idem_webhooks_hardening",
        sql: include_str!("../migrations/0005_idem_webhooks_hardening.sql"),
    },
    Migration {
        version: 6,
        name: "idem_runs",
        sql: include_str!("../migrations/0006_idem_runs.sql"),
    },
    Migration {
        version: 7,
        name: "idem_runs_namespace",
        sql: include_str!("../migrations/0007_idem_runs_namespace.sql"),
    },
    Migration {
        version: 8,
        name: "idem_admin_audit",
        sql: include_str!("../migrations/0008_idem_admin_audit.sql"),
    },
    Migration {
        version: 9,
        name: "idem_keys_on_unknown",
        sql: include_str!("../migrations/0009_idem_keys_on_unknown.sql"),
    },
];

mod admin;
pub mod clock;
mod inbox;
mod leased;
pub mod outbox;
pub mod patterns;
mod readers;
mod runs;
mod webhooks;

/// An open PostgreSQL transaction handed to business code. Dereferences to the
/// connection, so `sqlx::query(…).execute(&mut **tx)` works through a guard.
pub struct PgTx(Transaction<'static, Postgres>);

impl std::fmt::Debug for PgTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTx").finish_non_exhaustive()
    }
}

impl std::ops::Deref for PgTx {
    type Target = sqlx::PgConnection;
    fn deref(&self) -> &sqlx::PgConnection {
        &self.0
    }
}

impl std::ops::DerefMut for PgTx {
    fn deref_mut(&mut self) -> &mut sqlx::PgConnection {
        &mut self.0
    }
}

/// Connection settings for [`PgStore::connect`].
#[derive(Debug, Clone)]
pub struct PgConfig {
    /// Connections in the pool. Default 16. The claims' read-first step
    /// keeps up to as many again beside it (opened on first use, returned
    /// without a ping), so the store opens at most twice this many.
    pub max_connections: u32,
    /// How long to wait for a free connection before `Unavailable`. Default 5 s.
    pub acquire_timeout: Duration,
    /// Default `lock_timeout`, the bound on waiting for a concurrent claim.
    /// Default 5 s, matching [`Policy::DEFAULT_WAIT`].
    pub lock_timeout: Duration,
    /// `statement_timeout` of every connection, and (plus one second) the
    /// client-side deadline of every store call. Default 10 s; 1 s to 1 h, and
    /// longer than `lock_timeout`.
    pub statement_timeout: Duration,
    /// `idle_in_transaction_session_timeout`: the server ends a session that
    /// sits inside a transaction without sending anything for this long (its
    /// client is gone or hung), so the keys it claimed are free again.
    /// Longer than any handler may take between two statements. Default 60 s;
    /// 1 s to 24 h.
    pub idle_in_transaction_timeout: Duration,
}

impl Default for PgConfig {
    fn default() -> Self {
        Self {
            max_connections: 16,
            acquire_timeout: Duration::from_secs(5),
            lock_timeout: Policy::DEFAULT_WAIT,
            statement_timeout: Duration::from_secs(10),
            idle_in_transaction_timeout: Duration::from_secs(60),
        }
    }
}

impl PgConfig {
    /// Checks every bound (called by [`PgStore::connect`]).
    pub fn validate(&self) -> Result<(), ConfigError> {
        const C: &str = "PgConfig";
        let (second, hour) = (Duration::from_secs(1), Duration::from_secs(3600));
        ConfigError::check_range(C, "max_connections", self.max_connections, 1, 10_000)?;
        ConfigError::check_duration(
            C,
            "acquire_timeout",
            self.acquire_timeout,
            Duration::from_millis(10),
            hour,
        )?;
        ConfigError::check_duration(
            C,
            "lock_timeout",
            self.lock_timeout,
            Duration::from_millis(1),
            Policy::MAX_WAIT,
        )?;
        ConfigError::check_duration(C, "statement_timeout", self.statement_timeout, second, hour)?;
        ConfigError::check_duration(
            C,
            "idle_in_transaction_timeout",
            self.idle_in_transaction_timeout,
            second,
            24 * hour,
        )?;
        if self.statement_timeout <= self.lock_timeout {
            return Err(ConfigError::new(
                C,
                "statement_timeout",
                format!("longer than lock_timeout ({:?})", self.lock_timeout),
                format!("{:?}", self.statement_timeout),
            ));
        }
        Ok(())
    }
}

/// The PostgreSQL key store. Cheap to clone; clones share the pool.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    readers: std::sync::Arc<readers::Readers>,
    clock: PgClock,
    /// `clock`, as [`KeyStore::clock`] hands it out.
    shared_clock: SharedClock,
    lock_timeout: Duration,
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
    fn deadline_waiting(&self, wait: Duration) -> Duration {
        if wait < self.statement_timeout {
            self.deadline()
        } else {
            wait + self.deadline()
        }
    }

    async fn within<T>(
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

    /// The pool, for reads outside a key's transaction.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The database server's clock, which every lease, takeover and expiry
    /// on this store is judged by ([`KeyStore::clock`] hands it out as
    /// a [`SharedClock`]); see [`clock`] for what it assumes.
    pub fn database_clock(&self) -> &PgClock {
        &self.clock
    }

    /// Applies the key store's migrations (idempotent, safe to run from several
    /// processes at once).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        migrate_component(&self.pool, "idem", MIGRATIONS).await
    }

    /// Opens a transaction whose statements wait up to `wait` for row locks.
    async fn begin_waiting(
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

/// Applies `migrations` of `component` not yet recorded in
/// `idem_schema_migrations`, each in a transaction holding an advisory lock so
/// concurrent runners apply each migration once.
pub async fn migrate_component(
    pool: &PgPool,
    component: &str,
    migrations: &[Migration],
) -> Result<(), StoreError> {
    for m in migrations {
        let mut tx = pool.begin().await.map_err(map_err)?;
        // Schema changes may legitimately take longer than the pool's
        // statement timeout, and wait for another runner's advisory lock.
        sqlx::raw_sql("SET LOCAL statement_timeout = '15min'; SET LOCAL lock_timeout = '5min'")
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        sqlx::query("SELECT pg_advisory_xact_lock(7226415001)")
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        // Checked first so that a started server does not log PostgreSQL's
        // "already exists, skipping" notice for every migration.
        let exists: bool =
            sqlx::query_scalar("SELECT to_regclass('idem_schema_migrations') IS NOT NULL")
                .fetch_one(&mut *tx)
                .await
                .map_err(map_err)?;
        if !exists {
            sqlx::raw_sql(
                "CREATE TABLE idem_schema_migrations (
                     component TEXT NOT NULL, version BIGINT NOT NULL, name TEXT NOT NULL,
                     applied_at TIMESTAMPTZ NOT NULL DEFAULT now(), PRIMARY KEY (component, version))",
            )
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        }
        let seen: Option<i64> = sqlx::query_scalar(
            "SELECT version FROM idem_schema_migrations WHERE component = $1 AND version = $2",
        )
        .bind(component)
        .bind(m.version)
        .fetch_optional(&mut *tx)
        .await
        .map_err(map_err)?;
        if seen.is_some() {
            continue;
        }
        sqlx::raw_sql(m.sql)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        sqlx::query(
            "INSERT INTO idem_schema_migrations (component, version, name) VALUES ($1, $2, $3)",
        )
        .bind(component)
        .bind(m.version)
        .bind(m.name)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
    }
    Ok(())
}

/// Inserts a pending record unless the key has one. `DO NOTHING` takes no row
/// lock on a committed conflicting record, so concurrent replays of one hot key
/// do not queue behind each other; it still waits (bounded by `lock_timeout`)
/// for a conflicting claim that has not committed yet.
const INSERT_CLAIM: &str = "\
INSERT INTO idem_keys (tenant_id, operation, idempotency_key, request_hash, state,
                       locked_until_ms, created_at_ms, updated_at_ms, expires_at_ms)
VALUES ($1, $2, $3, $4, 'pending', NULL, $5, $5, $6)
ON CONFLICT (tenant_id, operation, idempotency_key) DO NOTHING
RETURNING 1";

/// Takes over a record that expired but was not collected yet. A concurrent
/// takeover holds the row lock; under READ COMMITTED this statement then
/// re-checks the condition against the winner's row and updates nothing.
const TAKE_OVER_EXPIRED: &str = "\
UPDATE idem_keys SET
    request_hash = $4, state = 'pending', status_code = NULL, response_headers = NULL,
    response_body = NULL, resource_type = NULL, resource_id = NULL, recovery_point = NULL,
    locked_until_ms = NULL, lock_token = NULL, created_at_ms = $5, updated_at_ms = $5,
    expires_at_ms = $6
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3 AND expires_at_ms <= $5
RETURNING 1";

const SELECT_RECORD: &str = idem_sql::keys::SELECT_RECORD;

/// Optimistic claims: the completed record, inserted at the end of the
/// operation's transaction. A record that expired is replaced in the same
/// statement; a live one is left alone (and locked, so the read that follows
/// sees it as committed).
const INSERT_COMPLETED: &str = "\
INSERT INTO idem_keys (tenant_id, operation, idempotency_key, request_hash, state,
                       status_code, response_headers, response_body, resource_type,
                       resource_id, locked_until_ms, created_at_ms, updated_at_ms, expires_at_ms)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, NULL, $11, $11, $12)
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
UPDATE idem_keys SET state = $4, status_code = $5, response_headers = $6, response_body = $7,
       resource_type = $8, resource_id = $9, locked_until_ms = NULL, updated_at_ms = $10
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3 AND state = 'pending'";

impl KeyStore for PgStore {
    type Tx = PgTx;

    async fn claim(
        &self,
        scope: &Scope,
        fingerprint: &Fingerprint,
        policy: &Policy,
        now_ms: i64,
    ) -> Result<Claim<PgTx>, StoreError> {
        self.within(
            self.deadline_waiting(policy.wait),
            self.claim_in_tx(scope, fingerprint, policy, now_ms),
        )
        .await
    }

    async fn complete(
        &self,
        mut tx: PgTx,
        scope: &Scope,
        completion: &Completion,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let (kind, id) = completion.resource_columns();
        let update = sqlx::query(UPDATE_COMPLETE)
            .bind(scope.tenant.as_str())
            .bind(scope.operation.as_str())
            .bind(scope.key.as_str())
            .bind(completion.state.as_str())
            .bind(i32::from(completion.response.status))
            .bind(completion.response.headers_json())
            .bind(&completion.response.body[..])
            .bind(kind)
            .bind(id)
            .bind(now_ms)
            .execute(&mut *tx.0);
        let done = self
            .bounded(async { update.await.map_err(map_err) })
            .await?;
        if done.rows_affected() != 1 {
            return Err(StoreError::Corrupt {
                detail: "the claimed record is no longer pending".into(),
            });
        }
        self.commit_tx(tx.0).await
    }

    async fn insert_completed(
        &self,
        mut tx: PgTx,
        scope: &Scope,
        fingerprint: &Fingerprint,
        completion: &Completion,
        policy: &Policy,
        now_ms: i64,
    ) -> Result<Settled, StoreError> {
        let insert = leased::outcome(
            leased::scoped(INSERT_COMPLETED, scope).bind(&fingerprint.as_bytes()[..]),
            completion,
        )
        .bind(now_ms)
        .bind(policy.expires_at_ms(now_ms));
        // The insert waits for an uncommitted duplicate as a claim does.
        let existing = self
            .within(self.deadline_waiting(policy.wait), async {
                if insert
                    .fetch_optional(&mut *tx.0)
                    .await
                    .map_err(map_err)?
                    .is_some()
                {
                    return Ok(None);
                }
                // The conflicting row is locked by the INSERT and committed:
                // READ COMMITTED shows it to the next statement.
                let row = leased::scoped(SELECT_RECORD, scope)
                    .fetch_optional(&mut *tx.0)
                    .await
                    .map_err(map_err)?;
                match row {
                    Some(row) => decode(&row).map(Some),
                    None => Err(StoreError::Busy {
                        waited: Duration::ZERO,
                    }),
                }
            })
            .await?;
        match existing {
            None => self.commit_tx(tx.0).await.map(|()| Settled::Committed),
            // Dropping the transaction queues its ROLLBACK on the connection.
            Some(record) => Ok(Settled::Existing(record)),
        }
    }

    async fn begin(&self) -> Result<PgTx, StoreError> {
        self.bounded(self.begin_waiting(self.lock_timeout))
            .await
            .map(PgTx)
    }

    async fn commit(&self, tx: PgTx) -> Result<(), StoreError> {
        self.commit_tx(tx.0).await
    }

    async fn rollback(&self, tx: PgTx) -> Result<(), StoreError> {
        self.bounded(async { tx.0.rollback().await.map_err(map_err) })
            .await
    }

    async fn fetch(&self, scope: &Scope) -> Result<Option<StoredRecord>, StoreError> {
        self.bounded(self.read_first(scope)).await
    }

    async fn purge_expired(&self, now_ms: i64, limit: u32) -> Result<u64, StoreError> {
        self.bounded(async {
            let done = sqlx::query(
                "DELETE FROM idem_keys WHERE ctid = ANY(ARRAY(
                     SELECT ctid FROM idem_keys WHERE expires_at_ms <= $1 LIMIT $2
                     FOR UPDATE SKIP LOCKED))",
            )
            .bind(now_ms)
            .bind(i64::from(limit))
            .execute(&self.pool)
            .await
            .map_err(map_err)?;
            Ok(done.rows_affected())
        })
        .await
    }

    /// The database server's clock ([`PgStore::database_clock`]): processes
    /// on hosts whose clocks disagree judge this store's leases alike.
    fn clock(&self) -> SharedClock {
        self.shared_clock.clone()
    }
}

impl PgStore {
    /// The claim's first step: one indexed read of the committed record,
    /// on a reader connection (no ping when it goes back; see `readers`).
    async fn read_first(&self, scope: &Scope) -> Result<Option<StoredRecord>, StoreError> {
        let binds = [
            scope.tenant.as_str().to_owned(),
            scope.operation.as_str().to_owned(),
            scope.key.as_str().to_owned(),
        ];
        let row = self
            .readers
            .fetch_optional(SELECT_RECORD, binds)
            .await
            .map_err(map_err)?;
        row.as_ref().map(decode).transpose()
    }

    async fn claim_in_tx(
        &self,
        scope: &Scope,
        fingerprint: &Fingerprint,
        policy: &Policy,
        now_ms: i64,
    ) -> Result<Claim<PgTx>, StoreError> {
        if let Some(record) = self.read_first(scope).await?
            && answered_by_read(&record, fingerprint, policy, now_ms)
        {
            return Ok(Claim::Existing(record));
        }
        let mut tx = self.begin_waiting(policy.wait).await?;
        if policy.mode == ClaimMode::Optimistic {
            return Ok(Claim::Claimed(PgTx(tx)));
        }
        let claim = |sql: &'static str| {
            leased::scoped(sql, scope)
                .bind(&fingerprint.as_bytes()[..])
                .bind(now_ms)
                .bind(policy.expires_at_ms(now_ms))
        };
        // Between two statements a record can be collected or taken over by
        // another claim; each turn then sees a newer committed state, so a few
        // turns settle it. Usually the first statement decides.
        for _ in 0..3 {
            let inserted = claim(INSERT_CLAIM)
                .fetch_optional(&mut *tx)
                .await
                .map_err(|e| map_err_waited(e, policy.wait))?;
            if inserted.is_some() {
                return Ok(Claim::Claimed(PgTx(tx)));
            }
            // READ COMMITTED: this statement sees the row the conflicting
            // transaction committed while our INSERT waited for it.
            let row = leased::scoped(SELECT_RECORD, scope)
                .fetch_optional(&mut *tx)
                .await
                .map_err(map_err)?;
            let Some(row) = row else { continue };
            let record = decode(&row)?;
            if record.expires_at_ms > now_ms {
                tx.rollback().await.map_err(map_err)?;
                return Ok(Claim::Existing(record));
            }
            let taken = claim(TAKE_OVER_EXPIRED)
                .fetch_optional(&mut *tx)
                .await
                .map_err(|e| map_err_waited(e, policy.wait))?;
            if taken.is_some() {
                return Ok(Claim::Claimed(PgTx(tx)));
            }
        }
        tx.rollback().await.map_err(map_err)?;
        Err(StoreError::Busy {
            waited: policy.wait,
        })
    }
}

/// Reads one column of a stored row; a value of the wrong type is `Corrupt`.
pub(crate) fn column<'r, T>(row: &'r PgRow, name: &str) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, <PgRow as Row>::Database> + sqlx::Type<<PgRow as Row>::Database>,
{
    row.try_get(name).map_err(|e| StoreError::Corrupt {
        detail: format!("column {name}: {e}"),
    })
}

fn decode(row: &PgRow) -> Result<StoredRecord, StoreError> {
    record_columns(row)?.decode()
}

/// A key record's columns, read from `row` (the shared part of every
/// query that returns a record).
pub(crate) fn record_columns(row: &PgRow) -> Result<RecordColumns, StoreError> {
    Ok(RecordColumns {
        request_hash: column(row, "request_hash")?,
        state: column(row, "state")?,
        status_code: column::<Option<i32>>(row, "status_code")?.map(i64::from),
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

fn map_err_waited(e: sqlx::Error, wait: Duration) -> StoreError {
    match map_err(e) {
        StoreError::Busy { .. } => StoreError::Busy { waited: wait },
        other => other,
    }
}

/// Whether the connection broke (I/O error, connection exception `08…`, or the
/// server ended the session `57P0…`): the statement never ran.
pub(crate) fn connection_lost(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) => true,
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|c| c.starts_with("08") || c.starts_with("57P0")),
        _ => false,
    }
}

/// Classifies a driver error by SQLSTATE: `55P03` lock_not_available is
/// `Busy`; connection exceptions (`08…`), shutdowns (`57P0…`),
/// too-many-connections (`53300`), a statement cancelled by
/// `statement_timeout` (`57014`) and a session ended by
/// `idle_in_transaction_session_timeout` (`25P03`) are `Unavailable`; data
/// exceptions (`22…`: a NUL in text, a number out of range, …) and values too
/// large for an index (`54000`) are `InvalidValue`, the caller's input.
pub fn map_err(e: sqlx::Error) -> StoreError {
    match &e {
        sqlx::Error::Database(db) => {
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            if code == "55P03" {
                StoreError::Busy {
                    waited: Duration::ZERO,
                }
            } else if code.starts_with("08")
                || code.starts_with("57P0")
                || ["53300", "57014", "25P03"].contains(&code.as_str())
            {
                StoreError::Unavailable { source: e.into() }
            } else if code.starts_with("22") || code == "54000" {
                StoreError::InvalidValue { source: e.into() }
            } else {
                StoreError::Database { source: e.into() }
            }
        }
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => StoreError::Unavailable { source: e.into() },
        _ => StoreError::Database { source: e.into() },
    }
}
