//! The schema, and one migration runner for both backends.
//!
//! [`sqlite::MIGRATIONS`] and [`postgres::MIGRATIONS`] are the key store's
//! own migrations (the files under `migrations/<dialect>/`).
//! [`run`] is each backend's `migrate_component`: each migration of a component that
//! `idem_schema_migrations` does not record is applied in a transaction of
//! its own, with the record of it. Concurrent runners apply each once:
//! SQLite's `BEGIN IMMEDIATE` serialises them, PostgreSQL's runners take an
//! advisory lock first.

use idem_core::StoreError;

use crate::dialect::{Dialect, On, Stmt, fetch_one};
use crate::row;

/// Whether `$1` (component) has applied `$2` (version).
pub const SEEN: &str =
    "SELECT version FROM idem_schema_migrations WHERE component = $1 AND version = $2";

macro_rules! migrations {
    ($dir:literal) => {
        &[
            idem_core::Migration {
                version: 1,
                name: "idem_keys",
                sql: include_str!(concat!("../migrations/", $dir, "/0001_idem_keys.sql")),
            },
            idem_core::Migration {
                version: 2,
                name: "idem_outbox",
                sql: include_str!(concat!("../migrations/", $dir, "/0002_idem_outbox.sql")),
            },
            idem_core::Migration {
                version: 3,
                name: "idem_inbox",
                sql: include_str!(concat!("../migrations/", $dir, "/0003_idem_inbox.sql")),
            },
            idem_core::Migration {
                version: 4,
                name: "idem_webhooks",
                sql: include_str!(concat!("../migrations/", $dir, "/0004_idem_webhooks.sql")),
            },
            idem_core::Migration {
                version: 5,
                name: "idem_webhooks_hardening",
                sql: include_str!(concat!(
                    "../migrations/",
                    $dir,
                    "/0005_idem_webhooks_hardening.sql"
                )),
            },
            idem_core::Migration {
                version: 6,
                name: "idem_runs",
                sql: include_str!(concat!("../migrations/", $dir, "/0006_idem_runs.sql")),
            },
            idem_core::Migration {
                version: 7,
                name: "idem_runs_namespace",
                sql: include_str!(concat!(
                    "../migrations/",
                    $dir,
                    "/0007_idem_runs_namespace.sql"
                )),
            },
            idem_core::Migration {
                version: 8,
                name: "idem_admin_audit",
                sql: include_str!(concat!(
                    "../migrations/",
                    $dir,
                    "/0008_idem_admin_audit.sql"
                )),
            },
            idem_core::Migration {
                version: 9,
                name: "idem_keys_on_unknown",
                sql: include_str!(concat!(
                    "../migrations/",
                    $dir,
                    "/0009_idem_keys_on_unknown.sql"
                )),
            },
            idem_core::Migration {
                version: 10,
                name: "idem_tasks",
                sql: include_str!(concat!("../migrations/", $dir, "/0010_idem_tasks.sql")),
            },
            idem_core::Migration {
                version: 11,
                name: "idem_positions",
                sql: include_str!(concat!("../migrations/", $dir, "/0011_idem_positions.sql")),
            },
        ]
    };
}

/// SQLite's schema and runner statements.
pub mod sqlite {
    use idem_core::Migration;

    /// The key store's own migrations.
    pub const MIGRATIONS: &[Migration] = migrations!("sqlite");
    /// A migration's transaction: the write lock taken at `BEGIN`.
    pub const BEGIN: &str = "BEGIN IMMEDIATE";
    /// Nothing to set before the first read.
    pub const PRELUDE: &[&str] = &[];
    /// Whether the record of migrations exists.
    pub const TABLE_EXISTS: &str = "SELECT EXISTS (SELECT 1 FROM sqlite_master \
        WHERE type = 'table' AND name = 'idem_schema_migrations')";
    /// The record of migrations.
    pub const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS idem_schema_migrations (
        component TEXT NOT NULL, version INTEGER NOT NULL, name TEXT NOT NULL,
        applied_at_ms INTEGER NOT NULL, PRIMARY KEY (component, version))";
    /// `$1` component, `$2` version, `$3` name applied now.
    pub const RECORD: &str = "\
INSERT INTO idem_schema_migrations (component, version, name, applied_at_ms)
VALUES ($1, $2, $3, CAST(unixepoch('subsec') * 1000 AS INTEGER))";
    /// The runner's statements.
    pub const RUNNER: super::Runner = super::Runner {
        begin: BEGIN,
        prelude: PRELUDE,
        table_exists: TABLE_EXISTS,
        create_table: CREATE_TABLE,
        record: RECORD,
    };
}

/// PostgreSQL's schema and runner statements.
pub mod postgres {
    use idem_core::Migration;

    /// The key store's own migrations.
    pub const MIGRATIONS: &[Migration] = migrations!("postgres");
    /// A migration's transaction.
    pub const BEGIN: &str = "BEGIN";
    /// Schema changes may legitimately take longer than the pool's
    /// statement timeout, and wait for another runner's advisory lock,
    /// which is taken before anything is read.
    pub const PRELUDE: &[&str] = &[
        "SET LOCAL statement_timeout = '15min'; SET LOCAL lock_timeout = '5min'",
        "SELECT pg_advisory_xact_lock(7226415001)",
    ];
    /// Whether the record of migrations exists (checked first so that a
    /// started server does not log "already exists, skipping" each time).
    pub const TABLE_EXISTS: &str = "SELECT to_regclass('idem_schema_migrations') IS NOT NULL";
    /// The record of migrations.
    pub const CREATE_TABLE: &str = "CREATE TABLE idem_schema_migrations (
        component TEXT NOT NULL, version BIGINT NOT NULL, name TEXT NOT NULL,
        applied_at TIMESTAMPTZ NOT NULL DEFAULT now(), PRIMARY KEY (component, version))";
    /// `$1` component, `$2` version, `$3` name applied now.
    pub const RECORD: &str =
        "INSERT INTO idem_schema_migrations (component, version, name) VALUES ($1, $2, $3)";
    /// The runner's statements.
    pub const RUNNER: super::Runner = super::Runner {
        begin: BEGIN,
        prelude: PRELUDE,
        table_exists: TABLE_EXISTS,
        create_table: CREATE_TABLE,
        record: RECORD,
    };
}

/// A dialect's runner statements.
#[derive(Debug)]
pub struct Runner {
    /// A migration's transaction's `BEGIN`.
    pub begin: &'static str,
    /// Run (as simple queries) before the first read.
    pub prelude: &'static [&'static str],
    /// Whether the record of migrations exists (one boolean column).
    pub table_exists: &'static str,
    /// The record of migrations.
    pub create_table: &'static str,
    /// `$1` component, `$2` version, `$3` name applied now.
    pub record: &'static str,
}

/// The key store's own migrations in `D`'s SQL family.
pub(crate) fn migrations<D: Dialect>() -> &'static [idem_core::Migration] {
    D::FAMILY.pick(sqlite::MIGRATIONS, postgres::MIGRATIONS)
}

/// This capability's text in `D`'s SQL family.
pub(crate) fn runner<D: Dialect>() -> &'static Runner {
    D::FAMILY.pick(&sqlite::RUNNER, &postgres::RUNNER)
}

/// Applies `migrations` of `component` that this database has not recorded
/// in `idem_schema_migrations`, each in a transaction of its own with its
/// record, so concurrent runners apply each once (see the module docs).
/// Each backend's `migrate_component` is this with its dialect.
pub async fn run<D: Dialect>(
    pool: &sqlx::Pool<D::Db>,
    component: &str,
    migrations: &[idem_core::Migration],
) -> Result<(), StoreError> {
    let sql = runner::<D>();
    for m in migrations {
        let mut tx = pool.begin_with(sql.begin).await.map_err(D::map_err)?;
        for statement in sql.prelude {
            D::execute_raw(On::Conn(&mut *tx), statement)
                .await
                .map_err(D::map_err)?;
        }
        let exists = fetch_one::<D>(On::Conn(&mut *tx), Stmt::new(sql.table_exists))
            .await
            .map_err(D::map_err)?;
        if !row::get_at::<bool, _>(&exists, 0)? {
            D::execute_raw(On::Conn(&mut *tx), sql.create_table)
                .await
                .map_err(D::map_err)?;
        }
        let seen = Stmt::new(SEEN).bind(component).bind(m.version);
        if D::fetch_optional(On::Conn(&mut *tx), seen)
            .await
            .map_err(D::map_err)?
            .is_some()
        {
            continue;
        }
        D::execute_raw(On::Conn(&mut *tx), m.sql)
            .await
            .map_err(D::map_err)?;
        let record = Stmt::new(sql.record)
            .bind(component)
            .bind(m.version)
            .bind(m.name);
        D::execute(On::Conn(&mut *tx), record)
            .await
            .map_err(D::map_err)?;
        tx.commit().await.map_err(D::map_err)?;
    }
    Ok(())
}
