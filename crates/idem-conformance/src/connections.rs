//! What every backend's pool must survive: callers cancelled in the middle
//! of a claim or a transaction's begin.

use std::time::Duration;

use idem_core::webhooks::{Accepted, WebhookStore};
use idem_core::{Completion, Engine, KeyStore, Outcome, Policy};

use crate::support::{NOW, fingerprint, response, scope};
use crate::webhooks::receipt;

/// Callers are cancelled at random points — a client hanging up, a deadline —
/// while claims and plain transactions begin, thousands of times. Afterwards
/// every connection of the pool must be clean: keys can be claimed and
/// committed at once, and autocommit writes (a webhook receipt is one
/// statement) are all durable. A begin left half-done would hold SQLite's
/// write lock forever, or leave a PostgreSQL connection inside a transaction
/// that silently swallows later writes.
pub async fn cancelled_calls_leave_connections_clean<S: KeyStore + WebhookStore>(store: S) {
    let engine = Engine::new(store.clone());
    let fp = fingerprint("{}");
    // A small linear congruential generator: deterministic, no dependency.
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        seed >> 33
    };
    for i in 0..3000 {
        // Mostly within a loopback round trip, where BEGIN is in flight.
        let cut = Duration::from_micros(next() % 600);
        if i % 2 == 0 {
            let key = format!("cancel-{i}");
            let scope = scope("t1", &key);
            let _ = tokio::time::timeout(cut, engine.begin(&scope, &fp, &Policy::default())).await;
        } else {
            let _ = tokio::time::timeout(cut, store.begin()).await;
        }
    }
    // Transactions whose caller went away finish in the background.
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Autocommit writes first: a connection left inside a transaction
    // would swallow them (a later claim on it could commit them by chance).
    for i in 0..200 {
        let r = receipt("github", &format!("after-{i}"), None);
        assert_eq!(
            store.accept(&r, NOW, NOW + 60_000).await.unwrap(),
            Accepted::New
        );
    }
    for i in 0..200 {
        assert!(
            store
                .get_receipt("github", &format!("after-{i}"))
                .await
                .unwrap()
                .is_some(),
            "receipt {i} was acknowledged as stored, so it is stored"
        );
    }
    for i in 0..20 {
        let key = format!("after-{i}");
        let outcome = tokio::time::timeout(
            Duration::from_secs(5),
            engine.execute(&scope("t1", &key), &fp, &Policy::default(), |_| {
                Box::pin(async {
                    Ok::<_, std::io::Error>(Completion::completed(response(201, "{}")))
                })
            }),
        )
        .await
        .expect("a claim after the storm does not wait for a lock held by a cancelled begin");
        assert!(
            matches!(outcome, Ok(Outcome::Executed(_))),
            "claim {i} after the storm: {outcome:?}"
        );
    }
}
