//! [`Dialect`]: what a backend provides for the store code of this crate,
//! which is written once, generic over it.
//!
//! A backend implements [`Dialect`] for its store: its driver
//! ([`Dialect::Db`]) and row type, its pool, its key transaction, error
//! mapping, deadlines, the messages of the key engine's hot path (claim,
//! `BEGIN`, the record with `COMMIT`, `ROLLBACK`, the read first), its SQL
//! family ([`Dialect::FAMILY`]: each capability module picks its text by it), and the driver's
//! binding of a [`Stmt`] ([`Dialect::query`]) with its pool and connection
//! as executors, on which [`Dialect::execute`] and its siblings run a
//! statement [`On`] either, written once here.
//!
//! # Why statements are values ([`Stmt`]) and not sqlx queries
//! Code generic over `sqlx::Database` needs a where-clause for every type it
//! binds or decodes and for every executor it runs on (`for<'c> &'c mut
//! DB::Connection: Executor<'c, Database = DB>`, `i64: Encode<'q, DB> +
//! Type<DB>`, … for each value type, on every generic function), and such
//! where-clauses are not implied at use sites: each caller repeats them.
//! Here a statement is its text and a list of [`Arg`]s, which the backend
//! binds in one small function against its concrete driver; rows come back
//! as [`Dialect::Row`], whose bound ([`Columns`]) is an associated-type
//! bound and therefore implied wherever `D: Dialect` is. Generic code thus
//! needs the one bound `D: Dialect`. Binding through an enum costs a match
//! per value, nothing on the wire: the same text and the same values reach
//! the server as before.

use std::borrow::Cow;
use std::future::Future;
use std::ops::DerefMut;
use std::time::Duration;

use idem_core::keys::Claim;
use idem_core::steps::{Fence, NewRun, RunId, RunRecord};
use idem_core::webhooks::{Accepted, NewReceipt};
use idem_core::{Completion, Operation, Scope, SharedClock, StoreError, StoredRecord};

use crate::calls::{ClaimRequest, LeaseClaim, Refused, RunWrite, Takeover};
use sqlx::Executor;

use crate::row::Columns;

/// One value bound to a statement's `$n`.
#[derive(Debug, Clone, PartialEq)]
pub enum Arg<'a> {
    /// A `BIGINT` (64-bit on both).
    I64(i64),
    /// A nullable `BIGINT`.
    OptI64(Option<i64>),
    /// An `INTEGER` column's value: bound 64-bit on SQLite, 32-bit on
    /// PostgreSQL (saturated).
    Int(i64),
    /// A nullable `INTEGER`.
    OptInt(Option<i64>),
    /// A boolean.
    Bool(bool),
    /// Text.
    Text(Cow<'a, str>),
    /// Nullable text.
    OptText(Option<Cow<'a, str>>),
    /// Bytes.
    Bytes(Cow<'a, [u8]>),
    /// Nullable bytes.
    OptBytes(Option<Cow<'a, [u8]>>),
    /// A list of ids, as the dialect binds a list (a JSON array on SQLite,
    /// an array on PostgreSQL).
    Ids(Vec<i64>),
    /// A list of texts, as the dialect binds a list.
    Texts(Vec<String>),
}

impl From<i64> for Arg<'_> {
    fn from(v: i64) -> Self {
        Arg::I64(v)
    }
}
impl From<Option<i64>> for Arg<'_> {
    fn from(v: Option<i64>) -> Self {
        Arg::OptI64(v)
    }
}
impl From<bool> for Arg<'_> {
    fn from(v: bool) -> Self {
        Arg::Bool(v)
    }
}
impl<'a> From<&'a str> for Arg<'a> {
    fn from(v: &'a str) -> Self {
        Arg::Text(Cow::Borrowed(v))
    }
}
impl<'a> From<&'a String> for Arg<'a> {
    fn from(v: &'a String) -> Self {
        Arg::Text(Cow::Borrowed(v))
    }
}
impl From<String> for Arg<'_> {
    fn from(v: String) -> Self {
        Arg::Text(Cow::Owned(v))
    }
}
impl<'a> From<Option<&'a str>> for Arg<'a> {
    fn from(v: Option<&'a str>) -> Self {
        Arg::OptText(v.map(Cow::Borrowed))
    }
}
impl From<Option<String>> for Arg<'_> {
    fn from(v: Option<String>) -> Self {
        Arg::OptText(v.map(Cow::Owned))
    }
}
impl<'a> From<&'a Option<String>> for Arg<'a> {
    fn from(v: &'a Option<String>) -> Self {
        Arg::OptText(v.as_deref().map(Cow::Borrowed))
    }
}
impl<'a> From<&'a [u8]> for Arg<'a> {
    fn from(v: &'a [u8]) -> Self {
        Arg::Bytes(Cow::Borrowed(v))
    }
}
impl From<Vec<u8>> for Arg<'_> {
    fn from(v: Vec<u8>) -> Self {
        Arg::Bytes(Cow::Owned(v))
    }
}
impl<'a> From<Option<&'a [u8]>> for Arg<'a> {
    fn from(v: Option<&'a [u8]>) -> Self {
        Arg::OptBytes(v.map(Cow::Borrowed))
    }
}

/// A statement: its text and the values of its `$n`, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Stmt<'a> {
    /// The text.
    pub sql: Cow<'a, str>,
    /// `$1`, `$2`, …
    pub args: Vec<Arg<'a>>,
}

impl<'a> Stmt<'a> {
    /// `sql`, nothing bound yet.
    pub fn new(sql: impl Into<Cow<'a, str>>) -> Self {
        Self {
            sql: sql.into(),
            args: Vec::new(),
        }
    }

    /// The next `$n` bound to `v`.
    #[must_use]
    pub fn bind(mut self, v: impl Into<Arg<'a>>) -> Self {
        self.args.push(v.into());
        self
    }

    /// The next `$n` bound to an `INTEGER` column's value (see [`Arg::Int`]).
    #[must_use]
    pub fn int(self, v: impl Into<i64>) -> Self {
        self.bind(Arg::Int(v.into()))
    }

    /// The next `$n` bound to a nullable `INTEGER`.
    #[must_use]
    pub fn opt_int(self, v: Option<i64>) -> Self {
        self.bind(Arg::OptInt(v))
    }

    /// The next `$n` bound to a list of ids (see [`Arg::Ids`]).
    #[must_use]
    pub fn ids(self, v: &[i64]) -> Self {
        self.bind(Arg::Ids(v.to_vec()))
    }

    /// The next `$n` bound to a list of texts (see [`Arg::Texts`]).
    #[must_use]
    pub fn texts(self, v: Vec<String>) -> Self {
        self.bind(Arg::Texts(v))
    }
}

/// Where a statement runs: on a pooled connection, or on this connection
/// (a transaction's).
pub enum On<'a, DB: sqlx::Database> {
    /// A connection of the pool, for this statement alone.
    Pool(&'a sqlx::Pool<DB>),
    /// This connection.
    Conn(&'a mut DB::Connection),
}

/// What a backend provides; see the module docs. Implemented by
/// `idem_sqlite::SqliteDialect` and `idem_postgres::PgDialect`.
///
/// # What an implementation must hold
/// - A failure the database may retry is [`StoreError::Busy`] or
///   [`StoreError::Unavailable`]; a `COMMIT` (or an autocommit write) sent
///   whose answer was lost is [`StoreError::OutcomeUnknown`], never
///   `Unavailable` (`map`, `bounded_write`).
/// - Dropping a [`Dialect::Tx`] rolls it back; `read_first` takes no lock
///   and opens no transaction; every call ends within the backend's
///   deadline (`bounded*`).
/// - The executable specification is `idem-conformance`: run every check
///   of it against a real instance, as both backends' `tests/it` do.
pub trait Dialect: Clone + Send + Sync + 'static {
    /// The driver.
    type Db: sqlx::Database<Row = Self::Row>;
    /// The driver's row; its columns decode as [`crate::row`] reads them.
    type Row: Columns + Send + Sync;
    /// The key transaction handed to business code: the connection it
    /// dereferences to runs business statements.
    type Tx: DerefMut<Target = <Self::Db as sqlx::Database>::Connection> + Send + 'static;
    /// What is left of a transaction whose optimistic insert a live record
    /// refused, for [`Dialect::live_record`] to read it in.
    type Left: Send;

    /// What [`Dialect::connect`] takes besides the URL.
    type Config: Send;

    /// Which SQL text the dialect speaks where the two differ.
    const FAMILY: Family;

    /// Connects to `url` (what [`SqlStore::connect`](crate::SqlStore::connect) calls).
    fn connect(
        url: &str,
        config: Self::Config,
    ) -> impl Future<Output = Result<Self, StoreError>> + Send;

    /// The pool, for reads and writes outside a key's transaction.
    fn pool(&self) -> &sqlx::Pool<Self::Db>;

    /// A driver error as a [`StoreError`], by the driver's codes.
    fn map_err(e: sqlx::Error) -> StoreError;

    /// A driver error as this store reports it ([`Dialect::map_err`]
    /// unless the store knows more, e.g. how long it waited).
    fn map(&self, e: sqlx::Error) -> StoreError {
        Self::map_err(e)
    }

    /// A store call under the backend's deadline, if it has one.
    fn bounded<T: Send>(
        &self,
        call: impl Future<Output = Result<T, StoreError>> + Send,
    ) -> impl Future<Output = Result<T, StoreError>> + Send;

    /// A claim under the backend's deadline, which may wait `wait` besides.
    fn bounded_claim<T: Send>(
        &self,
        wait: Duration,
        call: impl Future<Output = Result<T, StoreError>> + Send,
    ) -> impl Future<Output = Result<T, StoreError>> + Send;

    /// One autocommit statement that writes, under the deadline: its
    /// outcome may be unknown when its answer is lost.
    fn bounded_write<T: Send>(
        &self,
        statement: impl Future<Output = Result<T, sqlx::Error>> + Send,
    ) -> impl Future<Output = Result<T, StoreError>> + Send;

    /// The clock the store's records are judged by
    /// ([`KeyStore::clock`](idem_core::KeyStore::clock)); the host's by
    /// default.
    fn clock(&self) -> SharedClock {
        SharedClock::system()
    }

    /// The key engine's read first: the committed record of `scope`, one
    /// indexed read outside any transaction.
    fn read_first(
        &self,
        scope: &Scope,
    ) -> impl Future<Output = Result<Option<StoredRecord>, StoreError>> + Send;

    /// The claim, after the read first found no record that answers it:
    /// `BEGIN` and (pessimistic) the claim's insert, or the live record
    /// that refused it.
    fn claim_here(
        &self,
        scope: &Scope,
        r: ClaimRequest<'_>,
    ) -> impl Future<Output = Result<Claim<Self::Tx>, StoreError>> + Send;

    /// A transaction for business writes, claiming no key.
    fn begin_here(&self) -> impl Future<Output = Result<Self::Tx, StoreError>> + Send;

    /// The claimed record's update, guarded, and `COMMIT`; the transaction
    /// ended either way.
    fn complete_message(
        &self,
        tx: Self::Tx,
        scope: &Scope,
        completion: &Completion,
        now_ms: i64,
    ) -> impl Future<Output = Result<(), Refused<()>>> + Send;

    /// The optimistic claim's record inserted, guarded, and `COMMIT`; a live
    /// record refuses it ([`Refused::Guard`]) with what is left for
    /// [`Dialect::live_record`].
    fn insert_completed_message(
        &self,
        tx: Self::Tx,
        scope: &Scope,
        r: ClaimRequest<'_>,
        completion: &Completion,
    ) -> impl Future<Output = Result<(), Refused<Self::Left>>> + Send;

    /// The live record that refused an optimistic insert.
    fn live_record(
        &self,
        left: Self::Left,
        scope: &Scope,
    ) -> impl Future<Output = Result<StoredRecord, StoreError>> + Send;

    /// `COMMIT`.
    fn commit_here(&self, tx: Self::Tx) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// `ROLLBACK`.
    fn rollback_here(&self, tx: Self::Tx) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// [`LeasedKeyStore::claim_leased`](idem_core::leased::LeasedKeyStore::claim_leased)
    /// after its arguments were gathered: the claim's locking differs (one
    /// `BEGIN IMMEDIATE` transaction on SQLite, autocommit statements on
    /// PostgreSQL); written with [`crate::leased::claim_insert`] and
    /// [`crate::leased::claim_over`].
    fn claim_leased_here(
        &self,
        scope: &Scope,
        c: LeaseClaim<'_>,
        now_ms: i64,
    ) -> impl Future<Output = Result<idem_core::leased::LeasedClaim, StoreError>> + Send;

    /// [`RunStore::create_run`](idem_core::steps::RunStore::create_run): a
    /// new run in the claim's transaction (a final run of the id replaced).
    fn create_run_here<'a>(
        tx: &'a mut Self::Tx,
        run: &'a NewRun<'a>,
    ) -> impl Future<Output = Result<Fence, StoreError>> + Send + 'a;

    /// A run's fenced write (its step, ledger mark and key expiry with it)
    /// in the caller's transaction.
    fn record_in<'a>(
        tx: &'a mut Self::Tx,
        w: RunWrite<'a>,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'a;

    /// A run's fenced write outside a transaction.
    fn record_here(&self, w: RunWrite<'_>)
    -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// The takeover of a run whose lease ended, with its steps.
    fn take_over_here(
        &self,
        id: &RunId,
        t: Takeover<'_>,
    ) -> impl Future<Output = Result<Option<RunRecord>, StoreError>> + Send;

    /// The due runs of `operations`, taken over, with their steps.
    fn claim_due_here(
        &self,
        operations: &[Operation],
        t: Takeover<'_>,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<RunRecord>, StoreError>> + Send;

    /// [`WebhookStore::accept`](idem_core::webhooks::WebhookStore::accept):
    /// the receipt ([`crate::webhooks::receipt_insert`]) and its inbox
    /// record, committed together (`at`: now, expiry).
    fn accept_here(
        &self,
        r: &NewReceipt,
        at: (i64, i64),
    ) -> impl Future<Output = Result<Accepted, StoreError>> + Send;

    /// `s` as the driver's query, each [`Arg`] bound as this database
    /// stores it.
    fn query<'q>(s: &'q Stmt<'q>) -> impl sqlx::Execute<'q, Self::Db> + 'q;

    /// The rows a statement changed, as the driver counts them.
    fn rows_affected(done: &<Self::Db as sqlx::Database>::QueryResult) -> u64;

    /// The pool as the driver's executor (its type proves what a generic
    /// bound over every database cannot name).
    fn on_pool<'c>(
        pool: &'c sqlx::Pool<Self::Db>,
    ) -> impl sqlx::Executor<'c, Database = Self::Db> + 'c;

    /// A connection as the driver's executor.
    fn on_conn<'c>(
        conn: &'c mut <Self::Db as sqlx::Database>::Connection,
    ) -> impl sqlx::Executor<'c, Database = Self::Db> + 'c;

    /// Runs `s`; the rows it changed.
    fn execute<'a>(
        on: On<'a, Self::Db>,
        s: Stmt<'a>,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a {
        async move {
            let q = Self::query(&s);
            let done = match on {
                On::Pool(pool) => Self::on_pool(pool).execute(q).await?,
                On::Conn(conn) => Self::on_conn(conn).execute(q).await?,
            };
            Ok(Self::rows_affected(&done))
        }
    }

    /// Runs `s`; its first row, if any.
    fn fetch_optional<'a>(
        on: On<'a, Self::Db>,
        s: Stmt<'a>,
    ) -> impl Future<Output = Result<Option<Self::Row>, sqlx::Error>> + Send + 'a {
        async move {
            let q = Self::query(&s);
            match on {
                On::Pool(pool) => Self::on_pool(pool).fetch_optional(q).await,
                On::Conn(conn) => Self::on_conn(conn).fetch_optional(q).await,
            }
        }
    }

    /// Runs `s`; its rows.
    fn fetch_all<'a>(
        on: On<'a, Self::Db>,
        s: Stmt<'a>,
    ) -> impl Future<Output = Result<Vec<Self::Row>, sqlx::Error>> + Send + 'a {
        async move {
            let q = Self::query(&s);
            match on {
                On::Pool(pool) => Self::on_pool(pool).fetch_all(q).await,
                On::Conn(conn) => Self::on_conn(conn).fetch_all(q).await,
            }
        }
    }

    /// Runs `sql`, which binds nothing and may hold several statements, as
    /// one simple-query message.
    fn execute_raw<'a>(
        on: On<'a, Self::Db>,
        sql: &'a str,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a {
        async move {
            let raw = sqlx::raw_sql(sql);
            let done = match on {
                On::Pool(pool) => Self::on_pool(pool).execute(raw).await?,
                On::Conn(conn) => Self::on_conn(conn).execute(raw).await?,
            };
            Ok(Self::rows_affected(&done))
        }
    }
}

/// Runs `s`; its one row (none is [`sqlx::Error::RowNotFound`]).
pub async fn fetch_one<D: Dialect>(on: On<'_, D::Db>, s: Stmt<'_>) -> Result<D::Row, sqlx::Error> {
    D::fetch_optional(on, s)
        .await?
        .ok_or(sqlx::Error::RowNotFound)
}

/// The rows `s` answers on the pool, each decoded, under the read deadline
/// ([`Dialect::bounded`]): every read outside a transaction goes this way.
pub async fn read_rows<D: Dialect, T: Send>(
    d: &D,
    s: Stmt<'_>,
    decode: impl Fn(&D::Row) -> Result<T, StoreError> + Send,
) -> Result<Vec<T>, StoreError> {
    d.bounded(async {
        let rows = D::fetch_all(On::Pool(d.pool()), s)
            .await
            .map_err(|e| d.map(e))?;
        rows.iter().map(decode).collect()
    })
    .await
}

/// The row `s` answers on the pool, if any, decoded, under the read
/// deadline (as [`read_rows`]).
pub async fn read_row<D: Dialect, T: Send>(
    d: &D,
    s: Stmt<'_>,
    decode: impl Fn(&D::Row) -> Result<T, StoreError> + Send,
) -> Result<Option<T>, StoreError> {
    d.bounded(async {
        let row = D::fetch_optional(On::Pool(d.pool()), s)
            .await
            .map_err(|e| d.map(e))?;
        row.as_ref().map(decode).transpose()
    })
    .await
}

/// Which SQL a dialect speaks where the two differ: each capability module
/// holds a text per family side by side and picks by [`Dialect::FAMILY`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// SQLite's text.
    Sqlite,
    /// PostgreSQL's text.
    Postgres,
}

impl Family {
    /// `sqlite` or `postgres`, as this family speaks.
    pub fn pick<T>(self, sqlite: T, postgres: T) -> T {
        match self {
            Family::Sqlite => sqlite,
            Family::Postgres => postgres,
        }
    }
}
