//! The two backends as the same names in two modules (`sqlite_backend`,
//! `postgres_backend`): a store with a `ledger` table, an outbox writer, a
//! ledger handler. Shared by the broker adapters' tests (`idem-rabbitmq`
//! includes this file by path).

use std::time::Duration;

use idem_core::inbox::Subscriber;
use idem_core::outbox::{MessageId, OutboxMessage};
use idem_inbox::{Handler, Inbox};

/// The pieces that differ per backend, as the same names in two modules.
macro_rules! backend {
    ($modname:ident, $store:ty, $tx:ty, $outbox:path, $open:ident) => {
        pub mod $modname {
            use super::$open::{Guard, open, reopen};
            use super::*;
            use idem_core::{BoxFuture, KeyStore};
            use idem_inbox::{HandlerError, InboxBegun, InboxMessage};

            pub struct Db {
                pub store: $store,
                #[allow(dead_code)]
                pub db: Guard,
            }

            pub async fn setup() -> Db {
                let (store, db) = open().await;
                store.migrate().await.unwrap();
                sqlx::raw_sql("CREATE TABLE ledger (message_id TEXT NOT NULL)")
                    .execute(store.pool())
                    .await
                    .unwrap();
                Db { store, db }
            }

            /// A second pool on the same database (another process).
            #[allow(dead_code)]
            pub async fn connect(db: &Db) -> $store {
                reopen(&db.db).await
            }

            pub async fn enqueue(tx: &mut $tx, m: &OutboxMessage) -> i64 {
                $outbox(
                    &mut **tx,
                    m,
                    idem_core::Clock::now_ms(&idem_core::SystemClock),
                )
                .await
                .unwrap()
            }

            pub async fn write(store: &$store, messages: &[OutboxMessage]) -> Vec<i64> {
                let mut tx = store.begin().await.unwrap();
                let mut ids = Vec::new();
                for m in messages {
                    ids.push(enqueue(&mut tx, m).await);
                }
                store.commit(tx).await.unwrap();
                ids
            }

            /// The message ids in the ledger, one row per applied delivery.
            pub async fn ledger(store: &$store) -> Vec<String> {
                sqlx::query_scalar("SELECT message_id FROM ledger")
                    .fetch_all(store.pool())
                    .await
                    .unwrap()
            }

            /// Writes one ledger row per applied message; `reject` and `fail`
            /// payloads make it refuse or fail; `slow` makes its first
            /// delivery write its row and then hang past the handler timeout.
            pub struct Ledger;

            impl Handler<$tx> for Ledger {
                fn handle<'a>(
                    &'a self,
                    tx: &'a mut $tx,
                    m: &'a InboxMessage,
                ) -> BoxFuture<'a, Result<(), HandlerError>> {
                    Box::pin(async move {
                        match m.payload.as_slice() {
                            b"reject" => {
                                return Err(HandlerError::Reject("payload says reject".into()));
                            }
                            b"fail" => return Err(HandlerError::Retry("payload says fail".into())),
                            _ => {}
                        }
                        sqlx::query("INSERT INTO ledger (message_id) VALUES ($1)")
                            .bind(m.message_id.as_str())
                            .execute(&mut **tx)
                            .await
                            .map_err(|e| HandlerError::Retry(e.into()))?;
                        if m.payload.as_slice() == b"slow" && m.delivered == 1 {
                            tokio::time::sleep(Duration::from_secs(3)).await;
                        }
                        Ok(())
                    })
                }
            }

            /// One delivery of `id` through the inbox; whether it applied.
            #[allow(dead_code)]
            pub async fn apply_once(
                inbox: &Inbox<$store>,
                sub: &Subscriber,
                id: &MessageId,
            ) -> bool {
                let mut claim = match inbox.begin(sub, id).await.unwrap() {
                    InboxBegun::Duplicate => return false,
                    InboxBegun::Fresh(c) => c,
                };
                sqlx::query("INSERT INTO ledger (message_id) VALUES ($1)")
                    .bind(id.as_str())
                    .execute(&mut *claim.tx)
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
                inbox.commit(claim).await.unwrap() == idem_inbox::Committed::Applied
            }
        }
    };
}

pub mod sqlite_open {
    pub type Guard = idem_testkit::TempDir;
    pub async fn open() -> (idem_sqlite::SqliteStore, Guard) {
        let dir = idem_testkit::TempDir::new("nats-it");
        (reopen(&dir).await, dir)
    }
    pub async fn reopen(dir: &Guard) -> idem_sqlite::SqliteStore {
        idem_sqlite::SqliteStore::connect(&dir.sqlite_url(), Default::default())
            .await
            .unwrap()
    }
}

pub mod postgres_open {
    pub type Guard = idem_testkit::PgDatabase;
    pub async fn open() -> (idem_postgres::PgStore, Guard) {
        let db = idem_testkit::PgDatabase::create("idem_nats").await;
        (reopen(&db).await, db)
    }
    pub async fn reopen(db: &Guard) -> idem_postgres::PgStore {
        let config = idem_postgres::PgConfig {
            max_connections: 30,
            ..Default::default()
        };
        idem_postgres::PgStore::connect(&db.url, config)
            .await
            .unwrap()
    }
}

backend!(
    sqlite_backend,
    idem_sqlite::SqliteStore,
    idem_sqlite::SqliteTx,
    idem_sqlite::outbox::enqueue,
    sqlite_open
);
backend!(
    postgres_backend,
    idem_postgres::PgStore,
    idem_postgres::PgTx,
    idem_postgres::outbox::enqueue,
    postgres_open
);
