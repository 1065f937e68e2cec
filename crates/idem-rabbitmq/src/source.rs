//! The consumer's side: a quorum queue as an inbox message source.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::{FutureExt, StreamExt};
use idem_core::outbox::MessageId;
use idem_inbox::{Delivery, InboxMessage, MessageSource, SourceError};
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Confirmation};
use sha2::Digest;

use crate::{DEAD_REASON, IO_TIMEOUT, Link, MESSAGE_ID, MESSAGE_KEY, ORIGINAL_ROUTING_KEY};

/// Where the inbox id of a message that has neither an AMQP `message_id`
/// nor an `Idem-Message-Id` header comes from (a third-party publisher's).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum MissingId {
    /// Nowhere: the message is dead-lettered as undecodable (the default:
    /// nothing is applied under an id that was guessed).
    #[default]
    DeadLetter,
    /// This header (the publisher's own id, e.g. `X-Request-Id`).
    Header(String),
    /// `sha256-<hex>` of the routing key and the body: two messages with the
    /// same routing key and bytes are one message. Right only where the
    /// publisher never sends the same bytes as two intents.
    ContentHash,
}

/// How a [`RabbitSource`] consumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceConfig {
    /// The queue (declared by the [`Link`]'s topology).
    pub queue: String,
    /// Unacked messages the broker hands over at once (AMQP prefetch).
    /// Default 64; keep it at or above the consumer's batch size.
    pub prefetch: u16,
    /// The id of messages without one.
    pub missing_id: MissingId,
}

impl SourceConfig {
    /// Consume `queue` with the defaults.
    pub fn new(queue: &str) -> Self {
        Self {
            queue: queue.to_owned(),
            prefetch: 64,
            missing_id: MissingId::default(),
        }
    }
}

/// A quorum queue as an [`idem_inbox::MessageSource`]; dead letters are
/// published, with a confirm, to the queue's dead-letter exchange.
#[derive(Debug)]
pub struct RabbitSource {
    link: Arc<Link>,
    config: SourceConfig,
    consumer: Option<lapin::Consumer>,
    /// Prefetch 1 until a message is settled: see [`RabbitSource::fetch`].
    careful: bool,
    /// Set by a delivery once it is settled.
    settled: Arc<AtomicBool>,
}

impl RabbitSource {
    /// A source on `link` (its own, or shared with a readiness check),
    /// whose topology should declare `config.queue`.
    pub fn new(link: impl Into<Arc<Link>>, config: SourceConfig) -> Self {
        Self {
            link: link.into(),
            config,
            consumer: None,
            careful: true,
            settled: Arc::default(),
        }
    }

    /// Its link (for readiness).
    pub fn link(&self) -> &Link {
        &self.link
    }

    /// Whether the queue still answers on the consumer's channel (a passive
    /// declare, within two seconds).
    async fn alive(&self) -> Result<(), SourceError> {
        let channel = self.link.channel().await.map_err(source_err)?;
        let ask = channel.queue_declare(
            self.config.queue.as_str().into(),
            lapin::options::QueueDeclareOptions {
                passive: true,
                ..lapin::options::QueueDeclareOptions::default()
            },
            FieldTable::default(),
        );
        match tokio::time::timeout(Duration::from_secs(2), ask).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(source_err(e)),
            Err(_) => Err(source_err("RabbitMQ did not answer within 2 s")),
        }
    }

    async fn consumer(&mut self) -> Result<&mut lapin::Consumer, SourceError> {
        if self.consumer.is_none() {
            let channel = self.link.channel().await.map_err(source_err)?;
            channel
                .basic_qos(
                    if self.careful {
                        1
                    } else {
                        self.config.prefetch
                    },
                    BasicQosOptions::default(),
                )
                .await
                .map_err(source_err)?;
            let consumer = channel
                .basic_consume(
                    self.config.queue.as_str().into(),
                    "".into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(source_err)?;
            self.consumer = Some(consumer);
        }
        self.consumer
            .as_mut()
            .ok_or_else(|| source_err("no consumer"))
    }
}

fn source_err(e: impl Into<idem_core::BoxError>) -> SourceError {
    SourceError { source: e.into() }
}

/// One message from the queue.
#[derive(Debug)]
pub struct RabbitDelivery {
    settled: Arc<AtomicBool>,
    delivery: lapin::message::Delivery,
    missing_id: MissingId,
}

/// A header's value as text, if it is text or a number.
fn text(value: &AMQPValue) -> Option<String> {
    match value {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        AMQPValue::LongLongInt(n) => Some(n.to_string()),
        AMQPValue::LongInt(n) => Some(n.to_string()),
        AMQPValue::LongUInt(n) => Some(n.to_string()),
        AMQPValue::ShortInt(n) => Some(n.to_string()),
        AMQPValue::ShortUInt(n) => Some(n.to_string()),
        AMQPValue::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A header's value as a count.
fn count(value: &AMQPValue) -> Option<u64> {
    match value {
        AMQPValue::LongLongInt(n) => u64::try_from(*n).ok(),
        AMQPValue::LongInt(n) => u64::try_from(*n).ok(),
        AMQPValue::LongUInt(n) => Some(u64::from(*n)),
        AMQPValue::ShortInt(n) => u64::try_from(*n).ok(),
        AMQPValue::ShortUInt(n) => Some(u64::from(*n)),
        _ => None,
    }
}

impl RabbitDelivery {
    fn header(&self, name: &str) -> Option<&AMQPValue> {
        self.delivery
            .properties
            .headers()
            .as_ref()
            .and_then(|h| {
                h.inner()
                    .iter()
                    .find(|(k, _)| k.as_str().eq_ignore_ascii_case(name))
            })
            .map(|(_, v)| v)
    }

    fn message_id(&self) -> Result<String, String> {
        if let Some(id) = self.delivery.properties.message_id() {
            return Ok(id.as_str().to_owned());
        }
        if let Some(id) = self.header(MESSAGE_ID).and_then(text) {
            return Ok(id);
        }
        match &self.missing_id {
            MissingId::DeadLetter => Err(format!("no message_id and no {MESSAGE_ID} header")),
            MissingId::Header(name) => self
                .header(name)
                .and_then(text)
                .ok_or_else(|| format!("no message_id, no {MESSAGE_ID} and no {name} header")),
            MissingId::ContentHash => {
                let mut hash = sha2::Sha256::new();
                hash.update(self.delivery.routing_key.as_str().as_bytes());
                hash.update([0]);
                hash.update(&self.delivery.data);
                let hex: String = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
                Ok(format!("sha256-{hex}"))
            }
        }
    }
}

impl Delivery for RabbitDelivery {
    fn message(&self) -> Result<InboxMessage, String> {
        let message_id = MessageId::new(self.message_id()?).map_err(|e| e.to_string())?;
        // A quorum queue counts earlier deliveries that were not acked.
        let earlier = self.header("x-delivery-count").and_then(count).unwrap_or(0);
        let headers = self
            .delivery
            .properties
            .headers()
            .as_ref()
            .into_iter()
            .flat_map(|h| h.inner().iter())
            .filter(|(n, _)| {
                let n = n.as_str();
                !n.eq_ignore_ascii_case(MESSAGE_ID)
                    && !n.eq_ignore_ascii_case(MESSAGE_KEY)
                    && !n.starts_with("x-")
            })
            .filter_map(|(n, v)| text(v).map(|v| (n.as_str().to_owned(), v)))
            .collect();
        Ok(InboxMessage {
            message_id,
            subject: self.delivery.routing_key.as_str().to_owned(),
            key: self.header(MESSAGE_KEY).and_then(text),
            payload: self.delivery.data.clone(),
            headers,
            delivered: earlier.saturating_add(1),
            stream_sequence: self.delivery.delivery_tag,
        })
    }

    async fn ack(&self) -> Result<(), SourceError> {
        self.delivery
            .acker
            .ack(BasicAckOptions::default())
            .await
            .map_err(source_err)?;
        self.settled.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// The message stays unacked (held by this consumer) for `delay`, then
    /// goes back to the queue; if the consumer dies meanwhile, the broker
    /// requeues it at once.
    async fn nak(&self, delay: Duration) -> Result<(), SourceError> {
        let acker = self.delivery.acker.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let requeue = BasicNackOptions {
                requeue: true,
                ..BasicNackOptions::default()
            };
            if let Err(e) = acker.nack(requeue).await {
                // The channel is gone: the broker has requeued it already.
                tracing::debug!(error = %e, "nack after the retry delay failed");
            }
        });
        Ok(())
    }

    async fn term(&self) -> Result<(), SourceError> {
        self.ack().await
    }
}

impl MessageSource for RabbitSource {
    type Delivery = RabbitDelivery;

    async fn fetch(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<RabbitDelivery>, SourceError> {
        let missing_id = self.config.missing_id.clone();
        // A consumer starts, and starts again after losing its channel, with
        // a prefetch of 1: a message that kills the connection (one lapin
        // cannot parse) or the process is then the only one the broker
        // counts a delivery for, and it alone reaches the queue's delivery
        // limit — its neighbours, never attempted, are not dead-lettered
        // with it. Once a message is settled, consume with the full window.
        let mut out = Vec::new();
        if self.careful && self.settled.load(Ordering::Relaxed) && self.consumer.is_some() {
            self.careful = false;
            if let Some(mut c) = self.consumer.take() {
                let channel = self.link.channel().await.map_err(source_err)?;
                let _ = channel
                    .basic_cancel(c.tag(), lapin::options::BasicCancelOptions::default())
                    .await;
                // What the broker delivered before the cancel is handed out
                // here: left in the cancelled consumer it would stay unacked
                // on the channel, never applied, never redelivered.
                while let Some(Some(Ok(delivery))) = c.next().now_or_never() {
                    out.push(RabbitDelivery {
                        delivery,
                        missing_id: missing_id.clone(),
                        settled: self.settled.clone(),
                    });
                }
            }
        }
        let consumer = self.consumer().await?;
        let wait = if out.is_empty() { wait } else { Duration::ZERO };
        let first = match tokio::time::timeout(wait, consumer.next()).await {
            Err(_) => {
                // Nothing came: a quiet queue, or a broker that is gone
                // without the client having noticed (a killed node can
                // look connected until something is written). Ask.
                if out.is_empty()
                    && let Err(e) = self.alive().await
                {
                    self.consumer = None;
                    self.careful = true;
                    self.settled.store(false, Ordering::Relaxed);
                    self.link.reset().await;
                    return Err(e);
                }
                return Ok(out);
            }
            Ok(first) => first,
        };
        let mut next = first;
        loop {
            match next {
                Some(Ok(delivery)) => out.push(RabbitDelivery {
                    delivery,
                    missing_id: missing_id.clone(),
                    settled: self.settled.clone(),
                }),
                Some(Err(e)) => {
                    self.consumer = None;
                    self.careful = true;
                    self.settled.store(false, Ordering::Relaxed);
                    self.link.reset().await;
                    return if out.is_empty() {
                        Err(source_err(e))
                    } else {
                        Ok(out)
                    };
                }
                None => {
                    // The channel closed under the consumer: consume again
                    // on a new one next time.
                    self.consumer = None;
                    self.careful = true;
                    self.settled.store(false, Ordering::Relaxed);
                    self.link.reset().await;
                    return if out.is_empty() {
                        Err(source_err("the consumer's channel closed"))
                    } else {
                        Ok(out)
                    };
                }
            }
            if out.len() >= max {
                return Ok(out);
            }
            match self.consumer.as_mut().and_then(|c| c.next().now_or_never()) {
                Some(more) => next = more,
                None => return Ok(out),
            }
        }
    }

    async fn dead_letter(
        &self,
        delivery: &RabbitDelivery,
        reason: &str,
    ) -> Result<(), SourceError> {
        let queue =
            self.link.topology().queue.as_ref().ok_or_else(|| {
                source_err("the link declares no queue, so no dead-letter exchange")
            })?;
        let d = &delivery.delivery;
        // Header values stay on one line.
        let reason: String = reason
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        let mut headers = d.properties.headers().clone().unwrap_or_default();
        headers.insert(
            DEAD_REASON.into(),
            AMQPValue::LongString(reason.as_str().into()),
        );
        headers.insert(
            ORIGINAL_ROUTING_KEY.into(),
            AMQPValue::LongString(d.routing_key.as_str().into()),
        );
        let mut properties = BasicProperties::default()
            .with_delivery_mode(2)
            .with_headers(headers);
        if let Some(id) = d.properties.message_id() {
            properties = properties.with_message_id(id.clone());
        }
        let channel = self.link.channel().await.map_err(source_err)?;
        let publish = crate::publish_confirmed(
            &channel,
            &queue.dead_letter_exchange,
            &queue.name,
            &d.data,
            properties,
        );
        let publish = async { publish.await.map_err(source_err) };
        match tokio::time::timeout(IO_TIMEOUT, publish).await {
            Err(_) => Err(source_err("no confirm for the dead letter")),
            Ok(Err(e)) => Err(e),
            Ok(Ok(Confirmation::Ack(None))) => Ok(()),
            Ok(Ok(_)) => Err(source_err("the dead letter was not routed or was nacked")),
        }
    }
}
