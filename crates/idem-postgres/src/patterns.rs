//! [`PatternExec`] for [`PgTx`], so the patterns of
//! [`idem_sql::patterns`] run in the transaction of a key, a run's phase,
//! or one from [`KeyStore::begin`](idem_core::KeyStore::begin). The same
//! spec runs unchanged on SQLite (`idem_sqlite::patterns` has an example):
//!
//! ```no_run
//! # async fn demo(store: idem_postgres::PgStore) -> Result<(), Box<dyn std::error::Error>> {
//! use idem_core::KeyStore;
//! use idem_sql::patterns::{StateMachine, Transition, Value};
//! let orders = StateMachine::new("orders", &["id"], "status")?.allow("pending", &["confirmed"]);
//! let mut tx = store.begin().await?;
//! match orders.transition(&mut tx, &[Value::Text("o1")], "confirmed", &[]).await? {
//!     Transition::Moved | Transition::AlreadyThere => {}
//!     Transition::Illegal { current } => println!("the order is {current}"),
//!     Transition::Missing => println!("no such order"),
//! }
//! store.commit(tx).await?;
//! # Ok(()) }
//! ```

use idem_core::{BoxFuture, StoreError};
use idem_sql::patterns::{self, PatternExec, Value};

use crate::{PgDialect, PgTx};

impl PatternExec for PgTx {
    fn fetch_text<'a>(
        &'a mut self,
        sql: &'a str,
        binds: &'a [Value<'a>],
    ) -> BoxFuture<'a, Result<Option<String>, StoreError>> {
        Box::pin(patterns::fetch_text::<PgDialect>(self, sql, binds))
    }

    fn fetch_int<'a>(
        &'a mut self,
        sql: &'a str,
        binds: &'a [Value<'a>],
    ) -> BoxFuture<'a, Result<Option<i64>, StoreError>> {
        Box::pin(patterns::fetch_int::<PgDialect>(self, sql, binds))
    }

    fn execute<'a>(
        &'a mut self,
        sql: &'a str,
        binds: &'a [Value<'a>],
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(patterns::execute::<PgDialect>(self, sql, binds))
    }
}
