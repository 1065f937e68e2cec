//! The library half of the `idem` binary: the demo payments API, so tests and
//! benchmarks can run it in-process.
#![allow(missing_docs)]
// Demo handlers return early with a ready `Response` as their error; it is built
// once per rejected request, so its size does not matter.
#![allow(clippy::result_large_err)]

pub mod bench;
pub mod bench_messaging;
pub mod bench_webhooks;
pub mod demo;
pub mod messaging;
pub mod webhooks;

demo_app!(
    sqlite_demo,
    idem_sqlite::SqliteStore,
    idem_sqlite::SqliteTx,
    sqlx::SqlitePool,
    idem_sqlite::map_err,
    idem_sqlite::outbox::enqueue
);
demo_app!(
    postgres_demo,
    idem_postgres::PgStore,
    idem_postgres::PgTx,
    sqlx::PgPool,
    idem_postgres::map_err,
    idem_postgres::outbox::enqueue
);
