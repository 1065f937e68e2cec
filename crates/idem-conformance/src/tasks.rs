//! Tasks of a [`TaskStore`]: created once per key, cursors moved only from
//! where they are, claims never shared and fenced, settles only by the live
//! holder, actions decided by the send-once ledger.

use idem_core::IdempotencyKey;
use idem_core::Tenant;
use idem_core::steps::Namespace;
use idem_core::tasks::{
    ActionAttempt, ActionClaim, ActionDecision, ActionKey, ActionMode, ActionName, ActionOutcome,
    ClaimRequest, CursorMove, Fenced, NewTask, QueueName, Settle, Steer, Steered, TaskFilter,
    TaskId, TaskRecord, TaskState, TaskStore,
};

pub(crate) const T0: i64 = 1_000_000;
const LEASE: i64 = 30_000;

fn id(key: &str) -> String {
    TaskId::of(
        &Namespace::new("conformance").unwrap(),
        &Tenant::new("t1").unwrap(),
        &QueueName::new("q").unwrap(),
        &IdempotencyKey::new(key).unwrap(),
    )
    .as_str()
    .to_owned()
}

/// Creates task `key` in queue `q` of tenant `t1` with `payload`.
pub(crate) async fn create<S: TaskStore>(
    store: &S,
    key: &str,
    payload: &str,
    priority: i64,
) -> (TaskRecord, bool) {
    let id = id(key);
    let task = NewTask {
        id: &id,
        tenant: "t1",
        queue: "q",
        key,
        payload,
        payload_hash: &format!("h:{payload}"),
        priority,
        run_at_ms: T0,
        max_attempts: 2,
        now_ms: T0,
    };
    let mut tx = store.begin().await.unwrap();
    let made = S::create_task(&mut tx, &task).await.unwrap();
    store.commit(tx).await.unwrap();
    made
}

pub(crate) async fn claim<S: TaskStore>(
    store: &S,
    worker: &str,
    max: u32,
    now_ms: i64,
) -> Vec<TaskRecord> {
    let request = ClaimRequest {
        tenant: "t1",
        queue: "q",
        worker,
        lease_ms: LEASE,
        max,
        now_ms,
    };
    let mut tx = store.begin().await.unwrap();
    let claimed = S::claim_tasks(&mut tx, &request).await.unwrap();
    store.commit(tx).await.unwrap();
    claimed
}

async fn settle<S: TaskStore>(
    store: &S,
    task: &str,
    fence: i64,
    how: Settle<'_>,
    now_ms: i64,
) -> Fenced {
    let mut tx = store.begin().await.unwrap();
    let out = S::settle(&mut tx, "t1", task, fence, &how, now_ms)
        .await
        .unwrap();
    store.commit(tx).await.unwrap();
    out
}

/// A result as a worker sent it: the store keeps the text, every digit (a
/// column that reads numbers — `jsonb` normalises, a double rounds — would
/// not).
const EXACT_RESULT: &str = r#"{"ok":123456789012345678901234567890,"r":0.30000000000000001}"#;

fn complete(result: &str) -> Settle<'_> {
    Settle::Complete {
        result,
        result_hash: result,
    }
}

/// A key is one task per queue: created once, found again (with the first
/// payload, whatever the second says); its timeline starts with `created`.
pub async fn tasks_are_created_once_per_key<S: TaskStore>(store: S) {
    let (first, made) = create(&store, "obs-1", r#"{"n":1}"#, 0).await;
    assert!(made);
    assert_eq!(
        (first.state, first.attempt, first.fence),
        (TaskState::Ready, 0, 0)
    );
    let (again, made) = create(&store, "obs-1", r#"{"n":1}"#, 0).await;
    assert!(!made, "the same key again finds the task");
    assert_eq!(again, first);
    let (other, made) = create(&store, "obs-1", r#"{"n":2}"#, 0).await;
    assert!(!made);
    assert_eq!(
        other.payload_hash, first.payload_hash,
        "the first payload is kept: the caller compares and refuses the second"
    );
    let events = store.task_events(&first.id).await.unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].kind, "created");
    assert!(store.load_task(&id("nope")).await.unwrap().is_none());

    // The payload is kept as written, every digit of it.
    let exact = r#"{"n":123456789012345678901234567890,"x":1.50,"y":-0}"#;
    let (big, _) = create(&store, "obs-big", exact, 0).await;
    let stored = store.load_task(&big.id).await.unwrap().unwrap();
    assert_eq!(stored.payload, exact, "the payload as written");
}

/// A cursor moves only from the value it is at; a repeated move is known
/// as one; a move from elsewhere changes nothing and names where it is.
pub async fn cursors_move_only_from_where_they_are<S: TaskStore>(store: S) {
    let mv = |from: Option<&'static str>, to: &'static str, at: i64| {
        let store = store.clone();
        async move {
            let mut tx = store.begin().await.unwrap();
            let out = S::move_cursor(&mut tx, "t1", "p", from, to, at)
                .await
                .unwrap();
            store.commit(tx).await.unwrap();
            out
        }
    };
    assert_eq!(mv(None, "\"a\"", T0).await, CursorMove::Moved);
    assert_eq!(mv(None, "\"a\"", T0).await, CursorMove::AlreadyThere);
    assert_eq!(
        mv(None, "\"b\"", T0).await,
        CursorMove::Conflict(Some("\"a\"".into()))
    );
    assert_eq!(mv(Some("\"a\""), "\"b\"", T0 + 1).await, CursorMove::Moved);
    assert_eq!(
        mv(Some("\"a\""), "\"c\"", T0 + 2).await,
        CursorMove::Conflict(Some("\"b\"".into())),
        "a replica that read the old cursor moves nothing"
    );
    let kept = store.cursor("t1", "p").await.unwrap().unwrap();
    assert_eq!((kept.cursor.as_str(), kept.version), ("\"b\"", 2));
    assert!(
        store.cursor("t2", "p").await.unwrap().is_none(),
        "per tenant"
    );
    assert_eq!(
        mv(Some("\"x\""), "\"y\"", T0).await,
        CursorMove::Conflict(Some("\"b\"".into()))
    );

    // A cursor is kept as written, every digit of it, and compared as text
    // (the caller compares JSON values).
    let big = r#"{"after":123456789012345678901234567890,"x":1.50}"#;
    let next = r#"{"after":123456789012345678901234567891,"x":1.50}"#;
    assert_eq!(mv(Some("\"b\""), big, T0 + 3).await, CursorMove::Moved);
    assert_eq!(
        mv(Some(next), "\"z\"", T0 + 4).await,
        CursorMove::Conflict(Some(big.into())),
        "one digit off is elsewhere"
    );
    let kept = store.cursor("t1", "p").await.unwrap().unwrap();
    assert_eq!(kept.cursor, big, "the cursor as written");
}

/// Claims take the highest priority first, grow the fence, and never hand a
/// claimed task to another worker while its lease runs; after it ends the
/// task is taken over (a new fence), and on its last attempt it is dead.
pub async fn claims_are_fenced_and_taken_over_after_the_lease<S: TaskStore>(store: S) {
    let (low, _) = create(&store, "low", "{}", 0).await;
    let (high, _) = create(&store, "high", "{}", 5).await;
    let a = claim(&store, "w-a", 1, T0).await;
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].id, high.id, "priority first");
    assert_eq!(
        (a[0].state, a[0].fence, a[0].attempt, a[0].holder.as_deref()),
        (TaskState::Claimed, 1, 1, Some("w-a"))
    );
    assert_eq!(a[0].lease_expires_at_ms, Some(T0 + LEASE));
    let b = claim(&store, "w-b", 5, T0 + 1).await;
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].id, low.id, "a live lease is never shared");
    assert!(claim(&store, "w-c", 5, T0 + 2).await.is_empty());

    // w-a's lease ends (the database's clock says so): w-c takes it over.
    let c = claim(&store, "w-c", 1, T0 + LEASE).await;
    assert_eq!(c.len(), 1);
    assert_eq!(
        (c[0].id.as_str(), c[0].fence, c[0].attempt),
        (high.id.as_str(), 2, 2)
    );
    assert_eq!(
        (a[0].claim_kind.as_deref(), c[0].claim_kind.as_deref()),
        (Some("claimed"), Some("taken_over"))
    );
    // The zombie's writes are refused.
    let late = settle(&store, &high.id, 1, complete("{}"), T0 + LEASE + 1).await;
    assert!(matches!(late, Fenced::LeaseLost(_)), "{late:?}");
    // Its last attempt's lease ends too: dead, not claimed again.
    assert!(
        claim(&store, "w-d", 5, T0 + 2 * LEASE)
            .await
            .iter()
            .all(|t| t.id != high.id)
    );
    let dead = store.load_task(&high.id).await.unwrap().unwrap();
    assert_eq!((dead.state, dead.holder), (TaskState::Dead, None));
    let kinds: Vec<String> = store
        .task_events(&high.id)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, ["created", "claimed", "taken_over", "dead"]);
    let counts = store.count_tasks().await.unwrap();
    assert!(
        counts.contains(&("q".into(), TaskState::Dead, 1)),
        "{counts:?}"
    );
}

/// Only the live holder settles: heartbeats renew, a completion is
/// repeated by its fence with the same result and refused with another,
/// a failure retries until the attempts run out.
pub async fn only_the_live_holder_settles<S: TaskStore>(store: S) {
    let (task, _) = create(&store, "job", "{}", 0).await;
    let held = claim(&store, "w", 1, T0).await.remove(0);
    let beat = settle(
        &store,
        &task.id,
        held.fence,
        Settle::Heartbeat { lease_ms: LEASE },
        T0 + 10,
    )
    .await;
    let Fenced::Written(renewed) = beat else {
        panic!("the holder renews: {beat:?}")
    };
    assert_eq!(renewed.lease_expires_at_ms, Some(T0 + 10 + LEASE));
    let forged = settle(&store, &task.id, held.fence + 7, complete("{}"), T0 + 11).await;
    assert!(matches!(forged, Fenced::LeaseLost(_)), "{forged:?}");

    // Fails: ready again later, with the error kept; claimed again after.
    let fail = Settle::Fail {
        error: "upstream 503",
        retry_at_ms: T0 + 1_000,
    };
    let Fenced::Written(failed) = settle(&store, &task.id, held.fence, fail, T0 + 20).await else {
        panic!("the holder fails it")
    };
    assert_eq!(
        (failed.state, failed.run_at_ms, failed.last_error.as_deref()),
        (TaskState::Ready, T0 + 1_000, Some("upstream 503"))
    );
    assert!(
        claim(&store, "w", 1, T0 + 999).await.is_empty(),
        "not before its time"
    );
    let again = claim(&store, "w2", 1, T0 + 1_000).await.remove(0);
    assert_eq!((again.attempt, again.fence), (2, 2));

    let first = settle(
        &store,
        &task.id,
        again.fence,
        complete(EXACT_RESULT),
        T0 + 1_001,
    )
    .await;
    let Fenced::Written(done) = first else {
        panic!("{first:?}")
    };
    assert_eq!(
        (done.state, done.result.as_deref(), done.holder.as_deref()),
        (TaskState::Done, Some(EXACT_RESULT), None)
    );
    let repeat = settle(
        &store,
        &task.id,
        again.fence,
        complete(EXACT_RESULT),
        T0 + 99_000,
    )
    .await;
    assert!(
        matches!(repeat, Fenced::Repeated(ref t) if *t == done),
        "{repeat:?}"
    );
    let other = settle(
        &store,
        &task.id,
        again.fence,
        complete(r#"{"ok":2}"#),
        T0 + 1_002,
    )
    .await;
    assert!(matches!(other, Fenced::Mismatch(_)), "{other:?}");
    let stale = settle(
        &store,
        &task.id,
        held.fence,
        complete(r#"{"ok":1}"#),
        T0 + 1_003,
    )
    .await;
    assert!(matches!(stale, Fenced::LeaseLost(_)), "{stale:?}");
    assert_eq!(
        settle(&store, &id("ghost"), 1, complete("{}"), T0).await,
        Fenced::Missing
    );
    let mut tx = store.begin().await.unwrap();
    let theirs = S::settle(
        &mut tx,
        "t2",
        &task.id,
        again.fence,
        &complete(r#"{"ok":1}"#),
        T0,
    )
    .await
    .unwrap();
    store.rollback(tx).await.unwrap();
    assert_eq!(
        theirs,
        Fenced::Missing,
        "another tenant's task is missing to it"
    );
    let page = store
        .list_tasks(&TaskFilter {
            state: Some(TaskState::Done),
            limit: 10,
            ..TaskFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(page.len(), 1);
}

/// Asks about action `notify` of `task` as the holder of `fence`, under
/// the ask's key `asked` (`report`: reports its outcome instead).
async fn ask<S: TaskStore>(
    store: &S,
    task: &TaskRecord,
    fence: i64,
    (mode, asked): (ActionMode, Option<&str>),
    now_ms: i64,
    report: Option<ActionOutcome>,
) -> ActionClaim {
    let key = ActionKey::derive(
        &Namespace::new("conformance").unwrap(),
        &TaskId::parse(&task.id).unwrap(),
        &ActionName::new("notify").unwrap(),
    );
    let attempt = ActionAttempt {
        tenant: "t1",
        task: &task.id,
        fence,
        action: "notify",
        key: key.as_str(),
        mode,
        ask: asked,
        now_ms,
        expires_at_ms: now_ms + 86_400_000,
        detail: None,
    };
    let mut tx = store.begin().await.unwrap();
    let out = match report {
        None => S::claim_action(&mut tx, &attempt).await,
        Some(outcome) => S::record_action(&mut tx, &attempt, outcome).await,
    };
    store.commit(tx).await.unwrap();
    out.unwrap()
}

pub(crate) async fn action<S: TaskStore>(
    store: &S,
    task: &TaskRecord,
    fence: i64,
    mode: ActionMode,
    now_ms: i64,
) -> ActionClaim {
    ask(store, task, fence, (mode, None), now_ms, None).await
}

/// [`action`], the ask under its own key `asked`.
pub(crate) async fn action_as<S: TaskStore>(
    store: &S,
    task: &TaskRecord,
    fence: i64,
    mode: ActionMode,
    now_ms: i64,
    asked: &str,
) -> ActionClaim {
    ask(store, task, fence, (mode, Some(asked)), now_ms, None).await
}

pub(crate) async fn report<S: TaskStore>(
    store: &S,
    task: &TaskRecord,
    fence: i64,
    outcome: ActionOutcome,
    now_ms: i64,
) -> ActionClaim {
    ask(
        store,
        task,
        fence,
        (ActionMode::Verify, None),
        now_ms,
        Some(outcome),
    )
    .await
}

/// [`report`], for the ask under its own key `asked`.
pub(crate) async fn report_as<S: TaskStore>(
    store: &S,
    task: &TaskRecord,
    fence: i64,
    outcome: ActionOutcome,
    now_ms: i64,
    asked: &str,
) -> ActionClaim {
    let how = (ActionMode::Verify, Some(asked));
    ask(store, task, fence, how, now_ms, Some(outcome)).await
}

pub(crate) fn decision(claim: &ActionClaim) -> ActionDecision {
    match claim {
        ActionClaim::Decided(d, _) => *d,
        other => panic!("expected a decision, got {other:?}"),
    }
}

/// Actions: the holder is told to go (again, on a retry of its ask);
/// once reported done it is done for every later claim; an attempt whose
/// outcome never came back is unknown to the next holder — verified and
/// reported not sent it may go again, or in at-most-once mode the task
/// needs attention. Only the live holder records anything.
pub async fn actions_happen_once<S: TaskStore>(store: S) {
    let (task, _) = create(&store, "act", "{}", 0).await;
    let h1 = claim(&store, "w1", 1, T0).await.remove(0);
    assert_eq!(
        decision(&action_as(&store, &task, 1, ActionMode::Verify, T0, "w1:ask:1").await),
        ActionDecision::Go
    );
    assert_eq!(
        decision(&action_as(&store, &task, 1, ActionMode::Verify, T0 + 1, "w1:ask:1").await),
        ActionDecision::Go,
        "the same ask again (its answer was lost) may go"
    );
    // w1 dies; w2 takes over and finds the outcome unknown.
    let h2 = claim(&store, "w2", 1, T0 + LEASE).await.remove(0);
    assert_eq!(h2.fence, h1.fence + 1);
    let unasked = report(&store, &task, h2.fence, ActionOutcome::NotSent, T0 + LEASE).await;
    assert!(
        matches!(unasked, ActionClaim::NoAttempt(_)),
        "another claim's attempt is not this claim's to report without asking: {unasked:?}"
    );
    let stale = action(&store, &task, h1.fence, ActionMode::Verify, T0 + LEASE + 1).await;
    assert!(matches!(stale, ActionClaim::LeaseLost(_)), "{stale:?}");
    assert_eq!(
        decision(&action(&store, &task, h2.fence, ActionMode::Verify, T0 + LEASE + 1).await),
        ActionDecision::Unknown
    );
    // Verified downstream: it was not sent. Then w2's next ask may go.
    assert_eq!(
        decision(
            &report(
                &store,
                &task,
                h2.fence,
                ActionOutcome::NotSent,
                T0 + LEASE + 2
            )
            .await
        ),
        ActionDecision::Ask
    );
    assert_eq!(
        decision(&action(&store, &task, h2.fence, ActionMode::Verify, T0 + LEASE + 3).await),
        ActionDecision::Go
    );
    assert_eq!(
        decision(&report(&store, &task, h2.fence, ActionOutcome::Done, T0 + LEASE + 4).await),
        ActionDecision::Done
    );
    assert_eq!(
        decision(
            &report(
                &store,
                &task,
                h2.fence,
                ActionOutcome::NotSent,
                T0 + LEASE + 5
            )
            .await
        ),
        ActionDecision::Done,
        "a sent action stays sent"
    );
    let h3 = claim(&store, "w3", 1, T0 + 2 * LEASE).await;
    assert!(h3.is_empty(), "two attempts were its maximum: {h3:?}");

    // At-most-once: an unknown outcome goes to an operator.
    let (other, _) = create(&store, "act-2", "{}", 0).await;
    let o1 = claim(&store, "w1", 1, T0).await.remove(0);
    assert_eq!(o1.id, other.id);
    assert_eq!(
        decision(&action(&store, &other, o1.fence, ActionMode::AtMostOnce, T0).await),
        ActionDecision::Go
    );
    let o2 = claim(&store, "w2", 1, T0 + LEASE).await.remove(0);
    let unknown = action(&store, &other, o2.fence, ActionMode::AtMostOnce, T0 + LEASE).await;
    let ActionClaim::Decided(ActionDecision::Unknown, parked) = unknown else {
        panic!("{unknown:?}")
    };
    assert_eq!(
        (parked.state, parked.holder),
        (TaskState::NeedsAttention, None)
    );
    assert!(
        matches!(
            settle(&store, &other.id, o2.fence, complete("{}"), T0 + LEASE + 1).await,
            Fenced::LeaseLost(_)
        ),
        "a task that needs attention is not completed by a worker"
    );
    assert!(
        claim(&store, "w3", 5, T0 + 3 * LEASE)
            .await
            .iter()
            .all(|t| t.id != other.id)
    );

    // A result for an action never attempted is refused.
    let (third, _) = create(&store, "act-3", "{}", 0).await;
    let t1 = claim(&store, "w1", 1, T0 + 3 * LEASE).await.remove(0);
    assert_eq!(t1.id, third.id);
    let none = report(
        &store,
        &third,
        t1.fence,
        ActionOutcome::Done,
        T0 + 3 * LEASE,
    )
    .await;
    assert!(matches!(none, ActionClaim::NoAttempt(_)), "{none:?}");
}

/// Concurrent claimers on their own connections never get the same task.
pub async fn concurrent_claims_never_share_a_task<S: TaskStore>(store: S, workers: usize) {
    for i in 0..20 {
        create(&store, &format!("c-{i}"), "{}", 0).await;
    }
    let mut handles = Vec::new();
    for w in 0..workers {
        let store = store.clone();
        handles.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let got = claim(&store, &format!("w{w}"), 3, T0).await;
                if got.is_empty() {
                    return mine;
                }
                mine.extend(got.into_iter().map(|t| t.id));
            }
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.unwrap());
    }
    let n = all.len();
    all.sort();
    all.dedup();
    assert_eq!((n, all.len()), (20, 20), "each task claimed once");
}

async fn steer<S: TaskStore>(store: &S, task: &str, how: Steer<'_>, now_ms: i64) -> Steered {
    let mut tx = store.begin().await.unwrap();
    let out = S::steer(&mut tx, task, how, "ops@example", now_ms)
        .await
        .unwrap();
    store.commit(tx).await.unwrap();
    out
}

/// Operators: a dead task is retried (ready, one more attempt, a new
/// fence); a task that needs attention is resolved after checking the other
/// system — `sent` makes its action done for good, not sent lets it go
/// again; neither applies to a task that is ready or done.
pub async fn operators_steer_what_workers_cannot<S: TaskStore>(store: S) {
    let (task, _) = create(&store, "dead-one", "{}", 0).await;
    assert!(
        matches!(
            steer(&store, &task.id, Steer::Retry, T0).await,
            Steered::NotApplicable(_)
        ),
        "a ready task needs no retry"
    );
    // Two claims whose leases end: dead.
    claim(&store, "w1", 1, T0).await;
    claim(&store, "w2", 1, T0 + LEASE).await;
    assert!(claim(&store, "w3", 1, T0 + 2 * LEASE).await.is_empty());
    let Steered::Done(revived) = steer(&store, &task.id, Steer::Retry, T0 + 2 * LEASE).await else {
        panic!("a dead task is retried")
    };
    assert_eq!(
        (revived.state, revived.max_attempts, revived.fence),
        (TaskState::Ready, 3, 4),
        "one more attempt; the fence grew at its death and at its revival"
    );
    let again = claim(&store, "w4", 1, T0 + 2 * LEASE).await;
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].attempt, again[0].fence), (3, 5));

    // An unknown action in at-most-once mode, resolved as sent.
    let (t, _) = create(&store, "attn", "{}", 0).await;
    let a = claim(&store, "w1", 1, T0 + 3 * LEASE).await.remove(0);
    assert_eq!(a.id, t.id);
    action(&store, &t, a.fence, ActionMode::AtMostOnce, T0 + 3 * LEASE).await;
    let b = claim(&store, "w2", 1, T0 + 4 * LEASE).await.remove(0);
    let parked = action(&store, &t, b.fence, ActionMode::AtMostOnce, T0 + 4 * LEASE).await;
    assert_eq!(decision(&parked), ActionDecision::Unknown);
    let key = ActionKey::derive(
        &Namespace::new("conformance").unwrap(),
        &TaskId::parse(&t.id).unwrap(),
        &ActionName::new("notify").unwrap(),
    );
    let resolve = |sent| Steer::Resolve {
        action: "notify",
        key: key.as_str(),
        sent,
    };
    let Steered::Done(ready) = steer(&store, &t.id, resolve(true), T0 + 4 * LEASE + 1).await else {
        panic!("a task that needs attention is resolved")
    };
    assert_eq!(ready.state, TaskState::Ready);
    assert!(
        matches!(
            steer(&store, &t.id, resolve(true), T0 + 4 * LEASE + 2).await,
            Steered::NotApplicable(_)
        ),
        "resolved once"
    );
    let c = claim(&store, "w3", 5, T0 + 4 * LEASE + 3).await;
    let c = c.into_iter().find(|c| c.id == t.id).unwrap();
    assert_eq!(
        decision(
            &action(
                &store,
                &t,
                c.fence,
                ActionMode::AtMostOnce,
                T0 + 4 * LEASE + 3
            )
            .await
        ),
        ActionDecision::Done,
        "resolved as sent: never performed again"
    );
    let kinds: Vec<String> = store
        .task_events(&t.id)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert!(kinds.contains(&"resolved".to_owned()), "{kinds:?}");
    assert_eq!(
        steer(&store, &id("nope"), Steer::Retry, T0).await,
        Steered::Missing
    );
}
