//! `idem`: the Idem server.
//!
//! - `idem serve` — the demo payments API on the Idem HTTP layer, with
//!   periodic GC of expired key records.
//! - `idem migrate` — apply migrations and exit.
//! - `idem gc` — delete expired key records once, in bounded batches.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, bail};
use axum::Router;
use axum::routing::get;
use clap::{Parser, Subcommand};
use idem_core::{Engine, KeyStore};
use idem_postgres::{PgConfig, PgStore};
use idem_sqlite::{SqliteConfig, SqliteStore};

use idem_core::Policy;
use idem_server::demo::{self, DemoConfig};
use idem_server::{postgres_demo, sqlite_demo};

#[derive(Parser)]
#[command(name = "idem", version, about = "Make duplicate delivery harmless")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args)]
struct DbArgs {
    /// `sqlite://PATH` (the file is created if missing) or `postgres://…`.
    #[arg(long, env = "IDEM_DATABASE_URL", default_value = "sqlite://idem.db")]
    database_url: String,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the demo payments API.
    Serve {
        #[command(flatten)]
        db: DbArgs,
        /// Address to listen on.
        #[arg(long, env = "IDEM_LISTEN", default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
        /// How often expired key records are deleted.
        #[arg(long, env = "IDEM_GC_INTERVAL", default_value = "60s", value_parser = humantime::parse_duration)]
        gc_interval: Duration,
        /// How long key records live: retries after it execute again (the
        /// payment `reference` then still stops a second payment). 1s to 400d.
        #[arg(long, env = "IDEM_KEY_TTL", default_value = "24h", value_parser = humantime::parse_duration)]
        key_ttl: Duration,
        /// Largest request body accepted, in bytes (413 above). At most 64 MiB.
        #[arg(long, env = "IDEM_MAX_BODY_BYTES", default_value_t = 1 << 20)]
        max_body_bytes: usize,
    },
    /// Apply migrations and exit.
    Migrate {
        #[command(flatten)]
        db: DbArgs,
    },
    /// Benchmark the key engine against a plain insert (prints a markdown table).
    Bench {
        /// SQLite file for the SQLite half.
        #[arg(long, default_value = "sqlite://idem-bench.db")]
        sqlite_url: String,
        /// PostgreSQL database for the PostgreSQL half (skipped when absent).
        #[arg(long, env = "IDEM_BENCH_POSTGRES_URL")]
        postgres_url: Option<String>,
        /// Seconds per measured case.
        #[arg(long, default_value_t = 2)]
        secs: u64,
    },
    /// Delete expired key records once and print how many.
    Gc {
        #[command(flatten)]
        db: DbArgs,
    },
}

/// The largest request body `--max-body-bytes` accepts.
const MAX_BODY_BYTES_LIMIT: usize = 64 << 20;

fn demo_config(key_ttl: Duration, max_body_bytes: usize) -> anyhow::Result<DemoConfig> {
    if key_ttl < Duration::from_secs(1) || key_ttl > Policy::MAX_TTL {
        bail!("--key-ttl must be between 1s and 400days, got {key_ttl:?}");
    }
    if max_body_bytes == 0 || max_body_bytes > MAX_BODY_BYTES_LIMIT {
        bail!(
            "--max-body-bytes must be between 1 and {MAX_BODY_BYTES_LIMIT}, got {max_body_bytes}"
        );
    }
    Ok(DemoConfig {
        key_ttl,
        max_body_bytes,
    })
}

/// GC batch size and the most batches per run: bounded work per tick.
const GC_BATCH: u32 = 1000;
const GC_MAX_BATCHES: u32 = 100;

enum Db {
    Sqlite(SqliteStore),
    Postgres(PgStore),
}

async fn open(url: &str) -> anyhow::Result<Db> {
    let db = if url.starts_with("sqlite:") {
        let store = SqliteStore::connect(url, SqliteConfig::default())
            .await
            .with_context(|| format!("failed to open SQLite database {url}"))?;
        store
            .migrate()
            .await
            .context("failed to migrate the key store")?;
        idem_sqlite::migrate_component(store.pool(), "demo", demo::MIGRATIONS)
            .await
            .context("failed to migrate the demo tables")?;
        Db::Sqlite(store)
    } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        let store = PgStore::connect(url, PgConfig::default())
            .await
            .context("failed to connect to PostgreSQL")?;
        store
            .migrate()
            .await
            .context("failed to migrate the key store")?;
        idem_postgres::migrate_component(store.pool(), "demo", demo::MIGRATIONS)
            .await
            .context("failed to migrate the demo tables")?;
        Db::Postgres(store)
    } else {
        bail!("unsupported database URL: expected sqlite://… or postgres://…");
    };
    Ok(db)
}

async fn gc_once<S: KeyStore>(store: &S) -> anyhow::Result<u64> {
    Engine::new(store.clone())
        .purge_expired(GC_BATCH, GC_MAX_BATCHES)
        .await
        .context("failed to delete expired key records")
}

fn spawn_gc<S: KeyStore>(store: S, every: Duration) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every.max(Duration::from_secs(1)));
        loop {
            tick.tick().await;
            match gc_once(&store).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(deleted = n, "expired key records deleted"),
                Err(e) => tracing::warn!(error = %format!("{e:#}"), "gc failed; will retry"),
            }
        }
    });
}

async fn shutdown() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            s.recv().await;
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Serve {
            db,
            listen,
            gc_interval,
            key_ttl,
            max_body_bytes,
        } => {
            let config = demo_config(key_ttl, max_body_bytes)?;
            let api = match open(&db.database_url).await? {
                Db::Sqlite(store) => {
                    spawn_gc(store.clone(), gc_interval);
                    sqlite_demo::router(store.clone(), store.pool().clone(), &config)
                }
                Db::Postgres(store) => {
                    spawn_gc(store.clone(), gc_interval);
                    postgres_demo::router(store.clone(), store.pool().clone(), &config)
                }
            };
            let app = Router::new()
                .route("/healthz", get(|| async { "ok" }))
                .merge(api)
                .layer(tower_http::catch_panic::CatchPanicLayer::new());
            let listener = tokio::net::TcpListener::bind(listen)
                .await
                .with_context(|| format!("failed to listen on {listen}"))?;
            let bound = listener
                .local_addr()
                .context("failed to read the bound address")?;
            tracing::info!(listen = %bound, "idem serving the demo payments API");
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown())
                .await
                .context("server failed")?;
        }
        Command::Bench {
            sqlite_url,
            postgres_url,
            secs,
        } => {
            idem_server::bench::run(&sqlite_url, postgres_url.as_deref(), secs).await?;
        }
        Command::Migrate { db } => {
            open(&db.database_url).await?;
            println!("migrations applied");
        }
        Command::Gc { db } => {
            let n = match open(&db.database_url).await? {
                Db::Sqlite(s) => gc_once(&s).await?,
                Db::Postgres(s) => gc_once(&s).await?,
            };
            println!("deleted {n} expired key records");
        }
    }
    Ok(())
}
