//! Integration tests on a real PostgreSQL server, one fresh database per test.
//! `cargo xtask test` starts the server and sets `IDEM_TEST_POSTGRES_URL`.
#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::atomic::{AtomicU32, Ordering};

use idem_core::conformance as c;
use idem_core::{Completion, Engine, Error, KeyStore, Outcome, Policy};
use idem_postgres::{PgConfig, PgStore};
use sqlx::Connection;

fn admin_url() -> String {
    std::env::var("IDEM_TEST_POSTGRES_URL").unwrap_or_else(|_| {
        panic!("IDEM_TEST_POSTGRES_URL is not set: run the suite with `cargo xtask test`")
    })
}

struct TestDb {
    name: String,
    store: PgStore,
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Best effort: the throwaway server is deleted at the end of the run anyway.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                if let Ok(mut conn) = sqlx::PgConnection::connect(&admin_url()).await {
                    let _ = sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .execute(&mut conn)
                        .await;
                }
            });
        })
        .join();
    }
}

static SEQ: AtomicU32 = AtomicU32::new(0);

async fn db() -> TestDb {
    let admin = admin_url();
    let name = format!(
        "idem_it_{}_{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst)
    );
    let mut conn = sqlx::PgConnection::connect(&admin).await.unwrap();
    sqlx::raw_sql(&format!("CREATE DATABASE {name}"))
        .execute(&mut conn)
        .await
        .unwrap();
    let url = match admin.rsplit_once('/') {
        Some((base, _)) => format!("{base}/{name}"),
        None => panic!("IDEM_TEST_POSTGRES_URL must end in /<database>"),
    };
    let config = PgConfig {
        max_connections: 60,
        ..PgConfig::default()
    };
    let store = PgStore::connect(&url, config).await.unwrap();
    store.migrate().await.unwrap();
    store.migrate().await.unwrap(); // migrations are idempotent
    sqlx::raw_sql("CREATE TABLE payments (id TEXT PRIMARY KEY, amount BIGINT NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    TestDb { name, store }
}

macro_rules! conformance {
    ($($name:ident $(, $arg:expr)?;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let db = db().await;
            c::$name(db.store.clone() $(, $arg)?).await;
        }
    )*};
}

conformance! {
    replay_and_mismatch;
    failed_outcome_is_replayed;
    rollback_leaves_no_record;
    tenants_are_isolated;
    concurrent_claims_execute_once, 50;
    wait_is_bounded;
    expiry_and_gc;
    concurrent_takeover_of_expired_record_executes_once, 20;
}

async fn payments(store: &PgStore) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM payments")
        .fetch_one(store.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn business_write_commits_with_the_key_and_rolls_back_with_it() {
    let db = db().await;
    let engine = Engine::new(db.store.clone());
    let s = c::scope("t1", "atomic-1");
    let fp = c::fingerprint(r#"{"amount":5}"#);
    let failed = engine
        .execute(&s, &fp, &Policy::default(), |tx| {
            Box::pin(async move {
                sqlx::query("INSERT INTO payments VALUES ('p1', 5)")
                    .execute(&mut **tx)
                    .await
                    .unwrap();
                Err::<Completion, _>("card network timeout")
            })
        })
        .await;
    assert!(matches!(
        failed,
        Err(Error::Operation("card network timeout"))
    ));
    assert_eq!(
        payments(&db.store).await,
        0,
        "the payment must roll back with the key"
    );
    assert!(db.store.fetch(&s).await.unwrap().is_none());
    for expect_executed in [true, false] {
        let out = engine
            .execute(&s, &fp, &Policy::default(), |tx| {
                Box::pin(async move {
                    sqlx::query("INSERT INTO payments VALUES ('p1', 5)")
                        .execute(&mut **tx)
                        .await?;
                    Ok::<_, sqlx::Error>(Completion::completed(c::response(201, r#"{"id":"p1"}"#)))
                })
            })
            .await
            .unwrap();
        assert_eq!(matches!(out, Outcome::Executed(_)), expect_executed);
    }
    assert_eq!(payments(&db.store).await, 1, "exactly one payment");
}

#[tokio::test]
async fn unreachable_database_is_unavailable_and_retryable() {
    // Port 1 on loopback: nothing listens, the connection is refused.
    let config = PgConfig {
        acquire_timeout: std::time::Duration::from_secs(2),
        ..PgConfig::default()
    };
    let err = PgStore::connect("postgres://postgres@127.0.0.1:1/none", config)
        .await
        .unwrap_err();
    assert!(
        err.retryable(),
        "connection refused must be retryable: {err:?}"
    );
}
