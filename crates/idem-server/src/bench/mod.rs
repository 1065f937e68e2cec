//! `idem bench`: the key engine's fresh and replay paths against a baseline of
//! the same business insert without idempotency, on SQLite and PostgreSQL, at
//! several concurrencies, through the library and through HTTP. Prints ops/s,
//! p50, p99 and the ratio to the baseline measured the same way in the same run.

use std::time::Duration;

pub mod keys;
pub mod measure;
pub mod messaging;
pub mod quiet;
pub mod steps;
pub mod webhooks;

/// Runs every benchmark and prints its tables.
pub async fn run(
    sqlite_url: &str,
    postgres_url: Option<&str>,
    nats_url: Option<&str>,
    secs: u64,
) -> anyhow::Result<()> {
    let duration = Duration::from_secs(secs.max(1));
    let run_id = idem_core::Clock::now_ms(&idem_core::SystemClock) as u64;
    println!("| backend | via | path | concurrency | ops/s | p50 | p99 | ratio to baseline |");
    println!("|---|---|---|---:|---:|---:|---:|---:|");
    keys::run(sqlite_url, postgres_url, duration, run_id).await?;
    webhooks(sqlite_url, postgres_url, duration, run_id).await?;
    steps(sqlite_url, postgres_url, duration, run_id).await?;
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
