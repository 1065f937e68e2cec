//! How a run ends: its final answer, compensation then the workflow's
//! answer to the failure, a block for an operator, or a stop — and the
//! writes that make each final.

use std::sync::Arc;

use idem_core::steps::{Failure, RunChange, RunState, RunStore};
use idem_core::{Completion, RecordState};

use super::lease::guarded;
use super::{Mode, Run};
use crate::error::{Ended, Stop};
use crate::workflow::Workflow;

/// Whether a run that ends before its first commit keeps its answer (and
/// its key): the HTTP layer keeps what its route stores (a `409` business
/// error) and discards the rest (a validation `400`, so the key is not used
/// up). Everything after the first commit is kept.
pub type Keep = Arc<dyn Fn(&Completion) -> bool + std::marker::Send + Sync>;

impl<S: RunStore> Run<S> {
    /// Stops at `step` for an operator; recorded if the run exists.
    async fn block(&mut self, step: &str, reason: &str) -> Result<(), Stop> {
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
    async fn finish(
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
        self.exec
            .store
            .complete(tx, &self.record.scope, &stored, now)
            .await
            .map_err(Stop::Store)?;
        self.remember(&change, None);
        self.claim_open = false;
        Ok(())
    }
}

/// The workflow from the top, then how the run ends: a run resumed while
/// failing goes on compensating; an answer given before the first commit
/// that `keep` refuses is discarded with the claim.
pub(super) async fn execute<S: RunStore>(
    run: &mut Run<S>,
    workflow: &dyn Workflow<S>,
    keep: Keep,
) -> Ended {
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

/// Blocks the run for an operator; before its first commit there is no run
/// to block, and the claim is aborted instead.
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

/// The run stops without an end of its own: the open transaction rolls
/// back, and the stop says what becomes of it.
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
