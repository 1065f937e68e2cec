//! Workers: claim stored receipts, skip stale ones, run the endpoint's handler
//! with retries and backoff, and record the outcome.
//!
//! Each endpoint has a claim loop of its own, and within an endpoint up to
//! [`ProcessorConfig::concurrency`] receipts run at once, a new one claimed as
//! soon as a slot frees up. So a slow or stalled upstream holds its own
//! endpoint's slots and nothing else: other endpoints, and the other receipts
//! of its endpoint, keep moving.

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt};
use idem_core::webhooks::{Finish, Receipt, WebhookStore};
use idem_core::{
    Backoff, BoxFuture, Clock, ConfigError, Pause, RoundLoop, Rounds, StoreError, SystemClock,
    failpoint,
};

/// Why a handler did not finish a receipt.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandlerError {
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
    /// [`idempotency_key`](crate::idempotency_key) downstream. A run should
    /// end well within [`ProcessorConfig::lease`] (bound it with a timeout, as
    /// [`Forward`](crate::Forward) does); a panic counts as a retryable
    /// failure.
    fn handle<'a>(&'a self, receipt: &'a Receipt) -> BoxFuture<'a, Result<(), HandlerError>>;
}

/// Worker settings. Every field has a bound, checked by [`Processor::new`].
#[derive(Debug, Clone)]
pub struct ProcessorConfig {
    /// Receipts of one endpoint handled at once, at most (each endpoint has
    /// its own). Default 16, 1 to 1024.
    pub concurrency: u32,
    /// How long a claimed receipt is hidden from other workers; longer than a
    /// handler run (a [`Forward`](crate::Forward)'s timeout). Default 60 s,
    /// 100 ms to 1 h.
    pub lease: Duration,
    /// Sleep before looking for new receipts when an endpoint is idle.
    /// Default 500 ms, 1 ms to 1 min.
    pub poll_interval: Duration,
    /// Handler runs before a failing receipt is dead. Default 8, 1 to 1000.
    pub max_attempts: u32,
    /// Delay before the next run after a failure (a non-zero initial delay).
    pub backoff: Backoff,
}

impl Default for ProcessorConfig {
    fn default() -> Self {
        Self {
            concurrency: 16,
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

impl ProcessorConfig {
    /// Checks every field's bounds (called by [`Processor::new`]).
    pub fn validate(&self) -> Result<(), ConfigError> {
        const C: &str = "ProcessorConfig";
        let (ms, secs) = (Duration::from_millis, Duration::from_secs);
        ConfigError::check_range(C, "concurrency", self.concurrency, 1, 1024)?;
        ConfigError::check_duration(C, "lease", self.lease, ms(100), secs(3600))?;
        ConfigError::check_duration(C, "poll_interval", self.poll_interval, ms(1), secs(60))?;
        ConfigError::check_range(C, "max_attempts", self.max_attempts, 1, 1000)?;
        ConfigError::check_nonzero(C, "backoff.initial", self.backoff.initial)
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

impl Round {
    fn count(&mut self, outcome: &Outcome) {
        match outcome {
            Outcome::Processed => self.processed += 1,
            Outcome::Stale => self.stale += 1,
            Outcome::Retried => self.retried += 1,
            Outcome::Dead => self.dead += 1,
        }
    }
}

/// What an endpoint loop woke up for.
enum Event<T> {
    Claimed(Result<Vec<Receipt>, StoreError>),
    Finished(T),
    Tick,
}

enum Outcome {
    Processed,
    Stale,
    Retried,
    Dead,
}

/// The longest failure message stored with a receipt.
const MAX_ERROR_BYTES: usize = 8192;

/// A failure message as stored and logged: at most [`MAX_ERROR_BYTES`], with
/// control characters (a NUL from an upstream's body, terminal escapes)
/// replaced by spaces. A NUL cannot be stored as text on PostgreSQL, and the
/// outcome of a run must never fail to be recorded because of what an
/// upstream said.
fn clean_error(error: String) -> String {
    let mut end = error.len().min(MAX_ERROR_BYTES);
    while !error.is_char_boundary(end) {
        end -= 1;
    }
    error[..end]
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// Processes stored receipts with the handlers of their endpoints.
///
/// Only endpoints with a registered handler are claimed. Receipts of any
/// other endpoint are left as they are (`received`) for a process that has a
/// handler for it — several services may share one database, each handling
/// its own endpoints — until their retention ends; they are not marked dead.
pub struct Processor<S, C = SystemClock> {
    store: S,
    clock: C,
    config: ProcessorConfig,
    handlers: BTreeMap<String, Arc<dyn WebhookHandler>>,
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
    /// A processor on the system clock; `config` is validated.
    pub fn new(store: S, config: ProcessorConfig) -> Result<Self, ConfigError> {
        Self::with_clock(store, config, SystemClock)
    }
}

impl<S: WebhookStore, C: Clock> Processor<S, C> {
    /// A processor on its own clock, the one its claims' leases are judged
    /// by, which every processor sharing the receipts must read (on a store
    /// shared across hosts the store's,
    /// [`KeyStore::clock`](idem_core::KeyStore::clock)); `config` is
    /// validated.
    pub fn with_clock(store: S, config: ProcessorConfig, clock: C) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self {
            store,
            clock,
            config,
            handlers: BTreeMap::new(),
        })
    }

    /// Registers the handler of `endpoint`.
    pub fn handler(mut self, endpoint: &str, handler: impl WebhookHandler) -> Self {
        self.handlers.insert(endpoint.to_owned(), Arc::new(handler));
        self
    }

    /// The endpoints this processor claims receipts of.
    pub fn endpoints(&self) -> impl Iterator<Item = &str> {
        self.handlers.keys().map(String::as_str)
    }

    fn concurrency(&self) -> u32 {
        self.config.concurrency
    }

    async fn claim(&self, endpoint: &str, limit: u32) -> Result<Vec<Receipt>, StoreError> {
        self.store
            .claim_receipts(endpoint, self.clock.now_ms(), self.config.lease, limit)
            .await
    }

    /// Processes one receipt in its `idem.message` span (the endpoint and
    /// a short hash of the delivery id).
    async fn one(&self, r: &Receipt, handler: &dyn WebhookHandler) -> Result<Outcome, StoreError> {
        let span = tracing::info_span!(
            "idem.message",
            endpoint = %r.receipt.endpoint,
            message_hash = %idem_core::short_hash(r.receipt.delivery_id.as_bytes()),
        );
        tracing::Instrument::instrument(self.process(r, handler), span).await
    }

    async fn process(
        &self,
        r: &Receipt,
        handler: &dyn WebhookHandler,
    ) -> Result<Outcome, StoreError> {
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
        // A panicking handler must not take the other receipts (and the other
        // endpoints, which share this task) down with it.
        let result = AssertUnwindSafe(handler.handle(r))
            .catch_unwind()
            .await
            .unwrap_or_else(|_| Err(HandlerError::Retry("the handler panicked".into())));
        failpoint::hit("webhook.after_handle");
        let now = self.clock.now_ms();
        let attempt = r.attempts.saturating_add(1);
        let (finish, outcome) = match result {
            Ok(()) => (Finish::Processed, Outcome::Processed),
            Err(HandlerError::Reject(error)) => (
                Finish::Dead {
                    error: clean_error(error),
                },
                Outcome::Dead,
            ),
            Err(HandlerError::Retry(error)) => {
                let error = clean_error(error);
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
                           attempts = attempt, %error, "webhook handler failed");
        }
        self.store.finish(r.id, &finish, now).await?;
        Ok(outcome)
    }

    /// One round: claims up to [`ProcessorConfig::concurrency`] due receipts
    /// of every endpoint that has a handler, handles them all concurrently and
    /// returns when every one has been handled. For tests and one-shot tools;
    /// [`Processor::run`] does not wait for rounds.
    ///
    /// # Cancel safety
    /// Receipts claimed by a cancelled round come back when their lease ends.
    pub async fn run_once(&self) -> Result<Round, StoreError> {
        let rounds = join_all(self.handlers.iter().map(|(endpoint, handler)| async move {
            let batch = self.claim(endpoint, self.concurrency()).await?;
            let mut round = Round {
                claimed: batch.len(),
                ..Round::default()
            };
            for outcome in join_all(batch.iter().map(|r| self.one(r, handler.as_ref()))).await {
                round.count(&outcome?);
            }
            Ok::<_, StoreError>(round)
        }))
        .await;
        let mut total = Round::default();
        for round in rounds {
            let round = round?;
            total.claimed += round.claimed;
            total.processed += round.processed;
            total.stale += round.stale;
            total.retried += round.retried;
            total.dead += round.dead;
        }
        Ok(total)
    }

    /// One endpoint's loop: keeps up to `concurrency` receipts running,
    /// claiming as slots free up — at once while claims come back full or a
    /// finished receipt may have unblocked the next of its entity, else after
    /// the poll interval; backing off while the store is unreachable. Never
    /// returns.
    async fn endpoint_loop(&self, endpoint: &str, handler: &dyn WebhookHandler) {
        let limit = self.concurrency() as usize;
        let mut running = FuturesUnordered::new();
        // Receipts running here. A run that outlives its lease is claimed
        // again by this very loop; it must not run twice at once.
        let mut in_flight = HashSet::new();
        // The claim under way, and how many receipts it asked for.
        let mut claiming: Option<BoxFuture<'_, Result<Vec<Receipt>, StoreError>>> = None;
        let mut requested = 0;
        let mut next_claim = tokio::time::Instant::now();
        let mut failures = 0u32;
        loop {
            let free = limit.saturating_sub(running.len());
            if claiming.is_none() && free > 0 && tokio::time::Instant::now() >= next_claim {
                requested = free;
                let n = u32::try_from(free).unwrap_or(u32::MAX);
                claiming = Some(Box::pin(self.claim(endpoint, n)));
            }
            let idle = claiming.is_none() && free > 0;
            let claim_done = async {
                match claiming.as_mut() {
                    Some(claim) => claim.await,
                    None => std::future::pending().await,
                }
            };
            let event = tokio::select! {
                claimed = claim_done => Event::Claimed(claimed),
                Some(done) = running.next(), if !running.is_empty() => Event::Finished(done),
                () = tokio::time::sleep_until(next_claim), if idle => Event::Tick,
            };
            match event {
                Event::Claimed(claimed) => {
                    claiming = None;
                    let now = tokio::time::Instant::now();
                    match claimed {
                        Ok(batch) => {
                            failures = 0;
                            next_claim = if batch.len() >= requested {
                                now
                            } else {
                                now + self.config.poll_interval
                            };
                            for r in batch {
                                if in_flight.insert(r.id) {
                                    running.push(async move {
                                        let result = self.one(&r, handler).await;
                                        (r, result)
                                    });
                                }
                            }
                        }
                        Err(e) => {
                            failures = failures.saturating_add(1);
                            tracing::warn!(
                                endpoint,
                                error = &e as &dyn std::error::Error,
                                rounds = failures,
                                "webhook store unavailable"
                            );
                            next_claim = now + self.config.backoff.delay(failures, 1.0);
                        }
                    }
                }
                Event::Finished((r, result)) => {
                    in_flight.remove(&r.id);
                    if let Err(e) = result {
                        // The receipt comes back when its lease ends.
                        tracing::warn!(endpoint, delivery = %r.receipt.delivery_id, error = &e as &dyn std::error::Error,
                                       "webhook outcome not recorded");
                    }
                    if r.receipt.entity_id.is_some() {
                        next_claim = tokio::time::Instant::now();
                    }
                }
                Event::Tick => {}
            }
        }
    }

    /// Runs every endpoint's loop until `shutdown`, and deletes expired
    /// receipts every `gc_every`. One endpoint's slow or stalled handler
    /// never delays another endpoint.
    ///
    /// # Cancel safety
    /// Receipts being handled when `shutdown` resolves (or the future is
    /// dropped) come back when their lease ends and run again — handlers run
    /// at least once per receipt anyway.
    pub async fn run(&self, gc_every: Duration, shutdown: impl Future<Output = ()>) {
        let endpoints = async {
            join_all(
                self.handlers
                    .iter()
                    .map(|(endpoint, handler)| self.endpoint_loop(endpoint, handler.as_ref())),
            )
            .await;
            // No endpoint has a handler: GC still runs.
            std::future::pending::<()>().await;
        };
        let mut gc = GcRounds {
            processor: self,
            every: gc_every,
        };
        // Shutdown first; the GC rounds end at shutdown, wherever they are.
        let gc = RoundLoop::new(idem_core::Polling)
            .interrupting()
            .run(&mut gc, shutdown);
        tokio::select! {
            biased;
            () = gc => {}
            () = endpoints => {}
        }
    }
}

/// The processor's GC: delete expired receipts, sleep `every`, repeat.
struct GcRounds<'a, S, C> {
    processor: &'a Processor<S, C>,
    every: Duration,
}

impl<S: WebhookStore, C: Clock> Rounds for GcRounds<'_, S, C> {
    async fn round(&mut self) -> Pause {
        let p = self.processor;
        let now = p.clock.now_ms();
        match p.store.purge_expired_receipts(now, 1000).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(deleted = n, "expired webhook receipts deleted"),
            Err(e) => {
                tracing::warn!(error = &e as &dyn std::error::Error, "webhook gc failed")
            }
        }
        Pause::Sleep(self.every)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_bounded() {
        assert_eq!(ProcessorConfig::default().validate(), Ok(()));
        let bad = |c: ProcessorConfig| c.validate().unwrap_err().to_string();
        let d = ProcessorConfig::default;
        assert_eq!(
            bad(ProcessorConfig {
                concurrency: 0,
                ..d()
            }),
            "ProcessorConfig.concurrency must be between 1 and 1024, got 0"
        );
        assert_eq!(
            bad(ProcessorConfig {
                lease: Duration::ZERO,
                ..d()
            }),
            "ProcessorConfig.lease must be between 100ms and 1h, got 0s"
        );
        assert!(
            bad(ProcessorConfig {
                max_attempts: 0,
                ..d()
            })
            .starts_with("ProcessorConfig.max_attempts")
        );
    }

    #[test]
    fn failure_messages_are_bounded_and_storable() {
        assert_eq!(
            clean_error("upstream said \0 \x1b[31m".into()),
            "upstream said    [31m"
        );
        let long = "é".repeat(MAX_ERROR_BYTES);
        let cut = clean_error(long);
        assert!(cut.len() <= MAX_ERROR_BYTES && cut.chars().all(|c| c == 'é'));
        assert_eq!(clean_error("fine\n".into()), "fine ");
    }
}
