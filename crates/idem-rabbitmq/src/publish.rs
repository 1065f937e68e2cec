//! The relay's side: outbox records to the exchange, with confirms.

use std::sync::Arc;

use idem_core::outbox::OutboxRecord;
use idem_outbox::{PublishError, Published, Publisher};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Confirmation, ErrorKind};

use crate::{IO_TIMEOUT, Link, MESSAGE_ID, MESSAGE_KEY};

/// Persistent delivery (AMQP `delivery_mode` 2): written to disk by the
/// queue before the confirm.
const PERSISTENT: u8 = 2;

/// Publishes outbox messages to a topic exchange, one confirm each.
#[derive(Debug, Clone)]
pub struct RabbitPublisher {
    link: Arc<Link>,
    exchange: String,
    /// Unroutable publishes: when the last was logged, and how many since
    /// (logged at most every 30 s: the relay retries them every round until
    /// a queue is bound).
    unroutable: Arc<std::sync::Mutex<(Option<std::time::Instant>, u64)>>,
}

impl RabbitPublisher {
    /// A publisher to `exchange` over `link` (whose topology should declare
    /// that exchange).
    pub fn new(link: Arc<Link>, exchange: &str) -> Self {
        Self {
            link,
            exchange: exchange.to_owned(),
            unroutable: Arc::default(),
        }
    }

    /// Its link (for readiness).
    pub fn link(&self) -> &Arc<Link> {
        &self.link
    }
}

fn unavailable(e: impl Into<idem_core::BoxError>) -> PublishError {
    PublishError::Unavailable { source: e.into() }
}

/// A refused publish: the broker closed the channel over this message
/// (too large, not allowed) — an attempt; anything else is the broker's
/// or the network's state.
fn classify(e: lapin::Error) -> PublishError {
    if let ErrorKind::ProtocolError(amqp) = e.kind()
        && matches!(
            amqp.kind(),
            AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED | AMQPSoftError::ACCESSREFUSED)
        )
    {
        return PublishError::Rejected {
            reason: e.to_string(),
        };
    }
    unavailable(e)
}

impl Publisher for RabbitPublisher {
    async fn publish(&self, record: &OutboxRecord) -> Result<Published, PublishError> {
        let channel = self.link.channel().await.map_err(unavailable)?;
        let mut headers = FieldTable::default();
        for (name, value) in &record.headers {
            headers.insert(
                name.as_str().into(),
                AMQPValue::LongString(value.as_str().into()),
            );
        }
        headers.insert(
            MESSAGE_ID.into(),
            AMQPValue::LongString(record.message_id.as_str().into()),
        );
        headers.insert(
            MESSAGE_KEY.into(),
            AMQPValue::LongString(record.key.as_str().into()),
        );
        let properties = BasicProperties::default()
            .with_delivery_mode(PERSISTENT)
            .with_message_id(record.message_id.as_str().into())
            .with_headers(headers);
        let publish = crate::publish_confirmed(
            &channel,
            &self.exchange,
            record.topic.as_str(),
            &record.payload,
            properties,
        );
        let publish = async { publish.await.map_err(classify) };
        let confirmation = match tokio::time::timeout(IO_TIMEOUT, publish).await {
            Ok(Ok(confirmation)) => confirmation,
            Ok(Err(e)) => {
                self.link.reset().await;
                return Err(e);
            }
            Err(_) => {
                self.link.reset().await;
                return Err(unavailable(format!("no confirm within {IO_TIMEOUT:?}")));
            }
        };
        match confirmation {
            Confirmation::Ack(None) => Ok(Published::default()),
            // Routed nowhere: kept in the outbox until a queue is bound.
            Confirmation::Ack(Some(returned)) => {
                let logged = {
                    let mut u = self.unroutable.lock().unwrap_or_else(|p| p.into_inner());
                    u.1 += 1;
                    let due =
                        u.0.is_none_or(|at| at.elapsed() >= std::time::Duration::from_secs(30));
                    due.then(|| {
                        u.0 = Some(std::time::Instant::now());
                        std::mem::take(&mut u.1)
                    })
                };
                if let Some(returns) = logged {
                    tracing::warn!(
                        exchange = %self.exchange,
                        routing_key = %record.topic,
                        reply = %returned.reply_text,
                        returns_since_last_said = returns,
                        "publish returned unroutable (no queue bound for its routing key); will retry"
                    );
                }
                Err(unavailable(format!(
                    "unroutable: no queue bound to exchange {} for routing key {}",
                    self.exchange, record.topic
                )))
            }
            Confirmation::Nack(_) => Err(unavailable("the broker nacked the publish")),
            Confirmation::NotRequested => Err(unavailable("the channel is not in confirm mode")),
        }
    }
}
