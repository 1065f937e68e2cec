//! The [`RunStore`] checks: runs created with their key, fenced writes,
//! takeovers only after the lease, claims never shared, steps in order,
//! final runs expiring with their key, listing and counting by state.

use std::collections::HashMap;
use std::sync::Arc;

use idem_core::steps::{
    Failure, Fence, Lease, NewRun, RunChange, RunFilter, RunId, RunRecord, RunState, RunStore,
    StepKind, StepRecord, StepState,
};
use idem_core::{
    Begun, Completion, Engine, ManualClock, Operation, Policy, RecordState, Scope, StoreError,
};

use crate::support::{fingerprint, response, scope};

pub(crate) const T0: i64 = 1_000_000;
const LEASE_MS: i64 = 10_000;

/// Claims `scope`'s key and creates its run, held by `holder`, in one
/// transaction; returns the lease.
pub(crate) async fn start<S: RunStore>(store: &S, s: &Scope, holder: &str, now: i64) -> Lease {
    let namespace = store.namespace().await.unwrap();
    let engine = Engine::with_clock(store.clone(), ManualClock::new(now));
    let Begun::Fresh(mut claimed) = engine
        .begin(s, &fingerprint("{}"), &Policy::default())
        .await
        .unwrap()
    else {
        panic!("a fresh key is claimed");
    };
    let id = RunId::of(&namespace, s);
    let fence = S::create_run(
        &mut claimed.tx,
        &NewRun {
            id: &id,
            scope: s,
            input: b"{\"sku\":\"a\"}",
            holder,
            locked_until_ms: now + LEASE_MS,
            deadline_ms: now + 60_000,
            ttl_ms: 86_400_000,
            now_ms: now,
        },
    )
    .await
    .unwrap();
    store.commit(claimed.tx).await.unwrap();
    Lease {
        run: id,
        holder: holder.into(),
        fence,
    }
}

fn step(name: &str, seq: i64, state: StepState, attempts: u32, fence: Fence) -> StepRecord {
    StepRecord {
        name: name.into(),
        seq,
        kind: StepKind::Call,
        state,
        attempts,
        failures: 0,
        key: format!("idem:{name}:0"),
        fence,
        result: (state == StepState::Done).then(|| b"{\"id\":\"p1\"}".to_vec()),
        error: None,
        started_at_ms: Some(T0),
        finished_at_ms: (state == StepState::Done).then_some(T0 + 5),
        updated_at_ms: T0,
    }
}

async fn load<S: RunStore>(store: &S, id: &RunId) -> RunRecord {
    store.load_run(id).await.unwrap().expect("the run exists")
}

/// The namespace is drawn once and kept: every call gives the same one.
pub async fn the_namespace_is_drawn_once<S: RunStore>(store: S) {
    let first = store.namespace().await.unwrap();
    let (a, b) = tokio::join!(store.namespace(), store.namespace());
    assert_eq!(
        (a.unwrap(), b.unwrap()),
        (first.clone(), first.clone()),
        "stable"
    );
    assert_eq!(first.as_str().len(), 32);
}

/// A run is created in its key's transaction, held by its creator at fence
/// 1; its key record stays pending and never expires while the run lives;
/// a rolled-back claim leaves no run.
pub async fn runs_are_created_with_their_key<S: RunStore>(store: S) {
    let s = scope("t1", "run-create");
    let lease = start(&store, &s, "exec-a", T0).await;
    assert_eq!(lease.fence, Fence(1), "a new run starts at fence 1");
    let run = load(&store, &lease.run).await;
    assert_eq!(run.state, RunState::Running);
    assert_eq!(run.scope, s);
    assert_eq!(run.input, b"{\"sku\":\"a\"}");
    assert_eq!(run.holder.as_deref(), Some("exec-a"));
    assert_eq!(run.locked_until_ms, T0 + LEASE_MS);
    assert_eq!((run.takeovers, run.steps.len()), (0, 0));
    let key = store.fetch(&s).await.unwrap().unwrap();
    assert_eq!(key.state, RecordState::Pending, "the key stays pending");
    assert_eq!(
        key.expires_at_ms,
        i64::MAX,
        "a key whose run lives never expires"
    );

    // Rolled back with its claim: no run.
    let other = scope("t1", "run-rolled-back");
    let engine = Engine::new(store.clone());
    let Begun::Fresh(mut claimed) = engine
        .begin(&other, &fingerprint("{}"), &Policy::default())
        .await
        .unwrap()
    else {
        panic!("fresh");
    };
    let id = RunId::of(&store.namespace().await.unwrap(), &other);
    S::create_run(
        &mut claimed.tx,
        &NewRun {
            id: &id,
            scope: &other,
            input: b"",
            holder: "exec-a",
            locked_until_ms: T0,
            deadline_ms: T0,
            ttl_ms: 1,
            now_ms: T0,
        },
    )
    .await
    .unwrap();
    engine.abort(claimed).await.unwrap();
    assert!(
        store.load_run(&id).await.unwrap().is_none(),
        "a rolled-back claim leaves no run"
    );
}

/// Writes with the current fence land (state, recovery point, failure,
/// block, point of no return, step); a write with any other fence lands
/// nothing at all.
pub async fn fenced_writes_land_only_with_the_current_fence<S: RunStore>(store: S) {
    let s = scope("t1", "run-fence");
    let lease = start(&store, &s, "exec-a", T0).await;
    let charge = step("charge", 1, StepState::Done, 1, lease.fence);
    let failure = Failure::new("card_declined");
    let change = RunChange {
        recovery_point: Some("charge"),
        failure: Some(&failure),
        no_return: true,
        ..RunChange::default()
    };
    assert!(
        store
            .record_run(&lease, &change, Some(&charge), T0 + 10)
            .await
            .unwrap(),
        "the holder's write lands"
    );
    let run = load(&store, &lease.run).await;
    assert_eq!(run.recovery_point.as_deref(), Some("charge"));
    assert_eq!(run.failure, Some(failure.clone()));
    assert!(run.no_return);
    assert_eq!(run.steps.len(), 1);
    assert_eq!(run.steps[0].state, StepState::Done);
    assert_eq!(
        run.steps[0].result.as_deref(),
        Some(&b"{\"id\":\"p1\"}"[..])
    );
    assert_eq!(run.steps[0].fence, Fence(1));

    let stale = Lease {
        fence: Fence(lease.fence.0 + 7),
        ..lease.clone()
    };
    let mail = step("mail", 2, StepState::Started, 1, stale.fence);
    let zombie = RunChange {
        state: Some(RunState::Completed),
        recovery_point: Some("mail"),
        attention: Some(Some(("mail", "zombie"))),
        ..RunChange::default()
    };
    assert!(
        !store
            .record_run(&stale, &zombie, Some(&mail), T0 + 20)
            .await
            .unwrap(),
        "a write with another fence is refused"
    );
    let mut tx = store.begin().await.unwrap();
    assert!(
        !S::record_run_in(&mut tx, &stale, &zombie, Some(&mail), T0 + 20)
            .await
            .unwrap(),
        "in a transaction too"
    );
    store.commit(tx).await.unwrap();
    let after = load(&store, &lease.run).await;
    assert_eq!(after, run, "a refused write changed nothing");

    // A later failure does not replace the first; a block is set and cleared.
    let other = Failure::new("deadline");
    let block = RunChange {
        state: Some(RunState::NeedsAttention),
        failure: Some(&other),
        attention: Some(Some(("charge", "outcome unknown"))),
        ..RunChange::default()
    };
    assert!(
        store
            .record_run(&lease, &block, None, T0 + 30)
            .await
            .unwrap()
    );
    let blocked = load(&store, &lease.run).await;
    assert_eq!(blocked.failure, Some(failure), "the first failure is kept");
    assert_eq!(blocked.blocked_step.as_deref(), Some("charge"));
    assert_eq!(blocked.attention.as_deref(), Some("outcome unknown"));
    let clear = RunChange {
        state: Some(RunState::Running),
        attention: Some(None),
        bump_fence: true,
        ..RunChange::default()
    };
    assert!(
        store
            .record_run(&lease, &clear, None, T0 + 40)
            .await
            .unwrap()
    );
    let cleared = load(&store, &lease.run).await;
    assert_eq!((cleared.blocked_step, cleared.attention), (None, None));
    assert_eq!(
        cleared.fence,
        Fence(lease.fence.0 + 1),
        "an operator action bumps the fence"
    );
    assert!(
        !store
            .record_run(&lease, &RunChange::default(), None, T0 + 50)
            .await
            .unwrap(),
        "the executor that held the run is fenced out by it"
    );
}

/// A run is taken over only once its lease ended; the takeover adds one to
/// the fence, and from then on the old holder's writes are refused while
/// the new holder's land. A heartbeat moves the lease's end.
pub async fn takeover_needs_an_expired_lease<S: RunStore>(store: S) {
    let s = scope("t1", "run-takeover");
    let a = start(&store, &s, "exec-a", T0).await;
    assert!(
        store
            .take_over(&a.run, "exec-b", T0 + LEASE_MS - 1, T0 + 3 * LEASE_MS)
            .await
            .unwrap()
            .is_none(),
        "no takeover while the lease holds"
    );
    // A heartbeat moves it further.
    let beat = RunChange {
        locked_until_ms: Some(T0 + 2 * LEASE_MS),
        ..RunChange::default()
    };
    assert!(store.record_run(&a, &beat, None, T0 + 5).await.unwrap());
    assert!(
        store
            .take_over(&a.run, "exec-b", T0 + LEASE_MS, T0 + 3 * LEASE_MS)
            .await
            .unwrap()
            .is_none(),
        "the heartbeat extended the lease"
    );
    let taken = store
        .take_over(&a.run, "exec-b", T0 + 2 * LEASE_MS, T0 + 3 * LEASE_MS)
        .await
        .unwrap()
        .expect("an expired lease is taken over");
    assert_eq!(taken.fence, Fence(a.fence.0 + 1));
    assert_eq!(taken.holder.as_deref(), Some("exec-b"));
    assert_eq!(taken.takeovers, 1);
    assert_eq!(taken.locked_until_ms, T0 + 3 * LEASE_MS);
    let b = taken.lease().unwrap();
    assert!(
        !store
            .record_run(&a, &RunChange::default(), None, T0)
            .await
            .unwrap()
    );
    assert!(
        store
            .record_run(&b, &RunChange::default(), None, T0)
            .await
            .unwrap()
    );

    // A final run is never taken over; a released one is due when it says.
    let release = RunChange {
        release: true,
        locked_until_ms: Some(T0 + 5 * LEASE_MS),
        ..RunChange::default()
    };
    assert!(store.record_run(&b, &release, None, T0).await.unwrap());
    let released = load(&store, &b.run).await;
    assert_eq!(released.holder, None);
    assert!(
        store
            .take_over(&b.run, "exec-c", T0 + 5 * LEASE_MS - 1, T0 + 9 * LEASE_MS)
            .await
            .unwrap()
            .is_none(),
        "a released run is due only at its time"
    );
    let done = RunChange {
        state: Some(RunState::Completed),
        ..RunChange::default()
    };
    assert!(store.record_run(&b, &done, None, T0).await.unwrap());
    assert!(
        store
            .take_over(&b.run, "exec-c", i64::MAX - 1, i64::MAX - 1)
            .await
            .unwrap()
            .is_none(),
        "a final run is never taken over"
    );
}

/// Concurrent recovery claims take each due run exactly once, only runs of
/// the operations asked for, and never a run whose lease holds.
pub async fn claims_of_due_runs_are_never_shared<S: RunStore>(store: S, runs: usize) {
    let mut ids = Vec::new();
    for i in 0..runs {
        ids.push(
            start(&store, &scope("t1", &format!("due-{i}")), "crashed", T0)
                .await
                .run,
        );
    }
    start(&store, &scope("t1", "live"), "alive", T0 + LEASE_MS).await;
    let other_op = Scope::new(
        scope("t1", "x").tenant,
        Operation::new("other.op").unwrap(),
        scope("t1", "other-op").key,
    );
    start(&store, &other_op, "crashed", T0).await;

    let ops = Arc::new(vec![Operation::new("payments.create").unwrap()]);
    let now = T0 + LEASE_MS + 1;
    let mut tasks = Vec::new();
    for w in 0..8 {
        let (store, ops) = (store.clone(), ops.clone());
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let got = store
                    .claim_due(&ops, &format!("worker-{w}"), now, now + LEASE_MS, 3)
                    .await
                    .unwrap();
                if got.is_empty() {
                    return mine;
                }
                mine.extend(got.into_iter().map(|r| (r.id, r.fence, r.holder)));
            }
        }));
    }
    let mut claimed: HashMap<RunId, usize> = HashMap::new();
    for t in tasks {
        for (id, fence, holder) in t.await.unwrap() {
            assert_eq!(fence, Fence(2), "a claim bumps the fence");
            assert!(holder.unwrap().starts_with("worker-"));
            *claimed.entry(id).or_default() += 1;
        }
    }
    assert_eq!(claimed.len(), runs, "every due run is claimed");
    assert!(
        claimed.values().all(|n| *n == 1),
        "no run is claimed twice: {claimed:?}"
    );
    for id in &ids {
        assert!(claimed.contains_key(id));
    }
    assert!(
        !claimed.contains_key(&RunId::of(&store.namespace().await.unwrap(), &other_op)),
        "only the operations asked for"
    );
}

/// Steps come back in their order with every field; a final run moves its
/// key record's expiry and is purged after it with its steps; the key can
/// then start a new run, whose fence continues the old one's.
pub async fn final_runs_expire_with_their_key<S: RunStore>(store: S) {
    let s = scope("t1", "run-final");
    let lease = start(&store, &s, "exec-a", T0).await;
    for (i, name) in ["reserve", "charge", "mail"].iter().enumerate() {
        let st = step(name, i as i64 + 1, StepState::Done, 1, lease.fence);
        assert!(
            store
                .record_run(&lease, &RunChange::default(), Some(&st), T0)
                .await
                .unwrap()
        );
    }
    let again = StepRecord {
        attempts: 2,
        error: Some("timeout".into()),
        ..step("charge", 2, StepState::Started, 2, lease.fence)
    };
    assert!(
        store
            .record_run(&lease, &RunChange::default(), Some(&again), T0 + 1)
            .await
            .unwrap()
    );
    let run = load(&store, &lease.run).await;
    let names: Vec<&str> = run.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["reserve", "charge", "mail"], "steps in their order");
    let charge = run.step("charge").unwrap();
    assert_eq!((charge.state, charge.attempts), (StepState::Started, 2));
    assert_eq!(charge.error.as_deref(), Some("timeout"));
    assert_eq!(charge.started_at_ms, Some(T0), "the first start is kept");

    // Finished: the run and its key record expire together.
    let engine = Engine::with_clock(store.clone(), ManualClock::new(T0 + 100));
    let mut tx = store.begin().await.unwrap();
    let expires = T0 + 1_000;
    let done = RunChange {
        state: Some(RunState::Completed),
        expires_at_ms: Some(expires),
        ..RunChange::default()
    };
    assert!(
        S::record_run_in(&mut tx, &lease, &done, None, T0 + 100)
            .await
            .unwrap()
    );
    store
        .complete(
            tx,
            &s,
            &Completion::completed(response(201, "{}")),
            T0 + 100,
        )
        .await
        .unwrap();
    let key = store.fetch(&s).await.unwrap().unwrap();
    assert_eq!(
        (key.state, key.expires_at_ms),
        (RecordState::Completed, expires)
    );
    let run = load(&store, &lease.run).await;
    assert_eq!(
        (run.state, run.finished_at_ms),
        (RunState::Completed, Some(T0 + 100))
    );
    assert_eq!(store.purge_runs(expires - 1, 100).await.unwrap(), 0);
    assert_eq!(store.purge_runs(expires, 100).await.unwrap(), 1);
    assert!(store.load_run(&lease.run).await.unwrap().is_none());

    // The key expired too: a new intent with it starts a new run, and a
    // final run left behind (its key purged first) is replaced with its
    // fence carried on, never restarted at 1.
    let s2 = scope("t1", "run-final-2");
    let first = start(&store, &s2, "exec-a", T0).await;
    let mut tx = store.begin().await.unwrap();
    let end = RunChange {
        state: Some(RunState::Failed),
        expires_at_ms: Some(T0 + 10),
        ..RunChange::default()
    };
    assert!(
        S::record_run_in(
            &mut tx,
            &first,
            &end,
            Some(&step("x", 1, StepState::Done, 1, first.fence)),
            T0
        )
        .await
        .unwrap()
    );
    store
        .complete(tx, &s2, &Completion::failed(response(402, "{}")), T0)
        .await
        .unwrap();
    assert_eq!(
        engine.purge_expired(100, 10).await.unwrap(),
        1,
        "the key record is purged"
    );
    let second = start(&store, &s2, "exec-b", T0 + 200).await;
    assert_eq!(
        second.fence,
        Fence(first.fence.0 + 1),
        "fences never go back"
    );
    let run = load(&store, &second.run).await;
    assert_eq!(
        (run.state, run.steps.len()),
        (RunState::Running, 0),
        "a fresh run"
    );
    assert!(
        !store
            .record_run(&first, &RunChange::default(), None, T0)
            .await
            .unwrap(),
        "the old run's executor cannot write into the new run"
    );

    // A live run of the id blocks a second one: Corrupt, nothing written.
    let s3 = scope("t1", "run-final-3");
    let live = start(&store, &s3, "exec-a", T0).await;
    let mut tx = store.begin().await.unwrap();
    let err = S::create_run(
        &mut tx,
        &NewRun {
            id: &live.run,
            scope: &s3,
            input: b"",
            holder: "intruder",
            locked_until_ms: T0,
            deadline_ms: T0,
            ttl_ms: 1,
            now_ms: T0,
        },
    )
    .await
    .unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    drop(tx);
    assert_eq!(
        load(&store, &live.run).await.holder.as_deref(),
        Some("exec-a")
    );
}

/// Listing: newest first, by state, bounded.
pub async fn runs_are_listed_by_state<S: RunStore>(store: S) {
    let mut leases = Vec::new();
    for i in 0..5 {
        leases.push(start(&store, &scope("t1", &format!("list-{i}")), "exec-a", T0 + i).await);
    }
    let attention = RunChange {
        state: Some(RunState::NeedsAttention),
        attention: Some(Some(("mail", "unknown"))),
        ..RunChange::default()
    };
    assert!(
        store
            .record_run(&leases[1], &attention, None, T0)
            .await
            .unwrap()
    );
    let all = store.list_runs(&RunFilter::default()).await.unwrap();
    assert_eq!(all.len(), 5);
    assert_eq!(all[0].id, leases[4].run, "newest first");
    assert!(all.iter().all(|r| r.steps.is_empty()), "without steps");
    let stuck = store
        .list_runs(&RunFilter {
            state: Some(RunState::NeedsAttention),
            limit: 10,
        })
        .await
        .unwrap();
    assert_eq!(stuck.len(), 1);
    assert_eq!(stuck[0].id, leases[1].run);
    let two = store
        .list_runs(&RunFilter {
            state: None,
            limit: 2,
        })
        .await
        .unwrap();
    assert_eq!(two.len(), 2);
}

/// Runs are counted per state, states with none left out.
pub async fn runs_are_counted_by_state<S: RunStore>(store: S) {
    assert_eq!(store.count_runs().await.unwrap(), vec![], "none yet");
    let mut leases = Vec::new();
    for i in 0..3 {
        leases.push(
            start(
                &store,
                &scope("t1", &format!("count-{i}")),
                "exec-a",
                T0 + i,
            )
            .await,
        );
    }
    let attention = RunChange {
        state: Some(RunState::NeedsAttention),
        attention: Some(Some(("mail", "unknown"))),
        ..RunChange::default()
    };
    assert!(
        store
            .record_run(&leases[2], &attention, None, T0)
            .await
            .unwrap()
    );
    let mut counts = store.count_runs().await.unwrap();
    counts.sort_by_key(|(s, _)| s.as_str());
    assert_eq!(
        counts,
        vec![(RunState::NeedsAttention, 1), (RunState::Running, 2)]
    );
}
