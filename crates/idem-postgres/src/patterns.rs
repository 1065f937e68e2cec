//! [`PatternExec`] for [`PgTx`], so the patterns of
//! [`idem_core::patterns`] run in the transaction of a key, a run's phase,
//! or one from [`KeyStore::begin`](idem_core::KeyStore::begin). The same
//! spec runs unchanged on SQLite (`idem_sqlite::patterns` has an example):
//!
//! ```no_run
//! # async fn demo(store: idem_postgres::PgStore) -> Result<(), Box<dyn std::error::Error>> {
//! use idem_core::KeyStore;
//! use idem_core::patterns::{StateMachine, Transition, Value};
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

use idem_core::patterns::{PatternExec, Value};
use idem_core::{BoxFuture, StoreError};
use sqlx::Arguments;
use sqlx::postgres::{PgArguments, Postgres};

use crate::{PgTx, map_err};

fn arguments<'a>(binds: &'a [Value<'a>]) -> Result<PgArguments, StoreError> {
    let mut args = PgArguments::default();
    for v in binds {
        let added = match *v {
            Value::Text(s) => args.add(s),
            Value::Int(i) => args.add(i),
            Value::NullText => args.add(None::<&str>),
            Value::NullInt => args.add(None::<i64>),
        };
        added.map_err(|e| StoreError::Database { source: e })?;
    }
    Ok(args)
}

impl PatternExec for PgTx {
    fn fetch_text<'a>(
        &'a mut self,
        sql: &'a str,
        binds: &'a [Value<'a>],
    ) -> BoxFuture<'a, Result<Option<String>, StoreError>> {
        Box::pin(async move {
            sqlx::query_scalar_with::<Postgres, String, _>(sql, arguments(binds)?)
                .fetch_optional(&mut **self)
                .await
                .map_err(map_err)
        })
    }

    fn fetch_int<'a>(
        &'a mut self,
        sql: &'a str,
        binds: &'a [Value<'a>],
    ) -> BoxFuture<'a, Result<Option<i64>, StoreError>> {
        Box::pin(async move {
            sqlx::query_scalar_with::<Postgres, i64, _>(sql, arguments(binds)?)
                .fetch_optional(&mut **self)
                .await
                .map_err(map_err)
        })
    }

    fn execute<'a>(
        &'a mut self,
        sql: &'a str,
        binds: &'a [Value<'a>],
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            sqlx::query_with::<Postgres, _>(sql, arguments(binds)?)
                .execute(&mut **self)
                .await
                .map(|r| r.rows_affected())
                .map_err(map_err)
        })
    }
}
