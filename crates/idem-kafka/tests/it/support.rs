//! Shared pieces of the Kafka tests: topics of their own on the suite's
//! Tansu, the two backends through one generic store, a ledger handler.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use idem_core::inbox::Subscriber;
use idem_core::outbox::{OutboxMessage, Topic};
use idem_core::{Backoff, KeyStore};
use idem_inbox::{Consumer, ConsumerConfig, Inbox};
use idem_kafka::{Kafka, KafkaPublisher, KafkaSource, SourceConfig};
use idem_outbox::{Dispatcher, DispatcherConfig, Outbox};
use idem_sql::dialect::{On, Stmt, read_rows};
use idem_sql::{Dialect, SqlStore, row};

pub fn kafka() -> Kafka {
    idem_kafka::connect(&idem_testkit::kafka_url()).unwrap()
}

/// A topic, its dead-letter topic and a group of this test's own.
pub struct Topics {
    pub kafka: Kafka,
    pub topic: String,
    pub dead: String,
    pub group: String,
}

impl Topics {
    pub async fn create(partitions: i32) -> Self {
        Self::create_on(kafka(), partitions).await
    }

    /// On a broker of the test's own.
    pub async fn create_on(kafka: Kafka, partitions: i32) -> Self {
        let name = idem_testkit::unique_name("t");
        let (topic, dead) = (format!("{name}.events"), format!("{name}.dead"));
        let t = Duration::from_secs(10);
        assert!(kafka.ensure_topic(&topic, partitions, t).await.unwrap());
        assert!(!kafka.ensure_topic(&topic, partitions, t).await.unwrap());
        kafka.ensure_topic(&dead, 1, t).await.unwrap();
        Self {
            kafka,
            topic,
            dead,
            group: format!("{name}-ledger"),
        }
    }

    pub fn clone_topics(&self) -> Self {
        Self {
            kafka: self.kafka.clone(),
            topic: self.topic.clone(),
            dead: self.dead.clone(),
            group: self.group.clone(),
        }
    }

    pub fn message(&self, key: &str, payload: &str) -> OutboxMessage {
        let topic = Topic::new(self.topic.clone()).unwrap();
        OutboxMessage::new(topic, key, payload.as_bytes().to_vec()).unwrap()
    }

    pub fn source_config(&self) -> SourceConfig {
        let mut c = SourceConfig::new(&self.group, &self.topic, &self.dead);
        c.session_timeout = Duration::from_secs(6);
        c
    }

    pub async fn consumer<D: Dialect>(
        &self,
        store: &SqlStore<D>,
    ) -> Consumer<KafkaSource<SqlStore<D>>, SqlStore<D>, Ledger<D>> {
        self.consumer_with(store, consumer_config()).await
    }

    pub async fn consumer_with<D: Dialect>(
        &self,
        store: &SqlStore<D>,
        config: ConsumerConfig,
    ) -> Consumer<KafkaSource<SqlStore<D>>, SqlStore<D>, Ledger<D>> {
        let source = KafkaSource::new(&self.kafka, store.clone(), self.source_config())
            .await
            .unwrap();
        Consumer::new(
            source,
            Inbox::new(store.clone()),
            Subscriber::new("ledger").unwrap(),
            Ledger::default(),
            config,
        )
        .unwrap()
    }
}

pub fn consumer_config() -> ConsumerConfig {
    ConsumerConfig {
        batch_size: 16,
        fetch_wait: Duration::from_millis(200),
        max_deliver: 3,
        nak_backoff: Backoff {
            initial: Duration::from_millis(50),
            max: Duration::from_millis(200),
        },
        handler_timeout: Duration::from_secs(5),
    }
}

pub async fn sqlite() -> (SqlStore<idem_sqlite::SqliteDialect>, idem_testkit::TempDir) {
    let dir = idem_testkit::TempDir::new("kafka-it");
    let store = idem_sqlite::SqliteStore::connect(&dir.sqlite_url(), Default::default())
        .await
        .unwrap();
    setup(&store).await;
    (store, dir)
}

pub async fn postgres() -> (SqlStore<idem_postgres::PgDialect>, idem_testkit::PgDatabase) {
    let db = idem_testkit::PgDatabase::create("idem_kafka").await;
    let store = idem_postgres::PgStore::connect(&db.url, Default::default())
        .await
        .unwrap();
    setup(&store).await;
    (store, db)
}

/// Migrated, with the ledger table.
pub async fn setup<D: Dialect>(store: &SqlStore<D>) {
    store.migrate().await.unwrap();
    let seq = D::FAMILY.pick("INTEGER PRIMARY KEY AUTOINCREMENT", "BIGSERIAL PRIMARY KEY");
    let create = format!(
        "CREATE TABLE IF NOT EXISTS ledger (seq {seq}, message_id TEXT NOT NULL, \
         msg_key TEXT NOT NULL, payload TEXT NOT NULL)"
    );
    D::execute_raw(On::Pool(store.pool()), &create)
        .await
        .unwrap();
}

pub use crate::ledger::Ledger;

/// A ledger row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub message_id: String,
    pub key: String,
    pub payload: String,
}

/// The ledger, in the order rows were written.
pub async fn ledger<D: Dialect>(store: &SqlStore<D>) -> Vec<Entry> {
    let sql = "SELECT message_id, msg_key, payload FROM ledger ORDER BY seq";
    read_rows(store.dialect(), Stmt::new(sql), |r| {
        Ok(Entry {
            message_id: row::get(r, "message_id")?,
            key: row::get(r, "msg_key")?,
            payload: row::get(r, "payload")?,
        })
    })
    .await
    .unwrap()
}

/// Writes `messages` to the outbox in one transaction.
pub async fn write<D: Dialect>(store: &SqlStore<D>, messages: &[OutboxMessage]) {
    let outbox = Outbox::new(store.clone());
    let mut tx = store.begin().await.unwrap();
    for m in messages {
        outbox.enqueue(&mut tx, m).await.unwrap();
    }
    store.commit(tx).await.unwrap();
}

/// Relays the outbox to Kafka until nothing is left; how many were sent.
pub async fn relay<D: Dialect>(store: &SqlStore<D>, kafka: &Kafka) -> usize {
    let relay = Dispatcher::new(
        store.clone(),
        KafkaPublisher::new(kafka).unwrap(),
        DispatcherConfig::default(),
    )
    .unwrap();
    let mut sent = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = relay.run_once().await.unwrap();
        sent += r.sent;
        if r.claimed == 0 {
            return sent;
        }
        assert!(
            Instant::now() < deadline,
            "the relay did not finish in 30 s"
        );
    }
}

/// Runs `consumer` until the ledger holds `n` rows (within `secs`).
pub async fn drain<D: Dialect>(
    consumer: &mut Consumer<KafkaSource<SqlStore<D>>, SqlStore<D>, Ledger<D>>,
    store: &SqlStore<D>,
    n: usize,
    secs: u64,
) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while ledger(store).await.len() < n {
        assert!(
            Instant::now() < deadline,
            "{} of {n} applied after {secs} s",
            ledger(store).await.len()
        );
        consumer.run_once().await.unwrap();
    }
}

/// Checks exactly-once and per-key order: every payload once, and each
/// key's payloads (`<key>-<n>`) in increasing `n`.
pub fn assert_once_in_order(entries: &[Entry], expected: usize) {
    let mut by_payload: BTreeMap<&str, usize> = BTreeMap::new();
    for e in entries {
        *by_payload.entry(e.payload.as_str()).or_default() += 1;
    }
    let twice: Vec<_> = by_payload.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "applied twice: {twice:?}");
    assert_eq!(entries.len(), expected, "applied: {by_payload:?}");
    let mut last: BTreeMap<&str, u64> = BTreeMap::new();
    for e in entries {
        let Some((_, n)) = e.payload.rsplit_once('-') else {
            continue;
        };
        let Ok(n) = n.parse::<u64>() else { continue };
        if let Some(prev) = last.insert(e.key.as_str(), n) {
            assert!(prev < n, "key {} out of order: {prev} then {n}", e.key);
        }
    }
}

/// `n` messages over `keys` keys: payload `<key>-<i>`.
pub fn payments(topics: &Topics, keys: usize, n: usize) -> Vec<OutboxMessage> {
    (0..n)
        .map(|i| {
            let key = format!("acct{}", i % keys);
            topics.message(&key, &format!("{key}-{i}"))
        })
        .collect()
}
