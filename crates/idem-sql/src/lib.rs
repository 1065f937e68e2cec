//! `idem-sql`: the SQL both Idem backends run, written once.
//!
//! [`idem-sqlite`](https://docs.rs/idem-sqlite) and
//! [`idem-postgres`](https://docs.rs/idem-postgres) execute the same
//! statements against the same tables; every statement here takes `$n`
//! placeholders, which both drivers accept (sqlx binds SQLite's `$n` by
//! number too). Where the dialects differ (row locks, `SKIP LOCKED`, typed
//! NULLs, `MAX`/`GREATEST`, lists as JSON or arrays), a capability's module
//! holds a `sqlite` and a `postgres` module side by side. A backend keeps
//! only what truly differs: its claims and locking, connection setup,
//! deadlines and error mapping. `idem-core` holds no SQL text.
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
//! What is here:
//! - the statements of each capability: [`keys`], [`leased`], [`outbox`],
//!   [`inbox`], [`webhooks`], [`runs`], [`admin`]; the column lists
//!   ([`columns`]) and the batched purge of every table that expires rows
//!   ([`purge`]);
//! - the schema and one migration runner ([`migrate`]);
//! - the decoders ([`decode`]), generic over any [`sqlx::Row`] through
//!   [`row`] (an `INTEGER` is 64-bit on SQLite, 32-bit on PostgreSQL:
//!   [`row::Int`] reads either);
//! - the idempotent write patterns ([`patterns`]): SQL builders with typed
//!   outcomes, run through each backend's [`patterns::PatternExec`];
//! - one macro per capability that implements its `idem-core` trait for a
//!   backend's store, expanded in the backend with its driver's types
//!   ([`key_store!`], [`leased_store!`], [`outbox_store!`],
//!   [`inbox_store!`], [`webhook_store!`], [`run_store!`],
//!   [`admin_store!`], [`pattern_exec!`], [`migrate_fn!`], with the
//!   [`binders!`] of the scope and the outcome), and the store's glue
//!   ([`store`]: what the macros call on a store, and the pieces every
//!   store has);
//! - the connections both backends keep beside sqlx's pool for the key
//!   engine's hot path, without its ping ([`kept`]).
//!
//! Generics over `sqlx::Database` need a bound for every type bound and
//! every executor; the macros write the same code once instead and let each
//! backend instantiate it, as the demo's `demo_sql!` does.

pub mod admin;
pub mod columns;
pub mod decode;
pub mod inbox;
pub mod kept;
pub mod keys;
pub mod leased;
pub mod migrate;
pub mod outbox;
pub mod patterns;
pub mod purge;
pub mod row;
pub mod runs;
pub mod store;
pub mod tasks;
pub mod webhooks;
