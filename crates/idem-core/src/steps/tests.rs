//! The tests of runs, steps and their records.

use super::*;
use crate::error::StoreError;
use crate::idempotency_key::IdempotencyKey;
use crate::scope::{Operation, Scope, Tenant};

fn scope(tenant: &str, key: &str) -> Scope {
    Scope::new(
        Tenant::new(tenant).unwrap(),
        Operation::new("orders.create").unwrap(),
        IdempotencyKey::new(key).unwrap(),
    )
}

fn ns() -> Namespace {
    Namespace::new("prod").unwrap()
}

#[test]
fn derived_keys_depend_on_namespace_scope_and_name_only() {
    let s = scope("acme", "k-1");
    let charge = StepName::new("charge").unwrap();
    let key = StepKey::derive(&ns(), &s, &charge);
    assert_eq!(key, StepKey::derive(&ns(), &s.clone(), &charge));
    assert_ne!(
        key,
        StepKey::derive(&Namespace::new("staging").unwrap(), &s, &charge)
    );
    assert_ne!(key, StepKey::derive(&ns(), &scope("other", "k-1"), &charge));
    assert_ne!(key, StepKey::derive(&ns(), &scope("acme", "k-2"), &charge));
    assert_ne!(
        key,
        StepKey::derive(&ns(), &s, &StepName::new("refund").unwrap())
    );
    // Length-prefixed: moving a character between parts changes the key.
    assert_ne!(
        StepKey::derive(&ns(), &scope("ab", "c"), &charge),
        StepKey::derive(&ns(), &scope("a", "bc"), &charge)
    );
    let long = StepName::new("x".repeat(64)).unwrap();
    let k = StepKey::derive(&ns(), &s, &long);
    assert!(IdempotencyKey::new(k.as_str()).is_ok(), "{k}");
    assert!(Namespace::new("").is_err() && Namespace::new("a b").is_err());
    assert_ne!(Namespace::generate(), Namespace::generate());
    assert!(Namespace::new(Namespace::generate().as_str()).is_ok());
}

#[test]
fn run_ids_round_trip_and_refuse_anything_else() {
    let id = RunId::of(&ns(), &scope("acme", "k-1"));
    assert_eq!(RunId::parse(id.as_str()), Ok(id.clone()));
    assert_eq!(RunId::from_suffix(id.suffix()), Ok(id.clone()));
    assert_ne!(id, RunId::of(&ns(), &scope("acme", "k-2")));
    assert_ne!(
        id,
        RunId::of(&Namespace::new("other").unwrap(), &scope("acme", "k-1"))
    );
    for bad in [
        "",
        "run_",
        "run_XYZ",
        "pay_0123456789abcdef0123456789abcdef",
        "run_0123",
    ] {
        assert!(RunId::parse(bad).is_err(), "{bad}");
    }
    assert!(RunId::parse(&format!("{}A", &id.as_str()[..35])).is_err());
}

#[test]
fn step_names_are_bounded() {
    assert!(StepName::new("charge").is_ok());
    assert!(StepName::new("mark-failed.v2_x").is_ok());
    assert!(StepName::new("").is_err());
    assert!(StepName::new("a b").is_err());
    assert!(StepName::new("a:b").is_err());
    assert!(StepName::new("x".repeat(65)).is_err());
}

#[test]
fn names_round_trip() {
    for s in RunState::ALL {
        assert_eq!(RunState::parse(s.as_str()), Some(*s));
    }
    for s in StepKind::ALL {
        assert_eq!(StepKind::parse(s.as_str()), Some(*s));
    }
    for s in StepState::ALL {
        assert_eq!(StepState::parse(s.as_str()), Some(*s));
    }
    for s in MessageState::ALL {
        assert_eq!(MessageState::parse(s.as_str()), Some(*s));
    }
    assert_eq!(RunState::parse("done"), None);
    assert!(RunState::Completed.is_final() && !RunState::Running.is_final());
    assert!(RunState::Compensating.is_live() && !RunState::NeedsAttention.is_live());
}

#[test]
fn failures_round_trip() {
    let f = Failure {
        reason: "card_declined".into(),
        step: Some("charge".into()),
        detail: Some("402 \"declined\"".into()),
    };
    assert_eq!(Failure::from_json(&f.to_json()), Some(f));
    assert_eq!(
        Failure::from_json(&Failure::new("deadline").to_json()),
        Some(Failure::new("deadline"))
    );
    assert_eq!(Failure::from_json("{}"), None);
    assert_eq!(Failure::from_json("nope"), None);
}

#[test]
fn columns_decode_or_say_what_is_wrong() {
    let s = scope("acme", "k-1");
    let good = RunColumns {
        id: RunId::of(&ns(), &s).as_str().into(),
        tenant_id: "acme".into(),
        operation: "orders.create".into(),
        idempotency_key: "k-1".into(),
        state: "running".into(),
        fence: 3,
        ..RunColumns::default()
    };
    let run = good.clone().decode().unwrap();
    assert_eq!(
        (run.state, run.fence, run.scope),
        (RunState::Running, Fence(3), s)
    );
    let bad = |c: RunColumns| match c.decode() {
        Err(StoreError::Corrupt { detail }) => detail,
        other => panic!("expected Corrupt, got {other:?}"),
    };
    assert!(
        bad(RunColumns {
            state: "done".into(),
            ..good.clone()
        })
        .contains("state")
    );
    assert!(
        bad(RunColumns {
            tenant_id: "a b".into(),
            ..good.clone()
        })
        .contains("tenant")
    );
    assert!(
        bad(RunColumns {
            failure: Some("{".into()),
            ..good.clone()
        })
        .contains("failure")
    );
    assert!(
        bad(RunColumns {
            id: "x".into(),
            ..good
        })
        .contains("run id")
    );
    let step = StepColumns {
        run_id: "r".into(),
        name: "charge".into(),
        kind: "call".into(),
        state: "started".into(),
        attempts: 2,
        ..StepColumns::default()
    };
    let (run_id, rec) = step.clone().decode().unwrap();
    assert_eq!(
        (run_id.as_str(), rec.kind, rec.attempts),
        ("r", StepKind::Call, 2)
    );
    assert!(
        StepColumns {
            kind: "x".into(),
            ..step
        }
        .decode()
        .is_err()
    );
}
