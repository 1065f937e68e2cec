//! The inbox on SQLite: [`InboxStore`](idem_core::inbox::InboxStore) for
//! [`SqliteStore`], from [`idem_sql::inbox`].

use crate::{SqliteStore, SqliteTx};

idem_sql::inbox_store!(SqliteStore, SqliteTx, sqlite);
