//! The inbox on PostgreSQL: [`InboxStore`](idem_core::inbox::InboxStore)
//! for [`PgStore`], from [`idem_sql::inbox`].

use crate::{PgStore, PgTx};

idem_sql::inbox_store!(PgStore, PgTx, postgres);
