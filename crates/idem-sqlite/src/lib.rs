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
//!   beyond it the store answers [`StoreError::Unavailable`](idem_core::StoreError::Unavailable) (retryable).
//! - Inside one process, requests with the same key queue on an in-process gate
//!   for at most the policy's wait, and then get "in flight". Several processes
//!   on one file stay correct (the write lock serialises them) but a waiter
//!   then only sees `Busy`. One process per file is the supported layout.
//! - Leases, takeovers and expiries are judged by the host's clock (the
//!   default [`KeyStore::clock`](idem_core::KeyStore::clock), a
//!   `SystemClock`): every process sharing the file runs on one host and
//!   reads one kernel clock. A file shared by several hosts is not
//!   supported.

mod admin;
mod config;
mod errors;
mod gate;
mod inbox;
mod keys;
mod leased;
mod migrate;
pub mod outbox;
pub mod patterns;
mod pool;
mod runs;
mod tasks;
mod tx;
mod webhooks;

pub use config::SqliteConfig;
pub use errors::map_err;
pub use migrate::{MIGRATIONS, migrate_component};
pub use pool::{SqliteStore, file_path};
pub use tx::SqliteTx;
