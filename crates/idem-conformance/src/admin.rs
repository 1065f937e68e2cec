//! Checks of [`AdminStore`]: keyset pages that return every row once,
//! prefixes matched literally, the actions decided in the caller's
//! transaction, audit rows that commit (or not) with it.

use std::collections::BTreeSet;

use idem_core::admin::{
    AdminStore, AuditFilter, InboxFilter, KeyFilter, KeyRelease, LeaseEnd, NewAudit, OutboxFilter,
    OutboxRequeue, OutboxState, ReceiptFilter, ReleaseRequest, RunPageFilter,
};
use idem_core::inbox::{InboxStore, MessageId, Subscriber};
use idem_core::keys::Claim;
use idem_core::leased::{LeaseToken, LeasedClaim, LeasedKeyStore, OnUnknown};
use idem_core::outbox::OutboxStore;
use idem_core::steps::{RunState, RunStore};
use idem_core::webhooks::{Finish, ReceiptState, Requeue, WebhookStore};
use idem_core::{
    Completion, Fingerprint, IdempotencyKey, KeyStore, Operation, Policy, RecordState, Scope,
    Tenant,
};

use crate::outbox::{Enqueue, message};
use crate::support::{response, scope};
use crate::webhooks::receipt;

const NOW: i64 = 1_700_000_000_000;

fn scope_in(tenant: &str, op: &str, key: &str) -> Scope {
    Scope::new(
        Tenant::new(tenant).unwrap(),
        Operation::new(op).unwrap(),
        IdempotencyKey::new(key).unwrap(),
    )
}

async fn completed<S: KeyStore>(store: &S, s: &Scope) {
    let Claim::Claimed(tx) = store
        .claim(
            s,
            &Fingerprint::from_bytes([1; 32]),
            &Policy::default(),
            NOW,
        )
        .await
        .unwrap()
    else {
        panic!("a fresh key is claimed");
    };
    let done =
        Completion::completed(response(201, "{\"id\":\"p1\"}")).with_resource("payment", "p1");
    store.complete(tx, s, &done, NOW).await.unwrap();
}

/// Key pages walk every matching record exactly once in `(tenant,
/// operation, key)` order; a prefix with `%`, `_` and `\` matches them
/// literally (and case-sensitively); state and tenant filters hold; one
/// record shows its stored response.
pub async fn admin_key_pages_and_literal_prefixes<S: AdminStore>(store: S) {
    let keys = [
        "50%_a1", "50%_a2", "50%_A3", "50x_b", "50%zc", "50%_\\d", "other", "50%_e",
    ];
    for (i, k) in keys.iter().enumerate() {
        let tenant = if i % 2 == 0 { "acme" } else { "beta" };
        completed(&store, &scope_in(tenant, "payments.create", k)).await;
    }
    completed(&store, &scope_in("acme", "refunds.create", "50%_a1")).await;
    let walk = |filter: KeyFilter| {
        let store = store.clone();
        async move {
            let mut seen = Vec::new();
            let mut f = filter;
            loop {
                let page = store.list_keys(&f).await.unwrap();
                assert!(page.len() <= f.limit as usize, "a page holds at most limit");
                let Some(last) = page.last() else { break };
                f.after = Some((
                    last.tenant.clone(),
                    last.operation.clone(),
                    last.key.clone(),
                ));
                let full = page.len() == f.limit as usize;
                seen.extend(page.into_iter().map(|k| (k.tenant, k.operation, k.key)));
                if !full {
                    break;
                }
            }
            seen
        }
    };
    let all = walk(KeyFilter {
        limit: 2,
        ..KeyFilter::default()
    })
    .await;
    assert_eq!(all.len(), keys.len() + 1, "every record once: {all:?}");
    let mut sorted = all.clone();
    sorted.sort();
    assert_eq!(all, sorted, "in (tenant, operation, key) order");
    assert_eq!(
        all.iter().collect::<BTreeSet<_>>().len(),
        all.len(),
        "no repeats"
    );

    let prefixed = walk(KeyFilter {
        prefix: Some("50%_".into()),
        limit: 1,
        ..KeyFilter::default()
    })
    .await;
    let found: BTreeSet<&str> = prefixed.iter().map(|(_, _, k)| k.as_str()).collect();
    assert_eq!(
        found,
        ["50%_a1", "50%_a2", "50%_A3", "50%_\\d", "50%_e"]
            .into_iter()
            .collect(),
        "% and _ match themselves only"
    );
    let upper = store
        .list_keys(&KeyFilter {
            prefix: Some("50%_A".into()),
            limit: 10,
            ..KeyFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(
        upper.iter().map(|k| k.key.as_str()).collect::<Vec<_>>(),
        ["50%_A3"],
        "case matters"
    );
    let backslash = store
        .list_keys(&KeyFilter {
            prefix: Some("50%_\\".into()),
            limit: 10,
            ..KeyFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(backslash.len(), 1, "a backslash matches itself");

    let acme = walk(KeyFilter {
        tenant: Some(Tenant::new("acme").unwrap()),
        operation: Some(Operation::new("payments.create").unwrap()),
        state: Some(RecordState::Completed),
        limit: 3,
        ..KeyFilter::default()
    })
    .await;
    assert_eq!(acme.len(), 4, "the acme payments: {acme:?}");
    let none = store
        .list_keys(&KeyFilter {
            state: Some(RecordState::Pending),
            limit: 10,
            ..KeyFilter::default()
        })
        .await
        .unwrap();
    assert!(none.is_empty(), "no pending records");

    let one = store
        .key_detail(&scope_in("acme", "payments.create", "50%_a1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(one.summary.state, RecordState::Completed);
    assert_eq!(one.summary.status, Some(201));
    assert!(!one.summary.leased);
    let r = one.response.expect("the stored response");
    assert_eq!(
        (r.status, r.body.as_slice()),
        (201, &b"{\"id\":\"p1\"}"[..])
    );
    assert_eq!(one.resource.map(|r| r.id), Some("p1".into()));
    assert!(
        store
            .key_detail(&scope_in("acme", "payments.create", "absent"))
            .await
            .unwrap()
            .is_none()
    );
}

/// A forced release that says it checked upstream.
const FORCED: ReleaseRequest = ReleaseRequest {
    force: true,
    upstream_checked: true,
};

/// Release deletes only a pending *leased* record: a live lease needs
/// `force`; a finished or lease-less record is refused; afterwards the old
/// token writes nothing and the key is claimed afresh. A rolled-back
/// release changes nothing.
pub async fn admin_release_only_stuck_leased_records<S: AdminStore + LeasedKeyStore + RunStore>(
    store: S,
) {
    let s = scope("acme", "stuck-1");
    let fp = Fingerprint::from_bytes([9; 32]);
    let old = LeaseToken::new();
    let claim = store
        .claim_leased(
            &s,
            &fp,
            &Policy::default(),
            &old,
            NOW + 60_000,
            OnUnknown::Reforward,
            NOW,
        )
        .await
        .unwrap();
    assert!(matches!(claim, LeasedClaim::Claimed));
    let listed = store
        .list_keys(&KeyFilter {
            limit: 10,
            ..KeyFilter::default()
        })
        .await
        .unwrap();
    assert!(listed[0].leased && listed[0].state == RecordState::Pending);

    let release = |force: bool, at: i64, commit: bool| {
        let (store, s) = (store.clone(), s.clone());
        async move {
            let mut tx = store.begin().await.unwrap();
            let request = ReleaseRequest {
                force,
                upstream_checked: false,
            };
            let out = S::release_key(&mut tx, &s, request, at).await.unwrap();
            if commit {
                store.commit(tx).await.unwrap();
            } else {
                store.rollback(tx).await.unwrap();
            }
            out
        }
    };
    assert_eq!(
        release(false, NOW, true).await,
        KeyRelease::LeaseLive(NOW + 60_000)
    );
    assert_eq!(release(true, NOW, false).await, KeyRelease::Released);
    assert!(
        store.fetch(&s).await.unwrap().is_some(),
        "rolled back: still there"
    );
    assert_eq!(release(true, NOW, true).await, KeyRelease::Released);
    assert!(store.fetch(&s).await.unwrap().is_none(), "released");
    let done = Completion::completed(response(200, "{}"));
    assert!(
        !store
            .complete_leased(&s, &old, &done, NOW + 1, i64::MAX)
            .await
            .unwrap(),
        "the old holder's token writes nothing"
    );
    assert_eq!(release(true, NOW, true).await, KeyRelease::NotFound);

    // An expired lease is released without force; on a route whose
    // repeat is not harmless, only once the operator checked upstream.
    let s2 = scope("acme", "stuck-2");
    store
        .claim_leased(
            &s2,
            &fp,
            &Policy::default(),
            &LeaseToken::new(),
            NOW + 10,
            OnUnknown::Reject,
            NOW,
        )
        .await
        .unwrap();
    let mut tx = store.begin().await.unwrap();
    assert_eq!(
        S::release_key(&mut tx, &s2, ReleaseRequest::default(), NOW + 11)
            .await
            .unwrap(),
        KeyRelease::UpstreamUnchecked(Some(OnUnknown::Reject))
    );
    let checked = ReleaseRequest {
        force: false,
        upstream_checked: true,
    };
    assert_eq!(
        S::release_key(&mut tx, &s2, checked, NOW + 11)
            .await
            .unwrap(),
        KeyRelease::Released
    );
    store.commit(tx).await.unwrap();

    // Finished, and held by a run: refused.
    let s3 = scope("acme", "done-3");
    completed(&store, &s3).await;
    let mut tx = store.begin().await.unwrap();
    assert_eq!(
        S::release_key(&mut tx, &s3, FORCED, NOW).await.unwrap(),
        KeyRelease::NotPending(RecordState::Completed)
    );
    store.rollback(tx).await.unwrap();
    let s4 = scope("acme", "run-4");
    crate::runs::start(&store, &s4, "exec", NOW).await;
    let mut tx = store.begin().await.unwrap();
    assert_eq!(
        S::release_key(&mut tx, &s4, FORCED, NOW).await.unwrap(),
        KeyRelease::NotReleasable
    );
    store.rollback(tx).await.unwrap();
}

/// Outbox pages by state, newest id first, every message once; a dead
/// message is requeued (pending, attempts 0, claimable now), anything else
/// is not.
pub async fn admin_outbox_pages_and_requeue<S: AdminStore + OutboxStore>(
    store: S,
    enqueue: Enqueue<S::Tx>,
) {
    let mut tx = store.begin().await.unwrap();
    for i in 0..5 {
        enqueue(&mut tx, &message(&format!("k{i}"), &format!("m{i}")), NOW)
            .await
            .unwrap();
    }
    store.commit(tx).await.unwrap();
    let batch = store
        .claim_batch(NOW, std::time::Duration::from_secs(30), 1)
        .await
        .unwrap();
    store
        .mark_failed(batch[0].id, "refused", NOW, true)
        .await
        .unwrap();
    let dead_id = batch[0].message_id.as_str().to_owned();

    let mut ids = Vec::new();
    let mut f = OutboxFilter {
        limit: 2,
        ..OutboxFilter::default()
    };
    loop {
        let page = store.list_outbox(&f).await.unwrap();
        let Some(last) = page.last() else { break };
        f.before_id = Some(last.id);
        ids.extend(page.iter().map(|m| m.id));
        if page.len() < 2 {
            break;
        }
    }
    assert_eq!(ids.len(), 5, "every message once");
    assert!(ids.windows(2).all(|w| w[0] > w[1]), "newest first");
    let dead = store
        .list_outbox(&OutboxFilter {
            state: Some(OutboxState::Dead),
            limit: 10,
            ..OutboxFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (dead[0].message_id.as_str(), dead[0].attempts),
        (dead_id.as_str(), 1)
    );
    assert_eq!(dead[0].last_error.as_deref(), Some("refused"));

    let mut tx = store.begin().await.unwrap();
    assert_eq!(
        S::requeue_outbox(&mut tx, &dead_id, NOW + 5).await.unwrap(),
        OutboxRequeue::Requeued
    );
    store.commit(tx).await.unwrap();
    let mut tx = store.begin().await.unwrap();
    assert_eq!(
        S::requeue_outbox(&mut tx, &dead_id, NOW + 5).await.unwrap(),
        OutboxRequeue::NotDead(OutboxState::Pending)
    );
    assert_eq!(
        S::requeue_outbox(&mut tx, "absent", NOW).await.unwrap(),
        OutboxRequeue::NotFound
    );
    store.rollback(tx).await.unwrap();
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.pending, stats.dead), (5, 0));
    let again = store
        .claim_batch(NOW + 5, std::time::Duration::from_secs(30), 10)
        .await
        .unwrap();
    let requeued = again
        .iter()
        .find(|m| m.message_id.as_str() == dead_id)
        .expect("the requeued message is claimable now");
    assert_eq!(requeued.attempts, 0);
}

/// Audit rows commit with their transaction or not at all, and page newest
/// first, filtered by action.
pub async fn admin_audit_rows_commit_with_their_transaction<S: AdminStore>(store: S) {
    let entry = |action: &'static str, n: usize| NewAudit {
        at_ms: NOW + n as i64,
        actor: "ops@example",
        action,
        target: "t",
        detail: "{\"n\":1}",
        idempotency_key: Some("k-1"),
    };
    let mut tx = store.begin().await.unwrap();
    S::insert_audit(&mut tx, &entry("keys.release", 0))
        .await
        .unwrap();
    store.rollback(tx).await.unwrap();
    let all = |action: Option<&str>| {
        let store = store.clone();
        let action = action.map(str::to_owned);
        async move {
            store
                .list_audit(&AuditFilter {
                    action,
                    limit: 200,
                    ..AuditFilter::default()
                })
                .await
                .unwrap()
        }
    };
    assert!(all(None).await.is_empty(), "rolled back: no row");
    for n in 0..5 {
        let mut tx = store.begin().await.unwrap();
        let action = if n % 2 == 0 {
            "keys.release"
        } else {
            "runs.resume"
        };
        S::insert_audit(&mut tx, &entry(action, n)).await.unwrap();
        store.commit(tx).await.unwrap();
    }
    let rows = all(None).await;
    assert_eq!(rows.len(), 5);
    assert!(rows.windows(2).all(|w| w[0].id > w[1].id), "newest first");
    assert_eq!(rows[0].actor, "ops@example");
    assert_eq!(rows[0].idempotency_key.as_deref(), Some("k-1"));
    assert_eq!(all(Some("keys.release")).await.len(), 3);
    let page = store
        .list_audit(&AuditFilter {
            before_id: Some(rows[1].id),
            limit: 2,
            ..AuditFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(
        page.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![rows[2].id, rows[3].id]
    );
}

/// Runs, receipts and inbox records page newest first, every row once;
/// counts by state add up; a live run's lease ends now (and recovery then
/// takes it over at fence + 1), a final one's does not; a dead receipt is
/// replayed in the caller's transaction.
pub async fn admin_runs_receipts_and_inbox<S: AdminStore + RunStore + WebhookStore + InboxStore>(
    store: S,
) {
    let mut leases = Vec::new();
    for i in 0..5 {
        leases.push(
            crate::runs::start(&store, &scope("acme", &format!("run-{i}")), "exec", NOW + i).await,
        );
    }
    let mut seen = Vec::new();
    let mut f = RunPageFilter {
        limit: 2,
        ..RunPageFilter::default()
    };
    loop {
        let page = store.list_runs_page(&f).await.unwrap();
        let Some(last) = page.last() else { break };
        f.before = Some((last.created_at_ms, last.id.as_str().to_owned()));
        seen.extend(page.iter().map(|r| r.created_at_ms));
        if page.len() < 2 {
            break;
        }
    }
    assert_eq!(
        seen,
        vec![NOW + 4, NOW + 3, NOW + 2, NOW + 1, NOW],
        "every run once, newest first"
    );
    let by_op = store
        .list_runs_page(&RunPageFilter {
            operation: Some(Operation::new("other.op").unwrap()),
            state: Some(RunState::Running),
            limit: 10,
            ..RunPageFilter::default()
        })
        .await
        .unwrap();
    assert!(by_op.is_empty(), "filtered by operation");

    let id = leases[0].run.clone();
    let mut tx = store.begin().await.unwrap();
    assert_eq!(
        S::end_run_lease(&mut tx, &id, NOW + 100).await.unwrap(),
        LeaseEnd::Ended
    );
    store.commit(tx).await.unwrap();
    let taken = store
        .take_over(&id, "recovery", NOW + 100, NOW + 10_000)
        .await
        .unwrap()
        .expect("a resumed run is taken over at once");
    assert_eq!(taken.fence.0, leases[0].fence.0 + 1);
    let final_change = idem_core::steps::RunChange {
        state: Some(RunState::Completed),
        expires_at_ms: Some(NOW + 1_000_000),
        ..Default::default()
    };
    let lease = taken.lease().unwrap();
    assert!(
        store
            .record_run(&lease, &final_change, None, NOW + 200)
            .await
            .unwrap()
    );
    let mut tx = store.begin().await.unwrap();
    assert_eq!(
        S::end_run_lease(&mut tx, &id, NOW + 300).await.unwrap(),
        LeaseEnd::Final(RunState::Completed)
    );
    let absent = idem_core::steps::RunId::parse(&format!("run_{}", "0".repeat(32)));
    if let Ok(absent) = absent {
        assert_eq!(
            S::end_run_lease(&mut tx, &absent, NOW).await.unwrap(),
            LeaseEnd::NotFound
        );
    }
    store.rollback(tx).await.unwrap();

    // Receipts.
    for i in 0..4 {
        store
            .accept(
                &receipt("github", &format!("d{i}"), None),
                NOW + i,
                NOW + 1_000_000,
            )
            .await
            .unwrap();
    }
    let dead = store
        .claim_receipts("github", NOW + 10, std::time::Duration::from_secs(30), 1)
        .await
        .unwrap();
    store
        .finish(dead[0].id, &Finish::Dead { error: "no".into() }, NOW + 11)
        .await
        .unwrap();
    let mut ids = Vec::new();
    let mut rf = ReceiptFilter {
        endpoint: Some("github".into()),
        limit: 3,
        ..ReceiptFilter::default()
    };
    loop {
        let page = store.list_receipts_page(&rf).await.unwrap();
        let Some(last) = page.last() else { break };
        rf.before_id = Some(last.id);
        ids.extend(page.iter().map(|r| r.id));
        if page.len() < 3 {
            break;
        }
    }
    assert_eq!(ids.len(), 4);
    assert!(ids.windows(2).all(|w| w[0] > w[1]));
    let dead_only = store
        .list_receipts_page(&ReceiptFilter {
            state: Some(ReceiptState::Dead),
            limit: 10,
            ..ReceiptFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(dead_only.len(), 1);
    let delivery = dead_only[0].receipt.delivery_id.clone();
    let mut tx = store.begin().await.unwrap();
    assert_eq!(
        S::replay_receipt_in(&mut tx, "github", &delivery, NOW + 20)
            .await
            .unwrap(),
        Requeue::Requeued
    );
    assert_eq!(
        S::replay_receipt_in(&mut tx, "github", &delivery, NOW + 20)
            .await
            .unwrap(),
        Requeue::AlreadyQueued,
        "decided in the transaction that requeued it"
    );
    assert_eq!(
        S::replay_receipt_in(&mut tx, "github", "nope", NOW)
            .await
            .unwrap(),
        Requeue::NotFound
    );
    store.commit(tx).await.unwrap();
    let again = store
        .get_receipt("github", &delivery)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((again.state, again.attempts), (ReceiptState::Received, 0));

    // Inbox records (the receipts wrote theirs too).
    let sub = Subscriber::new("ledger").unwrap();
    for i in 0..3 {
        let mut tx = store.begin().await.unwrap();
        let m = MessageId::new(format!("m{i}")).unwrap();
        assert!(
            store
                .record(&mut tx, &sub, &m, NOW + i, NOW + 1_000_000)
                .await
                .unwrap()
        );
        store.commit(tx).await.unwrap();
    }
    let one = store.inbox_entry("ledger", "m1").await.unwrap().unwrap();
    assert_eq!(one.processed_at_ms, NOW + 1);
    assert!(store.inbox_entry("ledger", "m9").await.unwrap().is_none());
    let mut got = Vec::new();
    let mut inf = InboxFilter {
        subscriber: Some("ledger".into()),
        limit: 2,
        ..InboxFilter::default()
    };
    loop {
        let page = store.list_inbox(&inf).await.unwrap();
        let Some(last) = page.last() else { break };
        inf.before = Some((
            last.processed_at_ms,
            last.subscriber.clone(),
            last.message_id.clone(),
        ));
        got.extend(page.iter().map(|e| e.message_id.clone()));
        if page.len() < 2 {
            break;
        }
    }
    assert_eq!(got, vec!["m2", "m1", "m0"]);

    // Counts.
    let counts = store.state_counts().await.unwrap();
    let n = |v: &[(String, u64)], s: &str| v.iter().find(|(k, _)| k == s).map_or(0, |(_, n)| *n);
    assert_eq!(
        (n(&counts.runs, "running"), n(&counts.runs, "completed")),
        (4, 1)
    );
    assert_eq!(n(&counts.receipts, "received"), 4);
    assert_eq!(n(&counts.keys, "pending"), 5, "the runs' keys");
    assert_eq!(n(&counts.keys, "completed"), 0);
}
