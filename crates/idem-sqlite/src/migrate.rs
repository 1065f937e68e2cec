//! A small migration runner shared by the key store and applications.

use idem_core::{Migration, StoreError};
use sqlx::SqlitePool;

use crate::map_err;

/// The key store's own migrations.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "idem_keys",
        sql: include_str!("../migrations/0001_idem_keys.sql"),
    },
    Migration {
        version: 2,
        name: "idem_outbox",
        sql: include_str!("../migrations/0002_idem_outbox.sql"),
    },
    Migration {
        version: 3,
        name: "idem_inbox",
        sql: include_str!("../migrations/0003_idem_inbox.sql"),
    },
    Migration {
        version: 4,
        name: "idem_webhooks",
        sql: include_str!("../migrations/0004_idem_webhooks.sql"),
    },
    Migration {
        version: 5,
        name: "idem_webhooks_hardening",
        sql: include_str!("../migrations/0005_idem_webhooks_hardening.sql"),
    },
    Migration {
        version: 6,
        name: "idem_runs",
        sql: include_str!("../migrations/0006_idem_runs.sql"),
    },
    Migration {
        version: 7,
        name: "idem_runs_namespace",
        sql: include_str!("../migrations/0007_idem_runs_namespace.sql"),
    },
    Migration {
        version: 8,
        name: "idem_admin_audit",
        sql: include_str!("../migrations/0008_idem_admin_audit.sql"),
    },
    Migration {
        version: 9,
        name: "idem_keys_on_unknown",
        sql: include_str!("../migrations/0009_idem_keys_on_unknown.sql"),
    },
];

/// Applies `migrations` of `component` that this database has not seen, each in
/// its own `BEGIN IMMEDIATE` transaction (which serialises concurrent runners).
/// Applied versions are recorded in `idem_schema_migrations`.
pub async fn migrate_component(
    pool: &SqlitePool,
    component: &str,
    migrations: &[Migration],
) -> Result<(), StoreError> {
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS idem_schema_migrations (
             component TEXT NOT NULL, version INTEGER NOT NULL, name TEXT NOT NULL,
             applied_at_ms INTEGER NOT NULL, PRIMARY KEY (component, version))",
    )
    .execute(pool)
    .await
    .map_err(map_err)?;
    for m in migrations {
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.map_err(map_err)?;
        let seen: Option<i64> = sqlx::query_scalar(
            "SELECT version FROM idem_schema_migrations WHERE component = ?1 AND version = ?2",
        )
        .bind(component)
        .bind(m.version)
        .fetch_optional(&mut *tx)
        .await
        .map_err(map_err)?;
        if seen.is_some() {
            continue;
        }
        sqlx::raw_sql(m.sql)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        sqlx::query(
            "INSERT INTO idem_schema_migrations (component, version, name, applied_at_ms)
             VALUES (?1, ?2, ?3, CAST(unixepoch('subsec') * 1000 AS INTEGER))",
        )
        .bind(component)
        .bind(m.version)
        .bind(m.name)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
    }
    Ok(())
}
