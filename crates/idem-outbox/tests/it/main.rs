//! The `Outbox` entry point on real databases: a fresh SQLite file and a fresh
//! PostgreSQL database per test (`cargo xtask test` starts the server).
#![allow(clippy::unwrap_used, missing_docs)]

use std::time::Duration;

use idem_core::ManualClock;
use idem_core::outbox::{OutboxMessage, OutboxStore, OutboxWriter, Topic};
use idem_outbox::Outbox;

fn message(key: &str) -> OutboxMessage {
    OutboxMessage::new(Topic::new("orders.shipped").unwrap(), key, b"{}".to_vec()).unwrap()
}

/// A message enqueued through `Outbox` in a committed transaction is
/// claimable from the outbox's time on; one in a rolled-back transaction
/// never is.
async fn committed_is_claimable_rolled_back_is_not<S: OutboxWriter + OutboxStore>(store: S) {
    let clock = ManualClock::new(1_000_000);
    let outbox = Outbox::with_clock(store.clone(), clock.clone());

    let mut tx = store.begin().await.unwrap();
    let kept = outbox.enqueue(&mut tx, &message("kept")).await.unwrap();
    store.commit(tx).await.unwrap();

    let mut tx = store.begin().await.unwrap();
    let lost = outbox.enqueue(&mut tx, &message("lost")).await.unwrap();
    store.rollback(tx).await.unwrap();

    let lease = Duration::from_secs(30);
    // Stamped with the outbox's clock: not available before its time.
    assert!(
        store
            .claim_batch(999_999, lease, 10)
            .await
            .unwrap()
            .is_empty()
    );
    clock.advance(Duration::from_secs(1));
    let claimed = store.claim_batch(1_001_000, lease, 10).await.unwrap();
    let ids: Vec<i64> = claimed.iter().map(|r| r.id).collect();
    assert_eq!(
        ids,
        vec![kept],
        "the rolled-back message {lost} is not in the outbox"
    );
    assert_eq!(claimed[0].key, "kept");
    assert_eq!(claimed[0].created_at_ms, 1_000_000);
}

mod sqlite {
    use idem_sqlite::{SqliteConfig, SqliteStore};
    use idem_testkit::TempDir;

    #[tokio::test]
    async fn committed_is_claimable_rolled_back_is_not() {
        let dir = TempDir::new("outbox-it");
        let store = SqliteStore::connect(&dir.sqlite_url(), SqliteConfig::default())
            .await
            .unwrap();
        store.migrate().await.unwrap();
        super::committed_is_claimable_rolled_back_is_not(store).await;
    }
}

mod postgres {
    use idem_postgres::{PgConfig, PgStore};
    use idem_testkit::PgDatabase;

    #[tokio::test]
    async fn committed_is_claimable_rolled_back_is_not() {
        let db = PgDatabase::create("idem_outbox_it").await;
        let store = PgStore::connect(&db.url, PgConfig::default())
            .await
            .unwrap();
        store.migrate().await.unwrap();
        super::committed_is_claimable_rolled_back_is_not(store).await;
    }
}
