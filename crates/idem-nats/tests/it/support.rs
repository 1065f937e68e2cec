//! Shared pieces of the messaging tests: streams of their own on the shared
//! NATS server, a fault-injecting publisher, and the two backends.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, Context};
use idem_core::Backoff;
use idem_core::inbox::{InboxStore, Subscriber};
use idem_core::outbox::{MessageId, OutboxMessage, OutboxRecord, Topic};
use idem_inbox::{Consumer, ConsumerConfig, Handler, Inbox, InboxMode};
use idem_nats::{NatsSource, SourceConfig};
use idem_outbox::{PublishError, Published, Publisher};

pub const ORD: std::sync::atomic::Ordering = std::sync::atomic::Ordering::SeqCst;

pub async fn js() -> Context {
    idem_nats::connect(&idem_testkit::nats_url(), "idem-test", false)
        .await
        .unwrap()
}

pub use idem_testkit::{Rng, seed};

/// A message as stored in a stream.
#[derive(Debug, Clone)]
pub struct Sent {
    pub headers: Vec<(String, String)>,
    pub payload: Vec<u8>,
}

impl Sent {
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    }
}

/// A stream and a dead-letter stream of this test's own.
pub struct Streams {
    pub js: Context,
    pub name: String,
    pub topic: Topic,
    pub dead_letter_subject: String,
}

impl Streams {
    pub async fn create(js: &Context) -> Self {
        Self::create_with_max_msg_size(js, -1).await
    }

    pub async fn create_with_max_msg_size(js: &Context, max: i32) -> Self {
        let name = idem_testkit::unique_name("S");
        js.create_stream(jetstream::stream::Config {
            name: name.clone(),
            subjects: vec![format!("{name}.>")],
            duplicate_window: Duration::from_secs(120),
            max_message_size: max,
            ..Default::default()
        })
        .await
        .unwrap();
        idem_nats::ensure_stream(
            js,
            &format!("{name}_DLQ"),
            &[&format!("{name}_dlq.>")],
            Duration::from_secs(120),
        )
        .await
        .unwrap();
        Self {
            js: js.clone(),
            topic: Topic::new(format!("{name}.created")).unwrap(),
            dead_letter_subject: format!("{name}_dlq.dead"),
            name,
        }
    }

    pub fn message(&self, key: &str, payload: &str) -> OutboxMessage {
        OutboxMessage::new(self.topic.clone(), key, payload.as_bytes().to_vec()).unwrap()
    }

    async fn read_stream(&self, name: &str) -> Vec<Sent> {
        let stream = self.js.get_stream(name).await.unwrap();
        let info = stream.get_info().await.unwrap();
        let mut out = Vec::new();
        if info.state.messages == 0 {
            return out;
        }
        for seq in info.state.first_sequence..=info.state.last_sequence {
            let Ok(m) = stream.get_raw_message(seq).await else {
                continue;
            };
            out.push(Sent {
                headers: m
                    .headers
                    .iter()
                    .flat_map(|(n, vs)| {
                        vs.iter()
                            .map(move |v| (n.to_string(), v.as_str().to_owned()))
                    })
                    .collect(),
                payload: m.payload.to_vec(),
            });
        }
        out
    }

    /// Everything in the stream, in stream order.
    pub async fn read(&self) -> Vec<Sent> {
        self.read_stream(&self.name).await
    }

    /// Everything dead-lettered.
    pub async fn read_dead(&self) -> Vec<Sent> {
        self.read_stream(&format!("{}_DLQ", self.name)).await
    }

    /// Publishes the messages at these positions (0-based) again under new
    /// broker ids: duplicates only an inbox can catch.
    pub async fn republish(&self, positions: &[usize]) {
        let all = self.read().await;
        for &i in positions {
            let m = &all[i];
            let mut headers = HeaderMap::new();
            for (n, v) in &m.headers {
                if !n.eq_ignore_ascii_case("Nats-Msg-Id") {
                    headers.append(n.as_str(), v.as_str());
                }
            }
            let msg = PublishMessage::build()
                .payload(m.payload.clone().into())
                .headers(headers)
                .message_id(MessageId::generate().as_str());
            self.js
                .send_publish(self.topic.to_string(), msg)
                .await
                .unwrap()
                .await
                .unwrap();
        }
    }

    /// A message with no id headers at all.
    pub async fn publish_raw(&self, payload: &str) {
        self.js
            .publish(self.topic.to_string(), payload.to_owned().into())
            .await
            .unwrap()
            .await
            .unwrap();
    }

    pub async fn consumer<S, H>(
        &self,
        store: &S,
        handler: H,
        mode: InboxMode,
    ) -> Consumer<NatsSource, S, H>
    where
        S: InboxStore,
        H: Handler<S::Tx>,
    {
        let source = NatsSource::new(
            self.js.clone(),
            SourceConfig {
                stream: self.name.clone(),
                durable: "ledger".into(),
                filter_subject: String::new(),
                ack_wait: Duration::from_secs(1),
                dead_letter_subject: self.dead_letter_subject.clone(),
            },
        )
        .await
        .unwrap();
        Consumer::new(
            source,
            Inbox::new(store.clone()).mode(mode),
            Subscriber::new("ledger").unwrap(),
            handler,
            ConsumerConfig {
                batch_size: 16,
                fetch_wait: Duration::from_millis(200),
                max_deliver: 3,
                nak_backoff: Backoff {
                    initial: Duration::from_millis(10),
                    max: Duration::from_millis(50),
                },
                handler_timeout: Duration::from_millis(500),
            },
        )
        .unwrap()
    }
}

/// Wraps a real publisher with seeded faults: delays, refusals, and acks lost
/// after the broker stored the message.
pub struct Flaky<P> {
    inner: P,
    rng: Rng,
}

impl<P> Flaky<P> {
    pub fn new(inner: P, seed: u64) -> Self {
        Self {
            inner,
            rng: Rng::new(seed),
        }
    }
}

impl<P: Publisher> Publisher for Flaky<P> {
    async fn publish(&self, record: &OutboxRecord) -> Result<Published, PublishError> {
        tokio::time::sleep(Duration::from_micros(self.rng.next() % 3000)).await;
        if self.rng.chance(10) {
            return Err(PublishError::Rejected {
                reason: "injected refusal".into(),
            });
        }
        let published = self.inner.publish(record).await?;
        if self.rng.chance(10) {
            return Err(PublishError::Unavailable {
                source: "injected: ack lost after the broker stored it".into(),
            });
        }
        Ok(published)
    }
}

pub use crate::backends::*;
