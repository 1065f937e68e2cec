//! Checks of a [`LeasedKeyStore`] when a holder does not know its work's
//! outcome: the lease ended at once, the record held from its claim.

use idem_core::leased::{
    LeaseToken, LeasedClaim, LeasedDecision, LeasedKeyStore, OnUnknown, UNRESOLVED_EXPIRES_AT_MS,
    leased_decision,
};
use idem_core::{Fingerprint, Policy, RecordState};

use super::{ClaimAt, LEASE, NOW, answer};
use crate::support::scope;

/// A holder that learns its work's outcome is unknown ends its lease at
/// once: the record stays pending with the reason, a `Reject` retry finds
/// it abandoned, a `Verify` retry takes it over and learns when the lease
/// ended; a stale token ends nothing; the lease's end is never after now;
/// a restored end (the verifier found nothing yet) is kept as given.
pub async fn a_holder_ends_its_lease_when_the_outcome_is_unknown<S: LeasedKeyStore>(store: S) {
    let s = scope("acme", "unknown-1");
    let fp = Fingerprint::from_bytes([7; 32]);
    let policy = Policy::default();
    let holder = LeaseToken::new();
    let claim = store
        .claim_at(&s, &fp, &policy, &holder, OnUnknown::Verify, NOW)
        .await
        .unwrap();
    assert!(matches!(claim, LeasedClaim::Claimed));
    assert!(
        !store
            .abandon_leased(&s, &LeaseToken::new(), NOW, Some("timeout"), NOW + 10)
            .await
            .unwrap(),
        "another token ends nothing"
    );
    let at = NOW + 100;
    assert!(
        store
            .abandon_leased(&s, &holder, at + 5_000, Some("timeout"), at)
            .await
            .unwrap(),
        "the holder ends its own lease"
    );
    let r = store.fetch(&s).await.unwrap().unwrap();
    assert_eq!(
        r.state,
        RecordState::Pending,
        "still pending: the outcome is unknown"
    );
    assert_eq!(r.locked_until_ms, Some(at), "ended at most now");
    // Reject: an operator's; no takeover.
    let LeasedClaim::Existing(record) = store
        .claim_at(
            &s,
            &fp,
            &policy,
            &LeaseToken::new(),
            OnUnknown::Reject,
            at + 1,
        )
        .await
        .unwrap()
    else {
        panic!("Reject takes nothing over")
    };
    assert_eq!(
        leased_decision(record, &fp, at + 1),
        LeasedDecision::Abandoned
    );
    // Verify: taken over at once, with the lease's end.
    let verifier = LeaseToken::new();
    let claim = store
        .claim_at(&s, &fp, &policy, &verifier, OnUnknown::Verify, at + 2)
        .await
        .unwrap();
    assert!(
        matches!(claim, LeasedClaim::TakenOver { lease_ended_at_ms } if lease_ended_at_ms == at),
        "{claim:?}"
    );
    // Nothing found yet: the verifier puts the old end back, reason kept.
    assert!(
        store
            .abandon_leased(&s, &verifier, at, None, at + 3)
            .await
            .unwrap()
    );
    let again = LeaseToken::new();
    let claim = store
        .claim_at(&s, &fp, &policy, &again, OnUnknown::Verify, at + 4)
        .await
        .unwrap();
    assert!(
        matches!(claim, LeasedClaim::TakenOver { lease_ended_at_ms } if lease_ended_at_ms == at),
        "the landing window still counts from the first end: {claim:?}"
    );
    assert!(
        !store
            .complete_leased(&s, &holder, &answer(201, "{}"), at + 5, i64::MAX)
            .await
            .unwrap(),
        "the first holder writes nothing any more"
    );
    assert!(
        store
            .complete_leased(&s, &again, &answer(201, "{}"), at + 5, at + 86_400_000)
            .await
            .unwrap()
    );
    let done = store.fetch(&s).await.unwrap().unwrap();
    assert_eq!(
        done.expires_at_ms,
        at + 86_400_000,
        "kept for its TTL from its answer"
    );
    assert!(
        !store
            .abandon_leased(&s, &again, at + 6, None, at + 6)
            .await
            .unwrap(),
        "a finished record is not abandoned"
    );
}

/// A pending record whose work may not be repeated blindly is held from
/// its claim on: its holder may die before writing anything (the work's
/// outcome as unknown as after a timeout), so it is never claimed afresh
/// nor collected, however long after its TTL — by a `reject` or `verify`
/// claim; only its answer brings it back to a TTL. A `reforward` claim
/// expires with its TTL, and one taken over by a stricter claimer is held
/// as that claimer's.
pub async fn a_pending_unknown_is_held_from_its_claim<S: LeasedKeyStore>(store: S) {
    let policy = Policy::with_ttl(std::time::Duration::from_secs(10));
    let fp = Fingerprint::from_bytes([3; 32]);
    let far = NOW + 10 * 86_400_000;
    for on_unknown in [OnUnknown::Reject, OnUnknown::Verify] {
        let s = scope("acme", &format!("held-{on_unknown}"));
        let dead = LeaseToken::new();
        let claim = store
            .claim_at(&s, &fp, &policy, &dead, on_unknown, NOW)
            .await
            .unwrap();
        assert!(matches!(claim, LeasedClaim::Claimed));
        let r = store.fetch(&s).await.unwrap().unwrap();
        assert_eq!(r.expires_at_ms, UNRESOLVED_EXPIRES_AT_MS, "{on_unknown}");
        // The holder died; a month of TTLs later nothing is collected…
        store.purge_expired(far, 1000).await.unwrap();
        assert!(store.fetch(&s).await.unwrap().is_some(), "{on_unknown}");
        // …and another request under the key finds it, never a fresh claim.
        let other = store
            .claim_at(
                &s,
                &Fingerprint::from_bytes([4; 32]),
                &policy,
                &LeaseToken::new(),
                on_unknown,
                far,
            )
            .await
            .unwrap();
        assert!(
            matches!(other, LeasedClaim::Existing(_)),
            "{on_unknown}: {other:?}"
        );
        // The same request: held for an operator, or taken over to verify.
        let again = LeaseToken::new();
        let retry = store
            .claim_at(&s, &fp, &policy, &again, on_unknown, far)
            .await
            .unwrap();
        match on_unknown {
            OnUnknown::Reject => {
                let LeasedClaim::Existing(r) = retry else {
                    panic!("reject takes nothing over: {retry:?}")
                };
                assert_eq!(leased_decision(r, &fp, far), LeasedDecision::Abandoned);
            }
            _ => {
                assert!(
                    matches!(retry, LeasedClaim::TakenOver { lease_ended_at_ms } if lease_ended_at_ms == NOW + LEASE),
                    "{retry:?}"
                );
                assert!(
                    store
                        .complete_leased(
                            &s,
                            &again,
                            &answer(200, "{}"),
                            far + 1,
                            policy.expires_at_ms(far + 1)
                        )
                        .await
                        .unwrap()
                );
                let r = store.fetch(&s).await.unwrap().unwrap();
                assert_eq!(r.expires_at_ms, far + 1 + 10_000, "answered: its TTL again");
            }
        }
    }
    // Reforward: expires with its TTL; a verify claimer's takeover holds it.
    let s = scope("acme", "held-reforward");
    store
        .claim_at(
            &s,
            &fp,
            &policy,
            &LeaseToken::new(),
            OnUnknown::Reforward,
            NOW,
        )
        .await
        .unwrap();
    let r = store.fetch(&s).await.unwrap().unwrap();
    assert_eq!(r.expires_at_ms, NOW + 10_000);
    let at = NOW + LEASE + 1;
    let claim = store
        .claim_at(&s, &fp, &policy, &LeaseToken::new(), OnUnknown::Verify, at)
        .await
        .unwrap();
    assert!(matches!(claim, LeasedClaim::TakenOver { .. }), "{claim:?}");
    let r = store.fetch(&s).await.unwrap().unwrap();
    assert_eq!(
        (r.on_unknown, r.expires_at_ms),
        (Some(OnUnknown::Verify), UNRESOLVED_EXPIRES_AT_MS)
    );
}
