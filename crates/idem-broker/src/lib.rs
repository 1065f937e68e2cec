//! An outbox relay and an inbox consumer over a broker named by its URL:
//! NATS JetStream (`nats://`, `tls://`), RabbitMQ (`amqp://`, `amqps://`)
//! or Kafka (`kafka://`). What `idem serve`, `idem relay` and
//! `idem consume` run behind `--broker-url`; a library user runs the same.
//!
//! One entry point, [`Broker`]: [`Broker::connect`] to the broker a
//! [`BrokerUrl`] names, making the [`Routes`] there (NATS's streams,
//! RabbitMQ's exchange and, for a consumer, its quorum queue, Kafka's
//! topics); then [`Broker::relay`] publishes a store's outbox, or
//! [`Broker::consume`] applies messages through its inbox, and
//! [`Broker::readiness`] says whether the broker answers.
//!
//! ```no_run
//! # async fn run<S: idem_core::inbox::InboxStore, H: idem_inbox::Handler<S::Tx>>(store: S, handler: H) -> anyhow::Result<()> {
//! use idem_broker::{Broker, BrokerUrl, ConsumeConfig, Routes};
//! let url = BrokerUrl::parse("amqp://guest:guest@127.0.0.1:5672/%2f")?;
//! let routes = Routes::new("ORDERS", "orders");
//! let consume = ConsumeConfig::new("billing");
//! let (_stop, shutdown) = tokio::sync::watch::channel(false);
//! if let Some(broker) = Broker::connect(&url, "billing", &routes, Some(&consume), shutdown.clone()).await? {
//!     broker.consume(store, &routes, handler, &consume, shutdown).await?;
//! }
//! # Ok(()) }
//! ```
//!
//! Each broker's own crate ([`idem_nats`], [`idem_rabbitmq`],
//! [`idem_kafka`]) is there for a program that needs one broker only, or
//! more control than the routes give.

use std::sync::Arc;
use std::time::Duration;

use idem_core::KeyStore;
use idem_core::inbox::{InboxStore, Subscriber};
use idem_core::outbox::{OutboxStore, Wake};
use idem_inbox::{Consumer, ConsumerConfig, Handler, Inbox, MessageSource};
use idem_outbox::{Dispatcher, DispatcherConfig, Publisher, RelayFigures};
use tokio::sync::watch;

mod kafka;
mod nats;
mod rabbit;

pub use idem_core::without_credentials;

/// The longest broker URL accepted.
const MAX_URL_LEN: usize = 1024;

/// A broker URL that is refused: one line, without the URL (it may hold a
/// password).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadUrl(String);

/// A broker, by the scheme of its URL.
#[derive(Clone, PartialEq, Eq)]
pub enum BrokerUrl {
    /// `nats://` or `tls://`, one server or a comma-separated list.
    Nats(String),
    /// `amqp://` or `amqps://`: RabbitMQ.
    Rabbit(String),
    /// `kafka://host:port[,host:port]`.
    Kafka(String),
}

impl std::fmt::Debug for BrokerUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BrokerUrl({})", without_credentials(self.as_str()))
    }
}

impl BrokerUrl {
    /// Checks `url`: a known scheme and a URL of that broker that parses.
    pub fn parse(url: &str) -> Result<Self, BadUrl> {
        if url.len() > MAX_URL_LEN {
            return Err(BadUrl(format!("longer than {MAX_URL_LEN} bytes")));
        }
        let bad = |e: &dyn std::fmt::Display| BadUrl(e.to_string());
        match url.split_once("://").map_or("", |(s, _)| s) {
            "nats" | "tls" => {
                idem_nats::servers(url).map_err(|e| bad(&e))?;
                Ok(Self::Nats(url.to_owned()))
            }
            "amqp" | "amqps" => {
                idem_rabbitmq::check_url(url).map_err(|e| bad(&e))?;
                Ok(Self::Rabbit(url.to_owned()))
            }
            "kafka" => {
                idem_kafka::bootstrap_servers(url).map_err(|e| bad(&e))?;
                Ok(Self::Kafka(url.to_owned()))
            }
            _ => Err(BadUrl(
                "not a broker URL: expected nats:// or tls:// (NATS), amqp:// or amqps:// \
                 (RabbitMQ), kafka:// (Kafka)"
                    .into(),
            )),
        }
    }

    /// The broker's name, as logs and readiness say it: `nats`,
    /// `rabbitmq`, `kafka`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Nats(_) => "nats",
            Self::Rabbit(_) => "rabbitmq",
            Self::Kafka(_) => "kafka",
        }
    }

    /// The URL.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Nats(u) | Self::Rabbit(u) | Self::Kafka(u) => u,
        }
    }
}

/// Where events go, on each broker. [`Routes::new`] names them after one
/// stream; change a field for a topology of your own.
#[derive(Debug, Clone)]
pub struct Routes {
    /// NATS: the events stream and its subjects (the outbox's topics).
    pub nats_stream: String,
    /// Its subjects (`orders.>`).
    pub nats_subjects: Vec<String>,
    /// The stream of dead letters, and its subjects (`idem.dlq.>`).
    pub nats_dlq_stream: String,
    /// Its subjects.
    pub nats_dlq_subjects: Vec<String>,
    /// JetStream drops a message id seen within this window: longer than
    /// the relay's lease, so a message published again after a relay's
    /// crash is dropped by the broker.
    pub nats_duplicate_window: Duration,
    /// Copies of a stream Idem creates (1, 3 or 5; an existing stream keeps
    /// its own).
    pub nats_replicas: usize,
    /// RabbitMQ: the durable topic exchange (routing key = the topic).
    pub rabbit_exchange: String,
    /// A consumer's queue's bindings (`orders.#`).
    pub rabbit_bindings: Vec<String>,
    /// Kafka: the topic every outbox topic is published to (keyed by the
    /// message's ordering key; the topic in `Idem-Message-Subject`).
    pub kafka_topic: String,
    /// Its partitions, when Idem creates it.
    pub kafka_partitions: i32,
}

impl Routes {
    /// The routes of events on the topics `<prefix>.…`: NATS stream
    /// `stream` on `<prefix>.>` with dead letters in `IDEM_DLQ`
    /// (`idem.dlq.>`), a 5-minute duplicate window, one replica; RabbitMQ's
    /// exchange `idem.events`, queues bound to `<prefix>.#`; Kafka's topic
    /// `idem.<prefix>`, 6 partitions.
    pub fn new(stream: &str, prefix: &str) -> Self {
        Self {
            nats_stream: stream.to_owned(),
            nats_subjects: vec![format!("{prefix}.>")],
            nats_dlq_stream: "IDEM_DLQ".into(),
            nats_dlq_subjects: vec!["idem.dlq.>".into()],
            nats_duplicate_window: Duration::from_secs(300),
            nats_replicas: 1,
            rabbit_exchange: idem_rabbitmq::DEFAULT_EXCHANGE.into(),
            rabbit_bindings: vec![format!("{prefix}.#")],
            kafka_topic: format!("idem.{prefix}"),
            kafka_partitions: 6,
        }
    }
}

/// Settings of a consumer.
#[derive(Debug, Clone)]
pub struct ConsumeConfig {
    /// Its name: the inbox subscriber, NATS's durable consumer, RabbitMQ's
    /// queue, Kafka's consumer group.
    pub name: String,
    /// Redelivery after this long without an ack (NATS); the handler is
    /// given up after three quarters of it.
    pub ack_wait: Duration,
    /// Deliveries before a failing message is dead-lettered (RabbitMQ: the
    /// queue's delivery limit too).
    pub max_deliver: u32,
}

impl ConsumeConfig {
    /// `name`, a 30 s ack wait, 5 deliveries.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            ack_wait: Duration::from_secs(30),
            max_deliver: 5,
        }
    }

    /// Where its dead letters go: NATS's subject and Kafka's topic
    /// `idem.dlq.<name>` (RabbitMQ: the queue `<name>.dead`).
    pub fn dead_letters(&self) -> String {
        format!("idem.dlq.{}", self.name)
    }
}

/// A broker this process is connected to.
#[derive(Debug, Clone)]
pub enum Broker {
    /// NATS JetStream, its streams ready.
    Nats(Box<idem_nats::Context>),
    /// RabbitMQ: the exchange declared (and, for a consumer, its queue).
    Rabbit(Arc<idem_rabbitmq::Link>),
    /// Kafka, the topics there.
    Kafka(Box<idem_kafka::Kafka>),
}

impl Broker {
    /// Connects to `url` as `client` and makes `routes` there (for a
    /// `consumer`, its queue or dead-letter topic too), retrying until it
    /// holds or `shutdown` (`Ok(None)`). An error is a setting that can
    /// never work.
    pub async fn connect(
        url: &BrokerUrl,
        client: &str,
        routes: &Routes,
        consumer: Option<&ConsumeConfig>,
        shutdown: watch::Receiver<bool>,
    ) -> anyhow::Result<Option<Self>> {
        Ok(match url {
            BrokerUrl::Nats(u) => nats::prepare(u, client, routes, shutdown)
                .await?
                .map(|js| Self::Nats(Box::new(js))),
            BrokerUrl::Rabbit(u) => {
                let topology = rabbit::topology(routes, consumer);
                rabbit::connect(u, client, topology, shutdown)
                    .await?
                    .map(|link| Self::Rabbit(Arc::new(link)))
            }
            BrokerUrl::Kafka(u) => kafka::connect(u, routes, consumer, shutdown)
                .await?
                .map(|k| Self::Kafka(Box::new(k))),
        })
    }

    /// The broker's name (`nats`, `rabbitmq`, `kafka`).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Nats(_) => "nats",
            Self::Rabbit(_) => "rabbitmq",
            Self::Kafka(_) => "kafka",
        }
    }

    /// Whether the connection is down, known without asking the broker
    /// (NATS's client says so; the others are asked by
    /// [`readiness`](Self::readiness)).
    pub fn is_disconnected(&self) -> bool {
        matches!(self, Self::Nats(js) if !idem_nats::is_connected(js))
    }

    /// Asks the broker, within `within`: `"ok"`, or what is wrong (`"no
    /// quorum"`, `"unavailable"`, `"no answer"`), and how long an `"ok"`
    /// holds (NATS: no longer than the stream's leader says; the others:
    /// `within`).
    pub async fn readiness(&self, routes: &Routes, within: Duration) -> (&'static str, Duration) {
        let asked = match self {
            Self::Nats(js) => return nats::readiness(js, &routes.nats_stream, within).await,
            // The link opens again if it was lost; the exchange must answer.
            Self::Rabbit(link) => link.check(within).await.map_err(anyhow::Error::new),
            Self::Kafka(kafka) => kafka.ready(within).await.map_err(anyhow::Error::new),
        };
        match asked {
            Ok(()) => ("ok", within),
            Err(e) => {
                tracing::warn!(broker = self.name(), error = %format!("{e:#}"), "readiness: the broker did not answer");
                ("unavailable", within)
            }
        }
    }

    /// Relays `store`'s outbox to the broker along `routes` until
    /// `shutdown`; `started` gets the relay's figures once it runs.
    pub async fn relay<S: OutboxStore + KeyStore>(
        self,
        store: S,
        routes: &Routes,
        config: DispatcherConfig,
        wake: impl Wake,
        started: impl FnOnce(Arc<dyn RelayFigures>),
        shutdown: watch::Receiver<bool>,
    ) -> anyhow::Result<()> {
        let relay = Relay {
            store,
            config,
            wake,
            shutdown,
        };
        match self {
            Self::Nats(js) => relay.run(idem_nats::NatsPublisher::new(*js), started).await,
            Self::Rabbit(link) => {
                let p = idem_rabbitmq::RabbitPublisher::new(link, &routes.rabbit_exchange);
                relay.run(p, started).await
            }
            Self::Kafka(k) => relay.run(kafka::publisher(&k, routes)?, started).await,
        }
    }

    /// Applies the messages of `routes` to `store` through its inbox with
    /// `handler`, as `config.name`, until `shutdown`: binds its source
    /// (retrying while the broker is not ready), then consumes. On
    /// RabbitMQ the queue is the one [`connect`](Self::connect) declared
    /// for this consumer.
    pub async fn consume<S, H>(
        self,
        store: S,
        routes: &Routes,
        handler: H,
        config: &ConsumeConfig,
        shutdown: watch::Receiver<bool>,
    ) -> anyhow::Result<()>
    where
        S: InboxStore,
        H: Handler<S::Tx>,
    {
        let consume = Consume {
            store,
            handler,
            config,
            shutdown,
        };
        match self {
            Self::Nats(js) => {
                let bound = nats::source(*js, routes, config, consume.shutdown.clone());
                match bound.await {
                    Some(source) => consume.run(source).await,
                    None => Ok(()),
                }
            }
            Self::Rabbit(link) => consume.run(rabbit::source(&link, config)?).await,
            Self::Kafka(k) => {
                let source = kafka::source(&k, consume.store.clone(), routes, config).await?;
                consume.run(source).await
            }
        }
    }
}

/// A relay's parts, whatever its publisher.
struct Relay<S, W> {
    store: S,
    config: DispatcherConfig,
    wake: W,
    shutdown: watch::Receiver<bool>,
}

impl<S: OutboxStore + KeyStore, W: Wake> Relay<S, W> {
    async fn run<P: Publisher>(
        self,
        publisher: P,
        started: impl FnOnce(Arc<dyn RelayFigures>),
    ) -> anyhow::Result<()> {
        let clock = self.store.clock();
        let d = Arc::new(Dispatcher::with_clock(
            self.store,
            publisher,
            self.config,
            clock,
        )?);
        started(d.clone());
        tracing::info!("relay publishing the outbox");
        d.run(self.wake, stopped(self.shutdown)).await;
        Ok(())
    }
}

/// A consumer's parts, whatever its source.
struct Consume<'a, S, H> {
    store: S,
    handler: H,
    config: &'a ConsumeConfig,
    shutdown: watch::Receiver<bool>,
}

impl<S: InboxStore, H: Handler<S::Tx>> Consume<'_, S, H> {
    async fn run<Src: MessageSource>(self, source: Src) -> anyhow::Result<()> {
        let subscriber = Subscriber::new(&self.config.name)?;
        let consumer_config = ConsumerConfig {
            max_deliver: u64::from(self.config.max_deliver),
            // Given up before the broker redelivers it anyway.
            handler_timeout: (self.config.ack_wait * 3 / 4).max(Duration::from_millis(500)),
            ..ConsumerConfig::default()
        };
        let mut consumer = Consumer::new(
            source,
            Inbox::new(self.store),
            subscriber,
            self.handler,
            consumer_config,
        )?;
        tracing::info!(subscriber = %self.config.name, "consuming");
        consumer
            .run(Duration::from_secs(3600), stopped(self.shutdown))
            .await;
        Ok(())
    }
}

/// Resolves when `shutdown` turns true (or its sender is gone).
async fn stopped(mut shutdown: watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await;
}

/// Runs `attempt` until it succeeds, 0.5 s and then up to 5 s apart, each
/// failure logged with the broker's `name` and `shown` URL; `None` at
/// `shutdown`, whatever the attempt is doing.
async fn until_ready<T, E, Fut>(
    name: &'static str,
    shown: &str,
    shutdown: watch::Receiver<bool>,
    mut attempt: impl FnMut() -> Fut,
) -> Option<T>
where
    E: std::error::Error + 'static,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let mut delay = Duration::from_millis(500);
    for attempts in 0u32.. {
        let result = tokio::select! {
            _ = stopped(shutdown.clone()) => return None,
            r = attempt() => r,
        };
        match result {
            Ok(t) => {
                tracing::info!(url = %shown, attempts, "{name} ready");
                return Some(t);
            }
            Err(e) => tracing::warn!(
                url = %shown,
                attempts = attempts + 1,
                error = %idem_core::ErrorChain(&e),
                "{name} not ready; retrying"
            ),
        }
        tokio::select! {
            _ = stopped(shutdown.clone()) => return None,
            _ = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(5));
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use idem_core::BoxFuture;
    use idem_inbox::{Handler, HandlerError, InboxMessage};

    use super::{Broker, BrokerUrl, ConsumeConfig, Routes};

    struct Nothing;
    impl<Tx: Send> Handler<Tx> for Nothing {
        fn handle<'a>(
            &'a self,
            _: &'a mut Tx,
            _: &'a InboxMessage,
        ) -> BoxFuture<'a, Result<(), HandlerError>> {
            Box::pin(async { Ok(()) })
        }
    }

    /// A RabbitMQ broker connected for the relay (or another consumer)
    /// declares no queue of this consumer's: consuming on it is refused at
    /// once, by name, instead of retrying a queue that is not there
    /// (nothing is opened: the link connects on first use).
    #[tokio::test]
    async fn a_consumer_on_a_rabbitmq_link_without_its_queue_is_refused() {
        let dir = idem_testkit::TempDir::new("idem-broker-unit");
        let store = idem_sqlite::SqliteStore::connect(&dir.sqlite_url(), Default::default())
            .await
            .unwrap();
        store.migrate().await.unwrap();
        let routes = Routes::new("ORDERS", "orders");
        let billing = ConsumeConfig::new("billing");
        let (_stop, shutdown) = tokio::sync::watch::channel(false);
        for declared in [None, Some(&ConsumeConfig::new("shipping"))] {
            let topology = super::rabbit::topology(&routes, declared);
            let link = idem_rabbitmq::Link::new("amqp://127.0.0.1:1/%2f", "t", topology).unwrap();
            let broker = Broker::Rabbit(Arc::new(link));
            let consumed =
                broker.consume(store.clone(), &routes, Nothing, &billing, shutdown.clone());
            let e = tokio::time::timeout(std::time::Duration::from_secs(5), consumed)
                .await
                .expect("refused at once")
                .unwrap_err();
            assert!(format!("{e:#}").contains("no queue \"billing\""), "{e:#}");
        }
    }

    #[test]
    fn broker_urls_are_known_by_their_scheme_and_errors_hold_no_password() {
        assert_eq!(
            BrokerUrl::parse("nats://a:4222,nats://b:4222")
                .unwrap()
                .name(),
            "nats"
        );
        let rabbit = BrokerUrl::parse("amqp://u:hunter2@127.0.0.1:5672/%2f").unwrap();
        assert_eq!(rabbit.name(), "rabbitmq");
        assert!(!format!("{rabbit:?}").contains("hunter2"));
        assert_eq!(
            BrokerUrl::parse("kafka://127.0.0.1:9092").unwrap().name(),
            "kafka"
        );
        for bad in [
            "redis://u:hunter2@127.0.0.1:6379",
            "amqp://u:hunter2@127.0.0.1:notaport/",
            "nats://u:hunter2@127.0.0.1:4222,,",
            "u:hunter2@127.0.0.1",
            "kafka://u:hunter2@127.0.0.1:9092",
        ] {
            let e = BrokerUrl::parse(bad).unwrap_err().to_string();
            assert!(
                !e.is_empty() && !e.contains("hunter2") && !e.contains('\n'),
                "{e}"
            );
        }
    }
}
