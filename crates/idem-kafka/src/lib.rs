//! # Idem on Kafka
//!
//! - [`KafkaPublisher`] implements [`idem_outbox::Publisher`] with
//!   librdkafka's idempotent producer (`enable.idempotence=true`,
//!   `acks=all`): the record's key is the outbox message's ordering key (so
//!   a key's messages stay in one partition, in order), its topic the outbox
//!   topic (or what [`KafkaPublisher::map_topics`] makes of it), and its
//!   headers `Idem-Message-Id` (the outbox message id), `Idem-Message-Key`
//!   and the message's own. A publish returns only after the broker's
//!   delivery report; an unreachable broker or a timeout is
//!   [`PublishError::Unavailable`](idem_outbox::PublishError) (no attempt
//!   counted), a record the broker refuses (too large, an invalid topic) is
//!   `Rejected`.
//! - [`KafkaSource`] implements [`idem_inbox::MessageSource`] for one topic
//!   in a consumer group. **Its offsets live in Idem's database**, in
//!   `idem_positions`, written in the same transaction as each record's
//!   effects (the generic [`idem_inbox::Consumer`] does that through
//!   [`Delivery::position`](idem_inbox::Delivery::position)). On start and on
//!   every partition assignment it seeks each partition to the stored offset
//!   \+ 1; Kafka's own committed offsets are not used (`enable.auto.commit`
//!   is off and nothing is committed to Kafka).
//! - [`connect`] reads a `kafka://host:port[,host:port]` URL;
//!   [`Kafka::ready`] asks the cluster for its metadata within a timeout,
//!   [`Kafka::ensure_topic`] creates a topic that is missing.
//!
//! ## Message ids
//! A record's inbox id is its `Idem-Message-Id` header, else
//! `<topic>/<partition>/<offset>`. A record produced twice with one id
//! header is applied once; two records without the header are two
//! messages (their offsets differ).
//!
//! ## Deliveries
//! Kafka does not count deliveries. [`InboxMessage::delivered`](idem_inbox::InboxMessage)
//! is counted by the source, in this process: 1, plus the times this
//! process was told to retry this record (a nak). After a restart or a
//! rebalance the count starts at 1 again, so a record whose retries keep
//! crashing the process is retried without a bound; one that fails
//! without a crash is dead-lettered after the consumer's `max_deliver`.
//!
//! ## Retries keep the order
//! A retry (nak) of record N of a partition pauses the partition, and after
//! the delay seeks it back to N: the rest of that partition in the fetched
//! batch is left unsettled by the consumer and delivered again after N.
//! Dead letters are produced to [`SourceConfig::dead_letter_topic`] with
//! the reason in `Idem-Dead-Reason`; then the stored offset moves past them.
//!
//! ```no_run
//! # async fn wire(store: idem_postgres::PgStore) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use idem_kafka::{KafkaPublisher, KafkaSource, SourceConfig};
//! use idem_outbox::{Dispatcher, DispatcherConfig};
//!
//! let kafka = idem_kafka::connect("kafka://127.0.0.1:9092")?;
//! kafka.ready(Duration::from_secs(5)).await?;
//! kafka.ensure_topic("orders.shipped", 3, Duration::from_secs(10)).await?;
//! // The relay: outbox → Kafka.
//! let relay = Dispatcher::new(store.clone(), KafkaPublisher::new(&kafka)?, DispatcherConfig::default())?;
//! tokio::spawn(async move { relay.run(idem_outbox::Polling, std::future::pending()).await });
//! // A consumer's source, its offsets in `store`; give it to `idem_inbox::Consumer`.
//! let _source = KafkaSource::new(&kafka, store, SourceConfig::new("billing", "orders.shipped", "dlq.billing")).await?;
//! # Ok(()) }
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::BoxError;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;

mod publisher;
mod source;

pub use publisher::KafkaPublisher;
pub use rdkafka;
pub use source::{KafkaDelivery, KafkaSource, SourceConfig};

/// Header with the producer's message id.
pub const MESSAGE_ID: &str = "Idem-Message-Id";
/// Header with the producer's ordering key.
pub const MESSAGE_KEY: &str = "Idem-Message-Key";
/// The headers [`KafkaPublisher`] sets on every record itself: an outbox
/// message bound for Kafka may not carry them (build its headers with
/// [`OutboxMessage::header_except`](idem_core::outbox::OutboxMessage::header_except)).
pub const RESERVED_HEADERS: &[&str] = &[MESSAGE_ID, MESSAGE_KEY, MESSAGE_SUBJECT];
/// Header with the outbox topic a record was written under, before
/// [`KafkaPublisher::map_topics`] put it on a Kafka topic: consumers see it
/// as the message's subject (several event types on one topic keep their
/// names).
pub const MESSAGE_SUBJECT: &str = "Idem-Message-Subject";
/// Header with the reason a record was dead-lettered.
pub const DEAD_REASON: &str = "Idem-Dead-Reason";
/// Header with `<topic>/<partition>/<offset>` of a dead-lettered record.
pub const ORIGINAL_POSITION: &str = "Idem-Original-Position";

/// A Kafka failure.
#[derive(Debug, thiserror::Error)]
#[error("kafka: {0}")]
pub struct KafkaError(#[source] pub BoxError);

fn kafka_err(e: impl Into<BoxError>) -> KafkaError {
    KafkaError(e.into())
}

/// A cluster to talk to: its bootstrap servers and client settings.
#[derive(Clone)]
pub struct Kafka {
    config: ClientConfig,
    /// The client [`Kafka::ready`] asks, made on its first call and kept
    /// while it answers (shared by clones; [`Kafka::set`] drops it).
    probe: Arc<Mutex<Option<Arc<BaseConsumer>>>>,
}

impl std::fmt::Debug for Kafka {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The settings may hold credentials (sasl.password).
        f.debug_struct("Kafka").finish_non_exhaustive()
    }
}

/// The cluster of a `kafka://host:port[,host:port]` URL (the scheme on the
/// first server, optional on the others). The error never repeats the
/// URL's text (it may hold a password): credentials belong in
/// [`Kafka::set`] (`sasl.username`, `sasl.password`), not in the URL.
pub fn connect(url: &str) -> Result<Kafka, KafkaError> {
    let servers = bootstrap_servers(url)?;
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", servers)
        .set("socket.timeout.ms", "10000");
    Ok(Kafka {
        config,
        probe: Arc::default(),
    })
}

/// The `bootstrap.servers` of a `kafka://` URL, each server checked: a
/// host and a port, nothing else.
pub fn bootstrap_servers(url: &str) -> Result<String, KafkaError> {
    let Some(rest) = url.trim().strip_prefix("kafka://") else {
        return Err(kafka_err("the Kafka URL does not start with kafka://"));
    };
    if rest.trim().trim_end_matches('/').is_empty() {
        return Err(kafka_err("the Kafka URL names no server"));
    }
    let mut servers = Vec::new();
    for (i, server) in rest.split(',').map(str::trim).enumerate() {
        let n = i + 1;
        let server = server.strip_prefix("kafka://").unwrap_or(server);
        let server = server.strip_suffix('/').unwrap_or(server);
        if server.is_empty() {
            return Err(kafka_err(
                "an empty server in the Kafka URL (two commas, or one at an end)",
            ));
        }
        if server.contains('@') {
            return Err(kafka_err(format!(
                "server {n} of the Kafka URL has credentials; set sasl.username and \
                 sasl.password instead"
            )));
        }
        let Some((host, port)) = server.rsplit_once(':') else {
            return Err(kafka_err(format!(
                "server {n} of the Kafka URL has no port"
            )));
        };
        // A name or IPv4 address, or an IPv6 address in brackets.
        let host_ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
            None => {
                host.bytes().any(|b| b.is_ascii_alphanumeric())
                    && host
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-'))
            }
        };
        if !host_ok || port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(kafka_err(format!(
                "server {n} of the Kafka URL is not host:port"
            )));
        }
        servers.push(server);
    }
    Ok(servers.join(","))
}

impl Kafka {
    /// Sets a librdkafka property on every client made from this cluster
    /// (`security.protocol`, `sasl.*`, …).
    pub fn set(&mut self, key: &str, value: &str) -> &mut Self {
        self.config.set(key, value);
        self.probe = Arc::default();
        self
    }

    /// The client settings (bootstrap servers and [`Kafka::set`] ones).
    pub fn client_config(&self) -> &ClientConfig {
        &self.config
    }

    /// Whether the cluster answers a metadata request within `timeout`,
    /// asked on one client kept between calls (a new one after a failure).
    pub async fn ready(&self, timeout: Duration) -> Result<(), KafkaError> {
        let consumer = {
            let mut probe = self.probe.lock().unwrap_or_else(|p| p.into_inner());
            match probe.as_ref() {
                Some(c) => c.clone(),
                None => {
                    let c: Arc<BaseConsumer> = Arc::new(self.config.create().map_err(kafka_err)?);
                    *probe = Some(c.clone());
                    c
                }
            }
        };
        let asked = tokio::task::spawn_blocking(move || {
            consumer
                .fetch_metadata(None, timeout)
                .map(|m| m.brokers().len())
        });
        let answer = match tokio::time::timeout(timeout + Duration::from_secs(1), asked).await {
            Ok(Ok(Ok(brokers))) if brokers > 0 => Ok(()),
            Ok(Ok(Ok(_))) => Err(kafka_err("the cluster's metadata names no broker")),
            Ok(Ok(Err(e))) => Err(kafka_err(e)),
            Ok(Err(e)) => Err(kafka_err(e)),
            Err(_) => Err(kafka_err(format!("no metadata within {timeout:?}"))),
        };
        if answer.is_err() {
            *self.probe.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
        answer
    }

    /// Creates `topic` with `partitions` and a replication factor of 1 (a
    /// single broker, development and tests; on a production cluster create
    /// topics with its own tools and the replication it needs); an existing
    /// topic is left as it is. Returns whether it was created.
    pub async fn ensure_topic(
        &self,
        topic: &str,
        partitions: i32,
        timeout: Duration,
    ) -> Result<bool, KafkaError> {
        let admin: AdminClient<DefaultClientContext> = self.config.create().map_err(kafka_err)?;
        let options = AdminOptions::new()
            .operation_timeout(Some(timeout))
            .request_timeout(Some(timeout));
        let replication = TopicReplication::Fixed(1);
        let new = NewTopic::new(topic, partitions, replication);
        let results = admin
            .create_topics([&new], &options)
            .await
            .map_err(kafka_err)?;
        match results.into_iter().next() {
            Some(Ok(_)) => Ok(true),
            Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) => Ok(false),
            Some(Err((_, code))) => Err(kafka_err(format!("creating topic {topic}: {code}"))),
            None => Err(kafka_err(format!("creating topic {topic}: no answer"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let ok = |u: &str| bootstrap_servers(u).map_err(|e| e.to_string());
        assert_eq!(
            ok("kafka://127.0.0.1:9092").as_deref(),
            Ok("127.0.0.1:9092")
        );
        assert_eq!(
            ok("kafka://a:1,kafka://b:2, c:3").as_deref(),
            Ok("a:1,b:2,c:3")
        );
        let bad = |u: &str| bootstrap_servers(u).err().map(|e| e.to_string());
        let secret = bad("kafka://user:hunter2@h:9092").unwrap_or_default();
        assert!(secret.contains("credentials"), "{secret}");
        assert!(!secret.contains("hunter2"), "{secret}");
        assert!(bad("nats://h:1").is_some());
        assert!(bad("kafka://h").is_some());
        assert!(bad("kafka://h:0").is_some());
        assert!(bad("kafka://h:1,").is_some());
        assert!(bad("kafka://h:99999").is_some());
        assert!(bad("kafka://[:9092").is_some());
        assert!(bad("kafka://::::9092").is_some());
        assert!(bad("kafka://..:9092").is_some());
        assert_eq!(ok("kafka://[::1]:9092").as_deref(), Ok("[::1]:9092"));
        assert_eq!(
            bad("kafka://").as_deref(),
            Some("kafka: the Kafka URL names no server")
        );
    }
}
