//! Runs on real databases: replay, resume without repeating, crashes in the
//! window of drill 7, zombies fenced out, compensation, deadlines, the point
//! of no return, effects on sinks without keys, concurrent executors.

use std::time::{Duration, Instant};

use idem_core::steps::{Fence, MessageState, RunId, RunState, StepKind, StepState};
use idem_core::{ManualClock, Policy, RecordState};
use idem_steps::{
    Ended, Resolution, ResolveError, RunsConfig, Sent, Started, WorkflowPolicy, resolve,
};

use crate::eventually;
use crate::support::*;

fn body(ended: &Ended) -> serde_json::Value {
    match ended {
        Ended::Finished(c) => serde_json::from_slice(&c.response.body).unwrap(),
        other => panic!("expected a finished run, got {other:?}"),
    }
}

fn status(ended: &Ended) -> u16 {
    match ended {
        Ended::Finished(c) => c.response.status,
        other => panic!("expected a finished run, got {other:?}"),
    }
}

async fn rid<S: TestStore>(store: &S, key: &str) -> RunId {
    RunId::of(&store.namespace().await.unwrap(), &scope(key))
}

async fn run_of<S: TestStore>(store: &S, key: &str) -> idem_core::steps::RunRecord {
    store
        .load_run(&rid(store, key).await)
        .await
        .unwrap()
        .unwrap()
}

/// A run finishes with its answer stored on the key; the same intent again
/// replays it, byte for byte, and nothing runs twice.
pub async fn a_run_finishes_and_replays<S: TestStore>(db: Db) {
    let store = S::open(&db.url()).await;
    let flow = Flow::new(Plan::default());
    let runs = runs(store.clone(), flow.clone(), quick());
    let mut h = start(&runs, "k-1").await;
    let ended = ended(&mut h).await;
    assert_eq!(status(&ended), 201);
    assert_eq!(body(&ended)["payment"], "pay_1");
    let Started::Replay(record) = runs
        .start(
            &scope("k-1"),
            &fingerprint(b"{}"),
            &Policy::default(),
            b"{}".to_vec(),
        )
        .await
        .unwrap()
    else {
        panic!("the same intent replays");
    };
    let Ended::Finished(done) = &ended else {
        unreachable!()
    };
    assert_eq!(
        record.response.as_ref(),
        Some(&done.response),
        "the same bytes"
    );
    assert_eq!(record.state, RecordState::Completed);
    assert!(record.expires_at_ms < i64::MAX, "a final run's key expires");
    assert_eq!(
        (store.stock().await, flow.provider.charges(None)),
        (STOCK - 1, 1)
    );
    let run = run_of(&store, "k-1").await;
    assert_eq!(run.state, RunState::Completed);
    let steps: Vec<(&str, StepKind, StepState, u32)> = run
        .steps
        .iter()
        .map(|s| (s.name.as_str(), s.kind, s.state, s.attempts))
        .collect();
    assert_eq!(
        steps,
        [
            ("reserve", StepKind::Phase, StepState::Done, 1),
            ("charge", StepKind::Call, StepState::Done, 1),
            ("ship", StepKind::Call, StepState::Done, 1),
        ]
    );
    assert_eq!(run.recovery_point.as_deref(), Some("ship"));
    assert!(run.step("charge").unwrap().key.starts_with("idem:charge:"));
}

/// A run given back after a failed attempt is resumed by the next request
/// with its key: the recorded phase and call return their results without
/// running again; the failed step runs again with the same key.
pub async fn recorded_steps_are_not_run_again_on_resume<S: TestStore>(db: Db) {
    let store = S::open(&db.url()).await;
    let flow = Flow::new(Plan {
        ship: Ship::UnknownTimes(1),
        ..Plan::default()
    });
    let config = RunsConfig {
        // Every retry gives the run back instead of waiting in place.
        release_after: Duration::ZERO,
        ..quick()
    };
    let runs = runs(store.clone(), flow.clone(), config);
    let mut h = start(&runs, "k-resume").await;
    assert!(matches!(ended(&mut h).await, Ended::Released { .. }));
    let run = run_of(&store, "k-resume").await;
    assert_eq!(run.state, RunState::Running);
    assert_eq!(run.holder, None, "given back");
    let ship = run.step("ship").unwrap().clone();
    assert_eq!((ship.state, ship.attempts), (StepState::Started, 1));
    assert_eq!(ship.error.as_deref(), Some("outcome unknown: timeout"));

    let mut resumed = None;
    eventually!("the retry resumes the run", {
        match runs
            .start(
                &scope("k-resume"),
                &fingerprint(b"{}"),
                &Policy::default(),
                b"{}".to_vec(),
            )
            .await
            .unwrap()
        {
            Started::Running(h) => {
                resumed = Some(h);
                true
            }
            _ => false,
        }
    });
    let mut h = resumed.unwrap();
    assert!(h.resumed());
    assert_eq!(status(&ended(&mut h).await), 201);
    assert_eq!(store.stock().await, STOCK - 1, "the phase ran once");
    assert_eq!(
        flow.provider.charges(None),
        1,
        "the recorded charge was not made again"
    );
    let run = run_of(&store, "k-resume").await;
    let ship2 = run.step("ship").unwrap();
    assert_eq!((ship2.state, ship2.attempts), (StepState::Done, 2));
    assert_eq!(ship2.key, ship.key, "the same key on every attempt");
    assert_eq!((run.takeovers, run.fence), (1, Fence(2)));
}

/// Drill 7, in one process: the provider took the charge, then the executor
/// died before recording it. Another executor resumes the run: the
/// provider gets the same key again and holds one payment.
pub async fn a_crash_after_the_call_resumes_with_the_same_key<S: TestStore>(db: Db) {
    let store = S::open(&db.url()).await;
    let world = Flow::new(Plan::default());
    let doomed = Doomed::start::<S>(
        db.url(),
        world.with_plan(Plan {
            hold_charge: Some(Gate::new()),
            ..Plan::default()
        }),
        quick(),
        vec!["k-drill7".into()],
    );
    eventually!("the provider took the charge", {
        world.provider.state(|s| s.payments.len()) == 1
    });
    doomed.crash();
    let run = run_of(&store, "k-drill7").await;
    assert_eq!(
        run.step("charge").unwrap().state,
        StepState::Started,
        "not recorded"
    );

    let runs = runs(store.clone(), world.clone(), quick());
    let mut recovery = runs.recovery();
    eventually!("the lease expires and the run is taken over", {
        recovery.recover_once().await.unwrap() == 1
    });
    eventually!("the run completes", {
        run_of(&store, "k-drill7").await.state == RunState::Completed
    });
    let run = run_of(&store, "k-drill7").await;
    let key = run.step("charge").unwrap().key.clone();
    assert_eq!(
        world.provider.charges(Some(&key)),
        2,
        "the provider got the same key again"
    );
    assert_eq!(world.provider.charges(None), 2, "and no other");
    assert_eq!(world.provider.state(|s| s.payments.len()), 1, "one payment");
    assert_eq!(run.step("charge").unwrap().attempts, 2);
    assert_eq!((run.takeovers, store.stock().await), (1, STOCK - 1));
    let record = store.fetch(&scope("k-drill7")).await.unwrap().unwrap();
    assert_eq!(
        record.response.unwrap().status,
        201,
        "the outcome is stored"
    );
}

/// A zombie: an executor whose lease another executor took over (here: a
/// clock far ahead) finishes its call afterwards; its writes are refused by
/// the fence and it stops; the run completed once, by the other.
pub async fn a_zombie_is_fenced_out<S: TestStore>(db: Db) {
    let store = S::open(&db.url()).await;
    let gate = Gate::new();
    let world = Flow::new(Plan::default());
    let zombie = runs(
        store.clone(),
        world.with_plan(Plan {
            hold_charge: Some(gate.clone()),
            ..Plan::default()
        }),
        RunsConfig::default(),
    );
    let mut z = start(&zombie, "k-zombie").await;
    eventually!("the zombie's charge reached the provider", {
        world.provider.charges(None) == 1
    });

    let ahead = ManualClock::starting_now();
    // Past the zombie's 30 s lease, well before the run's 5 min deadline.
    ahead.advance(Duration::from_secs(120));
    let successor = idem_steps::Runs::builder(store.clone())
        .config(quick())
        .clock(ahead)
        .workflow(
            idem_core::Operation::new(OP).unwrap(),
            world.clone(),
            WorkflowPolicy::default(),
        )
        .build()
        .unwrap();
    assert_eq!(successor.recovery().recover_once().await.unwrap(), 1);
    eventually!("the successor completes the run", {
        run_of(&store, "k-zombie").await.state == RunState::Completed
    });
    let done = run_of(&store, "k-zombie").await;

    gate.open();
    assert!(
        matches!(ended(&mut z).await, Ended::LeaseLost),
        "the zombie stops when its write is refused"
    );
    let after = run_of(&store, "k-zombie").await;
    assert_eq!(after, done, "the zombie recorded nothing");
    assert_eq!(after.fence, Fence(2));
    assert!(
        after
            .steps
            .iter()
            .all(|s| s.fence == Fence(2) || s.name == "reserve")
    );
    assert_eq!(world.provider.state(|s| s.payments.len()), 1);
    assert_eq!(store.stock().await, STOCK - 1);
}

/// A permanent failure compensates the completed steps newest first, each
/// once, each a recorded step; the failure's answer is stored and replayed.
pub async fn compensations_run_newest_first_once<S: TestStore>(db: Db) {
    let store = S::open(&db.url()).await;
    let flow = Flow::new(Plan {
        ship: Ship::Permanent,
        ..Plan::default()
    });
    let runs = runs(store.clone(), flow.clone(), quick());
    let mut h = start(&runs, "k-undo").await;
    let ended = ended(&mut h).await;
    assert_eq!(status(&ended), 402);
    assert_eq!(body(&ended)["failed"], "step_failed");
    assert_eq!(flow.log(), ["refund", "release"], "newest first");
    assert_eq!(store.stock().await, STOCK, "released once");
    assert_eq!(flow.provider.state(|s| s.refunds.len()), 1, "refunded once");
    let run = run_of(&store, "k-undo").await;
    assert_eq!(run.state, RunState::Failed);
    let failure = run.failure.clone().unwrap();
    assert_eq!(
        (failure.reason.as_str(), failure.step.as_deref()),
        ("step_failed", Some("ship"))
    );
    let kinds: Vec<(&str, StepKind, StepState)> = run
        .steps
        .iter()
        .map(|s| (s.name.as_str(), s.kind, s.state))
        .collect();
    assert!(kinds.contains(&("refund", StepKind::Undo, StepState::Done)));
    assert!(kinds.contains(&("release", StepKind::UndoPhase, StepState::Done)));
    assert!(kinds.contains(&("ship", StepKind::Call, StepState::Failed)));
    let refund_key = run.step("refund").unwrap().key.clone();
    assert_ne!(
        refund_key,
        run.step("charge").unwrap().key,
        "its own derived key"
    );
    let Started::Replay(record) = runs
        .start(
            &scope("k-undo"),
            &fingerprint(b"{}"),
            &Policy::default(),
            b"{}".to_vec(),
        )
        .await
        .unwrap()
    else {
        panic!("the failure is replayed");
    };
    assert_eq!(record.state, RecordState::Failed);
    assert_eq!(record.response.unwrap().status, 402);
    assert_eq!(flow.log().len(), 2, "nothing ran again");
}

/// Killed in the middle of compensation — the provider refunded, the
/// executor died before recording it — the successor resumes the
/// compensation: the refund goes out again with the same key (one refund),
/// the stock is released once.
pub async fn a_crash_during_compensation_resumes_without_repeating<S: TestStore>(db: Db) {
    let store = S::open(&db.url()).await;
    let world = Flow::new(Plan {
        ship: Ship::Permanent,
        ..Plan::default()
    });
    let doomed = Doomed::start::<S>(
        db.url(),
        world.with_plan(Plan {
            ship: Ship::Permanent,
            hold_refund: Some(Gate::new()),
            ..Plan::default()
        }),
        quick(),
        vec!["k-undo-crash".into()],
    );
    eventually!("the provider refunded", {
        world.provider.state(|s| s.refunds.len()) == 1
    });
    doomed.crash();
    let run = run_of(&store, "k-undo-crash").await;
    assert_eq!(run.state, RunState::Compensating);
    assert_eq!(run.step("refund").unwrap().state, StepState::Started);

    let runs = runs(store.clone(), world.clone(), quick());
    let mut recovery = runs.recovery();
    eventually!("the run is taken over", {
        recovery.recover_once().await.unwrap() == 1
    });
    eventually!("the run fails, compensated", {
        run_of(&store, "k-undo-crash").await.state == RunState::Failed
    });
    let run = run_of(&store, "k-undo-crash").await;
    let refund_key = run.step("refund").unwrap().key.clone();
    let refund_requests = world.provider.state(|s| {
        s.requests
            .iter()
            .filter(|(op, k)| op == "refund" && *k == refund_key)
            .count()
    });
    assert_eq!(refund_requests, 2, "the refund went out again with its key");
    assert_eq!(world.provider.state(|s| s.refunds.len()), 1, "one refund");
    assert_eq!(store.stock().await, STOCK, "released once");
    assert_eq!(
        world.log(),
        ["refund", "release"],
        "each compensation recorded once"
    );
    let record = store.fetch(&scope("k-undo-crash")).await.unwrap().unwrap();
    assert_eq!(record.response.unwrap().status, 402);
}

/// An executor that dies while backing off does not hand its successor a
/// faster retry: the next attempt waits out the backoff the last failure
/// started, however soon the lease lapsed.
pub async fn a_successor_keeps_the_backoff<S: TestStore>(db: Db) {
    let store = S::open(&db.url()).await;
    let world = Flow::new(Plan::default());
    world.provider.0.lock().unwrap().lose_charge_answers_until =
        Some(Instant::now() + Duration::from_secs(60));
    let backoff = Duration::from_secs(3);
    let config = RunsConfig {
        backoff: idem_core::Backoff {
            initial: backoff,
            max: backoff,
        },
        ..quick()
    };
    let doomed = Doomed::start::<S>(
        db.url(),
        world.clone(),
        config.clone(),
        vec!["k-slow".into()],
    );
    let id = rid(&store, "k-slow").await;
    eventually!("the first attempt failed", {
        store
            .load_run(&id)
            .await
            .unwrap()
            .is_some_and(|r| r.step("charge").is_some_and(|c| c.failures == 1))
    });
    doomed.crash();
    let failed_at = run_of(&store, "k-slow")
        .await
        .step("charge")
        .unwrap()
        .updated_at_ms;
    let runs = runs(store.clone(), world.clone(), config);
    let mut recovery = runs.recovery();
    eventually!("the successor tried again", {
        let _ = recovery.recover_once().await;
        world.provider.charges(None) == 2
    });
    let retried_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let least = i64::try_from(backoff.as_millis()).unwrap() / 2;
    assert!(
        retried_at - failed_at >= least,
        "retried {} ms after the failure, the backoff is at least {least} ms (the lease: 1 s)",
        retried_at - failed_at
    );
}

/// A compensation that keeps taking its process down does not loop for
/// ever: after `max_attempts` × `CUT_SHORT_FACTOR` attempts cut short, the
/// run waits for an operator and nothing is sent again.
pub async fn a_step_that_keeps_crashing_waits_for_an_operator<S: TestStore>(db: Db) {
    let store = S::open(&db.url()).await;
    let world = Flow::new(Plan {
        ship: Ship::Permanent,
        ..Plan::default()
    });
    let config = RunsConfig {
        max_attempts: 1,
        ..quick()
    };
    let crashing = Plan {
        ship: Ship::Permanent,
        hold_refund: Some(Gate::new()),
        ..Plan::default()
    };
    let refunds = |world: &Flow| {
        world
            .provider
            .state(|s| s.requests.iter().filter(|(op, _)| op == "refund").count())
    };
    let mut doomed = Doomed::start::<S>(
        db.url(),
        world.with_plan(crashing.clone()),
        config.clone(),
        vec!["k-poison".into()],
    );
    for cut in 1..=idem_steps::CUT_SHORT_FACTOR as usize {
        eventually!("the refund went out again", refunds(&world) == cut);
        doomed.crash();
        doomed =
            Doomed::recovering::<S>(db.url(), world.with_plan(crashing.clone()), config.clone());
    }
    eventually!("the run stops for an operator", {
        run_of(&store, "k-poison").await.state == RunState::NeedsAttention
    });
    doomed.crash();
    let run = run_of(&store, "k-poison").await;
    assert_eq!(run.blocked_step.as_deref(), Some("refund"));
    let reason = run.attention.unwrap();
    assert!(reason.contains("cut short"), "{reason}");
    assert_eq!(
        refunds(&world),
        idem_steps::CUT_SHORT_FACTOR as usize,
        "no attempt after the bound"
    );
    assert_eq!(world.provider.state(|s| s.refunds.len()), 1, "one refund");
}

/// Retried with its key until the deadline, a call whose outcome stays
/// unknown makes the run compensate; its compensation learns the outcome
/// by the call's lookup and refunds: no net charge.
pub async fn past_its_deadline_a_run_compensates<S: TestStore>(db: Db) {
    let store = S::open(&db.url()).await;
    let flow = Flow::new(Plan::default());
    let deadline = Duration::from_secs(1);
    // Every answer before the deadline is lost (the charges go through).
    flow.provider.0.lock().unwrap().lose_charge_answers_until =
        Some(Instant::now() + deadline + Duration::from_millis(500));
    // The refund's first attempts fall in the window too: enough attempts
    // to outlast it.
    let config = RunsConfig {
        max_attempts: 100,
        ..quick()
    };
    let runs = runs_with(
        store.clone(),
        flow.clone(),
        config,
        WorkflowPolicy { deadline },
    );
    let mut h = start(&runs, "k-deadline").await;
    let ended = ended(&mut h).await;
    assert_eq!(status(&ended), 402);
    assert_eq!(body(&ended)["failed"], "deadline");
    let run = run_of(&store, "k-deadline").await;
    let charge = run.step("charge").unwrap();
    assert!(charge.attempts > 1, "retried before the deadline");
    assert_eq!(
        flow.provider.charges(Some(&charge.key)),
        flow.provider.charges(None),
        "always the same key"
    );
    assert_eq!(
        flow.provider.state(|s| (s.payments.len(), s.refunds.len())),
        (1, 1),
        "no net charge"
    );
    assert_eq!(store.stock().await, STOCK);
    assert_eq!(run.failure.unwrap().step.as_deref(), Some("charge"));
}

/// A call whose every attempt certainly did nothing (a refused connection)
/// has nothing to undo: past the deadline the run compensates the rest
/// without asking the provider anything.
pub async fn a_call_that_never_happened_is_not_compensated<S: TestStore>(db: Db) {
    let store = S::open(&db.url()).await;
    let flow = Flow::new(Plan::default());
    let deadline = Duration::from_secs(1);
    flow.provider.0.lock().unwrap().refuse_charges_until =
        Some(Instant::now() + Duration::from_secs(60));
    let runs = runs_with(
        store.clone(),
        flow.clone(),
        quick(),
        WorkflowPolicy { deadline },
    );
    let mut h = start(&runs, "k-never").await;
    let ended = ended(&mut h).await;
    assert_eq!(body(&ended)["failed"], "deadline");
    assert_eq!(
        flow.provider.charges(None),
        0,
        "nothing reached the provider, before or after"
    );
    assert!(
        flow.log().iter().all(|l| l != "refund"),
        "no refund: {:?}",
        flow.log()
    );
    assert_eq!(store.stock().await, STOCK, "the stock is released");
    let run = run_of(&store, "k-never").await;
    let charge = run.step("charge").unwrap();
    assert!(charge.attempts > 1);
    assert_eq!(charge.state, StepState::NotSent, "certainly not done");
    assert!(run.step("refund").is_none(), "no compensation of it");
}

/// Retries that are not bounded by the deadline are bounded by attempts,
/// counted over every executor that resumed the run.
pub async fn retries_are_bounded_across_executors<S: TestStore>(db: Db) {
    let store = S::open(&db.url()).await;
    let flow = Flow::new(Plan {
        mail: Mail::Verify,
        ponr: true,
        unknown_after_mail: true,
        ..Plan::default()
    });
    // Every retry gives the run back; the recovery worker resumes it.
    let config = RunsConfig {
        release_after: Duration::ZERO,
        max_attempts: 3,
        ..quick()
    };
    let runs = runs(store.clone(), flow.clone(), config);
    let mut h = start(&runs, "k-budget").await;
    assert!(matches!(ended(&mut h).await, Ended::Released { .. }));
    let mut recovery = runs.recovery();
    eventually!("the run stops for an operator", {
        let _ = recovery.recover_once().await;
        run_of(&store, "k-budget").await.state == RunState::NeedsAttention
    });
    let run = run_of(&store, "k-budget").await;
    assert_eq!(run.blocked_step.as_deref(), Some("after"));
    assert_eq!(run.step("after").unwrap().failures, 3);
    assert!(
        run.takeovers >= 2,
        "resumed by several executions: {}",
        run.takeovers
    );
    assert!(run.attention.unwrap().starts_with("3 attempts failed"));
    resolve(&store, &run.id, Resolution::NotSent, now())
        .await
        .unwrap();
    let after = run_of(&store, "k-budget").await;
    let after = after.step("after").unwrap();
    assert_eq!(after.failures, 0, "its budget starts over");
    assert!(after.attempts >= 3, "its attempts stay on record");
    assert_eq!(after.state, StepState::NotSent);
}

/// After the point of no return a failure is not compensated: the run waits
/// for an operator; a step that returns a value cannot be resolved as sent.
pub async fn past_the_point_of_no_return_a_failure_waits_for_an_operator<S: TestStore>(db: Db) {
    let store = S::open(&db.url()).await;
    let flow = Flow::new(Plan {
        mail: Mail::Verify,
        ponr: true,
        fail_after_mail: true,
        ..Plan::default()
    });
    let runs = runs(store.clone(), flow.clone(), quick());
    let mut h = start(&runs, "k-ponr").await;
    let Ended::NeedsAttention { step, reason } = ended(&mut h).await else {
        panic!("a failure after the point of no return waits for an operator");
    };
    assert_eq!(step, "after");
    assert!(reason.contains("point of no return"), "{reason}");
    assert!(flow.log().is_empty(), "nothing compensated");
    assert_eq!(store.stock().await, STOCK - 1);
    let run = run_of(&store, "k-ponr").await;
    assert!(run.no_return);
    assert_eq!(
        (run.state, run.blocked_step.as_deref()),
        (RunState::NeedsAttention, Some("after"))
    );
    let err = resolve(&store, &run.id, Resolution::Sent, 0)
        .await
        .unwrap_err();
    assert!(matches!(err, ResolveError::ValueNeeded { .. }), "{err}");
    match runs
        .start(
            &scope("k-ponr"),
            &fingerprint(b"{}"),
            &Policy::default(),
            b"{}".to_vec(),
        )
        .await
        .unwrap()
    {
        Started::Busy {
            attention: Some(_), ..
        } => {}
        other => panic!("a retry is told the run waits for an operator: {other:?}"),
    }
}

/// An at-most-once effect whose outcome is unknown is never sent again by
/// retries or recovery; an operator resolves it: "sent" finishes the run
/// without sending, "not sent" lets it be sent once more.
pub async fn an_unknown_at_most_once_effect_waits_for_an_operator<S: TestStore>(db: Db) {
    let store = S::open(&db.url()).await;
    let flow = Flow::new(Plan {
        mail: Mail::AtMostOnce,
        ..Plan::default()
    });
    flow.sink.0.lock().unwrap().lose_answers = 1;
    let runs = runs(store.clone(), flow.clone(), quick());
    let mut h = start(&runs, "k-amo").await;
    assert!(
        matches!(ended(&mut h).await, Ended::NeedsAttention { ref step, .. } if step == "mail")
    );
    assert_eq!(flow.sink.accepted().len(), 1);
    // Retries and the recovery worker leave it alone.
    for _ in 0..3 {
        assert!(matches!(
            runs.start(
                &scope("k-amo"),
                &fingerprint(b"{}"),
                &Policy::default(),
                b"{}".to_vec()
            )
            .await
            .unwrap(),
            Started::Busy {
                attention: Some(_),
                ..
            }
        ));
        assert_eq!(runs.recovery().recover_once().await.unwrap(), 0);
    }
    assert_eq!(flow.sink.accepted().len(), 1, "never re-sent");
    let id = rid(&store, "k-amo").await;
    let resolved = resolve(&store, &id, Resolution::Sent, now()).await.unwrap();
    assert_eq!(
        (resolved.step.as_str(), resolved.state),
        ("mail", RunState::Running)
    );
    let fence = run_of(&store, "k-amo").await.fence;
    let mut recovery = runs.recovery();
    eventually!("the resolved run is resumed", {
        recovery.recover_once().await.unwrap() == 1
    });
    eventually!("and completes", {
        run_of(&store, "k-amo").await.state == RunState::Completed
    });
    assert_eq!(flow.sink.accepted().len(), 1, "sent once");
    let run = run_of(&store, "k-amo").await;
    assert!(run.fence > fence, "the resolution moved the fence");
    let mail = run.step("mail").unwrap();
    assert_eq!(
        serde_json::from_slice::<Sent>(mail.result.as_deref().unwrap()).unwrap(),
        Sent::Operator
    );
    assert_eq!(
        store.message(&mail.key).await.unwrap().unwrap().state,
        MessageState::Sent
    );

    // Swallowed (never arrived): "not sent" lets it go once more.
    flow.sink.0.lock().unwrap().swallow = 1;
    let mut h = start(&runs, "k-amo-2").await;
    assert!(matches!(ended(&mut h).await, Ended::NeedsAttention { .. }));
    assert!(flow.sink.accepted().len() == 1, "nothing arrived");
    resolve(
        &store,
        &rid(&store, "k-amo-2").await,
        Resolution::NotSent,
        now(),
    )
    .await
    .unwrap();
    let mut recovery = runs.recovery();
    eventually!("resumed", recovery.recover_once().await.unwrap() == 1);
    eventually!("completes", {
        run_of(&store, "k-amo-2").await.state == RunState::Completed
    });
    assert_eq!(flow.sink.accepted().len(), 2, "sent exactly once more");
    let err = resolve(
        &store,
        &rid(&store, "k-amo-2").await,
        Resolution::Sent,
        now(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ResolveError::NotBlocked { .. }), "{err}");
}

fn now() -> i64 {
    idem_core::Clock::now_ms(&idem_core::SystemClock)
}

/// Verify-then-send: after an unknown outcome, the sink is asked first; a
/// message that arrived is not sent again, one that did not is.
pub async fn verify_then_send_asks_before_sending_again<S: TestStore>(db: Db) {
    let store = S::open(&db.url()).await;
    let flow = Flow::new(Plan {
        mail: Mail::Verify,
        ..Plan::default()
    });
    flow.sink.0.lock().unwrap().lose_answers = 1;
    let call_timeout = Duration::from_millis(300);
    let config = RunsConfig {
        call_timeout,
        ..quick()
    };
    let runs = runs(store.clone(), flow.clone(), config);
    let began = std::time::Instant::now();
    let mut h = start(&runs, "k-verify").await;
    assert_eq!(status(&ended(&mut h).await), 201);
    assert!(
        began.elapsed() >= call_timeout,
        "the sink was asked only after the lost send had a call's time to land"
    );
    assert_eq!(
        flow.sink.accepted().len(),
        1,
        "arrived once, not sent again"
    );
    let mail = run_of(&store, "k-verify")
        .await
        .step("mail")
        .unwrap()
        .clone();
    assert_eq!(
        serde_json::from_slice::<Sent>(mail.result.as_deref().unwrap()).unwrap(),
        Sent::Verified
    );
    assert_eq!(mail.attempts, 2);

    flow.sink.0.lock().unwrap().swallow = 1;
    let mut h = start(&runs, "k-verify-2").await;
    assert_eq!(status(&ended(&mut h).await), 201);
    let accepted = flow.sink.accepted();
    assert_eq!(
        accepted.len(),
        2,
        "the swallowed message was sent again, once"
    );
    assert_ne!(accepted[0], accepted[1], "each run its own message id");
}

/// The send-once ledger holds a message id across runs: a second run with
/// the same message id finds it sent and sends nothing.
pub async fn the_send_once_ledger_spans_runs<S: TestStore>(db: Db) {
    let store = S::open(&db.url()).await;
    let flow = Flow::new(Plan {
        mail: Mail::Verify,
        mail_id: Some("confirm-ord_1".into()),
        ..Plan::default()
    });
    let runs = runs(store.clone(), flow.clone(), quick());
    for key in ["k-ledger-1", "k-ledger-2"] {
        let mut h = start(&runs, key).await;
        assert_eq!(status(&ended(&mut h).await), 201);
    }
    assert_eq!(flow.sink.accepted(), ["confirm-ord_1"]);
    let second = run_of(&store, "k-ledger-2").await;
    let mail = second.step("mail").unwrap();
    assert_eq!(
        serde_json::from_slice::<Sent>(mail.result.as_deref().unwrap()).unwrap(),
        Sent::Before
    );
    let entry = store.message("confirm-ord_1").await.unwrap().unwrap();
    assert_eq!(
        (entry.state, entry.run_id),
        (
            MessageState::Sent,
            rid(&store, "k-ledger-1").await.to_string()
        )
    );
}

/// Several executors recovering the runs of a crashed one never execute one
/// run at once: the provider never sees two requests with one key in
/// flight, and each run completes once.
pub async fn concurrent_executors_never_run_one_run_at_once<S: TestStore>(db: Db) {
    let store = S::open(&db.url()).await;
    let world = Flow::new(Plan::default());
    world.provider.0.lock().unwrap().charge_delay = Duration::from_millis(30);
    let keys: Vec<String> = (0..16).map(|i| format!("k-many-{i}")).collect();
    let doomed = Doomed::start::<S>(
        db.url(),
        world.with_plan(Plan {
            hold_charge: Some(Gate::new()),
            ..Plan::default()
        }),
        quick(),
        keys.clone(),
    );
    eventually!("every charge reached the provider", {
        world.provider.state(|s| s.payments.len()) == keys.len()
    });
    doomed.crash();
    let mut workers = Vec::new();
    for _ in 0..3 {
        let runs = runs(S::open(&db.url()).await, world.clone(), quick());
        workers.push(tokio::spawn(async move {
            let mut recovery = runs.recovery();
            let until = Instant::now() + Duration::from_secs(15);
            while Instant::now() < until {
                let _ = recovery.recover_once().await;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    eventually!("every run completes", {
        store
            .list_runs(&idem_core::steps::RunFilter {
                state: Some(RunState::Completed),
                limit: 100,
            })
            .await
            .unwrap()
            .len()
            == keys.len()
    });
    for w in workers {
        w.abort();
    }
    assert_eq!(
        world.provider.state(|s| s.max_in_flight),
        1,
        "never two at once"
    );
    assert_eq!(
        world.provider.state(|s| s.payments.len()),
        keys.len(),
        "one payment each"
    );
    assert_eq!(store.stock().await, STOCK - keys.len() as i64);
    for key in &keys {
        let run = run_of(&store, key).await;
        assert!(run.takeovers >= 1 && run.fence.0 >= 2, "{key}: {run:?}");
    }
}

/// A run whose database goes away mid-run stops without recording anything
/// out of order, and resumes once the database is back (PostgreSQL, behind
/// a proxy that cuts the connections).
pub async fn a_lost_database_stops_the_run_until_it_returns(db: Db) {
    let url = db.url();
    let proxy = idem_testkit::Proxy::start(idem_testkit::url_addr(&url)).await;
    let via = idem_testkit::url_via(&url, proxy.addr);
    let store = <idem_postgres::PgStore as TestStore>::open(&via).await;
    let gate = Gate::new();
    let world = Flow::new(Plan::default());
    let runs = runs(
        store.clone(),
        world.with_plan(Plan {
            hold_charge: Some(gate.clone()),
            ..Plan::default()
        }),
        quick(),
    );
    let mut h = start(&runs, "k-db-down").await;
    eventually!("the charge reached the provider", {
        world.provider.charges(None) == 1
    });
    proxy.cut().await;
    gate.open();
    match ended(&mut h).await {
        Ended::StoreFailed { .. } | Ended::LeaseLost => {}
        other => panic!("the run stops when its store is gone: {other:?}"),
    }
    proxy.restore();
    let direct = <idem_postgres::PgStore as TestStore>::open(&url).await;
    let run = run_of(&direct, "k-db-down").await;
    assert_eq!(
        run.step("charge").unwrap().state,
        StepState::Started,
        "nothing out of order"
    );
    let runs = crate::support::runs(store.clone(), world.clone(), quick());
    let mut recovery = runs.recovery();
    eventually!("resumed once its lease expired", {
        recovery.recover_once().await.unwrap_or(0) == 1
    });
    eventually!("and completes", {
        run_of(&direct, "k-db-down").await.state == RunState::Completed
    });
    assert_eq!(world.provider.state(|s| s.payments.len()), 1);
    assert_eq!(direct.stock().await, STOCK - 1);
}
