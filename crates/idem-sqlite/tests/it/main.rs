//! Integration tests on real SQLite files, one fresh file per test.
#![allow(clippy::unwrap_used, missing_docs)]

use idem_core::conformance as c;
use idem_core::{Completion, Engine, Error, KeyStore, Outcome, Policy};
use idem_sqlite::{SqliteConfig, SqliteStore};

struct TestDb {
    dir: std::path::PathBuf,
    store: SqliteStore,
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn db(name: &str) -> TestDb {
    let dir = std::env::temp_dir().join(format!("idem-sqlite-it-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}", dir.join("test.db").display());
    let store = SqliteStore::connect(&url, SqliteConfig::default())
        .await
        .unwrap();
    store.migrate().await.unwrap();
    store.migrate().await.unwrap(); // migrations are idempotent
    sqlx::raw_sql("CREATE TABLE payments (id TEXT PRIMARY KEY, amount INTEGER NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    TestDb { dir, store }
}

macro_rules! conformance {
    ($($name:ident $(, $arg:expr)?;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let db = db(stringify!($name)).await;
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

async fn payments(store: &SqliteStore) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM payments")
        .fetch_one(store.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn business_write_commits_with_the_key_and_rolls_back_with_it() {
    let db = db("atomic").await;
    let engine = Engine::new(db.store.clone());
    let s = c::scope("t1", "atomic-1");
    let fp = c::fingerprint(r#"{"amount":5}"#);
    // The operation writes a payment then fails: neither payment nor key survive.
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
    // The retry executes once; the next one replays without a second payment.
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
async fn in_memory_databases_are_refused() {
    let err = SqliteStore::connect("sqlite::memory:", SqliteConfig::default())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("key store error"), "{err}");
}
