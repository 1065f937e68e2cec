//! The migration runner shared by the key store and applications (one
//! runner for both backends: [`idem_sql::migrate`]); safe to run from
//! several processes at once.

use idem_core::{Migration, StoreError};
pub use idem_sql::migrate::postgres::MIGRATIONS;
use sqlx::PgPool;

use crate::PgDialect;

/// Applies `migrations` of `component` that this database has not recorded
/// in `idem_schema_migrations`, each in a transaction of its own with its
/// record, under an advisory lock, so concurrent runners apply each once
/// (see [`idem_sql::migrate`]).
pub async fn migrate_component(
    pool: &PgPool,
    component: &str,
    migrations: &[Migration],
) -> Result<(), StoreError> {
    idem_sql::migrate::run::<PgDialect>(pool, component, migrations).await
}
