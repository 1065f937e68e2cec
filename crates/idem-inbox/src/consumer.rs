//! The consume loop: fetch, apply through the inbox, ack after commit.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem_core::inbox::{InboxStore, MessageId, Subscriber};
use idem_core::position::Position;
use idem_core::{
    Backoff, BoxError, BoxFuture, Clock, ConfigError, Pause, RoundLoop, Rounds, SharedClock,
    failpoint,
};

use crate::{Committed, Inbox, InboxBegun};

/// A message as handed to a [`Handler`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxMessage {
    /// The stable id the producer gave it.
    pub message_id: MessageId,
    /// Where it was published.
    pub subject: String,
    /// The producer's ordering key, if it sent one.
    pub key: Option<String>,
    /// The payload.
    pub payload: Vec<u8>,
    /// Headers other than the ids.
    pub headers: Vec<(String, String)>,
    /// How many times it has been delivered, this time included.
    pub delivered: u64,
    /// The broker's sequence number in its stream.
    pub stream_sequence: u64,
}

/// A broker failure.
#[derive(Debug, thiserror::Error)]
#[error("message source: {source}")]
pub struct SourceError {
    /// The client's error.
    #[source]
    pub source: BoxError,
}

/// One delivered message and the means to settle it.
pub trait Delivery: Send + Sync {
    /// The message, or why it cannot be read (no id, a bad id): such a
    /// message is dead-lettered.
    fn message(&self) -> Result<InboxMessage, String>;
    /// Done: do not deliver again.
    fn ack(&self) -> impl Future<Output = Result<(), SourceError>> + Send;
    /// Not done: deliver again after `delay`.
    fn nak(&self, delay: Duration) -> impl Future<Output = Result<(), SourceError>> + Send;
    /// Never deliver again (after a dead-letter).
    fn term(&self) -> impl Future<Output = Result<(), SourceError>> + Send;
    /// Where the message sits in an ordered log whose consumer positions live
    /// in the database (a Kafka partition), or `None` (the default: the
    /// broker keeps the position, as NATS does).
    ///
    /// With a position the [`Consumer`] stores it (through
    /// [`PositionStore::save_position`](idem_core::position::PositionStore::save_position)) in the transaction that applies the
    /// message, or in one of its own when the message is settled without
    /// one (a duplicate, a dead letter), before it acks. And once a message
    /// of a partition is nak'd, the rest of that partition in the same batch
    /// is left unsettled, neither applied nor acked: the source delivers the
    /// partition again from the nak'd message (its position would otherwise
    /// move past it).
    fn position(&self) -> Option<Position> {
        None
    }
}

/// Where messages come from.
pub trait MessageSource: Send {
    /// A delivered message.
    type Delivery: Delivery;
    /// Up to `max` messages, waiting at most `wait` for the first.
    ///
    /// # Cancel safety
    /// Messages fetched but not returned are redelivered after the ack wait.
    fn fetch(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> impl Future<Output = Result<Vec<Self::Delivery>, SourceError>> + Send;
    /// Parks the message, with `reason`, where an operator finds it.
    fn dead_letter(
        &self,
        delivery: &Self::Delivery,
        reason: &str,
    ) -> impl Future<Output = Result<(), SourceError>> + Send;
}

/// Why a handler did not apply a message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandlerError {
    /// Try again later (a dependency is down, a lock timed out).
    #[error("retryable: {0}")]
    Retry(#[source] BoxError),
    /// This message can never be applied (it does not decode): dead-letter it.
    #[error("rejected: {0}")]
    Reject(String),
}

/// Applies a message's business effect in the inbox transaction.
pub trait Handler<Tx>: Send + Sync {
    /// Writes the effect of `message` in `tx`. Everything it writes commits
    /// with the inbox record, or rolls back with it.
    fn handle<'a>(
        &'a self,
        tx: &'a mut Tx,
        message: &'a InboxMessage,
    ) -> BoxFuture<'a, Result<(), HandlerError>>;
}

/// Consumer settings. Every field has a bound, checked by [`Consumer::new`].
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// Messages per fetch. Default 64, 1 to 10 000.
    pub batch_size: u32,
    /// Longest wait for a fetch. Default 1 s, 1 ms to 1 min.
    pub fetch_wait: Duration,
    /// Deliveries before a message that keeps failing is dead-lettered.
    /// Default 5, 1 to 10 000; it should equal the broker consumer's maximum.
    pub max_deliver: u64,
    /// Redelivery delay after a retryable failure, by delivery count (a
    /// non-zero initial delay).
    pub nak_backoff: Backoff,
    /// How long the handler may take. Past it its transaction is rolled
    /// back and the message is redelivered later (a retryable failure), so a
    /// handler stuck on a silent dependency does not stall the consumer.
    /// Default 30 s, 10 ms to 1 h; keep it below the broker's ack wait.
    pub handler_timeout: Duration,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        Self {
            batch_size: 64,
            fetch_wait: Duration::from_secs(1),
            max_deliver: 5,
            nak_backoff: Backoff {
                initial: Duration::from_secs(1),
                max: Duration::from_secs(60),
            },
            handler_timeout: Duration::from_secs(30),
        }
    }
}

impl ConsumerConfig {
    /// Checks every field's bounds (called by [`Consumer::new`]).
    pub fn validate(&self) -> Result<(), ConfigError> {
        const C: &str = "ConsumerConfig";
        let (ms, secs) = (Duration::from_millis, Duration::from_secs);
        ConfigError::check_range(C, "batch_size", self.batch_size, 1, 10_000)?;
        ConfigError::check_duration(C, "fetch_wait", self.fetch_wait, ms(1), secs(60))?;
        ConfigError::check_range(C, "max_deliver", self.max_deliver, 1, 10_000)?;
        ConfigError::check_nonzero(C, "nak_backoff.initial", self.nak_backoff.initial)?;
        ConfigError::check_duration(
            C,
            "handler_timeout",
            self.handler_timeout,
            ms(10),
            secs(3600),
        )
    }
}

/// The counter of settled messages by subscriber and result (`applied`,
/// `duplicate`, `dead`).
pub const MESSAGES_TOTAL: &str = "idem_inbox_messages_total";

/// The counter of deliveries beyond a message's first (the broker's
/// redeliveries after an ack that did not arrive, a nak or a crash), by
/// subscriber.
pub const REDELIVERIES_TOTAL: &str = "idem_inbox_redeliveries_total";

/// Counters since start.
#[derive(Debug, Default)]
pub struct ConsumerStats {
    /// Applied and acknowledged.
    pub applied: AtomicU64,
    /// Skipped as duplicates and acknowledged.
    pub duplicates: AtomicU64,
    /// Negatively acknowledged for a retry.
    pub retried: AtomicU64,
    /// Dead-lettered.
    pub dead_lettered: AtomicU64,
}

/// Consumes a [`MessageSource`] through an [`Inbox`] with a [`Handler`].
#[derive(Debug)]
pub struct Consumer<Src, S, H, C = SharedClock> {
    source: Src,
    inbox: Inbox<S, C>,
    subscriber: Subscriber,
    handler: H,
    config: ConsumerConfig,
    stats: ConsumerStats,
}

enum Settle {
    Ack,
    /// Retry later; the delivery count sets the delay.
    Retry {
        error: String,
        delivered: u64,
    },
    Dead(String),
}

impl<Src, S, H, C> Consumer<Src, S, H, C>
where
    Src: MessageSource,
    S: InboxStore,
    H: Handler<S::Tx>,
    C: Clock,
{
    /// A consumer for `subscriber`; `config` is validated.
    pub fn new(
        source: Src,
        inbox: Inbox<S, C>,
        subscriber: Subscriber,
        handler: H,
        config: ConsumerConfig,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        // The series exists from the start (at 0), so a dashboard's rate
        // of it is 0, not missing, until the first redelivery.
        metrics::counter!(REDELIVERIES_TOTAL, "subscriber" => subscriber.as_str().to_owned())
            .increment(0);
        Ok(Self {
            source,
            inbox,
            subscriber,
            handler,
            config,
            stats: ConsumerStats::default(),
        })
    }

    /// Counters since start.
    pub fn stats(&self) -> &ConsumerStats {
        &self.stats
    }

    /// The message source.
    pub fn source_mut(&mut self) -> &mut Src {
        &mut self.source
    }

    /// Fetches one batch and settles every message in order. Returns how many
    /// were fetched.
    ///
    /// # Cancel safety
    /// A message being applied when cancelled is rolled back (its transaction
    /// drops) and redelivered after the ack wait.
    pub async fn run_once(&mut self) -> Result<usize, SourceError> {
        let batch = self
            .source
            .fetch(self.config.batch_size as usize, self.config.fetch_wait)
            .await?;
        // Partitions of an ordered log with a nak'd message in this batch:
        // their later messages wait for the redelivery.
        let mut held: Vec<Position> = Vec::new();
        for delivery in &batch {
            let position = delivery.position();
            if let Some(p) = &position
                && held.iter().any(|h| h.same_lane(p))
            {
                continue;
            }
            let span = tracing::info_span!(
                "idem.message",
                subscriber = %self.subscriber,
                message_hash = tracing::field::Empty,
            );
            let one = async {
                let settle = self.apply(delivery).await;
                self.settle(delivery, settle).await
            };
            let nakd = tracing::Instrument::instrument(one, span).await;
            if nakd && let Some(p) = position {
                held.push(p);
            }
        }
        Ok(batch.len())
    }

    async fn apply(&self, delivery: &Src::Delivery) -> Settle {
        let message = match delivery.message() {
            Ok(m) => m,
            Err(reason) => return Settle::Dead(format!("undecodable message: {reason}")),
        };
        if message.delivered > 1 {
            metrics::counter!(REDELIVERIES_TOTAL, "subscriber" => self.subscriber.as_str().to_owned())
                .increment(1);
        }
        tracing::Span::current().record(
            "message_hash",
            tracing::field::display(idem_core::short_hash(
                message.message_id.as_str().as_bytes(),
            )),
        );
        let claim = match self
            .inbox
            .begin(&self.subscriber, &message.message_id)
            .await
        {
            Ok(InboxBegun::Duplicate) => {
                if let Err(e) = self.save_alone(delivery).await {
                    return self.retry_or_dead(&message, format!("position: {e}"));
                }
                self.stats.duplicates.fetch_add(1, Ordering::Relaxed);
                self.count("duplicate");
                return Settle::Ack;
            }
            Ok(InboxBegun::Fresh(claim)) => claim,
            Err(e) => return self.retry_or_dead(&message, format!("inbox: {e}")),
        };
        let mut claim = claim;
        let handled = tokio::time::timeout(
            self.config.handler_timeout,
            self.handler.handle(&mut claim.tx, &message),
        )
        .await
        .unwrap_or_else(|_| {
            Err(HandlerError::Retry(
                format!(
                    "the handler did not finish within {:?}",
                    self.config.handler_timeout
                )
                .into(),
            ))
        });
        match handled {
            Ok(()) => {}
            Err(HandlerError::Reject(reason)) => {
                let _ = self.inbox.rollback(claim).await;
                return Settle::Dead(format!("rejected by the handler: {reason}"));
            }
            Err(HandlerError::Retry(e)) => {
                let _ = self.inbox.rollback(claim).await;
                return self.retry_or_dead(&message, format!("handler: {e}"));
            }
        }
        if let Some(position) = delivery.position()
            && let Err(e) = self
                .inbox
                .store()
                .save_position(&mut claim.tx, &position)
                .await
        {
            let _ = self.inbox.rollback(claim).await;
            return self.retry_or_dead(&message, format!("position: {e}"));
        }
        match self.inbox.commit(claim).await {
            Ok(Committed::Applied) => {
                failpoint::hit("consume.after_commit");
                self.stats.applied.fetch_add(1, Ordering::Relaxed);
                self.count("applied");
                Settle::Ack
            }
            Ok(Committed::Duplicate) => {
                if let Err(e) = self.save_alone(delivery).await {
                    return self.retry_or_dead(&message, format!("position: {e}"));
                }
                self.stats.duplicates.fetch_add(1, Ordering::Relaxed);
                self.count("duplicate");
                Settle::Ack
            }
            // Not acked: the broker delivers it again, and the inbox decides.
            Err(e) => self.retry_or_dead(&message, format!("commit: {e}")),
        }
    }

    /// Counts a settled message: `idem_inbox_messages_total{subscriber,
    /// result}` (the subscriber is configuration, so its values are bounded).
    fn count(&self, result: &'static str) {
        metrics::counter!(MESSAGES_TOTAL, "subscriber" => self.subscriber.as_str().to_owned(),
                          "result" => result)
        .increment(1);
    }

    fn retry_or_dead(&self, message: &InboxMessage, error: String) -> Settle {
        if message.delivered >= self.config.max_deliver {
            Settle::Dead(format!(
                "gave up after {} deliveries: {error}",
                message.delivered
            ))
        } else {
            Settle::Retry {
                error,
                delivered: message.delivered,
            }
        }
    }

    /// Stores the delivery's position, if it has one, in a transaction of
    /// its own: for a message settled without applying it.
    async fn save_alone(&self, delivery: &Src::Delivery) -> Result<(), idem_core::StoreError> {
        let Some(position) = delivery.position() else {
            return Ok(());
        };
        let store = self.inbox.store();
        let mut tx = store.begin().await?;
        if let Err(e) = store.save_position(&mut tx, &position).await {
            let _ = store.rollback(tx).await;
            return Err(e);
        }
        store.commit(tx).await
    }

    /// Settles a delivery; whether it was nak'd (to be delivered again).
    async fn settle(&self, delivery: &Src::Delivery, settle: Settle) -> bool {
        let mut nakd = false;
        let result = match settle {
            Settle::Ack => delivery.ack().await,
            Settle::Retry { error, delivered } => {
                let delay = self.config.nak_backoff.delay(delivered.min(32) as u32, 1.0);
                tracing::warn!(%error, ?delay, delivered, "message not applied; redelivery requested");
                self.stats.retried.fetch_add(1, Ordering::Relaxed);
                nakd = true;
                delivery.nak(delay).await
            }
            Settle::Dead(reason) => match self.source.dead_letter(delivery, &reason).await {
                // The dead letter is parked; its position is stored before
                // the term (if that fails, it is delivered and parked again).
                Ok(()) if self.save_alone(delivery).await.is_err() => {
                    tracing::error!(%reason, "message dead-lettered, its position not stored; it will be redelivered");
                    nakd = true;
                    delivery.nak(self.config.nak_backoff.max).await
                }
                Ok(()) => {
                    tracing::error!(%reason, "message dead-lettered");
                    self.stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
                    self.count("dead");
                    delivery.term().await
                }
                // Never drop a message silently: if it cannot be parked, it
                // is delivered again.
                Err(e) => {
                    tracing::error!(error = &e as &dyn std::error::Error, %reason, "dead-letter failed; message will be redelivered");
                    nakd = true;
                    delivery.nak(self.config.nak_backoff.max).await
                }
            },
        };
        if let Err(e) = result {
            // An ack that did not arrive means a redelivery, which the inbox
            // turns into a skip.
            tracing::warn!(
                error = &e as &dyn std::error::Error,
                "settling a message failed"
            );
        }
        nakd
    }

    /// Consumes until `shutdown` completes, pausing with a backoff while the
    /// broker cannot be reached; deletes expired inbox records every
    /// `gc_every`. Shutdown interrupts a fetch that is waiting for messages.
    ///
    /// # Cancel safety
    /// A message being applied when cancelled is rolled back and redelivered
    /// after the ack wait, as with [`Consumer::run_once`].
    pub async fn run(&mut self, gc_every: Duration, shutdown: impl Future<Output = ()>) {
        let mut rounds = ConsumeRounds {
            consumer: self,
            gc_every,
            next_gc: tokio::time::Instant::now(),
            failures: 0,
        };
        RoundLoop::new(idem_core::Polling)
            .interrupting()
            .run(&mut rounds, shutdown)
            .await;
    }
}

/// The state of [`Consumer::run`] between rounds.
struct ConsumeRounds<'a, Src, S, H, C> {
    consumer: &'a mut Consumer<Src, S, H, C>,
    gc_every: Duration,
    next_gc: tokio::time::Instant,
    /// Fetches in a row that failed.
    failures: u32,
}

impl<Src, S, H, C> Rounds for ConsumeRounds<'_, Src, S, H, C>
where
    Src: MessageSource,
    S: InboxStore,
    H: Handler<S::Tx>,
    C: Clock,
{
    async fn round(&mut self) -> Pause {
        if tokio::time::Instant::now() >= self.next_gc {
            match self.consumer.inbox.purge_expired(1000, 100).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(deleted = n, "expired inbox records deleted"),
                Err(e) => {
                    tracing::warn!(error = &e as &dyn std::error::Error, "inbox gc failed")
                }
            }
            self.next_gc = tokio::time::Instant::now() + self.gc_every;
        }
        match self.consumer.run_once().await {
            Ok(_) => {
                self.failures = 0;
                Pause::None
            }
            Err(e) => {
                self.failures += 1;
                tracing::warn!(
                    error = &e as &dyn std::error::Error,
                    rounds = self.failures,
                    "message source unavailable"
                );
                Pause::Sleep(self.consumer.config.nak_backoff.delay(self.failures, 1.0))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_bounded() {
        assert_eq!(ConsumerConfig::default().validate(), Ok(()));
        let bad = |c: ConsumerConfig| c.validate().unwrap_err().to_string();
        let d = ConsumerConfig::default;
        assert_eq!(
            bad(ConsumerConfig {
                batch_size: 0,
                ..d()
            }),
            "ConsumerConfig.batch_size must be between 1 and 10000, got 0"
        );
        assert_eq!(
            bad(ConsumerConfig {
                handler_timeout: Duration::ZERO,
                ..d()
            }),
            "ConsumerConfig.handler_timeout must be between 10ms and 1h, got 0s"
        );
        assert!(
            bad(ConsumerConfig {
                max_deliver: 0,
                ..d()
            })
            .starts_with("ConsumerConfig.max_deliver")
        );
    }
}
