//! [`Runs`]: the executor of one process — starting runs with their key,
//! resuming runs whose lease expired, heartbeats, and how a run ends.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use idem_core::steps::{
    Failure, Lease, Namespace, NewRun, RunChange, RunId, RunRecord, RunState, RunStore,
};
use idem_core::{
    Begun, Clock, Completion, ConfigError, Engine, Error, Fingerprint, Operation, Policy,
    RecordState, Scope, SharedClock, StoredRecord,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use crate::config::{RunsConfig, WorkflowPolicy};
use crate::error::{Ended, StartError, Stop};
use crate::run::{Beat, Mode, Run, guarded};
use crate::workflow::Workflow;

/// Whether a run that ends before its first commit keeps its answer (and
/// its key): the HTTP layer keeps what its route stores (a `409` business
/// error) and discards the rest (a validation `400`, so the key is not used
/// up). Everything after the first commit is kept.
pub type Keep = Arc<dyn Fn(&Completion) -> bool + std::marker::Send + Sync>;

pub(crate) struct Registered<S: RunStore> {
    pub(crate) workflow: Arc<dyn Workflow<S>>,
    pub(crate) policy: WorkflowPolicy,
}

pub(crate) struct Shared<S: RunStore> {
    pub(crate) store: S,
    pub(crate) engine: Engine<S, SharedClock>,
    pub(crate) clock: SharedClock,
    pub(crate) config: RunsConfig,
    pub(crate) holder: String,
    pub(crate) workflows: HashMap<Operation, Registered<S>>,
    pub(crate) permits: Arc<Semaphore>,
    /// The database's namespace, read once.
    namespace: tokio::sync::OnceCell<Namespace>,
    /// Runs executing in this process, for a retry that arrives meanwhile.
    waiters: Mutex<HashMap<RunId, watch::Receiver<Option<Ended>>>>,
}

impl<S: RunStore> Shared<S> {
    pub(crate) fn lease_ms(&self) -> i64 {
        i64::try_from(self.config.lease.as_millis()).unwrap_or(i64::MAX / 4)
    }

    /// The database's namespace (read, or drawn, on first use).
    pub(crate) async fn namespace(&self) -> Result<Namespace, idem_core::StoreError> {
        self.namespace
            .get_or_try_init(|| self.store.namespace())
            .await
            .cloned()
    }
}

/// The executor of multi-step runs in one process: a [`RunStore`] and the
/// [`Workflow`]s it runs, by operation. Cheap to clone.
///
/// - [`Runs::start`] claims an idempotency key and starts its run, or
///   replays the key's outcome, or resumes its run if the executor that
///   held it died (its lease expired).
/// - [`Runs::recovery`] is the worker that resumes runs nobody asks about.
/// - [`crate::resolve`] is the operator's way out of `needs_attention`.
pub struct Runs<S: RunStore> {
    pub(crate) shared: Arc<Shared<S>>,
}

impl<S: RunStore> Clone for Runs<S> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<S: RunStore> std::fmt::Debug for Runs<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runs")
            .field("holder", &self.shared.holder)
            .field("operations", &self.operations())
            .finish_non_exhaustive()
    }
}

/// Builds [`Runs`]: its settings, its clock, its workflows.
pub struct RunsBuilder<S: RunStore> {
    store: S,
    config: RunsConfig,
    clock: SharedClock,
    workflows: HashMap<Operation, Registered<S>>,
}

impl<S: RunStore> RunsBuilder<S> {
    /// Settings other than the defaults.
    pub fn config(mut self, config: RunsConfig) -> Self {
        self.config = config;
        self
    }

    /// Another clock than the store's (tests pass a
    /// [`ManualClock`](idem_core::ManualClock)). Every executor sharing the
    /// store must read the same one.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = SharedClock::new(clock);
        self
    }

    /// Registers the workflow of `operation`: runs of keys scoped to it
    /// execute `workflow`.
    pub fn workflow(
        mut self,
        operation: Operation,
        workflow: impl Workflow<S>,
        policy: WorkflowPolicy,
    ) -> Self {
        self.workflows.insert(
            operation,
            Registered {
                workflow: Arc::new(workflow),
                policy,
            },
        );
        self
    }

    /// The executor, once every setting is within its bounds.
    pub fn build(self) -> Result<Runs<S>, ConfigError> {
        self.config.validate()?;
        for r in self.workflows.values() {
            r.policy.validate()?;
        }
        let holder = self.config.holder.clone().unwrap_or_else(|| {
            let random = uuid::Uuid::new_v4().simple().to_string();
            format!("{}-{}", std::process::id(), &random[..8])
        });
        let permits = Arc::new(Semaphore::new(self.config.max_concurrent));
        Ok(Runs {
            shared: Arc::new(Shared {
                engine: Engine::with_clock(self.store.clone(), self.clock.clone()),
                store: self.store,
                clock: self.clock,
                config: self.config,
                holder,
                workflows: self.workflows,
                permits,
                namespace: tokio::sync::OnceCell::new(),
                waiters: Mutex::default(),
            }),
        })
    }
}

/// What [`Runs::start`] found.
#[derive(Debug)]
#[non_exhaustive]
pub enum Started {
    /// A run is executing here: a fresh one, or one taken over from an
    /// executor whose lease expired. Its [`RunHandle`] tells how it ends.
    Running(RunHandle),
    /// The key's run finished before: its stored outcome.
    Replay(StoredRecord),
    /// The key's run lives elsewhere (or its claim is in flight), or waits
    /// for an operator.
    Busy {
        /// When asking again makes sense.
        retry_after: Duration,
        /// Why the run waits for an operator, when it does.
        attention: Option<String>,
    },
}

/// A run executing in this process.
#[derive(Debug)]
pub struct RunHandle {
    id: RunId,
    resumed: bool,
    rx: watch::Receiver<Option<Ended>>,
}

impl RunHandle {
    /// The run.
    pub fn id(&self) -> &RunId {
        &self.id
    }

    /// Whether it was taken over from another executor rather than started.
    pub fn resumed(&self) -> bool {
        self.resumed
    }

    /// How this execution ended, if it ended within `within`. The run goes
    /// on after this returns `None`.
    pub async fn ended(&mut self, within: Duration) -> Option<Ended> {
        let waited = tokio::time::timeout(within, self.rx.wait_for(Option::is_some)).await;
        match waited {
            Ok(Ok(ended)) => ended.clone(),
            // The execution's task ended without a word: it panicked, and the
            // run was blocked for an operator (see `drive`).
            Ok(Err(_)) => Some(Ended::NeedsAttention {
                step: "-".into(),
                reason: "the workflow panicked".into(),
            }),
            Err(_) => None,
        }
    }
}

/// What [`Runs::busy`] found.
enum Busy {
    Answer(Started),
    /// Ask the key again: its run ended meanwhile.
    Again,
}

fn keep_all() -> Keep {
    Arc::new(|_| true)
}

impl<S: RunStore> Runs<S> {
    /// A builder with the default settings, on the store's clock
    /// ([`KeyStore::clock`](idem_core::KeyStore::clock): the host's for
    /// SQLite, the database server's for PostgreSQL), so executors on hosts
    /// whose clocks disagree judge each other's leases alike.
    pub fn builder(store: S) -> RunsBuilder<S> {
        let clock = store.clock();
        RunsBuilder {
            store,
            config: RunsConfig::default(),
            clock,
            workflows: HashMap::new(),
        }
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.shared.store
    }

    /// This executor's name in leases.
    pub fn holder(&self) -> &str {
        &self.shared.holder
    }

    /// The settings.
    pub fn config(&self) -> &RunsConfig {
        &self.shared.config
    }

    /// The operations with a workflow here.
    pub fn operations(&self) -> Vec<Operation> {
        let mut ops: Vec<Operation> = self.shared.workflows.keys().cloned().collect();
        ops.sort();
        ops
    }

    /// The workflow of `operation`, if registered.
    pub fn workflow(&self, operation: &Operation) -> Option<Arc<dyn Workflow<S>>> {
        self.shared
            .workflows
            .get(operation)
            .map(|r| r.workflow.clone())
    }

    /// Starts the run of `scope` with `input`, keeping every answer (see
    /// [`Runs::start_with`]).
    pub async fn start(
        &self,
        scope: &Scope,
        fingerprint: &Fingerprint,
        policy: &Policy,
        input: Vec<u8>,
    ) -> Result<Started, StartError> {
        self.start_with(scope, fingerprint, policy, input, keep_all())
            .await
    }

    /// Claims `scope`'s key and starts its run, in the claim's transaction,
    /// with `input`; or replays the key's stored outcome; or, when its run's
    /// executor died (lease expired), takes the run over and resumes it.
    /// `keep` decides whether an answer given before the first commit is
    /// stored.
    ///
    /// A run slot of this process is taken first (waiting at most
    /// `policy.wait`): nothing is written without one.
    ///
    /// # Cancel safety
    /// Cancel safe: the run executes in a task of its own; dropping this
    /// future before it returns leaves either nothing or a run that goes on.
    pub async fn start_with(
        &self,
        scope: &Scope,
        fingerprint: &Fingerprint,
        policy: &Policy,
        input: Vec<u8>,
        keep: Keep,
    ) -> Result<Started, StartError> {
        let shared = &self.shared;
        let Some(registered) = shared.workflows.get(&scope.operation) else {
            return Err(StartError::NotRegistered(scope.operation.to_string()));
        };
        let namespace = shared.namespace().await?;
        // Twice at most: a run of this key that just ended here leaves the
        // key replayable (or free again, if it ended before its first commit).
        for _ in 0..2 {
            let permit = tokio::time::timeout(policy.wait, shared.permits.clone().acquire_owned())
                .await
                .ok()
                .and_then(Result::ok)
                .ok_or(StartError::AtCapacity {
                    retry_after: Duration::from_secs(1),
                })?;
            match shared.engine.begin(scope, fingerprint, policy).await {
                Ok(Begun::Fresh(mut claimed)) => {
                    let now = shared.clock.now_ms();
                    let id = RunId::of(&namespace, scope);
                    let deadline =
                        i64::try_from(registered.policy.deadline.as_millis()).unwrap_or(0);
                    let ttl_ms = i64::try_from(policy.ttl.as_millis()).unwrap_or(i64::MAX / 4);
                    let locked_until_ms = now + shared.lease_ms();
                    let deadline_ms = now.saturating_add(deadline);
                    let new = NewRun {
                        id: &id,
                        scope,
                        input: &input,
                        holder: &shared.holder,
                        locked_until_ms,
                        deadline_ms,
                        ttl_ms,
                        now_ms: now,
                    };
                    let fence = match S::create_run(&mut claimed.tx, &new).await {
                        Ok(fence) => fence,
                        Err(e) => {
                            let _ = shared.engine.abort(claimed).await;
                            return Err(StartError::Store(e));
                        }
                    };
                    let record = RunRecord {
                        id: id.clone(),
                        scope: scope.clone(),
                        state: RunState::Running,
                        input,
                        recovery_point: None,
                        failure: None,
                        blocked_step: None,
                        attention: None,
                        no_return: false,
                        holder: Some(shared.holder.clone()),
                        locked_until_ms,
                        fence,
                        takeovers: 0,
                        deadline_ms,
                        ttl_ms,
                        created_at_ms: now,
                        updated_at_ms: now,
                        finished_at_ms: None,
                        steps: Vec::new(),
                    };
                    let lease = Lease {
                        run: id,
                        holder: shared.holder.clone(),
                        fence,
                    };
                    return Ok(Started::Running(self.spawn(
                        namespace,
                        record,
                        lease,
                        Some(claimed.tx),
                        keep,
                        permit,
                        false,
                    )));
                }
                Ok(Begun::Replay(record)) => return Ok(Started::Replay(record)),
                Err(Error::FingerprintMismatch) => return Err(StartError::FingerprintMismatch),
                Err(Error::InFlight { retry_after }) => {
                    // A retry holds no slot while it waits: only a takeover
                    // takes one.
                    drop(permit);
                    match self.busy(&namespace, scope, policy, retry_after).await? {
                        Busy::Answer(started) => return Ok(started),
                        Busy::Again => continue,
                    }
                }
                Err(Error::Store(e)) => return Err(StartError::Store(e)),
                Err(other) => {
                    return Err(StartError::Store(idem_core::StoreError::Database {
                        source: other.to_string().into(),
                    }));
                }
            }
        }
        Ok(Started::Busy {
            retry_after: Duration::from_secs(1),
            attention: None,
        })
    }

    /// The id of the run of `scope` here (in this database's namespace).
    pub async fn run_id(&self, scope: &Scope) -> Result<RunId, idem_core::StoreError> {
        Ok(RunId::of(&self.shared.namespace().await?, scope))
    }

    /// The key is pending: its run executes here (wait for it), elsewhere
    /// (busy), waits for an operator, or lost its executor (take it over).
    async fn busy(
        &self,
        namespace: &Namespace,
        scope: &Scope,
        policy: &Policy,
        retry_after: Duration,
    ) -> Result<Busy, StartError> {
        let shared = &self.shared;
        let id = RunId::of(namespace, scope);
        let local = shared
            .waiters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned();
        if let Some(mut rx) = local {
            // Executing in this process: wait for its end (bounded); then its
            // outcome is stored, or the key is free again.
            let ended = tokio::time::timeout(policy.wait, rx.wait_for(Option::is_some)).await;
            return Ok(match ended {
                Ok(_) => Busy::Again,
                Err(_) => Busy::Answer(Started::Busy {
                    retry_after: Duration::from_secs(1),
                    attention: None,
                }),
            });
        }
        let Some(run) = shared.store.load_run(&id).await? else {
            // The claim has not committed yet.
            return Ok(Busy::Answer(Started::Busy {
                retry_after,
                attention: None,
            }));
        };
        let now = shared.clock.now_ms();
        Ok(match run.state {
            RunState::NeedsAttention => Busy::Answer(Started::Busy {
                retry_after: Duration::from_secs(60),
                attention: run
                    .attention
                    .or(Some("an operator must resolve a step".into())),
            }),
            state if state.is_live() && run.locked_until_ms > now => Busy::Answer(Started::Busy {
                retry_after: Duration::from_millis(
                    u64::try_from(run.locked_until_ms - now).unwrap_or(1000),
                )
                .max(Duration::from_secs(1)),
                attention: None,
            }),
            state if state.is_live() => {
                let Ok(permit) = shared.permits.clone().try_acquire_owned() else {
                    return Ok(Busy::Answer(Started::Busy {
                        retry_after: Duration::from_secs(1),
                        attention: None,
                    }));
                };
                let until = now + shared.lease_ms();
                match shared
                    .store
                    .take_over(&id, &shared.holder, now, until)
                    .await?
                {
                    Some(record) => match record.lease() {
                        Some(lease) => {
                            crate::metrics::takeovers(1);
                            tracing::info!(run = %id, fence = %record.fence, "took over a run whose lease expired");
                            Busy::Answer(Started::Running(self.spawn(
                                namespace.clone(),
                                record,
                                lease,
                                None,
                                keep_all(),
                                permit,
                                true,
                            )))
                        }
                        None => Busy::Answer(Started::Busy {
                            retry_after,
                            attention: None,
                        }),
                    },
                    None => Busy::Answer(Started::Busy {
                        retry_after: Duration::from_secs(1),
                        attention: None,
                    }),
                }
            }
            // It finished between the claim and now: its outcome is stored.
            _ => Busy::Again,
        })
    }

    /// Executes a run whose lease this process holds, in a task of its own.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn spawn(
        &self,
        namespace: Namespace,
        record: RunRecord,
        lease: Lease,
        claim: Option<S::Tx>,
        keep: Keep,
        permit: OwnedSemaphorePermit,
        resumed: bool,
    ) -> RunHandle {
        let (tx, rx) = watch::channel(None);
        let id = record.id.clone();
        self.shared
            .waiters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.clone(), rx.clone());
        let shared = self.shared.clone();
        let task_id = id.clone();
        tokio::spawn(async move {
            let ended = drive(shared.clone(), namespace, record, lease, claim, keep).await;
            log_end(&task_id, &ended);
            shared
                .waiters
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&task_id);
            let _ = tx.send(Some(ended));
            drop(permit);
        });
        RunHandle { id, resumed, rx }
    }

    /// The worker that resumes runs whose lease expired (see
    /// [`Recovery`](crate::Recovery)).
    pub fn recovery(&self) -> crate::Recovery<S> {
        crate::Recovery::new(self.clone())
    }
}

fn log_end(id: &RunId, ended: &Ended) {
    match ended {
        Ended::Finished(c) => {
            tracing::debug!(run = %id, status = c.response.status, "run finished")
        }
        Ended::Discarded(c) => {
            tracing::debug!(run = %id, status = c.response.status, "run discarded before its first commit")
        }
        Ended::Aborted { error, .. } => {
            tracing::warn!(run = %id, error, "run aborted before its first commit")
        }
        Ended::NeedsAttention { step, reason } => {
            tracing::warn!(run = %id, step, reason, "run needs attention")
        }
        Ended::LeaseLost => tracing::warn!(run = %id, "lease lost; another executor holds the run"),
        Ended::Released { until_ms } => {
            tracing::info!(run = %id, until_ms, "run given back for a later retry")
        }
        Ended::StoreFailed { error, .. } => {
            tracing::warn!(run = %id, error, "store failed; the run resumes after its lease")
        }
        Ended::NotRegistered => tracing::warn!(run = %id, "no workflow for this run here"),
    }
}

/// Renews the lease every third of it while the run executes; says so when
/// it is lost (fenced out, or not renewed before it ended).
async fn heartbeat<S: RunStore>(
    shared: Arc<Shared<S>>,
    lease: Lease,
    beat: Arc<Beat>,
    lost: watch::Sender<bool>,
) {
    let every = shared.config.lease / 3;
    loop {
        tokio::time::sleep(every).await;
        if !beat.active.load(Ordering::SeqCst) {
            continue;
        }
        let now = shared.clock.now_ms();
        let until = now + shared.lease_ms();
        let change = RunChange {
            locked_until_ms: Some(until),
            ..RunChange::default()
        };
        match shared.store.record_run(&lease, &change, None, now).await {
            Ok(true) => beat.locked_until_ms.store(until, Ordering::SeqCst),
            Ok(false) => {
                crate::metrics::fence_rejected();
                tracing::warn!(run = %lease.run, fence = %lease.fence, "heartbeat fenced out: another executor took the run over");
                let _ = lost.send(true);
                return;
            }
            Err(e) => {
                if shared.clock.now_ms() >= beat.locked_until_ms.load(Ordering::SeqCst) {
                    tracing::warn!(run = %lease.run, error = %idem_core::ErrorChain(&e), "lease not renewed in time; stopping");
                    let _ = lost.send(true);
                    return;
                }
                tracing::debug!(run = %lease.run, error = %idem_core::ErrorChain(&e), "heartbeat failed; retrying");
            }
        }
    }
}

/// Executes one run to an end: the workflow from the top (recorded steps
/// return their results), then the final answer, compensation, a block for
/// an operator, or a stop.
async fn drive<S: RunStore>(
    shared: Arc<Shared<S>>,
    namespace: Namespace,
    record: RunRecord,
    lease: Lease,
    claim: Option<S::Tx>,
    keep: Keep,
) -> Ended {
    let Some(workflow) = shared
        .workflows
        .get(&record.scope.operation)
        .map(|r| r.workflow.clone())
    else {
        return Ended::NotRegistered;
    };
    let (lost_tx, lost_rx) = watch::channel(false);
    let mut run = Run::new(
        shared.clone(),
        namespace,
        record,
        lease.clone(),
        claim,
        lost_rx,
    );
    let outcome = {
        let beat = heartbeat(shared.clone(), lease.clone(), run.beat.clone(), lost_tx);
        let work = AssertUnwindSafe(execute(&mut run, &*workflow, keep)).catch_unwind();
        tokio::pin!(beat, work);
        let mut beating = true;
        loop {
            tokio::select! {
                outcome = &mut work => break outcome,
                () = &mut beat, if beating => beating = false,
            }
        }
    };
    match outcome {
        Ok(ended) => ended,
        Err(_) => {
            // A panic in the workflow would repeat on every resume: the run
            // waits for an operator instead.
            let claim_open = run.claim_open;
            run.rollback_open().await;
            drop(run);
            tracing::error!(run = %lease.run, "the workflow panicked");
            if claim_open {
                return Ended::Aborted {
                    error: "the workflow panicked".into(),
                    retryable: false,
                };
            }
            let reason = "the workflow panicked";
            let change = RunChange {
                state: Some(RunState::NeedsAttention),
                attention: Some(Some(("-", reason))),
                ..RunChange::default()
            };
            let _ = shared
                .store
                .record_run(&lease, &change, None, shared.clock.now_ms())
                .await;
            Ended::NeedsAttention {
                step: "-".into(),
                reason: reason.into(),
            }
        }
    }
}

async fn execute<S: RunStore>(run: &mut Run<S>, workflow: &dyn Workflow<S>, keep: Keep) -> Ended {
    let resumed_failing =
        run.record.state == RunState::Compensating || run.record.failure.is_some();
    run.mode = if resumed_failing {
        Mode::Compensating
    } else {
        Mode::Forward
    };
    let mut lost = run.lost.clone();
    let forward = guarded(&mut lost, workflow.run(run)).await.and_then(|r| r);
    match forward {
        Ok(_) if resumed_failing => fail(run, workflow, None).await,
        Ok(completion) => {
            if run.claim_open && !keep(&completion) {
                run.rollback_open().await;
                return Ended::Discarded(completion);
            }
            let state = match completion.state {
                RecordState::Failed => RunState::Failed,
                _ => RunState::Completed,
            };
            match run.finish(&completion, state).await {
                Ok(()) => Ended::Finished(completion),
                Err(stop) => stopped(run, stop).await,
            }
        }
        Err(Stop::Fail(failure)) => fail(run, workflow, Some(failure)).await,
        Err(Stop::Compensating) => fail(run, workflow, None).await,
        Err(Stop::Attention { step, reason }) => block(run, step, reason).await,
        Err(stop) => stopped(run, stop).await,
    }
}

/// Compensates, then stores the workflow's answer to the failure.
async fn fail<S: RunStore>(
    run: &mut Run<S>,
    workflow: &dyn Workflow<S>,
    failure: Option<Failure>,
) -> Ended {
    let failure = run
        .record
        .failure
        .clone()
        .or(failure)
        .unwrap_or_else(|| Failure::new("failed"));
    if run.record.no_return {
        let step = failure.step.clone().unwrap_or_else(|| "-".into());
        let reason = format!(
            "it failed after its point of no return ({}{}); it is never compensated",
            failure.reason,
            failure
                .detail
                .as_deref()
                .map(|d| format!(": {d}"))
                .unwrap_or_default()
        );
        return block(run, step, reason).await;
    }
    let mut lost = run.lost.clone();
    match guarded(&mut lost, run.compensate(&failure))
        .await
        .and_then(|r| r)
    {
        Ok(()) => {}
        Err(Stop::Attention { step, reason }) => return block(run, step, reason).await,
        Err(stop) => return stopped(run, stop).await,
    }
    run.mode = Mode::Finishing;
    let answer = guarded(&mut lost, workflow.failed(run, &failure))
        .await
        .and_then(|r| r);
    match answer {
        Ok(completion) => {
            // The answer to a failed run is stored as a failed outcome.
            let completion = Completion {
                state: RecordState::Failed,
                ..completion
            };
            match run.finish(&completion, RunState::Failed).await {
                Ok(()) => Ended::Finished(completion),
                Err(stop) => stopped(run, stop).await,
            }
        }
        Err(Stop::Attention { step, reason }) => block(run, step, reason).await,
        Err(stop) => stopped(run, stop).await,
    }
}

async fn block<S: RunStore>(run: &mut Run<S>, step: String, reason: String) -> Ended {
    if run.claim_open {
        run.rollback_open().await;
        return Ended::Aborted {
            error: format!("step {step}: {reason}"),
            retryable: false,
        };
    }
    match run.block(&step, &reason).await {
        Ok(()) => Ended::NeedsAttention { step, reason },
        Err(stop) => stopped(run, stop).await,
    }
}

async fn stopped<S: RunStore>(run: &mut Run<S>, stop: Stop) -> Ended {
    let claim_open = run.claim_open;
    run.rollback_open().await;
    match stop {
        Stop::Store(e) if claim_open => Ended::Aborted {
            retryable: e.retryable(),
            error: idem_core::ErrorChain(&e).to_string(),
        },
        Stop::Store(e) => Ended::StoreFailed {
            outcome_unknown: matches!(e, idem_core::StoreError::OutcomeUnknown { .. }),
            error: idem_core::ErrorChain(&e).to_string(),
        },
        _ if claim_open => Ended::Aborted {
            error: stop.to_string(),
            retryable: true,
        },
        Stop::Released { until_ms } => Ended::Released { until_ms },
        Stop::LeaseLost => Ended::LeaseLost,
        other => Ended::StoreFailed {
            error: other.to_string(),
            outcome_unknown: false,
        },
    }
}
