//! Compensations never create what they undo: a call whose outcome is
//! unknown is looked up first (found → undone; not found → trusted only
//! after the landing window), a failing lookup is retried within its budget
//! and then waits for an operator, a call without a lookup waits for one at
//! once, and a crash between the lookup and the undo does not look again.

use std::time::{Duration, Instant};

use idem_core::steps::{RunRecord, RunState, StepKind, StepRecord, StepState};
use idem_steps::{Ended, Resolution, Runs, RunsConfig, WorkflowPolicy, resolve};

use crate::eventually;
use crate::support::*;

async fn run_of<S: TestStore>(store: &S, key: &str) -> RunRecord {
    let id = idem_core::steps::RunId::of(&store.namespace().await.unwrap(), &scope(key));
    store.load_run(&id).await.unwrap().unwrap()
}

fn finished(ended: &Ended) -> (u16, serde_json::Value) {
    match ended {
        Ended::Finished(c) => (
            c.response.status,
            serde_json::from_slice(&c.response.body).unwrap(),
        ),
        other => panic!("expected a finished run, got {other:?}"),
    }
}

/// What the compensation recorded it learned (`result` of its record).
fn learned(rec: &StepRecord) -> serde_json::Value {
    serde_json::from_slice(rec.result.as_deref().unwrap_or(b"null")).unwrap()
}

/// The provider's requests from the first lookup on.
fn after_first_lookup(flow: &Flow) -> Vec<String> {
    flow.provider.state(|s| {
        s.requests
            .iter()
            .skip_while(|(op, _)| op != "lookup")
            .map(|(op, _)| op.clone())
            .collect()
    })
}

/// Runs that have one second to finish before they compensate.
fn within_a_second<S: TestStore>(store: &S, flow: &Flow, config: RunsConfig) -> Runs<S> {
    let deadline = Duration::from_secs(1);
    runs_with(
        store.clone(),
        flow.clone(),
        config,
        WorkflowPolicy { deadline },
    )
}

/// How many payments and refunds the provider made.
fn charged_refunded(flow: &Flow) -> (usize, usize) {
    flow.provider.state(|s| (s.payments.len(), s.refunds.len()))
}

fn now() -> i64 {
    idem_core::Clock::now_ms(&idem_core::SystemClock)
}

/// The charge went through and its answers were lost until past the
/// deadline: the compensation finds the payment by the lookup and refunds
/// it once. No charge is sent after the first lookup.
pub async fn a_lookup_that_finds_the_effect_undoes_it<S: TestStore>(db: Db) {
    let store = S::open(&db.url()).await;
    let flow = Flow::new(Plan::default());
    flow.provider.0.lock().unwrap().lose_charge_answers_until =
        Some(Instant::now() + Duration::from_secs(60));
    let runs = within_a_second(&store, &flow, quick());
    let mut h = start(&runs, "k-found").await;
    let (status, body) = finished(&ended(&mut h).await);
    assert_eq!((status, body["failed"].as_str()), (402, Some("deadline")));
    assert_eq!(
        charged_refunded(&flow),
        (1, 1),
        "the charge that landed is refunded: no net charge"
    );
    let after = after_first_lookup(&flow);
    assert_eq!(after, ["lookup", "refund"], "looked up once, then refunded");
    let run = run_of(&store, "k-found").await;
    let refund = run.step("refund").unwrap();
    assert_eq!(
        (refund.kind, refund.state),
        (StepKind::Undo, StepState::Done)
    );
    assert_eq!(learned(refund)["lookup"], "found");
    assert_eq!(learned(refund)["value"], "pay_1");
    assert_eq!(
        run.step("charge").unwrap().state,
        StepState::Started,
        "still unknown on its own record"
    );
    assert_eq!(store.stock().await, STOCK);
}

/// Finding 7 in one process: every charge vanishes (a black hole: no
/// answer, no effect). Past the deadline the compensation looks the charge
/// up — it never charges to find out — and trusts "not found" only once a
/// charge can no longer land: nothing is charged, nothing refunded, and the
/// failure's answer comes after the landing window.
pub async fn not_found_after_the_landing_window_is_nothing_to_undo<S: TestStore>(db: Db) {
    let store = S::open(&db.url()).await;
    let flow = Flow::new(Plan::default());
    flow.provider.0.lock().unwrap().black_hole_charges_until =
        Some(Instant::now() + Duration::from_secs(120));
    let config = RunsConfig {
        call_timeout: Duration::from_millis(300),
        landing_margin: Duration::from_secs(1),
        ..quick()
    };
    let runs = within_a_second(&store, &flow, config);
    let mut h = start(&runs, "k-hole").await;
    let (status, body) = finished(&ended(&mut h).await);
    assert_eq!((status, body["failed"].as_str()), (402, Some("deadline")));
    assert_eq!(
        charged_refunded(&flow),
        (0, 0),
        "nothing charged, nothing refunded"
    );
    assert!(
        flow.provider.requests("vanished") >= 2,
        "retried until the deadline"
    );
    assert_eq!(
        after_first_lookup(&flow),
        ["lookup", "lookup"],
        "not found before the window, asked again after it; never a charge"
    );
    let run = run_of(&store, "k-hole").await;
    let charge = run.step("charge").unwrap();
    let refund = run.step("refund").unwrap();
    assert_eq!(
        (refund.kind, refund.state),
        (StepKind::Undo, StepState::Done)
    );
    assert_eq!(learned(refund)["lookup"], "not_found");
    let window_ends = charge.updated_at_ms + 300 + 1000;
    assert!(
        refund.finished_at_ms.unwrap() >= window_ends,
        "not found is trusted only after the landing window"
    );
    assert!(
        run.finished_at_ms.unwrap() >= window_ends,
        "and the answer waited for it"
    );
    assert_eq!(run.state, RunState::Failed);
    assert_eq!(store.stock().await, STOCK, "released");
}

/// A charge that lands late (the network held it): the first lookup does
/// not find it, the compensation waits out the landing window and asks
/// again, finds it and refunds it. Trusting the first "not found" would
/// have left it charged.
pub async fn not_found_before_the_landing_window_is_not_trusted<S: TestStore>(db: Db) {
    let store = S::open(&db.url()).await;
    let flow = Flow::new(Plan::default());
    {
        let mut s = flow.provider.0.lock().unwrap();
        s.black_hole_charges_until = Some(Instant::now() + Duration::from_secs(120));
        s.land_after = Some(Duration::from_millis(1500));
    }
    let config = RunsConfig {
        call_timeout: Duration::from_millis(500),
        landing_margin: Duration::from_secs(2),
        ..quick()
    };
    let runs = within_a_second(&store, &flow, config);
    let mut h = start(&runs, "k-late").await;
    let (status, body) = finished(&ended(&mut h).await);
    assert_eq!((status, body["failed"].as_str()), (402, Some("deadline")));
    assert_eq!(after_first_lookup(&flow), ["lookup", "lookup", "refund"]);
    assert_eq!(
        charged_refunded(&flow),
        (1, 1),
        "the late charge is refunded"
    );
    let run = run_of(&store, "k-late").await;
    assert_eq!(learned(run.step("refund").unwrap())["lookup"], "found");
}

/// Lookups that keep failing are retried within `max_attempts`, then the
/// run waits for an operator — nothing is undone blind, nothing charged.
/// Once the provider answers again, `resolve --as not-sent` lets the
/// compensation look again: found, refunded once.
pub async fn a_failing_lookup_waits_for_an_operator<S: TestStore>(db: Db) {
    let store = S::open(&db.url()).await;
    let flow = Flow::new(Plan::default());
    {
        let mut s = flow.provider.0.lock().unwrap();
        s.lose_charge_answers_until = Some(Instant::now() + Duration::from_secs(120));
        s.lookups_fail_until = Some(Instant::now() + Duration::from_secs(120));
    }
    let config = RunsConfig {
        max_attempts: 3,
        ..quick()
    };
    let runs = within_a_second(&store, &flow, config);
    let mut h = start(&runs, "k-fails").await;
    let Ended::NeedsAttention { step, reason } = ended(&mut h).await else {
        panic!("a lookup that keeps failing waits for an operator");
    };
    assert_eq!(step, "refund");
    assert!(
        reason.starts_with("3 attempts failed, the last: lookup:"),
        "{reason}"
    );
    assert_eq!(after_first_lookup(&flow), ["lookup", "lookup", "lookup"]);
    assert_eq!(flow.provider.state(|s| s.refunds.len()), 0);
    let run = run_of(&store, "k-fails").await;
    assert_eq!(
        (run.state, run.blocked_step.as_deref()),
        (RunState::NeedsAttention, Some("refund"))
    );
    let refund = run.step("refund").unwrap();
    assert_eq!((refund.state, refund.failures), (StepState::NotSent, 3));
    assert_eq!(refund.result, None, "nothing learned");

    flow.provider.0.lock().unwrap().lookups_fail_until = None;
    resolve(&store, &run.id, Resolution::NotSent, now())
        .await
        .unwrap();
    let mut recovery = runs.recovery();
    eventually!("resumed", recovery.recover_once().await.unwrap() == 1);
    eventually!("and fails, compensated", {
        run_of(&store, "k-fails").await.state == RunState::Failed
    });
    assert_eq!(charged_refunded(&flow), (1, 1));
    assert_eq!(
        after_first_lookup(&flow),
        ["lookup", "lookup", "lookup", "lookup", "refund"]
    );
    assert_eq!(store.stock().await, STOCK);
}

/// A call whose outcome is unknown and that has no lookup is never undone
/// blind, and never sent again to find out: the run waits for an operator
/// at its compensation. `resolve --as sent` (the operator checked, and
/// undid it by hand if needed) lets the run finish.
pub async fn without_a_lookup_an_unknown_outcome_waits_for_an_operator<S: TestStore>(db: Db) {
    let store = S::open(&db.url()).await;
    let flow = Flow::new(Plan {
        no_lookup: true,
        ..Plan::default()
    });
    flow.provider.0.lock().unwrap().lose_charge_answers_until =
        Some(Instant::now() + Duration::from_secs(120));
    let runs = within_a_second(&store, &flow, quick());
    let mut h = start(&runs, "k-blind").await;
    let Ended::NeedsAttention { step, reason } = ended(&mut h).await else {
        panic!("an unknown outcome without a lookup waits for an operator");
    };
    assert_eq!(step, "refund");
    assert!(reason.contains("has no lookup"), "{reason}");
    assert!(reason.contains("resolve the run --as sent"), "{reason}");
    let refund = run_of(&store, "k-blind")
        .await
        .step("refund")
        .cloned()
        .unwrap();
    assert_eq!((refund.state, refund.attempts), (StepState::NotSent, 0));
    let charges = flow.provider.charges(None);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(flow.provider.charges(None), charges, "never charged again");
    assert_eq!(flow.provider.state(|s| s.refunds.len()), 0);
    let id = run_of(&store, "k-blind").await.id;
    resolve(&store, &id, Resolution::Sent, now()).await.unwrap();
    let mut recovery = runs.recovery();
    eventually!("resumed", recovery.recover_once().await.unwrap() == 1);
    eventually!("and fails, compensated", {
        run_of(&store, "k-blind").await.state == RunState::Failed
    });
    assert_eq!(flow.provider.charges(None), charges, "never charged again");
    assert_eq!(
        flow.provider.state(|s| s.refunds.len()),
        0,
        "the operator's"
    );
    assert_eq!(store.stock().await, STOCK, "the rest is compensated");
}

/// The executor dies after the lookup found the charge and before its
/// refund reached the provider. The successor does not look again (what
/// was learned is on the compensation's record) and refunds once, with the
/// compensation's own key.
pub async fn a_crash_between_the_lookup_and_the_undo_does_not_look_again<S: TestStore>(db: Db) {
    let store = S::open(&db.url()).await;
    let world = Flow::new(Plan::default());
    world.provider.0.lock().unwrap().lose_charge_answers_until =
        Some(Instant::now() + Duration::from_secs(120));
    let config = quick();
    let policy = WorkflowPolicy {
        deadline: Duration::from_secs(1),
    };
    let doomed = Doomed::start_with::<S>(
        db.url(),
        world.with_plan(Plan {
            hold_before_refund: Some(Gate::new()),
            ..Plan::default()
        }),
        config.clone(),
        policy,
        vec!["k-between".into()],
    );
    eventually!("the lookup found the charge", {
        world.provider.requests("lookup") == 1
            && run_of(&store, "k-between")
                .await
                .step("refund")
                .is_some_and(|r| r.state == StepState::Started)
    });
    doomed.crash();
    let run = run_of(&store, "k-between").await;
    assert_eq!(learned(run.step("refund").unwrap())["lookup"], "found");
    assert_eq!(
        world.provider.requests("refund"),
        0,
        "the refund never left"
    );

    let runs = runs_with(store.clone(), world.clone(), config, policy);
    let mut recovery = runs.recovery();
    eventually!("taken over", recovery.recover_once().await.unwrap() == 1);
    eventually!("and fails, compensated", {
        run_of(&store, "k-between").await.state == RunState::Failed
    });
    assert_eq!(world.provider.requests("lookup"), 1, "not looked up again");
    assert_eq!(
        world
            .provider
            .state(|s| (s.payments.len(), s.refunds.len())),
        (1, 1)
    );
    let run = run_of(&store, "k-between").await;
    let refund = run.step("refund").unwrap();
    // One lookup, then two refund attempts: the first cut short by the
    // crash, the second the successor's.
    assert_eq!((refund.state, refund.attempts), (StepState::Done, 3));
    assert_eq!(learned(refund)["value"], "pay_1");
    assert_eq!(store.stock().await, STOCK);
}
