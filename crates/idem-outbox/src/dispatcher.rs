//! The relay loop from the outbox table to a broker.

use std::collections::VecDeque;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use idem_core::outbox::{OutboxStore, Wake};
use idem_core::{
    Backoff, Clock, ConfigError, Pause, RoundLoop, Rounds, StoreError, SystemClock, failpoint,
};

use crate::{PublishError, Publisher};

/// Dispatcher settings. Every field has a bound, checked by
/// [`Dispatcher::new`].
#[derive(Debug, Clone)]
pub struct DispatcherConfig {
    /// Messages claimed (and published concurrently) per round. Default 100,
    /// 1 to 1000.
    pub batch_size: u32,
    /// How long claimed messages are hidden from other dispatchers. Must be
    /// longer than a publish can take. Default 30 s, 1 s to 1 h.
    pub lease: Duration,
    /// Sleep between rounds when idle and no wake-up hint comes. Default 1 s,
    /// 10 ms to 1 min.
    pub poll_interval: Duration,
    /// Delay before retrying a message the broker refused.
    pub backoff: Backoff,
    /// Refusals before a message is dead. Default 10, 1 to 1000.
    pub max_attempts: u32,
    /// Pause while the broker is unreachable (grows per failed round).
    pub broker_backoff: Backoff,
    /// How long sent messages are kept. Default 24 h, at most 400 days.
    pub retention: Duration,
    /// How often sent messages past the retention are deleted. Default 60 s.
    pub cleanup_interval: Duration,
    /// Rows deleted per cleanup statement. Default 1000, 1 to 100 000.
    pub cleanup_batch_size: u32,
}

impl Default for DispatcherConfig {
    fn default() -> Self {
        Self {
            batch_size: 100,
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_secs(1),
            backoff: Backoff::default(),
            max_attempts: 10,
            broker_backoff: Backoff {
                initial: Duration::from_millis(200),
                max: Duration::from_secs(10),
            },
            retention: Duration::from_secs(24 * 3600),
            cleanup_interval: Duration::from_secs(60),
            cleanup_batch_size: 1000,
        }
    }
}

impl DispatcherConfig {
    /// Checks every field's bounds (called by [`Dispatcher::new`]).
    pub fn validate(&self) -> Result<(), ConfigError> {
        const C: &str = "DispatcherConfig";
        let (ms, secs) = (Duration::from_millis, Duration::from_secs);
        ConfigError::check_range(C, "batch_size", self.batch_size, 1, 1000)?;
        ConfigError::check_duration(C, "lease", self.lease, secs(1), secs(3600))?;
        ConfigError::check_duration(C, "poll_interval", self.poll_interval, ms(10), secs(60))?;
        ConfigError::check_range(C, "max_attempts", self.max_attempts, 1, 1000)?;
        ConfigError::check_duration(
            C,
            "retention",
            self.retention,
            Duration::ZERO,
            secs(400 * 24 * 3600),
        )?;
        ConfigError::check_min_duration(C, "cleanup_interval", self.cleanup_interval, secs(1))?;
        ConfigError::check_range(C, "cleanup_batch_size", self.cleanup_batch_size, 1, 100_000)?;
        ConfigError::check_nonzero(C, "backoff.initial", self.backoff.initial)?;
        ConfigError::check_nonzero(C, "broker_backoff.initial", self.broker_backoff.initial)
    }
}

/// What one round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunOnce {
    /// Messages claimed.
    pub claimed: usize,
    /// Acknowledged by the broker and marked sent.
    pub sent: usize,
    /// Refused by the broker: backing off, or dead.
    pub failed: usize,
    /// Of those, now dead.
    pub dead: usize,
    /// Given back because the broker was unreachable.
    pub unavailable: usize,
}

/// The counter of messages published and marked sent (after the broker's
/// acknowledgement), over every dispatcher of the process.
pub const PUBLISHED_TOTAL: &str = "idem_outbox_published_total";

/// The histogram of how long published messages waited in the outbox: from
/// the commit that wrote them (the store's clock) to the broker's
/// acknowledgement, in seconds — the relay's lag, per process.
pub const PUBLISH_LAG: &str = "idem_outbox_publish_lag_seconds";

/// Lag figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DispatcherStats {
    /// Messages not yet published.
    pub pending: u64,
    /// Age of the oldest pending message.
    pub oldest_pending_age: Option<Duration>,
    /// Dead messages.
    pub dead: u64,
    /// Messages this dispatcher published since it started.
    pub published_total: u64,
    /// Messages per second this dispatcher published over the last minute.
    pub publish_rate_per_sec: f64,
}

/// A [`Wake`] that never wakes early: plain polling (core's timer).
pub use idem_core::Polling;

/// Published messages per second over the last minute, in one-second buckets.
#[derive(Debug, Default)]
struct Rate {
    started: Option<Instant>,
    buckets: VecDeque<(u64, u64)>,
}

const RATE_WINDOW_SECS: u64 = 60;

impl Rate {
    fn add(&mut self, now: Instant, n: u64) {
        let started = *self.started.get_or_insert(now);
        let second = now.duration_since(started).as_secs();
        match self.buckets.back_mut() {
            Some((s, count)) if *s == second => *count += n,
            _ => self.buckets.push_back((second, n)),
        }
        while self
            .buckets
            .front()
            .is_some_and(|(s, _)| second.saturating_sub(*s) >= RATE_WINDOW_SECS)
        {
            self.buckets.pop_front();
        }
    }

    fn per_sec(&self, now: Instant) -> f64 {
        let Some(started) = self.started else {
            return 0.0;
        };
        let second = now.duration_since(started).as_secs();
        let total: u64 = self
            .buckets
            .iter()
            .filter(|(s, _)| second.saturating_sub(*s) < RATE_WINDOW_SECS)
            .map(|(_, n)| n)
            .sum();
        let span = now
            .duration_since(started)
            .as_secs_f64()
            .clamp(1.0, RATE_WINDOW_SECS as f64);
        total as f64 / span
    }
}

/// Publishes committed outbox messages. Cheap to share behind an `Arc`; run
/// one per process (several processes may share a PostgreSQL outbox).
#[derive(Debug)]
pub struct Dispatcher<S, P, C = SystemClock> {
    store: S,
    publisher: P,
    clock: C,
    config: DispatcherConfig,
    published: AtomicU64,
    rate: Mutex<Rate>,
}

/// A number in `[0, 1]` for jitter. `RandomState` is seeded per instance from
/// the OS, which is random enough to spread retries apart.
fn jitter() -> f64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u8(0);
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl<S: OutboxStore, P: Publisher> Dispatcher<S, P> {
    /// A dispatcher on the system clock.
    pub fn new(store: S, publisher: P, config: DispatcherConfig) -> Result<Self, ConfigError> {
        Self::with_clock(store, publisher, config, SystemClock)
    }
}

impl<S: OutboxStore, P: Publisher, C: Clock> Dispatcher<S, P, C> {
    /// A dispatcher on its own clock: the one its leases on messages are
    /// judged by, which every dispatcher sharing the outbox must read. On a
    /// store shared across hosts pass the store's
    /// ([`KeyStore::clock`](idem_core::KeyStore::clock): PostgreSQL's).
    pub fn with_clock(
        store: S,
        publisher: P,
        config: DispatcherConfig,
        clock: C,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self {
            store,
            publisher,
            clock,
            config,
            published: AtomicU64::new(0),
            rate: Mutex::default(),
        })
    }

    /// The settings.
    pub fn config(&self) -> &DispatcherConfig {
        &self.config
    }

    /// Claims one batch, publishes it concurrently, and records each outcome.
    ///
    /// # Cancel safety
    /// Cancelling after the claim leaves the batch leased until the lease ends;
    /// then it is published again (with the same ids).
    pub async fn run_once(&self) -> Result<RunOnce, StoreError> {
        let now = self.clock.now_ms();
        let batch = self
            .store
            .claim_batch(now, self.config.lease, self.config.batch_size)
            .await?;
        let mut round = RunOnce {
            claimed: batch.len(),
            ..RunOnce::default()
        };
        if batch.is_empty() {
            return Ok(round);
        }
        // One message per key per batch (the claim guarantees it), so
        // publishing them concurrently cannot reorder a key.
        let outcomes = join_all(batch.iter().map(|r| self.publisher.publish(r))).await;
        failpoint::hit("relay.after_publish");
        let (mut sent, mut unavailable) = (Vec::new(), Vec::new());
        let acked_ms = self.clock.now_ms();
        for (record, outcome) in batch.iter().zip(outcomes) {
            match outcome {
                Ok(_) => {
                    sent.push(record.id);
                    let lag_ms = acked_ms.saturating_sub(record.created_at_ms).max(0);
                    metrics::histogram!(PUBLISH_LAG).record(lag_ms as f64 / 1000.0);
                }
                Err(PublishError::Unavailable { source }) => {
                    tracing::debug!(id = record.id, error = %source, "broker unavailable");
                    unavailable.push(record.id);
                }
                Err(e) => {
                    let attempt = record.attempts.saturating_add(1);
                    let dead = attempt >= self.config.max_attempts;
                    let retry_at = now + ms(self.config.backoff.delay(attempt, jitter()));
                    let reason = e.to_string();
                    self.store
                        .mark_failed(record.id, &reason, retry_at, dead)
                        .await?;
                    round.failed += 1;
                    if dead {
                        round.dead += 1;
                        tracing::error!(id = record.id, message_id = %record.message_id, topic = %record.topic,
                                        attempts = attempt, error = %reason, "outbox message is dead");
                    } else {
                        tracing::warn!(id = record.id, attempts = attempt, error = %reason, "publish refused; will retry");
                    }
                }
            }
        }
        if !sent.is_empty() {
            self.store.mark_sent(&sent, self.clock.now_ms()).await?;
            round.sent = sent.len();
            self.published
                .fetch_add(sent.len() as u64, Ordering::Relaxed);
            metrics::counter!(PUBLISHED_TOTAL).increment(sent.len() as u64);
            self.rate
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .add(Instant::now(), sent.len() as u64);
        }
        if !unavailable.is_empty() {
            let retry_at = now + ms(self.config.broker_backoff.initial);
            self.store.release(&unavailable, retry_at).await?;
            round.unavailable = unavailable.len();
        }
        Ok(round)
    }

    /// Deletes sent messages older than the retention, in bounded batches (at
    /// most 100 statements per call).
    pub async fn cleanup(&self) -> Result<u64, StoreError> {
        let before = self
            .clock
            .now_ms()
            .saturating_sub(ms(self.config.retention));
        let mut total = 0;
        for _ in 0..100 {
            let n = self
                .store
                .purge_sent(before, self.config.cleanup_batch_size)
                .await?;
            total += n;
            if n < u64::from(self.config.cleanup_batch_size) {
                break;
            }
        }
        Ok(total)
    }

    /// Lag figures: the store's counts and this dispatcher's rate.
    pub async fn stats(&self) -> Result<DispatcherStats, StoreError> {
        let s = self.store.stats().await?;
        let now = self.clock.now_ms();
        Ok(DispatcherStats {
            pending: s.pending,
            oldest_pending_age: s
                .oldest_pending_ms
                .map(|t| Duration::from_millis(now.saturating_sub(t).max(0) as u64)),
            dead: s.dead,
            published_total: self.published.load(Ordering::Relaxed),
            publish_rate_per_sec: self
                .rate
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .per_sec(Instant::now()),
        })
    }

    /// Runs rounds until `shutdown` completes: right away while batches come
    /// back full, else after a wake-up hint or the poll interval; backing off
    /// while the broker or the database is unreachable; cleaning up sent
    /// messages every cleanup interval.
    ///
    /// # Cancel safety
    /// Returns at the next pause after `shutdown` completes; a round in
    /// progress finishes first.
    pub async fn run(&self, wake: impl Wake, shutdown: impl Future<Output = ()>) {
        let mut rounds = DispatchRounds {
            dispatcher: self,
            next_cleanup: Instant::now(),
            broker_down: 0,
            store_down: 0,
        };
        RoundLoop::new(Polling)
            .woken_by(wake)
            .run(&mut rounds, shutdown)
            .await;
    }
}

/// The state of [`Dispatcher::run`] between rounds.
struct DispatchRounds<'a, S, P, C> {
    dispatcher: &'a Dispatcher<S, P, C>,
    next_cleanup: Instant,
    /// Rounds in a row the broker was unreachable.
    broker_down: u32,
    /// Rounds in a row the store failed.
    store_down: u32,
}

/// A running relay's figures, whatever its store, broker and clock: what
/// an admin API or a log line reads of a [`Dispatcher`] it cannot name.
pub trait RelayFigures: Send + Sync {
    /// The relay's figures ([`Dispatcher::stats`]).
    fn stats(&self) -> idem_core::BoxFuture<'_, Result<DispatcherStats, StoreError>>;
}

impl<S: OutboxStore, P: Publisher, C: Clock> RelayFigures for Dispatcher<S, P, C> {
    fn stats(&self) -> idem_core::BoxFuture<'_, Result<DispatcherStats, StoreError>> {
        Box::pin(Dispatcher::stats(self))
    }
}

impl<S: OutboxStore, P: Publisher, C: Clock> Rounds for DispatchRounds<'_, S, P, C> {
    async fn round(&mut self) -> Pause {
        let d = self.dispatcher;
        let pause = match d.run_once().await {
            Ok(r) if r.unavailable > 0 => {
                self.broker_down += 1;
                self.store_down = 0;
                if self.broker_down == 1 || self.broker_down.is_power_of_two() {
                    tracing::warn!(
                        rounds = self.broker_down,
                        "the broker did not take the messages (unreachable, or it routed them \
                         nowhere); they wait in the outbox"
                    );
                }
                Some(d.config.broker_backoff.delay(self.broker_down, jitter()))
            }
            Ok(r) => {
                if self.broker_down > 0 {
                    tracing::info!("the broker takes messages again");
                }
                (self.broker_down, self.store_down) = (0, 0);
                (r.claimed < d.config.batch_size as usize).then_some(d.config.poll_interval)
            }
            Err(e) => {
                self.store_down += 1;
                tracing::warn!(
                    error = &e as &dyn std::error::Error,
                    rounds = self.store_down,
                    "outbox store unavailable"
                );
                Some(d.config.backoff.delay(self.store_down, jitter()))
            }
        };
        if Instant::now() >= self.next_cleanup {
            match d.cleanup().await {
                Ok(0) => {}
                Ok(n) => tracing::info!(deleted = n, "sent outbox messages deleted"),
                Err(e) => tracing::warn!(
                    error = &e as &dyn std::error::Error,
                    "outbox cleanup failed"
                ),
            }
            self.next_cleanup = Instant::now() + d.config.cleanup_interval;
        }
        let idle = self.broker_down == 0 && self.store_down == 0;
        match pause {
            None => Pause::None,
            // Idle: a hint that new messages committed ends the wait early.
            Some(p) if idle => Pause::Woken(p),
            // Backing off: hints do not cut it short.
            Some(p) => Pause::Sleep(p),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_bounded() {
        assert!(DispatcherConfig::default().validate().is_ok());
        let bad = |c: DispatcherConfig| c.validate().unwrap_err().field;
        let d = DispatcherConfig::default;
        assert_eq!(
            bad(DispatcherConfig {
                batch_size: 0,
                ..d()
            }),
            "batch_size"
        );
        assert_eq!(
            bad(DispatcherConfig {
                lease: Duration::ZERO,
                ..d()
            }),
            "lease"
        );
        assert_eq!(
            bad(DispatcherConfig {
                max_attempts: 0,
                ..d()
            }),
            "max_attempts"
        );
        assert_eq!(
            bad(DispatcherConfig {
                poll_interval: Duration::from_secs(3600),
                ..d()
            }),
            "poll_interval"
        );
        assert_eq!(
            bad(DispatcherConfig {
                cleanup_batch_size: 0,
                ..d()
            }),
            "cleanup_batch_size"
        );
        let e = DispatcherConfig {
            lease: Duration::ZERO,
            ..d()
        }
        .validate()
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "DispatcherConfig.lease must be between 1s and 1h, got 0s"
        );
    }

    #[test]
    fn jitter_is_a_fraction_and_varies() {
        let xs: Vec<f64> = (0..64).map(|_| jitter()).collect();
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
        assert!(xs.windows(2).any(|w| w[0] != w[1]));
    }

    #[test]
    fn rate_counts_the_last_minute() {
        let t0 = Instant::now();
        let mut r = Rate::default();
        assert_eq!(r.per_sec(t0), 0.0);
        r.add(t0, 30);
        r.add(t0 + Duration::from_millis(500), 30);
        // Less than a second in: the span counts as one second.
        assert_eq!(r.per_sec(t0 + Duration::from_millis(900)), 60.0);
        r.add(t0 + Duration::from_secs(10), 40);
        assert_eq!(r.per_sec(t0 + Duration::from_secs(20)), 100.0 / 20.0);
        // 69 s in, the first second's bucket fell out of the window; at 70 s
        // the tenth's does too.
        assert_eq!(r.per_sec(t0 + Duration::from_secs(69)), 40.0 / 60.0);
        assert_eq!(r.per_sec(t0 + Duration::from_secs(70)), 0.0);
        r.add(t0 + Duration::from_secs(200), 1);
        assert_eq!(r.buckets.len(), 1, "old buckets are dropped");
    }
}
