//! # Idem on NATS JetStream
//!
//! - [`NatsPublisher`] implements [`idem_outbox::Publisher`]: it publishes an
//!   outbox message to its topic (the subject) with `Nats-Msg-Id` set to the
//!   message id, waits for the stream's acknowledgement, and counts a
//!   duplicate acknowledgement as success.
//! - [`NatsSource`] implements [`idem_inbox::MessageSource`] over a durable
//!   pull consumer with explicit acks: ack after commit, nak with a delay,
//!   term after a dead-letter, which is published to a dead-letter subject with
//!   the reason in `Idem-Dead-Reason`. The broker's own delivery limit is off:
//!   giving up is the consumer's decision, so a message is never dropped
//!   without a dead letter.
//! - [`ensure_stream`] / [`ensure_stream_with`] create a stream with a
//!   duplicate window (and, in a JetStream cluster, its replica count) or
//!   update an existing one's subjects and window.
//! - [`stream_quorum`] says whether a stream's copies have a majority live
//!   (the leader and followers heard from within [`FOLLOWER_SILENCE`]) and
//!   how long that answer holds: what a relay's readiness asks.
//!
//! Messages carry `Idem-Message-Id` (and `Idem-Message-Key`, the ordering
//! key); consumers read the id from it, falling back to `Nats-Msg-Id`.
//!
//! ```no_run
//! # async fn wire(store: idem_postgres::PgStore) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use idem_nats::{NatsPublisher, NatsSource, SourceConfig};
//! use idem_outbox::{Dispatcher, DispatcherConfig};
//!
//! let js = idem_nats::connect("nats://127.0.0.1:4222", "orders", true).await?;
//! idem_nats::ensure_stream(&js, "ORDERS", &["orders.>"], Duration::from_secs(300)).await?;
//! // The relay: outbox → JetStream, waking on NOTIFY, polling as a fallback.
//! let relay = Dispatcher::new(store.clone(), NatsPublisher::new(js.clone()), DispatcherConfig::default())?;
//! let wake = store.dialect().outbox_listener().await;
//! tokio::spawn(async move { relay.run(wake, std::future::pending()).await });
//! // A consumer's source: a durable pull consumer; give it to `idem_inbox::Consumer`.
//! let _source = NatsSource::new(js, SourceConfig {
//!     stream: "ORDERS".into(),
//!     durable: "billing".into(),
//!     filter_subject: "orders.shipped".into(),
//!     ack_wait: Duration::from_secs(30),
//!     dead_letter_subject: "dlq.billing".into(),
//! }).await?;
//! # Ok(()) }
//! ```

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, pull};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, AckKind};
use futures_util::StreamExt;
use idem_core::BoxError;
use idem_core::outbox::{MessageId, OutboxRecord};
use idem_inbox::{Delivery, InboxMessage, MessageSource, SourceError};
use idem_outbox::{PublishError, Published, Publisher};

pub use async_nats::jetstream::Context;
pub use quorum::{FOLLOWER_SILENCE, StreamQuorum, stream_has_quorum, stream_quorum};

mod quorum;

/// Header with the producer's message id.
pub const MESSAGE_ID: &str = "Idem-Message-Id";
/// Header with the producer's ordering key.
pub const MESSAGE_KEY: &str = "Idem-Message-Key";
/// The headers [`NatsPublisher`] sets on every message itself: an outbox
/// message bound for NATS may not carry them. Build its headers with
/// [`OutboxMessage::header_except`](idem_core::outbox::OutboxMessage::header_except):
///
/// ```
/// use idem_core::outbox::{MessageError, OutboxMessage, Topic};
/// let m = OutboxMessage::new(Topic::new("orders.shipped")?, "order-7", b"{}".to_vec())?;
/// let m = m.header_except("trace-id", "abc", idem_nats::RESERVED_HEADERS)?;
/// assert!(matches!(
///     m.header_except("Nats-Msg-Id", "x", idem_nats::RESERVED_HEADERS),
///     Err(MessageError::ReservedHeader(_))
/// ));
/// # Ok::<(), MessageError>(())
/// ```
pub const RESERVED_HEADERS: &[&str] = &["Nats-Msg-Id", MESSAGE_ID, MESSAGE_KEY];
/// Header with the reason a message was dead-lettered.
pub const DEAD_REASON: &str = "Idem-Dead-Reason";
/// Header with the subject a dead-lettered message came from.
pub const ORIGINAL_SUBJECT: &str = "Idem-Original-Subject";

/// A NATS failure.
#[derive(Debug, thiserror::Error)]
#[error("nats: {0}")]
pub struct NatsError(#[source] pub BoxError);

fn nats_err(e: impl Into<BoxError>) -> NatsError {
    NatsError(e.into())
}

/// Connects to `url`: one server, or the servers of a cluster separated by
/// commas (`nats://a:4222,nats://b:4222`), of which the client uses one
/// and moves to another when it is lost. With `retry`, the client keeps
/// trying in the background when no server is up yet, so a relay started
/// before its broker recovers by itself.
pub async fn connect(url: &str, name: &str, retry: bool) -> Result<Context, NatsError> {
    let servers = servers(url)?;
    let mut options = async_nats::ConnectOptions::new()
        .name(name)
        .connection_timeout(Duration::from_secs(5));
    if retry {
        options = options.retry_on_initial_connect();
    }
    let client = options.connect(servers).await.map_err(nats_err)?;
    Ok(jetstream::new(client))
}

/// The servers of `url` (one, or several separated by commas), each
/// checked: not empty, a `nats://` or `tls://` URL that parses. The error
/// never repeats the text of a server (it may hold a password).
pub fn servers(url: &str) -> Result<Vec<&str>, NatsError> {
    let servers: Vec<&str> = url.split(',').map(str::trim).collect();
    for (i, server) in servers.iter().enumerate() {
        let n = i + 1;
        if server.is_empty() {
            return Err(nats_err(
                "an empty server in the NATS URL list (two commas, or one at an end)",
            ));
        }
        if !(server.starts_with("nats://") || server.starts_with("tls://")) {
            return Err(nats_err(format!(
                "server {n} of the NATS URL list is not a nats:// or tls:// URL"
            )));
        }
        if let Err(e) = server.parse::<async_nats::ServerAddr>() {
            return Err(nats_err(format!(
                "server {n} of the NATS URL list is not a valid URL: {e}"
            )));
        }
    }
    Ok(servers)
}

/// Whether the client behind `js` is connected to a server right now (a
/// client from [`connect`] with `retry` keeps trying in the background).
pub fn is_connected(js: &Context) -> bool {
    js.client().connection_state() == async_nats::connection::State::Connected
}

/// Creates the stream (one replica), or updates its subjects and duplicate
/// window; [`ensure_stream_with`] with [`StreamSettings::new`]. The window must
/// be longer than the outbox lease, so a message republished after a
/// dispatcher crash is dropped by the broker too.
pub async fn ensure_stream(
    js: &Context,
    name: &str,
    subjects: &[&str],
    duplicate_window: Duration,
) -> Result<(), NatsError> {
    ensure_stream_with(js, name, subjects, &StreamSettings::new(duplicate_window))
        .await
        .map(drop)
}

/// How [`ensure_stream_with`] creates a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamSettings {
    /// How long the stream remembers a `Nats-Msg-Id` to drop a republished
    /// copy: longer than the outbox lease.
    pub duplicate_window: Duration,
    /// Copies of the stream, on as many servers of a JetStream cluster (1
    /// on a single server; 3 in a three-node cluster, where the stream, its
    /// duplicate window and its consumers survive the loss of one node).
    /// Applied when the stream is created; an existing stream keeps its own.
    pub replicas: usize,
}

impl StreamSettings {
    /// One replica and this duplicate window.
    pub fn new(duplicate_window: Duration) -> Self {
        Self {
            duplicate_window,
            replicas: 1,
        }
    }

    /// The largest replica count JetStream accepts.
    pub const MAX_REPLICAS: usize = 5;
}

/// What [`ensure_stream_with`] found or made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamReady {
    /// The stream did not exist and was created.
    pub created: bool,
    /// Its replica count now (an existing stream's own, which may differ
    /// from the one asked for).
    pub replicas: usize,
}

/// Creates the stream with `settings`, or brings an existing one's subjects
/// and duplicate window to them, keeping everything else it has (its replica
/// count, limits, storage: an operator's choices are not reset). An
/// existing stream whose subjects and window already match is not updated.
pub async fn ensure_stream_with(
    js: &Context,
    name: &str,
    subjects: &[&str],
    settings: &StreamSettings,
) -> Result<StreamReady, NatsError> {
    if !(1..=StreamSettings::MAX_REPLICAS).contains(&settings.replicas) {
        return Err(nats_err(format!(
            "stream replicas must be 1 to {}, not {}",
            StreamSettings::MAX_REPLICAS,
            settings.replicas
        )));
    }
    let subjects: Vec<String> = subjects.iter().map(|s| (*s).to_owned()).collect();
    match js.get_stream(name).await {
        // `get_stream` fetched the stream's info already.
        Ok(stream) => {
            let mut config = stream.cached_info().config.clone();
            let replicas = config.num_replicas.max(1);
            if config.subjects != subjects || config.duplicate_window != settings.duplicate_window {
                config.subjects = subjects;
                config.duplicate_window = settings.duplicate_window;
                js.update_stream(config).await.map_err(nats_err)?;
            }
            Ok(StreamReady {
                created: false,
                replicas,
            })
        }
        Err(e)
            if matches!(
                e.kind(),
                jetstream::context::GetStreamErrorKind::JetStream(ref j)
                    if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND
            ) =>
        {
            create(js, name, subjects, settings).await
        }
        Err(e) => Err(nats_err(e)),
    }
}

async fn create(
    js: &Context,
    name: &str,
    subjects: Vec<String>,
    settings: &StreamSettings,
) -> Result<StreamReady, NatsError> {
    let config = jetstream::stream::Config {
        name: name.to_owned(),
        subjects,
        duplicate_window: settings.duplicate_window,
        num_replicas: settings.replicas,
        ..Default::default()
    };
    match js.create_stream(config).await {
        Ok(_) => Ok(StreamReady {
            created: true,
            replicas: settings.replicas,
        }),
        Err(e)
            if matches!(
                e.kind(),
                jetstream::context::CreateStreamErrorKind::JetStream(ref j)
                    if j.error_code() == jetstream::ErrorCode::STREAM_REPLICAS_NOT_SUPPORTED
            ) =>
        {
            Err(nats_err(ReplicasUnsupported {
                stream: name.to_owned(),
                replicas: settings.replicas,
            }))
        }
        Err(e) => Err(nats_err(e)),
    }
}

/// A stream was asked for more than one replica from a NATS server that
/// is not in a JetStream cluster: a setting to change, not a state to wait
/// out. [`ensure_stream_with`] returns it as its error's source
/// (`error.0.downcast_ref::<ReplicasUnsupported>()`).
#[derive(Debug, thiserror::Error)]
#[error(
    "stream {stream}: {replicas} replicas asked, but this NATS server is not in a JetStream \
     cluster (ask for 1, or run a cluster)"
)]
pub struct ReplicasUnsupported {
    /// The stream.
    pub stream: String,
    /// The replicas asked for.
    pub replicas: usize,
}

/// Publishes outbox messages to JetStream.
#[derive(Debug, Clone)]
pub struct NatsPublisher {
    js: Context,
}

impl NatsPublisher {
    /// A publisher on `js`.
    pub fn new(js: Context) -> Self {
        Self { js }
    }
}

fn classify(kind: async_nats::jetstream::context::PublishErrorKind, e: BoxError) -> PublishError {
    use async_nats::jetstream::context::PublishErrorKind as K;
    match kind {
        // JetStream answered 503 (insufficient resources, system temporarily
        // unavailable, …): the broker's state, not the message's fault.
        K::Other if jetstream_unavailable(&*e) => PublishError::Unavailable { source: e },
        // The message itself is at fault: counts as an attempt.
        K::MaxPayloadExceeded | K::Other => PublishError::Rejected {
            reason: e.to_string(),
        },
        // The broker, its stream or the network: wait without an attempt.
        _ => PublishError::Unavailable { source: e },
    }
}

/// Whether `e` or one of its sources is a JetStream API error with status
/// 503 (the service is unavailable).
fn jetstream_unavailable(e: &(dyn std::error::Error + Send + Sync + 'static)) -> bool {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = next {
        if let Some(js) = err.downcast_ref::<jetstream::Error>() {
            return js.code() == 503;
        }
        next = err.source();
    }
    false
}

impl Publisher for NatsPublisher {
    async fn publish(&self, record: &OutboxRecord) -> Result<Published, PublishError> {
        let mut headers = HeaderMap::new();
        for (name, value) in &record.headers {
            headers.append(name.as_str(), value.as_str());
        }
        headers.insert(MESSAGE_ID, record.message_id.as_str());
        headers.insert(MESSAGE_KEY, record.key.as_str());
        let message = PublishMessage::build()
            .payload(bytes::Bytes::copy_from_slice(&record.payload))
            .headers(headers)
            .message_id(record.message_id.as_str());
        let ack = self
            .js
            .send_publish(record.topic.as_str().to_owned(), message)
            .await
            .map_err(|e| classify(e.kind(), e.into()))?
            .await
            .map_err(|e| classify(e.kind(), e.into()))?;
        Ok(Published {
            duplicate: ack.duplicate,
            sequence: Some(ack.sequence),
        })
    }
}

/// Settings of a durable pull consumer.
#[derive(Debug, Clone)]
pub struct SourceConfig {
    /// The stream.
    pub stream: String,
    /// The durable consumer's name (one per subscriber).
    pub durable: String,
    /// Subjects it receives (empty: all of the stream).
    pub filter_subject: String,
    /// Redelivery after this long without an ack.
    pub ack_wait: Duration,
    /// Where dead letters go (a subject bound to a stream).
    pub dead_letter_subject: String,
}

/// A durable pull consumer as an [`idem_inbox::MessageSource`].
#[derive(Debug)]
pub struct NatsSource {
    js: Context,
    consumer: jetstream::consumer::Consumer<pull::Config>,
    dead_letter_subject: String,
}

impl NatsSource {
    /// Creates (or binds to) the durable consumer.
    pub async fn new(js: Context, config: SourceConfig) -> Result<Self, NatsError> {
        let stream = js.get_stream(&config.stream).await.map_err(nats_err)?;
        let consumer = stream
            .get_or_create_consumer(
                &config.durable,
                pull::Config {
                    durable_name: Some(config.durable.clone()),
                    ack_policy: AckPolicy::Explicit,
                    deliver_policy: DeliverPolicy::All,
                    ack_wait: config.ack_wait,
                    // The server never gives up on a message: with a limit,
                    // a consumer in a crash loop (each crash a delivery of the
                    // whole fetched batch) would exhaust it and the message
                    // would be dropped without anyone seeing it fail. The
                    // consumer dead-letters by itself instead.
                    max_deliver: -1,
                    filter_subject: config.filter_subject.clone(),
                    ..Default::default()
                },
            )
            .await
            .map_err(nats_err)?;
        Ok(Self {
            js,
            consumer,
            dead_letter_subject: config.dead_letter_subject,
        })
    }
}

/// One message from JetStream.
#[derive(Debug)]
pub struct NatsDelivery(jetstream::Message);

fn source_err(e: impl Into<BoxError>) -> SourceError {
    SourceError { source: e.into() }
}

impl Delivery for NatsDelivery {
    fn message(&self) -> Result<InboxMessage, String> {
        let m = &self.0;
        let header = |name: &str| {
            m.headers
                .as_ref()
                .and_then(|h| h.get(name))
                .map(|v| v.as_str().to_owned())
        };
        let id = header(MESSAGE_ID)
            .or_else(|| header("Nats-Msg-Id"))
            .ok_or("no Idem-Message-Id or Nats-Msg-Id header")?;
        let message_id = MessageId::new(id).map_err(|e| e.to_string())?;
        let info = m
            .info()
            .map_err(|e| format!("no JetStream metadata: {e}"))?;
        let headers = m
            .headers
            .iter()
            .flat_map(|h| h.iter())
            .filter(|(n, _)| {
                let n = n.to_string();
                !n.eq_ignore_ascii_case(MESSAGE_ID)
                    && !n.eq_ignore_ascii_case(MESSAGE_KEY)
                    && !n.eq_ignore_ascii_case("Nats-Msg-Id")
            })
            .flat_map(|(n, vs)| {
                vs.iter()
                    .map(move |v| (n.to_string(), v.as_str().to_owned()))
            })
            .collect();
        Ok(InboxMessage {
            message_id,
            subject: m.subject.to_string(),
            key: header(MESSAGE_KEY),
            payload: m.payload.to_vec(),
            headers,
            delivered: u64::try_from(info.delivered).unwrap_or(1),
            stream_sequence: info.stream_sequence,
        })
    }

    async fn ack(&self) -> Result<(), SourceError> {
        self.0.ack().await.map_err(source_err)
    }

    async fn nak(&self, delay: Duration) -> Result<(), SourceError> {
        self.0
            .ack_with(AckKind::Nak(Some(delay)))
            .await
            .map_err(source_err)
    }

    async fn term(&self) -> Result<(), SourceError> {
        self.0.ack_with(AckKind::Term).await.map_err(source_err)
    }
}

impl MessageSource for NatsSource {
    type Delivery = NatsDelivery;

    async fn fetch(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<NatsDelivery>, SourceError> {
        let mut batch = self
            .consumer
            .fetch()
            .max_messages(max)
            .expires(wait)
            .messages()
            .await
            .map_err(source_err)?;
        let mut out = Vec::new();
        while let Some(m) = batch.next().await {
            out.push(NatsDelivery(m.map_err(source_err)?));
        }
        Ok(out)
    }

    async fn dead_letter(&self, delivery: &NatsDelivery, reason: &str) -> Result<(), SourceError> {
        let m = &delivery.0;
        let mut headers = m.headers.clone().unwrap_or_default();
        // Header values cannot hold line breaks.
        let reason: String = reason
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        headers.insert(DEAD_REASON, reason.as_str());
        headers.insert(ORIGINAL_SUBJECT, m.subject.as_str());
        let message = PublishMessage::build()
            .payload(m.payload.clone())
            .headers(headers);
        self.js
            .send_publish(self.dead_letter_subject.clone(), message)
            .await
            .map_err(source_err)?
            .await
            .map_err(source_err)?;
        Ok(())
    }
}
