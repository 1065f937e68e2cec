//! Starting a run with its key: a fresh key creates the run in the claim's
//! transaction; a pending one is executing here (wait), elsewhere (busy),
//! waiting for an operator, or abandoned (taken over). Each run executes in
//! a task of its own.

use std::sync::Arc;
use std::time::Duration;

use idem_core::steps::{Lease, Namespace, NewRun, RunId, RunRecord, RunState, RunStore};
use idem_core::{Begun, Clock, Error, Fingerprint, Policy, Scope};
use tokio::sync::{OwnedSemaphorePermit, watch};

use super::{RunHandle, Runs, Started};
use crate::error::{Ended, StartError};
use crate::run::drive::drive;
use crate::run::end::Keep;

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
                    let now = shared.exec.clock.now_ms();
                    let id = RunId::of(&namespace, scope);
                    let deadline =
                        i64::try_from(registered.policy.deadline.as_millis()).unwrap_or(0);
                    let ttl_ms = i64::try_from(policy.ttl.as_millis()).unwrap_or(i64::MAX / 4);
                    let locked_until_ms = now + shared.exec.lease_ms();
                    let deadline_ms = now.saturating_add(deadline);
                    let new = NewRun {
                        id: &id,
                        scope,
                        input: &input,
                        holder: &shared.exec.holder,
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
                        holder: Some(shared.exec.holder.clone()),
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
                        holder: shared.exec.holder.clone(),
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
        let Some(run) = shared.exec.store.load_run(&id).await? else {
            // The claim has not committed yet.
            return Ok(Busy::Answer(Started::Busy {
                retry_after,
                attention: None,
            }));
        };
        let now = shared.exec.clock.now_ms();
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
                let until = now + shared.exec.lease_ms();
                match shared
                    .exec
                    .store
                    .take_over(&id, &shared.exec.holder, now, until)
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
        let workflow = shared
            .workflows
            .get(&record.scope.operation)
            .map(|r| r.workflow.clone());
        tokio::spawn(async move {
            let ended = match workflow {
                Some(workflow) => {
                    let exec = shared.exec.clone();
                    drive(exec, workflow, namespace, record, lease, claim, keep).await
                }
                None => Ended::NotRegistered,
            };
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
