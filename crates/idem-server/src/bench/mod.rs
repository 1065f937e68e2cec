//! `idem bench`: the key engine's fresh and replay paths against a baseline of
//! the same business insert without idempotency, on SQLite and PostgreSQL, at
//! concurrency 1, 8 and 32 — through the library and in-process HTTP
//! ([`keys`]), and in the same run the limits and peers from outside the
//! process: pgbench with the same statements ([`pgbench`]), the real
//! `idem serve` driven by `wrk` ([`wrk`]) and AWS Powertools with Redis
//! ([`peer`]). Each row has ops/s, p50, p99, the client's CPU and sends per
//! operation ([`sends`]) and a ratio to a bare insert; then come the ratios
//! issue 24 sets targets for ([`report`]). Every case starts with a check
//! that the machine is quiet ([`quiet`]). Then the webhook, steps and
//! messaging tables. The in-process HTTP cases send with [`load`]'s bare
//! client (its module says why it is not `idem-client`).

use std::time::Duration;

pub mod keys;
pub mod load;
pub mod measure;
pub mod messaging;
pub mod peer;
pub mod pgbench;
pub mod procs;
pub mod quiet;
pub mod report;
pub mod sends;
pub mod steps;
pub mod webhooks;
pub mod wrk;

/// Seconds per case of the webhook and steps tables (at most).
const OTHER_SECS: Duration = Duration::from_secs(2);

/// Removes the scratch directory however the run ends.
struct Scratch;

impl Drop for Scratch {
    fn drop(&mut self) {
        procs::remove_scratch();
    }
}

/// Runs every benchmark and prints its tables.
pub async fn run(
    sqlite_url: &str,
    postgres_url: Option<&str>,
    nats_url: Option<&str>,
    secs: u64,
) -> anyhow::Result<()> {
    let duration = Duration::from_secs(secs.max(1));
    let run_id = idem_core::Clock::now_ms(&idem_core::SystemClock) as u64;
    procs::watch_signals();
    let _scratch = Scratch;
    if let Err(why) = sends::perf() {
        report::note(format!("sends/op: not counted because {why}"));
    }
    report::header();
    keys::sqlite(sqlite_url, duration, run_id).await?;
    let serve_db = procs::scratch()?.join("serve.db");
    wrk::run(
        "sqlite",
        &format!("sqlite://{}", serve_db.display()),
        duration,
        run_id,
    )
    .await?;
    if let Some(url) = postgres_url {
        keys::postgres(url, duration, run_id).await?;
        pgbench::run(url, duration, run_id).await?;
        wrk::run("postgres", url, duration, run_id).await?;
        peer::run(url, duration, run_id).await?;
    }
    report::summary();
    let other = duration.min(OTHER_SECS);
    webhooks(sqlite_url, postgres_url, other, run_id).await?;
    steps(sqlite_url, postgres_url, other, run_id).await?;
    if let Some(url) = nats_url {
        messaging(sqlite_url, postgres_url, url, run_id).await?;
    }
    println!();
    println!("{}", quiet::verdict());
    Ok(())
}

async fn webhooks(
    sqlite_url: &str,
    postgres_url: Option<&str>,
    duration: Duration,
    run_id: u64,
) -> anyhow::Result<()> {
    use self::webhooks as w;
    println!();
    w::header();
    let store =
        idem_sqlite::SqliteStore::connect(sqlite_url, idem_sqlite::SqliteConfig::default()).await?;
    store.migrate().await?;
    w::run("sqlite", store, duration, run_id).await?;
    if let Some(url) = postgres_url {
        let config = idem_postgres::PgConfig {
            max_connections: 40,
            ..Default::default()
        };
        let store = idem_postgres::PgStore::connect(url, config).await?;
        store.migrate().await?;
        w::run("postgres", store, duration, run_id).await?;
    }
    Ok(())
}

async fn steps(
    sqlite_url: &str,
    postgres_url: Option<&str>,
    duration: Duration,
    run_id: u64,
) -> anyhow::Result<()> {
    use self::steps as s;
    println!();
    s::header();
    let store =
        idem_sqlite::SqliteStore::connect(sqlite_url, idem_sqlite::SqliteConfig::default()).await?;
    store.migrate().await?;
    s::run("sqlite", store, duration, run_id).await?;
    if let Some(url) = postgres_url {
        let config = idem_postgres::PgConfig {
            max_connections: 40,
            ..Default::default()
        };
        let store = idem_postgres::PgStore::connect(url, config).await?;
        store.migrate().await?;
        s::run("postgres", store, duration, run_id).await?;
        println!();
        s::costs(url, run_id, 200).await?;
    }
    Ok(())
}

/// Messages per messaging case.
const MESSAGES: usize = 5000;

const LEDGER: &str = "CREATE TABLE IF NOT EXISTS bench_ledger (message_id TEXT NOT NULL)";

async fn messaging(
    sqlite_url: &str,
    postgres_url: Option<&str>,
    nats_url: &str,
    run_id: u64,
) -> anyhow::Result<()> {
    use self::messaging::{self as m, PgLedger, SqliteLedger};
    let js = idem_nats::connect(nats_url, "idem-bench", false).await?;
    println!();
    m::header();
    let store =
        idem_sqlite::SqliteStore::connect(sqlite_url, idem_sqlite::SqliteConfig::default()).await?;
    store.migrate().await?;
    sqlx::raw_sql(LEDGER).execute(store.pool()).await?;
    m::run(
        "sqlite",
        store,
        |tx, msg, now| Box::pin(idem_sqlite::outbox::enqueue(tx, msg, now)),
        SqliteLedger,
        &js,
        MESSAGES,
        run_id,
    )
    .await?;
    if let Some(url) = postgres_url {
        let store =
            idem_postgres::PgStore::connect(url, idem_postgres::PgConfig::default()).await?;
        store.migrate().await?;
        sqlx::raw_sql(LEDGER).execute(store.pool()).await?;
        m::run(
            "postgres",
            store,
            |tx, msg, now| Box::pin(idem_postgres::outbox::enqueue(tx, msg, now)),
            PgLedger,
            &js,
            MESSAGES,
            run_id,
        )
        .await?;
    }
    Ok(())
}
