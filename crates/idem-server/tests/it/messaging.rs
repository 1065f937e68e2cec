//! Messaging drills with real processes (`idem serve`, `idem relay`,
//! `idem consume`), a real NATS server of the test's own, and real databases.

use std::time::Duration;

use async_nats::jetstream::consumer::pull;
use idem_testkit::{NatsServer, PgDatabase, TempDir};
use serde_json::Value;

use crate::process::{Proc, Server};
use crate::{PAY, call, create};

/// A database and a NATS server for one drill.
pub struct Rig {
    pub db_url: String,
    pub nats: NatsServer,
    _sqlite: Option<TempDir>,
    _pg: Option<PgDatabase>,
}

impl Rig {
    pub async fn sqlite() -> Self {
        let dir = TempDir::new("msg");
        Self {
            db_url: dir.sqlite_url(),
            nats: NatsServer::start(),
            _sqlite: Some(dir),
            _pg: None,
        }
    }

    pub async fn postgres() -> Self {
        let db = PgDatabase::create("idem_msg").await;
        Self {
            db_url: db.url.clone(),
            nats: NatsServer::start(),
            _sqlite: None,
            _pg: Some(db),
        }
    }

    fn args(&self, command: &str, extra: &[&str]) -> Vec<String> {
        let mut v: Vec<String> = [
            command,
            "--database-url",
            &self.db_url,
            "--nats-url",
            &self.nats.url(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    }

    pub fn relay_args(&self) -> Vec<String> {
        self.args("relay", &["--lease", "2s"])
    }

    pub fn consumer_args(&self) -> Vec<String> {
        self.args("consume", &["--ack-wait", "2s"])
    }

    pub fn relay(&self, failpoints: Option<&str>) -> Proc {
        Proc::spawn(&self.relay_args(), failpoints)
    }

    pub fn consumer(&self, failpoints: Option<&str>) -> Proc {
        Proc::spawn(&self.consumer_args(), failpoints)
    }

    pub async fn js(&self) -> async_nats::jetstream::Context {
        idem_nats::connect(&self.nats.url(), "drill", false)
            .await
            .unwrap()
    }

    /// The outbox figures, from `idem stats`.
    pub fn outbox(&self) -> Value {
        outbox_of(&self.db_url)
    }
}

/// The outbox figures of the database at `db_url`, from `idem stats`.
pub fn outbox_of(db_url: &str) -> Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["stats", "--database-url", db_url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The ledger consumer's state on the broker: (acks pending, messages not yet
/// delivered, deliveries beyond the first: consumer sequence minus stream
/// sequence of the last delivery).
pub async fn consumer_state(js: &async_nats::jetstream::Context) -> Option<(usize, u64, u64)> {
    let stream = js.get_stream(idem_server::messaging::STREAM).await.ok()?;
    let mut c = stream
        .get_consumer::<pull::Config>(idem_server::messaging::SUBSCRIBER)
        .await
        .ok()?;
    let info = c.info().await.ok()?;
    let redeliveries = info
        .delivered
        .consumer_sequence
        .saturating_sub(info.delivered.stream_sequence);
    Some((info.num_ack_pending, info.num_pending, redeliveries))
}

pub async fn stream_messages(js: &async_nats::jetstream::Context) -> u64 {
    let stream = js.get_stream(idem_server::messaging::STREAM).await.unwrap();
    stream.get_info().await.unwrap().state.messages
}

/// Publishes every message in the stream again under a new broker id: the
/// duplicates an operator's replay makes, which only the inbox can catch.
pub async fn replay_stream(
    js: &async_nats::jetstream::Context,
    only: impl Fn(u64) -> bool,
) -> usize {
    let stream = js.get_stream(idem_server::messaging::STREAM).await.unwrap();
    let state = stream.get_info().await.unwrap().state;
    let mut n = 0;
    for seq in state.first_sequence..=state.last_sequence {
        if !only(seq) {
            continue;
        }
        let m = stream.get_raw_message(seq).await.unwrap();
        let mut headers = async_nats::HeaderMap::new();
        for (name, values) in m.headers.iter() {
            if !name.to_string().eq_ignore_ascii_case("Nats-Msg-Id") {
                for v in values {
                    headers.append(name.to_string().as_str(), v.as_str());
                }
            }
        }
        let msg = async_nats::jetstream::message::PublishMessage::build()
            .payload(m.payload.clone())
            .headers(headers)
            .message_id(format!("replay-{seq}"));
        js.send_publish(m.subject.to_string(), msg)
            .await
            .unwrap()
            .await
            .unwrap();
        n += 1;
    }
    n
}

/// Every message in the stream as (sequence, message id, key, subject), in
/// stream order.
pub async fn stream_events(
    js: &async_nats::jetstream::Context,
) -> Vec<(u64, String, String, String)> {
    let stream = js.get_stream(idem_server::messaging::STREAM).await.unwrap();
    let state = stream.get_info().await.unwrap().state;
    let mut out = Vec::new();
    for seq in state.first_sequence..=state.last_sequence {
        let Ok(m) = stream.get_raw_message(seq).await else {
            continue;
        };
        let header = |n: &str| {
            m.headers
                .get(n)
                .map(|v| v.as_str().to_owned())
                .unwrap_or_default()
        };
        out.push((
            seq,
            header("Idem-Message-Id"),
            header("Idem-Message-Key"),
            m.subject.to_string(),
        ));
    }
    out
}

pub async fn effects(addr: std::net::SocketAddr, payment: &str) -> (i64, i64) {
    let r = call(
        addr,
        "GET",
        &format!("/v1/payments/{payment}/effects"),
        None,
        "",
    )
    .await;
    assert_eq!(r.status, 200);
    let v = r.json();
    (
        v["ledger_entries"].as_i64().unwrap(),
        v["notifications"].as_i64().unwrap(),
    )
}

/// Polls `check` every 50 ms until it holds, for at most `max`.
pub async fn eventually<F, Fut>(max: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + max;
    while tokio::time::Instant::now() < deadline {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("not within {max:?}: {what}");
}

/// Drill 4: the consumer commits its effect and is killed before it acks.
/// The redelivery finds the inbox record and has no effect.
async fn drill4(rig: Rig) {
    let api = Server::start(&rig.db_url, &["--nats-url", &rig.nats.url()]).await;
    let mut consumer = rig.consumer(Some("consume.after_commit"));
    let created = create(api.addr, "d4-1", PAY).await;
    assert_eq!(created.status, 201);
    let id = created.json()["id"].as_str().unwrap().to_owned();
    assert!(
        consumer.exited_within(Duration::from_secs(20)).await,
        "the consumer aborted at its failpoint, after the commit and before the ack"
    );
    assert_eq!(
        effects(api.addr, &id).await,
        (1, 1),
        "the effect committed before the crash"
    );
    let js = rig.js().await;
    assert_eq!(
        consumer_state(&js).await.unwrap().0,
        1,
        "the event was not acked"
    );
    let _consumer = rig.consumer(None);
    eventually(
        Duration::from_secs(20),
        "the redelivery is acked",
        || async { matches!(consumer_state(&js).await, Some((0, 0, r)) if r >= 1) },
    )
    .await;
    assert_eq!(
        effects(api.addr, &id).await,
        (1, 1),
        "the redelivery had no effect"
    );
    let deliveries = 1 + consumer_state(&js).await.map_or(0, |s| s.2);
    println!(
        "drill4: consumer aborted after commit, before ack; deliveries={deliveries} ledger_entries=1 notifications=1"
    );
}

/// Drill 6: the relay is killed after the broker acknowledged a batch but
/// before it marked it sent, so it publishes the batch again; then every event
/// is replayed once more under new broker ids. Each payment's effects happen
/// once.
async fn drill6(rig: Rig) {
    let api = Server::start(&rig.db_url, &["--events"]).await;
    let _consumer = rig.consumer(None);
    let mut relay = rig.relay(Some("relay.after_publish"));
    let mut ids = Vec::new();
    for i in 0..5 {
        let body = format!(
            r#"{{"amount":{},"currency":"EUR","customer":"cus_d6"}}"#,
            100 + i
        );
        let r = create(api.addr, &format!("d6-{i}"), &body).await;
        assert_eq!(r.status, 201);
        ids.push(r.json()["id"].as_str().unwrap().to_owned());
    }
    assert!(
        relay.exited_within(Duration::from_secs(20)).await,
        "the relay aborted at its failpoint, after the broker's ack"
    );
    let js = rig.js().await;
    let published_before = stream_messages(&js).await;
    assert!(published_before >= 1, "the broker has the batch");
    assert_eq!(rig.outbox()["pending"], 5, "but nothing was marked sent");
    let _relay = rig.relay(None);
    eventually(Duration::from_secs(20), "the outbox drains", || async {
        rig.outbox()["pending"] == 0
    })
    .await;
    assert_eq!(
        stream_messages(&js).await,
        5,
        "the broker dropped the republished batch by id"
    );
    assert_eq!(replay_stream(&js, |_| true).await, 5);
    assert_eq!(
        stream_messages(&js).await,
        10,
        "forced duplicates are in the stream"
    );
    eventually(
        Duration::from_secs(30),
        "every delivery is acked",
        || async { matches!(consumer_state(&js).await, Some((0, 0, _))) },
    )
    .await;
    for id in &ids {
        assert_eq!(
            effects(api.addr, id).await,
            (1, 1),
            "payment {id}: one ledger entry, one receipt"
        );
    }
    println!(
        "drill6: relay aborted after the broker acked {published_before} of 5; republished after the lease, \
         deduplicated by the broker; 5 forced duplicates; every payment ledger_entries=1 notifications=1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drill4_consumer_killed_after_commit_before_ack_on_sqlite() {
    drill4(Rig::sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drill4_consumer_killed_after_commit_before_ack_on_postgres() {
    drill4(Rig::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drill6_relay_killed_after_ack_and_events_replayed_on_sqlite() {
    drill6(Rig::sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drill6_relay_killed_after_ack_and_events_replayed_on_postgres() {
    drill6(Rig::postgres().await).await;
}
