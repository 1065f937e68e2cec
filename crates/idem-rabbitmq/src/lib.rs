//! # Idem on RabbitMQ
//!
//! - [`RabbitPublisher`] implements [`idem_outbox::Publisher`]: it publishes an
//!   outbox message to a durable topic exchange (default
//!   [`DEFAULT_EXCHANGE`]), routing key = the message's topic, persistent,
//!   `message_id` = the outbox message id, `mandatory`, on a channel in
//!   confirm mode, and returns only after the broker's confirm. A publish
//!   that is returned unroutable (no queue bound for its routing key) or
//!   nacked is an [`idem_outbox::PublishError::Unavailable`]: it stays in the
//!   outbox and is retried, never dropped and never counted dead.
//! - [`RabbitSource`] implements [`idem_inbox::MessageSource`] over a durable
//!   **quorum queue** bound to the exchange, with manual acks: the consumer
//!   acks after the inbox transaction commits. Redeliveries are counted by
//!   the queue (`x-delivery-count`); the queue's `x-delivery-limit` with a
//!   dead-letter exchange parks a message that a crash loop keeps
//!   redelivering, and the consumer itself dead-letters, with the reason in
//!   `Idem-Dead-Reason`, a message that cannot be applied. Both go to the
//!   queue `<queue>.dead` (see [`Topology`]).
//! - [`Link`] is a connection and a channel that is opened again when lost
//!   (the broker restarted, the network cut), declaring the [`Topology`]
//!   each time.
//!
//! The inbox's message id is the AMQP `message_id`, else the
//! `Idem-Message-Id` header, else what [`MissingId`] says: a header of the
//! third-party publisher's choosing, a hash of the content, or nothing (the
//! message is dead-lettered as undecodable — the default).
//!
//! ```no_run
//! # async fn wire(store: idem_postgres::PgStore) -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use idem_rabbitmq::{Link, QueueSpec, RabbitPublisher, RabbitSource, SourceConfig, Topology};
//! use idem_outbox::{Dispatcher, DispatcherConfig};
//!
//! let url = "amqp://guest:guest@127.0.0.1:5672/%2f";
//! // The relay: outbox → exchange `idem.events`, waking on NOTIFY.
//! let link = Arc::new(Link::new(url, "orders-relay", Topology::exchange("idem.events"))?);
//! let relay = Dispatcher::new(store.clone(), RabbitPublisher::new(link, "idem.events"), DispatcherConfig::default())?;
//! let wake = store.dialect().outbox_listener().await;
//! tokio::spawn(async move { relay.run(wake, std::future::pending()).await });
//! // A consumer's source: a quorum queue bound to `orders.#`; give it to
//! // `idem_inbox::Consumer`.
//! let queue = QueueSpec::new("billing", &["orders.#"], 5);
//! let link = Link::new(url, "billing", Topology::exchange("idem.events").with_queue(queue))?;
//! let _source = RabbitSource::new(link, SourceConfig::new("billing"));
//! # Ok(()) }
//! ```

use std::time::Duration;

use idem_core::BoxError;
use lapin::options::{
    ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use tokio::sync::Mutex;

mod publish;
mod source;

/// Publishes `payload` to `exchange` with `routing_key`, `mandatory` (an
/// unroutable message comes back in the confirmation), and waits for the
/// broker's confirmation: what the relay and the consumer's dead letters
/// both send.
async fn publish_confirmed(
    channel: &Channel,
    exchange: &str,
    routing_key: &str,
    payload: &[u8],
    properties: lapin::BasicProperties,
) -> Result<lapin::Confirmation, lapin::Error> {
    let options = lapin::options::BasicPublishOptions {
        mandatory: true,
        ..lapin::options::BasicPublishOptions::default()
    };
    channel
        .basic_publish(
            exchange.into(),
            routing_key.into(),
            options,
            payload,
            properties,
        )
        .await?
        .await
}

pub use publish::RabbitPublisher;
pub use source::{MissingId, RabbitDelivery, RabbitSource, SourceConfig};

/// The exchange the relay publishes to unless told otherwise.
pub const DEFAULT_EXCHANGE: &str = "idem.events";
/// The exchange dead letters go to (a topic exchange; routing key = the
/// queue they came from).
pub const DEAD_LETTER_EXCHANGE: &str = "idem.dead";
/// Header with the producer's message id (also sent as `message_id`).
pub const MESSAGE_ID: &str = "Idem-Message-Id";
/// Header with the producer's ordering key.
pub const MESSAGE_KEY: &str = "Idem-Message-Key";
/// Header with the reason a message was dead-lettered by the consumer.
pub const DEAD_REASON: &str = "Idem-Dead-Reason";
/// Header with the routing key a dead-lettered message was published with.
pub const ORIGINAL_ROUTING_KEY: &str = "Idem-Original-Routing-Key";
/// The headers [`RabbitPublisher`] sets itself: an outbox message bound for
/// RabbitMQ may not carry them.
pub const RESERVED_HEADERS: &[&str] = &[MESSAGE_ID, MESSAGE_KEY];

/// How long connecting, declaring and a publish's confirm may take.
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// A RabbitMQ failure.
#[derive(Debug, thiserror::Error)]
#[error("rabbitmq: {0}")]
pub struct RabbitError(#[source] pub BoxError);

fn rabbit_err(e: impl Into<BoxError>) -> RabbitError {
    RabbitError(e.into())
}

/// Checks an `amqp://` or `amqps://` URL (user, password, host, port,
/// vhost, query). The error never repeats the URL (it may hold a password).
pub fn check_url(url: &str) -> Result<(), RabbitError> {
    if !(url.starts_with("amqp://") || url.starts_with("amqps://")) {
        return Err(rabbit_err(
            "the RabbitMQ URL is not an amqp:// or amqps:// URL",
        ));
    }
    // The parser takes a missing host for `localhost`: a URL must name it.
    let rest = url.split_once("://").map_or("", |(_, r)| r);
    let before_query = rest.split(['?', '#']).next().unwrap_or("");
    if before_query
        .split_once('/')
        .is_some_and(|(_, path)| path.contains('@'))
    {
        return Err(rabbit_err(
            "the RabbitMQ URL has an '@' after its host: percent-encode a '/' in the user \
             or password as %2F",
        ));
    }
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host_port.contains(',') {
        return Err(rabbit_err(
            "the RabbitMQ URL names several servers; it takes one (several: a load \
             balancer or a DNS name in front of them)",
        ));
    }
    if host_port.is_empty() || host_port.starts_with(':') {
        return Err(rabbit_err("the RabbitMQ URL names no host"));
    }
    match url.parse::<lapin::uri::AMQPUri>() {
        Ok(uri) if uri.authority.host.is_empty() => {
            Err(rabbit_err("the RabbitMQ URL names no host"))
        }
        Ok(_) => Ok(()),
        // The parser's message quotes the input; say what kind of thing is wrong.
        Err(_) => Err(rabbit_err(
            "the RabbitMQ URL does not parse as amqp://user:password@host:port/vhost",
        )),
    }
}

/// A quorum queue and its bindings, with its dead-letter queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSpec {
    /// The queue's name.
    pub name: String,
    /// Routing-key patterns bound to the exchange (`orders.#`, `*.shipped`).
    pub bindings: Vec<String>,
    /// The queue's `x-delivery-limit`: after that many redeliveries the
    /// broker moves a message to the dead-letter exchange (a crash loop
    /// does not spin forever). Keep it at the consumer's `max_deliver`.
    pub delivery_limit: u32,
    /// Where dead letters go: this topic exchange, routing key = the queue's
    /// name, into the quorum queue `<name>.dead`.
    pub dead_letter_exchange: String,
}

impl QueueSpec {
    /// A queue bound with `bindings`, dead letters to [`DEAD_LETTER_EXCHANGE`].
    pub fn new(name: &str, bindings: &[&str], delivery_limit: u32) -> Self {
        Self {
            name: name.to_owned(),
            bindings: bindings.iter().map(|b| (*b).to_owned()).collect(),
            delivery_limit,
            dead_letter_exchange: DEAD_LETTER_EXCHANGE.to_owned(),
        }
    }

    /// The dead-letter queue's name.
    pub fn dead_queue(&self) -> String {
        format!("{}.dead", self.name)
    }
}

/// What a [`Link`] declares on every (re)connection: durable topic
/// exchange(s), and a consumer's queue. Declaring is idempotent; a queue
/// that exists with other arguments is an error the broker names
/// (`PRECONDITION_FAILED`): delete it, or change it with a policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// The durable topic exchange events are published to.
    pub exchange: String,
    /// The consumer's queue, if this link consumes.
    pub queue: Option<QueueSpec>,
}

impl Topology {
    /// Only the exchange (a relay's link).
    pub fn exchange(name: &str) -> Self {
        Self {
            exchange: name.to_owned(),
            queue: None,
        }
    }

    /// With a consumer's queue.
    pub fn with_queue(mut self, queue: QueueSpec) -> Self {
        self.queue = Some(queue);
        self
    }

    /// Declares the exchange, and the queue, its bindings, the dead-letter
    /// exchange and queue.
    pub async fn declare(&self, channel: &Channel) -> Result<(), RabbitError> {
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        channel
            .exchange_declare(
                self.exchange.as_str().into(),
                ExchangeKind::Topic,
                durable,
                FieldTable::default(),
            )
            .await
            .map_err(rabbit_err)?;
        let Some(queue) = &self.queue else {
            return Ok(());
        };
        channel
            .exchange_declare(
                queue.dead_letter_exchange.as_str().into(),
                ExchangeKind::Topic,
                durable,
                FieldTable::default(),
            )
            .await
            .map_err(rabbit_err)?;
        let quorum = |extra: &[(&str, AMQPValue)]| {
            let mut args = FieldTable::default();
            args.insert(
                "x-queue-type".into(),
                AMQPValue::LongString("quorum".into()),
            );
            for (k, v) in extra {
                args.insert((*k).into(), v.clone());
            }
            args
        };
        let durable_queue = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        let dead = queue.dead_queue();
        channel
            .queue_declare(dead.as_str().into(), durable_queue, quorum(&[]))
            .await
            .map_err(rabbit_err)?;
        channel
            .queue_bind(
                dead.as_str().into(),
                queue.dead_letter_exchange.as_str().into(),
                queue.name.as_str().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(rabbit_err)?;
        let args = quorum(&[
            (
                "x-delivery-limit",
                AMQPValue::LongLongInt(i64::from(queue.delivery_limit)),
            ),
            (
                "x-dead-letter-exchange",
                AMQPValue::LongString(queue.dead_letter_exchange.as_str().into()),
            ),
            (
                "x-dead-letter-routing-key",
                AMQPValue::LongString(queue.name.as_str().into()),
            ),
            // Dead-lettered at least once (3.10+): a message moves only
            // once the dead-letter queue has it (needs reject-publish).
            (
                "x-dead-letter-strategy",
                AMQPValue::LongString("at-least-once".into()),
            ),
            ("x-overflow", AMQPValue::LongString("reject-publish".into())),
        ]);
        channel
            .queue_declare(queue.name.as_str().into(), durable_queue, args)
            .await
            .map_err(rabbit_err)?;
        for binding in &queue.bindings {
            channel
                .queue_bind(
                    queue.name.as_str().into(),
                    self.exchange.as_str().into(),
                    binding.as_str().into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(rabbit_err)?;
        }
        Ok(())
    }
}

/// A connection and a confirm-mode channel to RabbitMQ, opened on first use
/// and again whenever the last one was lost, with the [`Topology`] declared
/// each time.
pub struct Link {
    url: String,
    name: String,
    topology: Topology,
    open: Mutex<Option<(Connection, Channel)>>,
}

impl std::fmt::Debug for Link {
    // The URL may hold a password: it is left out.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("name", &self.name)
            .field("topology", &self.topology)
            .finish_non_exhaustive()
    }
}

impl Link {
    /// A link to `url` (checked by [`check_url`]), named `name` in the
    /// broker's connection list. Nothing is opened yet.
    pub fn new(url: &str, name: &str, topology: Topology) -> Result<Self, RabbitError> {
        check_url(url)?;
        Ok(Self {
            url: url.to_owned(),
            name: name.to_owned(),
            topology,
            open: Mutex::new(None),
        })
    }

    /// What it declares.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// The open channel, or a new one (connecting and declaring first) when
    /// there is none or the last was lost.
    pub async fn channel(&self) -> Result<Channel, RabbitError> {
        let mut open = self.open.lock().await;
        if let Some((conn, channel)) = open.as_ref()
            && conn.status().connected()
            && channel.status().connected()
        {
            return Ok(channel.clone());
        }
        if let Some((conn, _)) = open.take() {
            // Whatever is left of it: a close that fails changes nothing.
            let _ = tokio::time::timeout(Duration::from_secs(1), conn.close(0, "reopening".into()))
                .await;
        }
        let opened = tokio::time::timeout(IO_TIMEOUT, self.connect())
            .await
            .map_err(|_| {
                rabbit_err(format!("no connection to RabbitMQ within {IO_TIMEOUT:?}"))
            })??;
        let channel = opened.1.clone();
        *open = Some(opened);
        Ok(channel)
    }

    async fn connect(&self) -> Result<(Connection, Channel), RabbitError> {
        let properties =
            ConnectionProperties::default().with_connection_name(self.name.as_str().into());
        let conn = Connection::connect(&self.url, properties)
            .await
            .map_err(rabbit_err)?;
        let channel = conn.create_channel().await.map_err(rabbit_err)?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(rabbit_err)?;
        self.topology.declare(&channel).await?;
        Ok((conn, channel))
    }

    /// Whether a connection is open right now.
    pub async fn is_connected(&self) -> bool {
        self.open
            .lock()
            .await
            .as_ref()
            .is_some_and(|(conn, channel)| {
                conn.status().connected() && channel.status().connected()
            })
    }

    /// Readiness: a channel is open (or opens) and the exchange exists,
    /// within `within`.
    pub async fn check(&self, within: Duration) -> Result<(), RabbitError> {
        let check = async {
            let channel = self.channel().await?;
            channel
                .exchange_declare(
                    self.topology.exchange.as_str().into(),
                    ExchangeKind::Topic,
                    ExchangeDeclareOptions {
                        passive: true,
                        ..ExchangeDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await
                .map_err(rabbit_err)
        };
        tokio::time::timeout(within, check)
            .await
            .map_err(|_| rabbit_err(format!("RabbitMQ did not answer within {within:?}")))?
    }

    /// Forgets the connection after a failure on it (an error, a confirm
    /// that never came): the next [`Link::channel`] opens a new one. A
    /// connection whose broker was killed can look open to the client until
    /// it writes; this is how a link stops trusting it.
    pub async fn reset(&self) {
        self.close().await;
    }

    /// Closes the connection, if one is open.
    pub async fn close(&self) {
        if let Some((conn, _)) = self.open.lock().await.take() {
            let _ =
                tokio::time::timeout(Duration::from_secs(1), conn.close(200, "bye".into())).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_without_repeating_them() {
        assert!(check_url("amqp://guest:guest@127.0.0.1:5672/%2f").is_ok());
        assert!(check_url("amqps://u:p@broker.example:5671/prod").is_ok());
        assert!(check_url("amqp://127.0.0.1").is_ok());
        for bad in [
            "nats://u:hunter2@127.0.0.1:4222",
            "amqp://u:hunter2@127.0.0.1:notaport/",
            "http://u:hunter2@x/",
            "",
            "amqp://",
            "amqp:///%2f",
            "amqp://u:hunter2@:5672/%2f",
            "amqp://u:hunter2@a:5672,amqp://b:5672/%2f",
            "amqp://guest:123/hunter2@127.0.0.1:5672/%2f",
        ] {
            let e = check_url(bad).expect_err(bad).to_string();
            assert!(!e.contains("hunter2"), "{e}");
            assert!(e.contains("RabbitMQ URL"), "{e}");
        }
    }

    #[test]
    fn a_link_debug_holds_no_password() {
        let link = Link::new("amqp://u:hunter2@127.0.0.1/", "x", Topology::exchange("e"))
            .expect("a valid URL");
        assert!(!format!("{link:?}").contains("hunter2"));
    }
}
