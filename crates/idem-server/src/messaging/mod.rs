//! The demo's messaging on any of the brokers: the payment events relayed
//! from the outbox, and the ledger consumer. `--broker-url` names the
//! broker by its scheme ([`BrokerUrl`]); [`nats`] and [`rabbit`] hold what
//! each one needs.

use std::sync::Arc;
use std::time::Duration;

use idem_core::KeyStore;
use idem_core::inbox::{InboxStore, Subscriber};
use idem_core::outbox::{OutboxStore, Wake};
use idem_inbox::{Consumer, ConsumerConfig, Handler, Inbox, MessageSource};
use idem_outbox::{Dispatcher, DispatcherConfig, Publisher};
use tokio::sync::watch;

use crate::admin::outbox::RelaySlot;
use crate::shutdown::stopped;

pub mod kafka;
pub mod nats;
pub mod rabbit;

pub use nats::{DLQ_STREAM, DLQ_SUBJECT, DLQ_SUBJECTS, DUPLICATE_WINDOW, STREAM, SUBJECTS};

/// The ledger consumer: its inbox subscriber, and its durable consumer
/// (NATS) or queue (RabbitMQ).
pub const SUBSCRIBER: &str = "demo-ledger";

/// The longest `--broker-url` accepted.
const MAX_URL_LEN: usize = 1024;

/// A broker, by the scheme of its URL (`--broker-url`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BrokerUrl {
    /// `nats://` or `tls://`, one server or a comma-separated list.
    Nats(String),
    /// `amqp://` or `amqps://`: RabbitMQ.
    Rabbit(String),
    /// `kafka://host:port[,host:port]`.
    Kafka(String),
}

impl BrokerUrl {
    /// Checks `url` (as `flag` names it in an error): a known scheme and a
    /// URL of that broker that parses. The error is one line and never
    /// repeats the URL (it may hold a password).
    pub fn parse(url: &str, flag: &str) -> anyhow::Result<Self> {
        if url.len() > MAX_URL_LEN {
            anyhow::bail!("{flag}: longer than {MAX_URL_LEN} bytes");
        }
        let scheme = url.split_once("://").map_or("", |(s, _)| s);
        match scheme {
            "nats" | "tls" => {
                idem_nats::servers(url).map_err(|e| anyhow::anyhow!("{flag}: {e}"))?;
                Ok(Self::Nats(url.to_owned()))
            }
            "amqp" | "amqps" => {
                idem_rabbitmq::check_url(url).map_err(|e| anyhow::anyhow!("{flag}: {e}"))?;
                Ok(Self::Rabbit(url.to_owned()))
            }
            "kafka" => {
                idem_kafka::bootstrap_servers(url).map_err(|e| anyhow::anyhow!("{flag}: {e}"))?;
                Ok(Self::Kafka(url.to_owned()))
            }
            _ => anyhow::bail!(
                "{flag}: not a broker URL: expected nats:// or tls:// (NATS), amqp:// or amqps:// \
                 (RabbitMQ), kafka:// (Kafka)"
            ),
        }
    }

    /// The broker's name, as logs and `/readyz` say it.
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

/// A broker this process is connected to.
#[derive(Debug, Clone)]
pub enum Broker {
    /// NATS JetStream, its streams ready.
    Nats(Box<idem_nats::Context>),
    /// RabbitMQ, the exchange declared.
    Rabbit(Arc<idem_rabbitmq::Link>),
    /// Kafka, the topics there.
    Kafka(Box<idem_kafka::Kafka>),
}

/// Connects to `url` as `name` and makes what the relay needs (NATS: the
/// streams, with `replicas` copies when created; RabbitMQ: the exchange),
/// retrying until it holds or `shutdown` (`Ok(None)`).
pub async fn connect(
    url: &BrokerUrl,
    name: &str,
    replicas: usize,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<Option<Broker>> {
    Ok(match url {
        BrokerUrl::Nats(u) => nats::prepare(u, name, replicas, shutdown)
            .await?
            .map(|js| Broker::Nats(Box::new(js))),
        BrokerUrl::Rabbit(u) => rabbit::connect(u, name, rabbit::relay_topology(), shutdown)
            .await?
            .map(|link| Broker::Rabbit(Arc::new(link))),
        BrokerUrl::Kafka(u) => kafka::connect(u, shutdown)
            .await?
            .map(|k| Broker::Kafka(Box::new(k))),
    })
}

/// Runs the relay from `store`'s outbox to `broker` until `shutdown`,
/// putting it in `slot` (the admin API reads its figures there) and, with
/// `report`, logging its figures every 30 s.
#[allow(clippy::too_many_arguments)]
pub async fn relay<S: OutboxStore + KeyStore>(
    store: S,
    broker: Broker,
    poll_interval: Duration,
    lease: Duration,
    wake: impl Wake,
    slot: RelaySlot<S>,
    report: bool,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let config = DispatcherConfig {
        poll_interval,
        lease,
        ..DispatcherConfig::default()
    };
    match broker {
        Broker::Nats(js) => {
            let publisher = idem_nats::NatsPublisher::new(*js);
            run_relay(store, publisher, config, wake, slot, report, shutdown).await
        }
        Broker::Rabbit(link) => {
            let publisher = idem_rabbitmq::RabbitPublisher::new(link, rabbit::EXCHANGE);
            run_relay(store, publisher, config, wake, slot, report, shutdown).await
        }
        Broker::Kafka(k) => {
            let publisher = kafka::publisher(&k)?;
            run_relay(store, publisher, config, wake, slot, report, shutdown).await
        }
    }
}

async fn run_relay<S: OutboxStore + KeyStore, P: Publisher>(
    store: S,
    publisher: P,
    config: DispatcherConfig,
    wake: impl Wake,
    slot: RelaySlot<S>,
    report: bool,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let clock = store.clock();
    let d = Arc::new(Dispatcher::with_clock(store, publisher, config, clock)?);
    let _ = slot.set(d.clone());
    let reporter = report.then(|| {
        let d = d.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(30));
            tick.tick().await;
            loop {
                tick.tick().await;
                if let Ok(s) = d.stats().await {
                    tracing::info!(figures = %crate::admin::outbox::stats_json(&s), "outbox");
                }
            }
        })
    });
    tracing::info!("relay publishing the outbox");
    d.run(wake, stopped(shutdown)).await;
    if let Some(r) = reporter {
        r.abort();
    }
    Ok(())
}

/// Settings of the ledger consumer.
#[derive(Debug, Clone)]
pub struct ConsumeConfig {
    /// Redelivery after this long without an ack (NATS).
    pub ack_wait: Duration,
    /// Deliveries before a failing message is dead-lettered (RabbitMQ: the
    /// queue's delivery limit too).
    pub max_deliver: u32,
}

/// The ledger consumer on `broker` until `shutdown`: binds its source
/// (retrying while the broker is not ready), then applies events through
/// the inbox.
pub async fn consume<S, H>(
    store: S,
    broker: Broker,
    url: &BrokerUrl,
    handler: H,
    config: ConsumeConfig,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()>
where
    S: InboxStore,
    H: Handler<S::Tx>,
{
    match broker {
        Broker::Nats(js) => {
            let Some(source) = nats::source(*js, config.ack_wait, shutdown.clone()).await else {
                return Ok(());
            };
            run_consumer(store, source, handler, &config, shutdown).await
        }
        Broker::Rabbit(_) => {
            let source = rabbit::source(url.as_str(), config.max_deliver, shutdown.clone());
            let Some(source) = source.await? else {
                return Ok(());
            };
            run_consumer(store, source, handler, &config, shutdown).await
        }
        Broker::Kafka(k) => {
            let source = kafka::source(&k, store.clone()).await?;
            run_consumer(store, source, handler, &config, shutdown).await
        }
    }
}

async fn run_consumer<S, Src, H>(
    store: S,
    source: Src,
    handler: H,
    config: &ConsumeConfig,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()>
where
    S: InboxStore,
    Src: MessageSource,
    H: Handler<S::Tx>,
{
    let subscriber = Subscriber::new(SUBSCRIBER)?;
    let consumer_config = ConsumerConfig {
        max_deliver: u64::from(config.max_deliver),
        // Given up before the broker redelivers it anyway.
        handler_timeout: (config.ack_wait * 3 / 4).max(Duration::from_millis(500)),
        ..ConsumerConfig::default()
    };
    let mut consumer = Consumer::new(
        source,
        Inbox::new(store),
        subscriber,
        handler,
        consumer_config,
    )?;
    tracing::info!(subscriber = SUBSCRIBER, "consuming payment events");
    consumer
        .run(Duration::from_secs(3600), stopped(shutdown))
        .await;
    Ok(())
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

pub use idem_core::without_credentials;

#[cfg(test)]
mod tests {
    use super::BrokerUrl;

    #[test]
    fn broker_urls_are_known_by_their_scheme_and_errors_hold_no_password() {
        let f = "--broker-url";
        assert_eq!(
            BrokerUrl::parse("nats://a:4222,nats://b:4222", f)
                .unwrap()
                .name(),
            "nats"
        );
        assert_eq!(
            BrokerUrl::parse("amqp://u:p@127.0.0.1:5672/%2f", f)
                .unwrap()
                .name(),
            "rabbitmq"
        );
        for bad in [
            "redis://u:hunter2@127.0.0.1:6379",
            "amqp://u:hunter2@127.0.0.1:notaport/",
            "nats://u:hunter2@127.0.0.1:4222,,",
            "u:hunter2@127.0.0.1",
            "kafka://u:hunter2@127.0.0.1:9092",
        ] {
            let e = format!("{:#}", BrokerUrl::parse(bad, f).unwrap_err());
            assert!(e.starts_with("--broker-url: "), "{e}");
            assert!(!e.contains("hunter2") && !e.contains('\n'), "{e}");
        }
    }
}
