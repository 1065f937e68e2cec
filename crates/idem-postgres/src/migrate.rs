//! The migration runner shared by the key store and applications (one
//! runner for both backends: [`idem_sql::migrate`]); safe to run from
//! several processes at once.

pub use idem_sql::migrate::postgres::MIGRATIONS;
use sqlx::PgPool;

use crate::map_err;

idem_sql::migrate_fn!(PgPool, postgres);
