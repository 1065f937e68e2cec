//! [`PatternExec`](idem_sql::patterns::PatternExec) for [`PgTx`], so the patterns of
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

use sqlx::Postgres;

use crate::{PgTx, map_err};

idem_sql::pattern_exec!(PgTx, Postgres);
