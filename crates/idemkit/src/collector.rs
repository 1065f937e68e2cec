//! [`Collector`]: deletes what has served its purpose — expired key records,
//! inbox records and webhook receipts, sent outbox messages past their
//! retention, final runs (with their steps), send-once ledger entries past
//! theirs, and finished tasks past theirs — in bounded batches.

use std::future::Future;
use std::time::Duration;

use idem_core::inbox::InboxStore;
use idem_core::outbox::OutboxStore;
use idem_core::steps::RunStore;
use idem_core::tasks::TaskStore;
use idem_core::webhooks::WebhookStore;
use idem_core::{Clock, ConfigError, KeyStore, Pause, RoundLoop, Rounds, SharedClock, StoreError};

/// How much a [`Collector`] deletes per run, and what it keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectorConfig {
    /// Rows deleted per statement. Default 1000, 1 to 100 000.
    pub batch_size: u32,
    /// Statements per kind per run, at most: a run deletes at most
    /// `batch_size × max_batches` rows of each kind, and the rest waits for
    /// the next run. Default 100, 1 to 10 000.
    pub max_batches: u32,
    /// How long sent outbox messages are kept (a record of what was
    /// published). Default 24 h, at most 400 days.
    pub sent_retention: Duration,
    /// How long done and dead tasks are kept after they finished, with
    /// their timelines (for operators; a repeated observation after that
    /// creates the task again). Default 7 days, at most 400 days.
    pub task_retention: Duration,
}

impl Default for CollectorConfig {
    fn default() -> Self {
        Self {
            batch_size: 1000,
            max_batches: 100,
            sent_retention: Duration::from_secs(24 * 3600),
            task_retention: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

impl CollectorConfig {
    /// Checks every field's bounds (called by [`Collector::new`]).
    pub fn validate(&self) -> Result<(), ConfigError> {
        const C: &str = "CollectorConfig";
        ConfigError::check_range(C, "batch_size", self.batch_size, 1, 100_000)?;
        ConfigError::check_range(C, "max_batches", self.max_batches, 1, 10_000)?;
        ConfigError::check_duration(
            C,
            "sent_retention",
            self.sent_retention,
            Duration::ZERO,
            Duration::from_secs(400 * 24 * 3600),
        )?;
        ConfigError::check_duration(
            C,
            "task_retention",
            self.task_retention,
            Duration::ZERO,
            Duration::from_secs(400 * 24 * 3600),
        )
    }
}

/// What one [`Collector::collect_once`] deleted, per kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Collected {
    /// Expired idempotency key records.
    pub keys: u64,
    /// Expired inbox records.
    pub inbox: u64,
    /// Expired webhook receipts (with their inbox records).
    pub receipts: u64,
    /// Sent outbox messages older than the retention.
    pub sent: u64,
    /// Final runs (with their steps) whose key record expired.
    pub runs: u64,
    /// Send-once ledger entries past their retention.
    pub messages: u64,
    /// Done and dead tasks past their retention.
    pub tasks: u64,
}

impl Collected {
    /// All kinds together.
    pub fn total(&self) -> u64 {
        self.keys + self.inbox + self.receipts + self.sent + self.runs + self.messages + self.tasks
    }
}

/// The counter of expired key records the collector deleted.
pub const KEYS_PURGED_TOTAL: &str = "idem_keys_purged_total";

/// Purges expired keys, inbox records, webhook receipts, sent outbox
/// messages, final runs, send-once ledger entries and finished tasks of one database, in bounded batches. Several instances may run
/// against one PostgreSQL database (deletes skip locked rows).
///
/// Run [`Collector::run`] in a task for the life of the service, or
/// [`Collector::collect_once`] from a command or a scheduler:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use idemkit::sqlite::{SqliteConfig, SqliteStore};
/// use idemkit::{Collector, CollectorConfig};
///
/// # let dir = std::env::temp_dir().join(format!("idem-collector-doc-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir)?;
/// # let url = format!("sqlite://{}", dir.join("doc.db").display());
/// let store = SqliteStore::connect(&url, SqliteConfig::default()).await?;
/// store.migrate().await?;
/// let collector = Collector::new(store, CollectorConfig::default())?;
///
/// let collected = collector.collect_once().await?;
/// assert_eq!(collected.total(), 0, "nothing has expired yet");
///
/// // In a service: every minute until shutdown.
/// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
/// let gc = tokio::spawn(async move {
///     collector.run(Duration::from_secs(60), async { let _ = stopped.await; }).await;
/// });
/// # let _ = stop.send(());
/// # gc.await?;
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Collector<S, C = SharedClock> {
    store: S,
    clock: C,
    config: CollectorConfig,
}

impl<S> Collector<S>
where
    S: KeyStore + InboxStore + OutboxStore + WebhookStore + RunStore + TaskStore,
{
    /// A collector on the store's clock ([`KeyStore::clock`]: the host's
    /// for SQLite, the database server's for PostgreSQL), which every
    /// expiry it purges by is judged by; `config` is validated.
    pub fn new(store: S, config: CollectorConfig) -> Result<Self, ConfigError> {
        let clock = store.clock();
        Self::with_clock(store, config, clock)
    }
}

impl<S, C> Collector<S, C>
where
    S: KeyStore + InboxStore + OutboxStore + WebhookStore + RunStore + TaskStore,
    C: Clock,
{
    /// A collector on its own clock (tests use a
    /// [`ManualClock`](idem_core::ManualClock)); `config` is validated.
    pub fn with_clock(store: S, config: CollectorConfig, clock: C) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self {
            store,
            clock,
            config,
        })
    }

    /// The settings.
    pub fn config(&self) -> &CollectorConfig {
        &self.config
    }

    /// One run: for each kind in turn (keys, inbox records, receipts, sent
    /// messages, final runs, ledger entries), deletes batches of [`CollectorConfig::batch_size`] until
    /// one comes back short or [`CollectorConfig::max_batches`] ran. Stops
    /// at the first store error; what was deleted before it stays deleted.
    ///
    /// # Cancel safety
    /// Cancel safe: each batch is one statement, and a cancelled one deletes
    /// nothing more than it would have; the next run carries on.
    pub async fn collect_once(&self) -> Result<Collected, StoreError> {
        self.collect_once_reporting(|_, _| {}).await
    }

    /// [`Collector::collect_once`], calling `report(kind, rows)` after each
    /// batch with the rows it deleted; `kind` is one of `key records`,
    /// `inbox records`, `webhook receipts`, `sent outbox messages`,
    /// `finished runs`, `send-once entries` and `finished tasks` (for a
    /// progress display).
    pub async fn collect_once_reporting(
        &self,
        mut report: impl FnMut(&'static str, u64),
    ) -> Result<Collected, StoreError> {
        let now = self.clock.now_ms();
        let s = &self.store;
        let r = &mut report;
        let keys = self
            .batches("key records", r, |n| s.purge_expired(now, n))
            .await?;
        metrics::counter!(KEYS_PURGED_TOTAL).increment(keys);
        let inbox = self
            .batches("inbox records", r, |n| s.purge_expired_inbox(now, n))
            .await?;
        let receipts = self
            .batches("webhook receipts", r, |n| s.purge_expired_receipts(now, n))
            .await?;
        let retention = i64::try_from(self.config.sent_retention.as_millis()).unwrap_or(i64::MAX);
        let before = now.saturating_sub(retention);
        let sent = self
            .batches("sent outbox messages", r, |n| s.purge_sent(before, n))
            .await?;
        let runs = self
            .batches("finished runs", r, |n| s.purge_runs(now, n))
            .await?;
        let messages = self
            .batches("send-once entries", r, |n| s.purge_messages(now, n))
            .await?;
        let kept = i64::try_from(self.config.task_retention.as_millis()).unwrap_or(i64::MAX);
        let finished = now.saturating_sub(kept);
        let tasks = self
            .batches("finished tasks", r, |n| s.purge_tasks(finished, n))
            .await?;
        Ok(Collected {
            keys,
            inbox,
            receipts,
            sent,
            runs,
            messages,
            tasks,
        })
    }

    async fn batches<F, Fut>(
        &self,
        kind: &'static str,
        report: &mut impl FnMut(&'static str, u64),
        mut purge: F,
    ) -> Result<u64, StoreError>
    where
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = Result<u64, StoreError>>,
    {
        let batch = self.config.batch_size;
        let mut total = 0;
        for _ in 0..self.config.max_batches {
            let n = purge(batch).await?;
            total += n;
            report(kind, n);
            if n < u64::from(batch) {
                break;
            }
        }
        Ok(total)
    }

    /// Collects at once, then every `every`, until `shutdown` completes;
    /// a failed run is logged and the next one comes at its time.
    ///
    /// # Cancel safety
    /// Cancel safe, and shutdown is prompt: a run in progress is dropped
    /// (see [`Collector::collect_once`]).
    pub async fn run(&self, every: Duration, shutdown: impl Future<Output = ()>) {
        let mut rounds = CollectRounds {
            collector: self,
            every,
        };
        RoundLoop::new(idem_core::Polling)
            .interrupting()
            .run(&mut rounds, shutdown)
            .await;
    }
}

struct CollectRounds<'a, S, C> {
    collector: &'a Collector<S, C>,
    every: Duration,
}

impl<S, C> Rounds for CollectRounds<'_, S, C>
where
    S: KeyStore + InboxStore + OutboxStore + WebhookStore + RunStore + TaskStore,
    C: Clock,
{
    async fn round(&mut self) -> Pause {
        match self.collector.collect_once().await {
            Ok(c) if c.total() == 0 => {}
            Ok(c) => tracing::info!(
                keys = c.keys,
                inbox = c.inbox,
                receipts = c.receipts,
                sent = c.sent,
                runs = c.runs,
                messages = c.messages,
                "expired records deleted"
            ),
            Err(e) => tracing::warn!(
                error = &e as &dyn std::error::Error,
                "collection failed; will retry"
            ),
        }
        Pause::Sleep(self.every)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_bounded() {
        assert_eq!(CollectorConfig::default().validate(), Ok(()));
        let bad = |c: CollectorConfig| c.validate().unwrap_err().field;
        let d = CollectorConfig::default;
        assert_eq!(
            bad(CollectorConfig {
                batch_size: 0,
                ..d()
            }),
            "batch_size"
        );
        assert_eq!(
            bad(CollectorConfig {
                max_batches: 10_001,
                ..d()
            }),
            "max_batches"
        );
        let e = CollectorConfig {
            sent_retention: Duration::from_secs(500 * 24 * 3600),
            ..d()
        }
        .validate()
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "CollectorConfig.sent_retention must be between 0s and 400d, got 500d"
        );
    }
}
