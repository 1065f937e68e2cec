//! The operator's way out of `needs_attention`: [`resolve`].

use idem_core::steps::{
    Lease, MessageState, RunChange, RunId, RunRecord, RunState, RunStore, StepKind, StepRecord,
    StepState,
};

use crate::error::ResolveError;
use crate::run::send::Sent;

/// What an operator says about the step a run is blocked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// It happened (the operator checked the sink): record it done; it is
    /// never attempted again. Only for steps without a result the workflow
    /// needs: sends, at-most-once effects, compensations.
    Sent,
    /// It did not happen: it may be attempted again (once more, for an
    /// at-most-once effect); its failures count starts over.
    NotSent,
}

/// What [`resolve`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The run.
    pub run: RunId,
    /// The step resolved.
    pub step: String,
    /// The state the run went back to (`running` or `compensating`), due
    /// at once for any executor: the recovery worker or a retry resumes it.
    pub state: RunState,
}

/// Resolves the step run `id` is blocked at, as an operator: the step is
/// recorded as sent (done) or not sent, the run goes back to `running` (or
/// `compensating`, if it was compensating), its lease is released, due now,
/// and its fence grows by one, so an executor still holding it records
/// nothing more.
pub async fn resolve<S: RunStore>(
    store: &S,
    id: &RunId,
    resolution: Resolution,
    now_ms: i64,
) -> Result<Resolved, ResolveError> {
    let run = store
        .load_run(id)
        .await?
        .ok_or_else(|| ResolveError::NotFound(id.to_string()))?;
    let plan = Plan::of(run, resolution, now_ms)?;
    if !store
        .record_run(&plan.lease, &plan.change(), plan.step.as_ref(), now_ms)
        .await?
    {
        return Err(ResolveError::Changed(id.to_string()));
    }
    Ok(plan.done(resolution))
}

/// [`resolve`] written in `tx` (an admin request's transaction, which
/// commits it with its audit row): `run` is the run as loaded; the write is
/// conditional on its fence, so a run that changed since is
/// [`ResolveError::Changed`].
pub async fn resolve_in<S: RunStore>(
    tx: &mut S::Tx,
    run: RunRecord,
    resolution: Resolution,
    now_ms: i64,
) -> Result<Resolved, ResolveError> {
    let plan = Plan::of(run, resolution, now_ms)?;
    if !S::record_run_in(tx, &plan.lease, &plan.change(), plan.step.as_ref(), now_ms).await? {
        return Err(ResolveError::Changed(plan.lease.run.to_string()));
    }
    Ok(plan.done(resolution))
}

/// What a resolution writes.
struct Plan {
    lease: Lease,
    state: RunState,
    step_name: String,
    step: Option<StepRecord>,
    message: Option<(String, MessageState)>,
    now_ms: i64,
}

impl Plan {
    fn of(run: RunRecord, resolution: Resolution, now_ms: i64) -> Result<Self, ResolveError> {
        let id = &run.id;
        if run.state != RunState::NeedsAttention {
            return Err(ResolveError::NotBlocked {
                run: id.to_string(),
                state: run.state,
            });
        }
        let step_name = run.blocked_step.clone().unwrap_or_else(|| "-".into());
        let mut step = run.step(&step_name).cloned();
        let message = match (&mut step, resolution) {
            (None, Resolution::Sent) => {
                return Err(ResolveError::ValueNeeded {
                    run: id.to_string(),
                    step: step_name,
                });
            }
            (None, Resolution::NotSent) => None,
            (Some(rec), Resolution::Sent) => {
                rec.result = Some(match rec.kind {
                    StepKind::Send | StepKind::AtMostOnce => {
                        serde_json::to_vec(&Sent::Operator).unwrap_or_default()
                    }
                    StepKind::Undo | StepKind::UndoPhase => b"null".to_vec(),
                    StepKind::Call | StepKind::Phase => {
                        return Err(ResolveError::ValueNeeded {
                            run: id.to_string(),
                            step: step_name,
                        });
                    }
                });
                rec.state = StepState::Done;
                rec.error = Some("resolved by an operator: sent".into());
                rec.finished_at_ms = Some(now_ms);
                matches!(rec.kind, StepKind::Send | StepKind::AtMostOnce)
                    .then(|| (rec.key.clone(), MessageState::Sent))
            }
            (Some(rec), Resolution::NotSent) => {
                rec.state = StepState::NotSent;
                // Its retries start over: the operator's decision resets the
                // budget that sent it here (its attempts stay on record).
                rec.failures = 0;
                rec.error = Some("resolved by an operator: not sent".into());
                matches!(rec.kind, StepKind::Send | StepKind::AtMostOnce)
                    .then(|| (rec.key.clone(), MessageState::NotSent))
            }
        };
        let state = if run.failure.is_some() {
            RunState::Compensating
        } else {
            RunState::Running
        };
        let lease = Lease {
            run: run.id.clone(),
            holder: run.holder.clone().unwrap_or_default(),
            fence: run.fence,
        };
        Ok(Self {
            lease,
            state,
            step_name,
            step,
            message,
            now_ms,
        })
    }

    fn change(&self) -> RunChange<'_> {
        RunChange {
            state: Some(self.state),
            attention: Some(None),
            bump_fence: true,
            release: true,
            locked_until_ms: Some(self.now_ms),
            message: self.message.as_ref().map(|(id, s)| (id.as_str(), *s)),
            ..RunChange::default()
        }
    }

    fn done(self, resolution: Resolution) -> Resolved {
        tracing::info!(run = %self.lease.run, step = %self.step_name, ?resolution, "resolved by an operator");
        Resolved {
            run: self.lease.run,
            step: self.step_name,
            state: self.state,
        }
    }
}
