//! [`Tasks`]: the operations, each checked, on the store's clock.

use std::sync::Arc;
use std::time::Duration;

use idem_core::steps::{Namespace, RunStore};
use idem_core::tasks::{
    ActionAttempt, ActionClaim, ActionDecision, ActionKey, ActionMode, ActionName, ActionOutcome,
    ClaimRequest, Fenced, NewTask, PollerName, PollerRecord, QueueName, Settle, TaskId, TaskRecord,
    TaskStore, WorkerName,
};
use idem_core::{Clock, IdempotencyKey, Tenant};
use sha2::{Digest, Sha256};

use crate::{JsonText, TaskSpec, TasksConfig, TasksError};

mod cursor;
mod operators;

/// An observation: the cursor it moves and the tasks it creates.
#[derive(Clone, Debug)]
pub struct Observation {
    /// The cursor the poller read (`None`: it had none).
    pub expected: Option<JsonText>,
    /// The cursor after this observation.
    pub value: JsonText,
    /// The tasks it creates: queue, key, spec.
    pub tasks: Vec<(QueueName, IdempotencyKey, TaskSpec)>,
}

/// What an observation did.
#[derive(Clone, Debug)]
pub struct Observed {
    /// The tasks, each with whether this observation created it.
    pub tasks: Vec<(TaskRecord, bool)>,
    /// The cursor was at the value already: a repeat of the observation.
    pub repeated: bool,
    /// The cursor as stored: JSON text (on a repeat, as the first wrote it).
    pub cursor: String,
}

/// The task operations over one store: create, observe, claim, settle and
/// act. Cheap to clone.
pub struct Tasks<S> {
    store: S,
    namespace: Namespace,
    config: Arc<TasksConfig>,
}

impl<S: Clone> Clone for Tasks<S> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            namespace: self.namespace.clone(),
            config: self.config.clone(),
        }
    }
}

impl<S> std::fmt::Debug for Tasks<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tasks")
            .field("namespace", &self.namespace.as_str())
            .finish_non_exhaustive()
    }
}

fn hash(text: &str) -> String {
    use std::fmt::Write;
    Sha256::digest(text.as_bytes())
        .iter()
        .fold(String::new(), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl<S: TaskStore + RunStore> Tasks<S> {
    /// The operations over `store`, whose namespace every derived id and
    /// key includes.
    pub async fn new(store: S, config: TasksConfig) -> Result<Self, TasksError> {
        config
            .validate()
            .map_err(|e| TasksError::invalid(e.to_string()))?;
        let namespace = store.namespace().await?;
        Ok(Self {
            store,
            namespace,
            config: Arc::new(config),
        })
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The limits in force.
    pub fn config(&self) -> &TasksConfig {
        &self.config
    }

    /// The id of the task keyed `key` in `queue` of `tenant`.
    pub fn task_id(&self, tenant: &Tenant, queue: &QueueName, key: &IdempotencyKey) -> TaskId {
        TaskId::of(&self.namespace, tenant, queue, key)
    }

    /// The key of `action` of `task`, to pass downstream.
    pub fn action_key(&self, task: &TaskId, action: &ActionName) -> ActionKey {
        ActionKey::derive(&self.namespace, task, action)
    }

    fn now_ms(&self) -> i64 {
        self.store.clock().now_ms()
    }

    /// How long `task`'s lease has left now, on the store's clock (`None`:
    /// it is not claimed): a worker's bound for acting is the time it
    /// asked plus this, measured on its own clock — the clocks are never
    /// compared.
    pub fn lease_left(&self, task: &TaskRecord) -> Option<Duration> {
        let until = task.lease_expires_at_ms?;
        let left = until.saturating_sub(self.now_ms()).max(0);
        Some(Duration::from_millis(u64::try_from(left).unwrap_or(0)))
    }

    /// `op` within [`TasksConfig::deadline`]; past it, its transaction is
    /// dropped (rolled back unless its commit was under way) and the
    /// outcome is unknown to the caller, who repeats the request.
    async fn bounded<T>(
        &self,
        op: impl Future<Output = Result<T, TasksError>>,
    ) -> Result<T, TasksError> {
        let deadline = self.config.deadline;
        match tokio::time::timeout(deadline, op).await {
            Ok(out) => out,
            Err(_) => Err(TasksError::Store(idem_core::StoreError::OutcomeUnknown {
                source: format!(
                    "the database did not answer within {}",
                    idem_core::duration_text(deadline)
                )
                .into(),
            })),
        }
    }

    /// In `tx`: creates the task keyed `key` in `queue`, or finds it (then
    /// `false`); [`TasksError::KeyReused`] when it was created with another
    /// payload.
    pub async fn create_in(
        &self,
        tx: &mut S::Tx,
        tenant: &Tenant,
        queue: &QueueName,
        key: &IdempotencyKey,
        spec: &TaskSpec,
    ) -> Result<(TaskRecord, bool), TasksError> {
        let payload = spec
            .payload
            .check(self.config.max_payload_bytes, "payload")?;
        let max_attempts = spec
            .max_attempts
            .unwrap_or(self.config.default_max_attempts);
        if !(1..=self.config.max_attempts_limit).contains(&max_attempts) {
            return Err(TasksError::invalid(format!(
                "max_attempts must be 1 to {}",
                self.config.max_attempts_limit
            )));
        }
        let payload_hash = hash(&payload.canonical);
        let id = self.task_id(tenant, queue, key);
        let now_ms = self.now_ms();
        let task = NewTask {
            id: id.as_str(),
            tenant: tenant.as_str(),
            queue: queue.as_str(),
            key: key.as_str(),
            payload: &payload.text,
            payload_hash: &payload_hash,
            priority: spec.priority,
            run_at_ms: spec.run_at_ms.unwrap_or(now_ms),
            max_attempts,
            now_ms,
        };
        let (record, created) = S::create_task(tx, &task).await?;
        if !created && record.payload_hash != payload_hash {
            return Err(TasksError::KeyReused);
        }
        Ok((record, created))
    }

    /// Creates the task keyed `key` in `queue`, or finds it (then `false`).
    pub async fn create(
        &self,
        tenant: &Tenant,
        queue: &QueueName,
        key: &IdempotencyKey,
        spec: &TaskSpec,
    ) -> Result<(TaskRecord, bool), TasksError> {
        self.bounded(async {
            let mut tx = self.store.begin().await?;
            let made = self.create_in(&mut tx, tenant, queue, key, spec).await;
            self.finish(tx, made).await
        })
        .await
    }

    /// Commits `tx` when `out` is a success, else rolls it back; `out`.
    pub async fn finish<T>(&self, tx: S::Tx, out: Result<T, TasksError>) -> Result<T, TasksError> {
        match out {
            Ok(v) => {
                self.store.commit(tx).await?;
                Ok(v)
            }
            Err(e) => {
                let _ = self.store.rollback(tx).await;
                Err(e)
            }
        }
    }

    /// Moves `poller`'s cursor from `observation.expected` to its value
    /// and creates its tasks, in one transaction; nothing is written when
    /// the cursor is elsewhere ([`TasksError::CursorMoved`]). A repeat (the
    /// cursor at the value already) creates nothing new and says so.
    pub async fn observe(
        &self,
        tenant: &Tenant,
        poller: &PollerName,
        observation: &Observation,
    ) -> Result<Observed, TasksError> {
        let limit = self.config.max_cursor_bytes;
        let expected = observation
            .expected
            .as_ref()
            .map(|v| v.check(limit, "cursor.expected"))
            .transpose()?;
        let value = observation.value.check(limit, "cursor.value")?;
        if value.canonical == "null" {
            // `expected: null` means "no cursor yet": a null cursor could never move on.
            return Err(TasksError::invalid("cursor.value must not be null"));
        }
        if observation.tasks.len() > self.config.max_tasks_per_observation {
            return Err(TasksError::invalid(format!(
                "an observation creates at most {} tasks",
                self.config.max_tasks_per_observation
            )));
        }
        self.bounded(async {
            let mut tx = self.store.begin().await?;
            let result = async {
                let now_ms = self.now_ms();
                let moved =
                    Self::move_cursor(&mut tx, (tenant, poller), expected.as_ref(), &value, now_ms)
                        .await?;
                let (repeated, cursor) = match moved {
                    Ok(moved) => moved,
                    Err(current) => return Err(TasksError::CursorMoved { current }),
                };
                // Rows locked in one order by every poller: two observations
                // sharing keys never wait on each other in a circle.
                let mut order: Vec<usize> = (0..observation.tasks.len()).collect();
                order.sort_by(|&a, &b| {
                    let (qa, ka, _) = &observation.tasks[a];
                    let (qb, kb, _) = &observation.tasks[b];
                    (qa.as_str(), ka.as_str()).cmp(&(qb.as_str(), kb.as_str()))
                });
                let mut made = vec![None; observation.tasks.len()];
                for i in order {
                    let (queue, key, spec) = &observation.tasks[i];
                    made[i] = Some(self.create_in(&mut tx, tenant, queue, key, spec).await?);
                }
                let tasks = made.into_iter().flatten().collect();
                Ok(Observed {
                    tasks,
                    repeated,
                    cursor,
                })
            }
            .await;
            self.finish(tx, result).await
        })
        .await
    }

    /// A poller's cursor.
    pub async fn poller(
        &self,
        tenant: &Tenant,
        poller: &PollerName,
    ) -> Result<Option<PollerRecord>, TasksError> {
        Ok(self.store.cursor(tenant.as_str(), poller.as_str()).await?)
    }

    fn lease_ms(&self, lease: Duration) -> Result<i64, TasksError> {
        if lease < self.config.min_lease || lease > self.config.max_lease {
            return Err(TasksError::invalid(format!(
                "lease must be between {} and {}",
                idem_core::duration_text(self.config.min_lease),
                idem_core::duration_text(self.config.max_lease)
            )));
        }
        Ok(millis(lease))
    }

    /// Checks a claim's `lease` and `max` (also before a long poll waits):
    /// the lease in milliseconds.
    pub fn check_claim(&self, lease: Duration, max: u32) -> Result<i64, TasksError> {
        if !(1..=self.config.max_claim).contains(&max) {
            let most = self.config.max_claim;
            return Err(TasksError::invalid(format!("max must be 1 to {most}")));
        }
        self.lease_ms(lease)
    }

    /// Waits until a claim of `queue` would find a task, or `wait` passed
    /// (at most [`TasksConfig::max_wait`]): `true` when one is due. It
    /// reads without a lock or a transaction, every 100 ms, so a long poll
    /// holds nothing while it waits.
    pub async fn wait_for_due(
        &self,
        tenant: &Tenant,
        queue: &QueueName,
        wait: Duration,
    ) -> Result<bool, TasksError> {
        if wait > self.config.max_wait {
            return Err(TasksError::invalid(format!(
                "wait must be at most {}",
                idem_core::duration_text(self.config.max_wait)
            )));
        }
        let until = tokio::time::Instant::now() + wait;
        loop {
            let due = self
                .store
                .has_due(tenant.as_str(), queue.as_str(), self.now_ms())
                .await?;
            if due || tokio::time::Instant::now() >= until {
                return Ok(due);
            }
            tokio::time::sleep_until(
                until.min(tokio::time::Instant::now() + Duration::from_millis(100)),
            )
            .await;
        }
    }

    /// In `tx`: claims up to `max` due tasks of `queue` for `worker`, each
    /// held for `lease` (the database's clock), each one's fence grown.
    pub async fn claim_in(
        &self,
        tx: &mut S::Tx,
        tenant: &Tenant,
        queue: &QueueName,
        worker: &WorkerName,
        lease: Duration,
        max: u32,
    ) -> Result<Vec<TaskRecord>, TasksError> {
        let lease_ms = self.check_claim(lease, max)?;
        let request = ClaimRequest {
            tenant: tenant.as_str(),
            queue: queue.as_str(),
            worker: worker.as_str(),
            lease_ms,
            max,
            now_ms: self.now_ms(),
        };
        let claimed = S::claim_tasks(tx, &request).await?;
        // The queue is a request's name: a claim that got nothing records
        // nothing, and the label's values are bounded.
        if !claimed.is_empty() {
            count_claimed(queue, request.now_ms, &claimed);
        }
        Ok(claimed)
    }

    /// Claims up to `max` due tasks of `queue` for `worker`.
    pub async fn claim(
        &self,
        tenant: &Tenant,
        queue: &QueueName,
        worker: &WorkerName,
        lease: Duration,
        max: u32,
    ) -> Result<Vec<TaskRecord>, TasksError> {
        let mut tx = self.store.begin().await?;
        let claimed = self
            .claim_in(&mut tx, tenant, queue, worker, lease, max)
            .await;
        self.finish(tx, claimed).await
    }

    /// One fenced settle in a transaction of its own.
    async fn settle(
        &self,
        tenant: &Tenant,
        task: &TaskId,
        fence: i64,
        how: &Settle<'_>,
    ) -> Result<Fenced, TasksError> {
        self.bounded(async {
            let mut tx = self.store.begin().await?;
            let now_ms = self.now_ms();
            match S::settle(&mut tx, tenant.as_str(), task.as_str(), fence, how, now_ms).await {
                Ok(out @ Fenced::Written(_)) => {
                    self.store.commit(tx).await?;
                    Ok(out)
                }
                Ok(out) => {
                    let _ = self.store.rollback(tx).await;
                    if matches!(out, Fenced::LeaseLost(_)) {
                        metrics::counter!(crate::FENCED_OUT_TOTAL).increment(1);
                    }
                    Ok(out)
                }
                Err(e) => {
                    let _ = self.store.rollback(tx).await;
                    Err(e.into())
                }
            }
        })
        .await
    }

    fn written(fence: i64, out: Fenced) -> Result<TaskRecord, TasksError> {
        match out {
            Fenced::Written(t) | Fenced::Repeated(t) => Ok(t),
            Fenced::Mismatch(_) => Err(TasksError::ResultMismatch),
            Fenced::LeaseLost(t) => Err(TasksError::lease_lost(fence, t.fence, t.state)),
            Fenced::Missing => Err(TasksError::NotFound),
        }
    }

    /// The holder of `fence` renews its lease for `lease` from now.
    pub async fn heartbeat(
        &self,
        tenant: &Tenant,
        task: &TaskId,
        fence: i64,
        lease: Duration,
    ) -> Result<TaskRecord, TasksError> {
        let lease_ms = self.lease_ms(lease)?;
        let out = self
            .settle(tenant, task, fence, &Settle::Heartbeat { lease_ms })
            .await?;
        Self::written(fence, out)
    }

    /// The holder of `fence` completes the task with `result`. Repeated with
    /// the same fence and result (compared as JSON values) it answers the
    /// same (then `true`).
    pub async fn complete(
        &self,
        tenant: &Tenant,
        task: &TaskId,
        fence: i64,
        result: impl Into<JsonText>,
    ) -> Result<(TaskRecord, bool), TasksError> {
        let result = result
            .into()
            .check(self.config.max_payload_bytes, "result")?;
        let result_hash = hash(&result.canonical);
        let how = Settle::Complete {
            result: &result.text,
            result_hash: &result_hash,
        };
        let out = self.settle(tenant, task, fence, &how).await?;
        let repeated = matches!(out, Fenced::Repeated(_));
        Ok((Self::written(fence, out)?, repeated))
    }

    /// The holder of `fence` reports a failure: retried after `retry_in`
    /// (or the configured backoff) while attempts remain, else dead.
    pub async fn fail(
        &self,
        tenant: &Tenant,
        task: &TaskId,
        fence: i64,
        error: &str,
        retry_in: Option<Duration>,
    ) -> Result<TaskRecord, TasksError> {
        if error.len() > self.config.max_error_bytes {
            return Err(TasksError::invalid(format!(
                "error is {} bytes; at most {}",
                error.len(),
                self.config.max_error_bytes
            )));
        }
        let wait = match retry_in {
            Some(d) if d > Duration::from_secs(7 * 86_400) => {
                return Err(TasksError::invalid("retry_in must be at most 7d"));
            }
            Some(d) => millis(d),
            None => {
                // Doubled per attempt so far, at most five minutes.
                let attempt = self
                    .store
                    .load_task(task.as_str())
                    .await?
                    .map_or(1, |t| t.attempt.max(1));
                let doubled = self
                    .config
                    .retry_base
                    .saturating_mul(1 << (attempt - 1).min(16));
                millis(doubled.min(Duration::from_secs(300)))
            }
        };
        let how = Settle::Fail {
            error,
            retry_at_ms: self.now_ms().saturating_add(wait),
        };
        let out = self.settle(tenant, task, fence, &how).await?;
        Self::written(fence, out)
    }

    #[allow(clippy::too_many_arguments)]
    fn attempt<'a>(
        &self,
        tenant: &'a Tenant,
        task: &'a TaskId,
        fence: i64,
        action: &'a ActionName,
        key: &'a ActionKey,
        mode: ActionMode,
        ask: Option<&'a IdempotencyKey>,
    ) -> ActionAttempt<'a> {
        let now_ms = self.now_ms();
        ActionAttempt {
            tenant: tenant.as_str(),
            task: task.as_str(),
            fence,
            action: action.as_str(),
            key: key.as_str(),
            mode,
            ask: ask.map(IdempotencyKey::as_str),
            now_ms,
            expires_at_ms: now_ms.saturating_add(millis(self.config.action_retention)),
            detail: None,
        }
    }

    async fn decided(
        &self,
        fence: i64,
        tx: S::Tx,
        out: Result<ActionClaim, idem_core::StoreError>,
    ) -> Result<(ActionDecision, TaskRecord), TasksError> {
        match out {
            Ok(ActionClaim::Decided(d, t)) => {
                self.store.commit(tx).await?;
                Ok((d, t))
            }
            Ok(other) => {
                let _ = self.store.rollback(tx).await;
                Err(match other {
                    ActionClaim::LeaseLost(t) => {
                        metrics::counter!(crate::FENCED_OUT_TOTAL).increment(1);
                        TasksError::lease_lost(fence, t.fence, t.state)
                    }
                    ActionClaim::NoAttempt(_) => TasksError::NoAttempt,
                    ActionClaim::KeyReused(_) => TasksError::AskKeyReused,
                    ActionClaim::InFlight(_) => TasksError::AttemptInFlight,
                    _ => TasksError::NotFound,
                })
            }
            Err(e) => {
                let _ = self.store.rollback(tx).await;
                Err(e.into())
            }
        }
    }

    /// The holder of `fence` asks about `action`: its key, and whether to
    /// perform it now ([`ActionDecision::Go`], recorded before this
    /// answer), skip it (`Done`) or handle an earlier attempt's unknown
    /// outcome (`Unknown`: in [`ActionMode::Verify`] check the other system
    /// by the key and report; in [`ActionMode::AtMostOnce`] the task now
    /// needs an operator).
    ///
    /// `Go` is answered once per fence, whoever asks: after it, the only
    /// other `Go` under that fence is the exact replay of that ask — the
    /// same `ask` key and `mode` (a retry whose answer was lost). Any other
    /// ask, keyless ones included, is told `Unknown`; the same `ask` key
    /// with another mode is [`TasksError::AskKeyReused`]. Give each ask a
    /// key of its own process (a per-process nonce in it), so that a
    /// restarted process never passes for the one it replaces.
    #[allow(clippy::too_many_arguments)]
    pub async fn action(
        &self,
        tenant: &Tenant,
        task: &TaskId,
        fence: i64,
        action: &ActionName,
        mode: ActionMode,
        ask: Option<&IdempotencyKey>,
    ) -> Result<(ActionKey, ActionDecision, TaskRecord), TasksError> {
        let key = self.action_key(task, action);
        let attempt = self.attempt(tenant, task, fence, action, &key, mode, ask);
        self.bounded(async {
            let mut tx = self.store.begin().await?;
            let out = S::claim_action(&mut tx, &attempt).await;
            self.decided(fence, tx, out).await
        })
        .await
        .map(|(decision, record)| (key.clone(), decision, record))
    }

    /// The holder of `fence` reports what became of `action`: `Done` marks
    /// it done for good (whatever was recorded before); `NotSent` (the
    /// other system says it never happened) lets it be attempted again —
    /// answered [`ActionDecision::Ask`], no go itself: the next
    /// [`Tasks::action`] is told `Go`.
    /// `ask` is the key of the ask reported for. A `go` told under this
    /// very fence is given back (`NotSent`) only by that ask, under its key:
    /// any other ask of the claim may have looked before the one told `go`
    /// acted, so its `NotSent` is [`TasksError::AttemptInFlight`], nothing
    /// written. (An earlier claim's attempt can no longer be under way: a
    /// `NotSent` after checking it is taken from an ask told `Unknown`.)
    /// `detail` (what the worker learnt, at most 4 KiB) is kept in the
    /// task's timeline.
    #[allow(clippy::too_many_arguments)]
    pub async fn action_result(
        &self,
        tenant: &Tenant,
        task: &TaskId,
        fence: i64,
        action: &ActionName,
        outcome: ActionOutcome,
        ask: Option<&IdempotencyKey>,
        detail: Option<&str>,
    ) -> Result<(ActionKey, ActionDecision, TaskRecord), TasksError> {
        if detail.is_some_and(|d| d.len() > 4096) {
            return Err(TasksError::invalid("detail: at most 4096 bytes"));
        }
        let key = self.action_key(task, action);
        let mut attempt = self.attempt(tenant, task, fence, action, &key, ActionMode::Verify, ask);
        attempt.detail = detail;
        self.bounded(async {
            let mut tx = self.store.begin().await?;
            let out = S::record_action(&mut tx, &attempt, outcome).await;
            self.decided(fence, tx, out).await
        })
        .await
        .map(|(decision, record)| (key.clone(), decision, record))
    }

    /// A task of `tenant`.
    pub async fn task(&self, tenant: &Tenant, id: &TaskId) -> Result<TaskRecord, TasksError> {
        match self.store.load_task(id.as_str()).await? {
            Some(t) if t.tenant == tenant.as_str() => Ok(t),
            _ => Err(TasksError::NotFound),
        }
    }
}

/// The claim counters and latencies of `claimed` (not empty: a queue with
/// tasks), under the queue's label value ([`crate::QUEUE_LABELS`]).
fn count_claimed(queue: &QueueName, now_ms: i64, claimed: &[TaskRecord]) {
    let label = crate::QUEUE_LABELS.value(queue.as_str());
    for t in claimed {
        let due_ms = (now_ms - t.run_at_ms).max(0);
        metrics::histogram!(crate::CLAIM_LATENCY, "queue" => label.clone())
            .record(due_ms as f64 / 1000.0);
    }
    metrics::counter!(crate::CLAIMED_TOTAL, "queue" => label.clone())
        .increment(claimed.len() as u64);
    let again = claimed.iter().filter(|t| t.attempt > 1).count();
    if again > 0 {
        metrics::counter!(crate::RECLAIMED_TOTAL, "queue" => label.clone()).increment(again as u64);
    }
    let taken_over = claimed
        .iter()
        .filter(|t| t.claim_kind.as_deref() == Some("taken_over"))
        .count();
    if taken_over > 0 {
        metrics::counter!(crate::TAKEOVERS_TOTAL, "queue" => label).increment(taken_over as u64);
    }
}
