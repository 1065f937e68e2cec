//! # Idem on PostgreSQL
//!
//! [`PgStore`] implements [`idem_core::KeyStore`] on PostgreSQL. The key record
//! is written in the caller's transaction, so it commits if and only if the
//! business writes commit.
//!
//! ## What is here
//! The store code is written once, for both backends, in [`idem_sql`]:
//! [`PgStore`] is [`idem_sql::SqlStore`] on [`PgDialect`], which implements
//! [`idem_sql::Dialect`] (see `dialect`): PostgreSQL's binding of a statement (an
//! `INTEGER` bound as 32 bits, a list as an array), the client-side
//! deadlines, its error mapping by SQLSTATE, the database server's clock
//! ([`clock`]), and what only PostgreSQL has — the key messages with their
//! values written in as literals (`inline`) and Idem's statements prepared
//! on each writer (`keys`, `conns`), the writes that are one autocommit
//! statement each (a leased claim, a run's fenced write and takeover, a
//! webhook's acceptance: `leased`, `runs`, `webhooks`), and the outbox's
//! `LISTEN`/`NOTIFY` wake-up ([`outbox`]).
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
//!   fails with [`StoreError::Busy`](idem_core::StoreError::Busy), which the engine turns into "in flight".
//! - `fsync = on` and `synchronous_commit = on` (the defaults): a commit is
//!   durable when `COMMIT` returns.
//!
//! ## Round trips
//! A fresh key costs four messages to the server and a replay one (the
//! suite pins the counts on the wire): the read-first `SELECT` on a reader
//! connection; `BEGIN` and the claim's `INSERT` in one simple-query message
//! on a writer; the business statements; the record's `UPDATE` and
//! `COMMIT` in one message (optimistic claims: `BEGIN` alone, then the
//! completed record's `INSERT` with `COMMIT`). Idem's values are written
//! into those two messages as literals, encoded, never pasted (see
//! `inline`); the `UPDATE`/`INSERT` is guarded so that a record it cannot
//! write fails the message before its `COMMIT`. Readers and writers go back
//! without the ping sqlx's pool sends on every release. Business code gets
//! the writer's connection ([`PgTx`]); a `begin()` on it opens a savepoint,
//! as inside a sqlx `Transaction`.
//!
//! ## Timeouts
//! - Every store call is bounded on the client side by
//!   [`PgConfig::statement_timeout`] plus one second (a claim by its policy's
//!   wait if that is longer): a database that stops answering — a partition,
//!   a proxy that stops forwarding — gives [`StoreError::Unavailable`](idem_core::StoreError::Unavailable) within
//!   that time instead of a hang. sqlx does not expose TCP keepalive; this
//!   deadline is what bounds a silent connection.
//! - The same `statement_timeout` is set on every connection (a startup
//!   parameter), and `idle_in_transaction_session_timeout`
//!   ([`PgConfig::idle_in_transaction_timeout`]) makes the server end a
//!   session whose client went silent inside a transaction, releasing its
//!   row locks (the key it claimed) for the retry.
//! - A `COMMIT` whose answer does not arrive — the connection broke after it
//!   was sent, or the deadline passed — is [`StoreError::OutcomeUnknown`](idem_core::StoreError::OutcomeUnknown):
//!   it may have committed. The key record travels in the same message as
//!   its `COMMIT`, so a connection that breaks while that message goes out
//!   is `OutcomeUnknown` too. Any failure before it rolls back and is
//!   `Unavailable`.
//!
//! ## Clock
//! Processes on several hosts share the database and its leases, so every
//! lease, takeover and expiry is judged by the database server's clock, not
//! by each host's: [`PgStore::connect`] samples the server's
//! `clock_timestamp()`, and [`KeyStore::clock`](idem_core::KeyStore::clock) hands out a [`PgClock`]
//! that runs on from the sample with the process's monotonic clock (error:
//! half the sample's round trip plus the drift since, resampled every 30 s;
//! see [`clock`]). `Engine::new`, `IdempotencyLayer::new`, `Runs::builder`,
//! the inbox, the outbox's write side and the collector take it by default;
//! pass `store.clock()` to what takes a clock explicitly (the relay's
//! `Dispatcher::with_clock`, the webhook `Processor` and `Receiver`, the
//! gateway's `with_clock`). With it, a host whose wall clock is off takes
//! over no live lease; NTP is not needed on the application hosts.

pub mod clock;
mod config;
mod conns;
mod dialect;
mod errors;
mod inline;
mod keys;
mod leased;
mod migrate;
pub mod outbox;
pub mod patterns;
mod pool;
mod runs;
mod tx;
mod webhooks;

pub use clock::PgClock;
pub use config::PgConfig;
pub use errors::map_err;
pub use migrate::{MIGRATIONS, migrate_component};
pub use pool::PgDialect;
pub use tx::PgTx;

/// The PostgreSQL store: [`idem_sql::SqlStore`] on [`PgDialect`], which implements
/// every store trait of `idem-core` once for both backends. Cheap to clone;
/// clones share the pool. What only this backend has is on its dialect:
/// `store.dialect()`.
pub type PgStore = idem_sql::SqlStore<PgDialect>;
