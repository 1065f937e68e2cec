//! Outbox → relay → Tansu → consumer → inbox, on both backends.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use idem_core::outbox::{MessageId, OutboxRecord, Topic};
use idem_core::position::PositionStore;
use idem_kafka::KafkaPublisher;
use idem_outbox::Publisher;
use idem_sql::dialect::{Stmt, read_rows};
use idem_sql::{Dialect, SqlStore, row};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::support::*;

/// Publishes the first `n` outbox messages again, as a relay that lost its
/// delivery reports would: same ids, new records.
async fn republish<D: Dialect>(store: &SqlStore<D>, topics: &Topics, n: usize) {
    let s = Stmt::new(
        "SELECT id, message_id, topic, message_key, payload FROM idem_outbox ORDER BY id",
    );
    let rows = read_rows(store.dialect(), s, |r| {
        Ok((
            row::int(r, "id")?,
            row::get::<String, _>(r, "message_id")?,
            row::get::<String, _>(r, "topic")?,
            row::get::<String, _>(r, "message_key")?,
            row::get::<Vec<u8>, _>(r, "payload")?,
        ))
    })
    .await
    .unwrap();
    let publisher = KafkaPublisher::new(&topics.kafka).unwrap();
    for (id, message_id, topic, key, payload) in rows.into_iter().take(n) {
        let record = OutboxRecord {
            id,
            message_id: MessageId::new(message_id).unwrap(),
            topic: Topic::new(topic).unwrap(),
            key,
            payload,
            headers: Vec::new(),
            attempts: 0,
            created_at_ms: 0,
        };
        publisher.publish(&record).await.unwrap();
    }
}

async fn exactly_once<D: Dialect>(store: SqlStore<D>) {
    let topics = Topics::create(3).await;
    write(&store, &payments(&topics, 5, 30)).await;
    assert_eq!(relay(&store, &topics.kafka).await, 30);
    republish(&store, &topics, 5).await;
    let mut consumer = topics.consumer(&store).await;
    drain(&mut consumer, &store, 30, 45).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while consumer.stats().duplicates.load(Ordering::SeqCst) < 5 {
        assert!(
            Instant::now() < deadline,
            "the 5 duplicates were not all seen"
        );
        consumer.run_once().await.unwrap();
    }
    let entries = ledger(&store).await;
    assert_once_in_order(&entries, 30);
    // 35 records settled; each partition's stored offset is its last.
    let positions = store.positions(&topics.group, &topics.topic).await.unwrap();
    let settled: i64 = positions.iter().map(|(_, o)| o + 1).sum();
    assert_eq!(settled, 35, "positions {positions:?}");
    println!(
        "exactly once: 30 payments + 5 republished → {} ledger rows, {} duplicates, positions {positions:?}",
        entries.len(),
        consumer.stats().duplicates.load(Ordering::SeqCst)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_on_sqlite() {
    let (store, _dir) = sqlite().await;
    exactly_once(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_on_postgres() {
    let (store, _db) = postgres().await;
    exactly_once(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_produced_twice_with_one_id_header_is_applied_once() {
    let (store, _dir) = sqlite().await;
    let topics = Topics::create(1).await;
    let producer: FutureProducer = topics.kafka.client_config().create().unwrap();
    let send = |payload: &'static str, id: Option<&'static str>| {
        let mut record = FutureRecord::<str, str>::to(&topics.topic)
            .key("acct0")
            .payload(payload);
        if let Some(id) = id {
            record = record.headers(OwnedHeaders::new().insert(Header {
                key: idem_kafka::MESSAGE_ID,
                value: Some(id),
            }));
        }
        let producer = producer.clone();
        async move {
            producer
                .send(record, Duration::from_secs(10))
                .await
                .unwrap()
        }
    };
    send("acct0-1", Some("pay-1")).await;
    send("acct0-1", Some("pay-1")).await;
    let third = send("acct0-2", None).await;
    let mut consumer = topics.consumer(&store).await;
    drain(&mut consumer, &store, 2, 30).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while consumer.stats().duplicates.load(Ordering::SeqCst) < 1 {
        assert!(Instant::now() < deadline, "the duplicate was not seen");
        consumer.run_once().await.unwrap();
    }
    let ids: BTreeSet<String> = ledger(&store)
        .await
        .into_iter()
        .map(|e| e.message_id)
        .collect();
    let place = format!("{}/{}/{}", topics.topic, third.partition, third.offset);
    assert_eq!(ids, BTreeSet::from(["pay-1".to_owned(), place]));
    assert_eq!(ledger(&store).await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_record_holds_its_partition_and_nothing_is_skipped() {
    let (store, _dir) = sqlite().await;
    let topics = Topics::create(1).await;
    let messages: Vec<_> = (0..10)
        .map(|i| {
            let payload = if i == 3 {
                format!("fail-once-acct0-{i}")
            } else {
                format!("acct0-{i}")
            };
            topics.message("acct0", &payload)
        })
        .collect();
    write(&store, &messages).await;
    assert_eq!(relay(&store, &topics.kafka).await, 10);
    let mut consumer = topics.consumer(&store).await;
    drain(&mut consumer, &store, 10, 30).await;
    let entries = ledger(&store).await;
    assert_once_in_order(&entries, 10);
    assert_eq!(consumer.stats().retried.load(Ordering::SeqCst), 1);
    let positions = store.positions(&topics.group, &topics.topic).await.unwrap();
    assert_eq!(positions, vec![(0, 9)]);
}

/// Produces one record twice with one `Idem-Message-Id`, from Python's
/// `confluent-kafka` (its own librdkafka, a real third-party producer).
const PYTHON_PRODUCER: &str = r#"
import sys
from confluent_kafka import Producer
p = Producer({"bootstrap.servers": sys.argv[1], "linger.ms": 0, "batch.num.messages": 1})
errors = []
def done(err, msg):
    if err is not None:
        errors.append(str(err))
for _ in range(2):
    p.produce(sys.argv[2], key=b"acct0", value=b"acct0-1",
              headers=[("Idem-Message-Id", b"py-1")], on_delivery=done)
    if p.flush(10) != 0:
        errors.append("not delivered in 10 s")
if errors:
    sys.exit("; ".join(errors))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_confluent_kafka_record_produced_twice_with_one_id_is_applied_once() {
    let (store, _dir) = sqlite().await;
    let topics = Topics::create(1).await;
    let bootstrap = idem_kafka::bootstrap_servers(&idem_testkit::kafka_url()).unwrap();
    let out = std::process::Command::new(idem_testkit::python())
        .args(["-c", PYTHON_PRODUCER, &bootstrap, &topics.topic])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python producer: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut consumer = topics.consumer(&store).await;
    drain(&mut consumer, &store, 1, 30).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while consumer.stats().duplicates.load(Ordering::SeqCst) < 1 {
        assert!(Instant::now() < deadline, "the second copy was not seen");
        consumer.run_once().await.unwrap();
    }
    let entries = ledger(&store).await;
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].message_id, "py-1");
    assert_eq!(entries[0].key, "acct0");
}

/// A producer that batches (`linger.ms=200`: the 50 records travel in one
/// produce request) and a consumer whose stored position is in the middle
/// of that batch: it resumes exactly after the stored offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_resumes_in_the_middle_of_a_batching_producers_batch() {
    use idem_core::KeyStore;
    use idem_core::position::Position;
    let (store, _dir) = sqlite().await;
    let topics = Topics::create(1).await;
    let mut config = topics.kafka.client_config().clone();
    config
        .set("linger.ms", "200")
        .set("enable.idempotence", "true");
    let producer: FutureProducer = config.create().unwrap();
    // Queued in order without waiting, delivered together.
    let mut pending = Vec::new();
    for i in 0..50 {
        let payload = format!("acct0-{i}");
        let record = FutureRecord::<str, str>::to(&topics.topic)
            .key("acct0")
            .payload(&payload);
        pending.push(producer.send_result(record).map_err(|(e, _)| e).unwrap());
    }
    let mut offsets = Vec::new();
    for delivery in pending {
        offsets.push(delivery.await.unwrap().map_err(|(e, _)| e).unwrap().offset);
    }
    assert_eq!(offsets, (0..50).collect::<Vec<i64>>());
    // As if a consumer had applied offsets 0 to 9 and stopped.
    let mut tx = store.begin().await.unwrap();
    let position = Position {
        group: topics.group.clone(),
        topic: topics.topic.clone(),
        partition: 0,
        offset: 9,
    };
    store.save_position(&mut tx, &position).await.unwrap();
    store.commit(tx).await.unwrap();
    let mut consumer = topics.consumer(&store).await;
    drain(&mut consumer, &store, 40, 30).await;
    let entries = ledger(&store).await;
    assert_eq!(
        entries[0].payload, "acct0-10",
        "resumed after the stored offset"
    );
    assert_once_in_order(&entries, 40);
    assert_eq!(
        store.positions(&topics.group, &topics.topic).await.unwrap(),
        vec![(0, 49)]
    );
}

/// Reads every record of `topic` (one partition) from its beginning.
async fn read_all(topics: &Topics, topic: &str, n: usize) -> Vec<rdkafka::message::OwnedMessage> {
    use rdkafka::consumer::{Consumer, StreamConsumer};
    let mut config = topics.kafka.client_config().clone();
    config
        .set("group.id", format!("{}-reader", topics.group))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false");
    let reader: StreamConsumer = config.create().unwrap();
    reader.subscribe(&[topic]).unwrap();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while out.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        let m = tokio::time::timeout(left, reader.recv())
            .await
            .expect("dead letters not read in 20 s")
            .unwrap();
        out.push(m.detach());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_and_failing_records_are_dead_lettered_and_their_offsets_stored() {
    use rdkafka::message::Headers;
    let (store, _dir) = sqlite().await;
    let topics = Topics::create(1).await;
    let producer: FutureProducer = topics.kafka.client_config().create().unwrap();
    // An id header that is not an id (a space is not visible ASCII).
    let bad = FutureRecord::<str, str>::to(&topics.topic)
        .key("acct0")
        .payload("acct0-0")
        .headers(OwnedHeaders::new().insert(Header {
            key: idem_kafka::MESSAGE_ID,
            value: Some("not an id"),
        }));
    producer.send(bad, Duration::from_secs(10)).await.unwrap();
    write(
        &store,
        &[
            topics.message("acct0", "acct0-1"),
            topics.message("acct0", "acct0-2"),
        ],
    )
    .await;
    assert_eq!(relay(&store, &topics.kafka).await, 2);
    let mut consumer = topics.consumer(&store).await;
    drain(&mut consumer, &store, 2, 30).await;
    assert_eq!(consumer.stats().dead_lettered.load(Ordering::SeqCst), 1);
    let dead = read_all(&topics, &topics.dead, 1).await;
    let headers = rdkafka::Message::headers(&dead[0]).unwrap();
    let header = |name: &str| {
        headers
            .iter()
            .find(|h| h.key == name)
            .and_then(|h| h.value)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    };
    let reason = header(idem_kafka::DEAD_REASON).unwrap();
    assert!(reason.starts_with("undecodable message"), "{reason}");
    assert_eq!(
        header(idem_kafka::ORIGINAL_POSITION).as_deref(),
        Some(format!("{}/0/0", topics.topic).as_str())
    );
    let payloads: Vec<String> = ledger(&store)
        .await
        .into_iter()
        .map(|e| e.payload)
        .collect();
    assert_eq!(payloads, ["acct0-1", "acct0-2"]);
    assert_eq!(
        store.positions(&topics.group, &topics.topic).await.unwrap(),
        vec![(0, 2)],
        "the dead letter's offset is stored too"
    );
}

/// Reads `n` records of a topic from its beginning with Python's
/// `confluent-kafka` and prints each one's `Idem-Message-Id` and key.
const PYTHON_CONSUMER: &str = r#"
import sys, time
from confluent_kafka import Consumer
c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2] + "-py",
              "auto.offset.reset": "earliest", "enable.auto.commit": False})
c.subscribe([sys.argv[2]])
n, seen, end = int(sys.argv[3]), 0, time.time() + 20
while seen < n and time.time() < end:
    m = c.poll(0.5)
    if m is None or m.error():
        continue
    ids = [v.decode() for k, v in (m.headers() or []) if k == "Idem-Message-Id"]
    print(ids[0] if len(ids) == 1 else "?", m.key().decode())
    seen += 1
c.close()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_confluent_kafka_consumer_sees_each_relayed_event_under_its_outbox_id() {
    let (store, _dir) = sqlite().await;
    let topics = Topics::create(1).await;
    let messages = payments(&topics, 2, 4);
    write(&store, &messages).await;
    assert_eq!(relay(&store, &topics.kafka).await, 4);
    let bootstrap = idem_kafka::bootstrap_servers(&idem_testkit::kafka_url()).unwrap();
    let out = std::process::Command::new(idem_testkit::python())
        .args(["-c", PYTHON_CONSUMER, &bootstrap, &topics.topic, "4"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python consumer: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    let expected: Vec<String> = messages
        .iter()
        .map(|m| format!("{} {}", m.message_id.as_str(), m.key))
        .collect();
    assert_eq!(seen, expected);
}
