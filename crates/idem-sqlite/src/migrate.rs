//! The migration runner shared by the key store and applications (one
//! runner for both backends: [`idem_sql::migrate`]).

pub use idem_sql::migrate::sqlite::MIGRATIONS;
use sqlx::SqlitePool;

use crate::map_err;

idem_sql::migrate_fn!(SqlitePool, sqlite);
