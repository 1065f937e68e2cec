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

/// `idem mail-sink` (its body read timeout shorter than the workers' send
/// margin), answering.
async fn mail_sink() -> (Proc, SocketAddr) {
    let sink_addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let sink = Proc::spawn(
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
    (sink, sink_addr)
}

/// Task `key` in queue `notify` of the agents' tenant: its id.
async fn task(server: SocketAddr, key: &str) -> String {
    let made = as_agents(
        server,
        "POST",
        "/v1/queues/notify/tasks",
        Some(key),
        &json!({"payload": {"item": "x", "version": 1}}).to_string(),
    )
    .await;
    assert_eq!(made.status, 201, "{}", String::from_utf8_lossy(&made.body));
    made.json()["id"].as_str().unwrap().to_owned()
}

/// `agent.py work --worker agent-3 --mode verify` against `idem` and `sink`.
fn work(idem: SocketAddr, sink: SocketAddr, lease: &str) -> Vec<String> {
    [
        "work",
        "--idem",
        &format!("http://{idem}"),
        "--queue",
        "notify",
        "--sink",
        &format!("http://{sink}"),
        "--mode",
        "verify",
        "--worker",
        "agent-3",
        "--lease",
        lease,
        "--send-margin",
        "1500ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Task `id` once it is done (within `within`), else as it is then.
async fn settled(server: SocketAddr, id: &str, within: Duration) -> serde_json::Value {
    let started = Instant::now();
    loop {
        let shown = as_agents(server, "GET", &format!("/v1/tasks/{id}"), None, "").await;
        let task = shown.json();
        if task["state"] == "done" || started.elapsed() > within {
            return task;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn restarted_agent_sends_once(url: &str) {
    let server = Server::start(url, &[]).await;
    let (_sink, sink_addr) = mail_sink().await;
    let proxy = idem_testkit::Proxy::start(sink_addr).await;
    // The message's last bytes (its body ends with the payload's JSON, then
    // the string's and the object's ends): delivered, then silence.
    proxy.freeze_after_next(br#"}"}"#);

    let key = "item:x:v1";
    let id = task(server.addr, key).await;
    let dir = TempDir::new("agent-restart");
    let mut agent = Agent::spawn(&dir, "agent-3", work(server.addr, proxy.addr, "10s"));

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

    let state = settled(server.addr, &id, Duration::from_secs(40)).await["state"].clone();
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

/// The agent's claim reaches `idem serve`, the network goes silent for 2 s
/// of the 3 s lease and the connection is cut, the answer lost; the agent
/// retries the claim under its key and is answered the first claim again,
/// its lease mostly spent. Told `go`, it must not send with less than its
/// `--send-margin` (1.5 s) left — it takes the lease left from the ask's
/// answer, not from when its retry started — so the task is done under a
/// later claim, with one message.
async fn a_late_answer_leaves_no_lease_to_send(url: &str) {
    let server = Server::start(url, &[]).await;
    let (_sink, sink_addr) = mail_sink().await;
    let proxy = idem_testkit::Proxy::start(server.addr).await;
    // The claim reaches the server whole (its body ends so: the head may
    // come in a read of its own); then the network is silent.
    proxy.freeze_after_next(br#""max": 1}"#);
    let key = "item:late:v1";
    let id = task(server.addr, key).await;
    let dir = TempDir::new("agent-late");
    let agent = Agent::spawn(&dir, "agent-3", work(proxy.addr, sink_addr, "3s"));
    let started = Instant::now();
    loop {
        let shown = as_agents(server.addr, "GET", &format!("/v1/tasks/{id}"), None, "").await;
        if shown.json()["state"] == "claimed" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "never claimed: {}",
            agent.output()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Claimed; 2 s of the lease's 3 later the connection is cut (the
    // answer lost) and the network is back: the agent's retry is answered.
    let claimed = Instant::now();
    tokio::time::sleep(Duration::from_secs(2).saturating_sub(claimed.elapsed())).await;
    proxy.cut().await;
    proxy.restore();

    let done = settled(server.addr, &id, Duration::from_secs(30)).await;
    let messages = sink_messages(sink_addr).await;
    let copies = messages.get(key).map_or(0, Vec::len);
    println!(
        "late claim answer: task {} at fence {}, {copies} message(s)\n{}",
        done["state"],
        done["fence"],
        agent.output()
    );
    assert_eq!(done["state"], "done", "{done}");
    assert_eq!(copies, 1, "{messages:?}");
    assert!(
        done["fence"].as_i64().unwrap() > 1,
        "the claim answered with under 1 s of its lease left sent nothing: {done}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_answer_leaves_no_lease_to_send_on_sqlite() {
    let dir = TempDir::new("agent-late-db");
    a_late_answer_leaves_no_lease_to_send(&dir.sqlite_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_answer_leaves_no_lease_to_send_on_postgres() {
    let db = PgDatabase::create("idem_agent_late").await;
    a_late_answer_leaves_no_lease_to_send(&db.url).await;
}
