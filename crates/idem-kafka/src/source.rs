//! The consumer's side: one topic in a consumer group, positioned from the
//! offsets stored in Idem's database.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use idem_core::outbox::MessageId;
use idem_core::position::{Position, PositionStore};
use idem_inbox::{Delivery, InboxMessage, MessageSource, SourceError};
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use tokio::time::Instant;

use crate::{
    DEAD_REASON, Kafka, KafkaError, MESSAGE_ID, MESSAGE_KEY, MESSAGE_SUBJECT, ORIGINAL_POSITION,
    RESERVED_HEADERS, kafka_err,
};

/// Settings of a [`KafkaSource`].
#[derive(Debug, Clone)]
pub struct SourceConfig {
    /// The consumer group (`group.id`); positions are stored under it.
    pub group: String,
    /// The topic consumed.
    pub topic: String,
    /// Where dead letters are produced.
    pub dead_letter_topic: String,
    /// How long a dead letter's produce may take.
    pub dead_letter_timeout: Duration,
    /// How long the group may go without hearing from this consumer before
    /// it gives its partitions to others (`session.timeout.ms`).
    pub session_timeout: Duration,
    /// A consumer that has had no assignment this long since it subscribed
    /// or lost its partitions leaves the group and joins again (default
    /// twice the session timeout). A group whose coordinator lost track of
    /// it would otherwise wait forever: Tansu 0.6.0 keeps a member killed
    /// with `kill -9` as the leader when a new member joins before its
    /// session expired, and never assigns anything.
    pub rejoin_after: Duration,
}

impl SourceConfig {
    /// A source of `topic` for `group`, dead letters to `dead_letter_topic`.
    pub fn new(group: &str, topic: &str, dead_letter_topic: &str) -> Self {
        Self {
            group: group.to_owned(),
            topic: topic.to_owned(),
            dead_letter_topic: dead_letter_topic.to_owned(),
            dead_letter_timeout: Duration::from_secs(30),
            session_timeout: Duration::from_secs(10),
            rejoin_after: Duration::from_secs(20),
        }
    }
}

/// How long a consumer without a partition waits before its next rejoin:
/// `base`, doubled for each rejoin since it last held one, at most 16 times
/// `base` (an idle member of a crowded group on a broker that cannot say so
/// rejoins ever more rarely: each rejoin rebalances the whole group).
fn rejoin_wait(base: Duration, rejoins: u32) -> Duration {
    base.saturating_mul(1 << rejoins.min(4))
}

/// What the source knows of one assigned partition.
#[derive(Debug, Clone, Copy, Default)]
struct Lane {
    /// Sought to its stored position since it was assigned.
    positioned: bool,
    /// The lowest offset accepted next (older ones are from before a seek).
    next: i64,
    /// The next record accepted must be exactly `next` (after a retry's
    /// seek back: anything else is from before the seek).
    exact: bool,
    /// A nak'd record to deliver again (offset, when): the partition is
    /// paused until then.
    retry: Option<(i64, Instant)>,
}

#[derive(Debug, Default)]
struct State {
    lanes: HashMap<i32, Lane>,
    /// Retries asked in this process, by (partition, offset).
    naks: HashMap<(i32, i64), u64>,
    /// Since when the consumer has held no partition of its topic (since
    /// it subscribed, lost its partitions or was given none); `None` while
    /// it holds some.
    unassigned_since: Option<Instant>,
    /// Rejoins since the consumer last held a partition (each doubles the
    /// wait before the next).
    rejoins: u32,
}

#[derive(Debug, Default)]
struct Shared {
    topic: String,
    state: Mutex<State>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding it cannot leave the maps half-written in a
        // way that matters more than stopping would.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The consumer's context: records assignments and revocations; the
/// source positions newly assigned partitions before it hands out any of
/// their records.
struct Context(Arc<Shared>);

impl ClientContext for Context {}

impl ConsumerContext for Context {
    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let mut state = self.0.state();
        match rebalance {
            Rebalance::Assign(tpl) => {
                let mine = tpl.elements().iter().any(|e| e.topic() == self.0.topic);
                if mine {
                    state.unassigned_since = None;
                    state.rejoins = 0;
                } else {
                    state.unassigned_since.get_or_insert_with(Instant::now);
                }
                for e in tpl.elements() {
                    if e.topic() == self.0.topic {
                        state.lanes.insert(e.partition(), Lane::default());
                        tracing::info!(partition = e.partition(), "partition assigned");
                    }
                }
            }
            Rebalance::Revoke(tpl) => {
                state.unassigned_since.get_or_insert_with(Instant::now);
                for e in tpl.elements() {
                    if e.topic() == self.0.topic {
                        let p = e.partition();
                        state.lanes.remove(&p);
                        state.naks.retain(|(q, _), _| *q != p);
                        tracing::info!(partition = p, "partition revoked");
                    }
                }
            }
            Rebalance::Error(e) => tracing::warn!(error = %e, "rebalance failed"),
        }
    }
}

/// One topic of a consumer group as an [`idem_inbox::MessageSource`],
/// positioned from Idem's database.
pub struct KafkaSource<S> {
    consumer: Arc<StreamConsumer<Context>>,
    producer: FutureProducer,
    store: S,
    shared: Arc<Shared>,
    config: SourceConfig,
}

impl<S> std::fmt::Debug for KafkaSource<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSource")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Whether a consumer error is the client's connection to a broker coming
/// and going (which librdkafka mends itself).
fn transient(e: &rdkafka::error::KafkaError) -> bool {
    use rdkafka::error::{KafkaError as K, RDKafkaErrorCode as C};
    matches!(
        e,
        K::MessageConsumption(
            C::BrokerTransportFailure | C::AllBrokersDown | C::BrokerNotAvailable
        )
    )
}

impl<S: PositionStore + Clone> KafkaSource<S> {
    /// Joins `config.group` on `config.topic`; positions are read from and
    /// (by the consumer) written to `store`.
    pub async fn new(kafka: &Kafka, store: S, config: SourceConfig) -> Result<Self, KafkaError> {
        let shared = Arc::new(Shared {
            topic: config.topic.clone(),
            state: Mutex::new(State {
                unassigned_since: Some(Instant::now()),
                ..State::default()
            }),
        });
        let mut c = kafka.config.clone();
        c.set("group.id", &config.group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            // A partition without a stored position starts at its beginning
            // (the source seeks it there itself).
            .set("auto.offset.reset", "earliest")
            .set(
                "session.timeout.ms",
                config.session_timeout.as_millis().to_string(),
            );
        let consumer: StreamConsumer<Context> = c
            .create_with_context(Context(shared.clone()))
            .map_err(kafka_err)?;
        consumer.subscribe(&[&config.topic]).map_err(kafka_err)?;
        let producer: FutureProducer = kafka
            .config
            .clone()
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .create()
            .map_err(kafka_err)?;
        Ok(Self {
            consumer: Arc::new(consumer),
            producer,
            store,
            shared,
            config,
        })
    }

    /// Leaves the group and joins again when this consumer has held no
    /// partition for [`SourceConfig::rejoin_after`] (doubled after each
    /// rejoin without a partition, up to 16 times), unless the group has more
    /// members than the topic has partitions: each member of a group with no
    /// more gets one, so the group's coordinator lost track of this one.
    async fn rejoin_when_forgotten(&self) -> Result<(), SourceError> {
        let waited = {
            let mut state = self.shared.state();
            let after = rejoin_wait(self.config.rejoin_after, state.rejoins);
            match state.unassigned_since {
                Some(since) if since.elapsed() >= after => {
                    state.unassigned_since = Some(Instant::now());
                    since.elapsed()
                }
                _ => return Ok(()),
            }
        };
        let crowded = self.crowded().await;
        if crowded == Some(true) {
            // More members than partitions: holding none is this member's lot.
            return Ok(());
        }
        let rejoins = {
            let mut state = self.shared.state();
            state.rejoins = state.rejoins.saturating_add(1);
            state.rejoins
        };
        tracing::warn!(
            group = %self.config.group,
            waited_ms = waited.as_millis() as u64,
            group_size_known = crowded.is_some(),
            next_after_ms = rejoin_wait(self.config.rejoin_after, rejoins).as_millis() as u64,
            "no partition from the group; leaving it and joining again"
        );
        self.consumer.unsubscribe();
        self.consumer
            .subscribe(&[&self.config.topic])
            .map_err(source_err)
    }

    /// Whether the group has more members than the topic has partitions,
    /// as the broker says within two seconds; `None` when it does not say
    /// (Tansu 0.6.0 answers no `DescribeGroups`).
    async fn crowded(&self) -> Option<bool> {
        let consumer = self.consumer.clone();
        let (group, topic) = (self.config.group.clone(), self.config.topic.clone());
        let asked = tokio::task::spawn_blocking(move || {
            let wait = Duration::from_secs(2);
            let groups = consumer.fetch_group_list(Some(&group), wait).ok()?;
            let members = groups.groups().first()?.members().len();
            let metadata = consumer.fetch_metadata(Some(&topic), wait).ok()?;
            let partitions = metadata.topics().first()?.partitions().len();
            Some(members > partitions)
        });
        asked.await.ok().flatten()
    }

    /// The partitions assigned to this consumer now.
    pub fn assigned(&self) -> Vec<i32> {
        let mut p: Vec<i32> = self.shared.state().lanes.keys().copied().collect();
        p.sort_unstable();
        p
    }

    /// Seeks every newly assigned partition to its stored offset + 1 (its
    /// beginning without one). A failed seek is tried again at the next
    /// call; the partition's records are not handed out meanwhile.
    async fn position_lanes(&self) -> Result<(), SourceError> {
        let waiting: Vec<i32> = {
            let state = self.shared.state();
            state
                .lanes
                .iter()
                .filter(|(_, l)| !l.positioned)
                .map(|(p, _)| *p)
                .collect()
        };
        if waiting.is_empty() {
            return Ok(());
        }
        let stored = self
            .store
            .positions(&self.config.group, &self.config.topic)
            .await
            .map_err(source_err)?;
        for p in waiting {
            let next = stored
                .iter()
                .find(|(q, _)| *q == p)
                .map_or(0, |(_, o)| o.saturating_add(1));
            let offset = if next == 0 {
                Offset::Beginning
            } else {
                Offset::Offset(next)
            };
            // librdkafka keeps a pause across a revoke and a re-assign: a
            // partition given back while it waited for a retry would stay
            // paused, its retry dropped with the old lane. Resumed here.
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&self.config.topic, p);
            let sought = self
                .consumer
                .seek(&self.config.topic, p, offset, Duration::ZERO)
                .and_then(|()| self.consumer.resume(&tpl));
            match sought {
                Ok(()) => {
                    let mut state = self.shared.state();
                    // Revoked meanwhile: nothing to position.
                    if let Some(lane) = state.lanes.get_mut(&p) {
                        *lane = Lane {
                            positioned: true,
                            next,
                            exact: false,
                            retry: None,
                        };
                        tracing::info!(
                            partition = p,
                            next,
                            "partition positioned from the database"
                        );
                    }
                }
                Err(e) => tracing::debug!(partition = p, error = %e, "seek not possible yet"),
            }
        }
        Ok(())
    }

    /// Seeks back the partitions whose retry is due, and resumes them; the
    /// time until the next retry is due, if any.
    fn due_retries(&self) -> Option<Duration> {
        let now = Instant::now();
        let mut state = self.shared.state();
        let mut next_due: Option<Duration> = None;
        for (p, lane) in state.lanes.iter_mut() {
            let Some((offset, due)) = lane.retry else {
                continue;
            };
            if due > now {
                let left = due - now;
                next_due = Some(next_due.map_or(left, |d| d.min(left)));
                continue;
            }
            let sought = self.consumer.seek(
                &self.config.topic,
                *p,
                Offset::Offset(offset),
                Duration::ZERO,
            );
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&self.config.topic, *p);
            match sought.and_then(|()| self.consumer.resume(&tpl)) {
                Ok(()) => {
                    lane.retry = None;
                    lane.next = offset;
                    lane.exact = true;
                }
                // Tried again at the next fetch.
                Err(e) => tracing::debug!(partition = p, error = %e, "seek back not possible yet"),
            }
        }
        next_due
    }

    /// Whether a received record may be handed out, moving its lane on.
    fn accept(&self, partition: i32, offset: i64) -> bool {
        let mut state = self.shared.state();
        let Some(lane) = state.lanes.get_mut(&partition) else {
            return false;
        };
        let fits = if lane.exact {
            offset == lane.next
        } else {
            offset >= lane.next
        };
        if !lane.positioned || lane.retry.is_some() || !fits {
            return false;
        }
        lane.next = offset.saturating_add(1);
        lane.exact = false;
        true
    }
}

/// A record as received, its bytes copied out of the client.
#[derive(Debug, Clone)]
struct Record {
    topic: String,
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    payload: Vec<u8>,
    headers: Vec<(String, Option<Vec<u8>>)>,
}

fn record_of(m: &impl Message) -> Record {
    let headers = m
        .headers()
        .map(|h| {
            (0..h.count())
                .filter_map(|i| h.try_get(i))
                .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
                .collect()
        })
        .unwrap_or_default();
    Record {
        topic: m.topic().to_owned(),
        partition: m.partition(),
        offset: m.offset(),
        key: m.key().map(<[u8]>::to_vec),
        payload: m.payload().map(<[u8]>::to_vec).unwrap_or_default(),
        headers,
    }
}

/// One record from Kafka.
pub struct KafkaDelivery {
    record: Record,
    delivered: u64,
    group: String,
    shared: Arc<Shared>,
    consumer: Arc<StreamConsumer<Context>>,
}

impl std::fmt::Debug for KafkaDelivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaDelivery")
            .field("topic", &self.record.topic)
            .field("partition", &self.record.partition)
            .field("offset", &self.record.offset)
            .field("delivered", &self.delivered)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Context")
    }
}

fn source_err(e: impl Into<idem_core::BoxError>) -> SourceError {
    SourceError { source: e.into() }
}

impl KafkaDelivery {
    fn header(&self, name: &str) -> Option<&Option<Vec<u8>>> {
        self.record
            .headers
            .iter()
            .rev()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    }

    /// Settled: this process stops counting its retries.
    fn forget(&self) {
        let r = &self.record;
        self.shared.state().naks.remove(&(r.partition, r.offset));
    }

    /// `<topic>/<partition>/<offset>`: the record's id without a header.
    fn place(&self) -> String {
        let r = &self.record;
        format!("{}/{}/{}", r.topic, r.partition, r.offset)
    }
}

impl Delivery for KafkaDelivery {
    fn message(&self) -> Result<InboxMessage, String> {
        let r = &self.record;
        let text = |name: &str, v: &Option<Vec<u8>>| {
            let bytes = v.as_deref().unwrap_or_default();
            String::from_utf8(bytes.to_vec()).map_err(|_| format!("header {name} is not UTF-8"))
        };
        let id = match self.header(MESSAGE_ID) {
            Some(v) => text(MESSAGE_ID, v)?,
            None => self.place(),
        };
        let message_id = MessageId::new(id).map_err(|e| e.to_string())?;
        let key = match self.header(MESSAGE_KEY) {
            Some(v) => Some(text(MESSAGE_KEY, v)?),
            None => r
                .key
                .as_ref()
                .map(|k| String::from_utf8_lossy(k).into_owned()),
        };
        // The outbox topic it was written under, when the relay put several
        // on one Kafka topic; else the topic.
        let subject = match self.header(MESSAGE_SUBJECT) {
            Some(v) => text(MESSAGE_SUBJECT, v)?,
            None => r.topic.clone(),
        };
        let headers = r
            .headers
            .iter()
            .filter(|(n, _)| !RESERVED_HEADERS.iter().any(|h| n.eq_ignore_ascii_case(h)))
            .map(|(n, v)| {
                let v = v.as_deref().unwrap_or_default();
                (n.clone(), String::from_utf8_lossy(v).into_owned())
            })
            .collect();
        Ok(InboxMessage {
            message_id,
            subject,
            key,
            payload: r.payload.clone(),
            headers,
            delivered: self.delivered,
            stream_sequence: u64::try_from(r.offset).unwrap_or(0),
        })
    }

    async fn ack(&self) -> Result<(), SourceError> {
        self.forget();
        Ok(())
    }

    async fn nak(&self, delay: Duration) -> Result<(), SourceError> {
        let r = &self.record;
        {
            let mut state = self.shared.state();
            *state.naks.entry((r.partition, r.offset)).or_insert(0) += 1;
            match state.lanes.get_mut(&r.partition) {
                Some(lane) => lane.retry = Some((r.offset, Instant::now() + delay)),
                // Revoked: its new owner starts from the stored position.
                None => return Ok(()),
            }
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&r.topic, r.partition);
        // Not paused: its records are dropped until the retry is due.
        if let Err(e) = self.consumer.pause(&tpl) {
            tracing::debug!(partition = r.partition, error = %e, "pause failed");
        }
        Ok(())
    }

    async fn term(&self) -> Result<(), SourceError> {
        self.forget();
        Ok(())
    }

    fn position(&self) -> Option<Position> {
        Some(Position {
            group: self.group.clone(),
            topic: self.record.topic.clone(),
            partition: self.record.partition,
            offset: self.record.offset,
        })
    }
}

impl<S: PositionStore + Clone> MessageSource for KafkaSource<S> {
    type Delivery = KafkaDelivery;

    async fn fetch(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<KafkaDelivery>, SourceError> {
        let deadline = Instant::now() + wait;
        let mut out = Vec::new();
        while out.len() < max {
            self.rejoin_when_forgotten().await?;
            self.position_lanes().await?;
            let now = Instant::now();
            let mut until = if out.is_empty() {
                deadline
            } else {
                // Records already received: take what is queued, briefly.
                deadline.min(now + Duration::from_millis(5))
            };
            if let Some(due) = self.due_retries() {
                until = until.min(now + due);
            }
            let received = match tokio::time::timeout_at(until, self.consumer.recv()).await {
                Err(_) => None,
                Ok(Ok(m)) => Some(record_of(&m)),
                // librdkafka reconnects by itself: a lost broker connection
                // is an event to wait through, not an end of this fetch
                // (returned as an error, it would put the consumer into
                // its backoff while the broker is back).
                Ok(Err(e)) if transient(&e) => {
                    tracing::debug!(error = %e, "Kafka connection event; waiting");
                    None
                }
                Ok(Err(e)) => {
                    if out.is_empty() {
                        return Err(source_err(e));
                    }
                    None
                }
            };
            let Some(record) = received else {
                if Instant::now() >= deadline || !out.is_empty() {
                    break;
                }
                continue;
            };
            if record.topic != self.config.topic || !self.accept(record.partition, record.offset) {
                continue;
            }
            let retried = self
                .shared
                .state()
                .naks
                .get(&(record.partition, record.offset))
                .copied()
                .unwrap_or(0);
            out.push(KafkaDelivery {
                record,
                delivered: retried.saturating_add(1),
                group: self.config.group.clone(),
                shared: self.shared.clone(),
                consumer: self.consumer.clone(),
            });
        }
        Ok(out)
    }

    async fn dead_letter(&self, delivery: &KafkaDelivery, reason: &str) -> Result<(), SourceError> {
        let r = &delivery.record;
        // Header values cannot hold line breaks.
        let reason: String = reason
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        let place = delivery.place();
        let mut headers = OwnedHeaders::new_with_capacity(r.headers.len() + 2);
        for (key, value) in &r.headers {
            headers = headers.insert(Header {
                key: key.as_str(),
                value: value.as_deref(),
            });
        }
        headers = headers
            .insert(Header {
                key: DEAD_REASON,
                value: Some(reason.as_str()),
            })
            .insert(Header {
                key: ORIGINAL_POSITION,
                value: Some(place.as_str()),
            });
        let mut message = FutureRecord::to(&self.config.dead_letter_topic)
            .payload(&r.payload)
            .headers(headers);
        if let Some(k) = &r.key {
            message = message.key(k);
        }
        self.producer
            .send(message, self.config.dead_letter_timeout)
            .await
            .map_err(|(e, _)| source_err(e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn rejoins_without_a_partition_wait_twice_as_long_each_time_up_to_16_times() {
        let base = Duration::from_secs(20);
        let waits: Vec<u64> = (0..7)
            .map(|n| super::rejoin_wait(base, n).as_secs())
            .collect();
        assert_eq!(waits, [20, 40, 80, 160, 320, 320, 320]);
        assert_eq!(super::rejoin_wait(base, u32::MAX).as_secs(), 320);
    }
}
