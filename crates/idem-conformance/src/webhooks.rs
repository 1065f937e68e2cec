//! The [`WebhookStore`] checks: receipts stored once, claims in entity
//! order, counts, failures replayed and collected, content dedupe.

use idem_core::inbox::{InboxStore, MessageId, Subscriber};
use idem_core::webhooks::{
    Accepted, Finish, NewReceipt, Receipt, ReceiptState, Requeue, WebhookStore,
};

use crate::support::{LEASE, NOW};

pub(crate) fn receipt(endpoint: &str, delivery: &str, entity: Option<(&str, i64)>) -> NewReceipt {
    NewReceipt {
        endpoint: endpoint.into(),
        delivery_id: delivery.into(),
        event_type: Some("push".into()),
        headers: vec![("x-github-delivery".into(), delivery.into())],
        body: format!(r#"{{"delivery":"{delivery}"}}"#).into_bytes(),
        entity_id: entity.map(|(e, _)| e.to_owned()),
        entity_version: entity.map(|(_, v)| v),
        content_sha256: None,
    }
}

/// A delivery is stored once per endpoint, with its inbox record, byte for
/// byte; a repeat is a duplicate that changes nothing.
pub async fn webhook_receipts_are_stored_once<S: WebhookStore + InboxStore>(store: S) {
    let r = receipt("github", "d-1", None);
    assert_eq!(
        store.accept(&r, NOW, NOW + 1_000).await.unwrap(),
        Accepted::New
    );
    let again = NewReceipt {
        body: b"different".to_vec(),
        ..r.clone()
    };
    assert_eq!(
        store.accept(&again, NOW + 5, NOW + 1_000).await.unwrap(),
        Accepted::Duplicate
    );
    let stored = store.get_receipt("github", "d-1").await.unwrap().unwrap();
    assert_eq!(stored.receipt, r, "the first delivery, unchanged");
    assert_eq!(
        (stored.state, stored.received_at_ms),
        (ReceiptState::Received, NOW)
    );
    let inbox = Subscriber::new("webhook:github").unwrap();
    assert!(
        store
            .seen(&inbox, &MessageId::new("d-1").unwrap())
            .await
            .unwrap()
    );
    assert_eq!(
        store
            .accept(&receipt("stripe", "d-1", None), NOW, NOW + 1_000)
            .await
            .unwrap(),
        Accepted::New,
        "endpoints are independent"
    );
    assert!(store.get_receipt("github", "nope").await.unwrap().is_none());
}

/// One entity's receipts are handed out one at a time in arrival order;
/// processing moves the entity's newest version up; leases expire.
pub async fn webhook_claims_keep_entity_order<S: WebhookStore>(store: S) {
    for r in [
        receipt("gh", "a-v2", Some(("A", 2))),
        receipt("gh", "a-v1", Some(("A", 1))),
        receipt("gh", "b-v1", Some(("B", 1))),
        receipt("gh", "plain", None),
        receipt("other", "a-v1", Some(("A", 1))),
    ] {
        store.accept(&r, NOW, NOW + 100_000).await.unwrap();
    }
    let ids = |v: &[Receipt]| {
        v.iter()
            .map(|r| format!("{}/{}", r.receipt.endpoint, r.receipt.delivery_id))
            .collect::<Vec<_>>()
    };
    let first = store.claim_receipts("gh", NOW, LEASE, 10).await.unwrap();
    assert_eq!(
        ids(&first),
        ["gh/a-v2", "gh/b-v1", "gh/plain"],
        "one endpoint's receipts only"
    );
    assert_eq!(
        ids(&store.claim_receipts("gh", NOW, LEASE, 10).await.unwrap()),
        Vec::<String>::new(),
        "leased"
    );
    assert_eq!(
        ids(&store.claim_receipts("other", NOW, LEASE, 10).await.unwrap()),
        ["other/a-v1"],
        "endpoints are claimed separately; the same entity id elsewhere is another entity"
    );
    assert_eq!(store.newest_version("gh", "A").await.unwrap(), None);
    store
        .finish(first[0].id, &Finish::Processed, NOW + 1)
        .await
        .unwrap();
    assert_eq!(store.newest_version("gh", "A").await.unwrap(), Some(2));
    assert_eq!(
        store.newest_version("other", "A").await.unwrap(),
        None,
        "per endpoint"
    );
    let next = store.claim_receipts("gh", NOW, LEASE, 10).await.unwrap();
    assert_eq!(
        ids(&next),
        ["gh/a-v1"],
        "A's second delivery after the first finished"
    );
    store
        .finish(next[0].id, &Finish::Stale, NOW + 2)
        .await
        .unwrap();
    assert_eq!(
        store.newest_version("gh", "A").await.unwrap(),
        Some(2),
        "stale moves nothing"
    );
    let stale = store.get_receipt("gh", "a-v1").await.unwrap().unwrap();
    assert_eq!(
        (stale.state, stale.finished_at_ms, stale.attempts),
        (ReceiptState::Stale, Some(NOW + 2), 0),
        "a stale receipt is finished without a handler run"
    );
    let processed = store.get_receipt("gh", "a-v2").await.unwrap().unwrap();
    assert_eq!(
        (
            processed.state,
            processed.finished_at_ms,
            processed.attempts
        ),
        (ReceiptState::Processed, Some(NOW + 1), 1),
        "the successful run counts"
    );
    let end = NOW + LEASE.as_millis() as i64;
    let back = store.claim_receipts("gh", end, LEASE, 10).await.unwrap();
    assert_eq!(
        ids(&back),
        ["gh/b-v1", "gh/plain"],
        "expired leases come back"
    );
    assert_eq!(
        ids(&store.claim_receipts("other", end, LEASE, 1).await.unwrap()),
        ["other/a-v1"]
    );
}

/// Receipts are counted per endpoint and state, pairs with none left out.
pub async fn webhook_receipts_are_counted_by_endpoint_and_state<S: WebhookStore>(store: S) {
    assert_eq!(store.count_receipts().await.unwrap(), vec![], "none yet");
    for (endpoint, delivery) in [("gh", "1"), ("gh", "2"), ("gh", "3"), ("other", "1")] {
        let r = receipt(endpoint, delivery, None);
        assert_eq!(
            store.accept(&r, NOW, NOW + 1_000).await.unwrap(),
            Accepted::New
        );
    }
    let claimed = store.claim_receipts("gh", NOW, LEASE, 1).await.unwrap();
    store
        .finish(claimed[0].id, &Finish::Processed, NOW + 1)
        .await
        .unwrap();
    assert_eq!(
        store.count_receipts().await.unwrap(),
        vec![
            ("gh".to_owned(), ReceiptState::Processed, 1),
            ("gh".to_owned(), ReceiptState::Received, 2),
            ("other".to_owned(), ReceiptState::Received, 1),
        ]
    );
}

/// Failures retry later, then die; an operator's replay requeues failed and
/// dead receipts and leaves finished ones alone; GC deletes expired receipts.
pub async fn webhook_failures_replay_and_gc<S: WebhookStore>(store: S) {
    store
        .accept(&receipt("gh", "r", None), NOW, NOW + 10_000)
        .await
        .unwrap();
    let r = store
        .claim_receipts("gh", NOW, LEASE, 10)
        .await
        .unwrap()
        .remove(0);
    let retry = Finish::Retry {
        error: "upstream 503".into(),
        at_ms: NOW + 1_000,
    };
    store.finish(r.id, &retry, NOW).await.unwrap();
    assert!(
        store
            .claim_receipts("gh", NOW + 999, LEASE, 10)
            .await
            .unwrap()
            .is_empty()
    );
    let failed = store.get_receipt("gh", "r").await.unwrap().unwrap();
    assert_eq!(
        (failed.attempts, failed.finished_at_ms),
        (1, None),
        "a retry is not finished"
    );
    let again = store
        .claim_receipts("gh", NOW + 1_000, LEASE, 10)
        .await
        .unwrap()
        .remove(0);
    assert_eq!((again.state, again.attempts), (ReceiptState::Failed, 1));
    assert_eq!(again.last_error.as_deref(), Some("upstream 503"));
    store
        .finish(
            again.id,
            &Finish::Dead {
                error: "upstream 400".into(),
            },
            NOW + 1_001,
        )
        .await
        .unwrap();
    let dead = store.get_receipt("gh", "r").await.unwrap().unwrap();
    assert_eq!(
        (dead.state, dead.attempts, dead.finished_at_ms),
        (ReceiptState::Dead, 2, Some(NOW + 1_001)),
        "a dead receipt is finished"
    );
    assert_eq!(
        store
            .list_receipts(Some("gh"), Some(ReceiptState::Dead), 10)
            .await
            .unwrap()
            .len(),
        1
    );
    assert!(
        store
            .claim_receipts("gh", NOW + 5_000, LEASE, 10)
            .await
            .unwrap()
            .is_empty(),
        "dead stays dead"
    );
    assert_eq!(
        store.replay_receipt("gh", "r", NOW + 5_000).await.unwrap(),
        Requeue::Requeued
    );
    assert_eq!(
        store.replay_receipt("gh", "r", NOW + 5_000).await.unwrap(),
        Requeue::AlreadyQueued
    );
    let requeued = store
        .claim_receipts("gh", NOW + 5_000, LEASE, 10)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(
        (requeued.state, requeued.attempts, requeued.finished_at_ms),
        (ReceiptState::Received, 0, None),
        "a replay starts afresh"
    );
    store
        .finish(requeued.id, &Finish::Processed, NOW + 5_001)
        .await
        .unwrap();
    assert_eq!(
        store.replay_receipt("gh", "r", NOW + 6_000).await.unwrap(),
        Requeue::AlreadyFinished(ReceiptState::Processed),
        "a processed receipt is not run twice"
    );
    assert_eq!(
        store.replay_receipt("gh", "missing", NOW).await.unwrap(),
        Requeue::NotFound
    );
    store
        .accept(
            &receipt("gh", "young", Some(("E", 1))),
            NOW + 9_000,
            NOW + 100_000,
        )
        .await
        .unwrap();
    assert_eq!(store.list_receipts(None, None, 10).await.unwrap().len(), 2);
    assert_eq!(
        store.purge_expired_receipts(NOW + 9_999, 10).await.unwrap(),
        0
    );
    assert_eq!(
        store
            .purge_expired_receipts(NOW + 10_000, 10)
            .await
            .unwrap(),
        1
    );
    assert!(store.get_receipt("gh", "r").await.unwrap().is_none());
    assert!(store.get_receipt("gh", "young").await.unwrap().is_some());
}

fn sha256(body: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(body).into()
}

/// A receipt with a content hash is a duplicate of a stored receipt with the
/// same endpoint and hash, whatever its delivery id (a captured delivery
/// resent under a new id): nothing stored, no inbox record. Concurrent resends
/// store one. Another endpoint, or a receipt without a hash, is not affected;
/// once the first receipt is purged the content is new again.
pub async fn webhook_content_dedupe<S: WebhookStore + InboxStore>(store: S) {
    let body = br#"{"action":"opened","number":7}"#;
    let hashed = |endpoint: &str, delivery: &str| NewReceipt {
        body: body.to_vec(),
        content_sha256: Some(sha256(body)),
        ..receipt(endpoint, delivery, None)
    };
    assert_eq!(
        store
            .accept(&hashed("gh", "d-1"), NOW, NOW + 1_000)
            .await
            .unwrap(),
        Accepted::New
    );
    assert_eq!(
        store
            .accept(&hashed("gh", "d-2"), NOW + 1, NOW + 1_001)
            .await
            .unwrap(),
        Accepted::Duplicate,
        "the same content under a new delivery id"
    );
    assert!(store.get_receipt("gh", "d-2").await.unwrap().is_none());
    let inbox = Subscriber::new("webhook:gh").unwrap();
    assert!(
        !store
            .seen(&inbox, &MessageId::new("d-2").unwrap())
            .await
            .unwrap(),
        "no inbox record for the resend"
    );
    let stored = store.get_receipt("gh", "d-1").await.unwrap().unwrap();
    assert_eq!(stored.receipt, hashed("gh", "d-1"), "the hash is stored");
    assert_eq!(
        store
            .accept(&hashed("other", "d-2"), NOW, NOW + 1_000)
            .await
            .unwrap(),
        Accepted::New,
        "per endpoint"
    );
    for delivery in ["plain-1", "plain-2"] {
        let plain = NewReceipt {
            body: body.to_vec(),
            ..receipt("gh", delivery, None)
        };
        assert_eq!(
            store.accept(&plain, NOW, NOW + 1_000).await.unwrap(),
            Accepted::New,
            "without a hash, identical bodies are distinct deliveries"
        );
    }
    // Resends racing each other: exactly one is stored.
    let race_body = br#"{"action":"closed","number":8}"#;
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            let r = NewReceipt {
                body: race_body.to_vec(),
                content_sha256: Some(sha256(race_body)),
                ..receipt("gh", &format!("race-{i}"), None)
            };
            tokio::spawn(async move { store.accept(&r, NOW, NOW + 1_000).await.unwrap() })
        })
        .collect();
    let mut new = 0;
    for t in tasks {
        if t.await.unwrap() == Accepted::New {
            new += 1;
        }
    }
    assert_eq!(new, 1, "concurrent resends: one stored");
    assert_eq!(
        store
            .purge_expired_receipts(NOW + 1_000, 100)
            .await
            .unwrap(),
        5,
        "d-1, other/d-2, two plain ones and the race's winner"
    );
    assert_eq!(
        store
            .accept(&hashed("gh", "d-3"), NOW + 2_000, NOW + 3_000)
            .await
            .unwrap(),
        Accepted::New,
        "after the retention the content is new again"
    );
}
