//! The [`OutboxStore`] checks: messages commit with the transaction, order
//! per key, leases that expire and release, backoff then death, delays and
//! purges.

use idem_core::outbox::{OutboxMessage, OutboxRecord, OutboxStore, Topic};
use idem_core::{BoxFuture, KeyStore, StoreError};

use crate::support::{LEASE, NOW};

/// A backend's `enqueue`: writes a message in the given transaction.
pub type Enqueue<T> =
    for<'t> fn(&'t mut T, &'t OutboxMessage, i64) -> BoxFuture<'t, Result<i64, StoreError>>;

pub(crate) fn message(key: &str, body: &str) -> OutboxMessage {
    OutboxMessage::new(
        Topic::new("payments.created").unwrap(),
        key,
        body.as_bytes().to_vec(),
    )
    .unwrap()
}

async fn write<S: KeyStore + OutboxStore>(
    store: &S,
    enqueue: Enqueue<S::Tx>,
    messages: &[OutboxMessage],
) -> Vec<i64> {
    let mut tx = store.begin().await.unwrap();
    let mut ids = Vec::new();
    for m in messages {
        ids.push(enqueue(&mut tx, m, NOW).await.unwrap());
    }
    store.commit(tx).await.unwrap();
    ids
}

fn keys(batch: &[OutboxRecord]) -> Vec<String> {
    batch
        .iter()
        .map(|r| String::from_utf8(r.payload.clone()).unwrap())
        .collect()
}

/// A message written in a rolled-back transaction never exists; a committed
/// one comes back from a claim exactly as written.
pub async fn outbox_commits_with_the_transaction<S: KeyStore + OutboxStore>(
    store: S,
    enqueue: Enqueue<S::Tx>,
) {
    let lost = message("k", "rolled back");
    let mut tx = store.begin().await.unwrap();
    enqueue(&mut tx, &lost, NOW).await.unwrap();
    store.rollback(tx).await.unwrap();
    assert!(store.claim_batch(NOW, LEASE, 10).await.unwrap().is_empty());
    let kept = message("pay_1", "kept").header("trace-id", "t-1").unwrap();
    write(&store, enqueue, std::slice::from_ref(&kept)).await;
    let batch = store.claim_batch(NOW, LEASE, 10).await.unwrap();
    assert_eq!(batch.len(), 1);
    let r = &batch[0];
    assert_eq!(r.message_id, kept.message_id, "the id is the one written");
    assert_eq!(
        (r.topic.as_str(), r.key.as_str()),
        ("payments.created", "pay_1")
    );
    assert_eq!(r.payload, b"kept");
    assert_eq!(r.headers, kept.headers);
    assert_eq!((r.attempts, r.created_at_ms), (0, NOW));
}

/// Per key, only the earliest pending message is claimable; other keys are not
/// held back; a sent message releases the next one of its key.
pub async fn outbox_keeps_order_per_key<S: KeyStore + OutboxStore>(
    store: S,
    enqueue: Enqueue<S::Tx>,
) {
    write(
        &store,
        enqueue,
        &[
            message("a", "a1"),
            message("a", "a2"),
            message("b", "b1"),
            message("a", "a3"),
        ],
    )
    .await;
    let first = store.claim_batch(NOW, LEASE, 10).await.unwrap();
    assert_eq!(
        keys(&first),
        ["a1", "b1"],
        "one message per key, the earliest"
    );
    assert!(
        store.claim_batch(NOW, LEASE, 10).await.unwrap().is_empty(),
        "leased"
    );
    assert_eq!(store.mark_sent(&[first[0].id], NOW).await.unwrap(), 1);
    let next = store.claim_batch(NOW, LEASE, 10).await.unwrap();
    assert_eq!(keys(&next), ["a2"], "a2 follows a1 once a1 is sent");
    assert_eq!(
        store
            .mark_sent(&[first[1].id, next[0].id], NOW)
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        store.mark_sent(&[next[0].id], NOW).await.unwrap(),
        0,
        "already sent"
    );
    assert_eq!(
        keys(&store.claim_batch(NOW, LEASE, 10).await.unwrap()),
        ["a3"]
    );
}

/// A lease hides a claimed message until it ends (a crashed dispatcher's
/// messages come back); `release` gives it back without counting an attempt.
pub async fn outbox_leases_expire_and_release<S: KeyStore + OutboxStore>(
    store: S,
    enqueue: Enqueue<S::Tx>,
) {
    write(&store, enqueue, &[message("k", "m")]).await;
    let claimed = store.claim_batch(NOW, LEASE, 10).await.unwrap();
    assert_eq!(claimed.len(), 1);
    let end = NOW + LEASE.as_millis() as i64;
    assert!(
        store
            .claim_batch(end - 1, LEASE, 10)
            .await
            .unwrap()
            .is_empty()
    );
    let again = store.claim_batch(end, LEASE, 10).await.unwrap();
    assert_eq!(keys(&again), ["m"], "the lease ended: claimable again");
    store.release(&[again[0].id], end + 5_000).await.unwrap();
    assert!(
        store
            .claim_batch(end + 4_999, LEASE, 10)
            .await
            .unwrap()
            .is_empty()
    );
    let back = store.claim_batch(end + 5_000, LEASE, 10).await.unwrap();
    assert_eq!(back[0].attempts, 0, "a release is not an attempt");
}

/// A failed attempt backs off and keeps holding its key; a dead message no
/// longer holds it. The figures follow.
pub async fn outbox_failures_back_off_then_die<S: KeyStore + OutboxStore>(
    store: S,
    enqueue: Enqueue<S::Tx>,
) {
    write(
        &store,
        enqueue,
        &[message("k", "first"), message("k", "second")],
    )
    .await;
    let stats = store.stats().await.unwrap();
    assert_eq!(
        (stats.pending, stats.dead, stats.oldest_pending_ms),
        (2, 0, Some(NOW))
    );
    let first = store.claim_batch(NOW, LEASE, 10).await.unwrap().remove(0);
    store
        .mark_failed(first.id, "broker said no", NOW + 1_000, false)
        .await
        .unwrap();
    assert!(
        store
            .claim_batch(NOW + 999, LEASE, 10)
            .await
            .unwrap()
            .is_empty(),
        "backing off, and the second waits behind it"
    );
    let retry = store.claim_batch(NOW + 1_000, LEASE, 10).await.unwrap();
    assert_eq!(
        (keys(&retry), retry[0].attempts),
        (vec!["first".to_owned()], 1)
    );
    store
        .mark_failed(first.id, "broker said no", NOW + 2_000, true)
        .await
        .unwrap();
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.pending, stats.dead), (1, 1));
    assert_eq!(
        keys(&store.claim_batch(NOW + 1_000, LEASE, 10).await.unwrap()),
        ["second"],
        "a dead message does not hold its key"
    );
}

/// `available_at` holds a message back; purge deletes only sent messages, in
/// bounded batches.
pub async fn outbox_delays_and_purges<S: KeyStore + OutboxStore>(
    store: S,
    enqueue: Enqueue<S::Tx>,
) {
    write(
        &store,
        enqueue,
        &[message("later", "later").available_at_ms(NOW + 60_000)],
    )
    .await;
    assert!(store.claim_batch(NOW, LEASE, 10).await.unwrap().is_empty());
    let sent: Vec<OutboxMessage> = (0..5).map(|i| message(&format!("s{i}"), "s")).collect();
    let ids = write(&store, enqueue, &sent).await;
    assert_eq!(store.claim_batch(NOW, LEASE, 10).await.unwrap().len(), 5);
    store.mark_sent(&ids, NOW).await.unwrap();
    assert_eq!(
        store.purge_sent(NOW - 1, 10).await.unwrap(),
        0,
        "not old enough"
    );
    assert_eq!(store.purge_sent(NOW, 3).await.unwrap(), 3, "bounded batch");
    assert_eq!(store.purge_sent(NOW, 3).await.unwrap(), 2);
    assert_eq!(
        store.stats().await.unwrap().pending,
        1,
        "the delayed one is kept"
    );
    assert_eq!(
        keys(&store.claim_batch(NOW + 60_000, LEASE, 10).await.unwrap()),
        ["later"]
    );
}
