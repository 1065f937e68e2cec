//! `/admin/v1` in-process over real stores (an SQLite file, a PostgreSQL
//! database), behind the admin guard with a bearer token: pages walked with
//! cursors, prefix search with LIKE wildcards, the actions (release,
//! requeue, replay, resolve, resume), their audit rows, replayed POSTs,
//! bad input and missing credentials.

use std::net::SocketAddr;
use std::time::Duration;

use idem_core::inbox::{MessageId, Subscriber};
use idem_core::keys::Claim;
use idem_core::leased::{LeaseToken, OnUnknown};
use idem_core::outbox::{OutboxMessage, Topic};
use idem_core::steps::{
    Fence, Lease, NewRun, RunChange, RunId, RunState, StepKind, StepRecord, StepState,
};
use idem_core::webhooks::{Finish, NewReceipt};
use idem_core::{
    Clock, Completion, Fingerprint, IdempotencyKey, Operation, Policy, Scope, StoredResponse,
    SystemClock, Tenant,
};
use idem_server::admin::outbox::RelaySlot;
use idem_server::admin::{AdminToken, AllowedHosts, Auth};
use idem_server::backend::{Backend, Db, Job};
use idem_testkit::{PgDatabase, TempDir};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::Reply;

const TOKEN: &str = "037092c11830c283065246c98e40c665";

/// Where the test database lives, kept alive with the test.
enum Keep {
    Dir(#[allow(dead_code)] TempDir),
    Pg(#[allow(dead_code)] PgDatabase),
}

async fn database(postgres: bool) -> (String, Keep) {
    if postgres {
        let db = PgDatabase::create("idem_admin").await;
        (db.url.clone(), Keep::Pg(db))
    } else {
        let dir = TempDir::new("admin-api");
        (dir.sqlite_url(), Keep::Dir(dir))
    }
}

/// Serves `/admin/v1` (with the server's guard and outcome ring) on a
/// socket and returns its address.
async fn serve<B: Backend>(store: &B) -> SocketAddr {
    let api = idem_server::admin::v1::router(store.clone(), RelaySlot::<B>::default());
    let auth = Auth::new(
        Some(AdminToken::new(TOKEN).unwrap()),
        AllowedHosts::default(),
        Default::default(),
    );
    let app = idem_server::routes::service(api, auth, None);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// One request with the token (unless `auth` is `None`).
async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    auth: Option<&str>,
    key: Option<&str>,
    body: &str,
) -> Reply {
    let mut extra = String::new();
    if let Some(token) = auth {
        extra.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    if let Some(k) = key {
        extra.push_str(&format!("Idempotency-Key: {k}\r\n"));
    }
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Content-Type: application/json\r\n{extra}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(raw.as_bytes()).await.unwrap();
    Reply::read(&mut s).await
}

async fn get(addr: SocketAddr, path: &str) -> Reply {
    send(addr, "GET", path, Some(TOKEN), None, "").await
}

async fn post(addr: SocketAddr, path: &str, key: &str, body: &str) -> Reply {
    send(addr, "POST", path, Some(TOKEN), Some(key), body).await
}

/// Walks a list with `limit` per page; every item, in order.
async fn walk(addr: SocketAddr, path: &str, limit: u32) -> Vec<Value> {
    let sep = if path.contains('?') { '&' } else { '?' };
    let mut items = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let url = match &cursor {
            Some(c) => format!("{path}{sep}limit={limit}&cursor={c}"),
            None => format!("{path}{sep}limit={limit}"),
        };
        let r = get(addr, &url).await;
        assert_eq!(r.status, 200, "{url}: {}", String::from_utf8_lossy(&r.body));
        let v = r.json();
        let page = v["items"].as_array().unwrap();
        assert!(page.len() <= limit as usize);
        items.extend(page.iter().cloned());
        match v["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    items
}

async fn audit(addr: SocketAddr) -> Vec<Value> {
    walk(addr, "/admin/v1/audit", 200).await
}

fn assert_problem(r: &Reply, status: u16, slug: &str) {
    assert_eq!(r.status, status, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        r.problem_type(),
        format!("https://idem.dev/problems/{slug}"),
        "{}",
        String::from_utf8_lossy(&r.body)
    );
}

fn scope(tenant: &str, op: &str, key: &str) -> Scope {
    Scope::new(
        Tenant::new(tenant).unwrap(),
        Operation::new(op).unwrap(),
        IdempotencyKey::new(key).unwrap(),
    )
}

fn now() -> i64 {
    SystemClock.now_ms()
}

async fn completed<B: Backend>(store: &B, s: &Scope, body: &str) {
    let Claim::Claimed(tx) = store
        .claim(
            s,
            &Fingerprint::from_bytes([3; 32]),
            &Policy::default(),
            now(),
        )
        .await
        .unwrap()
    else {
        panic!("fresh key");
    };
    let answer = Completion::completed(StoredResponse {
        status: 201,
        headers: vec![("content-type".into(), "application/json".into())],
        body: body.as_bytes().to_vec(),
    });
    store.complete(tx, s, &answer, now()).await.unwrap();
}

/// Key records: a prefix holding `%` and `_` finds only what starts with
/// it, pages of 2 walk every match once, one record shows its stored
/// response; release refuses a live lease (409), a finished record (409),
/// then with `force` deletes the stuck one; a repeat with the same key
/// replays the answer and writes no second audit row; bad input is 400.
struct Keys;
impl Job for Keys {
    type Output = ();
    async fn run<B: Backend>(self, store: B) {
        let addr = serve(&store).await;
        for k in ["50%_a", "50%_b", "50%_c", "50xa", "50%Zz", "other"] {
            completed(
                &store,
                &scope("acme", "payments.create", k),
                "{\"id\":\"p1\"}",
            )
            .await;
        }
        completed(
            &store,
            &scope("acme", "payments.create", "xss-1"),
            "<script>alert(1)</script>",
        )
        .await;
        let found = walk(addr, "/admin/v1/keys?prefix=50%25_", 2).await;
        let keys: Vec<&str> = found.iter().map(|k| k["key"].as_str().unwrap()).collect();
        assert_eq!(
            keys,
            ["50%_a", "50%_b", "50%_c"],
            "literal prefix, each once"
        );
        assert_eq!(found[0]["state"], "completed");
        assert_eq!(found[0]["fingerprint"].as_str().unwrap().len(), 64);
        assert_eq!(found[0]["status"], 201);
        let all = walk(addr, "/admin/v1/keys?tenant=acme&state=completed", 3).await;
        assert_eq!(all.len(), 7, "every record once");

        let one = get(
            addr,
            "/admin/v1/key?tenant=acme&operation=payments.create&key=xss-1",
        )
        .await;
        assert_eq!(one.status, 200);
        let v = one.json();
        assert_eq!(v["response"]["body"], "<script>alert(1)</script>");
        assert_eq!(v["response"]["status"], 201);
        assert_eq!(v["response"]["headers"][0][0], "content-type");
        let missing = get(
            addr,
            "/admin/v1/key?tenant=acme&operation=payments.create&key=nope",
        )
        .await;
        assert_problem(&missing, 404, "not-found");

        // Bad input: 400 naming the parameter.
        for (path, param) in [
            ("/admin/v1/keys?limit=0", "limit"),
            ("/admin/v1/keys?limit=201", "limit"),
            ("/admin/v1/keys?limit=x", "limit"),
            ("/admin/v1/keys?state=stuck", "state"),
            ("/admin/v1/keys?tenant=a%20b", "tenant"),
            ("/admin/v1/keys?cursor=not-a-cursor", "cursor"),
            ("/admin/v1/key?tenant=acme&operation=payments.create", "key"),
            ("/admin/v1/outbox/messages?state=lost", "state"),
            ("/admin/v1/runs?state=paused", "state"),
            ("/admin/v1/runs/nope", "id"),
            ("/admin/v1/webhooks/receipts?endpoint=a%2Fb", "endpoint"),
            ("/admin/v1/audit?action=drop.tables", "action"),
        ] {
            let r = get(addr, path).await;
            assert_problem(&r, 400, "invalid-request");
            let detail = r.json()["detail"].as_str().unwrap_or_default().to_owned();
            assert!(detail.starts_with(param), "{path}: {detail}");
        }
        // A repeated parameter: the same problem, title and all.
        let r = get(addr, "/admin/v1/keys?limit=1&limit=2").await;
        assert_problem(&r, 400, "invalid-request");
        assert_eq!(r.json()["title"], "The request is invalid");
        assert!(
            r.json()["detail"]
                .as_str()
                .unwrap_or_default()
                .contains("limit")
        );

        // Release.
        let stuck = scope("gw", "orders.create", "stuck-1");
        let old = LeaseToken::new();
        store
            .claim_leased(
                &stuck,
                &Fingerprint::from_bytes([4; 32]),
                &Policy::default(),
                &old,
                now() + 600_000,
                OnUnknown::Reject,
                now(),
            )
            .await
            .unwrap();
        let leased = get(
            addr,
            "/admin/v1/key?tenant=gw&operation=orders.create&key=stuck-1",
        )
        .await;
        assert_eq!(leased.json()["leased"], true);
        assert_eq!(leased.json()["state"], "pending");
        let body = r#"{"tenant":"gw","operation":"orders.create","key":"stuck-1"}"#;
        let r = post(addr, "/admin/v1/keys/release", "rel-1", body).await;
        assert_problem(&r, 409, "lease-live");
        assert!(
            store.fetch(&stuck).await.unwrap().is_some(),
            "nothing changed"
        );
        // A reject route's upstream does not deduplicate: forcing is not
        // enough without the operator's word that they checked it.
        let unchecked =
            r#"{"tenant":"gw","operation":"orders.create","key":"stuck-1","force":true}"#;
        let r = post(addr, "/admin/v1/keys/release", "rel-u", unchecked).await;
        assert_problem(&r, 409, "upstream-unchecked");
        let detail = r.json()["detail"].as_str().unwrap_or_default().to_owned();
        assert!(
            detail.contains("reject") && detail.contains("still running"),
            "{detail}"
        );
        assert!(
            store.fetch(&stuck).await.unwrap().is_some(),
            "nothing changed"
        );
        let forced = r#"{"tenant":"gw","operation":"orders.create","key":"stuck-1","force":true,"upstream_checked":true}"#;
        let r = post(addr, "/admin/v1/keys/release", "rel-2", forced).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.json()["released"], true);
        assert!(
            r.json()["warning"]
                .as_str()
                .is_some_and(|w| w.contains("may still land")),
            "a forced release says what it cannot stop"
        );
        assert!(store.fetch(&stuck).await.unwrap().is_none(), "released");
        let done = Completion::completed(StoredResponse {
            status: 200,
            headers: vec![],
            body: vec![],
        });
        assert!(
            !store
                .complete_leased(&stuck, &old, &done, now(), i64::MAX)
                .await
                .unwrap(),
            "the old holder is fenced out"
        );
        let again = post(addr, "/admin/v1/keys/release", "rel-2", forced).await;
        assert_eq!((again.status, again.json()), (200, r.json()), "replayed");
        assert!(again.replayed());
        let other = post(addr, "/admin/v1/keys/release", "rel-2", body).await;
        assert_eq!(other.status, 422, "another body under the same key");
        let rows = audit(addr).await;
        assert_eq!(rows.len(), 1, "one action, one row: {rows:?}");
        assert_eq!(rows[0]["action"], "keys.release");
        assert_eq!(rows[0]["actor"], "admin");
        assert_eq!(rows[0]["target"], "gw/orders.create/stuck-1");
        assert_eq!(rows[0]["detail"]["force"], true);
        assert_eq!(rows[0]["detail"]["upstream_checked"], true);
        assert_eq!(rows[0]["idempotency_key"], "rel-2");

        let fin = r#"{"tenant":"acme","operation":"payments.create","key":"50%_a","force":true}"#;
        let r = post(addr, "/admin/v1/keys/release", "rel-3", fin).await;
        assert_problem(&r, 409, "not-pending");
        let r = send(
            addr,
            "POST",
            "/admin/v1/keys/release",
            Some(TOKEN),
            None,
            fin,
        )
        .await;
        assert_problem(&r, 400, "missing-idempotency-key");
        let r = post(
            addr,
            "/admin/v1/keys/release",
            "rel-4",
            r#"{"tenant":"acme"}"#,
        )
        .await;
        assert_problem(&r, 400, "invalid-request");
        let r = post(addr, "/admin/v1/keys/release", "rel-5", "not json").await;
        assert_problem(&r, 400, "invalid-request");
        assert_eq!(audit(addr).await.len(), 1, "refusals write no audit row");
    }
}

/// Outbox: dead messages listed by state, requeued (then 409 not-dead, 404
/// for an unknown id); inbox lookups.
struct OutboxInbox;
impl Job for OutboxInbox {
    type Output = ();
    async fn run<B: Backend>(self, store: B) {
        let addr = serve(&store).await;
        let mut tx = store.begin().await.unwrap();
        for i in 0..5 {
            let m = OutboxMessage::new(
                Topic::new("payments.created").unwrap(),
                format!("k{i}"),
                format!("{{\"n\":{i}}}").into_bytes(),
            )
            .unwrap();
            store.enqueue(&mut tx, &m, now()).await.unwrap();
        }
        store.commit(tx).await.unwrap();
        let batch = store
            .claim_batch(now(), Duration::from_secs(30), 1)
            .await
            .unwrap();
        store
            .mark_failed(batch[0].id, "refused", now(), true)
            .await
            .unwrap();
        let dead_id = batch[0].message_id.as_str().to_owned();

        let all = walk(addr, "/admin/v1/outbox/messages", 2).await;
        assert_eq!(all.len(), 5);
        let ids: Vec<i64> = all.iter().map(|m| m["id"].as_i64().unwrap()).collect();
        assert!(ids.windows(2).all(|w| w[0] > w[1]), "newest first");
        let dead = walk(addr, "/admin/v1/outbox/messages?state=dead", 10).await;
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0]["message_id"], dead_id.as_str());
        assert_eq!(dead[0]["last_error"], "refused");
        assert_eq!(dead[0]["payload"], "{\"n\":0}");
        let figures = get(addr, "/admin/v1/outbox").await.json();
        assert_eq!(
            (figures["pending"].as_u64(), figures["dead"].as_u64()),
            (Some(4), Some(1))
        );

        let body = json!({"message_id": dead_id}).to_string();
        let r = post(addr, "/admin/v1/outbox/requeue", "rq-1", &body).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.json(), json!({"requeued": true, "message_id": dead_id}));
        let stats = store.stats().await.unwrap();
        assert_eq!((stats.pending, stats.dead), (5, 0));
        let replay = post(addr, "/admin/v1/outbox/requeue", "rq-1", &body).await;
        assert!(replay.replayed() && replay.status == 200);
        let r = post(addr, "/admin/v1/outbox/requeue", "rq-2", &body).await;
        assert_problem(&r, 409, "not-dead");
        let r = post(
            addr,
            "/admin/v1/outbox/requeue",
            "rq-3",
            r#"{"message_id":"absent"}"#,
        )
        .await;
        assert_problem(&r, 404, "not-found");
        let rows = audit(addr).await;
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0]["action"], "outbox.requeue");

        let sub = Subscriber::new("ledger").unwrap();
        for m in ["m1", "m2", "m3"] {
            let mut tx = store.begin().await.unwrap();
            store
                .record(
                    &mut tx,
                    &sub,
                    &MessageId::new(m).unwrap(),
                    now(),
                    now() + 60_000,
                )
                .await
                .unwrap();
            store.commit(tx).await.unwrap();
        }
        let seen = get(addr, "/admin/v1/inbox?subscriber=ledger&message_id=m2")
            .await
            .json();
        assert_eq!(seen["seen"], true);
        assert!(seen["processed_at"].is_string());
        let unseen = get(addr, "/admin/v1/inbox?subscriber=ledger&message_id=m9")
            .await
            .json();
        assert_eq!(
            (unseen["seen"].clone(), unseen["processed_at"].clone()),
            (json!(false), Value::Null)
        );
        let r = get(addr, "/admin/v1/inbox?subscriber=ledger").await;
        assert_problem(&r, 400, "invalid-request");
        let listed = walk(addr, "/admin/v1/inbox/messages?subscriber=ledger", 2).await;
        assert_eq!(listed.len(), 3);
    }
}

/// A dead webhook receipt is listed, shown, and replayed (202 requeued,
/// received again); a replay of the request replays the answer.
struct Webhooks;
impl Job for Webhooks {
    type Output = ();
    async fn run<B: Backend>(self, store: B) {
        let addr = serve(&store).await;
        for i in 0..3 {
            let r = NewReceipt {
                endpoint: "github".into(),
                delivery_id: format!("d{i}"),
                event_type: Some("push".into()),
                headers: vec![("x-github-delivery".into(), format!("d{i}"))],
                body: b"{\"ok\":true}".to_vec(),
                entity_id: None,
                entity_version: None,
                content_sha256: None,
            };
            store.accept(&r, now(), now() + 60_000).await.unwrap();
        }
        let claimed = store
            .claim_receipts("github", now(), Duration::from_secs(30), 1)
            .await
            .unwrap();
        store
            .finish(
                claimed[0].id,
                &Finish::Dead {
                    error: "handler said no".into(),
                },
                now(),
            )
            .await
            .unwrap();
        let delivery = claimed[0].receipt.delivery_id.clone();
        assert_eq!(
            walk(addr, "/admin/v1/webhooks/receipts?endpoint=github", 2)
                .await
                .len(),
            3
        );
        let dead = walk(addr, "/admin/v1/webhooks/receipts?state=dead", 10).await;
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0]["delivery_id"], delivery.as_str());
        let shown = get(
            addr,
            &format!("/admin/v1/webhooks/receipt?endpoint=github&delivery_id={delivery}"),
        )
        .await;
        assert_eq!(shown.status, 200);
        assert_eq!(shown.json()["body"], "{\"ok\":true}");
        let body = json!({"endpoint": "github", "delivery_id": delivery}).to_string();
        let r = post(addr, "/admin/v1/webhooks/replay", "wh-1", &body).await;
        assert_eq!(r.status, 202, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.json()["result"], "requeued");
        let again = post(addr, "/admin/v1/webhooks/replay", "wh-1", &body).await;
        assert!(again.replayed());
        assert_eq!((again.status, again.json()), (202, r.json()));
        let receipt = store
            .get_receipt("github", &delivery)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(receipt.state.as_str(), "received");
        let r = post(
            addr,
            "/admin/v1/webhooks/replay",
            "wh-2",
            r#"{"endpoint":"github","delivery_id":"absent"}"#,
        )
        .await;
        assert_problem(&r, 404, "not-found");
        let rows = audit(addr).await;
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0]["action"], "webhooks.replay");
        assert_eq!(rows[0]["detail"]["result"], "requeued");
    }
}

/// Starts a run of `key` held by `holder`; returns its lease.
async fn start_run<B: Backend>(store: &B, key: &str, holder: &str) -> Lease {
    let s = scope("shop", "orders.create", key);
    // Drawn before the claim: on SQLite the claim holds the write lock.
    let namespace = store.namespace().await.unwrap();
    let Claim::Claimed(mut tx) = store
        .claim(
            &s,
            &Fingerprint::from_bytes([5; 32]),
            &Policy::default(),
            now(),
        )
        .await
        .unwrap()
    else {
        panic!("fresh key");
    };
    let id = RunId::of(&namespace, &s);
    let fence = B::create_run(
        &mut tx,
        &NewRun {
            id: &id,
            scope: &s,
            input: b"{}",
            holder,
            locked_until_ms: now() + 600_000,
            deadline_ms: now() + 600_000,
            ttl_ms: 86_400_000,
            now_ms: now(),
        },
    )
    .await
    .unwrap();
    store.commit(tx).await.unwrap();
    Lease {
        run: id,
        holder: holder.into(),
        fence,
    }
}

/// Runs: a run blocked at a send is listed by state and shown with its
/// steps; resume is refused for it (resolve it), resolve `sent` puts it
/// back to running with its fence bumped; then resume ends its lease so a
/// takeover happens at once; a final run is not resumed.
struct Runs;
impl Job for Runs {
    type Output = ();
    async fn run<B: Backend>(self, store: B) {
        let addr = serve(&store).await;
        let lease = start_run(&store, "ord-1", "exec-a").await;
        let step = StepRecord {
            name: "notify".into(),
            seq: 1,
            kind: StepKind::AtMostOnce,
            state: StepState::Started,
            attempts: 1,
            failures: 0,
            key: "idem:notify:1".into(),
            fence: lease.fence,
            result: None,
            error: None,
            started_at_ms: Some(now()),
            finished_at_ms: None,
            updated_at_ms: now(),
        };
        let blocked = RunChange {
            state: Some(RunState::NeedsAttention),
            attention: Some(Some(("notify", "the send may have happened"))),
            ..RunChange::default()
        };
        assert!(
            store
                .record_run(&lease, &blocked, Some(&step), now())
                .await
                .unwrap()
        );
        start_run(&store, "ord-2", "exec-b").await;

        let attention = walk(addr, "/admin/v1/runs?state=needs_attention", 5).await;
        assert_eq!(attention.len(), 1);
        assert_eq!(attention[0]["id"], lease.run.as_str());
        assert_eq!(
            walk(addr, "/admin/v1/runs?operation=orders.create", 1)
                .await
                .len(),
            2
        );
        let shown = get(addr, &format!("/admin/v1/runs/{}", lease.run.as_str()))
            .await
            .json();
        assert_eq!(shown["state"], "needs_attention");
        assert_eq!(shown["steps"][0]["name"], "notify");
        assert_eq!(shown["steps"][0]["derived_key"], "idem:notify:1");
        assert_eq!(shown["steps"][0]["message_id"], "idem:notify:1");

        let path = |action: &str| format!("/admin/v1/runs/{}/{action}", lease.run.as_str());
        let r = post(addr, &path("resume"), "rs-0", "{}").await;
        assert_problem(&r, 409, "needs-attention");
        let r = post(addr, &path("resolve"), "rv-0", r#"{"as":"maybe"}"#).await;
        assert_problem(&r, 400, "invalid-request");
        let r = post(addr, &path("resolve"), "rv-1", r#"{"as":"sent"}"#).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.json()["state"], "running");
        let run = store.load_run(&lease.run).await.unwrap().unwrap();
        assert_eq!(run.state, RunState::Running);
        assert_eq!(
            run.fence,
            Fence(lease.fence.0 + 1),
            "the old executor is fenced out"
        );
        assert_eq!(run.step("notify").unwrap().state, StepState::Done);
        let again = post(addr, &path("resolve"), "rv-1", r#"{"as":"sent"}"#).await;
        assert!(again.replayed() && again.status == 200);
        let r = post(addr, &path("resolve"), "rv-2", r#"{"as":"sent"}"#).await;
        assert_problem(&r, 409, "not-needs-attention");

        // Resume: the second run's lease (10 minutes left) ends now.
        let second = walk(addr, "/admin/v1/runs?state=running", 5).await;
        let other = second.iter().find(|r| r["key"] == "ord-2").unwrap()["id"]
            .as_str()
            .unwrap()
            .to_owned();
        let other = RunId::parse(&other).unwrap();
        let before = store.load_run(&other).await.unwrap().unwrap();
        let resume = format!("/admin/v1/runs/{}/resume", other.as_str());
        let r = post(addr, &resume, "rs-1", "{}").await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.json()["resumed"], true);
        let taken = store
            .take_over(&other, "recovery", now(), now() + 30_000)
            .await
            .unwrap()
            .expect("taken over at once");
        assert_eq!(taken.fence, Fence(before.fence.0 + 1));
        let finish = RunChange {
            state: Some(RunState::Completed),
            expires_at_ms: Some(now() + 60_000),
            ..RunChange::default()
        };
        assert!(
            store
                .record_run(&taken.lease().unwrap(), &finish, None, now())
                .await
                .unwrap()
        );
        let r = post(addr, &resume, "rs-2", "{}").await;
        assert_problem(&r, 409, "run-final");
        let missing = format!(
            "/admin/v1/runs/{}/resume",
            RunId::of(
                &store.namespace().await.unwrap(),
                &scope("shop", "orders.create", "none")
            )
            .as_str()
        );
        let r = post(addr, &missing, "rs-3", "{}").await;
        assert_problem(&r, 404, "not-found");

        let rows = audit(addr).await;
        let actions: Vec<&str> = rows.iter().map(|r| r["action"].as_str().unwrap()).collect();
        assert_eq!(
            actions,
            ["runs.resume", "runs.resolve"],
            "newest first, one per action"
        );
        assert_eq!(
            walk(addr, "/admin/v1/audit?action=runs.resolve", 1)
                .await
                .len(),
            1
        );
    }
}

/// Without the token: 401 on every route, reads and actions alike, and
/// nothing changes. With it, the overview counts the POSTs' outcomes of
/// this server and the stores' rows by state.
struct AuthAndOverview;
impl Job for AuthAndOverview {
    type Output = ();
    async fn run<B: Backend>(self, store: B) {
        let addr = serve(&store).await;
        for path in [
            "/admin/v1/overview",
            "/admin/v1/keys",
            "/admin/v1/audit",
            "/admin/v1/nope",
        ] {
            let r = send(addr, "GET", path, None, None, "").await;
            assert_eq!(r.status, 401, "{path}");
            let r = send(addr, "GET", path, Some("wrong-token-0123456789"), None, "").await;
            assert_eq!(r.status, 401, "{path}");
        }
        let body = r#"{"message_id":"absent"}"#;
        let r = send(
            addr,
            "POST",
            "/admin/v1/outbox/requeue",
            None,
            Some("u-1"),
            body,
        )
        .await;
        assert_eq!(r.status, 401);
        completed(&store, &scope("acme", "payments.create", "k1"), "{}").await;
        let stuck = scope("gw", "orders.create", "s1");
        store
            .claim_leased(
                &stuck,
                &Fingerprint::from_bytes([4; 32]),
                &Policy::default(),
                &LeaseToken::new(),
                now() - 1,
                OnUnknown::Reject,
                now() - 10,
            )
            .await
            .unwrap();
        let rel =
            r#"{"tenant":"gw","operation":"orders.create","key":"s1","upstream_checked":true}"#;
        assert_eq!(
            post(addr, "/admin/v1/keys/release", "o-1", rel)
                .await
                .status,
            200
        );
        assert!(
            post(addr, "/admin/v1/keys/release", "o-1", rel)
                .await
                .replayed()
        );
        assert_eq!(
            post(addr, "/admin/v1/keys/release", "o-1", "{}")
                .await
                .status,
            422
        );
        let v = get(addr, "/admin/v1/overview").await.json();
        let outcomes = &v["requests"]["outcomes"];
        assert_eq!(
            (
                outcomes["executed"].as_u64(),
                outcomes["replayed"].as_u64(),
                outcomes["mismatch"].as_u64()
            ),
            (Some(1), Some(1), Some(1)),
            "{v}"
        );
        assert_eq!(v["requests"]["window_minutes"], 60);
        assert_eq!(v["requests"]["per_minute"].as_array().unwrap().len(), 60);
        assert_eq!(
            v["keys"]["completed"], 2,
            "k1 and the release's own record: {v}"
        );
        assert_eq!(v["keys"]["pending"], 0);
        assert_eq!(v["runs"]["needs_attention"], 0);
        assert_eq!(v["webhooks"]["dead"], 0);
        assert_eq!(v["outbox"]["pending"], 0);
    }
}

/// A body the JSON parser refuses with a long message holding non-ASCII
/// text (an unknown field named `ééé…`): every action answers `400
/// invalid-request` with a shortened detail (never a 500 from cutting a
/// character in two), and the same key then runs a good body.
struct NonAsciiBodies;
impl Job for NonAsciiBodies {
    type Output = ();
    async fn run<B: Backend>(self, store: B) {
        let addr = serve(&store).await;
        let run = "run_0123456789abcdef0123456789abcdef";
        for (n, field) in [
            "é".repeat(200),
            format!("x{}", "é".repeat(200)),
            "€".repeat(150),
        ]
        .iter()
        .enumerate()
        {
            let body = format!("{{\"{field}\": 1}}");
            for path in [
                "/admin/v1/keys/release".to_owned(),
                "/admin/v1/outbox/requeue".to_owned(),
                "/admin/v1/webhooks/replay".to_owned(),
                format!("/admin/v1/runs/{run}/resolve"),
                format!("/admin/v1/runs/{run}/resume"),
            ] {
                let key = format!("na-{n}-{}", path.len());
                let r = post(addr, &path, &key, &body).await;
                assert_problem(&r, 400, "invalid-request");
                let detail = r.json()["detail"].as_str().unwrap().to_owned();
                assert!(
                    detail.starts_with("body: unknown field"),
                    "{path}: {detail}"
                );
                assert!(detail.len() <= 300, "{path}: {} bytes", detail.len());
            }
            // The refusal stored nothing: the key runs a good body.
            let good = r#"{"tenant":"t","operation":"o","key":"absent"}"#;
            let key = format!("na-{n}-{}", "/admin/v1/keys/release".len());
            let r = post(addr, "/admin/v1/keys/release", &key, good).await;
            assert_problem(&r, 404, "not-found");
        }
        assert!(audit(addr).await.is_empty(), "nothing was done");
    }
}

macro_rules! both {
    ($($name:ident: $job:expr;)*) => {
        mod sqlite {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let (url, _keep) = database(false).await;
                    Db::open(&url).await.unwrap().run($job).await;
                }
            )*
        }
        mod postgres {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let (url, _keep) = database(true).await;
                    Db::open(&url).await.unwrap().run($job).await;
                }
            )*
        }
    };
}

both! {
    admin_keys_search_pages_show_and_release: Keys;
    admin_outbox_requeue_and_inbox: OutboxInbox;
    admin_webhooks_replay_a_dead_receipt: Webhooks;
    admin_runs_resolve_and_resume: Runs;
    admin_needs_a_token_and_overview_counts_outcomes: AuthAndOverview;
    admin_bodies_with_long_non_ascii_errors_are_400: NonAsciiBodies;
}
