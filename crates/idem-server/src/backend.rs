//! The one place the server tells its backends apart: [`Db::open`] reads the
//! URL, connects and migrates Idem's tables; everything else is generic over
//! [`Backend`] and is handed the store by [`Db::run`]. The demo apps' work
//! ([`DemoJob`], by [`Db::run_demo`]) is also handed the demo's SQL, and
//! only then are the demo's tables made: a gateway's database has none.

use std::time::Duration;

use anyhow::{Context, bail};
use idem_core::KeyStore;
use idem_core::admin::AdminStore;
use idem_core::inbox::InboxStore;
use idem_core::leased::LeasedKeyStore;
use idem_core::outbox::{OutboxStore, OutboxWriter, Wake};
use idem_core::steps::RunStore;
use idem_core::tasks::TaskStore;
use idem_core::webhooks::WebhookStore;
use idem_postgres::{PgConfig, PgStore};
use idem_sql::patterns::PatternExec;
use idem_sqlite::{SqliteConfig, SqliteStore};

use idem_demo as demo;
use idem_demo::DemoSql;

/// Every store capability the server uses, from one database: runs and
/// steps included, whose transactions run the database patterns.
pub trait Backend:
    InboxStore
    + AdminStore
    + OutboxStore
    + OutboxWriter
    + WebhookStore
    + RunStore
    + TaskStore
    + LeasedKeyStore
    + KeyStore<Tx: PatternExec>
{
    /// What wakes the relay when a row is written to the outbox.
    type OutboxWake: Wake + 'static;

    /// How often the relay polls the outbox besides being woken.
    const RELAY_POLL: Duration;

    /// The wake-up for the relay (for PostgreSQL a `LISTEN`).
    fn outbox_wake(&self) -> impl Future<Output = Self::OutboxWake> + Send;

    /// Applies the key store's migrations.
    fn migrate_store(&self) -> impl Future<Output = Result<(), idem_core::StoreError>>;

    /// One trivial query (`SELECT 1`) on a pooled connection: whether the
    /// database answers now (`/readyz`).
    fn ping(&self) -> impl Future<Output = Result<(), idem_core::StoreError>> + Send;
}

/// `SELECT 1` on a pooled connection. The pool hands out idle connections
/// without a check, so after the database restarted the first ones are
/// dead: each failed try drops one and the next takes another (the caller
/// bounds the whole in time), so a probe — and the requests after it —
/// do not keep meeting connections the server closed.
async fn ping<DB: sqlx::Database>(pool: &sqlx::Pool<DB>) -> Result<(), idem_core::StoreError>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    let mut last = sqlx::Error::PoolClosed;
    for _ in 0..=pool.size() {
        let mut conn = pool.acquire().await.map_err(unavailable)?;
        match sqlx::query("SELECT 1").execute(&mut *conn).await {
            Ok(_) => return Ok(()),
            Err(e) => {
                // Closed, not handed back to the pool.
                drop(conn.detach());
                last = e;
            }
        }
    }
    Err(unavailable(last))
}

/// A failed ping, as the store's error.
fn unavailable(e: sqlx::Error) -> idem_core::StoreError {
    idem_core::StoreError::Unavailable { source: e.into() }
}

impl Backend for SqliteStore {
    type OutboxWake = idem_outbox::Polling;
    const RELAY_POLL: Duration = Duration::from_millis(200);

    async fn outbox_wake(&self) -> Self::OutboxWake {
        idem_outbox::Polling
    }

    async fn migrate_store(&self) -> Result<(), idem_core::StoreError> {
        self.migrate().await
    }

    async fn ping(&self) -> Result<(), idem_core::StoreError> {
        ping(self.pool()).await
    }
}

impl Backend for PgStore {
    type OutboxWake = idem_postgres::outbox::OutboxListener;
    const RELAY_POLL: Duration = Duration::from_secs(1);

    async fn outbox_wake(&self) -> Self::OutboxWake {
        self.dialect().outbox_listener().await
    }

    async fn migrate_store(&self) -> Result<(), idem_core::StoreError> {
        self.migrate().await
    }

    async fn ping(&self) -> Result<(), idem_core::StoreError> {
        ping(self.pool()).await
    }
}

/// Work to do on whichever backend the URL named.
pub trait Job {
    /// What the work returns.
    type Output;
    /// Does the work on `backend`.
    fn run<B: Backend>(self, backend: B) -> impl Future<Output = Self::Output>;
}

/// Work of the demo apps: also handed the demo's SQL and the checkout's runs.
pub trait DemoJob {
    /// What the work returns.
    type Output;
    /// Does the work on `backend`, whose demo tables exist.
    fn run<B: Backend + demo::Store>(self, backend: B) -> impl Future<Output = Self::Output>;
}

/// An open, migrated database.
#[derive(Debug, Clone)]
pub enum Db {
    /// `sqlite://PATH`.
    Sqlite(SqliteStore),
    /// `postgres://…`.
    Postgres(PgStore),
}

impl Db {
    /// Opens the database, creating an SQLite file if missing, and applies
    /// Idem's migrations (not the demo's: [`Db::run_demo`] makes those).
    pub async fn open(url: &str) -> anyhow::Result<Db> {
        Self::open_with(url, None).await
    }

    /// [`Db::open`] with a pool of `pool` connections instead of the
    /// backend's default (`--database-pool`).
    pub async fn open_with(url: &str, pool: Option<u32>) -> anyhow::Result<Db> {
        let db = Self::connect(url, pool).await?;
        db.clone().run(Migrate).await?;
        Ok(db)
    }

    /// Opens a database that must exist already: an operator command pointed
    /// at the wrong file must not report an empty, brand-new one as "all
    /// clear".
    pub async fn open_existing(url: &str) -> anyhow::Result<Db> {
        Self::open_existing_with(url, None).await
    }

    /// [`Db::open_existing`] with a pool of `pool` connections.
    pub async fn open_existing_with(url: &str, pool: Option<u32>) -> anyhow::Result<Db> {
        if let Some(path) = idem_sqlite::file_path(url)
            && !path.is_empty()
            && !std::path::Path::new(path).exists()
        {
            bail!(
                "no SQLite database at {path}: pass --database-url (or IDEM_DATABASE_URL), \
                 or create it with idem serve or idem migrate"
            );
        }
        Self::open_with(url, pool).await
    }

    /// Connects without migrating.
    async fn connect(url: &str, pool: Option<u32>) -> anyhow::Result<Db> {
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
        if url.starts_with("sqlite:") {
            let mut config = SqliteConfig::default();
            config.max_connections = pool.unwrap_or(config.max_connections);
            let store = SqliteStore::connect(url, config)
                .await
                .with_context(|| format!("failed to open SQLite database {url}"))?;
            Ok(Db::Sqlite(store))
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            let mut config = PgConfig::default();
            config.max_connections = pool.unwrap_or(config.max_connections);
            let store = PgStore::connect(url, config)
                .await
                .context("failed to connect to PostgreSQL")?;
            Ok(Db::Postgres(store))
        } else {
            bail!("unsupported database URL: expected sqlite://… or postgres://…")
        }
    }

    /// Runs `job` on the backend.
    pub async fn run<J: Job>(self, job: J) -> J::Output {
        match self {
            Db::Sqlite(store) => job.run(store).await,
            Db::Postgres(store) => job.run(store).await,
        }
    }

    /// Creates or updates the demo's tables.
    pub async fn migrate_demo(&self) -> anyhow::Result<()> {
        match self {
            Db::Sqlite(store) => store.migrate_demo().await,
            Db::Postgres(store) => store.migrate_demo().await,
        }
        .context("failed to migrate the demo tables")
    }

    /// Creates or updates the demo's tables, then runs `job` on the backend.
    pub async fn run_demo<J: DemoJob>(self, job: J) -> anyhow::Result<J::Output> {
        self.migrate_demo().await?;
        Ok(match self {
            Db::Sqlite(store) => job.run(store).await,
            Db::Postgres(store) => job.run(store).await,
        })
    }
}

struct Migrate;

impl Job for Migrate {
    type Output = anyhow::Result<()>;
    async fn run<B: Backend>(self, backend: B) -> anyhow::Result<()> {
        backend
            .migrate_store()
            .await
            .context("failed to migrate the key store")
    }
}
