//! `idem-sql`: the SQL store both Idem backends run, written once.
//!
//! [`SqlStore<D>`](SqlStore) implements every store trait of `idem-core`
//! ([`KeyStore`](idem_core::KeyStore), leased keys, outbox, inbox, webhook
//! receipts, runs, tasks, the operator's [`AdminStore`](idem_core::admin::AdminStore))
//! once, as ordinary generic Rust over a [`Dialect`]. A backend is a type
//! that implements [`Dialect`]: `idem_sqlite::SqliteDialect` and
//! `idem_postgres::PgDialect`, exported as `SqliteStore = SqlStore<SqliteDialect>`
//! and `PgStore = SqlStore<PgDialect>`. `idem-core` holds no SQL text.
//!
//! ```
//! use idem_sql::{columns::RUN_COLUMNS, keys::SELECT_RECORD};
//!
//! let load = format!("SELECT {RUN_COLUMNS} FROM idem_runs WHERE id = $1");
//! assert!(load.starts_with("SELECT id, tenant_id"));
//! assert!(SELECT_RECORD.contains("idempotency_key = $3"));
//! assert!(idem_sql::purge::postgres::KEYS.contains("FOR UPDATE SKIP LOCKED"));
//! ```
//!
//! # What a backend provides ([`Dialect`])
//! - its driver (`type Db: sqlx::Database`), row (`type Row`), pool, key
//!   transaction (`type Tx`, which derefs to the driver's connection),
//!   connect options (`type Config`, [`Dialect::connect`]);
//! - error mapping ([`Dialect::map_err`], [`Dialect::map`]) and deadlines
//!   ([`Dialect::bounded`], [`Dialect::bounded_claim`],
//!   [`Dialect::bounded_write`]), and the records' clock;
//! - the key engine's hot path, which each backend sends its own way:
//!   [`Dialect::read_first`], [`Dialect::claim_here`],
//!   [`Dialect::begin_here`], [`Dialect::complete_message`],
//!   [`Dialect::insert_completed_message`], [`Dialect::live_record`],
//!   [`Dialect::commit_here`], [`Dialect::rollback_here`];
//! - the writes whose locking differs (a leased claim, a run's creation,
//!   fenced write, takeover and due claim, a webhook's acceptance);
//! - its SQL family ([`Dialect::FAMILY`], a [`dialect::Family`]): where
//!   the dialects' text differs, each capability module holds both texts
//!   side by side and picks by it, so the dialect names no capability
//!   module and none imports another back;
//! - its driver's binding ([`Dialect::query`]: a [`dialect::Stmt`], text
//!   and typed [`dialect::Arg`]s, as the driver's query), its count of
//!   changed rows, and its pool and connection as executors
//!   ([`Dialect::on_pool`], [`Dialect::on_conn`]): on these, this crate
//!   runs a statement [`dialect::On`] either, once for both backends
//!   ([`Dialect::execute`], [`Dialect::fetch_optional`],
//!   [`Dialect::fetch_all`], [`Dialect::execute_raw`]).
//!
//! # Why statements are values, not sqlx queries
//! Code generic over `sqlx::Database` needs a where-clause for every type
//! it binds or decodes and for every executor (`for<'c> &'c mut
//! DB::Connection: Executor<'c, Database = DB>`, `i64: Encode<'q, DB> +
//! Type<DB>`, …), and such where-clauses are not implied where the code is
//! used: each caller repeats them. Here a statement is a value, bound by the
//! backend in one small function against its concrete driver, and a row is
//! `D::Row`, whose bound ([`row::Columns`]) is an associated-type bound and
//! so implied wherever `D: Dialect` is. Generic code needs the one bound
//! `D: Dialect`. The same text and the same values reach the server as
//! before (the round-trip pins of both backends say so).
//!
//! # A claim, call by call
//! `KeyStore::claim` on `SqlStore<D>` ([`keys`]): under
//! `D::bounded_claim`, `D::read_first` (a replay ends here) → `D::claim_here`
//! (SQLite: the key's gate, the writer, `BEGIN IMMEDIATE` + the insert in one
//! message; PostgreSQL: `BEGIN` + `EXECUTE idem_claim(…)` inline on a writer)
//! → business code on `D::Tx` → `KeyStore::complete` (the same impl) →
//! `D::complete_message` (the guarded update and `COMMIT`, one message).
//!
//! What a dialect's own methods take (a claim's request, a leased claim, a
//! run's write and takeover, why a `COMMIT` was refused) is in [`calls`].
//!
//! # What else is here
//! - the statements of each capability: [`keys`], [`leased`], [`outbox`],
//!   [`inbox`], [`webhooks`], [`runs`], [`tasks`], [`admin`]; the column
//!   lists ([`columns`]) and the batched purge ([`purge`]);
//! - the schema and one migration runner ([`migrate`]);
//! - the decoders ([`decode`]), generic over any [`sqlx::Row`] through
//!   [`row`] (an `INTEGER` is 64-bit on SQLite, 32-bit on PostgreSQL:
//!   [`row::Int`] reads either);
//! - the idempotent write patterns ([`patterns`]): SQL builders with typed
//!   outcomes, run through [`patterns::PatternExec`];
//! - the connections both backends keep beside sqlx's pool for the key
//!   engine's hot path, without its ping ([`kept`]).

pub mod admin;
pub mod calls;
pub mod columns;
pub mod decode;
pub mod dialect;
pub mod inbox;
pub mod kept;
pub mod keys;
pub mod leased;
pub mod migrate;
pub mod outbox;
pub mod patterns;
pub mod position;
pub mod purge;
pub mod row;
pub mod runs;
pub mod store;
pub mod tasks;
pub mod webhooks;

pub use dialect::Dialect;
pub use store::SqlStore;
