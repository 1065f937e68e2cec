//! The demo's messaging on Kafka: one topic for the payment events (every
//! event of a payment under its id, so one partition keeps their order), a
//! dead-letter topic, and the ledger's consumer group whose offsets live in
//! the database with the effects.

use std::time::Duration;

use idem_core::inbox::InboxStore;
use idem_kafka::{Kafka, KafkaPublisher, KafkaSource, SourceConfig};
use tokio::sync::watch;

use super::{SUBSCRIBER, until_ready, without_credentials};

/// The topic payment events are published to (`payments.created`,
/// `payments.refunded`, …: all of them, keyed by payment).
pub const TOPIC: &str = "idem.payments";
/// Its partitions, when Idem creates it.
pub const PARTITIONS: i32 = 6;
/// The ledger's dead letters.
pub const DLQ_TOPIC: &str = "idem.dlq.demo-ledger";

/// Connects to the cluster of `url` and makes sure both topics exist,
/// retrying until they do or `shutdown` (`Ok(None)`).
pub async fn connect(url: &str, shutdown: watch::Receiver<bool>) -> anyhow::Result<Option<Kafka>> {
    let shown = without_credentials(url);
    let kafka = idem_kafka::connect(url)
        .map_err(|e| anyhow::anyhow!("invalid Kafka settings ({shown}): {e}"))?;
    let prepared = until_ready("Kafka", &shown, shutdown, || async {
        kafka.ready(Duration::from_secs(5)).await?;
        kafka
            .ensure_topic(TOPIC, PARTITIONS, Duration::from_secs(10))
            .await?;
        kafka
            .ensure_topic(DLQ_TOPIC, 1, Duration::from_secs(10))
            .await
    })
    .await;
    Ok(prepared.map(|_| kafka))
}

/// The relay's publisher: every outbox topic to [`TOPIC`].
pub fn publisher(kafka: &Kafka) -> anyhow::Result<KafkaPublisher> {
    Ok(KafkaPublisher::new(kafka)?.map_topics(|_| TOPIC.to_owned()))
}

/// The ledger's source: the consumer group `demo-ledger` on [`TOPIC`], its
/// positions read from and written to `store`.
pub async fn source<S: InboxStore>(kafka: &Kafka, store: S) -> anyhow::Result<KafkaSource<S>> {
    let config = SourceConfig::new(SUBSCRIBER, TOPIC, DLQ_TOPIC);
    Ok(KafkaSource::new(kafka, store, config).await?)
}
