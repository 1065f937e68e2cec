//! The [`InboxStore`] checks: once per subscriber, concurrent duplicates,
//! collection of expired records.

use std::time::Duration;

use idem_core::inbox::{InboxStore, MessageId, Subscriber};

use crate::support::NOW;

fn subscriber(name: &str) -> Subscriber {
    Subscriber::new(name).unwrap()
}

/// An inbox record commits with its transaction: rolled back, the message is
/// new again; committed, a second record is a duplicate. Subscribers are
/// independent.
pub async fn inbox_records_once_per_subscriber<S: InboxStore>(store: S) {
    let (ledger, mailer) = (subscriber("ledger"), subscriber("mailer"));
    let id = MessageId::new("m-1").unwrap();
    let mut tx = store.begin().await.unwrap();
    assert!(
        store
            .record(&mut tx, &ledger, &id, NOW, NOW + 1_000)
            .await
            .unwrap()
    );
    store.rollback(tx).await.unwrap();
    assert!(
        !store.seen(&ledger, &id).await.unwrap(),
        "rolled back with its transaction"
    );
    let mut tx = store.begin().await.unwrap();
    assert!(
        store
            .record(&mut tx, &ledger, &id, NOW, NOW + 1_000)
            .await
            .unwrap()
    );
    store.commit(tx).await.unwrap();
    assert!(store.seen(&ledger, &id).await.unwrap());
    let mut tx = store.begin().await.unwrap();
    assert!(
        !store
            .record(&mut tx, &ledger, &id, NOW, NOW + 1_000)
            .await
            .unwrap(),
        "duplicate"
    );
    assert!(
        store
            .record(&mut tx, &mailer, &id, NOW, NOW + 1_000)
            .await
            .unwrap(),
        "other subscriber"
    );
    store.commit(tx).await.unwrap();
}

/// A duplicate arriving while the first is still in its transaction waits for
/// it, then sees the committed record.
pub async fn inbox_concurrent_duplicate_waits_then_skips<S: InboxStore>(store: S) {
    let sub = subscriber("ledger");
    let id = MessageId::new("m-race").unwrap();
    let mut first = store.begin().await.unwrap();
    assert!(
        store
            .record(&mut first, &sub, &id, NOW, NOW + 1_000)
            .await
            .unwrap()
    );
    let (s2, sub2, id2) = (store.clone(), sub.clone(), id.clone());
    let second = tokio::spawn(async move {
        let mut tx = s2.begin().await.unwrap();
        let fresh = s2
            .record(&mut tx, &sub2, &id2, NOW, NOW + 1_000)
            .await
            .unwrap();
        s2.rollback(tx).await.unwrap();
        fresh
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !second.is_finished(),
        "the duplicate waits for the first transaction"
    );
    store.commit(first).await.unwrap();
    assert!(!second.await.unwrap(), "and then sees a duplicate");
}

/// Expired inbox records are deleted in bounded batches; live ones stay.
pub async fn inbox_gc_deletes_expired_records<S: InboxStore>(store: S) {
    let sub = subscriber("ledger");
    let mut tx = store.begin().await.unwrap();
    for i in 0..5 {
        let id = MessageId::new(format!("old-{i}")).unwrap();
        store
            .record(&mut tx, &sub, &id, NOW, NOW + 10)
            .await
            .unwrap();
    }
    let live = MessageId::new("live").unwrap();
    store
        .record(&mut tx, &sub, &live, NOW, NOW + 1_000_000)
        .await
        .unwrap();
    store.commit(tx).await.unwrap();
    assert_eq!(store.purge_expired_inbox(NOW + 9, 10).await.unwrap(), 0);
    assert_eq!(store.purge_expired_inbox(NOW + 10, 3).await.unwrap(), 3);
    assert_eq!(store.purge_expired_inbox(NOW + 10, 3).await.unwrap(), 2);
    assert!(store.seen(&sub, &live).await.unwrap());
}

/// Log positions ([`PositionStore`](idem_core::position::PositionStore)):
/// stored with the transaction or not at all, per (group, topic,
/// partition), never moved backwards.
pub async fn positions_commit_with_the_transaction_and_never_move_back<S: InboxStore>(store: S) {
    use idem_core::position::Position;
    let at = |group: &str, partition: i32, offset: i64| Position {
        group: group.to_owned(),
        topic: "orders".to_owned(),
        partition,
        offset,
    };
    let save = |p: Position| {
        let store = store.clone();
        async move {
            let mut tx = store.begin().await.unwrap();
            store.save_position(&mut tx, &p).await.unwrap();
            tx
        }
    };
    let tx = save(at("billing", 0, 7)).await;
    store.rollback(tx).await.unwrap();
    assert!(
        store
            .positions("billing", "orders")
            .await
            .unwrap()
            .is_empty(),
        "a rolled-back position is not stored"
    );
    for p in [at("billing", 0, 7), at("billing", 1, 3), at("mail", 0, 1)] {
        let tx = save(p).await;
        store.commit(tx).await.unwrap();
    }
    let tx = save(at("billing", 0, 5)).await;
    store.commit(tx).await.unwrap();
    assert_eq!(
        store.positions("billing", "orders").await.unwrap(),
        vec![(0, 7), (1, 3)],
        "a lower offset leaves the stored one; groups are apart"
    );
    let tx = save(at("billing", 0, 8)).await;
    store.commit(tx).await.unwrap();
    assert_eq!(
        store.positions("billing", "orders").await.unwrap(),
        vec![(0, 8), (1, 3)]
    );
    assert!(
        store
            .positions("billing", "other")
            .await
            .unwrap()
            .is_empty()
    );
}
