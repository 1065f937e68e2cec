//! Kafka: one topic for the events (every event of a key under that key, so
//! one partition keeps their order), a consumer's dead-letter topic, and
//! its consumer group whose offsets live in the database with the effects.

use std::time::Duration;

use idem_core::inbox::InboxStore;
use idem_kafka::{Kafka, KafkaPublisher, KafkaSource, SourceConfig};
use tokio::sync::watch;

use crate::{ConsumeConfig, Routes, until_ready, without_credentials};

/// Connects to the cluster of `url` and makes sure the events topic (and a
/// consumer's dead-letter topic) exists, retrying until it does or
/// `shutdown` (`Ok(None)`).
pub(crate) async fn connect(
    url: &str,
    routes: &Routes,
    consumer: Option<&ConsumeConfig>,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<Option<Kafka>> {
    let shown = without_credentials(url);
    let kafka = idem_kafka::connect(url)
        .map_err(|e| anyhow::anyhow!("invalid Kafka settings ({shown}): {e}"))?;
    let dead_letters = consumer.map(ConsumeConfig::dead_letters);
    let prepared = until_ready("Kafka", &shown, shutdown, || async {
        kafka.ready(Duration::from_secs(5)).await?;
        let (topic, partitions) = (&routes.kafka_topic, routes.kafka_partitions);
        kafka
            .ensure_topic(topic, partitions, Duration::from_secs(10))
            .await?;
        match &dead_letters {
            Some(dlq) => kafka.ensure_topic(dlq, 1, Duration::from_secs(10)).await,
            None => Ok(false),
        }
    })
    .await;
    Ok(prepared.map(|_| kafka))
}

/// The relay's publisher: every outbox topic to the routes' topic.
pub(crate) fn publisher(kafka: &Kafka, routes: &Routes) -> anyhow::Result<KafkaPublisher> {
    let topic = routes.kafka_topic.clone();
    Ok(KafkaPublisher::new(kafka)?.map_topics(move |_| topic.clone()))
}

/// The consumer's source: its consumer group on the routes' topic, its
/// positions read from and written to `store`.
pub(crate) async fn source<S: InboxStore>(
    kafka: &Kafka,
    store: S,
    routes: &Routes,
    config: &ConsumeConfig,
) -> anyhow::Result<KafkaSource<S>> {
    let dlq = config.dead_letters();
    let config = SourceConfig::new(&config.name, &routes.kafka_topic, &dlq);
    Ok(KafkaSource::new(kafka, store, config).await?)
}
