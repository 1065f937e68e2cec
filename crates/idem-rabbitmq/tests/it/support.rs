//! An exchange and queues of a test's own on its RabbitMQ node.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use idem_core::Backoff;
use idem_core::inbox::{InboxStore, Subscriber};
use idem_core::outbox::{OutboxMessage, OutboxStore, Topic};
use idem_inbox::{Consumer, ConsumerConfig, Handler, Inbox, InboxMode};
use idem_outbox::{Dispatcher, DispatcherConfig};
use idem_rabbitmq::{Link, QueueSpec, RabbitPublisher, RabbitSource, SourceConfig, Topology};
use idem_testkit::RabbitNode;
use lapin::BasicProperties;
use lapin::options::{BasicGetOptions, BasicPublishOptions};
use lapin::types::{AMQPValue, FieldTable};

pub const ORD: std::sync::atomic::Ordering = std::sync::atomic::Ordering::SeqCst;

/// Deliveries before the consumer gives up on a failing message.
pub const MAX_DELIVER: u32 = 3;

/// An exchange, its topic, and a consumer queue bound to it.
pub struct Queues {
    pub url: String,
    pub exchange: String,
    pub queue: String,
    pub topic: Topic,
}

/// A message in the dead-letter queue.
#[derive(Debug)]
pub struct Dead {
    pub reason: String,
    pub payload: Vec<u8>,
}

impl Queues {
    pub fn new(node: &RabbitNode, tag: &str) -> Self {
        let name = idem_testkit::unique_name(tag).to_lowercase();
        Self {
            url: node.url(),
            exchange: format!("x.{name}"),
            topic: Topic::new(format!("{name}.created")).unwrap(),
            queue: name,
        }
    }

    pub fn message(&self, key: &str, payload: &str) -> OutboxMessage {
        OutboxMessage::new(self.topic.clone(), key, payload.as_bytes().to_vec()).unwrap()
    }

    fn queue_spec(&self) -> QueueSpec {
        QueueSpec::new(&self.queue, &[&format!("{}.#", self.queue)], MAX_DELIVER)
    }

    pub fn dispatcher<S: OutboxStore>(&self, store: S) -> Dispatcher<S, RabbitPublisher> {
        let link = Link::new(&self.url, "relay", Topology::exchange(&self.exchange)).unwrap();
        let config = DispatcherConfig {
            poll_interval: Duration::from_millis(50),
            backoff: Backoff {
                initial: Duration::from_millis(10),
                max: Duration::from_millis(50),
            },
            broker_backoff: Backoff {
                initial: Duration::from_millis(20),
                max: Duration::from_millis(200),
            },
            ..DispatcherConfig::default()
        };
        Dispatcher::new(
            store,
            RabbitPublisher::new(Arc::new(link), &self.exchange),
            config,
        )
        .unwrap()
    }

    /// A consumer whose queue is declared (and bound) before it returns.
    pub async fn consumer<S, H>(
        &self,
        store: &S,
        handler: H,
        mode: InboxMode,
    ) -> Consumer<RabbitSource, S, H>
    where
        S: InboxStore,
        H: Handler<S::Tx>,
    {
        let topology = Topology::exchange(&self.exchange).with_queue(self.queue_spec());
        let link = Link::new(&self.url, "ledger", topology).unwrap();
        link.channel().await.unwrap();
        Consumer::new(
            RabbitSource::new(link, SourceConfig::new(&self.queue)),
            Inbox::new(store.clone()).mode(mode),
            Subscriber::new("ledger").unwrap(),
            handler,
            ConsumerConfig {
                batch_size: 16,
                fetch_wait: Duration::from_millis(200),
                max_deliver: u64::from(MAX_DELIVER),
                nak_backoff: Backoff {
                    initial: Duration::from_millis(10),
                    max: Duration::from_millis(50),
                },
                handler_timeout: Duration::from_millis(1000),
            },
        )
        .unwrap()
    }

    async fn channel(&self) -> lapin::Channel {
        let link = Link::new(&self.url, "test", Topology::exchange(&self.exchange)).unwrap();
        let channel = link.channel().await.unwrap();
        // The link would close the connection when dropped with it.
        std::mem::forget(link);
        channel
    }

    async fn publish(&self, properties: BasicProperties, payload: &[u8]) {
        let confirm = self
            .channel()
            .await
            .basic_publish(
                self.exchange.as_str().into(),
                self.topic.as_str().into(),
                BasicPublishOptions::default(),
                payload,
                properties,
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(confirm.is_ack());
    }

    /// `m` published again with its own `message_id` and headers, as the
    /// relay does after a crash between the confirm and marking it sent.
    pub async fn publish_again(&self, m: &OutboxMessage) {
        let mut headers = FieldTable::default();
        headers.insert(
            "Idem-Message-Id".into(),
            AMQPValue::LongString(m.message_id.as_str().into()),
        );
        headers.insert(
            "Idem-Message-Key".into(),
            AMQPValue::LongString(m.key.as_str().into()),
        );
        let properties = BasicProperties::default()
            .with_message_id(m.message_id.as_str().into())
            .with_headers(headers);
        self.publish(properties, &m.payload).await;
    }

    /// A message with no id at all.
    pub async fn publish_without_id(&self, payload: &str) {
        self.publish(BasicProperties::default(), payload.as_bytes())
            .await;
    }

    /// Everything in the dead-letter queue (taken off it).
    pub async fn read_dead(&self) -> Vec<Dead> {
        let channel = self.channel().await;
        let mut out = Vec::new();
        let dead_queue = format!("{}.dead", self.queue);
        while let Some(m) = channel
            .basic_get(dead_queue.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            let reason = m
                .delivery
                .properties
                .headers()
                .as_ref()
                .and_then(|h| h.inner().get("Idem-Dead-Reason").cloned())
                .map(|v| match v {
                    AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
                    other => format!("{other:?}"),
                })
                .unwrap_or_default();
            out.push(Dead {
                reason,
                payload: m.delivery.data.clone(),
            });
        }
        out
    }
}

/// Runs the consumer until it has settled `n` deliveries (or 20 s).
pub async fn drain<Src, S, H>(consumer: &mut Consumer<Src, S, H>, n: u64)
where
    Src: idem_inbox::MessageSource,
    S: InboxStore,
    H: Handler<S::Tx>,
{
    let settled = |c: &Consumer<Src, S, H>| {
        let s = c.stats();
        s.applied.load(ORD)
            + s.duplicates.load(ORD)
            + s.dead_lettered.load(ORD)
            + s.retried.load(ORD)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while std::time::Instant::now() < deadline {
        if settled(consumer) >= n {
            return;
        }
        let _ = consumer.run_once().await;
    }
    panic!("only {} of {n} deliveries settled", settled(consumer));
}

/// Each key's messages were applied in the order they were written.
pub fn assert_in_key_order(applied: &[String], written: &[OutboxMessage]) {
    let position: BTreeMap<String, (String, usize)> = written
        .iter()
        .enumerate()
        .map(|(i, m)| (m.message_id.to_string(), (m.key.clone(), i)))
        .collect();
    let mut last: BTreeMap<String, usize> = BTreeMap::new();
    for id in applied {
        let (key, at) = &position[id];
        if let Some(prev) = last.insert(key.clone(), *at) {
            assert!(prev < *at, "key {key}: message {at} applied after {prev}");
        }
    }
}

/// Runs a pika script (`python -c`) with the node's AMQP `port` and `args`.
pub fn pika(script: &str, port: u16, args: &[&str]) -> std::process::Output {
    std::process::Command::new(idem_testkit::python())
        .args(["-c", script])
        .arg(port.to_string())
        .args(args)
        .output()
        .unwrap()
}

/// The same, which must succeed.
pub fn pika_ok(script: &str, port: u16, args: &[&str]) {
    let out = pika(script, port, args);
    assert!(
        out.status.success(),
        "pika: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
