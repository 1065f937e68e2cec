//! Tasks, cursors and actions on SQLite: [`TaskStore`](idem_core::tasks::TaskStore)
//! for [`SqliteStore`], from [`idem_sql::tasks`]. One writer at a time
//! (`BEGIN IMMEDIATE`): two claimers never take the same task.

use crate::{SqliteStore, SqliteTx, map_err};

idem_sql::task_store!(SqliteStore, SqliteTx, sqlite);
