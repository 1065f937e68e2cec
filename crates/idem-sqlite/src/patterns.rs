//! [`PatternExec`] for [`SqliteTx`], so the patterns of
//! [`idem_sql::patterns`] run in the transaction of a key, a run's phase,
//! or one from [`KeyStore::begin`](idem_core::KeyStore::begin).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_sql::patterns::{StateMachine, Transition, Value};
//! # let dir = std::env::temp_dir().join(format!("idem-patterns-doc-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir)?;
//! # let url = format!("sqlite://{}", dir.join("doc.db").display());
//! let store = idem_sqlite::SqliteStore::connect(&url, Default::default()).await?;
//! sqlx::query("CREATE TABLE orders (id TEXT PRIMARY KEY, status TEXT NOT NULL)")
//!     .execute(store.pool()).await?;
//! sqlx::query("INSERT INTO orders VALUES ('o1', 'pending')").execute(store.pool()).await?;
//! let orders = StateMachine::new("orders", &["id"], "status")?.allow("pending", &["confirmed"]);
//!
//! use idem_core::KeyStore;
//! let mut tx = store.begin().await?;
//! let key = [Value::Text("o1")];
//! assert_eq!(orders.transition(&mut tx, &key, "confirmed", &[]).await?, Transition::Moved);
//! // The retry of the same transition changes nothing and says so.
//! assert_eq!(orders.transition(&mut tx, &key, "confirmed", &[]).await?, Transition::AlreadyThere);
//! store.commit(tx).await?;
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(()) }
//! ```

use idem_core::{BoxFuture, StoreError};
use idem_sql::patterns::{self, PatternExec, Value};

use crate::{SqliteDialect, SqliteTx};

impl PatternExec for SqliteTx {
    fn fetch_text<'a>(
        &'a mut self,
        sql: &'a str,
        binds: &'a [Value<'a>],
    ) -> BoxFuture<'a, Result<Option<String>, StoreError>> {
        Box::pin(patterns::fetch_text::<SqliteDialect>(self, sql, binds))
    }

    fn fetch_int<'a>(
        &'a mut self,
        sql: &'a str,
        binds: &'a [Value<'a>],
    ) -> BoxFuture<'a, Result<Option<i64>, StoreError>> {
        Box::pin(patterns::fetch_int::<SqliteDialect>(self, sql, binds))
    }

    fn execute<'a>(
        &'a mut self,
        sql: &'a str,
        binds: &'a [Value<'a>],
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(patterns::execute::<SqliteDialect>(self, sql, binds))
    }
}
