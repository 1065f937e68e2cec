//! The operator's queries and actions on PostgreSQL: [`AdminStore`](idem_core::admin::AdminStore)
//! for [`PgStore`], from [`idem_sql::admin`]. Actions run in the caller's
//! transaction and lock the row they decide on (`FOR UPDATE`), so nothing
//! changes between their read and their write.

use crate::{PgStore, PgTx, map_err};

idem_sql::admin_store!(PgStore, PgTx, postgres);
