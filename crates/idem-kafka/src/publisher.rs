//! The relay's side: outbox messages to Kafka with the idempotent producer.

use std::sync::Arc;
use std::time::Duration;

use idem_core::outbox::OutboxRecord;
use idem_outbox::{PublishError, Published, Publisher};
use rdkafka::error::KafkaError as RdError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;

use crate::{Kafka, KafkaError, MESSAGE_ID, MESSAGE_KEY, MESSAGE_SUBJECT, kafka_err};

type TopicMap = Arc<dyn Fn(&str) -> String + Send + Sync>;

/// Publishes outbox messages to Kafka and waits for each delivery report.
#[derive(Clone)]
pub struct KafkaPublisher {
    producer: FutureProducer,
    topics: Option<TopicMap>,
    timeout: Duration,
}

impl std::fmt::Debug for KafkaPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaPublisher")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl KafkaPublisher {
    /// How long a publish waits for its delivery report by default (the
    /// producer's `message.timeout.ms`): past it the publish is
    /// `Unavailable` and the message stays in the outbox.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

    /// An idempotent producer on `kafka`: `enable.idempotence=true`,
    /// `acks=all`, librdkafka's batching otherwise (the dispatcher publishes
    /// a claimed batch concurrently, so records of one partition travel
    /// together). Brokers must let a consumer seek into the middle of such a
    /// batch (a consumer of Idem resumes at a stored offset + 1, which may
    /// be anywhere): Apache Kafka does, and Tansu does with its SQLite
    /// storage but not its memory storage (docs/development.md, "Kafka
    /// test broker: Tansu"); for such a broker send one record per request
    /// with [`KafkaPublisher::with`] and `[("linger.ms", "0"),
    /// ("batch.num.messages", "1")]`.
    pub fn new(kafka: &Kafka) -> Result<Self, KafkaError> {
        Self::with(kafka, &[])
    }

    /// As [`KafkaPublisher::new`], with librdkafka producer properties set
    /// over the defaults (those that make the producer idempotent excepted:
    /// `enable.idempotence` and `acks` stay).
    pub fn with(kafka: &Kafka, properties: &[(&str, &str)]) -> Result<Self, KafkaError> {
        let mut config = kafka.config.clone();
        let timeout = Self::DEFAULT_TIMEOUT.as_millis().to_string();
        config.set("message.timeout.ms", &timeout);
        for (k, v) in properties {
            config.set(*k, *v);
        }
        config.set("enable.idempotence", "true").set("acks", "all");
        let producer: FutureProducer = config.create().map_err(kafka_err)?;
        Ok(Self {
            producer,
            topics: None,
            timeout: Self::DEFAULT_TIMEOUT,
        })
    }

    /// Publishes an outbox topic `t` to the Kafka topic `map(t)` (by
    /// default the outbox topic itself: its characters, `[A-Za-z0-9._-]`,
    /// are valid in a Kafka topic).
    pub fn map_topics(mut self, map: impl Fn(&str) -> String + Send + Sync + 'static) -> Self {
        self.topics = Some(Arc::new(map));
        self
    }
}

/// A failed produce: the record's fault (`Rejected`, an attempt) or the
/// broker's and the network's (`Unavailable`, none).
fn classify(e: RdError) -> PublishError {
    use RDKafkaErrorCode as C;
    let code = e.rdkafka_error_code();
    let rejected = matches!(
        code,
        Some(
            C::MessageSizeTooLarge
                | C::InvalidMessageSize
                | C::InvalidMessage
                | C::InvalidTopic
                | C::InvalidRecord
                | C::InvalidArgument
                | C::UnsupportedForMessageFormat
        )
    );
    if rejected {
        PublishError::Rejected {
            reason: e.to_string(),
        }
    } else {
        PublishError::Unavailable { source: e.into() }
    }
}

impl Publisher for KafkaPublisher {
    async fn publish(&self, record: &OutboxRecord) -> Result<Published, PublishError> {
        let topic = match &self.topics {
            Some(map) => map(record.topic.as_str()),
            None => record.topic.as_str().to_owned(),
        };
        let mut headers = OwnedHeaders::new_with_capacity(record.headers.len() + 3);
        for (name, value) in &record.headers {
            headers = headers.insert(Header {
                key: name.as_str(),
                value: Some(value.as_str()),
            });
        }
        headers = headers
            .insert(Header {
                key: MESSAGE_ID,
                value: Some(record.message_id.as_str()),
            })
            .insert(Header {
                key: MESSAGE_KEY,
                value: Some(record.key.as_str()),
            })
            .insert(Header {
                key: MESSAGE_SUBJECT,
                value: Some(record.topic.as_str()),
            });
        let message = FutureRecord::to(&topic)
            .key(record.key.as_str())
            .payload(&record.payload)
            .headers(headers);
        // The local queue's wait; the delivery report comes within
        // `message.timeout.ms` after it.
        match self.producer.send(message, self.timeout).await {
            Ok(delivery) => Ok(Published {
                duplicate: false,
                sequence: u64::try_from(delivery.offset).ok(),
            }),
            Err((e, _)) => Err(classify(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_classified() {
        let rejected = classify(RdError::MessageProduction(
            RDKafkaErrorCode::MessageSizeTooLarge,
        ));
        assert!(matches!(rejected, PublishError::Rejected { .. }));
        for code in [
            RDKafkaErrorCode::MessageTimedOut,
            RDKafkaErrorCode::BrokerTransportFailure,
            RDKafkaErrorCode::NotEnoughReplicas,
            RDKafkaErrorCode::UnknownTopicOrPartition,
        ] {
            assert!(
                classify(RdError::MessageProduction(code)).retryable(),
                "{code:?}"
            );
        }
    }
}
