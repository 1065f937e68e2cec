//! The key transaction's own messages: what a backend writes into them
//! (values of every kind, stored and replayed exactly), and how the
//! transaction ends when business code is cancelled or removes the claimed
//! record under it. Both backends send `BEGIN` with the claim and the
//! record with `COMMIT`, each in one message; these checks hold whatever
//! the way.

use std::time::Duration;

use idem_core::{BoxError, Completion, Engine, KeyStore, Outcome, Policy, Scope, StoredResponse};

use crate::keys::{Count, Insert};
use crate::support::{answered, fingerprint, response, scope};

/// Values in the claim's and the record's messages — quotes, backslashes,
/// SQL, every byte, non-ASCII, in the key, the body, the headers and the
/// resource — are stored and replayed exactly, in both claim modes, and
/// nothing else runs.
pub async fn values_in_the_key_messages_round_trip_exactly<S: KeyStore>(store: S) {
    let engine = Engine::new(store);
    let body: Vec<u8> = (0u8..=255)
        .chain(*b"'; DROP TABLE idem_keys; --\\")
        .collect();
    let stored = StoredResponse {
        status: 201,
        headers: vec![
            ("x-quote".into(), "it's \\'; COMMIT; --".into()),
            ("x-unicode".into(), "ünïcödé ✓ \u{1F600}".into()),
        ],
        body,
    };
    let completion = Completion::completed(stored.clone()).with_resource("o'k\\", "id';--");
    let mut scopes = Vec::new();
    for (key, policy) in [
        (r#"p'\x';DROP-TABLE"--"#, Policy::default()),
        (r#"o'\x';DROP-TABLE"--"#, Policy::default().optimistic()),
    ] {
        let s = Scope::new(
            // Tenants and operations are letters, digits and `._:@-/`.
            idem_core::Tenant::new("t-1@x.y:z").unwrap(),
            idem_core::Operation::new("op/x:y.z-w").unwrap(),
            idem_core::IdempotencyKey::new(key).unwrap(),
        );
        let fp = fingerprint(r#"{"q":"'\\"}"#);
        for expect_executed in [true, false] {
            let done = completion.clone();
            let out = engine
                .execute(&s, &fp, &policy, |_| {
                    Box::pin(async move { Ok::<_, BoxError>(done) })
                })
                .await
                .unwrap();
            let (executed, got) = answered(out);
            assert_eq!(executed, expect_executed, "executed once: {key}");
            assert_eq!(got.as_ref(), Some(&stored), "the same bytes back: {key}");
        }
        let record = engine.store().fetch(&s).await.unwrap().unwrap();
        assert_eq!(record.response.as_ref(), Some(&stored), "stored: {key}");
        assert_eq!(record.fingerprint, fp, "fingerprint stored: {key}");
        let resource = record.resource.unwrap();
        assert_eq!(
            (resource.kind.as_str(), resource.id.as_str()),
            ("o'k\\", "id';--"),
            "resource stored: {key}"
        );
        scopes.push(s);
    }
    // The SQL in the values ran nowhere: the records are still there.
    for s in &scopes {
        assert!(engine.store().fetch(s).await.unwrap().is_some());
    }
}

/// A key transaction dropped while open (the caller cancelled during
/// business code) is rolled back, in both claim modes; the next claim of
/// the same key — on a store with one writer, behind the rollback — runs
/// the operation afresh, once.
pub async fn a_dropped_key_transaction_rolls_back<S: KeyStore>(
    store: S,
    insert: Insert<S::Tx>,
    count: Count<S>,
) {
    let engine = Engine::new(store);
    let s = scope("t1", "cancelled");
    let fp = fingerprint("{}");
    for policy in [Policy::default(), Policy::default().optimistic()] {
        let cancelled = tokio::time::timeout(
            Duration::from_millis(300),
            engine.execute(&s, &fp, &policy, move |tx| {
                Box::pin(async move {
                    insert(tx, "cancelled").await?;
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    Ok::<_, BoxError>(Completion::completed(response(201, "{}")))
                })
            }),
        )
        .await;
        assert!(cancelled.is_err(), "the operation was cancelled");
    }
    let next = engine
        .execute(&s, &fp, &Policy::default(), move |tx| {
            Box::pin(async move {
                insert(tx, "cancelled").await?;
                Ok::<_, BoxError>(Completion::completed(response(201, "{}")))
            })
        })
        .await;
    assert!(
        matches!(next, Ok(Outcome::Executed(_))),
        "the key is free again after the rollback: {next:?}"
    );
    assert_eq!(
        count(engine.store()).await,
        1,
        "the cancelled inserts were rolled back; the retry's committed"
    );
}

/// The record goes with `COMMIT`: when the claimed record is no longer
/// pending (business code removed it with `forget`), the message fails
/// before its `COMMIT` — nothing of the operation commits, the error says
/// why, and the next key is served as before.
pub async fn a_record_no_longer_pending_commits_nothing<S: KeyStore>(
    store: S,
    insert: Insert<S::Tx>,
    forget: Insert<S::Tx>,
    count: Count<S>,
) {
    let engine = Engine::new(store);
    let out = engine
        .execute(
            &scope("t1", "gone"),
            &fingerprint("{}"),
            &Policy::default(),
            move |tx| {
                Box::pin(async move {
                    insert(tx, "gone").await?;
                    forget(tx, "gone").await?;
                    Ok::<_, BoxError>(Completion::completed(response(201, "{}")))
                })
            },
        )
        .await;
    let e = out.unwrap_err();
    assert!(e.to_string().contains("no longer pending"), "{e}");
    assert_eq!(count(engine.store()).await, 0, "nothing of it committed");
    let next = engine
        .execute(
            &scope("t1", "after-gone"),
            &fingerprint("{}"),
            &Policy::default(),
            move |tx| {
                Box::pin(async move {
                    insert(tx, "after-gone").await?;
                    Ok::<_, BoxError>(Completion::completed(response(201, "{}")))
                })
            },
        )
        .await;
    assert!(matches!(next, Ok(Outcome::Executed(_))), "{next:?}");
    assert_eq!(count(engine.store()).await, 1);
}

/// Large stored answers (a backend may send them apart from the statement
/// text) are stored and replayed exactly in both claim modes, and a large
/// record that can no longer be stored commits nothing.
pub async fn large_answers_are_stored_exactly<S: KeyStore>(
    store: S,
    insert: Insert<S::Tx>,
    forget: Insert<S::Tx>,
    count: Count<S>,
) {
    let engine = Engine::new(store);
    let body: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 256) as u8).collect();
    let stored = StoredResponse {
        status: 201,
        headers: vec![("x-note".into(), "it's \\ ✓".into())],
        body,
    };
    for (key, policy) in [
        ("large-p", Policy::default()),
        ("large-o", Policy::default().optimistic()),
    ] {
        let s = scope("t1", key);
        for expect_executed in [true, false] {
            let done = Completion::completed(stored.clone());
            let out = engine
                .execute(&s, &fingerprint("{}"), &policy, move |tx| {
                    Box::pin(async move {
                        insert(tx, key).await?;
                        Ok::<_, BoxError>(done)
                    })
                })
                .await
                .unwrap();
            let (executed, got) = answered(out);
            assert_eq!(executed, expect_executed, "executed once: {key}");
            assert_eq!(got.as_ref(), Some(&stored), "the same bytes back: {key}");
        }
    }
    assert_eq!(count(engine.store()).await, 2, "one row per key");
    let gone = engine
        .execute(
            &scope("t1", "large-gone"),
            &fingerprint("{}"),
            &Policy::default(),
            move |tx| {
                let done = Completion::completed(stored.clone());
                Box::pin(async move {
                    insert(tx, "large-gone").await?;
                    forget(tx, "large-gone").await?;
                    Ok::<_, BoxError>(done)
                })
            },
        )
        .await;
    let e = gone.unwrap_err();
    assert!(e.to_string().contains("no longer pending"), "{e}");
    assert_eq!(count(engine.store()).await, 2, "nothing of it committed");
}
