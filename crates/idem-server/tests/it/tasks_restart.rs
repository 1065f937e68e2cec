//! Issue 36, finding 1: the Python reference agent
//! (`examples/polling-agent/agent.py work --worker agent-3 --mode verify`)
//! killed with `kill -9` after the mail relay recorded its message and
//! before it reported, then started again at once under the same
//! `--worker` (what a process manager's `Restart=always` does), against a
//! real `idem serve` and `idem mail-sink` (which does not deduplicate).
//!
//! The agent's send reaches the relay through a TCP proxy that lets the
//! message through whole and then goes silent: the relay has the message,
//! the agent waits for the relay's answer and has reported nothing — the
//! moment it is killed. The proxy is thawed and the agent restarted with the
//! same command line. Checked: the task is done and the relay holds one
//! message for its key.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use idem_testkit::{PgDatabase, TempDir};
use serde_json::json;

use crate::process::{Proc, Server, free_port};
use crate::tasks_history::{Agent, sink_messages};
use crate::{call, exchange};

const TENANT: &str = "agents";

/// A request as the agents' tenant.
async fn as_agents(
    addr: SocketAddr,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: &str,
) -> crate::Reply {
    let key = key
        .map(|k| format!("Idempotency-Key: {k}\r\n"))
        .unwrap_or_default();
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Content-Type: application/json\r\nX-Tenant-Id: {TENANT}\r\n{key}\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    exchange(addr, &raw).await
}

async fn restarted_agent_sends_once(url: &str) {
    let server = Server::start(url, &[]).await;
    let sink_addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let _sink = Proc::spawn(
        &[
            "mail-sink".into(),
            "--listen".into(),
            sink_addr.to_string(),
            "--body-read-timeout".into(),
            "1s".into(),
        ],
        None,
    );
    for _ in 0..200 {
        if crate::try_call(sink_addr, "GET", "/messages", None, "")
            .await
            .is_ok()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let proxy = idem_testkit::Proxy::start(sink_addr).await;
    // The message's last bytes (its body ends with the payload's JSON, then
    // the string's and the object's ends): delivered, then silence.
    proxy.freeze_after_next(br#"}"}"#);

    let key = "item:x:v1";
    let made = as_agents(
        server.addr,
        "POST",
        "/v1/queues/notify/tasks",
        Some(key),
        &json!({"payload": {"item": "x", "version": 1}}).to_string(),
    )
    .await;
    assert_eq!(made.status, 201, "{}", String::from_utf8_lossy(&made.body));
    let id = made.json()["id"].as_str().unwrap().to_owned();

    let dir = TempDir::new("agent-restart");
    let args: Vec<String> = [
        "work",
        "--idem",
        &format!("http://{}", server.addr),
        "--queue",
        "notify",
        "--sink",
        &format!("http://{}", proxy.addr),
        "--mode",
        "verify",
        "--worker",
        "agent-3",
        "--lease",
        "10s",
        "--send-margin",
        "1500ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut agent = Agent::spawn(&dir, "agent-3", args);

    // The relay records the message; its answer never reaches the agent.
    let started = Instant::now();
    loop {
        if !sink_messages(sink_addr).await.is_empty() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the agent never sent: {}",
            agent.output()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let before = agent.output();
    assert!(
        before.contains("claimed") && !before.contains("reported"),
        "killed after sending and before reporting: {before}"
    );
    // kill -9, and at once the same command line again.
    proxy.thaw();
    agent.restart(&dir, "agent-3");

    let path = format!("/v1/tasks/{id}");
    let mut state = String::new();
    while started.elapsed() < Duration::from_secs(40) {
        let shown = as_agents(server.addr, "GET", &path, None, "").await;
        state = shown.json()["state"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if state == "done" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let messages = sink_messages(sink_addr).await;
    let copies = messages.get(key).map_or(0, Vec::len);
    println!(
        "restarted agent: task {state}, {copies} message(s) at the relay for {key} \
         ({:.1} s)\n{}",
        started.elapsed().as_secs_f64(),
        agent.output()
    );
    assert_eq!(copies, 1, "one message per key at the relay: {messages:?}");
    assert_eq!(state, "done", "the restarted agent finished the task");
    let all = call(sink_addr, "GET", "/messages", None, "").await;
    assert_eq!(all.json()["accepted"], 1, "nothing else was sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_sends_once_on_sqlite() {
    let dir = TempDir::new("agent-restart-db");
    restarted_agent_sends_once(&dir.sqlite_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_sends_once_on_postgres() {
    let db = PgDatabase::create("idem_agent_restart").await;
    restarted_agent_sends_once(&db.url).await;
}
