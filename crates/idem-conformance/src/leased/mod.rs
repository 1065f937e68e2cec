//! Checks of [`LeasedKeyStore`]: claims committed with a lease, writes
//! conditional on the token, takeovers only of abandoned records and by one
//! claimer, and an operator's resolution; outcomes a holder does not know
//! in `unknown.rs`.

pub(crate) mod unknown;

use std::sync::Arc;

use idem_core::leased::{
    LeaseToken, LeasedClaim, LeasedDecision, LeasedKeyStore, OnUnknown, Resolution,
    UNRESOLVED_EXPIRES_AT_MS, leased_decision,
};
use idem_core::{
    Completion, Fingerprint, KeyStore, Policy, RecordState, Scope, StoreError, StoredResponse,
};

use crate::support::scope;

pub(super) const NOW: i64 = 1_700_000_000_000;
pub(super) const LEASE: i64 = 2_000;

/// A claim at `now` leased for [`LEASE`]: the shape of most claims here.
pub(super) trait ClaimAt: LeasedKeyStore {
    async fn claim_at(
        &self,
        scope: &Scope,
        fingerprint: &Fingerprint,
        policy: &Policy,
        token: &LeaseToken,
        on_unknown: OnUnknown,
        now: i64,
    ) -> Result<LeasedClaim, StoreError> {
        self.claim_leased(
            scope,
            fingerprint,
            policy,
            token,
            now + LEASE,
            on_unknown,
            now,
        )
        .await
    }
}

impl<S: LeasedKeyStore> ClaimAt for S {}

pub(super) fn answer(status: u16, body: &str) -> Completion {
    Completion::completed(StoredResponse {
        status,
        headers: vec![("content-type".into(), "application/json".into())],
        body: body.as_bytes().to_vec(),
    })
}

/// A claim commits a pending record at once (another caller sees it in
/// flight); only its token completes it; the outcome is replayed; another
/// request with the key is a mismatch.
pub async fn leased_claims_commit_and_only_the_holder_writes<S: LeasedKeyStore>(store: S) {
    let s = scope("acme", "lease-1");
    let fp = Fingerprint::from_bytes([7; 32]);
    let policy = Policy::default();
    let (mine, other) = (LeaseToken::new(), LeaseToken::new());
    let claim = store
        .claim_at(&s, &fp, &policy, &mine, OnUnknown::Reforward, NOW)
        .await
        .unwrap();
    assert!(
        matches!(claim, LeasedClaim::Claimed),
        "a free key is claimed"
    );
    // Committed: visible outside, pending, with its lease.
    let seen = store
        .fetch(&s)
        .await
        .unwrap()
        .expect("the claim is committed");
    assert_eq!(seen.state, RecordState::Pending);
    assert_eq!(seen.locked_until_ms, Some(NOW + LEASE));
    // A second claimer during the lease: in flight, nothing changed.
    let again = store
        .claim_at(&s, &fp, &policy, &other, OnUnknown::Reforward, NOW + 10)
        .await
        .unwrap();
    let LeasedClaim::Existing(record) = again else {
        panic!("a live lease is not taken over: {again:?}")
    };
    assert!(matches!(
        leased_decision(record, &fp, NOW + 10),
        LeasedDecision::InFlight { .. }
    ));
    // Another token writes nothing.
    assert!(
        !store
            .renew_leased(&s, &other, NOW + 9_999, NOW + 20)
            .await
            .unwrap()
    );
    assert!(
        !store
            .complete_leased(
                &s,
                &other,
                &answer(201, "{\"by\":\"other\"}"),
                NOW + 20,
                i64::MAX
            )
            .await
            .unwrap()
    );
    assert!(!store.release_leased(&s, &other).await.unwrap());
    assert_eq!(
        store.fetch(&s).await.unwrap().unwrap().locked_until_ms,
        Some(NOW + LEASE),
        "a foreign renewal moved nothing"
    );
    // The holder renews and completes.
    assert!(
        store
            .renew_leased(&s, &mine, NOW + 5_000, NOW + 30)
            .await
            .unwrap()
    );
    assert_eq!(
        store.fetch(&s).await.unwrap().unwrap().locked_until_ms,
        Some(NOW + 5_000)
    );
    assert!(
        store
            .complete_leased(&s, &mine, &answer(201, "{\"id\":1}"), NOW + 40, i64::MAX)
            .await
            .unwrap()
    );
    // Once completed, the token is spent.
    assert!(
        !store
            .renew_leased(&s, &mine, NOW + 9_000, NOW + 50)
            .await
            .unwrap()
    );
    assert!(!store.release_leased(&s, &mine).await.unwrap());
    let done = store
        .claim_at(&s, &fp, &policy, &other, OnUnknown::Reforward, NOW + 60)
        .await
        .unwrap();
    let LeasedClaim::Existing(record) = done else {
        panic!("a completed key is not claimed again: {done:?}")
    };
    match leased_decision(record, &fp, NOW + 60) {
        LeasedDecision::Replay(r) => {
            let response = r.response.unwrap();
            assert_eq!(
                (response.status, &response.body[..]),
                (201, &b"{\"id\":1}"[..])
            );
        }
        d => panic!("the outcome is replayed: {d:?}"),
    }
    let other_fp = Fingerprint::from_bytes([8; 32]);
    let LeasedClaim::Existing(record) = store
        .claim_leased(
            &s,
            &other_fp,
            &policy,
            &other,
            NOW + LEASE,
            OnUnknown::Reforward,
            NOW + 70,
        )
        .await
        .unwrap()
    else {
        panic!("another request does not claim a used key")
    };
    assert_eq!(
        leased_decision(record, &other_fp, NOW + 70),
        LeasedDecision::Mismatch
    );
}

/// A released key is free again; a release by the holder only.
pub async fn a_released_lease_frees_the_key<S: LeasedKeyStore>(store: S) {
    let s = scope("acme", "lease-2");
    let fp = Fingerprint::from_bytes([3; 32]);
    let policy = Policy::default();
    let first = LeaseToken::new();
    store
        .claim_at(&s, &fp, &policy, &first, OnUnknown::Reject, NOW)
        .await
        .unwrap();
    assert!(store.release_leased(&s, &first).await.unwrap());
    assert!(
        store.fetch(&s).await.unwrap().is_none(),
        "released: no record"
    );
    let second = LeaseToken::new();
    let claim = store
        .claim_at(&s, &fp, &policy, &second, OnUnknown::Reject, NOW + 10)
        .await
        .unwrap();
    assert!(matches!(claim, LeasedClaim::Claimed), "{claim:?}");
    // The first holder's token is spent: it cannot release the new claim.
    assert!(!store.release_leased(&s, &first).await.unwrap());
    assert!(store.fetch(&s).await.unwrap().is_some());
}

/// After the lease runs out: `Reforward` gives the record to exactly one of
/// many racing claimers (a new token; the old one writes nothing), `Reject`
/// leaves it as it was for an operator, and another request is still a
/// mismatch.
pub async fn an_abandoned_lease_is_taken_over_by_one<S: LeasedKeyStore>(store: S, racers: usize) {
    let s = scope("acme", "lease-3");
    let fp = Fingerprint::from_bytes([5; 32]);
    let policy = Policy::default();
    let dead = LeaseToken::new();
    store
        .claim_at(&s, &fp, &policy, &dead, OnUnknown::Reforward, NOW)
        .await
        .unwrap();
    let later = NOW + LEASE;
    // Reject: the record stays, abandoned.
    let LeasedClaim::Existing(record) = store
        .claim_at(
            &s,
            &fp,
            &policy,
            &LeaseToken::new(),
            OnUnknown::Reject,
            later,
        )
        .await
        .unwrap()
    else {
        panic!("Reject takes nothing over")
    };
    assert_eq!(
        leased_decision(record, &fp, later),
        LeasedDecision::Abandoned
    );
    // Another request never takes it over.
    let other_fp = Fingerprint::from_bytes([6; 32]);
    let LeasedClaim::Existing(record) = store
        .claim_at(
            &s,
            &other_fp,
            &policy,
            &LeaseToken::new(),
            OnUnknown::Reforward,
            later,
        )
        .await
        .unwrap()
    else {
        panic!("another request takes nothing over")
    };
    assert_eq!(
        leased_decision(record, &other_fp, later),
        LeasedDecision::Mismatch
    );
    // Racing takeovers: one wins.
    let store = Arc::new(store);
    let mut tasks = Vec::new();
    for _ in 0..racers {
        let (store, s) = (store.clone(), s.clone());
        tasks.push(tokio::spawn(async move {
            let token = LeaseToken::new();
            let claim = store
                .claim_at(
                    &s,
                    &fp,
                    &Policy::default(),
                    &token,
                    OnUnknown::Reforward,
                    later,
                )
                .await
                .unwrap();
            (token, claim)
        }));
    }
    let mut winners = Vec::new();
    for t in tasks {
        let (token, claim) = t.await.unwrap();
        match claim {
            LeasedClaim::TakenOver { lease_ended_at_ms } => {
                assert_eq!(
                    lease_ended_at_ms,
                    NOW + LEASE,
                    "the end of the lease taken over"
                );
                winners.push(token);
            }
            LeasedClaim::Existing(r) => assert!(
                matches!(
                    leased_decision(r, &fp, later),
                    LeasedDecision::InFlight { .. }
                ),
                "a loser sees the winner's live lease"
            ),
            LeasedClaim::Claimed => panic!("the record exists: nobody inserts"),
        }
    }
    assert_eq!(
        winners.len(),
        1,
        "exactly one claimer takes an abandoned record over"
    );
    // The dead holder wakes up: its token writes nothing.
    assert!(
        !store
            .complete_leased(
                &s,
                &dead,
                &answer(201, "{\"by\":\"zombie\"}"),
                later + 1,
                i64::MAX
            )
            .await
            .unwrap()
    );
    assert!(!store.release_leased(&s, &dead).await.unwrap());
    assert!(
        store
            .complete_leased(
                &s,
                &winners[0],
                &answer(201, "{\"by\":\"successor\"}"),
                later + 2,
                i64::MAX
            )
            .await
            .unwrap()
    );
    let r = store.fetch(&s).await.unwrap().unwrap();
    assert_eq!(r.response.unwrap().body, b"{\"by\":\"successor\"}");
}

/// An operator resolves only an abandoned record: released (the key is
/// free) or answered (replayed); a live or finished one is left alone.
pub async fn operators_resolve_only_abandoned_leases<S: LeasedKeyStore>(store: S) {
    let policy = Policy::default();
    let fp = Fingerprint::from_bytes([9; 32]);
    let (a, b) = (scope("acme", "lease-4a"), scope("acme", "lease-4b"));
    for s in [&a, &b] {
        store
            .claim_at(s, &fp, &policy, &LeaseToken::new(), OnUnknown::Reject, NOW)
            .await
            .unwrap();
    }
    // Live: refused.
    assert!(
        !store
            .resolve_abandoned(&a, &Resolution::Release, NOW + 1)
            .await
            .unwrap()
    );
    assert!(store.fetch(&a).await.unwrap().is_some());
    let later = NOW + LEASE;
    assert!(
        store
            .resolve_abandoned(&a, &Resolution::Release, later)
            .await
            .unwrap()
    );
    assert!(store.fetch(&a).await.unwrap().is_none(), "released");
    let gone = Completion::failed(StoredResponse {
        status: 409,
        headers: vec![],
        body: b"resolved".to_vec(),
    });
    assert!(
        store
            .resolve_abandoned(&b, &Resolution::Answer(gone.clone()), later)
            .await
            .unwrap()
    );
    let r = store.fetch(&b).await.unwrap().unwrap();
    assert_eq!(r.state, RecordState::Failed);
    assert_eq!(r.response.unwrap().body, b"resolved");
    // Finished: refused.
    assert!(
        !store
            .resolve_abandoned(&b, &Resolution::Release, later + 1)
            .await
            .unwrap()
    );
    assert!(
        !store
            .resolve_abandoned(&b, &Resolution::Answer(gone), later + 1)
            .await
            .unwrap()
    );
    assert!(store.fetch(&b).await.unwrap().is_some());
}

/// A key claimed by the transactional path is one key for the leased path
/// too: a leased claim of it is a replay or a mismatch, never a second
/// claim.
pub async fn leased_and_transactional_claims_share_keys<S: LeasedKeyStore + KeyStore>(store: S) {
    let s = scope("acme", "lease-5");
    let fp = Fingerprint::from_bytes([4; 32]);
    let policy = Policy::default();
    let claim = store.claim(&s, &fp, &policy, NOW).await.unwrap();
    let idem_core::keys::Claim::Claimed(tx) = claim else {
        panic!("a free key is claimed")
    };
    store
        .complete(tx, &s, &answer(200, "{}"), NOW)
        .await
        .unwrap();
    let LeasedClaim::Existing(r) = store
        .claim_leased(
            &s,
            &fp,
            &policy,
            &LeaseToken::new(),
            NOW + LEASE,
            OnUnknown::Reforward,
            NOW + 1,
        )
        .await
        .unwrap()
    else {
        panic!("a key is one key whichever path claimed it")
    };
    assert!(matches!(
        leased_decision(r, &fp, NOW + 1),
        LeasedDecision::Replay(_)
    ));
}

/// A record past its TTL (not collected yet) is claimed afresh, by any
/// request: a new token, a new lease, the old outcome gone.
pub async fn an_expired_leased_record_is_claimed_afresh<S: LeasedKeyStore>(store: S) {
    let s = scope("acme", "lease-6");
    let policy = Policy::with_ttl(std::time::Duration::from_secs(10));
    let old = LeaseToken::new();
    store
        .claim_at(
            &s,
            &Fingerprint::from_bytes([1; 32]),
            &policy,
            &old,
            OnUnknown::Reject,
            NOW,
        )
        .await
        .unwrap();
    assert!(
        store
            .complete_leased(
                &s,
                &old,
                &answer(201, "{\"old\":true}"),
                NOW + 1,
                policy.expires_at_ms(NOW)
            )
            .await
            .unwrap()
    );
    let later = NOW + 10_000;
    let other = Fingerprint::from_bytes([2; 32]);
    let new = LeaseToken::new();
    let claim = store
        .claim_at(&s, &other, &policy, &new, OnUnknown::Reject, later)
        .await
        .unwrap();
    assert!(
        matches!(claim, LeasedClaim::Claimed),
        "expired: claimed afresh, {claim:?}"
    );
    let r = store.fetch(&s).await.unwrap().unwrap();
    assert_eq!(
        (r.state, r.response.is_none()),
        (RecordState::Pending, true)
    );
    assert_eq!(r.fingerprint, other);
    assert_eq!(
        r.expires_at_ms, UNRESOLVED_EXPIRES_AT_MS,
        "a reject claim is held while pending"
    );
    assert!(
        store
            .renew_leased(&s, &new, later + 2 * LEASE, later + 1)
            .await
            .unwrap()
    );
    assert!(
        !store
            .renew_leased(&s, &old, later + 2 * LEASE, later + 1)
            .await
            .unwrap()
    );
}
