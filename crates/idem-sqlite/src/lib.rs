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
//! ## What is here
//! The store code is written once, for both backends, in [`idem_sql`]:
//! [`SqliteStore`] is [`idem_sql::SqlStore`] on [`SqliteDialect`], which
//! implements [`idem_sql::Dialect`] (see `dialect`): SQLite's binding of a
//! statement (an `INTEGER` bound as 64 bits, a list as a JSON array), no
//! client-side deadline (a local file cannot hang up), its error mapping,
//! and what only SQLite has — the key transactions' single writer and its
//! per-key gates (`keys`, `writer`, `gate`), the readers of the read first
//! (`readers`), and the writes that take the write lock with `BEGIN
//! IMMEDIATE` (a leased claim, a run's fenced write, takeover and due
//! claim, a webhook's acceptance: `leased`, `runs`, `webhooks`). The
//! operator's actions and the task writes run in the caller's
//! `BEGIN IMMEDIATE` transaction, so nothing changes between their read and
//! their write.
//!
//! ## What the guarantees assume
//! - `journal_mode = WAL` and `synchronous = FULL`: a commit is on disk when
//!   `COMMIT` returns, so it survives `kill -9` and power loss. (`NORMAL` in WAL
//!   mode can lose the last commits on power loss; this store never sets it.)
//! - Claims use `BEGIN IMMEDIATE`: the write lock is taken at `BEGIN`, so two
//!   claims never interleave and there is no read-then-upgrade deadlock.
//! - `busy_timeout` bounds how long a transaction waits for the write lock,
//!   and how long a key transaction queues for the writer in process (below);
//!   beyond either the store answers [`StoreError::Unavailable`](idem_core::StoreError::Unavailable) (retryable).
//! - Inside one process, requests with the same key queue on an in-process gate
//!   for at most the policy's wait, and then get "in flight". Several processes
//!   on one file stay correct (the write lock serialises them) but a waiter
//!   then only sees `Busy`. One process per file is the supported layout.
//! - Leases, takeovers and expiries are judged by the host's clock (the
//!   default [`KeyStore::clock`](idem_core::KeyStore::clock), a
//!   `SystemClock`): every process sharing the file runs on one host and
//!   reads one kernel clock. A file shared by several hosts is not
//!   supported.
//!
//! ## Connections
//! Besides the sqlx pool (which serves everything else: relays, leased keys,
//! runs, the admin API, your own queries through [`SqliteStore::pool`]):
//! - **the writer**, one connection that every key transaction runs on, one
//!   after another — the claims and [`KeyStore::begin`](idem_core::KeyStore::begin). SQLite lets one
//!   transaction write at a time anyway; queued in process (FIFO) they hand
//!   the connection over as soon as one ends, where transactions on pooled
//!   connections would poll the write lock in SQLite's busy handler, which
//!   sleeps 1, 2, 5, 10 … ms between tries. `BEGIN IMMEDIATE` goes with the
//!   claim in one message, and the record with its guard and `COMMIT` in
//!   another (see `keys`). Business code runs on it through [`SqliteTx`]:
//!   `begin()` there opens a savepoint, as inside a sqlx `Transaction`. It
//!   is taken from the pool once (the pool's `after_connect` runs on it) and
//!   detached, so the pool may open another in its place;
//! - **the readers**, up to `max_connections` connections for the claims'
//!   read first (a replay is that read alone), opened with the pool's
//!   connect options. sqlx's pool pings each connection it gets back, one
//!   more round trip per read; these go back without one.
//!
//! A fresh key thus costs four messages to SQLite (each a round trip to a
//! connection's worker thread), a replay one; the `statements` test pins
//! them. The messages bind their values across their statements, which
//! sqlx's SQLite driver runs in turn (a behaviour sqlx marks as deprecated
//! for `query()`; the test would catch its removal).

mod config;
mod dialect;
mod errors;
mod gate;
mod keys;
mod leased;
mod migrate;
pub mod outbox;
pub mod patterns;
mod pool;
mod readers;
mod runs;
mod tx;
mod webhooks;
mod writer;

pub use config::SqliteConfig;
pub use errors::map_err;
pub use migrate::{MIGRATIONS, migrate_component};
pub use pool::{SqliteDialect, file_path};
pub use tx::SqliteTx;

/// The SQLite store: [`idem_sql::SqlStore`] on [`SqliteDialect`], which implements
/// every store trait of `idem-core` once for both backends. Cheap to clone;
/// clones share the pool. What only this backend has is on its dialect:
/// `store.dialect()`.
pub type SqliteStore = idem_sql::SqlStore<SqliteDialect>;
