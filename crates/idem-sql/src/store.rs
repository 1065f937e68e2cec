//! [`SqlStore`]: Idem's store on a [`Dialect`], and the pieces both
//! backends would otherwise write twice (the pool's bounds, the driver
//! errors that are not the database's answer).

use std::time::Duration;

/// A connection that sent a message larger than this is closed after it
/// instead of kept: the driver keeps a connection's buffers as large as its
/// largest message (a large stored answer).
pub const KEEP_AFTER_MESSAGE_BYTES: usize = 256 << 10;

use idem_core::{ConfigError, StoreError};

use crate::dialect::Dialect;

/// Checks the pool's bounds every backend's config has: `max_connections`
/// 1 to 10 000, `acquire_timeout` 10 ms to 1 h (`config` names the type).
pub fn check_pool(
    config: &'static str,
    max_connections: u32,
    acquire_timeout: Duration,
) -> Result<(), ConfigError> {
    ConfigError::check_range(config, "max_connections", max_connections, 1, 10_000)?;
    ConfigError::check_duration(
        config,
        "acquire_timeout",
        acquire_timeout,
        Duration::from_millis(10),
        Duration::from_secs(3600),
    )
}

/// A driver error that is not the database's answer: the connection or the
/// pool failing is [`StoreError::Unavailable`], anything else
/// [`StoreError::Database`]. Each backend's `map_err` classifies the
/// database's own errors and hands the rest here.
pub fn map_client_err(e: sqlx::Error) -> StoreError {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => StoreError::Unavailable { source: e.into() },
        _ => StoreError::Database { source: e.into() },
    }
}

/// Idem's store on the dialect `D`: every store trait of `idem-core` is
/// implemented for it once, generically (each in the module of its
/// capability: [`crate::keys`], [`crate::leased`], [`crate::outbox`],
/// [`crate::inbox`], [`crate::webhooks`], [`crate::runs`],
/// [`crate::tasks`], [`crate::admin`]). `idem_sqlite::SqliteStore` and
/// `idem_postgres::PgStore` are this with their dialect. Cheap to clone
/// when the dialect is. What only one backend has is reached through
/// [`SqlStore::dialect`]; the store does not dereference to its dialect, so
/// the dialect's hot-path messages (a claim without its read first and its
/// deadline, a raw `COMMIT`) are not methods of the store.
#[derive(Debug, Clone)]
pub struct SqlStore<D>(pub(crate) D);

impl<D: Dialect> SqlStore<D> {
    /// Connects to `url` with the dialect's `config` ([`Dialect::connect`]).
    pub async fn connect(url: &str, config: D::Config) -> Result<Self, StoreError> {
        D::connect(url, config).await.map(Self)
    }

    /// The store on a dialect already set up.
    pub fn new(dialect: D) -> Self {
        Self(dialect)
    }

    /// The dialect.
    pub fn dialect(&self) -> &D {
        &self.0
    }

    /// The pool, for reads and writes outside a key's transaction.
    pub fn pool(&self) -> &sqlx::Pool<D::Db> {
        self.0.pool()
    }

    /// Applies the key store's migrations (idempotent; concurrent runners
    /// apply each once, see [`crate::migrate`]).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        crate::migrate::run::<D>(self.pool(), "idem", crate::migrate::migrations::<D>()).await
    }
}
