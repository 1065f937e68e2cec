//! [`Dialect`] for [`PgStore`] (this backend's part of what idem-sql writes once): what the store code of [`idem_sql`],
//! written once for both backends, runs on here — the driver's primitives
//! (a [`Stmt`] bound to PostgreSQL's types, an `INTEGER` as 32 bits, lists
//! as arrays), the client-side deadlines (see [`pool`](crate::pool)), the
//! error mapping, the database server's clock, and this backend's own
//! claims ([`keys`](crate::keys), [`leased`](crate::leased)).

use std::future::Future;
use std::time::Duration;

use idem_core::keys::Claim;
use idem_core::leased::LeasedClaim;
use idem_core::steps::{Fence, NewRun, RunId, RunRecord};
use idem_core::webhooks::{Accepted, NewReceipt};
use idem_core::{Completion, Operation, Scope, SharedClock, StoreError, StoredRecord};
use idem_sql::dialect::{Arg, Dialect, Family, Stmt};
use idem_sql::keys::{ClaimRequest, Refused};
use idem_sql::leased::LeaseClaim;
use idem_sql::runs::{RunWrite, Takeover};
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::{Executor, PgPool, Postgres};

use crate::{PgConfig, PgDialect, PgTx};

/// An `INTEGER` column's value, saturated to 32 bits.
fn int(v: i64) -> i32 {
    i32::try_from(v).unwrap_or(if v < 0 { i32::MIN } else { i32::MAX })
}

/// A statement as the driver's query: PostgreSQL binds an `INTEGER` as 32
/// bits and a list as an array (`= ANY($n)`).
pub(crate) fn query<'q>(s: &'q Stmt<'q>) -> sqlx::query::Query<'q, Postgres, PgArguments> {
    let mut q = sqlx::query(&s.sql);
    for arg in &s.args {
        q = match arg {
            Arg::I64(v) => q.bind(*v),
            Arg::OptI64(v) => q.bind(*v),
            Arg::Int(v) => q.bind(int(*v)),
            Arg::OptInt(v) => q.bind(v.map(int)),
            Arg::Bool(v) => q.bind(*v),
            Arg::Text(v) => q.bind(v.as_ref()),
            Arg::OptText(v) => q.bind(v.as_deref()),
            Arg::Bytes(v) => q.bind(v.as_ref()),
            Arg::OptBytes(v) => q.bind(v.as_deref()),
            Arg::Ids(v) => q.bind(v.as_slice()),
            Arg::Texts(v) => q.bind(v.as_slice()),
        };
    }
    q
}

impl Dialect for PgDialect {
    type Db = Postgres;
    type Row = PgRow;
    type Tx = PgTx;
    type Left = ();

    type Config = PgConfig;

    const FAMILY: Family = Family::Postgres;

    fn connect(
        url: &str,
        config: PgConfig,
    ) -> impl Future<Output = Result<Self, StoreError>> + Send {
        Self::open(url, config)
    }

    fn pool(&self) -> &PgPool {
        &self.pool
    }

    fn map_err(e: sqlx::Error) -> StoreError {
        crate::map_err(e)
    }

    fn bounded<T: Send>(
        &self,
        call: impl Future<Output = Result<T, StoreError>> + Send,
    ) -> impl Future<Output = Result<T, StoreError>> + Send {
        self.within(self.deadline(), call)
    }

    fn bounded_claim<T: Send>(
        &self,
        wait: Duration,
        call: impl Future<Output = Result<T, StoreError>> + Send,
    ) -> impl Future<Output = Result<T, StoreError>> + Send {
        self.within(self.deadline_waiting(wait), call)
    }

    fn bounded_write<T: Send>(
        &self,
        statement: impl Future<Output = Result<T, sqlx::Error>> + Send,
    ) -> impl Future<Output = Result<T, StoreError>> + Send {
        self.write_within(statement)
    }

    /// The database server's clock ([`PgDialect::database_clock`]): processes
    /// on hosts whose clocks disagree judge this store's leases alike.
    fn clock(&self) -> SharedClock {
        self.shared_clock.clone()
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
    ) -> impl Future<Output = Result<Claim<PgTx>, StoreError>> + Send {
        self.claim_writer(scope, r)
    }

    fn begin_here(&self) -> impl Future<Output = Result<PgTx, StoreError>> + Send {
        self.begin_business()
    }

    fn complete_message(
        &self,
        tx: PgTx,
        scope: &Scope,
        completion: &Completion,
        now_ms: i64,
    ) -> impl Future<Output = Result<(), Refused<()>>> + Send {
        self.complete_commit(tx, scope, completion, now_ms)
    }

    fn insert_completed_message(
        &self,
        tx: PgTx,
        scope: &Scope,
        r: ClaimRequest<'_>,
        completion: &Completion,
    ) -> impl Future<Output = Result<(), Refused<()>>> + Send {
        self.insert_commit(tx, scope, r, completion)
    }

    fn live_record(
        &self,
        (): (),
        scope: &Scope,
    ) -> impl Future<Output = Result<StoredRecord, StoreError>> + Send {
        self.live_record_after(scope)
    }

    fn commit_here(&self, tx: PgTx) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.commit_writer(tx)
    }

    fn rollback_here(&self, tx: PgTx) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.rollback_writer(tx)
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
        tx: &'a mut PgTx,
        run: &'a NewRun<'a>,
    ) -> impl Future<Output = Result<Fence, StoreError>> + Send + 'a {
        crate::runs::create_run(tx, run)
    }

    fn record_in<'a>(
        tx: &'a mut PgTx,
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
        self.take_over_alone(id, t)
    }

    fn claim_due_here(
        &self,
        operations: &[Operation],
        t: Takeover<'_>,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<RunRecord>, StoreError>> + Send {
        self.claim_due_alone(operations, t, limit)
    }

    fn accept_here(
        &self,
        r: &NewReceipt,
        at: (i64, i64),
    ) -> impl Future<Output = Result<Accepted, StoreError>> + Send {
        crate::webhooks::accept(self, r, at)
    }

    fn query<'q>(s: &'q Stmt<'q>) -> impl sqlx::Execute<'q, Postgres> + 'q {
        crate::dialect::query(s)
    }

    fn rows_affected(done: &<Postgres as sqlx::Database>::QueryResult) -> u64 {
        done.rows_affected()
    }

    fn on_pool<'c>(pool: &'c sqlx::Pool<Postgres>) -> impl Executor<'c, Database = Postgres> + 'c {
        pool
    }

    fn on_conn<'c>(
        conn: &'c mut sqlx::PgConnection,
    ) -> impl Executor<'c, Database = Postgres> + 'c {
        conn
    }
}
