//! The migration runner shared by the key store and applications (one
//! runner for both backends: [`idem_sql::migrate`]).

use idem_core::{Migration, StoreError};
pub use idem_sql::migrate::sqlite::MIGRATIONS;
use sqlx::SqlitePool;

use crate::SqliteDialect;

/// Applies `migrations` of `component` that this database has not recorded
/// in `idem_schema_migrations`, each in a `BEGIN IMMEDIATE` transaction of
/// its own with its record, so concurrent runners apply each once (see
/// [`idem_sql::migrate`]).
pub async fn migrate_component(
    pool: &SqlitePool,
    component: &str,
    migrations: &[Migration],
) -> Result<(), StoreError> {
    idem_sql::migrate::run::<SqliteDialect>(pool, component, migrations).await
}
