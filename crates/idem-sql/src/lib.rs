//! `idem-sql`: the SQL text both Idem backends run, written once.
//!
//! [`idem-sqlite`](https://docs.rs/idem-sqlite) and
//! [`idem-postgres`](https://docs.rs/idem-postgres) execute the same
//! statements against the same tables; every statement here takes `$n`
//! placeholders, which both drivers accept (sqlx binds SQLite's `$n` by
//! number too). A backend keeps only what truly differs: row locks, claim
//! SQL, connection setup and error mapping. `idem-core` holds no SQL text.
//!
//! ```
//! use idem_sql::{columns::RUN_COLUMNS, keys::SELECT_RECORD};
//!
//! let load = format!("SELECT {RUN_COLUMNS} FROM idem_runs WHERE id = $1");
//! assert!(load.starts_with("SELECT id, tenant_id"));
//! assert!(SELECT_RECORD.contains("idempotency_key = $3"));
//! ```
//!
//! Entry points: [`columns`] (the column lists each `*Columns` decoder of
//! `idem-core` reads, in order), [`keys`] (the key record's read and the
//! operator's release) and [`leased`] (the statements of `LeasedKeyStore`).

pub mod admin;
pub mod columns;
pub mod decode;
pub mod inbox;
pub mod keys;
pub mod leased;
pub mod migrate;
pub mod outbox;
pub mod patterns;
pub mod purge;
pub mod row;
pub mod runs;
pub mod store;
pub mod webhooks;
