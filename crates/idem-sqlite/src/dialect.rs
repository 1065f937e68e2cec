//! [`Dialect`] for [`SqliteStore`] (this backend's part of what idem-sql writes once): what the store code of [`idem_sql`],
//! written once for both backends, runs on here — the driver's primitives
//! (a [`Stmt`] bound to SQLite's types, lists as JSON arrays), the
//! deadlines (none: a local file cannot hang up), the error mapping and
//! this backend's own claims ([`keys`](crate::keys), [`leased`](crate::leased)).

use std::future::Future;
use std::time::Duration;

use idem_core::keys::Claim;
use idem_core::leased::LeasedClaim;
use idem_core::steps::{Fence, NewRun, RunId, RunRecord};
use idem_core::webhooks::{Accepted, NewReceipt};
use idem_core::{Completion, Operation, Scope, StoreError, StoredRecord};
use idem_sql::dialect::{Arg, Dialect, Family, Stmt};
use idem_sql::keys::{ClaimRequest, Refused};
use idem_sql::leased::LeaseClaim;
use idem_sql::runs::{RunWrite, Takeover};
use sqlx::sqlite::{SqliteArguments, SqliteRow};
use sqlx::{Executor, Sqlite, SqlitePool};

use crate::writer::Lease;
use crate::{SqliteConfig, SqliteDialect, SqliteTx};

/// A statement as the driver's query: SQLite binds an `INTEGER` as 64 bits
/// and a list as a JSON array (`json_each`).
pub(crate) fn query<'q>(s: &'q Stmt<'q>) -> sqlx::query::Query<'q, Sqlite, SqliteArguments<'q>> {
    let mut q = sqlx::query(&s.sql);
    for arg in &s.args {
        q = match arg {
            Arg::I64(v) | Arg::Int(v) => q.bind(*v),
            Arg::OptI64(v) | Arg::OptInt(v) => q.bind(*v),
            Arg::Bool(v) => q.bind(*v),
            Arg::Text(v) => q.bind(v.as_ref()),
            Arg::OptText(v) => q.bind(v.as_deref()),
            Arg::Bytes(v) => q.bind(v.as_ref()),
            Arg::OptBytes(v) => q.bind(v.as_deref()),
            Arg::Ids(v) => q.bind(serde_json::Value::from(v.as_slice()).to_string()),
            Arg::Texts(v) => q.bind(serde_json::Value::from(v.as_slice()).to_string()),
        };
    }
    q
}

impl Dialect for SqliteDialect {
    type Db = Sqlite;
    type Row = SqliteRow;
    type Tx = SqliteTx;
    type Left = Lease;

    type Config = SqliteConfig;

    const FAMILY: Family = Family::Sqlite;

    fn connect(
        url: &str,
        config: SqliteConfig,
    ) -> impl Future<Output = Result<Self, StoreError>> + Send {
        Self::open(url, config)
    }

    fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    fn map_err(e: sqlx::Error) -> StoreError {
        crate::map_err(e)
    }

    /// The database write lock not being free within `busy_timeout` is not
    /// about this key (the per-key gate already let us in): it means the
    /// store is overloaded or locked by another process, so it is reported
    /// as `Unavailable` (503 + Retry-After over HTTP), not as "in flight".
    fn map(&self, e: sqlx::Error) -> StoreError {
        match crate::map_err(e) {
            StoreError::Busy { .. } => StoreError::Unavailable {
                source: format!("database is locked (waited {:?})", self.busy_timeout).into(),
            },
            other => other,
        }
    }

    /// The call as it is: no deadline.
    async fn bounded<T: Send>(
        &self,
        call: impl Future<Output = Result<T, StoreError>> + Send,
    ) -> Result<T, StoreError> {
        call.await
    }

    /// A claim as it is: no deadline (a claim may wait `_wait`).
    async fn bounded_claim<T: Send>(
        &self,
        _wait: Duration,
        call: impl Future<Output = Result<T, StoreError>> + Send,
    ) -> Result<T, StoreError> {
        call.await
    }

    /// One autocommit statement that writes, its error through `map`.
    async fn bounded_write<T: Send>(
        &self,
        statement: impl Future<Output = Result<T, sqlx::Error>> + Send,
    ) -> Result<T, StoreError> {
        statement.await.map_err(|e| self.map(e))
    }

    fn read_first(
        &self,
        scope: &Scope,
    ) -> impl Future<Output = Result<Option<StoredRecord>, StoreError>> + Send {
        self.read_first_here(scope)
    }

    fn claim_here(
        &self,
        scope: &Scope,
        r: ClaimRequest<'_>,
    ) -> impl Future<Output = Result<Claim<SqliteTx>, StoreError>> + Send {
        self.claim_writer(scope, r)
    }

    fn begin_here(&self) -> impl Future<Output = Result<SqliteTx, StoreError>> + Send {
        self.begin_writer()
    }

    fn complete_message(
        &self,
        tx: SqliteTx,
        scope: &Scope,
        completion: &Completion,
        now_ms: i64,
    ) -> impl Future<Output = Result<(), Refused<()>>> + Send {
        self.complete_commit(tx, scope, completion, now_ms)
    }

    fn insert_completed_message(
        &self,
        tx: SqliteTx,
        scope: &Scope,
        r: ClaimRequest<'_>,
        completion: &Completion,
    ) -> impl Future<Output = Result<(), Refused<Lease>>> + Send {
        self.insert_commit(tx, scope, r, completion)
    }

    fn live_record(
        &self,
        left: Lease,
        scope: &Scope,
    ) -> impl Future<Output = Result<StoredRecord, StoreError>> + Send {
        self.live_record_in(left, scope)
    }

    fn commit_here(&self, tx: SqliteTx) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.commit_writer(tx)
    }

    /// `ROLLBACK`. One that fails closes the writer's connection, which
    /// rolls back as surely: nothing of the transaction is ever committed.
    async fn rollback_here(&self, tx: SqliteTx) -> Result<(), StoreError> {
        tx.lease.roll_back().await;
        Ok(())
    }

    fn claim_leased_here(
        &self,
        scope: &Scope,
        c: LeaseClaim<'_>,
        now_ms: i64,
    ) -> impl Future<Output = Result<LeasedClaim, StoreError>> + Send {
        crate::leased::claim(self, scope, c, now_ms)
    }

    fn create_run_here<'a>(
        tx: &'a mut SqliteTx,
        run: &'a NewRun<'a>,
    ) -> impl Future<Output = Result<Fence, StoreError>> + Send + 'a {
        crate::runs::create_run(tx, run)
    }

    fn record_in<'a>(
        tx: &'a mut SqliteTx,
        w: RunWrite<'a>,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'a {
        crate::runs::record_in(tx, w)
    }

    fn record_here(
        &self,
        w: RunWrite<'_>,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        self.record_alone(w)
    }

    fn take_over_here(
        &self,
        id: &RunId,
        t: Takeover<'_>,
    ) -> impl Future<Output = Result<Option<RunRecord>, StoreError>> + Send {
        self.take_over_in_tx(id, t)
    }

    fn claim_due_here(
        &self,
        operations: &[Operation],
        t: Takeover<'_>,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<RunRecord>, StoreError>> + Send {
        self.claim_due_in_tx(operations, t, limit)
    }

    fn accept_here(
        &self,
        r: &NewReceipt,
        at: (i64, i64),
    ) -> impl Future<Output = Result<Accepted, StoreError>> + Send {
        crate::webhooks::accept(self, r, at)
    }

    fn query<'q>(s: &'q Stmt<'q>) -> impl sqlx::Execute<'q, Sqlite> + 'q {
        crate::dialect::query(s)
    }

    fn rows_affected(done: &<Sqlite as sqlx::Database>::QueryResult) -> u64 {
        done.rows_affected()
    }

    fn on_pool<'c>(pool: &'c sqlx::Pool<Sqlite>) -> impl Executor<'c, Database = Sqlite> + 'c {
        pool
    }

    fn on_conn<'c>(
        conn: &'c mut sqlx::SqliteConnection,
    ) -> impl Executor<'c, Database = Sqlite> + 'c {
        conn
    }
}
