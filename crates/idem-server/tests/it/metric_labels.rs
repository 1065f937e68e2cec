//! Metric labels never take an unbounded value from a request (DESIGN 16),
//! through the real `idem serve` process on SQLite and PostgreSQL: claims
//! on request-chosen queue names that have no tasks leave no series and no
//! memory behind; a queue with tasks shows its series, and its gauges go
//! when its tasks do; past 500 queues the rest are counted under `(other)`.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::call;
use crate::checkout::ShopDb;
use crate::gateway_unknown::rss;
use crate::metrics::{Scraped, TOKEN, get_metrics, parse, scrape};
use crate::process::Server;

on_both! {
    a_queue_shows_its_series_while_it_has_tasks;
    queue_labels_stop_at_500_values;
}

/// One kept-alive HTTP/1.1 connection: requests one after another.
struct Conn(TcpStream);

impl Conn {
    async fn open(addr: SocketAddr) -> Self {
        Self(TcpStream::connect(addr).await.unwrap())
    }

    /// `POST path` with `key` and a JSON body; the status and the body.
    async fn post(&mut self, path: &str, key: &str, body: &str) -> (u16, Vec<u8>) {
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
             Idempotency-Key: {key}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        self.0.write_all(req.as_bytes()).await.unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            self.0.read_exact(&mut b).await.unwrap();
            head.push(b[0]);
        }
        let head = String::from_utf8(head).unwrap();
        let status = head[9..12].parse().unwrap();
        let len: usize = head
            .split("\r\n")
            .find_map(|l| {
                let (n, v) = l.split_once(':')?;
                n.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().unwrap())
            })
            .unwrap_or_else(|| panic!("no Content-Length: {head}"));
        let mut body = vec![0; len];
        self.0.read_exact(&mut body).await.unwrap();
        (status, body)
    }

    /// [`Conn::post`], retried with the same key on a new connection while
    /// the answer is `503` (a store busy under the test's load), as a
    /// client does; at most 20 tries.
    async fn answered(&mut self, path: &str, key: &str, body: &str) -> (u16, Vec<u8>) {
        for _ in 1..20 {
            let answer = self.post(path, key, body).await;
            if answer.0 != 503 {
                return answer;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            *self = Self::open(self.0.peer_addr().unwrap()).await;
        }
        self.post(path, key, body).await
    }
}

/// `n` claims, on `conns` kept-alive connections, each on the queue
/// `name(i)` gives with a key of its own; every one answered 200 (a `503`
/// of a busy store retried with the same key, as a client does).
async fn claims(addr: SocketAddr, n: usize, conns: usize, name: fn(usize) -> String) {
    let mut all = Vec::new();
    for c in 0..conns {
        all.push(tokio::spawn(async move {
            let mut conn = Conn::open(addr).await;
            for i in (c..n).step_by(conns) {
                let q = name(i);
                let (status, body) = conn
                    .answered(
                        &format!("/v1/queues/{q}/claims"),
                        &format!("claim-{q}-{i}"),
                        r#"{"worker":"agent-1","lease":"30s"}"#,
                    )
                    .await;
                assert_eq!(status, 200, "{q}: {}", String::from_utf8_lossy(&body));
            }
        }));
    }
    for t in all {
        t.await.unwrap();
    }
}

/// The samples whose name starts with `idem_tasks`: every series of the
/// task metrics (a histogram's buckets, sum and count each one).
fn task_series(m: &Scraped) -> usize {
    m.0.iter()
        .filter(|s| s.name.starts_with("idem_tasks"))
        .count()
}

/// The distinct values of the `queue` label on the samples of `name`.
fn queues(m: &Scraped, name: &str) -> std::collections::BTreeSet<String> {
    m.0.iter()
        .filter(|s| s.name == name)
        .filter_map(|s| s.labels.get("queue").cloned())
        .collect()
}

/// 20,000 claims, each on a queue name of its own with no task in it (no
/// authentication needed): no queue-labelled series, fewer than 1,000 task
/// series in all, `/metrics` stays small, and the process grows by less
/// than 40 MiB. Once, on PostgreSQL: what it measures is the process's
/// metrics, which no store changes (the gauges read from each store are
/// checked on both by the tests below), and 20,000 claims are a minute of
/// the suite's two cores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_on_request_chosen_queues_leave_no_series() {
    const N: usize = 20_000;
    let db = ShopDb::postgres().await;
    let mut server = Server::start(&db.url(), &["--admin-token", TOKEN]).await;
    let addr = server.addr;
    let pid = server.proc().pid();
    // Warm up (pools, allocator, the recorder) on one queue name.
    claims(addr, 400, 4, |_| "warm".to_owned()).await;
    let before = get_metrics(addr, Some(TOKEN)).await.body.len();
    let rss_before = rss(pid);

    claims(addr, N, 8, |i| format!("q-{i:05}")).await;

    let text = String::from_utf8(get_metrics(addr, Some(TOKEN)).await.body).unwrap();
    let m = Scraped(parse(&text));
    let rss_after = rss(pid);
    let grown = rss_after.saturating_sub(rss_before);
    let named: Vec<&String> =
        m.0.iter()
            .filter_map(|s| s.labels.get("queue"))
            .filter(|q| q.starts_with("q-"))
            .take(3)
            .collect();
    println!(
        "{N} claims on request-chosen queues: {} task series, /metrics {before} -> {} bytes, \
         RSS {} -> {} KiB (+{} KiB)",
        task_series(&m),
        text.len(),
        rss_before / 1024,
        rss_after / 1024,
        grown / 1024
    );
    assert!(
        named.is_empty(),
        "a claim on a queue without tasks left a queue-labelled series: {named:?}, …"
    );
    assert!(
        task_series(&m) < 1_000,
        "{} task series after {N} claims on request-chosen queue names",
        task_series(&m)
    );
    assert!(
        grown < 40 << 20,
        "RSS grew by {} KiB over {N} claims",
        grown / 1024
    );
}

/// A queue with tasks shows its gauges (every state) and counters; a claim
/// on a queue without tasks shows nothing; once the queue's tasks are gone
/// (the collector deleted them past their retention), its gauges are gone
/// too, not left at 0.
async fn a_queue_shows_its_series_while_it_has_tasks(db: ShopDb) {
    let server = Server::start(&db.url(), &["--admin-token", TOKEN]).await;
    let a = server.addr;
    let made = call(
        a,
        "POST",
        "/v1/queues/mail/tasks",
        Some("issue:1"),
        &json!({"payload": {"issue": 1}}).to_string(),
    )
    .await;
    assert_eq!(made.status, 201, "{}", String::from_utf8_lossy(&made.body));
    let id = made.json()["id"].as_str().unwrap().to_owned();
    let claim = |q: &'static str, key: &'static str| async move {
        call(
            a,
            "POST",
            &format!("/v1/queues/{q}/claims"),
            Some(key),
            r#"{"worker":"agent-1","lease":"30s"}"#,
        )
        .await
    };
    let c = claim("mail", "c-1").await;
    assert_eq!(c.status, 200);
    let fence = c.json()["tasks"][0]["fence"].as_i64().unwrap();
    let done = call(
        a,
        "POST",
        &format!("/v1/tasks/{id}/complete"),
        None,
        &json!({"fence": fence, "result": {}}).to_string(),
    )
    .await;
    assert_eq!(done.status, 200, "{}", String::from_utf8_lossy(&done.body));
    assert_eq!(claim("idle", "c-2").await.json()["tasks"], json!([]));

    let m = scrape(a).await;
    assert_eq!(
        m.get("idem_tasks", &[("queue", "mail"), ("state", "done")]),
        Some(1.0)
    );
    assert_eq!(
        m.get("idem_tasks", &[("queue", "mail"), ("state", "ready")]),
        Some(0.0),
        "a queue with tasks shows every state"
    );
    assert_eq!(m.count("idem_tasks_claimed_total", &[("queue", "mail")]), 1);
    assert_eq!(
        m.count(
            "idem_tasks_claim_latency_seconds_count",
            &[("queue", "mail")]
        ),
        1
    );
    assert!(
        m.0.iter()
            .all(|s| s.labels.get("queue").map(String::as_str) != Some("idle")),
        "a claim on a queue without tasks shows nothing"
    );

    // The collector deletes finished tasks past their retention (0 here).
    let purged = purge_finished_tasks(&db).await;
    assert_eq!(purged, 1, "the done task deleted");
    let m = scrape(a).await;
    let left: Vec<String> =
        m.0.iter()
            .filter(|s| s.name == "idem_tasks" && s.labels.contains_key("queue"))
            .map(|s| format!("{:?} {}", s.labels, s.value))
            .collect();
    assert!(
        left.is_empty(),
        "the queue's tasks are gone, its gauges too: {left:?}"
    );
}

/// Runs the collector once with a task retention of 0; the tasks deleted.
async fn purge_finished_tasks(db: &ShopDb) -> u64 {
    let config = idemkit::CollectorConfig {
        task_retention: Duration::ZERO,
        ..Default::default()
    };
    let collected = match db {
        ShopDb::Sqlite(_) => {
            let s = idem_sqlite::SqliteStore::connect(&db.url(), Default::default())
                .await
                .unwrap();
            idemkit::Collector::new(s, config)
                .unwrap()
                .collect_once()
                .await
        }
        ShopDb::Postgres(_) => {
            let s = idem_postgres::PgStore::connect(&db.url(), Default::default())
                .await
                .unwrap();
            idemkit::Collector::new(s, config)
                .unwrap()
                .collect_once()
                .await
        }
    };
    collected.unwrap().tasks
}

/// 510 queues with a task each, each task claimed: the `queue` label takes
/// at most 500 values, the rest counted under `(other)` (nothing lost from
/// the sums), and the overflow is counted.
async fn queue_labels_stop_at_500_values(db: ShopDb) {
    const Q: usize = 510;
    let server = Server::start(&db.url(), &["--admin-token", TOKEN]).await;
    let a = server.addr;
    let mut conn = Conn::open(a).await;
    for i in 0..Q {
        let (status, body) = conn
            .answered(
                &format!("/v1/queues/q-{i:03}/tasks"),
                &format!("t-{i}"),
                r#"{"payload":{}}"#,
            )
            .await;
        assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    }
    claims(a, Q, 4, |i| format!("q-{i:03}")).await;

    let m = scrape(a).await;
    for name in [
        "idem_tasks",
        "idem_tasks_claimed_total",
        "idem_tasks_claim_latency_seconds_count",
    ] {
        let values = queues(&m, name);
        assert!(values.len() <= 501, "{name}: {} queue values", values.len());
        assert!(values.contains("(other)"), "{name}: the rest under (other)");
    }
    assert_eq!(m.sum("idem_tasks_claimed_total", &[]), Q as u64);
    assert_eq!(
        m.sum("idem_tasks", &[("state", "claimed")]),
        Q as u64,
        "every claimed task counted once, under its queue or (other)"
    );
    assert!(
        m.count(
            "idem_metric_label_values_dropped_total",
            &[("label", "queue")]
        ) >= (Q - 500) as u64
    );
}
