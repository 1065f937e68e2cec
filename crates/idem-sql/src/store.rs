//! What every backend's store is made of besides its statements: the glue
//! the macros of this crate call, and the pieces both backends would
//! otherwise write twice.
//!
//! The macros expand inside a backend and call, on its store: `pool()`,
//! `map(sqlx::Error)` (a driver error as a [`StoreError`]), `bounded(call)`
//! (a store call under the backend's deadline, if it has one),
//! `bounded_claim(wait, call)` (a claim, which may wait `wait` besides),
//! `bounded_write(statement)` (an autocommit write, whose outcome may be
//! unknown when its answer is lost) and `purge(..)`; and
//! the crate's `map_err(sqlx::Error)`. [`store_common!`](crate::store_common)
//! writes `pool()`, `migrate()` and `purge(..)`; [`unbounded!`](crate::unbounded)
//! writes `bounded` and `bounded_write` for a store without a deadline.

use std::time::Duration;

/// A connection that sent a message larger than this is closed after it
/// instead of kept: the driver keeps a connection's buffers as large as its
/// largest message (a large stored answer).
pub const KEEP_AFTER_MESSAGE_BYTES: usize = 256 << 10;

use idem_core::{ConfigError, StoreError};

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

/// `Debug` (opaque: a transaction shows no connection state) and
/// `Deref`/`DerefMut` to the connection for a backend's key transaction,
/// which reaches its connection by the methods `get` and `get_mut`:
/// `tx_guard!(Tx, Connection, get, get_mut)`.
#[macro_export]
macro_rules! tx_guard {
    ($tx:ident, $conn:ty, $get:ident, $get_mut:ident) => {
        impl std::fmt::Debug for $tx {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($tx)).finish_non_exhaustive()
            }
        }

        impl std::ops::Deref for $tx {
            type Target = $conn;
            fn deref(&self) -> &$conn {
                self.$get()
            }
        }

        impl std::ops::DerefMut for $tx {
            fn deref_mut(&mut self) -> &mut $conn {
                self.$get_mut()
            }
        }
    };
}

/// Inside `impl Store`: `pool()`, `migrate()` (the key store's migrations,
/// idempotent) and `purge(..)` ([`purge_fn!`](crate::purge_fn)), for a
/// store whose pool is its `pool` field: `store_common!(Pool, MIGRATIONS)`.
#[macro_export]
macro_rules! store_common {
    ($pool:ty, $migrations:expr) => {
        /// The pool, for reads outside a key's transaction.
        pub fn pool(&self) -> &$pool {
            &self.pool
        }

        /// Applies the key store's migrations (idempotent; concurrent
        /// runners apply each once, see [`idem_sql::migrate`]).
        pub async fn migrate(&self) -> Result<(), idem_core::StoreError> {
            migrate_component(&self.pool, "idem", $migrations).await
        }

        $crate::purge_fn!();
    };
}

/// Inside `impl Store`, for a store without a client-side deadline (a local
/// file cannot hang up): `bounded(call)` is the call as it is, and
/// `bounded_write(statement)` maps its error through the store's `map`.
#[macro_export]
macro_rules! unbounded {
    () => {
        /// The call as it is: no deadline.
        pub(crate) async fn bounded<T>(
            &self,
            call: impl std::future::Future<Output = Result<T, idem_core::StoreError>>,
        ) -> Result<T, idem_core::StoreError> {
            call.await
        }

        /// A claim as it is: no deadline (a claim may wait `_wait`).
        pub(crate) async fn bounded_claim<T>(
            &self,
            _wait: std::time::Duration,
            call: impl std::future::Future<Output = Result<T, idem_core::StoreError>>,
        ) -> Result<T, idem_core::StoreError> {
            call.await
        }

        /// One autocommit statement that writes, its error through `map`.
        pub(crate) async fn bounded_write<T>(
            &self,
            statement: impl std::future::Future<Output = Result<T, sqlx::Error>>,
        ) -> Result<T, idem_core::StoreError> {
            statement.await.map_err(|e| self.map(e))
        }
    };
}
