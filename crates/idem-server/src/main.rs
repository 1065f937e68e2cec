//! `idem`: the Idem server.
//!
//! - `idem serve` — the demo payments API on the Idem HTTP layer, with
//!   periodic GC of expired key records; with `--nats-url`, payment events go
//!   through the outbox to NATS (and with `--consume`, into the ledger).
//! - `idem relay` — the outbox relay alone; `idem consume` — the ledger
//!   consumer alone.
//! - `idem migrate`, `idem gc`, `idem stats`, `idem bench`.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{Context, bail};
use axum::Router;
use axum::extract::State;
use axum::response::Response;
use axum::routing::get;
use clap::{Parser, Subcommand};
use idem_core::outbox::OutboxStore;
use idem_core::{Engine, KeyStore, Policy};
use idem_nats::NatsPublisher;
use idem_outbox::{Dispatcher, Polling};
use idem_postgres::{PgConfig, PgStore};
use idem_server::admin::AdminToken;
use idem_server::demo::{self, DemoConfig};
use idem_server::http_server;
use idem_server::messaging::{self, ConsumeConfig};
use idem_server::{postgres_demo, sqlite_demo};
use idem_sqlite::{SqliteConfig, SqliteStore};
use serde_json::json;
use tokio::sync::watch;

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

#[derive(clap::Args)]
struct ConsumeArgs {
    /// Redelivery of an unacknowledged event after this long.
    #[arg(long, env = "IDEM_ACK_WAIT", default_value = "30s", value_parser = humantime::parse_duration)]
    ack_wait: Duration,
    /// Deliveries before an event that keeps failing is dead-lettered (1 to 100).
    #[arg(long, env = "IDEM_MAX_DELIVER", default_value_t = 5)]
    max_deliver: u32,
}

/// The HTTP server's limits and the admin token.
#[derive(clap::Args)]
struct HttpArgs {
    /// Bearer token for `/admin/…` (16 to 1024 visible ASCII characters).
    /// Without it the admin routes answer 401; it is required when
    /// --listen is not a loopback address.
    #[arg(long, env = "IDEM_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// How long a request head may take from its first byte (1s to 60s).
    #[arg(long, env = "IDEM_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    header_read_timeout: Duration,
    /// How long an idle keep-alive connection stays open (1s to 1h).
    #[arg(long, env = "IDEM_IDLE_TIMEOUT", default_value = "60s", value_parser = humantime::parse_duration)]
    idle_timeout: Duration,
    /// How long a request body may take after its head (1s to 1h); 408 after.
    #[arg(long, env = "IDEM_BODY_READ_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    body_read_timeout: Duration,
    /// Connections served at once (1 to 100000); 503 beyond.
    #[arg(long, env = "IDEM_MAX_CONNECTIONS", default_value_t = 1024)]
    max_connections: usize,
    /// Request body bytes buffered at once over all requests; 503 beyond.
    /// At least --max-body-bytes, at most 16 GiB.
    #[arg(long, env = "IDEM_MAX_BUFFERED_BYTES", default_value_t = 64 << 20)]
    max_buffered_bytes: usize,
    /// How long a handler may run before it is rolled back with 503
    /// handler-timeout (1s to 10min).
    #[arg(long, env = "IDEM_HANDLER_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    handler_timeout: Duration,
}

impl HttpArgs {
    fn limits(&self, max_body_bytes: usize) -> anyhow::Result<http_server::Limits> {
        let limits = http_server::Limits {
            header_read_timeout: self.header_read_timeout,
            idle_timeout: self.idle_timeout,
            body_read_timeout: self.body_read_timeout,
            max_connections: self.max_connections,
            max_buffered_bytes: self.max_buffered_bytes,
        };
        limits
            .validate(max_body_bytes)
            .map_err(anyhow::Error::msg)?;
        Ok(limits)
    }

    /// The admin token, required off loopback.
    fn admin_token(&self, listen: SocketAddr) -> anyhow::Result<Option<AdminToken>> {
        match &self.admin_token {
            Some(t) => Ok(Some(AdminToken::new(t).map_err(anyhow::Error::msg)?)),
            None if !listen.ip().is_loopback() => bail!(
                "--listen {listen} is not a loopback address: set --admin-token (or \
                 IDEM_ADMIN_TOKEN) so the admin routes are not open to the network"
            ),
            None => Ok(None),
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Serve the demo payments API.
    Serve {
        #[command(flatten)]
        db: DbArgs,
        /// Address to listen on: IP:PORT, or HOST:PORT (resolved once, the
        /// first address is used: `localhost:8080`).
        #[arg(long, env = "IDEM_LISTEN", default_value = "127.0.0.1:8080", value_parser = listen_address)]
        listen: SocketAddr,
        #[command(flatten)]
        http: HttpArgs,
        /// How often expired key records are deleted (1s to 24h).
        #[arg(long, env = "IDEM_GC_INTERVAL", default_value = "60s", value_parser = humantime::parse_duration)]
        gc_interval: Duration,
        /// How long key records live: retries after it execute again (the
        /// payment `reference` then still stops a second payment). 1s to 400d.
        #[arg(long, env = "IDEM_KEY_TTL", default_value = "24h", value_parser = humantime::parse_duration)]
        key_ttl: Duration,
        /// Largest request body accepted, in bytes (413 above). At most 64 MiB.
        #[arg(long, env = "IDEM_MAX_BODY_BYTES", default_value_t = 1 << 20)]
        max_body_bytes: usize,
        /// NATS server: payment events are written to the outbox and relayed
        /// to JetStream by this process.
        #[arg(long, env = "IDEM_NATS_URL")]
        nats_url: Option<String>,
        /// Write payment events to the outbox without relaying them here (run
        /// `idem relay` next to it).
        #[arg(long)]
        events: bool,
        /// Also run the ledger consumer in this process (needs --nats-url).
        #[arg(long)]
        consume: bool,
        #[command(flatten)]
        consumer: ConsumeArgs,
        /// A TOML file declaring webhook endpoints (`[webhooks.<name>]`).
        #[arg(long, env = "IDEM_CONFIG")]
        config: Option<std::path::PathBuf>,
    },
    /// Inspect and replay stored webhook deliveries.
    Webhooks {
        #[command(subcommand)]
        action: WebhookAction,
    },
    /// Relay the outbox to NATS JetStream (one per SQLite file; any number on PostgreSQL).
    Relay {
        #[command(flatten)]
        db: DbArgs,
        /// NATS server.
        #[arg(long, env = "IDEM_NATS_URL")]
        nats_url: String,
        /// How long claimed messages are hidden from other relays; a relay
        /// that dies holding some publishes them again after it (1s to 1h,
        /// shorter than the stream's 5 min duplicate window).
        #[arg(long, env = "IDEM_RELAY_LEASE", default_value = "30s", value_parser = humantime::parse_duration)]
        lease: Duration,
    },
    /// Apply payment events to the ledger through the inbox.
    Consume {
        #[command(flatten)]
        db: DbArgs,
        /// NATS server.
        #[arg(long, env = "IDEM_NATS_URL")]
        nats_url: String,
        #[command(flatten)]
        consumer: ConsumeArgs,
    },
    /// Apply migrations and exit.
    Migrate {
        #[command(flatten)]
        db: DbArgs,
    },
    /// Benchmark against plain baselines (prints markdown tables).
    Bench {
        /// SQLite file for the SQLite half.
        #[arg(long, default_value = "sqlite://idem-bench.db")]
        sqlite_url: String,
        /// PostgreSQL database for the PostgreSQL half (skipped when absent).
        #[arg(long, env = "IDEM_BENCH_POSTGRES_URL")]
        postgres_url: Option<String>,
        /// NATS server for the relay and consume benchmarks (skipped when absent).
        #[arg(long, env = "IDEM_BENCH_NATS_URL")]
        nats_url: Option<String>,
        /// Seconds per measured case.
        #[arg(long, default_value_t = 2)]
        secs: u64,
    },
    /// Delete expired key records once and print how many.
    Gc {
        #[command(flatten)]
        db: DbArgs,
    },
    /// Print the outbox lag figures as JSON.
    Stats {
        #[command(flatten)]
        db: DbArgs,
    },
}

#[derive(Subcommand)]
enum WebhookAction {
    /// List deliveries, newest first, as JSON lines.
    List {
        #[command(flatten)]
        db: DbArgs,
        /// Only this endpoint.
        #[arg(long)]
        endpoint: Option<String>,
        /// Only this state: received, processed, failed, dead or stale.
        #[arg(long)]
        state: Option<String>,
        /// At most this many (1 to 1000).
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Show one delivery with its headers and body.
    Show {
        #[command(flatten)]
        db: DbArgs,
        endpoint: String,
        delivery_id: String,
    },
    /// Run a failed or dead delivery again (a processed one is left alone).
    Replay {
        #[command(flatten)]
        db: DbArgs,
        endpoint: String,
        delivery_id: String,
    },
}

/// The largest request body `--max-body-bytes` accepts.
const MAX_BODY_BYTES_LIMIT: usize = 64 << 20;

/// `--listen`: an IP address and port, or a host name and port resolved now.
fn listen_address(value: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(addr) = value.parse() {
        return Ok(addr);
    }
    let mut addrs = value.to_socket_addrs().map_err(|e| {
        format!("{e}: expected IP:PORT or HOST:PORT, e.g. 127.0.0.1:8080 or localhost:8080")
    })?;
    // Loopback first when the name has both (localhost: 127.0.0.1 and ::1).
    let all: Vec<SocketAddr> = addrs.by_ref().collect();
    all.iter()
        .find(|a| a.is_ipv4())
        .or_else(|| all.first())
        .copied()
        .ok_or_else(|| format!("{value} resolves to no address"))
}

/// `value` within `lo..=hi`, or an error naming the flag, with durations
/// written the way they are typed (`0s`, `400days`).
fn within(flag: &str, value: Duration, lo: Duration, hi: Duration) -> anyhow::Result<Duration> {
    if value < lo || value > hi {
        bail!(
            "{flag} must be between {} and {}, got {}",
            idem_server::duration_text(lo),
            idem_server::duration_text(hi),
            idem_server::duration_text(value)
        );
    }
    Ok(value)
}

fn demo_config(
    key_ttl: Duration,
    max_body_bytes: usize,
    events: bool,
    handler_timeout: Duration,
) -> anyhow::Result<DemoConfig> {
    within(
        "--key-ttl",
        key_ttl,
        Duration::from_secs(1),
        Policy::MAX_TTL,
    )?;
    if max_body_bytes == 0 || max_body_bytes > MAX_BODY_BYTES_LIMIT {
        bail!(
            "--max-body-bytes must be between 1 and {MAX_BODY_BYTES_LIMIT}, got {max_body_bytes}"
        );
    }
    within(
        "--handler-timeout",
        handler_timeout,
        Duration::from_secs(1),
        Duration::from_secs(600),
    )?;
    Ok(DemoConfig {
        key_ttl,
        max_body_bytes,
        events,
        handler_timeout,
        ..DemoConfig::default()
    })
}

fn consume_config(args: &ConsumeArgs) -> anyhow::Result<ConsumeConfig> {
    within(
        "--ack-wait",
        args.ack_wait,
        Duration::from_secs(1),
        Duration::from_secs(12 * 3600),
    )?;
    if !(1..=100).contains(&args.max_deliver) {
        bail!(
            "--max-deliver must be between 1 and 100, got {}",
            args.max_deliver
        );
    }
    Ok(ConsumeConfig {
        ack_wait: args.ack_wait,
        max_deliver: args.max_deliver,
    })
}

/// GC batch size and the most batches per run: bounded work per tick.
const GC_BATCH: u32 = 1000;
const GC_MAX_BATCHES: u32 = 100;

enum Db {
    Sqlite(SqliteStore),
    Postgres(PgStore),
}

/// Opens a database that must exist already: an operator command pointed at
/// the wrong file must not report an empty, brand-new one as "all clear".
async fn open_existing(url: &str) -> anyhow::Result<Db> {
    if let Some(path) = idem_sqlite::file_path(url)
        && !path.is_empty()
        && !std::path::Path::new(path).exists()
    {
        bail!(
            "no SQLite database at {path}: pass --database-url (or IDEM_DATABASE_URL), \
                 or create it with idem serve or idem migrate"
        );
    }
    open(url).await
}

/// Opens the database, creating an SQLite file if missing, and migrates it.
async fn open(url: &str) -> anyhow::Result<Db> {
    if let Some(dir) = idem_sqlite::file_path(url)
        .map(std::path::Path::new)
        .and_then(std::path::Path::parent)
        .filter(|d| !d.as_os_str().is_empty() && !d.exists())
    {
        bail!(
            "the directory {} does not exist: create it, or point --database-url elsewhere",
            dir.display()
        );
    }
    let db = if url.starts_with("sqlite:") {
        let store = SqliteStore::connect(url, SqliteConfig::default())
            .await
            .with_context(|| format!("failed to open SQLite database {url}"))?;
        store
            .migrate()
            .await
            .context("failed to migrate the key store")?;
        idem_sqlite::migrate_component(store.pool(), "demo", demo::SQLITE_MIGRATIONS)
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
        idem_postgres::migrate_component(store.pool(), "demo", demo::POSTGRES_MIGRATIONS)
            .await
            .context("failed to migrate the demo tables")?;
        Db::Postgres(store)
    } else {
        bail!("unsupported database URL: expected sqlite://… or postgres://…");
    };
    Ok(db)
}

/// A NATS URL is checked before anything starts.
fn check_nats_url(url: &str) -> anyhow::Result<()> {
    if !(url.starts_with("nats://") || url.starts_with("tls://")) || url.len() > 1024 {
        bail!("--nats-url must be a nats:// or tls:// URL");
    }
    Ok(())
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

/// A watch that turns true on Ctrl-C or SIGTERM.
fn shutdown_signal() -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        let ctrl_c = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        #[cfg(unix)]
        let term = async {
            if let Ok(mut s) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            {
                s.recv().await;
            }
        };
        #[cfg(not(unix))]
        let term = std::future::pending::<()>();
        tokio::select! { _ = ctrl_c => {}, _ = term => {} }
        let _ = tx.send(true);
    });
    rx
}

fn stats_json(s: &idem_outbox::DispatcherStats) -> serde_json::Value {
    json!({
        "pending": s.pending,
        "oldest_pending_age_ms": s.oldest_pending_age.map(|d| d.as_millis() as u64),
        "dead": s.dead,
        "published_total": s.published_total,
        "publish_rate_per_sec": (s.publish_rate_per_sec * 100.0).round() / 100.0,
    })
}

async fn store_stats_json<S: OutboxStore>(store: &S) -> anyhow::Result<serde_json::Value> {
    let s = store.stats().await.context("failed to read the outbox")?;
    let now = idem_core::Clock::now_ms(&idem_core::SystemClock);
    Ok(json!({
        "pending": s.pending,
        "oldest_pending_age_ms": s.oldest_pending_ms.map(|t| now.saturating_sub(t).max(0)),
        "dead": s.dead,
    }))
}

/// The relay of this process, once it has started.
type RelaySlot<S> = Arc<OnceLock<Arc<Dispatcher<S, NatsPublisher>>>>;

/// `GET /admin/outbox`: lag figures (with the relay's rate when it runs here).
fn admin_router<S: OutboxStore>(store: S, relay: RelaySlot<S>) -> Router {
    async fn outbox<S: OutboxStore>(State((store, relay)): State<(S, RelaySlot<S>)>) -> Response {
        let figures = match relay.get() {
            Some(d) => d
                .stats()
                .await
                .map(|s| stats_json(&s))
                .map_err(anyhow::Error::from),
            None => store_stats_json(&store).await,
        };
        match figures {
            Ok(v) => demo::json_response(axum::http::StatusCode::OK, &v, None, None),
            Err(e) => demo::db_error(match e.downcast::<idem_core::StoreError>() {
                Ok(s) => s,
                Err(e) => idem_core::StoreError::Database { source: e.into() },
            }),
        }
    }
    Router::new()
        .route("/admin/outbox", get(outbox::<S>))
        .with_state((store, relay))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    idem_server::logging::init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: failed to start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        // One line, whatever RUST_BACKTRACE says: these are the operator's
        // errors (a bad flag, an unreachable database), not the program's.
        Err(e) => {
            eprintln!("error: {}", idem_core::ErrorChain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve {
            db,
            listen,
            http,
            gc_interval,
            key_ttl,
            max_body_bytes,
            nats_url,
            events,
            consume,
            consumer,
            config: config_file,
        } => {
            if let Some(url) = &nats_url {
                check_nats_url(url)?;
            }
            let hooks = match &config_file {
                Some(path) => Some(idem_server::webhooks::load(path)?),
                None => None,
            };
            if consume && nats_url.is_none() {
                bail!("--consume needs --nats-url");
            }
            let consume_config = consume_config(&consumer)?;
            let config = demo_config(
                key_ttl,
                max_body_bytes,
                events || nats_url.is_some(),
                http.handler_timeout,
            )?;
            within(
                "--gc-interval",
                gc_interval,
                Duration::from_secs(1),
                Duration::from_secs(24 * 3600),
            )?;
            let limits = http.limits(max_body_bytes)?;
            let admin_token = http.admin_token(listen)?;
            let shutdown = shutdown_signal();
            let api = match open(&db.database_url).await? {
                Db::Sqlite(store) => {
                    spawn_gc(store.clone(), gc_interval);
                    let d = start_messaging(
                        &store,
                        nats_url.as_deref(),
                        consume.then(|| (sqlite_demo::Ledger, consume_config.clone())),
                        || async { Polling },
                        Duration::from_millis(200),
                        &shutdown,
                    );
                    sqlite_demo::router(store.clone(), store.pool().clone(), &config)
                        .merge(admin_router(store.clone(), d))
                        .merge(start_webhooks(&store, hooks.as_ref(), &shutdown))
                }
                Db::Postgres(store) => {
                    spawn_gc(store.clone(), gc_interval);
                    let listener_store = store.clone();
                    let d = start_messaging(
                        &store,
                        nats_url.as_deref(),
                        consume.then(|| (postgres_demo::Ledger, consume_config.clone())),
                        move || async move { listener_store.outbox_listener().await },
                        Duration::from_secs(1),
                        &shutdown,
                    );
                    postgres_demo::router(store.clone(), store.pool().clone(), &config)
                        .merge(admin_router(store.clone(), d))
                        .merge(start_webhooks(&store, hooks.as_ref(), &shutdown))
                }
            };
            let listener = tokio::net::TcpListener::bind(listen)
                .await
                .with_context(|| format!("failed to listen on {listen}"))?;
            let bound = listener
                .local_addr()
                .context("failed to read the bound address")?;
            if admin_token.is_none() {
                tracing::info!(
                    "admin routes disabled: start with --admin-token (or IDEM_ADMIN_TOKEN) to use /admin"
                );
            }
            let app = idem_server::routes::service(api, admin_token);
            tracing::info!(listen = %bound, "idem serving the demo payments API");
            http_server::serve(listener, app, limits, messaging::stopped(shutdown)).await;
        }
        Command::Relay {
            db,
            nats_url,
            lease,
        } => {
            check_nats_url(&nats_url)?;
            if lease < Duration::from_secs(1) || lease >= messaging::DUPLICATE_WINDOW {
                bail!("--lease must be at least 1s and shorter than the 5 min duplicate window");
            }
            let shutdown = shutdown_signal();
            match open_existing(&db.database_url).await? {
                Db::Sqlite(store) => {
                    let poll = Duration::from_millis(200);
                    run_relay(store, &nats_url, Polling, poll, lease, shutdown).await?
                }
                Db::Postgres(store) => {
                    let wake = store.outbox_listener().await;
                    let poll = Duration::from_secs(1);
                    run_relay(store, &nats_url, wake, poll, lease, shutdown).await?
                }
            }
        }
        Command::Consume {
            db,
            nats_url,
            consumer,
        } => {
            check_nats_url(&nats_url)?;
            let config = consume_config(&consumer)?;
            let shutdown = shutdown_signal();
            let Some(js) = messaging::prepare(&nats_url, "idem-consume", shutdown.clone()).await
            else {
                return Ok(());
            };
            match open_existing(&db.database_url).await? {
                Db::Sqlite(store) => {
                    messaging::consume(store, js, sqlite_demo::Ledger, config, shutdown).await
                }
                Db::Postgres(store) => {
                    messaging::consume(store, js, postgres_demo::Ledger, config, shutdown).await
                }
            }
        }
        Command::Bench {
            sqlite_url,
            postgres_url,
            nats_url,
            secs,
        } => {
            idem_server::bench::run(
                &sqlite_url,
                postgres_url.as_deref(),
                nats_url.as_deref(),
                secs,
            )
            .await?;
        }
        Command::Migrate { db } => {
            open(&db.database_url).await?;
            println!("migrations applied");
        }
        Command::Gc { db } => {
            let n = match open_existing(&db.database_url).await? {
                Db::Sqlite(s) => gc_once(&s).await?,
                Db::Postgres(s) => gc_once(&s).await?,
            };
            println!("deleted {n} expired key records");
        }
        Command::Webhooks { action } => {
            let (WebhookAction::List { db, .. }
            | WebhookAction::Show { db, .. }
            | WebhookAction::Replay { db, .. }) = &action;
            match open_existing(&db.database_url).await? {
                Db::Sqlite(s) => webhooks_command(&s, action).await?,
                Db::Postgres(s) => webhooks_command(&s, action).await?,
            }
        }
        Command::Stats { db } => {
            let v = match open_existing(&db.database_url).await? {
                Db::Sqlite(s) => store_stats_json(&s).await?,
                Db::Postgres(s) => store_stats_json(&s).await?,
            };
            println!("{v}");
        }
    }
    Ok(())
}

/// Starts the relay (and the consumer) in the background when a NATS URL is
/// given. The relay needs the streams, hence the server; until it is up the
/// API works and events wait in the outbox. Returns the slot the relay is put
/// in once it runs.
fn start_messaging<S, H, W, F>(
    store: &S,
    nats_url: Option<&str>,
    consumer: Option<(H, ConsumeConfig)>,
    wake: impl FnOnce() -> F + Send + 'static,
    poll: Duration,
    shutdown: &watch::Receiver<bool>,
) -> RelaySlot<S>
where
    S: OutboxStore + idem_core::inbox::InboxStore,
    H: idem_inbox::Handler<S::Tx> + 'static,
    W: idem_core::outbox::Wake + 'static,
    F: std::future::Future<Output = W> + Send,
{
    let slot = RelaySlot::<S>::default();
    let Some(url) = nats_url else {
        return slot;
    };
    let (url, store, shutdown, filled) = (
        url.to_owned(),
        store.clone(),
        shutdown.clone(),
        slot.clone(),
    );
    tokio::spawn(async move {
        let Some(js) = messaging::prepare(&url, "idem-serve", shutdown.clone()).await else {
            return;
        };
        if let Some((handler, config)) = consumer {
            let task =
                messaging::consume(store.clone(), js.clone(), handler, config, shutdown.clone());
            tokio::spawn(task);
        }
        match messaging::dispatcher(
            store,
            js,
            poll,
            idem_outbox::DispatcherConfig::default().lease,
        ) {
            Ok(d) => {
                let d = Arc::new(d);
                let _ = filled.set(d.clone());
                messaging::relay(d, wake().await, shutdown).await
            }
            Err(e) => tracing::error!(error = %format!("{e:#}"), "relay not started"),
        }
    });
    slot
}

/// Mounts the webhook routes and starts the workers, when a configuration
/// declares endpoints.
fn start_webhooks<S: idem_core::webhooks::WebhookStore>(
    store: &S,
    config: Option<&idem_server::webhooks::WebhookConfig>,
    shutdown: &watch::Receiver<bool>,
) -> Router {
    use idem_server::webhooks as w;
    // The admin view of stored receipts works without endpoints too (an
    // endpoint taken out of the file still has receipts to look at).
    let stored_only = || {
        w::admin_router(
            store.clone(),
            Arc::new(idem_webhooks::Receiver::new(store.clone(), vec![])),
        )
    };
    let Some(config) = config else {
        return stored_only();
    };
    if config.endpoints.is_empty() {
        tracing::warn!(
            "--config: no webhook endpoints are configured (no [webhooks.<name>] table); no webhooks are received"
        );
        return stored_only();
    }
    let receiver = Arc::new(idem_webhooks::Receiver::new(
        store.clone(),
        config.endpoints.clone(),
    ));
    let processor = w::processor(store.clone(), config);
    let shutdown = shutdown.clone();
    tokio::spawn(async move {
        processor
            .run(Duration::from_secs(3600), messaging::stopped(shutdown))
            .await
    });
    let names: Vec<&str> = config.endpoints.iter().map(|e| e.name.as_str()).collect();
    tracing::info!(endpoints = ?names, "receiving webhooks at /webhooks/{{endpoint}}");
    w::router(receiver.clone()).merge(w::admin_router(store.clone(), receiver))
}

async fn webhooks_command<S: idem_core::webhooks::WebhookStore>(
    store: &S,
    action: WebhookAction,
) -> anyhow::Result<()> {
    use idem_server::webhooks as w;
    match action {
        WebhookAction::List {
            endpoint,
            state,
            limit,
            ..
        } => {
            let state = match state.as_deref() {
                None => None,
                Some(s) => Some(idem_core::webhooks::ReceiptState::parse(s).with_context(
                    || format!("--state {s}: expected received, processed, failed, dead or stale"),
                )?),
            };
            if !(1..=1000).contains(&limit) {
                bail!("--limit must be between 1 and 1000");
            }
            for r in store
                .list_receipts(endpoint.as_deref(), state, limit)
                .await?
            {
                println!("{}", w::receipt_json(&r, false));
            }
        }
        WebhookAction::Show {
            endpoint,
            delivery_id,
            ..
        } => match w::find_receipt(store, &endpoint, &delivery_id).await? {
            Some(r) => println!("{}", w::receipt_json(&r, true)),
            None => bail!("no delivery {delivery_id} on endpoint {endpoint}"),
        },
        WebhookAction::Replay {
            endpoint,
            delivery_id,
            ..
        } => {
            let now = idem_core::Clock::now_ms(&idem_core::SystemClock);
            let (delivery_id, outcome) =
                w::replay_receipt(store, &endpoint, &delivery_id, now).await?;
            let (_, v) = w::replay_json(&endpoint, &delivery_id, outcome);
            println!("{v}");
            if outcome == idem_core::webhooks::Requeue::NotFound {
                bail!("no delivery {delivery_id} on endpoint {endpoint}");
            }
        }
    }
    Ok(())
}

async fn run_relay<S: OutboxStore>(
    store: S,
    nats_url: &str,
    wake: impl idem_core::outbox::Wake,
    poll: Duration,
    lease: Duration,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let Some(js) = messaging::prepare(nats_url, "idem-relay", shutdown.clone()).await else {
        return Ok(());
    };
    let d = Arc::new(messaging::dispatcher(store, js, poll, lease)?);
    let reporter = {
        let d = d.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(30));
            tick.tick().await;
            loop {
                tick.tick().await;
                if let Ok(s) = d.stats().await {
                    tracing::info!(figures = %stats_json(&s), "outbox");
                }
            }
        })
    };
    messaging::relay(d, wake, shutdown).await;
    reporter.abort();
    Ok(())
}
