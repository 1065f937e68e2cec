//! What operators see of a client's JSON keeps every digit: a task's
//! payload and result through `idem serve`'s admin API (`/admin/v1/tasks`,
//! a list and one task) and `idem tasks list|show`, real processes on a
//! real SQLite file and a real PostgreSQL.

use std::collections::HashMap;
use std::net::SocketAddr;

use idem_testkit::{PgDatabase, TempDir};
use serde_json::value::RawValue;

use crate::process::Server;
use crate::{Reply, call, exchange, idem_cli};

const TOKEN: &str = "3f9a6c2e8b1d4f7a0c5e9b2d6f8a1c4e";
const PAYLOAD: &str =
    r#"{"a":123456789012345678901234567890,"b":0.1000000000000000000000000000000001}"#;
const RESULT: &str = r#"{"total":98765432109876543210987654321,"ratio":0.30000000000000001}"#;

/// The raw JSON text at `path` (object keys, array indices) of `text`.
fn raw(text: &str, path: &[&str]) -> String {
    let mut text = text.to_owned();
    for step in path {
        let next: Box<RawValue> = match step.parse::<usize>() {
            Ok(i) => serde_json::from_str::<Vec<Box<RawValue>>>(&text)
                .unwrap_or_else(|e| panic!("{text}: {e}"))
                .swap_remove(i),
            Err(_) => serde_json::from_str::<HashMap<String, Box<RawValue>>>(&text)
                .unwrap_or_else(|e| panic!("{text}: {e}"))
                .remove(*step)
                .unwrap_or_else(|| panic!("no {step} in {text}")),
        };
        text = next.get().to_owned();
    }
    text
}

fn text(r: &Reply) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

async fn admin_get(addr: SocketAddr, path: &str) -> Reply {
    exchange(
        addr,
        &format!(
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
             Authorization: Bearer {TOKEN}\r\n\r\n"
        ),
    )
    .await
}

async fn operators_see_every_digit(url: &str) {
    let server = Server::start(url, &["--admin-token", TOKEN]).await;
    let a = server.addr;
    let made = call(
        a,
        "POST",
        "/v1/queues/big/tasks",
        Some("big:1"),
        &format!(r#"{{"payload":{PAYLOAD}}}"#),
    )
    .await;
    assert_eq!(made.status, 201, "{}", text(&made));
    let id = made.json()["id"].as_str().unwrap().to_owned();
    let claim = call(
        a,
        "POST",
        "/v1/queues/big/claims",
        Some("w:claim:1"),
        r#"{"worker":"w","lease":"30s"}"#,
    )
    .await;
    let fence = claim.json()["tasks"][0]["fence"].as_i64().unwrap();
    let done = call(
        a,
        "POST",
        &format!("/v1/tasks/{id}/complete"),
        None,
        &format!(r#"{{"fence":{fence},"result":{RESULT}}}"#),
    )
    .await;
    assert_eq!(done.status, 200, "{}", text(&done));

    let listed = admin_get(a, "/admin/v1/tasks?queue=big").await;
    assert_eq!(listed.status, 200, "{}", text(&listed));
    let listed = text(&listed);
    assert_eq!(
        raw(&listed, &["items", "0", "payload"]),
        PAYLOAD,
        "admin list"
    );
    assert_eq!(
        raw(&listed, &["items", "0", "result"]),
        RESULT,
        "admin list"
    );
    let shown = admin_get(a, &format!("/admin/v1/tasks/{id}")).await;
    assert_eq!(shown.status, 200, "{}", text(&shown));
    let shown = text(&shown);
    assert_eq!(raw(&shown, &["payload"]), PAYLOAD, "admin task");
    assert_eq!(raw(&shown, &["result"]), RESULT, "admin task");
    assert_eq!(raw(&shown, &["tenant"]), r#""default""#, "{shown}");

    let cli = |args: &[&str]| {
        let out = idem_cli(args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let line = cli(&["tasks", "list", "--database-url", url, "--queue", "big"]);
    assert_eq!(raw(line.trim(), &["payload"]), PAYLOAD, "idem tasks list");
    assert_eq!(raw(line.trim(), &["result"]), RESULT, "idem tasks list");
    let shown = cli(&["tasks", "show", "--database-url", url, &id]);
    assert_eq!(raw(&shown, &["payload"]), PAYLOAD, "idem tasks show");
    assert_eq!(raw(&shown, &["result"]), RESULT, "idem tasks show");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_see_every_digit_on_sqlite() {
    let dir = TempDir::new("numbers");
    operators_see_every_digit(&dir.sqlite_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_see_every_digit_on_postgres() {
    let db = PgDatabase::create("idem_numbers_proc").await;
    operators_see_every_digit(&db.url).await;
}
