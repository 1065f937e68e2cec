use super::*;
use crate::steps::Namespace;
use crate::{IdempotencyKey, Tenant};

#[test]
fn names_are_checked() {
    assert!(QueueName::new("triage.v2_a-b").is_ok());
    for bad in ["", "a b", "é", &"q".repeat(65)] {
        assert!(QueueName::new(bad).is_err(), "{bad:?}");
        assert!(PollerName::new(bad).is_err(), "{bad:?}");
        assert!(ActionName::new(bad).is_err(), "{bad:?}");
    }
    assert!(WorkerName::new("host-a:4711@eu").is_ok());
    assert!(WorkerName::new("a/b").is_err());
    assert!(WorkerName::new("w".repeat(129)).is_err());
    let err = QueueName::new("x".repeat(200)).unwrap_err().to_string();
    assert!(err.starts_with("queue must be"), "{err}");
    assert!(err.len() < 200, "the value is cut: {err}");
}

#[test]
fn task_ids_are_derived_and_parsed() {
    let ns = Namespace::new("n1").unwrap();
    let t = Tenant::new("acme").unwrap();
    let q = QueueName::new("triage").unwrap();
    let k = IdempotencyKey::new("obs-1").unwrap();
    let id = TaskId::of(&ns, &t, &q, &k);
    assert_eq!(TaskId::parse(id.as_str()).unwrap(), id);
    let other_queue = TaskId::of(&ns, &t, &QueueName::new("mail").unwrap(), &k);
    let other_tenant = TaskId::of(&ns, &Tenant::new("globex").unwrap(), &q, &k);
    let other_ns = TaskId::of(&Namespace::new("n2").unwrap(), &t, &q, &k);
    assert!(id != other_queue && id != other_tenant && id != other_ns);
    for bad in [
        "tsk_",
        "tsk_XYZ",
        "run_0123456789abcdef0123456789abcdef",
        "tsk_0123",
    ] {
        assert!(TaskId::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn action_keys_are_valid_idempotency_keys() {
    let ns = Namespace::new("n1").unwrap();
    let id = TaskId::parse("tsk_0123456789abcdef0123456789abcdef").unwrap();
    let name = ActionName::new("a".repeat(64)).unwrap();
    let key = ActionKey::derive(&ns, &id, &name);
    assert!(IdempotencyKey::new(key.as_str()).is_ok(), "{key}");
    assert_ne!(
        key,
        ActionKey::derive(&ns, &id, &ActionName::new("b").unwrap())
    );
}

#[test]
fn states_and_modes_round_trip() {
    for s in TaskState::ALL {
        assert_eq!(TaskState::parse(s.as_str()), Some(s));
    }
    assert_eq!(TaskState::parse("READY"), None);
    assert!(TaskState::Done.is_final() && !TaskState::NeedsAttention.is_final());
    for m in [ActionMode::AtMostOnce, ActionMode::Verify] {
        assert_eq!(ActionMode::parse(m.as_str()), Some(m));
    }
    assert_eq!(ActionMode::parse("exactly-once"), None);
    assert_eq!(
        ActionOutcome::parse("not-sent"),
        Some(ActionOutcome::NotSent)
    );
    assert_eq!(ActionOutcome::parse("sent"), None);
}

#[test]
fn corrupt_columns_are_an_error_not_a_panic() {
    let ok = TaskColumns {
        state: "ready".into(),
        attempt: 0,
        max_attempts: 5,
        ..TaskColumns::default()
    };
    assert!(ok.clone().decode().is_ok());
    let bad_state = TaskColumns {
        state: "lost".into(),
        ..ok.clone()
    };
    assert!(bad_state.decode().is_err());
    let negative = TaskColumns { attempt: -1, ..ok };
    assert!(negative.decode().is_err());
}

fn claimed(fence: i64, attempt: u32, until: i64) -> TaskRecord {
    TaskRecord {
        id: "tsk_0123456789abcdef0123456789abcdef".into(),
        tenant: "acme".into(),
        queue: "q".into(),
        key: "k".into(),
        payload: "{}".into(),
        payload_hash: "h".into(),
        state: TaskState::Claimed,
        priority: 0,
        run_at_ms: 0,
        attempt,
        max_attempts: 3,
        fence,
        holder: Some("w1".into()),
        lease_expires_at_ms: Some(until),
        result: None,
        result_hash: None,
        last_error: None,
        created_at_ms: 0,
        updated_at_ms: 0,
        finished_at_ms: None,
        claim_kind: Some("claimed".into()),
    }
}

#[test]
fn only_the_live_holder_writes() {
    let t = claimed(4, 1, 1_000);
    let beat = Settle::Heartbeat { lease_ms: 500 };
    assert_eq!(
        plan_settle(&t, 4, &beat, 999),
        SettlePlan::Write(SettleWrite::Renew { until_ms: 1_499 })
    );
    // Another fence, or the lease ended by the database's clock.
    for (fence, now) in [(3, 10), (5, 10), (4, 1_000), (4, 2_000)] {
        assert!(
            matches!(
                plan_settle(&t, fence, &beat, now),
                SettlePlan::Refuse(Refusal::LeaseLost)
            ),
            "fence {fence} at {now}"
        );
    }
}

#[test]
fn a_completion_repeats_and_mismatches_by_its_fence() {
    let mut t = claimed(2, 1, 1_000);
    let done = Settle::Complete {
        result: "{}",
        result_hash: "r1",
    };
    assert_eq!(
        plan_settle(&t, 2, &done, 10),
        SettlePlan::Write(SettleWrite::Complete)
    );
    t.state = TaskState::Done;
    t.result_hash = Some("r1".into());
    t.lease_expires_at_ms = None;
    assert!(matches!(
        plan_settle(&t, 2, &done, 5_000),
        SettlePlan::Refuse(Refusal::Repeated)
    ));
    let other = Settle::Complete {
        result: "[]",
        result_hash: "r2",
    };
    assert!(matches!(
        plan_settle(&t, 2, &other, 10),
        SettlePlan::Refuse(Refusal::Mismatch)
    ));
    // A zombie with an older fence is refused, whatever it sends.
    assert!(matches!(
        plan_settle(&t, 1, &done, 10),
        SettlePlan::Refuse(Refusal::LeaseLost)
    ));
}

#[test]
fn failures_retry_until_the_attempts_run_out() {
    let fail = Settle::Fail {
        error: "boom",
        retry_at_ms: 5,
    };
    assert_eq!(
        plan_settle(&claimed(1, 2, 100), 1, &fail, 10),
        SettlePlan::Write(SettleWrite::Retry { run_at_ms: 10 }),
        "never before now"
    );
    assert_eq!(
        plan_settle(&claimed(1, 3, 100), 1, &fail, 10),
        SettlePlan::Write(SettleWrite::Dead)
    );
    // The same failure again (its answer lost): answered as it was.
    let mut failed = claimed(1, 2, 100);
    failed.state = TaskState::Ready;
    failed.holder = None;
    failed.last_error = Some("boom".into());
    assert_eq!(
        plan_settle(&failed, 1, &fail, 50),
        SettlePlan::Refuse(Refusal::Repeated)
    );
    let other = Settle::Fail {
        error: "else",
        retry_at_ms: 5,
    };
    assert_eq!(
        plan_settle(&failed, 1, &other, 50),
        SettlePlan::Refuse(Refusal::LeaseLost)
    );
    assert_eq!(
        plan_settle(&failed, 2, &fail, 50),
        SettlePlan::Refuse(Refusal::LeaseLost)
    );
}

#[test]
fn an_ask_is_told_go_again_only_when_it_is_the_same_ask() {
    use crate::steps::MessageState::{NotSent, Sending, Sent};
    let ask = |key: Option<&str>, mode| AskHolder::new("tsk_1", 3, key, mode);
    let a = ask(Some("agent-3:n1:ask:1"), ActionMode::Verify);
    assert_eq!(a, ask(Some("agent-3:n1:ask:1"), ActionMode::Verify));
    assert!(a.as_str().starts_with("tsk_1@3#k"), "{}", a.as_str());
    assert!(
        !a.as_str().contains("agent-3"),
        "the key is kept as a digest"
    );
    let told = |entry: &AskHolder, asker: &AskHolder| decide_ask(Sending, entry.as_str(), asker);
    assert_eq!(told(&a, &a), AskAnswer::Decided(ActionDecision::Go));
    let other = ask(Some("agent-3:n2:ask:1"), ActionMode::Verify);
    assert_eq!(
        told(&a, &other),
        AskAnswer::Decided(ActionDecision::Unknown)
    );
    let keyless = ask(None, ActionMode::Verify);
    assert_ne!(keyless, ask(None, ActionMode::Verify), "never a replay");
    assert_eq!(
        told(&keyless, &ask(None, ActionMode::Verify)),
        AskAnswer::Decided(ActionDecision::Unknown)
    );
    assert_eq!(
        told(&keyless, &a),
        AskAnswer::Decided(ActionDecision::Unknown)
    );
    assert_eq!(
        told(&a, &ask(Some("agent-3:n1:ask:1"), ActionMode::AtMostOnce)),
        AskAnswer::KeyReused,
        "the same key with another body"
    );
    let next_fence = AskHolder::new("tsk_1", 4, Some("agent-3:n1:ask:1"), ActionMode::Verify);
    assert_eq!(
        told(&a, &next_fence),
        AskAnswer::Decided(ActionDecision::Unknown),
        "the same key under another claim is another ask"
    );
    // An entry written before asks were told apart is no ask's.
    assert_eq!(
        decide_ask(Sending, "tsk_1@3", &a),
        AskAnswer::Decided(ActionDecision::Unknown)
    );
    assert_eq!(
        decide_ask(Sent, a.as_str(), &other),
        AskAnswer::Decided(ActionDecision::Done)
    );
    assert_eq!(
        decide_ask(NotSent, a.as_str(), &other),
        AskAnswer::Decided(ActionDecision::Go)
    );
    for (holder, fence, held) in [
        (a.as_str(), 3, true),
        (keyless.as_str(), 3, true),
        ("tsk_1@3", 3, true),
        (a.as_str(), 4, false),
        ("tsk_1@33#nabc", 3, false),
        ("tsk_12@3#nabc", 3, false),
        ("run_1", 3, false),
    ] {
        assert_eq!(
            held_by_claim(holder, "tsk_1", fence),
            held,
            "{holder} {fence}"
        );
    }
}
