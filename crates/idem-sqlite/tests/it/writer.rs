//! The key transactions on the store's writer connection: what business
//! code may do on it, what a transaction left behind costs the next one,
//! and values bound across the statements of one message.

use std::time::Duration;

use idem_conformance as c;
use idem_core::{Completion, Engine, Error, KeyStore, Outcome, Policy, StoreError};
use idem_sqlite::{SqliteConfig, SqliteStore};

use crate::{count, db};

fn payment(
    id: &'static str,
) -> sqlx::query::Query<'static, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'static>> {
    sqlx::query("INSERT INTO payments (id, amount) VALUES ($1, 1)").bind(id)
}

async fn ok(
    engine: &Engine<SqliteStore>,
    key: &'static str,
) -> Result<Outcome<Completion>, Error<sqlx::Error>> {
    engine
        .execute(
            &c::scope("t1", key),
            &c::fingerprint("{}"),
            &Policy::default(),
            |tx| {
                Box::pin(async move {
                    payment(key).execute(&mut **tx).await?;
                    Ok::<_, sqlx::Error>(Completion::completed(c::response(201, "{}")))
                })
            },
        )
        .await
}

/// Business code that opens a transaction inside Idem's gets a savepoint,
/// as inside a sqlx `Transaction`: its rollback undoes only its part, its
/// commit commits nothing until Idem's COMMIT, and a failing operation
/// undoes everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_inside_the_key_transaction_is_a_savepoint() {
    let db = db().await;
    let engine = Engine::new(db.store.clone());
    let fp = c::fingerprint("{}");
    let out = engine
        .execute(&c::scope("t1", "nested"), &fp, &Policy::default(), |tx| {
            Box::pin(async move {
                payment("outer").execute(&mut **tx).await?;
                let mut inner = sqlx::Connection::begin(&mut **tx).await?;
                payment("undone").execute(&mut *inner).await?;
                inner.rollback().await?;
                let mut inner = sqlx::Connection::begin(&mut **tx).await?;
                payment("kept").execute(&mut *inner).await?;
                inner.commit().await?;
                // A savepoint left open is rolled back (sqlx queues it).
                let mut inner = sqlx::Connection::begin(&mut **tx).await?;
                payment("dropped").execute(&mut *inner).await?;
                drop(inner);
                Ok::<_, sqlx::Error>(Completion::completed(c::response(201, "{}")))
            })
        })
        .await
        .unwrap();
    assert!(matches!(out, Outcome::Executed(_)));
    let failed = engine
        .execute(
            &c::scope("t1", "nested-fails"),
            &fp,
            &Policy::default(),
            |tx| {
                Box::pin(async move {
                    let mut inner = sqlx::Connection::begin(&mut **tx).await?;
                    payment("inner-of-failed").execute(&mut *inner).await?;
                    inner.commit().await?;
                    Err::<Completion, _>(sqlx::Error::Protocol("the operation fails".into()))
                })
            },
        )
        .await;
    assert!(failed.is_err());
    let ids: Vec<String> = sqlx::query_scalar("SELECT id FROM payments ORDER BY id")
        .fetch_all(db.store.pool())
        .await
        .unwrap();
    assert_eq!(ids, ["kept", "outer"]);
    let record = db
        .store
        .fetch(&c::scope("t1", "nested-fails"))
        .await
        .unwrap();
    assert!(record.is_none());
}

/// Business code that leaves a savepoint open for good (a forgotten sqlx
/// transaction) still commits with the key (Idem's COMMIT ends it), and the
/// next keys — savepoints included — work as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_savepoint_left_open_commits_with_the_key_and_later_keys_work() {
    let db = db().await;
    let engine = Engine::new(db.store.clone());
    let out = engine
        .execute(
            &c::scope("t1", "leaky"),
            &c::fingerprint("{}"),
            &Policy::default(),
            |tx| {
                Box::pin(async move {
                    let mut inner = sqlx::Connection::begin(&mut **tx).await?;
                    payment("leaky").execute(&mut *inner).await?;
                    std::mem::forget(inner);
                    Ok::<_, sqlx::Error>(Completion::completed(c::response(201, "{}")))
                })
            },
        )
        .await
        .unwrap();
    assert!(matches!(out, Outcome::Executed(_)));
    assert!(matches!(
        ok(&engine, "after-leaky").await,
        Ok(Outcome::Executed(_))
    ));
    assert_eq!(count(&db.store).await, 2);
    let nested = engine
        .execute(
            &c::scope("t1", "nested-after"),
            &c::fingerprint("{}"),
            &Policy::default(),
            |tx| {
                Box::pin(async move {
                    let mut inner = sqlx::Connection::begin(&mut **tx).await?;
                    payment("undone-after").execute(&mut *inner).await?;
                    inner.rollback().await?;
                    Ok::<_, sqlx::Error>(Completion::completed(c::response(201, "{}")))
                })
            },
        )
        .await;
    assert!(matches!(nested, Ok(Outcome::Executed(_))), "{nested:?}");
    assert_eq!(
        count(&db.store).await,
        2,
        "the new writer's savepoints work"
    );
}

/// Another connection holding the database's write lock past the busy
/// timeout makes a claim `Unavailable` (nothing claimed, nothing run); once
/// the lock is free, the writer claims as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_behind_a_foreign_write_lock_is_unavailable_then_recovers() {
    let dir = idem_testkit::TempDir::new("sqlite-writer");
    let config = SqliteConfig {
        busy_timeout: Duration::from_millis(200),
        ..SqliteConfig::default()
    };
    let store = SqliteStore::connect(&dir.sqlite_url(), config)
        .await
        .unwrap();
    store.migrate().await.unwrap();
    sqlx::raw_sql("CREATE TABLE payments (id TEXT PRIMARY KEY, amount INTEGER NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    let engine = Engine::new(store.clone());
    assert!(matches!(
        ok(&engine, "before").await,
        Ok(Outcome::Executed(_))
    ));
    let mut foreign = store.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
    sqlx::query("INSERT INTO payments (id, amount) VALUES ('foreign', 1)")
        .execute(&mut *foreign)
        .await
        .unwrap();
    for policy in [Policy::default(), Policy::default().optimistic()] {
        let ran = std::sync::atomic::AtomicBool::new(false);
        let out = engine
            .execute(
                &c::scope("t1", "blocked"),
                &c::fingerprint("{}"),
                &policy,
                |_| {
                    ran.store(true, std::sync::atomic::Ordering::SeqCst);
                    Box::pin(async {
                        Ok::<_, sqlx::Error>(Completion::completed(c::response(201, "{}")))
                    })
                },
            )
            .await;
        assert!(
            matches!(out, Err(Error::Store(StoreError::Unavailable { .. }))),
            "{:?}: {out:?}",
            policy.mode
        );
        assert!(
            !ran.load(std::sync::atomic::Ordering::SeqCst),
            "nothing ran"
        );
    }
    foreign.rollback().await.unwrap();
    let out = ok(&engine, "blocked").await;
    assert!(matches!(out, Ok(Outcome::Executed(_))), "{out:?}");
    assert_eq!(count(&store).await, 2);
}
