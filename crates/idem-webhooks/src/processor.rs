//! Workers: claim stored receipts, skip stale ones, run the endpoint's handler
//! with retries and backoff, and record the outcome.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use idem_core::{
    Backoff, BoxFuture, Clock, Finish, Receipt, StoreError, SystemClock, WebhookStore, failpoint,
};

/// Why a handler did not finish a receipt.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandleError {
    /// Try again later (a dependency is down, a timeout).
    #[error("retryable: {0}")]
    Retry(String),
    /// This delivery cannot be handled: the receipt is dead (an operator may
    /// replay it once the cause is fixed).
    #[error("rejected: {0}")]
    Reject(String),
}

/// Handles one endpoint's receipts. Registered with [`Processor::handler`].
pub trait WebhookHandler: Send + Sync + 'static {
    /// Handles a receipt. Called at least once per receipt: a worker that dies
    /// after the handler and before recording the outcome runs it again, so a
    /// handler with external effects passes
    /// [`idempotency_key`](crate::idempotency_key) downstream.
    fn handle<'a>(&'a self, receipt: &'a Receipt) -> BoxFuture<'a, Result<(), HandleError>>;
}

/// Worker settings.
#[derive(Debug, Clone)]
pub struct ProcessorConfig {
    /// Receipts claimed (and handled concurrently) per round. Default 16.
    pub batch: u32,
    /// How long a claimed receipt is hidden from other workers; longer than a
    /// handler run. Default 60 s.
    pub lease: Duration,
    /// Sleep between rounds when idle. Default 500 ms.
    pub poll_interval: Duration,
    /// Failed runs before a receipt is dead. Default 8.
    pub max_attempts: u32,
    /// Delay before the next run after a failure.
    pub backoff: Backoff,
}

impl Default for ProcessorConfig {
    fn default() -> Self {
        Self {
            batch: 16,
            lease: Duration::from_secs(60),
            poll_interval: Duration::from_millis(500),
            max_attempts: 8,
            backoff: Backoff {
                initial: Duration::from_secs(1),
                max: Duration::from_secs(300),
            },
        }
    }
}

/// What one round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Round {
    /// Receipts claimed.
    pub claimed: usize,
    /// Handled successfully.
    pub processed: usize,
    /// Older than the newest applied version of their entity: not handled.
    pub stale: usize,
    /// Failed; retried later.
    pub retried: usize,
    /// Failed for good.
    pub dead: usize,
}

enum Outcome {
    Processed,
    Stale,
    Retried,
    Dead,
}

/// Processes stored receipts with the handlers of their endpoints.
pub struct Processor<S, C = SystemClock> {
    store: S,
    clock: C,
    config: ProcessorConfig,
    handlers: HashMap<String, Arc<dyn WebhookHandler>>,
}

impl<S, C> std::fmt::Debug for Processor<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Processor")
            .field("config", &self.config)
            .field("endpoints", &self.handlers.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl<S: WebhookStore> Processor<S> {
    /// A processor on the system clock.
    pub fn new(store: S, config: ProcessorConfig) -> Self {
        Self::with_clock(store, config, SystemClock)
    }
}

impl<S: WebhookStore, C: Clock> Processor<S, C> {
    /// A processor on its own clock.
    pub fn with_clock(store: S, config: ProcessorConfig, clock: C) -> Self {
        Self {
            store,
            clock,
            config,
            handlers: HashMap::new(),
        }
    }

    /// Registers the handler of `endpoint`.
    pub fn handler(mut self, endpoint: &str, handler: impl WebhookHandler) -> Self {
        self.handlers.insert(endpoint.to_owned(), Arc::new(handler));
        self
    }

    async fn one(&self, r: &Receipt) -> Result<Outcome, StoreError> {
        let now = self.clock.now_ms();
        if let (Some(entity), Some(version)) = (&r.receipt.entity_id, r.receipt.entity_version) {
            let newest = self
                .store
                .newest_version(&r.receipt.endpoint, entity)
                .await?;
            if newest.is_some_and(|n| version < n) {
                self.store.finish(r.id, &Finish::Stale, now).await?;
                tracing::info!(endpoint = %r.receipt.endpoint, delivery = %r.receipt.delivery_id,
                               entity, version, "webhook receipt is stale; not applied");
                return Ok(Outcome::Stale);
            }
        }
        let result = match self.handlers.get(&r.receipt.endpoint) {
            Some(h) => h.handle(r).await,
            None => Err(HandleError::Reject(format!(
                "no handler for endpoint {}",
                r.receipt.endpoint
            ))),
        };
        failpoint::hit("webhook.after_handle");
        let now = self.clock.now_ms();
        let (finish, outcome) = match result {
            Ok(()) => (Finish::Processed, Outcome::Processed),
            Err(HandleError::Reject(error)) => (Finish::Dead { error }, Outcome::Dead),
            Err(HandleError::Retry(error)) => {
                let attempt = r.attempts.saturating_add(1);
                if attempt >= self.config.max_attempts {
                    let error = format!("gave up after {attempt} attempts: {error}");
                    (Finish::Dead { error }, Outcome::Dead)
                } else {
                    let delay = self.config.backoff.delay(attempt, 1.0);
                    let at_ms =
                        now.saturating_add(i64::try_from(delay.as_millis()).unwrap_or(i64::MAX));
                    (Finish::Retry { error, at_ms }, Outcome::Retried)
                }
            }
        };
        if let Finish::Dead { error } | Finish::Retry { error, .. } = &finish {
            tracing::warn!(endpoint = %r.receipt.endpoint, delivery = %r.receipt.delivery_id,
                           attempts = r.attempts + 1, %error, "webhook handler failed");
        }
        self.store.finish(r.id, &finish, now).await?;
        Ok(outcome)
    }

    /// Claims one batch and handles it (one receipt per entity, so
    /// concurrently).
    ///
    /// # Cancel safety
    /// Receipts claimed by a cancelled round come back when their lease ends.
    pub async fn run_once(&self) -> Result<Round, StoreError> {
        // Claims are per endpoint; receipts of an endpoint without a handler
        // here are left for a process that has one.
        let mut batch = Vec::new();
        for endpoint in self.handlers.keys() {
            let limit = self.config.batch.max(1) - u32::try_from(batch.len()).unwrap_or(0);
            if limit == 0 {
                break;
            }
            batch.extend(
                self.store
                    .claim_receipts(endpoint, self.clock.now_ms(), self.config.lease, limit)
                    .await?,
            );
        }
        let mut round = Round {
            claimed: batch.len(),
            ..Round::default()
        };
        for outcome in join_all(batch.iter().map(|r| self.one(r))).await {
            match outcome? {
                Outcome::Processed => round.processed += 1,
                Outcome::Stale => round.stale += 1,
                Outcome::Retried => round.retried += 1,
                Outcome::Dead => round.dead += 1,
            }
        }
        Ok(round)
    }

    /// Runs rounds until `shutdown`: at once while batches come back full, else
    /// after the poll interval; backing off while the store is unreachable;
    /// deleting expired receipts every `gc_every`.
    pub async fn run(&self, gc_every: Duration, shutdown: impl Future<Output = ()>) {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut failures = 0u32;
        let mut next_gc = tokio::time::Instant::now();
        loop {
            if tokio::time::Instant::now() >= next_gc {
                let now = self.clock.now_ms();
                match self.store.purge_expired_receipts(now, 1000).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(deleted = n, "expired webhook receipts deleted"),
                    Err(e) => tracing::warn!(error = %e, "webhook gc failed"),
                }
                next_gc = tokio::time::Instant::now() + gc_every;
            }
            let pause = match self.run_once().await {
                Ok(r) if r.claimed >= self.config.batch as usize => Duration::ZERO,
                Ok(_) => {
                    failures = 0;
                    self.config.poll_interval
                }
                Err(e) => {
                    failures += 1;
                    tracing::warn!(error = %e, rounds = failures, "webhook store unavailable");
                    self.config.backoff.delay(failures, 1.0)
                }
            };
            tokio::select! {
                biased;
                _ = &mut shutdown => return,
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }
}
