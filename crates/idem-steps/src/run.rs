//! [`Run`]: what a [`Workflow`](crate::Workflow) works through — phases,
//! calls, sends, compensations — and how each is recorded.

use std::collections::HashSet;
use std::future::{Future, IntoFuture};
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use idem_core::failpoint;
use idem_core::steps::{
    Failure, Fence, Lease, MessageClaim, MessageState, Namespace, RunChange, RunId, RunRecord,
    RunState, RunStore, StepKey, StepKind, StepName, StepRecord, StepState,
};
use idem_core::{BoxError, BoxFuture, Scope, StoreError};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

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

/// What a compensation's closure gets.
#[derive(Debug, Clone)]
pub struct UndoCtx {
    /// The compensation's own key (derived from its own name).
    pub key: StepKey,
    /// The key the compensated step sent, to find or repeat its effect.
    pub undone: StepKey,
    /// The fence of the lease this attempt runs under.
    pub fence: Fence,
    /// The attempt.
    pub attempt: u32,
}

/// What a send's closures get.
#[derive(Debug, Clone)]
pub struct SendCtx {
    /// The message id the sink sees, and the send-once ledger records.
    pub message_id: String,
    /// The fence of the lease this attempt runs under.
    pub fence: Fence,
    /// The attempt.
    pub attempt: u32,
}

/// The verification of an at-most-once send: there is none.
pub type NoVerify = fn(SendCtx) -> std::future::Ready<Result<bool, StepError>>;

/// How a send's effect is known to have happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sent {
    /// Sent by this attempt.
    Now,
    /// The sink said it had the message already (verify-then-send).
    Verified,
    /// The send-once ledger had it as sent (by this run or another).
    Before,
    /// An operator said it was sent.
    Operator,
}

pub(crate) type UndoPhaseFn<Tx> =
    Box<dyn for<'t> Fn(&'t mut Tx, &'t [u8]) -> BoxFuture<'t, Result<(), BoxError>> + Send + Sync>;
pub(crate) type UndoCallFn =
    Arc<dyn Fn(UndoCtx, Option<&[u8]>) -> BoxFuture<'static, Result<(), StepError>> + Send + Sync>;

/// A registered compensation.
pub(crate) struct Undo<Tx> {
    name: StepName,
    target: String,
    action: UndoAction<Tx>,
}

pub(crate) enum UndoAction<Tx> {
    Phase(UndoPhaseFn<Tx>),
    Call(UndoCallFn),
}

/// Forces a closure to be higher-ranked over the transaction's lifetime.
fn undo_phase_fn<Tx, F>(f: F) -> F
where
    F: for<'t> Fn(&'t mut Tx, &'t [u8]) -> BoxFuture<'t, Result<(), BoxError>>,
{
    f
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

    /// Local database work named `name`: `work` runs in a transaction that
    /// commits together with the step's record, so it happens once — and,
    /// for the run's first phase, in the transaction that claims the key
    /// and creates the run. Its result (JSON) is recorded and returned on
    /// resume without running `work` again. Several phases in a row share a
    /// transaction, committed before the next external call.
    pub fn phase<T, F>(&mut self, name: &str, work: F) -> Phase<'_, S, T, F>
    where
        F: for<'t> FnOnce(&'t mut S::Tx) -> BoxFuture<'t, Result<T, BoxError>>,
    {
        Phase {
            run: self,
            name: name.to_owned(),
            work,
            undo: None,
            _t: PhantomData,
        }
    }

    /// An external call named `name` that accepts a key: `call` gets the
    /// derived key (the same on every attempt) and the fence. Its attempt
    /// is recorded before the call and its result after; on resume a
    /// recorded result is returned without calling again, and a call that
    /// started without a recorded result is made again with the same key.
    /// [`StepError::Unknown`] and [`StepError::Retry`] are retried with
    /// backoff until the run's deadline; [`StepError::Permanent`] fails the
    /// run.
    pub fn call<T, F, Fut>(&mut self, name: &str, call: F) -> Call<'_, S, T, F>
    where
        F: Fn(StepCtx) -> Fut,
        Fut: Future<Output = Result<T, StepError>>,
    {
        Call {
            run: self,
            name: name.to_owned(),
            call,
            undo: None,
            no_return: false,
            _t: PhantomData,
        }
    }

    /// A message to a sink that does not deduplicate (an SMTP relay): before
    /// a send whose earlier attempt's outcome is unknown, `verify` asks the
    /// sink whether it has the message id (`Ok(true)`: it does, nothing is
    /// sent). The id is claimed in the send-once ledger, so no other run
    /// sends it either. The message id is the step's derived key unless
    /// [`SendStep::message_id`] names one.
    pub fn send<V, VFut, F, Fut>(&mut self, name: &str, verify: V, send: F) -> SendStep<'_, S, V, F>
    where
        V: Fn(SendCtx) -> VFut,
        VFut: Future<Output = Result<bool, StepError>>,
        F: Fn(SendCtx) -> Fut,
        Fut: Future<Output = Result<(), StepError>>,
    {
        SendStep {
            run: self,
            name: name.to_owned(),
            message_id: None,
            verify: Some(verify),
            send,
            no_return: false,
            _s: PhantomData,
        }
    }

    /// An effect that is never repeated automatically: the attempt is
    /// recorded before the call; if its outcome is then unknown (a crash,
    /// a timeout, [`StepError::Unknown`]), the run waits in
    /// `needs_attention` for an operator (`idem steps resolve RUN --as
    /// sent|not-sent`). Only a [`StepError::Retry`] — certainly not sent —
    /// is tried again.
    pub fn send_at_most_once<F, Fut>(&mut self, name: &str, send: F) -> SendStep<'_, S, NoVerify, F>
    where
        F: Fn(SendCtx) -> Fut,
        Fut: Future<Output = Result<(), StepError>>,
    {
        SendStep {
            run: self,
            name: name.to_owned(),
            message_id: None,
            verify: None,
            send,
            no_return: false,
            _s: PhantomData,
        }
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
        let timeout = self.shared.config.call_timeout;
        let mut lost = self.lost.clone();
        async move {
            guarded(&mut lost, async {
                match tokio::time::timeout(timeout, call).await {
                    Ok(r) => r,
                    Err(_) => Err(StepError::Unknown(format!("no answer within {timeout:?}"))),
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

    // ---- the step kinds --------------------------------------------------

    async fn run_phase<T, F>(
        &mut self,
        name: &str,
        work: F,
        undo: Option<(String, UndoPhaseFn<S::Tx>)>,
    ) -> Result<T, Stop>
    where
        T: Serialize + DeserializeOwned,
        F: for<'t> FnOnce(&'t mut S::Tx) -> BoxFuture<'t, Result<T, BoxError>>,
    {
        let step = self.begin_step(name)?;
        if let Some((undo_name, f)) = undo {
            self.register(undo_name, &step, UndoAction::Phase(f))?;
        }
        if let Some(rec) = self.existing(&step)
            && rec.state == StepState::Done
        {
            return Self::decode(&rec);
        }
        if self.mode == Mode::Compensating {
            return Err(Stop::Compensating);
        }
        let mut tx = self.tx().await?;
        match work(&mut tx).await {
            Ok(value) => {
                let bytes = Self::encode(&step, &value)?;
                let key = StepKey::derive(&self.namespace, &self.record.scope, &step);
                let rec = self.attempt_record(&step, StepKind::Phase, key.as_str());
                let rec = self.done(rec, bytes);
                self.open = Some(tx);
                let change = RunChange {
                    recovery_point: Some(step.as_str()),
                    ..RunChange::default()
                };
                self.write(&change, Some(&rec)).await?;
                Ok(value)
            }
            Err(e) => {
                let _ = self.shared.store.rollback(tx).await;
                Err(self.phase_error(&step, e))
            }
        }
    }

    /// A phase's work failed: its transaction rolled back. A store that is
    /// away stops the run (resumed after its lease); anything else is for
    /// an operator.
    fn phase_error(&mut self, step: &StepName, e: BoxError) -> Stop {
        match store_stop(e) {
            Ok(e) if e.retryable() || self.claim_open => Stop::Store(e),
            Ok(e) => Stop::Attention {
                step: step.as_str().to_owned(),
                reason: format!("its work failed: {}", idem_core::ErrorChain(&e)),
            },
            Err(e) if self.claim_open => Stop::Store(StoreError::Database { source: e }),
            Err(e) => Stop::Attention {
                step: step.as_str().to_owned(),
                reason: format!("its work failed: {}", idem_core::ErrorChain(&*e)),
            },
        }
    }

    fn register(
        &mut self,
        name: String,
        target: &StepName,
        action: UndoAction<S::Tx>,
    ) -> Result<(), Stop> {
        let undo = self.begin_step(&name)?;
        self.undo.push(Undo {
            name: undo,
            target: target.as_str().to_owned(),
            action,
        });
        Ok(())
    }

    async fn run_call<T, F, Fut>(
        &mut self,
        name: &str,
        call: F,
        undo: Option<(String, UndoCallFn)>,
        no_return: bool,
    ) -> Result<T, Stop>
    where
        T: Serialize + DeserializeOwned,
        F: Fn(StepCtx) -> Fut,
        Fut: Future<Output = Result<T, StepError>>,
    {
        let step = self.begin_step(name)?;
        if let Some((undo_name, f)) = undo {
            self.register(undo_name, &step, UndoAction::Call(f))?;
        }
        match self.existing(&step) {
            Some(rec) if rec.state == StepState::Done => return Self::decode(&rec),
            Some(rec) if rec.state == StepState::Failed => return Err(Self::failed_step(&rec)),
            _ => {}
        }
        if self.mode != Mode::Forward {
            return Err(Stop::Compensating);
        }
        let key = StepKey::derive(&self.namespace, &self.record.scope, &step);
        // Whether an attempt so far may have had its effect (an unknown
        // outcome, or a crash in the middle): then a compensation must find
        // out. Attempts that certainly did nothing leave the step clean.
        let mut uncertain = self
            .existing(&step)
            .is_some_and(|r| r.state == StepState::Started);
        let mut last_error: Option<String> = None;
        self.resume_backoff(&step).await?;
        loop {
            self.check_deadline(&step, last_error.as_deref())?;
            self.next_attempt(
                &step,
                self.record.no_return || no_return,
                last_error.as_deref(),
            )?;
            let mut rec = self.attempt_record(&step, StepKind::Call, key.as_str());
            self.start_attempt(&rec, no_return).await?;
            failpoint::hit("steps.before_call");
            let ctx = StepCtx {
                key: key.clone(),
                fence: self.lease.fence,
                attempt: rec.attempts,
            };
            let answer = self.timed(call(ctx)).await?;
            crate::metrics::attempt(step.as_str(), &answer);
            match answer {
                Ok(value) => {
                    // Drill 7's window: the other system did it, nothing
                    // is recorded yet.
                    failpoint::hit("steps.after_call");
                    let bytes = Self::encode(&step, &value)?;
                    let rec = self.done(rec, bytes);
                    let change = RunChange {
                        recovery_point: Some(step.as_str()),
                        ..RunChange::default()
                    };
                    // Durable before the next step starts; lost in a crash
                    // before that, the call runs again with the same key.
                    self.write_lazily(&change, Some(&rec)).await?;
                    return Ok(value);
                }
                Err(StepError::Permanent(e)) => {
                    rec.state = StepState::Failed;
                    rec.error = Some(e);
                    rec.finished_at_ms = Some(self.now());
                    self.write_now(&RunChange::default(), Some(&rec)).await?;
                    return Err(Self::failed_step(&rec));
                }
                Err(e) => {
                    tracing::info!(run = %self.record.id, step = %step, attempt = rec.attempts,
                                   error = %e, "step attempt failed; retrying with the same key");
                    uncertain |= matches!(e, StepError::Unknown(_));
                    if !uncertain {
                        rec.state = StepState::NotSent;
                    }
                    rec.error = Some(e.to_string());
                    rec.failures = rec.failures.saturating_add(1);
                    self.write_now(&RunChange::default(), Some(&rec)).await?;
                    last_error = rec.error;
                    self.pause(rec.failures).await?;
                }
            }
        }
    }

    async fn run_send<V, VFut, F, Fut>(
        &mut self,
        name: &str,
        message_id: Option<String>,
        verify: Option<V>,
        send: F,
        no_return: bool,
    ) -> Result<Sent, Stop>
    where
        V: Fn(SendCtx) -> VFut,
        VFut: Future<Output = Result<bool, StepError>>,
        F: Fn(SendCtx) -> Fut,
        Fut: Future<Output = Result<(), StepError>>,
    {
        let step = self.begin_step(name)?;
        let kind = if verify.is_some() {
            StepKind::Send
        } else {
            StepKind::AtMostOnce
        };
        let previous = self.existing(&step);
        match &previous {
            Some(rec) if rec.state == StepState::Done => return Self::decode(rec),
            Some(rec) if rec.state == StepState::Failed => return Err(Self::failed_step(rec)),
            _ => {}
        }
        if self.mode != Mode::Forward {
            return Err(Stop::Compensating);
        }
        let message_id = match message_id {
            Some(id)
                if (1..=255).contains(&id.len())
                    && id.bytes().all(|b| (0x21..=0x7e).contains(&b)) =>
            {
                id
            }
            Some(_) => {
                return Err(Stop::Attention {
                    step: step.as_str().to_owned(),
                    reason: "its message id is not 1 to 255 visible ASCII characters".into(),
                });
            }
            None => StepKey::derive(&self.namespace, &self.record.scope, &step)
                .as_str()
                .to_owned(),
        };
        // An attempt that started and recorded no outcome may have sent.
        let mut unknown = previous
            .as_ref()
            .is_some_and(|r| r.state == StepState::Started);
        // When the attempt whose outcome is unknown was last heard of: a
        // request still travelling to the sink when we ask it would be a
        // duplicate, so we ask only once it had a call's time to land.
        let mut quiet_since = previous
            .as_ref()
            .filter(|r| r.state == StepState::Started)
            .map(|r| r.updated_at_ms);
        let mut last_error: Option<String> = previous.and_then(|r| r.error);
        if unknown && kind == StepKind::AtMostOnce {
            return Err(Stop::Attention {
                step: step.as_str().to_owned(),
                reason: format!(
                    "an earlier attempt may have been sent (outcome unknown{}); it is never \
                     sent again without an operator",
                    last_error
                        .as_deref()
                        .map(|e| format!(": {e}"))
                        .unwrap_or_default()
                ),
            });
        }
        self.resume_backoff(&step).await?;
        loop {
            self.check_deadline(&step, last_error.as_deref())?;
            self.next_attempt(
                &step,
                self.record.no_return || no_return,
                last_error.as_deref(),
            )?;
            if unknown
                && verify.is_some()
                && let Some(since) = quiet_since.take()
            {
                // Before the next attempt is recorded: a wait that gives the
                // run back leaves the step as it was, so whoever resumes it
                // waits for the same moment, not a later one.
                let landing = i64::try_from(self.shared.config.call_timeout.as_millis())
                    .unwrap_or(i64::MAX / 4);
                self.wait_until(since.saturating_add(landing)).await?;
                continue;
            }
            self.ensure_lease()?;
            // Claim the message id and record the attempt, in one transaction.
            let mut tx = self.tx().await?;
            let now = self.now();
            let retention = i64::try_from(self.shared.config.message_retention.as_millis())
                .unwrap_or(i64::MAX / 4);
            let claim = MessageClaim {
                message_id: &message_id,
                run: &self.record.id,
                step: step.as_str(),
                now_ms: now,
                expires_at_ms: now.saturating_add(retention),
            };
            let claimed = S::claim_message(&mut tx, &claim).await;
            self.open = Some(tx);
            let entry = match claimed {
                Ok(entry) => entry,
                Err(e) => {
                    self.rollback_open().await;
                    return Err(Stop::Store(e));
                }
            };
            let theirs = entry.run_id != self.record.id.as_str();
            let mut rec = self.attempt_record(&step, kind, &message_id);
            if entry.state == MessageState::Sent {
                let rec = self.done(rec, Self::encode(&step, &Sent::Before)?);
                self.write_now(
                    &RunChange {
                        recovery_point: Some(step.as_str()),
                        ..RunChange::default()
                    },
                    Some(&rec),
                )
                .await?;
                return Ok(Sent::Before);
            }
            if theirs {
                // Another run is sending this id, or did and did not say.
                unknown = true;
                if kind == StepKind::AtMostOnce {
                    self.commit_open().await?;
                    return Err(Stop::Attention {
                        step: step.as_str().to_owned(),
                        reason: format!(
                            "message {message_id} is being sent by run {} (outcome unknown)",
                            entry.run_id
                        ),
                    });
                }
            }
            self.start_attempt(&rec, no_return).await?;
            let ctx = SendCtx {
                message_id: message_id.clone(),
                fence: self.lease.fence,
                attempt: rec.attempts,
            };
            if unknown && let Some(verify) = &verify {
                match self.timed(verify(ctx.clone())).await? {
                    Ok(true) => {
                        let rec = self.done(rec, Self::encode(&step, &Sent::Verified)?);
                        let change = RunChange {
                            recovery_point: Some(step.as_str()),
                            message: (!theirs).then_some((message_id.as_str(), MessageState::Sent)),
                            ..RunChange::default()
                        };
                        self.write_now(&change, Some(&rec)).await?;
                        return Ok(Sent::Verified);
                    }
                    Ok(false) if !theirs => {}
                    Ok(false) => {
                        // Not arrived, but another run holds the id: its send
                        // may be in flight. Wait, never send beside it.
                        last_error = Some(format!(
                            "message {message_id} is held by run {}",
                            entry.run_id
                        ));
                        rec.error = last_error.clone();
                        rec.failures = rec.failures.saturating_add(1);
                        self.write_now(&RunChange::default(), Some(&rec)).await?;
                        self.pause(rec.failures).await?;
                        continue;
                    }
                    Err(e) => {
                        // The sink cannot say: never send blind.
                        last_error = Some(format!("verify: {e}"));
                        rec.error = last_error.clone();
                        rec.failures = rec.failures.saturating_add(1);
                        self.write_now(&RunChange::default(), Some(&rec)).await?;
                        self.pause(rec.failures).await?;
                        continue;
                    }
                }
            }
            failpoint::hit("steps.before_send");
            let answer = self.timed(send(ctx)).await?;
            crate::metrics::attempt(step.as_str(), &answer);
            match answer {
                Ok(()) => {
                    failpoint::hit("steps.after_send");
                    let rec = self.done(rec, Self::encode(&step, &Sent::Now)?);
                    let change = RunChange {
                        recovery_point: Some(step.as_str()),
                        message: Some((message_id.as_str(), MessageState::Sent)),
                        ..RunChange::default()
                    };
                    if kind == StepKind::Send {
                        // Lost in a crash, the sink is asked before any resend.
                        self.write_lazily(&change, Some(&rec)).await?;
                    } else {
                        // At most once: an unrecorded success would wait for
                        // an operator after a crash; durable now.
                        self.write_now(&change, Some(&rec)).await?;
                    }
                    return Ok(Sent::Now);
                }
                Err(StepError::Permanent(e)) => {
                    rec.state = StepState::Failed;
                    rec.error = Some(e);
                    rec.finished_at_ms = Some(self.now());
                    let change = RunChange {
                        message: Some((message_id.as_str(), MessageState::NotSent)),
                        ..RunChange::default()
                    };
                    self.write_now(&change, Some(&rec)).await?;
                    return Err(Self::failed_step(&rec));
                }
                Err(StepError::Retry(e)) => {
                    // Certainly not sent: the next attempt needs no check.
                    rec.state = StepState::NotSent;
                    rec.error = Some(e);
                    rec.failures = rec.failures.saturating_add(1);
                    let change = RunChange {
                        message: Some((message_id.as_str(), MessageState::NotSent)),
                        ..RunChange::default()
                    };
                    self.write_now(&change, Some(&rec)).await?;
                    unknown = false;
                    quiet_since = None;
                    last_error = rec.error;
                    self.pause(rec.failures).await?;
                }
                Err(e @ StepError::Unknown(_)) => {
                    rec.error = Some(e.to_string());
                    rec.failures = rec.failures.saturating_add(1);
                    self.write_now(&RunChange::default(), Some(&rec)).await?;
                    if kind == StepKind::AtMostOnce {
                        return Err(Stop::Attention {
                            step: step.as_str().to_owned(),
                            reason: format!("the attempt's outcome is unknown: {}", e.detail()),
                        });
                    }
                    unknown = true;
                    // Abandoned now, it may still land: give it time first.
                    quiet_since = Some(self.now());
                    last_error = rec.error;
                    self.pause(rec.failures).await?;
                }
            }
        }
    }

    // ---- compensation ----------------------------------------------------

    /// Runs the registered compensations of the steps that happened, newest
    /// first, each recorded as a step of its own.
    pub(crate) async fn compensate(&mut self, failure: &Failure) -> Result<(), Stop> {
        if self.record.state != RunState::Compensating {
            let change = RunChange {
                state: Some(RunState::Compensating),
                failure: Some(failure),
                ..RunChange::default()
            };
            self.write_now(&change, None).await?;
        }
        self.mode = Mode::Compensating;
        let undos = std::mem::take(&mut self.undo);
        for undo in undos.into_iter().rev() {
            self.run_undo(undo).await?;
        }
        Ok(())
    }

    async fn run_undo(&mut self, undo: Undo<S::Tx>) -> Result<(), Stop> {
        let Some(target) = self.record.step(&undo.target).cloned() else {
            return Ok(());
        };
        let (applies, result) = match &undo.action {
            UndoAction::Phase(_) => (target.state == StepState::Done, target.result.clone()),
            // A call that never started, failed for good, or only ever
            // certainly did nothing has nothing to undo.
            UndoAction::Call(_) => (
                target.attempts > 0
                    && !matches!(target.state, StepState::Failed | StepState::NotSent),
                (target.state == StepState::Done)
                    .then(|| target.result.clone())
                    .flatten(),
            ),
        };
        if !applies {
            return Ok(());
        }
        if self
            .existing(&undo.name)
            .is_some_and(|r| r.state == StepState::Done)
        {
            return Ok(());
        }
        let key = StepKey::derive(&self.namespace, &self.record.scope, &undo.name);
        let mut last_error: Option<String> = None;
        self.resume_backoff(&undo.name).await?;
        loop {
            self.next_attempt(&undo.name, true, last_error.as_deref())?;
            match &undo.action {
                UndoAction::Phase(f) => {
                    let mut tx = self.tx().await?;
                    match f(&mut tx, result.as_deref().unwrap_or(b"null")).await {
                        Ok(()) => {
                            let rec =
                                self.attempt_record(&undo.name, StepKind::UndoPhase, key.as_str());
                            let rec = self.done(rec, b"null".to_vec());
                            self.open = Some(tx);
                            self.write_now(&RunChange::default(), Some(&rec)).await?;
                            crate::metrics::compensation("done");
                            return Ok(());
                        }
                        Err(e) => {
                            let _ = self.shared.store.rollback(tx).await;
                            let reason = match self.phase_error(&undo.name, e) {
                                Stop::Attention { reason, .. } => reason,
                                stop => return Err(stop),
                            };
                            // Rolled back, so certainly not done; counted, so
                            // the budget holds across executors.
                            let mut rec =
                                self.attempt_record(&undo.name, StepKind::UndoPhase, key.as_str());
                            rec.state = StepState::NotSent;
                            rec.error = Some(reason.clone());
                            rec.failures = rec.failures.saturating_add(1);
                            self.write_now(&RunChange::default(), Some(&rec)).await?;
                            last_error = Some(reason);
                            self.pause(rec.failures).await?;
                        }
                    }
                }
                UndoAction::Call(f) => {
                    let mut rec = self.attempt_record(&undo.name, StepKind::Undo, key.as_str());
                    self.start_attempt(&rec, false).await?;
                    let ctx = UndoCtx {
                        key: key.clone(),
                        undone: StepKey::derive(
                            &self.namespace,
                            &self.record.scope,
                            &StepName::new(undo.target.clone()).map_err(|e| Stop::Attention {
                                step: undo.target.clone(),
                                reason: e.to_string(),
                            })?,
                        ),
                        fence: self.lease.fence,
                        attempt: rec.attempts,
                    };
                    failpoint::hit("steps.undo.before_call");
                    let answer = self.timed(f(ctx, result.as_deref())).await?;
                    crate::metrics::attempt(undo.name.as_str(), &answer);
                    match answer {
                        Ok(()) => {
                            failpoint::hit("steps.undo.after_call");
                            let rec = self.done(rec, b"null".to_vec());
                            self.write_now(&RunChange::default(), Some(&rec)).await?;
                            crate::metrics::compensation("done");
                            return Ok(());
                        }
                        Err(StepError::Permanent(e)) => {
                            rec.error = Some(e.clone());
                            self.write_now(&RunChange::default(), Some(&rec)).await?;
                            crate::metrics::compensation("failed");
                            return Err(Stop::Attention {
                                step: undo.name.as_str().to_owned(),
                                reason: format!("the compensation failed for good: {e}"),
                            });
                        }
                        Err(e) => {
                            rec.error = Some(e.to_string());
                            rec.failures = rec.failures.saturating_add(1);
                            self.write_now(&RunChange::default(), Some(&rec)).await?;
                            last_error = rec.error;
                            self.pause(rec.failures).await?;
                        }
                    }
                }
            }
        }
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

/// A phase being set up: `.undo(…)` registers its compensation; `.await`
/// runs it.
#[must_use = "a phase does nothing until it is awaited"]
pub struct Phase<'r, S: RunStore, T, F> {
    run: &'r mut Run<S>,
    name: String,
    work: F,
    undo: Option<(String, UndoPhaseFn<S::Tx>)>,
    _t: PhantomData<fn() -> T>,
}

impl<'r, S: RunStore, T, F> Phase<'r, S, T, F>
where
    T: DeserializeOwned + Send + 'static,
{
    /// Registers the phase's compensation, local work named `name` that
    /// gets the phase's result. It runs (once, committed with its record)
    /// if the run fails after the phase committed.
    pub fn undo<U>(mut self, name: &str, undo: U) -> Self
    where
        U: for<'t> Fn(&'t mut S::Tx, T) -> BoxFuture<'t, Result<(), BoxError>>
            + Send
            + Sync
            + 'static,
    {
        let f = undo_phase_fn(move |tx: &mut S::Tx, bytes: &[u8]| {
            match serde_json::from_slice::<T>(bytes) {
                Ok(value) => undo(tx, value),
                Err(e) => {
                    let e: BoxError =
                        format!("the phase's recorded result does not decode: {e}").into();
                    Box::pin(std::future::ready(Err(e)))
                }
            }
        });
        self.undo = Some((name.to_owned(), Box::new(f)));
        self
    }
}

impl<'r, S, T, F> IntoFuture for Phase<'r, S, T, F>
where
    S: RunStore,
    T: Serialize + DeserializeOwned + Send + 'r,
    F: for<'t> FnOnce(&'t mut S::Tx) -> BoxFuture<'t, Result<T, BoxError>> + Send + 'r,
{
    type Output = Result<T, Stop>;
    type IntoFuture = BoxFuture<'r, Result<T, Stop>>;

    fn into_future(self) -> Self::IntoFuture {
        let Phase {
            run,
            name,
            work,
            undo,
            ..
        } = self;
        Box::pin(async move { run.run_phase(&name, work, undo).await })
    }
}

/// An external call being set up: `.undo(…)` registers its compensation,
/// `.point_of_no_return()` marks it; `.await` runs it.
#[must_use = "a call does nothing until it is awaited"]
pub struct Call<'r, S: RunStore, T, F> {
    run: &'r mut Run<S>,
    name: String,
    call: F,
    undo: Option<(String, UndoCallFn)>,
    no_return: bool,
    _t: PhantomData<fn() -> T>,
}

impl<'r, S: RunStore, T, F> Call<'r, S, T, F>
where
    T: DeserializeOwned + 'static,
{
    /// Registers the call's compensation, an external call named `name`
    /// with its own derived key. It runs if the run fails after the call
    /// was attempted: with the call's result, or `None` when its outcome
    /// is unknown (find out with [`UndoCtx::undone`], the call's key).
    pub fn undo<U, Fut>(mut self, name: &str, undo: U) -> Self
    where
        U: Fn(UndoCtx, Option<T>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), StepError>> + Send + 'static,
    {
        let f: UndoCallFn = Arc::new(move |ctx: UndoCtx, bytes: Option<&[u8]>| {
            let value = match bytes.map(serde_json::from_slice::<T>) {
                None => None,
                Some(Ok(v)) => Some(v),
                Some(Err(e)) => {
                    let e = StepError::Permanent(format!(
                        "the call's recorded result does not decode: {e}"
                    ));
                    return Box::pin(std::future::ready(Err(e)));
                }
            };
            Box::pin(undo(ctx, value))
        });
        self.undo = Some((name.to_owned(), f));
        self
    }

    /// From this call's first attempt on, the run is past its point of no
    /// return: failures are retried forward (then wait for an operator),
    /// never compensated.
    pub fn point_of_no_return(mut self) -> Self {
        self.no_return = true;
        self
    }
}

impl<'r, S, T, F, Fut> IntoFuture for Call<'r, S, T, F>
where
    S: RunStore,
    T: Serialize + DeserializeOwned + Send + 'r,
    F: Fn(StepCtx) -> Fut + Send + Sync + 'r,
    Fut: Future<Output = Result<T, StepError>> + Send + 'r,
{
    type Output = Result<T, Stop>;
    type IntoFuture = BoxFuture<'r, Result<T, Stop>>;

    fn into_future(self) -> Self::IntoFuture {
        let Call {
            run,
            name,
            call,
            undo,
            no_return,
            ..
        } = self;
        Box::pin(async move { run.run_call(&name, call, undo, no_return).await })
    }
}

/// A send being set up: `.message_id(…)`, `.point_of_no_return()`;
/// `.await` runs it.
#[must_use = "a send does nothing until it is awaited"]
pub struct SendStep<'r, S: RunStore, V, F> {
    run: &'r mut Run<S>,
    name: String,
    message_id: Option<String>,
    verify: Option<V>,
    send: F,
    no_return: bool,
    _s: PhantomData<fn() -> S>,
}

impl<'r, S: RunStore, V, F> SendStep<'r, S, V, F> {
    /// Sends under this message id (derived from a business id, such as
    /// `confirm-<order id>`) instead of the step's derived key. It must be
    /// deterministic: 1 to 255 visible ASCII characters.
    pub fn message_id(mut self, id: impl Into<String>) -> Self {
        self.message_id = Some(id.into());
        self
    }

    /// From this send's first attempt on, the run is past its point of no
    /// return (see [`Call::point_of_no_return`]).
    pub fn point_of_no_return(mut self) -> Self {
        self.no_return = true;
        self
    }
}

impl<'r, S, V, VFut, F, Fut> IntoFuture for SendStep<'r, S, V, F>
where
    S: RunStore,
    V: Fn(SendCtx) -> VFut + Send + Sync + 'r,
    VFut: Future<Output = Result<bool, StepError>> + Send + 'r,
    F: Fn(SendCtx) -> Fut + Send + Sync + 'r,
    Fut: Future<Output = Result<(), StepError>> + Send + 'r,
{
    type Output = Result<Sent, Stop>;
    type IntoFuture = BoxFuture<'r, Result<Sent, Stop>>;

    fn into_future(self) -> Self::IntoFuture {
        let SendStep {
            run,
            name,
            message_id,
            verify,
            send,
            no_return,
            ..
        } = self;
        Box::pin(async move {
            run.run_send(&name, message_id, verify, send, no_return)
                .await
        })
    }
}
