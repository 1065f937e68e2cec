//! Tasks, cursors and actions on PostgreSQL: [`TaskStore`](idem_core::tasks::TaskStore)
//! for [`PgStore`], from [`idem_sql::tasks`]. Claimers skip each other's
//! rows (`FOR UPDATE SKIP LOCKED`); a worker's write locks its task's row.

use crate::{PgStore, PgTx, map_err};

idem_sql::task_store!(PgStore, PgTx, postgres);
