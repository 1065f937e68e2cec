//! [`Run`]: what a [`Workflow`](crate::Workflow) works through — phases,
//! calls, sends, compensations — and how each is recorded.

mod compensate;
mod forward;
mod send;

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use idem_core::steps::{
    Failure, Fence, Lease, Namespace, RunChange, RunId, RunRecord, RunState, RunStore, StepKey,
    StepKind, StepName, StepRecord, StepState,
};
use idem_core::{BoxError, Clock, Scope, StoreError};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::watch;

pub(crate) use self::compensate::Undo;
pub use self::compensate::{LookupCtx, UndoCtx};
pub use self::forward::{Call, Phase};
pub use self::send::{NoVerify, SendCtx, SendStep, Sent};
use crate::error::{StepError, Stop};
use crate::runs::Shared;

/// Where retries are bounded by attempts, how many times `max_attempts`
/// attempts may be cut short (a crash, a lost lease) before the run waits for
/// an operator: a step that keeps killing its process does not loop forever.
pub const CUT_SHORT_FACTOR: u32 = 3;

/// What a step's closure gets: the key to send downstream, the fence to pass
/// to systems that accept one, and which attempt this is (1, 2, …).
#[derive(Debug, Clone)]
pub struct StepCtx {
    /// Derived from the run's scope and the step's name: the same on every
    /// attempt, by every executor.
    pub key: StepKey,
    /// The fence of the lease this attempt runs under.
    pub fence: Fence,
    /// The attempt, counted over every executor.
    pub attempt: u32,
}

/// Where the run is going.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Forward: steps run.
    Forward,
    /// Compensating: only recorded forward steps return; the rest stop.
    Compensating,
    /// The failure's answer: phases run, external steps do not.
    Finishing,
}

/// The lease as the executor and its heartbeat share it.
#[derive(Debug)]
pub(crate) struct Beat {
    pub(crate) locked_until_ms: AtomicI64,
    /// Off while the run's first transaction (its key's claim) is open: the
    /// run is not visible to a heartbeat before it commits.
    pub(crate) active: AtomicBool,
}

/// A run being executed: your [`Workflow`](crate::Workflow) records its
/// work through it.
///
/// - [`Run::phase`]: local database work, committed together with its
///   record (and with the run's creation, for the first one).
/// - [`Run::call`]: an external call that accepts the derived key; retried
///   with the same key until it answers, or the run's deadline.
/// - [`Run::send`]: a message to a sink without keys; before sending again
///   after an unknown outcome, the sink is asked whether it has it.
/// - [`Run::send_at_most_once`]: an effect never repeated automatically.
/// - [`Run::fail`]: the run fails; the compensations registered with
///   `.undo(…)` run, newest first.
pub struct Run<S: RunStore> {
    pub(crate) shared: Arc<Shared<S>>,
    /// The installation's namespace, in every key the run derives.
    namespace: Namespace,
    pub(crate) record: RunRecord,
    pub(crate) lease: Lease,
    pub(crate) beat: Arc<Beat>,
    pub(crate) lost: watch::Receiver<bool>,
    /// An open transaction: the key's claim until the first commit, then a
    /// phase's (committed before the next external call or at the end).
    pub(crate) open: Option<S::Tx>,
    pub(crate) claim_open: bool,
    pub(crate) mode: Mode,
    pub(crate) undo: Vec<Undo<S::Tx>>,
    seen: HashSet<String>,
}

impl<S: RunStore> std::fmt::Debug for Run<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Run")
            .field("id", &self.record.id)
            .field("state", &self.record.state)
            .field("fence", &self.lease.fence)
            .finish_non_exhaustive()
    }
}

/// Runs `fut` unless the lease is lost first.
pub(crate) async fn guarded<T>(
    lost: &mut watch::Receiver<bool>,
    fut: impl Future<Output = T>,
) -> Result<T, Stop> {
    if *lost.borrow() {
        return Err(Stop::LeaseLost);
    }
    let lost_now = async {
        if lost.wait_for(|l| *l).await.is_err() {
            // The heartbeat is gone with the drive: never lost from here.
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        v = fut => Ok(v),
        () = lost_now => Err(Stop::LeaseLost),
    }
}

fn jitter() -> f64 {
    (uuid::Uuid::new_v4().as_u128() >> 64) as f64 / u64::MAX as f64
}

fn store_stop(e: BoxError) -> Result<StoreError, BoxError> {
    e.downcast::<StoreError>().map(|e| *e)
}

impl<S: RunStore> Run<S> {
    pub(crate) fn new(
        shared: Arc<Shared<S>>,
        namespace: Namespace,
        record: RunRecord,
        lease: Lease,
        claim: Option<S::Tx>,
        lost: watch::Receiver<bool>,
    ) -> Self {
        let claim_open = claim.is_some();
        let beat = Arc::new(Beat {
            locked_until_ms: AtomicI64::new(record.locked_until_ms),
            active: AtomicBool::new(!claim_open),
        });
        Self {
            shared,
            namespace,
            record,
            lease,
            beat,
            lost,
            open: claim,
            claim_open,
            mode: Mode::Forward,
            undo: Vec::new(),
            seen: HashSet::new(),
        }
    }

    /// The run's id.
    pub fn id(&self) -> &RunId {
        &self.record.id
    }

    /// The scope of the key the run belongs to.
    pub fn scope(&self) -> &Scope {
        &self.record.scope
    }

    /// What the run was started with (the request body).
    pub fn input(&self) -> &[u8] {
        &self.record.input
    }

    /// The fence of this executor's lease.
    pub fn fence(&self) -> Fence {
        self.lease.fence
    }

    /// The run as recorded so far (steps included).
    pub fn record(&self) -> &RunRecord {
        &self.record
    }

    /// The key step `name` sends downstream (the same for every attempt).
    pub fn key(&self, name: &str) -> Result<StepKey, Stop> {
        let name = StepName::new(name).map_err(|e| Stop::Attention {
            step: name.chars().take(64).collect(),
            reason: e.to_string(),
        })?;
        Ok(StepKey::derive(&self.namespace, &self.record.scope, &name))
    }

    /// Why the run fails, when it does.
    pub fn failure(&self) -> Option<&Failure> {
        self.record.failure.as_ref()
    }

    /// Fails the run for `reason` (a short code such as `card_declined`):
    /// return `Err(run.fail(…))` from [`Workflow::run`](crate::Workflow::run).
    /// The completed steps' compensations run, newest first, then
    /// [`Workflow::failed`](crate::Workflow::failed) gives the answer. After
    /// the point of no return the run waits for an operator instead.
    pub fn fail(&self, reason: impl Into<String>) -> Stop {
        Stop::Fail(Failure::new(reason))
    }

    // ---- recording -------------------------------------------------------

    pub(crate) fn now(&self) -> i64 {
        self.shared.clock.now_ms()
    }

    fn begin_step(&mut self, name: &str) -> Result<StepName, Stop> {
        let step = StepName::new(name).map_err(|e| Stop::Attention {
            step: name.chars().take(64).collect(),
            reason: format!("the workflow uses an invalid step name: {e}"),
        })?;
        if !self.seen.insert(step.as_str().to_owned()) {
            return Err(Stop::Attention {
                step: step.as_str().to_owned(),
                reason: "the workflow uses this step name twice in one run".into(),
            });
        }
        Ok(step)
    }

    fn existing(&self, name: &StepName) -> Option<StepRecord> {
        self.record.step(name.as_str()).cloned()
    }

    /// The record of a step about to be attempted (its next attempt).
    fn attempt_record(&self, name: &StepName, kind: StepKind, key: &str) -> StepRecord {
        let now = self.now();
        match self.existing(name) {
            Some(mut r) => {
                r.state = StepState::Started;
                r.attempts = r.attempts.saturating_add(1);
                r.fence = self.lease.fence;
                r.updated_at_ms = now;
                r
            }
            None => StepRecord {
                name: name.as_str().to_owned(),
                seq: self.record.steps.iter().map(|s| s.seq).max().unwrap_or(0) + 1,
                kind,
                state: StepState::Started,
                attempts: 1,
                failures: 0,
                key: key.to_owned(),
                fence: self.lease.fence,
                result: None,
                error: None,
                started_at_ms: Some(now),
                finished_at_ms: None,
                updated_at_ms: now,
            },
        }
    }

    fn remember(&mut self, change: &RunChange<'_>, step: Option<&StepRecord>) {
        if let Some(s) = step {
            match self.record.steps.iter_mut().find(|r| r.name == s.name) {
                Some(r) => *r = s.clone(),
                None => self.record.steps.push(s.clone()),
            }
        }
        if let Some(state) = change.state {
            self.record.state = state;
        }
        if let Some(p) = change.recovery_point {
            self.record.recovery_point = Some(p.to_owned());
        }
        if let Some(f) = change.failure
            && self.record.failure.is_none()
        {
            self.record.failure = Some(f.clone());
        }
        self.record.no_return |= change.no_return;
    }

    /// A fenced write: into the open transaction if there is one (committed
    /// later), else a transaction of its own.
    async fn write(
        &mut self,
        change: &RunChange<'_>,
        step: Option<&StepRecord>,
    ) -> Result<(), Stop> {
        let now = self.now();
        // A step's record says when it was last written: an attempt's start,
        // or its failure (whence a successor counts its backoff).
        let step = step.map(|s| StepRecord {
            updated_at_ms: now,
            ..s.clone()
        });
        let step = step.as_ref();
        let written = match self.open.as_mut() {
            Some(tx) => S::record_run_in(tx, &self.lease, change, step, now).await,
            None => {
                self.shared
                    .store
                    .record_run(&self.lease, change, step, now)
                    .await
            }
        };
        match written {
            Ok(true) => {
                self.remember(change, step);
                Ok(())
            }
            Ok(false) => {
                crate::metrics::fence_rejected();
                self.rollback_open().await;
                tracing::warn!(run = %self.record.id, fence = %self.lease.fence,
                               "fenced out: another executor holds the run; stopping");
                Err(Stop::LeaseLost)
            }
            Err(e) => {
                self.rollback_open().await;
                Err(Stop::Store(e))
            }
        }
    }

    /// Rolls the open transaction back, if any — explicitly: a dropped
    /// transaction rolls back only when its connection is next used, and
    /// holds its locks until then (the key's claim among them, which would
    /// keep a retry with the key waiting).
    pub(crate) async fn rollback_open(&mut self) {
        if let Some(tx) = self.open.take() {
            let _ = self.shared.store.rollback(tx).await;
        }
    }

    /// Commits the open transaction, if any.
    async fn commit_open(&mut self) -> Result<(), Stop> {
        if let Some(tx) = self.open.take() {
            self.shared.store.commit(tx).await.map_err(Stop::Store)?;
            if self.claim_open {
                self.claim_open = false;
                self.beat.active.store(true, Ordering::SeqCst);
            }
        }
        Ok(())
    }

    /// A fenced write made durable now.
    async fn write_now(
        &mut self,
        change: &RunChange<'_>,
        step: Option<&StepRecord>,
    ) -> Result<(), Stop> {
        self.write(change, step).await?;
        self.commit_open().await
    }

    /// A fenced write into the open transaction, opening one if needed: it
    /// commits with the next write made durable (the next attempt's start,
    /// the end of the run). For results that are safe to lose in a crash —
    /// the step runs again with the same key, or asks its sink first — so a
    /// step's result and the next step's start cost one commit, not two.
    async fn write_lazily(
        &mut self,
        change: &RunChange<'_>,
        step: Option<&StepRecord>,
    ) -> Result<(), Stop> {
        if self.open.is_none() {
            self.open = Some(self.shared.store.begin().await.map_err(Stop::Store)?);
        }
        self.write(change, step).await
    }

    /// The open transaction, or a new one.
    async fn tx(&mut self) -> Result<S::Tx, Stop> {
        match self.open.take() {
            Some(tx) => Ok(tx),
            None => self.shared.store.begin().await.map_err(Stop::Store),
        }
    }

    /// Refuses to start an external call under a lease that may be gone.
    fn ensure_lease(&self) -> Result<(), Stop> {
        // A margin for the call's first bytes: a lease about to end is as
        // good as ended.
        let margin = (self.shared.lease_ms() / 10).min(1_000);
        if *self.lost.borrow()
            || self.now() + margin >= self.beat.locked_until_ms.load(Ordering::SeqCst)
        {
            return Err(Stop::LeaseLost);
        }
        Ok(())
    }

    /// Records an attempt's start and makes it durable before the call.
    async fn start_attempt(&mut self, rec: &StepRecord, no_return: bool) -> Result<(), Stop> {
        self.ensure_lease()?;
        let change = RunChange {
            no_return,
            ..RunChange::default()
        };
        self.write_now(&change, Some(rec)).await
    }

    /// Past the deadline, before the point of no return: the run fails.
    fn check_deadline(&self, step: &StepName, last_error: Option<&str>) -> Result<(), Stop> {
        if self.mode == Mode::Forward
            && !self.record.no_return
            && self.now() >= self.record.deadline_ms
        {
            return Err(Stop::Fail(Failure {
                reason: "deadline".into(),
                step: Some(step.as_str().to_owned()),
                detail: last_error.map(str::to_owned),
            }));
        }
        Ok(())
    }

    /// The number of the attempt about to be made (the step's recorded
    /// attempts, over every executor, plus one), once the budget allows it:
    /// where retries are not bounded by the deadline (after the point of no
    /// return, and in compensation), after
    /// [`RunsConfig::max_attempts`](crate::RunsConfig::max_attempts) failed
    /// attempts the run waits for an operator instead. Failures are counted
    /// over every executor; attempts cut short by a crash are not failures,
    /// but a step that keeps taking its process down (more than
    /// [`CUT_SHORT_FACTOR`] times `max_attempts` attempts cut short) waits
    /// for an operator too.
    fn next_attempt(
        &self,
        step: &StepName,
        bounded: bool,
        last_error: Option<&str>,
    ) -> Result<u32, Stop> {
        let rec = self.existing(step);
        let failures = rec.as_ref().map_or(0, |r| r.failures);
        if bounded && failures >= self.shared.config.max_attempts {
            return Err(Stop::Attention {
                step: step.as_str().to_owned(),
                reason: format!(
                    "{failures} attempts failed{}",
                    last_error
                        .or(rec.as_ref().and_then(|r| r.error.as_deref()))
                        .map(|e| format!(", the last: {e}"))
                        .unwrap_or_default()
                ),
            });
        }
        let attempts = rec.as_ref().map_or(0, |r| r.attempts);
        let cut_short = attempts.saturating_sub(failures);
        if bounded
            && cut_short
                >= self
                    .shared
                    .config
                    .max_attempts
                    .saturating_mul(CUT_SHORT_FACTOR)
        {
            return Err(Stop::Attention {
                step: step.as_str().to_owned(),
                reason: format!(
                    "{cut_short} attempts were cut short (their process died or lost the run)"
                ),
            });
        }
        Ok(attempts.saturating_add(1))
    }

    /// Waits until `at_ms`; a long wait gives the run back, due then.
    async fn wait_until(&mut self, at_ms: i64) -> Result<(), Stop> {
        let left = at_ms - self.now();
        if left <= 0 {
            return Ok(());
        }
        let left = std::time::Duration::from_millis(u64::try_from(left).unwrap_or(0));
        if left > self.shared.config.release_after {
            self.release_until(at_ms).await?;
        }
        let mut lost = self.lost.clone();
        guarded(&mut lost, tokio::time::sleep(left)).await
    }

    /// Gives the run back, due at `until_ms` for any executor.
    async fn release_until(&mut self, until_ms: i64) -> Result<(), Stop> {
        self.beat.active.store(false, Ordering::SeqCst);
        let change = RunChange {
            release: true,
            locked_until_ms: Some(until_ms),
            ..RunChange::default()
        };
        self.write_now(&change, None).await?;
        Err(Stop::Released { until_ms })
    }

    /// A step resumed after failures waits out the backoff its last failure
    /// started (from when it was recorded), so a run that keeps changing
    /// hands is not retried faster than one that does not.
    async fn resume_backoff(&mut self, step: &StepName) -> Result<(), Stop> {
        let Some(rec) = self.existing(step) else {
            return Ok(());
        };
        if rec.failures == 0 || matches!(rec.state, StepState::Done | StepState::Failed) {
            return Ok(());
        }
        let delay = self.shared.config.backoff.delay(rec.failures, 0.0);
        let due = rec
            .updated_at_ms
            .saturating_add(i64::try_from(delay.as_millis()).unwrap_or(i64::MAX / 2));
        self.wait_until(due).await
    }

    /// Waits before the next attempt, after `failures` failures; a long
    /// wait gives the run back.
    async fn pause(&mut self, failures: u32) -> Result<(), Stop> {
        let delay = self.shared.config.backoff.delay(failures, jitter());
        let until_ms = self.now() + i64::try_from(delay.as_millis()).unwrap_or(i64::MAX / 2);
        if delay > self.shared.config.release_after {
            return self.release_until(until_ms).await;
        }
        let mut lost = self.lost.clone();
        guarded(&mut lost, tokio::time::sleep(delay)).await
    }

    /// Bounds a call by the call timeout (past it the outcome is unknown)
    /// and by the lease. Built before it is awaited, so the future borrows
    /// nothing of the run.
    fn timed<T>(
        &self,
        call: impl Future<Output = Result<T, StepError>>,
    ) -> impl Future<Output = Result<Result<T, StepError>, Stop>> {
        self.timed_from(tokio::time::Instant::now(), call)
    }

    /// [`Run::timed`], its timeout counted from `began` (taken before the
    /// attempt's start was recorded). The deadline is checked before the
    /// call is polled, every time: a call is never polled past `began` +
    /// `call_timeout` — not even once by an executor resumed after a pause
    /// — so none of its requests is handed to the network later than that.
    /// A compensation's landing window counts on it.
    fn timed_from<T>(
        &self,
        began: tokio::time::Instant,
        call: impl Future<Output = Result<T, StepError>>,
    ) -> impl Future<Output = Result<Result<T, StepError>, Stop>> {
        let timeout = self.shared.config.call_timeout;
        let mut lost = self.lost.clone();
        async move {
            guarded(&mut lost, async {
                let deadline = tokio::time::sleep_until(began + timeout);
                tokio::pin!(deadline, call);
                tokio::select! {
                    biased;
                    () = &mut deadline => {
                        Err(StepError::Unknown(format!("no answer within {timeout:?}")))
                    }
                    r = &mut call => r,
                }
            })
            .await
        }
    }

    fn decode<T: DeserializeOwned>(rec: &StepRecord) -> Result<T, Stop> {
        let bytes = rec.result.as_deref().unwrap_or(b"null");
        serde_json::from_slice(bytes).map_err(|e| Stop::Attention {
            step: rec.name.clone(),
            reason: format!(
                "its recorded result does not decode as this workflow's type ({e}): \
                 the workflow changed under a run in flight"
            ),
        })
    }

    fn encode<T: Serialize>(step: &StepName, value: &T) -> Result<Vec<u8>, Stop> {
        serde_json::to_vec(value).map_err(|e| Stop::Attention {
            step: step.as_str().to_owned(),
            reason: format!("its result does not encode as JSON: {e}"),
        })
    }

    fn failed_step(rec: &StepRecord) -> Stop {
        Stop::Fail(Failure {
            reason: "step_failed".into(),
            step: Some(rec.name.clone()),
            detail: rec.error.clone(),
        })
    }

    fn done(&self, mut rec: StepRecord, result: Vec<u8>) -> StepRecord {
        rec.state = StepState::Done;
        rec.result = Some(result);
        rec.error = None;
        rec.finished_at_ms = Some(self.now());
        rec
    }

    // ---- the end ---------------------------------------------------------

    /// Stops at `step` for an operator; recorded if the run exists.
    pub(crate) async fn block(&mut self, step: &str, reason: &str) -> Result<(), Stop> {
        // Nobody executes it until an operator acts: no holder.
        let change = RunChange {
            state: Some(RunState::NeedsAttention),
            attention: Some(Some((step, reason))),
            release: true,
            ..RunChange::default()
        };
        self.write_now(&change, None).await
    }

    /// The run is final: its state, its key record's outcome and expiry,
    /// and whatever the open transaction holds, in one commit.
    pub(crate) async fn finish(
        &mut self,
        completion: &idem_core::Completion,
        state: RunState,
    ) -> Result<(), Stop> {
        let mut tx = self.tx().await?;
        let now = self.now();
        let change = RunChange {
            state: Some(state),
            expires_at_ms: Some(now.saturating_add(self.record.ttl_ms)),
            release: true,
            ..RunChange::default()
        };
        match S::record_run_in(&mut tx, &self.lease, &change, None, now).await {
            Ok(true) => {}
            Ok(false) => {
                crate::metrics::fence_rejected();
                return Err(Stop::LeaseLost);
            }
            Err(e) => return Err(Stop::Store(e)),
        }
        let mut stored = completion.clone();
        stored.response.headers = idem_core::headers::storable(stored.response.headers);
        self.shared
            .store
            .complete(tx, &self.record.scope, &stored, now)
            .await
            .map_err(Stop::Store)?;
        self.remember(&change, None);
        self.claim_open = false;
        Ok(())
    }
}
