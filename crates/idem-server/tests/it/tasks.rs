//! Polling agents' tasks through `idem serve` and `idem tasks`, real
//! processes on a real SQLite file and a real PostgreSQL: a claim whose
//! holder stops is taken over after its lease (the database's clock), the
//! stopped holder's late writes are refused, an action of unknown outcome
//! in at-most-once mode parks the task, an operator resolves it with `idem
//! tasks resolve`, and the next worker is told the action was done.

use std::net::SocketAddr;
use std::time::Duration;

use idem_testkit::{PgDatabase, TempDir};
use serde_json::{Value, json};

use crate::process::Server;
use crate::{Reply, call, exchange, idem_cli};

const TOKEN: &str = "7a4c1e9b2d5f8a0c3e6b9d2f5a8c1e4b";

/// An admin request with the bearer token.
async fn admin(addr: SocketAddr, method: &str, path: &str, key: Option<&str>, body: &str) -> Reply {
    let key = key
        .map(|k| format!("Idempotency-Key: {k}\r\n"))
        .unwrap_or_default();
    exchange(
        addr,
        &format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
             Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n{key}\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
    .await
}

async fn post(addr: SocketAddr, path: &str, key: Option<&str>, body: Value) -> Reply {
    call(addr, "POST", path, key, &body.to_string()).await
}

async fn act(a: SocketAddr, id: &str, fence: i64) -> Reply {
    let path = format!("/v1/tasks/{id}/actions/notify");
    post(
        a,
        &path,
        None,
        json!({"fence": fence, "mode": "at-most-once"}),
    )
    .await
}

fn cli(args: &[&str]) -> (bool, String, String) {
    let out = idem_cli(args);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn tasks_survive_a_stopped_worker(url: &str) {
    let server = Server::start(url, &["--admin-token", TOKEN]).await;
    let a = server.addr;
    let made = post(
        a,
        "/v1/queues/mail/tasks",
        Some("issue:7:opened"),
        json!({"payload": {"issue": 7}}),
    )
    .await;
    assert_eq!(made.status, 201, "{}", String::from_utf8_lossy(&made.body));
    let id = made.json()["id"].as_str().unwrap().to_owned();

    // Worker 1 claims for a 1 s lease, is told to go, and "stops" before
    // reporting: its outcome is unknown.
    let claim = |key: &'static str, worker: &'static str| {
        post(
            a,
            "/v1/queues/mail/claims",
            Some(key),
            json!({"worker": worker, "lease": "1s"}),
        )
    };
    let c1 = claim("c-1", "agent-1").await;
    let f1 = c1.json()["tasks"][0]["fence"].as_i64().unwrap();
    assert_eq!(act(a, &id, f1).await.json()["do"], "go");
    assert_eq!(
        claim("c-2", "agent-2").await.json()["tasks"],
        json!([]),
        "the lease is live"
    );
    tokio::time::sleep(Duration::from_millis(1300)).await;

    // Worker 2 takes it over; the action's outcome is unknown: parked.
    let c3 = claim("c-3", "agent-2").await;
    let f2 = c3.json()["tasks"][0]["fence"].as_i64().unwrap();
    assert_eq!(f2, f1 + 1);
    let unknown = act(a, &id, f2).await;
    assert_eq!(unknown.json()["do"], "unknown");
    assert_eq!(unknown.json()["task"]["state"], "needs_attention");
    // Worker 1 wakes and reports: refused, nothing changes.
    let late = post(
        a,
        &format!("/v1/tasks/{id}/complete"),
        None,
        json!({"fence": f1, "result": {}}),
    )
    .await;
    assert_eq!(late.status, 409);
    assert_eq!(late.problem_type(), "https://idem.dev/problems/lease-lost");

    // The operator sees it (the admin API and the CLI), checks the mail
    // relay, resolves it as sent.
    let parked = admin(a, "GET", "/admin/v1/tasks?state=needs_attention", None, "").await;
    assert_eq!(parked.status, 200);
    assert_eq!(parked.json()["items"][0]["id"], id.as_str());
    let detail = admin(a, "GET", &format!("/admin/v1/tasks/{id}"), None, "").await;
    assert_eq!(detail.json()["timeline"].as_array().unwrap().len(), 6);
    let early = admin(
        a,
        "POST",
        &format!("/admin/v1/tasks/{id}/resolve"),
        Some("r-0"),
        r#"{"action":"notify","as":"maybe"}"#,
    )
    .await;
    assert_eq!(early.status, 400, "a bad resolution changes nothing");
    let not_dead = admin(
        a,
        "POST",
        &format!("/admin/v1/tasks/{id}/retry"),
        Some("r-1"),
        "{}",
    )
    .await;
    assert_eq!(
        not_dead.status, 200,
        "a task that needs attention may be retried too"
    );
    assert_eq!(not_dead.json()["state"], "ready");
    let again = admin(
        a,
        "POST",
        &format!("/admin/v1/tasks/{id}/retry"),
        Some("r-1"),
        "{}",
    )
    .await;
    assert!(
        again.replayed(),
        "an admin action's retry is replayed, not done twice"
    );
    // Parked again by the next claim's unknown action.
    let c = claim("c-2b", "agent-2").await;
    let fb = c.json()["tasks"][0]["fence"].as_i64().unwrap();
    assert_eq!(act(a, &id, fb).await.json()["do"], "unknown");
    let (ok, listed, _) = cli(&[
        "tasks",
        "list",
        "--database-url",
        url,
        "--state",
        "needs_attention",
    ]);
    assert!(ok && listed.contains(&id), "{listed}");
    let (ok, shown, err) = cli(&["tasks", "show", "--database-url", url, &id]);
    assert!(ok, "{err}");
    let shown: Value = serde_json::from_str(&shown).unwrap();
    let kinds: Vec<&str> = shown["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "created",
            "claimed",
            "action",
            "taken_over",
            "action",
            "needs_attention",
            "retried",
            "claimed",
            "action",
            "needs_attention"
        ]
    );
    let (ok, _, err) = cli(&[
        "tasks",
        "resolve",
        "--database-url",
        url,
        &id,
        "--action",
        "notify",
        "--as",
        "sent",
    ]);
    assert!(ok, "{err}");
    let (ok, _, err) = cli(&[
        "tasks",
        "resolve",
        "--database-url",
        url,
        &id,
        "--action",
        "notify",
        "--as",
        "sent",
    ]);
    assert!(
        !ok && err.contains("needs_attention") || err.contains("ready"),
        "resolved once: {err}"
    );
    let (ok, _, err) = cli(&["tasks", "retry", "--database-url", url, "tsk_nope"]);
    assert!(!ok && err.contains("task id must be"), "{err}");

    // The next worker is told it was done, and completes.
    let c4 = claim("c-4", "agent-3").await;
    let f3 = c4.json()["tasks"][0]["fence"].as_i64().unwrap();
    assert_eq!(act(a, &id, f3).await.json()["do"], "done");
    let done = post(
        a,
        &format!("/v1/tasks/{id}/complete"),
        None,
        json!({"fence": f3, "result": {"sent": 1}}),
    )
    .await;
    assert_eq!(
        (done.status, done.json()["state"].clone()),
        (200, json!("done"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_survive_a_stopped_worker_on_sqlite() {
    let dir = TempDir::new("tasks");
    tasks_survive_a_stopped_worker(&dir.sqlite_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_survive_a_stopped_worker_on_postgres() {
    let db = PgDatabase::create("idem_tasks_proc").await;
    tasks_survive_a_stopped_worker(&db.url).await;
}
