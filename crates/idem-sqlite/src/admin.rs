//! The operator's queries and actions on SQLite: [`AdminStore`](idem_core::admin::AdminStore)
//! for [`SqliteStore`], from [`idem_sql::admin`]. Actions run in the
//! caller's `BEGIN IMMEDIATE` transaction, so nothing changes between their
//! read and their write.

use crate::{SqliteStore, SqliteTx, map_err};

idem_sql::admin_store!(SqliteStore, SqliteTx, sqlite);
