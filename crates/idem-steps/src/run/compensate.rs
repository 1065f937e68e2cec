//! Compensation: the registered undos of the steps that happened, newest
//! first, each a recorded step of its own.

use std::sync::Arc;

use idem_core::failpoint;
use idem_core::steps::{
    Failure, Fence, RunChange, RunState, RunStore, StepKey, StepKind, StepName, StepState,
};
use idem_core::{BoxError, BoxFuture};

use super::{Mode, Run};
use crate::error::{StepError, Stop};

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
pub(super) fn undo_phase_fn<Tx, F>(f: F) -> F
where
    F: for<'t> Fn(&'t mut Tx, &'t [u8]) -> BoxFuture<'t, Result<(), BoxError>>,
{
    f
}

impl<S: RunStore> Run<S> {
    pub(super) fn register(
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
}
