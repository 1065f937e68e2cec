//! The task API's contract through its router, on a real SQLite file and a
//! real PostgreSQL: tasks once per key, cursors moved only from where they
//! are, claims replayed by their key, settles and actions fenced, bad input
//! refused with problem+json and nothing changed.
#![cfg(feature = "http")]
#![allow(clippy::unwrap_used)]

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use idem_core::Tenant;
use idem_core::steps::RunStore;
use idem_core::tasks::TaskStore;
use idem_http::TenantSource;
use idem_tasks::http::{HttpConfig, router};
use idem_tasks::{Tasks, TasksConfig};
use serde_json::{Value, json};
use tower::ServiceExt;

struct Answer {
    status: StatusCode,
    replayed: bool,
    problem: bool,
    body: Value,
}

async fn call(app: &Router, method: &str, path: &str, key: Option<&str>, body: Value) -> Answer {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .header("x-tenant-id", "acme");
    if let Some(k) = key {
        req = req.header("idempotency-key", k);
    }
    let body = if body.is_null() {
        Body::empty()
    } else {
        Body::from(body.to_string())
    };
    let res = app.clone().oneshot(req.body(body).unwrap()).await.unwrap();
    let status = res.status();
    let replayed = res.headers().get("idempotent-replayed").is_some();
    let problem = res
        .headers()
        .get("content-type")
        .is_some_and(|v| v == "application/problem+json");
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Answer {
        status,
        replayed,
        problem,
        body,
    }
}

async fn app<S: TaskStore + RunStore>(store: S) -> Router {
    let tasks = Tasks::new(store, TasksConfig::default()).await.unwrap();
    let tenant = TenantSource::TrustedHeader {
        name: axum::http::HeaderName::from_static("x-tenant-id"),
        default: Tenant::new("default").ok(),
    };
    router(tasks, HttpConfig::new(tenant)).unwrap()
}

/// The routes over a store on a fresh SQLite file (kept while the guard lives).
async fn on_sqlite(tag: &str) -> (Router, idem_testkit::TempDir) {
    let dir = idem_testkit::TempDir::new(tag);
    let store =
        idem_sqlite::SqliteStore::connect(&dir.sqlite_url(), idem_sqlite::SqliteConfig::default())
            .await
            .unwrap();
    store.migrate().await.unwrap();
    (app(store).await, dir)
}

/// The routes over a store on a fresh PostgreSQL database.
async fn on_postgres(tag: &str) -> (Router, idem_testkit::PgDatabase) {
    let db = idem_testkit::PgDatabase::create(tag).await;
    let store = idem_postgres::PgStore::connect(&db.url, idem_postgres::PgConfig::default())
        .await
        .unwrap();
    store.migrate().await.unwrap();
    (app(store).await, db)
}

async fn contract(app: Router) {
    // Observations become tasks once.
    let new = json!({"payload": {"issue": 1842}});
    let first = call(
        &app,
        "POST",
        "/v1/queues/triage/tasks",
        Some("gh:1842:t1"),
        new.clone(),
    )
    .await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    assert!(!first.replayed);
    assert_eq!(first.body["state"], "ready");
    let id = first.body["id"].as_str().unwrap().to_owned();
    let again = call(
        &app,
        "POST",
        "/v1/queues/triage/tasks",
        Some("gh:1842:t1"),
        json!({"payload": {"issue": 1842}}),
    )
    .await;
    assert_eq!((again.status, again.replayed), (StatusCode::CREATED, true));
    assert_eq!(again.body["id"], id.as_str());
    let other = call(
        &app,
        "POST",
        "/v1/queues/triage/tasks",
        Some("gh:1842:t1"),
        json!({"payload": {"issue": 9}}),
    )
    .await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(other.problem);
    let keyless = call(&app, "POST", "/v1/queues/triage/tasks", None, new.clone()).await;
    assert_eq!(keyless.status, StatusCode::BAD_REQUEST);

    // The cursor moves with the observation, only from where it is.
    let obs = |expected: Value, value: Value, key: &str| {
        json!({"cursor": {"expected": expected, "value": value},
               "tasks": [{"queue": "triage", "key": key, "payload": {"k": key}}]})
    };
    let o1 = call(
        &app,
        "POST",
        "/v1/pollers/gh/observations",
        None,
        obs(Value::Null, json!({"since": 1}), "o-1"),
    )
    .await;
    assert_eq!(o1.status, StatusCode::OK, "{}", o1.body);
    assert_eq!(o1.body["tasks"][0]["created"], true);
    let stale = call(
        &app,
        "POST",
        "/v1/pollers/gh/observations",
        None,
        obs(Value::Null, json!({"since": 2}), "o-2"),
    )
    .await;
    assert_eq!(stale.status, StatusCode::CONFLICT);
    assert_eq!(stale.body["type"], "https://idem.dev/problems/cursor-moved");
    assert_eq!(stale.body["current"], json!({"since": 1}));
    let nothing = call(
        &app,
        "GET",
        &format!("/v1/tasks/{}", "tsk_0123456789abcdef0123456789abcdef"),
        None,
        Value::Null,
    )
    .await;
    assert_eq!(nothing.status, StatusCode::NOT_FOUND);
    let o2 = call(
        &app,
        "POST",
        "/v1/pollers/gh/observations",
        None,
        obs(json!({"since": 1}), json!({"since": 2}), "o-2"),
    )
    .await;
    assert_eq!(o2.status, StatusCode::OK);
    let repeat = call(
        &app,
        "POST",
        "/v1/pollers/gh/observations",
        None,
        obs(json!({"since": 1}), json!({"since": 2}), "o-2"),
    )
    .await;
    assert_eq!(
        (repeat.status, repeat.body["repeated"].clone()),
        (StatusCode::OK, json!(true))
    );
    assert_eq!(
        repeat.body["tasks"][0]["created"], false,
        "a repeat creates nothing"
    );
    let cursor = call(&app, "GET", "/v1/pollers/gh", None, Value::Null).await;
    assert_eq!(
        (
            cursor.body["cursor"].clone(),
            cursor.body["version"].clone()
        ),
        (json!({"since": 2}), json!(2))
    );

    // Claims: a retried claim (its answer lost) is answered as the first.
    let body = json!({"worker": "agent-3", "lease": "30s", "max": 5});
    let c1 = call(
        &app,
        "POST",
        "/v1/queues/triage/claims",
        Some("claim-1"),
        body.clone(),
    )
    .await;
    assert_eq!(c1.status, StatusCode::OK, "{}", c1.body);
    let claimed = c1.body["tasks"].as_array().unwrap().clone();
    assert_eq!(claimed.len(), 3, "the three tasks of the queue");
    let c1again = call(
        &app,
        "POST",
        "/v1/queues/triage/claims",
        Some("claim-1"),
        body.clone(),
    )
    .await;
    assert!(c1again.replayed);
    assert_eq!(c1again.body, c1.body, "the same tasks, not three more");
    let c2 = call(
        &app,
        "POST",
        "/v1/queues/triage/claims",
        Some("claim-2"),
        body.clone(),
    )
    .await;
    assert_eq!(c2.body["tasks"], json!([]), "live leases are not shared");
    let unkeyed = call(&app, "POST", "/v1/queues/triage/claims", None, body).await;
    assert_eq!(unkeyed.status, StatusCode::BAD_REQUEST);

    // A long poll: nothing due, it waits and answers empty; a task created
    // meanwhile is claimed as soon as it is due.
    let waited = std::time::Instant::now();
    let empty = call(
        &app,
        "POST",
        "/v1/queues/later/claims",
        Some("w-1"),
        json!({"worker": "w", "lease": "30s", "wait": "300ms"}),
    )
    .await;
    assert_eq!(
        (empty.status, empty.body["tasks"].clone()),
        (StatusCode::OK, json!([]))
    );
    assert!(
        waited.elapsed() >= std::time::Duration::from_millis(300),
        "it waited"
    );
    let creator = app.clone();
    let made = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        call(
            &creator,
            "POST",
            "/v1/queues/later/tasks",
            Some("late-1"),
            json!({"payload": 1}),
        )
        .await
    });
    let polled = call(
        &app,
        "POST",
        "/v1/queues/later/claims",
        Some("w-2"),
        json!({"worker": "w", "lease": "30s", "wait": "20s"}),
    )
    .await;
    assert_eq!(made.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(polled.body["tasks"][0]["key"], "late-1", "{}", polled.body);
    let replay = call(
        &app,
        "POST",
        "/v1/queues/later/claims",
        Some("w-2"),
        json!({"worker": "w", "lease": "30s", "wait": "20s"}),
    )
    .await;
    assert!(
        replay.replayed,
        "a recorded claim is answered at once, not after a wait"
    );

    // Actions and completion, fenced.
    let t = claimed.iter().find(|t| t["id"] == id.as_str()).unwrap();
    let fence = t["fence"].as_i64().unwrap();
    let act = call(
        &app,
        "POST",
        &format!("/v1/tasks/{id}/actions/notify"),
        None,
        json!({"fence": fence, "mode": "verify"}),
    )
    .await;
    assert_eq!(
        (act.status, act.body["do"].clone()),
        (StatusCode::OK, json!("go")),
        "{}",
        act.body
    );
    let key = act.body["key"].as_str().unwrap().to_owned();
    assert!(key.starts_with("idem:notify:"));
    let done = call(
        &app,
        "POST",
        &format!("/v1/tasks/{id}/actions/notify/result"),
        None,
        json!({"fence": fence, "outcome": "done"}),
    )
    .await;
    assert_eq!(done.body["do"], "done");
    let zombie = call(
        &app,
        "POST",
        &format!("/v1/tasks/{id}/complete"),
        None,
        json!({"fence": fence - 1, "result": {}}),
    )
    .await;
    assert_eq!(zombie.status, StatusCode::CONFLICT);
    assert_eq!(zombie.body["type"], "https://idem.dev/problems/lease-lost");
    let ok = call(
        &app,
        "POST",
        &format!("/v1/tasks/{id}/complete"),
        None,
        json!({"fence": fence, "result": {"sent": true}}),
    )
    .await;
    assert_eq!(
        (ok.status, ok.body["state"].clone()),
        (StatusCode::OK, json!("done"))
    );
    let twice = call(
        &app,
        "POST",
        &format!("/v1/tasks/{id}/complete"),
        None,
        json!({"fence": fence, "result": {"sent": true}}),
    )
    .await;
    assert_eq!((twice.status, twice.replayed), (StatusCode::OK, true));
    let mismatch = call(
        &app,
        "POST",
        &format!("/v1/tasks/{id}/complete"),
        None,
        json!({"fence": fence, "result": {"sent": false}}),
    )
    .await;
    assert_eq!(mismatch.status, StatusCode::UNPROCESSABLE_ENTITY);
    let shown = call(&app, "GET", &format!("/v1/tasks/{id}"), None, Value::Null).await;
    assert_eq!(shown.body["result"], json!({"sent": true}));

    // Bad input: a clear problem, nothing changed.
    let bad = [
        (
            "POST",
            "/v1/queues/bad%20queue/tasks",
            Some("k"),
            json!({"payload": 1}),
        ),
        (
            "POST",
            "/v1/queues/q/tasks",
            Some("k"),
            json!({"payload": 1, "extra": 2}),
        ),
        (
            "POST",
            "/v1/queues/q/tasks",
            Some("k"),
            json!({"payload": "x".repeat(70_000)}),
        ),
        (
            "POST",
            "/v1/queues/q/tasks",
            Some("k"),
            json!({"payload": 1, "max_attempts": 0}),
        ),
        (
            "POST",
            "/v1/queues/q/tasks",
            Some("k"),
            json!({"payload": 1, "run_at": "tomorrow"}),
        ),
        (
            "POST",
            "/v1/queues/triage/claims",
            Some("c-x"),
            json!({"worker": "w", "lease": "forever"}),
        ),
        (
            "POST",
            "/v1/queues/triage/claims",
            Some("c-y"),
            json!({"worker": "w", "lease": "2h"}),
        ),
        (
            "POST",
            "/v1/queues/triage/claims",
            Some("c-z"),
            json!({"worker": "w w", "lease": "30s"}),
        ),
        (
            "POST",
            &format!("/v1/tasks/{id}/actions/notify"),
            None,
            json!({"fence": fence, "mode": "twice"}),
        ),
        (
            "POST",
            &format!("/v1/tasks/{id}/fail"),
            None,
            json!({"fence": fence, "error": "x", "retry_in": "soon"}),
        ),
        (
            "POST",
            "/v1/pollers/gh/observations",
            None,
            json!({"cursor": {"value": "x".repeat(5000)}}),
        ),
    ];
    for (method, path, key, body) in bad {
        let a = call(&app, method, path, key, body.clone()).await;
        assert_eq!(
            a.status,
            StatusCode::BAD_REQUEST,
            "{path} {body}: {}",
            a.body
        );
        assert!(a.problem, "{path}");
    }
    let forged = call(
        &app,
        "POST",
        "/v1/tasks/not-a-task/complete",
        None,
        json!({"fence": 1}),
    )
    .await;
    assert_eq!(forged.status, StatusCode::NOT_FOUND);
    let c3 = call(
        &app,
        "POST",
        "/v1/queues/q/claims",
        Some("claim-q"),
        json!({"worker": "w", "lease": "30s"}),
    )
    .await;
    assert_eq!(
        c3.body["tasks"],
        json!([]),
        "no refused request created a task"
    );
}

#[tokio::test]
async fn the_contract_holds_on_sqlite() {
    let (app, _dir) = on_sqlite("tasks-http").await;
    contract(app).await;
}

#[tokio::test]
async fn the_contract_holds_on_postgres() {
    let (app, _db) = on_postgres("idem_tasks_http").await;
    contract(app).await;
}

/// PostgreSQL goes silent: task writes answer 503 within the deadline
/// (nothing hangs), and once it answers again the same requests repeated
/// finish the work once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_database_gives_bounded_answers_and_repeats_are_safe() {
    let db = idem_testkit::PgDatabase::create("idem_tasks_stall").await;
    let proxy = idem_testkit::Proxy::start(idem_testkit::url_addr(&db.url)).await;
    let url = idem_testkit::url_via(&db.url, proxy.addr);
    let config = idem_postgres::PgConfig {
        acquire_timeout: std::time::Duration::from_secs(1),
        ..idem_postgres::PgConfig::default()
    };
    let store = idem_postgres::PgStore::connect(&url, config).await.unwrap();
    store.migrate().await.unwrap();
    let tasks = Tasks::new(
        store,
        TasksConfig {
            deadline: std::time::Duration::from_secs(1),
            ..TasksConfig::default()
        },
    )
    .await
    .unwrap();
    let tenant = TenantSource::TrustedHeader {
        name: axum::http::HeaderName::from_static("x-tenant-id"),
        default: Tenant::new("default").ok(),
    };
    let app = router(tasks, HttpConfig::new(tenant)).unwrap();
    let made = call(
        &app,
        "POST",
        "/v1/queues/q/tasks",
        Some("s-1"),
        json!({"payload": 1}),
    )
    .await;
    assert_eq!(made.status, StatusCode::CREATED);
    let claimed = call(
        &app,
        "POST",
        "/v1/queues/q/claims",
        Some("s-c"),
        json!({"worker": "w", "lease": "1m"}),
    )
    .await;
    let t = claimed.body["tasks"][0].clone();
    let (id, fence) = (
        t["id"].as_str().unwrap().to_owned(),
        t["fence"].as_i64().unwrap(),
    );

    proxy.freeze();
    let started = std::time::Instant::now();
    let create = call(
        &app,
        "POST",
        "/v1/queues/q/tasks",
        Some("s-2"),
        json!({"payload": 2}),
    )
    .await;
    let complete = call(
        &app,
        "POST",
        &format!("/v1/tasks/{id}/complete"),
        None,
        json!({"fence": fence, "result": {"ok": 1}}),
    )
    .await;
    for a in [&create, &complete] {
        assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{}", a.body);
        assert!(a.problem);
    }
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "bounded: {:?}",
        started.elapsed()
    );
    proxy.thaw();

    // The same requests again: each done once.
    let mut created = None;
    for _ in 0..50 {
        let a = call(
            &app,
            "POST",
            "/v1/queues/q/tasks",
            Some("s-2"),
            json!({"payload": 2}),
        )
        .await;
        if a.status == StatusCode::CREATED {
            created = Some(a);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert!(created.is_some(), "the store answers again");
    let done = call(
        &app,
        "POST",
        &format!("/v1/tasks/{id}/complete"),
        None,
        json!({"fence": fence, "result": {"ok": 1}}),
    )
    .await;
    assert_eq!(
        (done.status, done.body["state"].clone()),
        (StatusCode::OK, json!("done")),
        "{}",
        done.body
    );
    let again = call(
        &app,
        "POST",
        "/v1/queues/q/tasks",
        Some("s-2"),
        json!({"payload": 2}),
    )
    .await;
    assert!(again.replayed, "one task for the key");
}

/// Found by attacking the API: a null cursor is refused (an observation
/// expecting `null` means "no cursor yet", so a poller whose cursor were
/// `null` could never move it again), and a long-poll claim with bad input
/// is refused at once, not after its wait.
async fn bad_input_is_refused_at_once(app: Router) {
    let null = call(
        &app,
        "POST",
        "/v1/pollers/nullish/observations",
        None,
        json!({"cursor": {"expected": null, "value": null},
               "tasks": [{"queue": "triage", "key": "n:1", "payload": 1}]}),
    )
    .await;
    assert_eq!(null.status, StatusCode::BAD_REQUEST, "{}", null.body);
    assert!(null.problem);
    let read = call(&app, "GET", "/v1/pollers/nullish", None, Value::Null).await;
    assert_eq!(read.status, StatusCode::NOT_FOUND, "nothing written");
    let moved = call(
        &app,
        "POST",
        "/v1/pollers/nullish/observations",
        None,
        json!({"cursor": {"expected": null, "value": 1}}),
    )
    .await;
    assert_eq!(moved.status, StatusCode::OK, "{}", moved.body);

    for bad in [
        json!({"worker": "w", "lease": "zz", "wait": "3s"}),
        json!({"worker": "w", "lease": "0s", "wait": "3s"}),
        json!({"worker": "w", "lease": "30s", "max": 0, "wait": "3s"}),
        json!({"worker": "w é", "lease": "30s", "wait": "3s"}),
    ] {
        let started = std::time::Instant::now();
        let refused = call(
            &app,
            "POST",
            "/v1/queues/idle/claims",
            Some("idle:claim:1"),
            bad.clone(),
        )
        .await;
        assert_eq!(
            refused.status,
            StatusCode::BAD_REQUEST,
            "{bad}: {}",
            refused.body
        );
        assert!(refused.problem);
        assert!(
            started.elapsed() < std::time::Duration::from_secs(2),
            "{bad} refused after {:?}, not at once",
            started.elapsed()
        );
    }
}

#[tokio::test]
async fn bad_input_is_refused_at_once_on_sqlite() {
    let (app, _dir) = on_sqlite("tasks-http-bad").await;
    bad_input_is_refused_at_once(app).await;
}

#[tokio::test]
async fn bad_input_is_refused_at_once_on_postgres() {
    let (app, _db) = on_postgres("idem_tasks_http_bad").await;
    bad_input_is_refused_at_once(app).await;
}

/// Found by attacking the API: tasks whose lease ended on their last
/// attempt turn dead when a claim meets them, and they used to count
/// against its `max` — a claim answered `[]` (at once, even as a long poll)
/// while a ready task waited behind them.
async fn a_claim_looks_past_tasks_that_died(app: Router) {
    for i in 0..3 {
        let key = format!("last:{i}");
        let body = json!({"payload": i, "max_attempts": 1, "priority": 10});
        let made = call(&app, "POST", "/v1/queues/deaths/tasks", Some(&key), body).await;
        assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
        let key = format!("deaths:claim:{i}");
        let body = json!({"worker": "w1", "lease": "1s"});
        let held = call(&app, "POST", "/v1/queues/deaths/claims", Some(&key), body).await;
        assert_eq!(held.body["tasks"].as_array().map(Vec::len), Some(1));
    }
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    let ready = json!({"payload": "ready"});
    let made = call(
        &app,
        "POST",
        "/v1/queues/deaths/tasks",
        Some("ready"),
        ready,
    )
    .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    let body = json!({"worker": "w2", "lease": "30s", "wait": "2s"});
    let claim = call(
        &app,
        "POST",
        "/v1/queues/deaths/claims",
        Some("deaths:w2"),
        body,
    )
    .await;
    assert_eq!(claim.status, StatusCode::OK, "{}", claim.body);
    assert_eq!(
        claim.body["tasks"][0]["key"], "ready",
        "the ready task is claimed: {}",
        claim.body
    );
    for i in 0..3 {
        // The same key again answers the task as it stands.
        let key = format!("last:{i}");
        let body = json!({"payload": i, "max_attempts": 1, "priority": 10});
        let again = call(&app, "POST", "/v1/queues/deaths/tasks", Some(&key), body).await;
        assert_eq!(again.body["state"], "dead", "{}", again.body);
    }
}

#[tokio::test]
async fn a_claim_looks_past_tasks_that_died_on_sqlite() {
    let (app, _dir) = on_sqlite("tasks-http-deaths").await;
    a_claim_looks_past_tasks_that_died(app).await;
}

#[tokio::test]
async fn a_claim_looks_past_tasks_that_died_on_postgres() {
    let (app, _db) = on_postgres("idem_tasks_http_deaths").await;
    a_claim_looks_past_tasks_that_died(app).await;
}

/// Found by attacking the API: a `not-sent` result answered `go` without
/// recording the attempt, and a `done` after it was dropped — so a worker
/// that sent as told and died before completing left the action to be
/// sent again by the next claim (`go`, not `done` or `unknown`). Since
/// issue 36 a `not-sent` result answers `ask` (no go: the next ask is told
/// go, recorded as that ask's), and a `done` is recorded whatever came
/// before.
async fn a_go_after_not_sent_is_recorded(app: Router) {
    let made = call(
        &app,
        "POST",
        "/v1/queues/ns/tasks",
        Some("ns:1"),
        json!({"payload": 1}),
    )
    .await;
    let id = made.body["id"].as_str().unwrap().to_owned();
    let ask = |fence: i64| {
        let app = app.clone();
        let path = format!("/v1/tasks/{id}/actions/notify");
        async move {
            call(
                &app,
                "POST",
                &path,
                None,
                json!({"fence": fence, "mode": "verify"}),
            )
            .await
            .body["do"]
                .clone()
        }
    };
    let report = |fence: i64, outcome: &'static str| {
        let app = app.clone();
        let path = format!("/v1/tasks/{id}/actions/notify/result");
        async move {
            call(
                &app,
                "POST",
                &path,
                None,
                json!({"fence": fence, "outcome": outcome}),
            )
            .await
            .body["do"]
                .clone()
        }
    };
    let claim = |n: u32| {
        let app = app.clone();
        async move {
            let body = json!({"worker": format!("w{n}"), "lease": "1s"});
            let key = format!("ns:claim:{n}");
            let got = call(&app, "POST", "/v1/queues/ns/claims", Some(&key), body).await;
            got.body["tasks"][0]["fence"].as_i64().unwrap()
        }
    };
    let f1 = claim(1).await;
    assert_eq!(ask(f1).await, "go", "the first attempt; its worker dies");
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let f2 = claim(2).await;
    assert_eq!(ask(f2).await, "unknown");
    assert_eq!(report(f2, "not-sent").await, "ask", "checked: never sent");
    assert_eq!(ask(f2).await, "go", "the next ask");
    assert_eq!(report(f2, "done").await, "done", "sent as told");
    // The worker dies before completing; the next claim skips the action.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let f3 = claim(3).await;
    assert_eq!(ask(f3).await, "done", "a done report is kept");

    // Told go after a not-sent result, sent, died before reporting: unknown.
    let made = call(
        &app,
        "POST",
        "/v1/queues/ns2/tasks",
        Some("ns:2"),
        json!({"payload": 2}),
    )
    .await;
    assert_eq!(made.status, StatusCode::CREATED);
    let id2 = made.body["id"].as_str().unwrap().to_owned();
    let path = format!("/v1/tasks/{id2}/actions/notify");
    let result = format!("/v1/tasks/{id2}/actions/notify/result");
    let mut fences = Vec::new();
    for n in 4..7 {
        let body = json!({"worker": format!("w{n}"), "lease": "1s"});
        let got = call(
            &app,
            "POST",
            "/v1/queues/ns2/claims",
            Some(&format!("ns:claim:{n}")),
            body,
        )
        .await;
        let fence = got.body["tasks"][0]["fence"].as_i64().unwrap();
        let asked = call(
            &app,
            "POST",
            &path,
            None,
            json!({"fence": fence, "mode": "verify"}),
        )
        .await;
        fences.push(asked.body["do"].clone());
        if n == 5 {
            let r = call(
                &app,
                "POST",
                &result,
                None,
                json!({"fence": fence, "outcome": "not-sent"}),
            )
            .await;
            assert_eq!(r.body["do"], "ask");
            let go = call(
                &app,
                "POST",
                &path,
                None,
                json!({"fence": fence, "mode": "verify"}),
            )
            .await;
            assert_eq!(go.body["do"], "go");
        }
        tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    }
    assert_eq!(
        fences,
        vec![json!("go"), json!("unknown"), json!("unknown")]
    );
}

#[tokio::test]
async fn a_go_after_not_sent_is_recorded_on_sqlite() {
    let (app, _dir) = on_sqlite("tasks-http-notsent").await;
    a_go_after_not_sent_is_recorded(app).await;
}

#[tokio::test]
async fn a_go_after_not_sent_is_recorded_on_postgres() {
    let (app, _db) = on_postgres("idem_tasks_http_notsent").await;
    a_go_after_not_sent_is_recorded(app).await;
}

/// Issue 36: after an ask was answered `go` under a fence, the only other
/// `go` for the action under that fence is the exact replay of that ask
/// (its `Idempotency-Key` and body); any other ask — another key, no key, a
/// restarted process holding the replayed claim — is told `unknown`. In
/// verify mode its report is accepted; in at-most-once mode the task needs
/// an operator; a `not-sent` report by the ask told go frees the action for
/// the next ask.
async fn an_action_goes_once_per_fence_whoever_asks(app: Router) {
    let made = |key: &'static str| {
        let app = app.clone();
        async move {
            let t = call(
                &app,
                "POST",
                &format!("/v1/queues/{key}/tasks"),
                Some(key),
                json!({"payload": {"k": key}}),
            )
            .await;
            assert_eq!(t.status, StatusCode::CREATED, "{}", t.body);
            t.body["id"].as_str().unwrap().to_owned()
        }
    };
    let claim = |queue: &'static str, key: &'static str| {
        let app = app.clone();
        async move {
            let body = json!({"worker": "agent-3", "lease": "30s"});
            let path = format!("/v1/queues/{queue}/claims");
            let got = call(&app, "POST", &path, Some(key), body).await;
            assert_eq!(got.status, StatusCode::OK, "{}", got.body);
            got.body["tasks"][0].clone()
        }
    };
    let ask = |id: String, key: Option<&'static str>, body: Value| {
        let app = app.clone();
        async move {
            let path = format!("/v1/tasks/{id}/actions/notify");
            call(&app, "POST", &path, key, body).await
        }
    };
    let report = |id: String, fence: i64, outcome: &'static str| {
        let app = app.clone();
        async move {
            let path = format!("/v1/tasks/{id}/actions/notify/result");
            let body = json!({"fence": fence, "outcome": outcome});
            call(&app, "POST", &path, None, body).await
        }
    };

    // Verify mode: one go, its exact replay, unknown for anyone else.
    let id = made("once").await;
    let held = claim("once", "agent-3:n1:claim:1").await;
    let fence = held["fence"].as_i64().unwrap();
    let verify = json!({"fence": fence, "mode": "verify"});
    let first = ask(id.clone(), Some("agent-3:n1:ask:1"), verify.clone()).await;
    assert_eq!(
        (first.status, first.body["do"].clone()),
        (StatusCode::OK, json!("go")),
        "{}",
        first.body
    );
    let replay = ask(id.clone(), Some("agent-3:n1:ask:1"), verify.clone()).await;
    assert_eq!(
        replay.body["do"], "go",
        "the exact replay (its answer lost)"
    );
    let respelled = ask(
        id.clone(),
        Some("agent-3:n1:ask:1"),
        json!({"mode": "verify", "fence": fence}),
    )
    .await;
    assert_eq!(respelled.body["do"], "go", "the same body, keys reordered");
    let other = ask(id.clone(), Some("agent-3:n2:ask:1"), verify.clone()).await;
    assert_eq!(
        (other.status, other.body["do"].clone()),
        (StatusCode::OK, json!("unknown")),
        "another key under the fence that was told go: {}",
        other.body
    );
    let keyless = ask(id.clone(), None, verify.clone()).await;
    assert_eq!(keyless.body["do"], "unknown", "no key: never a replay");
    let left = first.body["lease_remaining_ms"].as_i64();
    assert!(
        left.is_some_and(|ms| ms > 0 && ms <= 30_000),
        "the answer says how long the lease has left: {}",
        first.body
    );
    assert_eq!(
        first.body["task"]["lease_expires_at"], held["lease_expires_at"],
        "{}",
        first.body
    );
    let reused = ask(
        id.clone(),
        Some("agent-3:n1:ask:1"),
        json!({"fence": fence, "mode": "at-most-once"}),
    )
    .await;
    assert_eq!(
        reused.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        reused.body
    );
    assert!(reused.problem);
    assert_eq!(
        reused.body["type"],
        "https://idem.dev/problems/idempotency-key-reused"
    );
    let bad = "k".repeat(300);
    let bad_key = call(
        &app,
        "POST",
        &format!("/v1/tasks/{id}/actions/notify"),
        Some(&bad),
        verify.clone(),
    )
    .await;
    assert_eq!(bad_key.status, StatusCode::BAD_REQUEST, "{}", bad_key.body);
    assert!(bad_key.problem);
    let shown = call(&app, "GET", &format!("/v1/tasks/{id}"), None, Value::Null).await;
    assert_eq!(
        shown.body["state"], "claimed",
        "refused asks changed nothing"
    );
    // A restarted process: its claim's key is replayed (the same fence),
    // its ask has a key of its own.
    let again = claim("once", "agent-3:n1:claim:1").await;
    assert_eq!(again["fence"], held["fence"]);
    let restarted = ask(id.clone(), Some("agent-3:n3:ask:1"), verify.clone()).await;
    assert_eq!(restarted.body["do"], "unknown", "{}", restarted.body);
    let checked = report(id.clone(), fence, "done").await;
    assert_eq!(
        (checked.status, checked.body["do"].clone()),
        (StatusCode::OK, json!("done")),
        "verified downstream, its report is accepted: {}",
        checked.body
    );
    let done = call(
        &app,
        "POST",
        &format!("/v1/tasks/{id}/complete"),
        None,
        json!({"fence": fence, "result": {}}),
    )
    .await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);

    // At-most-once: another ask under the fence parks the task.
    let id = made("amo").await;
    let fence = claim("amo", "agent-3:n1:claim:2").await["fence"]
        .as_i64()
        .unwrap();
    let amo = json!({"fence": fence, "mode": "at-most-once"});
    let go = ask(id.clone(), Some("agent-3:n1:ask:2"), amo.clone()).await;
    assert_eq!(go.body["do"], "go");
    let second = ask(id.clone(), Some("agent-3:n4:ask:1"), amo).await;
    assert_eq!(
        (
            second.body["do"].clone(),
            second.body["task"]["state"].clone()
        ),
        (json!("unknown"), json!("needs_attention")),
        "{}",
        second.body
    );

    // A not-sent report frees the action for the next ask.
    let id = made("freed").await;
    let fence = claim("freed", "agent-3:n1:claim:3").await["fence"]
        .as_i64()
        .unwrap();
    let verify = json!({"fence": fence, "mode": "verify"});
    let a = ask(id.clone(), Some("agent-3:n1:ask:3"), verify.clone()).await;
    assert_eq!(a.body["do"], "go");
    let b = ask(id.clone(), Some("agent-3:n5:ask:1"), verify.clone()).await;
    assert_eq!(b.body["do"], "unknown");
    // Given back by the ask told go (its key); B's look proved nothing.
    let by_b = call(
        &app,
        "POST",
        &format!("/v1/tasks/{id}/actions/notify/result"),
        Some("agent-3:n5:ask:1"),
        json!({"fence": fence, "outcome": "not-sent"}),
    )
    .await;
    assert_eq!(by_b.status, StatusCode::CONFLICT, "{}", by_b.body);
    let freed = call(
        &app,
        "POST",
        &format!("/v1/tasks/{id}/actions/notify/result"),
        Some("agent-3:n1:ask:3"),
        json!({"fence": fence, "outcome": "not-sent"}),
    )
    .await;
    assert_eq!(freed.status, StatusCode::OK, "{}", freed.body);
    assert_ne!(freed.body["do"], "go", "a report is no go: {}", freed.body);
    let b = ask(id.clone(), Some("agent-3:n5:ask:1"), verify.clone()).await;
    assert_eq!(b.body["do"], "go", "the next ask after not-sent");
    let a = ask(id.clone(), Some("agent-3:n1:ask:3"), verify.clone()).await;
    assert_eq!(a.body["do"], "unknown", "the earlier go was given up");
    let sent = report(id.clone(), fence, "done").await;
    assert_eq!(sent.body["do"], "done");
}

#[tokio::test]
async fn an_action_goes_once_per_fence_whoever_asks_on_sqlite() {
    let (app, _dir) = on_sqlite("tasks-http-asks").await;
    an_action_goes_once_per_fence_whoever_asks(app).await;
}

#[tokio::test]
async fn an_action_goes_once_per_fence_whoever_asks_on_postgres() {
    let (app, _db) = on_postgres("idem_tasks_http_asks").await;
    an_action_goes_once_per_fence_whoever_asks(app).await;
}

/// Found by attacking issue 36's "asked once": two processes hold one
/// claim (a process restarted under the same worker name whose claim key
/// was replayed while the first still runs — the case docs/tasks.md names).
/// A asks and is told `go`; B asks and is told `unknown`, checks the other
/// system, finds nothing there yet (A has not sent) and reports
/// `not-sent`, as the verify protocol says. If that report freed the
/// action, B's next ask would be told `go` while A, told `go` too and never
/// told otherwise, sends: two messages under one fence. Under the fence
/// that told it `go`, the check of another ask proves nothing — the
/// asker told `go` may still send — so only that ask (its
/// `Idempotency-Key` on the report) may say it did not send; a `done`
/// from anyone is taken.
async fn a_go_is_not_taken_back_by_another_ask_of_its_claim(app: Router) {
    let made = call(
        &app,
        "POST",
        "/v1/queues/twice/tasks",
        Some("twice:1"),
        json!({"payload": {"n": 1}}),
    )
    .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    let id = made.body["id"].as_str().unwrap().to_owned();
    let claim = json!({"worker": "agent-3", "lease": "30s"});
    let a = call(
        &app,
        "POST",
        "/v1/queues/twice/claims",
        Some("agent-3:claim:1"),
        claim.clone(),
    )
    .await;
    let b = call(
        &app,
        "POST",
        "/v1/queues/twice/claims",
        Some("agent-3:claim:1"),
        claim,
    )
    .await;
    let fence = a.body["tasks"][0]["fence"].as_i64().unwrap();
    assert_eq!(
        b.body["tasks"][0]["fence"], fence,
        "the claim replayed to B"
    );
    let verify = json!({"fence": fence, "mode": "verify"});
    let ask = |key: &'static str| {
        let (app, path, body) = (
            app.clone(),
            format!("/v1/tasks/{id}/actions/notify"),
            verify.clone(),
        );
        async move { call(&app, "POST", &path, Some(key), body).await }
    };
    let report = |key: Option<&'static str>, outcome: &'static str| {
        let (app, path) = (app.clone(), format!("/v1/tasks/{id}/actions/notify/result"));
        let body = json!({"fence": fence, "outcome": outcome});
        async move { call(&app, "POST", &path, key, body).await }
    };

    let go = ask("agent-3:a:ask:1").await;
    assert_eq!(go.body["do"], "go", "A: {}", go.body);
    let told = ask("agent-3:b:ask:1").await;
    assert_eq!(told.body["do"], "unknown", "B: {}", told.body);
    // B looks the key up downstream: A has not sent yet.
    let b_report = report(Some("agent-3:b:ask:1"), "not-sent").await;
    let again = ask("agent-3:b:ask:1").await;
    assert_ne!(
        again.body["do"], "go",
        "B told go under the fence A was told go under, A never told otherwise: two sends \
         (B's not-sent report was answered {} {})",
        b_report.status, b_report.body
    );
    assert_eq!(
        (b_report.status, b_report.body["type"].clone()),
        (
            StatusCode::CONFLICT,
            json!("https://idem.dev/problems/attempt-in-flight")
        ),
        "{}",
        b_report.body
    );
    assert!(b_report.problem);
    let keyless = report(None, "not-sent").await;
    assert_eq!(keyless.status, StatusCode::CONFLICT, "{}", keyless.body);
    assert_eq!(
        ask("agent-3:a:ask:1").await.body["do"],
        "go",
        "refused reports changed nothing: A's replay is still its go"
    );
    // A itself may give its go back; then the next ask, and it alone, goes.
    let freed = report(Some("agent-3:a:ask:1"), "not-sent").await;
    assert_eq!(
        (freed.status, freed.body["do"].clone()),
        (StatusCode::OK, json!("ask")),
        "{}",
        freed.body
    );
    assert_eq!(ask("agent-3:b:ask:1").await.body["do"], "go");
    assert_eq!(ask("agent-3:a:ask:1").await.body["do"], "unknown");
    // A done is taken from any ask of the claim.
    let done = report(Some("agent-3:a:ask:1"), "done").await;
    assert_eq!(done.body["do"], "done", "{}", done.body);
}

#[tokio::test]
async fn a_go_is_not_taken_back_by_another_ask_of_its_claim_on_sqlite() {
    let (app, _dir) = on_sqlite("tasks-http-taken-back").await;
    a_go_is_not_taken_back_by_another_ask_of_its_claim(app).await;
}

#[tokio::test]
async fn a_go_is_not_taken_back_by_another_ask_of_its_claim_on_postgres() {
    let (app, _db) = on_postgres("idem_tasks_http_taken_back").await;
    a_go_is_not_taken_back_by_another_ask_of_its_claim(app).await;
}
