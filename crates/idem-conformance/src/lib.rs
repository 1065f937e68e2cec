//! # Idem backend conformance
//!
//! The behaviour every Idem backend must show, as reusable checks: a
//! [`KeyStore`] (claims, replay, mismatch, concurrency, bounded waits, expiry),
//! an [`OutboxStore`] (commit with the transaction, order per key, leases,
//! backoff, purge), an [`InboxStore`] (once per subscriber, concurrent
//! duplicates), a [`WebhookStore`] (stored once, entity order, replay,
//! content dedupe, cancellation) and a
//! [`RunStore`](idem_core::steps::RunStore) (runs created with their key,
//! fenced writes, takeovers only after the lease, claims never shared, the
//! send-once ledger).
//!
//! A backend runs each check against a real database in its integration
//! tests, the way `idem-sqlite` and `idem-postgres` do; each check takes a
//! store on an empty database (a fresh one per check) and panics with a
//! message naming the property that failed.
//!
//! ```no_run
//! # async fn run<S: idem_core::KeyStore>(fresh_store: impl Fn() -> S) {
//! idem_conformance::replay_and_mismatch(fresh_store()).await;
//! idem_conformance::rollback_leaves_no_record(fresh_store()).await;
//! idem_conformance::concurrent_claims_execute_once(fresh_store(), 16).await;
//! # }
//! ```
#![allow(clippy::unwrap_used)]

mod admin;
mod leased;
mod runs;
pub use admin::*;
pub use leased::*;
pub use runs::*;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::Clock;
use idem_core::inbox::{InboxStore, MessageId, Subscriber};
use idem_core::keys::Settled;
use idem_core::outbox::{OutboxMessage, OutboxRecord, OutboxStore, Topic};
use idem_core::webhooks::{
    Accepted, Finish, NewReceipt, Receipt, ReceiptState, Requeue, WebhookStore,
};
use idem_core::{
    Begun, BoxError, BoxFuture, Completion, Engine, Error, Fingerprint, FingerprintSpec, Finished,
    IdempotencyKey, KeyStore, ManualClock, Operation, Outcome, Policy, RecordState, RequestParts,
    Scope, StoreError, StoredResponse, Tenant,
};

/// A backend's `enqueue`: writes a message in the given transaction.
pub type Enqueue<T> =
    for<'t> fn(&'t mut T, &'t OutboxMessage, i64) -> BoxFuture<'t, Result<i64, StoreError>>;

/// Writes one business row with the given id in the claim's transaction.
pub type Insert<T> = for<'t> fn(&'t mut T, &'static str) -> BoxFuture<'t, Result<(), BoxError>>;
/// Counts the business rows, outside any claim.
pub type Count<S> = for<'s> fn(&'s S) -> BoxFuture<'s, i64>;

/// The scope of `key` for `tenant`, on the operation the checks use.
pub fn scope(tenant: &str, key: &str) -> Scope {
    Scope::new(
        Tenant::new(tenant).unwrap(),
        Operation::new("payments.create").unwrap(),
        IdempotencyKey::new(key).unwrap(),
    )
}

/// The fingerprint of a `POST` with this JSON body, as the checks compute it.
pub fn fingerprint(body: &str) -> Fingerprint {
    let op = Operation::new("payments.create").unwrap();
    FingerprintSpec::default().fingerprint(&RequestParts {
        method: "POST",
        operation: &op,
        target: "/v1/payments",
        json: true,
        body: body.as_bytes(),
    })
}

/// A JSON response to store.
pub fn response(status: u16, body: &str) -> StoredResponse {
    StoredResponse {
        status,
        headers: vec![("content-type".into(), "application/json".into())],
        body: body.as_bytes().to_vec(),
    }
}

/// Claim, complete, replay the same bytes; a different fingerprint is a
/// mismatch and leaves the record untouched.
pub async fn replay_and_mismatch<S: KeyStore>(store: S) {
    let engine = Engine::new(store);
    let s = scope("t1", "replay-1");
    let fp = fingerprint(r#"{"amount":1}"#);
    let policy = Policy::default();
    let Begun::Fresh(claimed) = engine.begin(&s, &fp, &policy).await.unwrap() else {
        panic!("first claim of a fresh key must be Fresh");
    };
    let done =
        Completion::completed(response(201, r#"{"id":"p1"}"#)).with_resource("payment", "p1");
    committed(engine.finish(claimed, &done).await.unwrap());
    let Begun::Replay(record) = engine.begin(&s, &fp, &policy).await.unwrap() else {
        panic!("second claim with the same fingerprint must replay");
    };
    assert_eq!(record.state, RecordState::Completed);
    assert_eq!(
        record.response.as_ref(),
        Some(&done.response),
        "replay must return the stored bytes"
    );
    assert_eq!(record.resource.as_ref().map(|r| r.id.as_str()), Some("p1"));
    let other = fingerprint(r#"{"amount":2}"#);
    assert!(
        matches!(
            engine.begin(&s, &other, &policy).await,
            Err(Error::FingerprintMismatch)
        ),
        "a different fingerprint must be a mismatch"
    );
    let after = engine.store().fetch(&s).await.unwrap().unwrap();
    assert_eq!(
        after, record,
        "a mismatch must leave the stored record untouched"
    );
}

/// A failed (contract-error) outcome is stored and replayed too.
pub async fn failed_outcome_is_replayed<S: KeyStore>(store: S) {
    let engine = Engine::new(store);
    let s = scope("t1", "failed-1");
    let fp = fingerprint("{}");
    let Begun::Fresh(c) = engine.begin(&s, &fp, &Policy::default()).await.unwrap() else {
        panic!("fresh key must be claimed");
    };
    committed(
        engine
            .finish(
                c,
                &Completion::failed(response(422, r#"{"type":"declined"}"#)),
            )
            .await
            .unwrap(),
    );
    let Begun::Replay(r) = engine.begin(&s, &fp, &Policy::default()).await.unwrap() else {
        panic!("failed outcome must replay");
    };
    assert_eq!(r.state, RecordState::Failed);
    assert_eq!(r.response.unwrap().status, 422);
}

/// Rolling back a claim leaves no record: the retry claims again.
pub async fn rollback_leaves_no_record<S: KeyStore>(store: S) {
    let engine = Engine::new(store);
    let s = scope("t1", "rollback-1");
    let fp = fingerprint("{}");
    let Begun::Fresh(c) = engine.begin(&s, &fp, &Policy::default()).await.unwrap() else {
        panic!("fresh key must be claimed");
    };
    engine.abort(c).await.unwrap();
    assert!(
        engine.store().fetch(&s).await.unwrap().is_none(),
        "rollback must remove the claim"
    );
    // Dropping a claim without finishing it (a panic, a cancelled future) also rolls back.
    let Begun::Fresh(c) = engine.begin(&s, &fp, &Policy::default()).await.unwrap() else {
        panic!("key must be claimable after a rollback");
    };
    drop(c);
    let Begun::Fresh(c) = engine.begin(&s, &fp, &Policy::default()).await.unwrap() else {
        panic!("key must be claimable after a dropped claim");
    };
    committed(
        engine
            .finish(c, &Completion::completed(response(201, "{}")))
            .await
            .unwrap(),
    );
    assert!(engine.store().fetch(&s).await.unwrap().is_some());
}

/// The same key in two tenants is two records.
pub async fn tenants_are_isolated<S: KeyStore>(store: S) {
    let engine = Engine::new(store);
    let fp = fingerprint("{}");
    for tenant in ["alpha", "beta"] {
        let s = scope(tenant, "shared-key");
        let Begun::Fresh(c) = engine.begin(&s, &fp, &Policy::default()).await.unwrap() else {
            panic!("tenant {tenant} must get its own claim of a shared key");
        };
        let body = format!(r#"{{"tenant":"{tenant}"}}"#);
        committed(
            engine
                .finish(c, &Completion::completed(response(201, &body)))
                .await
                .unwrap(),
        );
    }
    let a = engine
        .store()
        .fetch(&scope("alpha", "shared-key"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(a.response.unwrap().body, br#"{"tenant":"alpha"}"#);
}

/// `n` concurrent claims of one key: exactly one executes; every other one
/// replays it or is told "in flight". Never two executions.
pub async fn concurrent_claims_execute_once<S: KeyStore>(store: S, n: usize) {
    let engine = Arc::new(Engine::new(store));
    let executed = Arc::new(AtomicUsize::new(0));
    let replayed = Arc::new(AtomicUsize::new(0));
    let in_flight = Arc::new(AtomicUsize::new(0));
    let s = scope("t1", "race-1");
    let fp = fingerprint(r#"{"amount":7}"#);
    let mut tasks = Vec::new();
    for _ in 0..n {
        let (engine, s, executed, replayed, in_flight) = (
            engine.clone(),
            s.clone(),
            executed.clone(),
            replayed.clone(),
            in_flight.clone(),
        );
        tasks.push(tokio::spawn(async move {
            match engine.begin(&s, &fp, &Policy::default()).await {
                Ok(Begun::Fresh(c)) => {
                    executed.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    committed(
                        engine
                            .finish(c, &Completion::completed(response(201, "{}")))
                            .await
                            .unwrap(),
                    );
                }
                Ok(Begun::Replay(r)) => {
                    assert_eq!(r.response.unwrap().status, 201);
                    replayed.fetch_add(1, Ordering::SeqCst);
                }
                Err(Error::InFlight { .. }) => {
                    in_flight.fetch_add(1, Ordering::SeqCst);
                }
                Err(e) => panic!("a concurrent claim must not fail with {e:?}"),
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (e, r, f) = (
        executed.load(Ordering::SeqCst),
        replayed.load(Ordering::SeqCst),
        in_flight.load(Ordering::SeqCst),
    );
    assert_eq!(e, 1, "exactly one execution (replayed={r}, in_flight={f})");
    assert_eq!(e + r + f, n);
}

/// A concurrent claim that outwaits its policy's wait gets "in flight".
pub async fn wait_is_bounded<S: KeyStore>(store: S) {
    let engine = Engine::new(store);
    let s = scope("t1", "slow-1");
    let fp = fingerprint("{}");
    let Begun::Fresh(held) = engine.begin(&s, &fp, &Policy::default()).await.unwrap() else {
        panic!("fresh key must be claimed");
    };
    let short = Policy::default().wait(Duration::from_millis(200));
    let started = std::time::Instant::now();
    let second = engine.begin(&s, &fp, &short).await;
    match second {
        Err(Error::InFlight { retry_after }) => assert!(retry_after >= Duration::from_secs(1)),
        Err(e) => panic!("a claim blocked past its wait must be InFlight, got {e:?}"),
        Ok(_) => panic!("a claim blocked past its wait must be InFlight, got a claim or replay"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the wait must be bounded by the policy"
    );
    committed(
        engine
            .finish(held, &Completion::completed(response(201, "{}")))
            .await
            .unwrap(),
    );
    assert!(matches!(
        engine.begin(&s, &fp, &short).await,
        Ok(Begun::Replay(_))
    ));
}

/// After the TTL a record counts as absent: the late retry claims again (the
/// documented behaviour), and GC deletes expired records in bounded batches.
pub async fn expiry_and_gc<S: KeyStore>(store: S) {
    let clock = ManualClock::starting_now();
    let engine = Engine::with_clock(store, clock.clone());
    let policy = Policy::with_ttl(Duration::from_secs(60));
    let fp = fingerprint("{}");
    for i in 0..25 {
        let s = scope("t1", &format!("ttl-{i}"));
        let Begun::Fresh(c) = engine.begin(&s, &fp, &policy).await.unwrap() else {
            panic!("fresh key must be claimed");
        };
        committed(
            engine
                .finish(c, &Completion::completed(response(201, "{}")))
                .await
                .unwrap(),
        );
    }
    let s0 = scope("t1", "ttl-0");
    assert!(
        matches!(engine.begin(&s0, &fp, &policy).await, Ok(Begun::Replay(_))),
        "live record replays"
    );
    assert_eq!(
        engine.purge_expired(10, 100).await.unwrap(),
        0,
        "nothing expired yet"
    );
    clock.advance(Duration::from_secs(61));
    // A late retry after expiry (before GC ran) executes again.
    let Begun::Fresh(c) = engine
        .begin(&s0, &fingerprint(r#"{"other":1}"#), &policy)
        .await
        .unwrap()
    else {
        panic!("an expired record must not replay nor mismatch");
    };
    committed(
        engine
            .finish(c, &Completion::completed(response(201, r#"{"late":true}"#)))
            .await
            .unwrap(),
    );
    // Bounded batches: at most 2 batches of 10 → 20 of the 24 expired.
    assert_eq!(engine.purge_expired(10, 2).await.unwrap(), 20);
    assert_eq!(engine.purge_expired(10, 100).await.unwrap(), 4);
    let s1 = scope("t1", "ttl-1");
    assert!(
        engine.store().fetch(&s1).await.unwrap().is_none(),
        "expired record deleted"
    );
    assert!(
        engine.store().fetch(&s0).await.unwrap().is_some(),
        "the re-claimed record is live"
    );
}

/// `n` concurrent late retries of one expired record that GC has not deleted
/// yet: exactly one takes it over and executes; the others replay the new
/// outcome or are told "in flight". None sees the expired outcome.
pub async fn concurrent_takeover_of_expired_record_executes_once<S: KeyStore>(store: S, n: usize) {
    let clock = ManualClock::starting_now();
    let engine = Arc::new(Engine::with_clock(store, clock.clone()));
    let policy = Policy::with_ttl(Duration::from_secs(60));
    let s = scope("t1", "takeover-1");
    let fp = fingerprint(r#"{"amount":3}"#);
    let Begun::Fresh(c) = engine.begin(&s, &fp, &policy).await.unwrap() else {
        panic!("fresh key must be claimed");
    };
    committed(
        engine
            .finish(c, &Completion::completed(response(201, r#"{"old":true}"#)))
            .await
            .unwrap(),
    );
    clock.advance(Duration::from_secs(61));
    let executed = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..n {
        let (engine, s, executed) = (engine.clone(), s.clone(), executed.clone());
        tasks.push(tokio::spawn(async move {
            match engine.begin(&s, &fp, &policy).await {
                Ok(Begun::Fresh(c)) => {
                    executed.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    committed(
                        engine
                            .finish(c, &Completion::completed(response(201, r#"{"new":true}"#)))
                            .await
                            .unwrap(),
                    );
                }
                Ok(Begun::Replay(r)) => assert_eq!(
                    r.response.unwrap().body,
                    br#"{"new":true}"#,
                    "an expired outcome must never be replayed"
                ),
                Err(Error::InFlight { .. }) => {}
                Err(e) => panic!("a concurrent takeover must not fail with {e:?}"),
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(executed.load(Ordering::SeqCst), 1, "exactly one takeover");
}

/// A business write made in the claim's transaction rolls back with the key
/// when the operation fails, and commits with it exactly once when it succeeds.
pub async fn business_write_commits_with_the_key<S: KeyStore>(
    store: S,
    insert: Insert<S::Tx>,
    count: Count<S>,
) {
    let engine = Engine::new(store);
    let s = scope("t1", "atomic-1");
    let fp = fingerprint(r#"{"amount":5}"#);
    // The operation writes a payment then fails: neither payment nor key survive.
    let failed = engine
        .execute(&s, &fp, &Policy::default(), move |tx| {
            Box::pin(async move {
                insert(tx, "p1").await?;
                Err::<Completion, BoxError>("card network timeout".into())
            })
        })
        .await;
    match failed {
        Err(Error::Operation(e)) => assert_eq!(e.to_string(), "card network timeout"),
        other => panic!("the operation's error must come back, got {other:?}"),
    }
    assert_eq!(
        count(engine.store()).await,
        0,
        "the payment rolls back with the key"
    );
    assert!(engine.store().fetch(&s).await.unwrap().is_none());
    // The retry executes once; the next one replays without a second payment.
    for expect_executed in [true, false] {
        let out = engine
            .execute(&s, &fp, &Policy::default(), move |tx| {
                Box::pin(async move {
                    insert(tx, "p1").await?;
                    Ok::<_, BoxError>(Completion::completed(response(201, r#"{"id":"p1"}"#)))
                })
            })
            .await
            .unwrap();
        assert_eq!(matches!(out, Outcome::Executed(_)), expect_executed);
    }
    assert_eq!(count(engine.store()).await, 1, "exactly one payment");
}

/// Optimistic claims: of `n` concurrent requests with one key, each writing
/// its own business row, exactly one commits (row and record); every other
/// one rolls its row back and answers with the winner's outcome.
pub async fn optimistic_race_commits_one_outcome<S: KeyStore>(
    store: S,
    insert: Insert<S::Tx>,
    count: Count<S>,
    n: usize,
) {
    let ids = |i: usize| -> &'static str { format!("o-{i}").leak() };
    optimistic_race(store, "optimistic-race", ids, insert, count, n).await;
}

/// Optimistic claims: when the losers' own work fails *because of* the
/// winner's effect (here every request inserts the same business row, so a
/// loser hits the row the winner committed), the losers still answer with
/// the winner's outcome, never with their own error.
pub async fn optimistic_losers_failing_on_the_winners_effect_replay_it<S: KeyStore>(
    store: S,
    insert: Insert<S::Tx>,
    count: Count<S>,
    n: usize,
) {
    optimistic_race(
        store,
        "optimistic-same-row",
        |_| "order-c1",
        insert,
        count,
        n,
    )
    .await;
}

/// `n` concurrent optimistic requests with one key; request `i` inserts
/// business row `id(i)` and answers with it as its body.
async fn optimistic_race<S: KeyStore>(
    store: S,
    key: &str,
    id: impl Fn(usize) -> &'static str,
    insert: Insert<S::Tx>,
    count: Count<S>,
    n: usize,
) {
    let engine = Arc::new(Engine::new(store));
    let s = scope("t1", key);
    let fp = fingerprint(r#"{"amount":9}"#);
    let policy = Policy::default().optimistic();
    let mut tasks = Vec::new();
    for i in 0..n {
        let (engine, s, id) = (engine.clone(), s.clone(), id(i));
        tasks.push(tokio::spawn(async move {
            engine
                .execute(&s, &fp, &policy, move |tx| {
                    Box::pin(async move {
                        insert(tx, id).await?;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        Ok::<_, BoxError>(Completion::completed(response(201, id)))
                    })
                })
                .await
        }));
    }
    let (mut executed, mut bodies) = (Vec::new(), Vec::new());
    for t in tasks {
        match t.await.unwrap() {
            Ok(Outcome::Executed(c)) => executed.push(c.response.body),
            Ok(Outcome::Replayed(r)) => bodies.push(r.response.unwrap().body),
            Err(Error::InFlight { .. }) => {}
            Err(e) => panic!("a loser must answer with the winner's outcome, not {e:?}"),
        }
    }
    assert_eq!(executed.len(), 1, "exactly one request commits");
    assert!(
        bodies.iter().all(|b| *b == executed[0]),
        "every loser answers with the winner's outcome"
    );
    assert_eq!(
        count(engine.store()).await,
        1,
        "the losers' rows rolled back"
    );
    let record = engine.store().fetch(&s).await.unwrap().unwrap();
    assert_eq!(record.response.unwrap().body, executed[0]);
}

/// Optimistic claims: a fresh key executes and stores its outcome in one
/// write; the same request replays, another is a mismatch; a failed
/// operation leaves nothing; an expired record is replaced; and a completed
/// record inserted over a live one rolls the transaction back and returns
/// the live record untouched.
pub async fn optimistic_claims_replay_mismatch_and_expire<S: KeyStore>(
    store: S,
    insert: Insert<S::Tx>,
    count: Count<S>,
) {
    let clock = ManualClock::starting_now();
    let engine = Engine::with_clock(store, clock.clone());
    let policy = Policy::with_ttl(Duration::from_secs(60)).optimistic();
    let s = scope("t1", "optimistic-1");
    let fp = fingerprint(r#"{"amount":4}"#);
    let failed = pay(&engine, &s, &fp, &policy, insert, "p0", true).await;
    assert!(matches!(failed, Err(Error::Operation(_))), "{failed:?}");
    assert!(engine.store().fetch(&s).await.unwrap().is_none());
    assert_eq!(
        count(engine.store()).await,
        0,
        "a failed operation leaves nothing"
    );
    let first = pay(&engine, &s, &fp, &policy, insert, "p1", false).await;
    assert!(matches!(first, Ok(Outcome::Executed(_))), "{first:?}");
    let record = engine.store().fetch(&s).await.unwrap().unwrap();
    assert_eq!(
        (record.state, record.response.as_ref().map(|r| &r.body[..])),
        (RecordState::Completed, Some(&b"p1"[..])),
        "the record is written completed, never pending"
    );
    let again = pay(&engine, &s, &fp, &policy, insert, "p2", false).await;
    assert!(
        matches!(again, Ok(Outcome::Replayed(ref r)) if *r == record),
        "{again:?}"
    );
    let other = pay(
        &engine,
        &s,
        &fingerprint("{}"),
        &policy,
        insert,
        "p3",
        false,
    )
    .await;
    assert!(
        matches!(other, Err(Error::FingerprintMismatch)),
        "{other:?}"
    );
    assert_eq!(count(engine.store()).await, 1, "one payment so far");

    // Inserted over the live record (as a loser of a race would): rolled back.
    let mut tx = engine.store().begin().await.unwrap();
    insert(&mut tx, "p4").await.unwrap();
    let settled = engine
        .store()
        .insert_completed(
            tx,
            &s,
            &fingerprint("{}"),
            &Completion::completed(response(201, "p4")),
            &policy,
            clock.now_ms(),
        )
        .await
        .unwrap();
    assert!(
        matches!(settled, Settled::Existing(ref r) if *r == record),
        "{settled:?}"
    );
    assert_eq!(
        count(engine.store()).await,
        1,
        "the loser's write rolled back"
    );
    assert_eq!(engine.store().fetch(&s).await.unwrap().unwrap(), record);

    // Past the TTL the record is replaced, by this request or another.
    clock.advance(Duration::from_secs(61));
    let late = pay(
        &engine,
        &s,
        &fingerprint("{}"),
        &policy,
        insert,
        "p5",
        false,
    )
    .await;
    assert!(matches!(late, Ok(Outcome::Executed(_))), "{late:?}");
    let replaced = engine.store().fetch(&s).await.unwrap().unwrap();
    assert_eq!(replaced.response.unwrap().body, b"p5");
    assert_eq!(replaced.fingerprint, fingerprint("{}"));
    assert_eq!(count(engine.store()).await, 2);
}

/// Runs a payment through `engine`: `insert` writes business row `id`, then
/// the operation succeeds with `id` as its body, or fails when `fail`.
async fn pay<S: KeyStore, C: Clock + Clone>(
    engine: &Engine<S, C>,
    s: &Scope,
    fp: &Fingerprint,
    policy: &Policy,
    insert: Insert<S::Tx>,
    id: &'static str,
    fail: bool,
) -> Result<Outcome<Completion>, Error<BoxError>> {
    engine
        .execute(s, fp, policy, move |tx| {
            Box::pin(async move {
                insert(tx, id).await?;
                if fail {
                    return Err("card network timeout".into());
                }
                Ok(Completion::completed(response(201, id)))
            })
        })
        .await
}

/// A committed record is answered from a read: a replay and a mismatch get
/// their answer while another transaction holds the database's write side
/// open (on SQLite, the write lock itself).
pub async fn replays_are_answered_without_a_transaction<S: KeyStore>(store: S) {
    let engine = Engine::new(store);
    let fp = fingerprint(r#"{"amount":2}"#);
    for policy in [Policy::default(), Policy::default().optimistic()] {
        let k = scope("t1", &format!("read-first-{:?}", policy.mode));
        let Begun::Fresh(c) = engine.begin(&k, &fp, &policy).await.unwrap() else {
            panic!("fresh key must be claimed");
        };
        committed(
            engine
                .finish(c, &Completion::completed(response(201, "{}")))
                .await
                .unwrap(),
        );
    }
    let held = engine.store().begin().await.unwrap();
    for policy in [
        Policy::default().wait(Duration::from_millis(200)),
        Policy::default().optimistic(),
    ] {
        let k = scope("t1", &format!("read-first-{:?}", policy.mode));
        let answer = tokio::time::timeout(Duration::from_secs(2), engine.begin(&k, &fp, &policy))
            .await
            .expect("a replay must not wait for a writer");
        assert!(
            matches!(answer, Ok(Begun::Replay(_))),
            "{:?}",
            answer.map(|_| "claimed instead of replayed")
        );
        let answer = tokio::time::timeout(
            Duration::from_secs(2),
            engine.begin(&k, &fingerprint("{}"), &policy),
        )
        .await
        .expect("a mismatch must not wait for a writer");
        assert!(
            matches!(answer, Err(Error::FingerprintMismatch)),
            "{:?}",
            answer.map(|_| "not refused")
        );
    }
    engine.store().rollback(held).await.unwrap();
}

const NOW: i64 = 1_000_000;
const LEASE: Duration = Duration::from_secs(30);

/// Asserts that a pessimistic finish stored the outcome and committed.
fn committed(finished: Finished) {
    assert!(matches!(finished, Finished::Committed), "{finished:?}");
}

fn message(key: &str, body: &str) -> OutboxMessage {
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

fn receipt(endpoint: &str, delivery: &str, entity: Option<(&str, i64)>) -> NewReceipt {
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
