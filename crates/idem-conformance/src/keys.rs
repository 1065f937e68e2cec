//! The [`KeyStore`] checks: claims, replay, mismatch, isolation,
//! concurrency, bounded waits, expiry and collection, optimistic claims,
//! business writes committed with the key.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::Clock;
use idem_core::keys::Settled;
use idem_core::{
    Begun, BoxError, BoxFuture, Completion, Engine, Error, Fingerprint, KeyStore, ManualClock,
    Outcome, Policy, RecordState, Scope,
};

use crate::support::{committed, fingerprint, response, scope};

/// Writes one business row with the given id in the claim's transaction.
pub type Insert<T> = for<'t> fn(&'t mut T, &'static str) -> BoxFuture<'t, Result<(), BoxError>>;
/// Counts the business rows, outside any claim.
pub type Count<S> = for<'s> fn(&'s S) -> BoxFuture<'s, i64>;

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
