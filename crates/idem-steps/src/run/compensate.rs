//! Compensation: the registered undos of the steps that happened, newest
//! first, each a recorded step of its own.

use idem_core::failpoint;
use idem_core::steps::{
    Failure, RunChange, RunState, RunStore, StepKey, StepKind, StepName, StepRecord, StepState,
};
use serde_json::{Value as Json, json};

use super::undo::{LookupCtx, LookupFn, Undo, UndoAction, UndoCallFn, UndoCtx, UndoPhaseFn};
use super::{Mode, Run};
use crate::error::{StepError, Stop};

/// What a compensation learned of a call whose outcome was unknown, by its
/// lookup. Recorded on the compensation's own step record (`result`) as
/// soon as it is known, so no executor asks again: `{"lookup":"found",
/// "value":…}` (then the undo runs with the value) or
/// `{"lookup":"not_found"}` (the record is done: nothing to undo).
#[derive(Debug, Clone, PartialEq)]
enum Learned {
    Found(Json),
    NotFound,
}

impl Learned {
    fn encode(&self) -> Vec<u8> {
        match self {
            Learned::Found(value) => json!({"lookup": "found", "value": value}),
            Learned::NotFound => json!({"lookup": "not_found"}),
        }
        .to_string()
        .into_bytes()
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        let mut v: Json = serde_json::from_slice(bytes).ok()?;
        match v.get("lookup")?.as_str()? {
            "found" => Some(Learned::Found(v.get_mut("value")?.take())),
            "not_found" => Some(Learned::NotFound),
            _ => None,
        }
    }
}

/// What the compensation of a call works from.
enum Outcome {
    /// The call's result (JSON): recorded, or found by the lookup.
    Known(Vec<u8>),
    /// The lookup found nothing after the landing window: nothing to undo.
    Nothing,
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
    pub(super) async fn compensate(&mut self, failure: &Failure) -> Result<(), Stop> {
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
        let applies = match &undo.action {
            UndoAction::Phase(_) => target.state == StepState::Done,
            // A call that never started, failed for good, or only ever
            // certainly did nothing has nothing to undo.
            UndoAction::Call { .. } => {
                target.attempts > 0
                    && !matches!(target.state, StepState::Failed | StepState::NotSent)
            }
        };
        if !applies
            || self
                .existing(&undo.name)
                .is_some_and(|r| r.state == StepState::Done)
        {
            return Ok(());
        }
        let key = StepKey::derive(&self.namespace, &self.record.scope, &undo.name);
        self.resume_backoff(&undo.name).await?;
        match &undo.action {
            UndoAction::Phase(f) => {
                let result = target.result.clone();
                self.undo_phase(&undo.name, &key, f, result.as_deref().unwrap_or(b"null"))
                    .await
            }
            UndoAction::Call { undo: f, lookup } => {
                let undone = StepName::new(target.name.clone()).map_err(|e| Stop::Attention {
                    step: target.name.clone(),
                    reason: e.to_string(),
                })?;
                let undone = StepKey::derive(&self.namespace, &self.record.scope, &undone);
                let value = match self
                    .outcome(&undo.name, &key, &target, &undone, lookup.as_ref())
                    .await?
                {
                    Outcome::Known(value) => value,
                    Outcome::Nothing => return Ok(()),
                };
                self.undo_call(&undo.name, &key, undone, f, &value).await
            }
        }
    }

    /// A phase's compensation: local work, committed with its record.
    async fn undo_phase(
        &mut self,
        name: &StepName,
        key: &StepKey,
        f: &UndoPhaseFn<S::Tx>,
        result: &[u8],
    ) -> Result<(), Stop> {
        let mut last_error: Option<String> = None;
        loop {
            self.next_attempt(name, true, last_error.as_deref())?;
            let mut tx = self.tx().await?;
            match f(&mut tx, result).await {
                Ok(()) => {
                    let rec = self.attempt_record(name, StepKind::UndoPhase, key.as_str());
                    let rec = self.done(rec, b"null".to_vec());
                    self.open = Some(tx);
                    self.write_now(&RunChange::default(), Some(&rec)).await?;
                    crate::metrics::compensation("done");
                    return Ok(());
                }
                Err(e) => {
                    let _ = self.exec.store.rollback(tx).await;
                    let reason = match self.phase_error(name, e) {
                        Stop::Attention { reason, .. } => reason,
                        stop => return Err(stop),
                    };
                    // Rolled back, so certainly not done; counted, so
                    // the budget holds across executors.
                    let mut rec = self.attempt_record(name, StepKind::UndoPhase, key.as_str());
                    rec.state = StepState::NotSent;
                    rec.error = Some(reason.clone());
                    rec.failures = rec.failures.saturating_add(1);
                    self.write_now(&RunChange::default(), Some(&rec)).await?;
                    last_error = Some(reason);
                    self.pause(rec.failures).await?;
                }
            }
        }
    }

    /// What the compensated call did, before anything is undone: its
    /// recorded result; or, when its outcome is unknown, what its lookup
    /// finds — recorded on the compensation's record as soon as it is
    /// known. "Not found" is trusted only from a lookup that starts once a
    /// request the call sent can no longer land ([`Run::landing_ends`]);
    /// until then the compensation waits. Without a lookup, or when the
    /// lookup fails for good or past its budget, the run waits for an
    /// operator: an unknown outcome is never undone blind, and the call is
    /// never sent again to find out.
    async fn outcome(
        &mut self,
        name: &StepName,
        key: &StepKey,
        target: &StepRecord,
        undone: &StepKey,
        lookup: Option<&LookupFn>,
    ) -> Result<Outcome, Stop> {
        if target.state == StepState::Done {
            return Ok(Outcome::Known(
                target.result.clone().unwrap_or_else(|| b"null".to_vec()),
            ));
        }
        // Learned before, by this executor or one that died since.
        let learned = self
            .existing(name)
            .and_then(|r| r.result)
            .and_then(|b| Learned::decode(&b));
        match learned {
            Some(Learned::Found(value)) => return Self::known(name, &value),
            Some(Learned::NotFound) => return Ok(Outcome::Nothing),
            None => {}
        }
        let check = format!(
            "nothing is undone blind: find out at the other system what the request with key \
             {undone} did; once nothing is left to undo (it did not happen, or it was undone by \
             hand), resolve the run --as sent"
        );
        let Some(lookup) = lookup else {
            let reason = format!(
                "the outcome of {} is unknown and it has no lookup; {check}",
                target.name
            );
            // On record (nothing attempted), so an operator can resolve it.
            let mut rec = self.attempt_record(name, StepKind::Undo, key.as_str());
            rec.attempts = rec.attempts.saturating_sub(1);
            rec.state = StepState::NotSent;
            rec.error = Some(reason.clone());
            self.write_now(&RunChange::default(), Some(&rec)).await?;
            return Err(Stop::Attention {
                step: name.as_str().to_owned(),
                reason,
            });
        };
        let landing = self.landing_ends(target);
        let mut last_error: Option<String> = None;
        loop {
            self.next_attempt(name, true, last_error.as_deref())?;
            self.ensure_lease()?;
            let asked_at = self.now();
            let mut rec = self.attempt_record(name, StepKind::Undo, key.as_str());
            // A lookup undoes nothing.
            rec.state = StepState::NotSent;
            let ctx = LookupCtx {
                key: undone.clone(),
                fence: self.lease.fence,
                attempt: rec.attempts,
            };
            let answer = self.timed(lookup(ctx)).await?;
            crate::metrics::lookup(name.as_str(), &answer);
            match answer {
                Ok(Some(value)) => {
                    rec.result = Some(Learned::Found(value.clone()).encode());
                    rec.error = None;
                    self.write_now(&RunChange::default(), Some(&rec)).await?;
                    tracing::info!(run = %self.record.id, step = %name, undone = %target.name,
                                   "the lookup found the call's effect; undoing it");
                    return Self::known(name, &value);
                }
                Ok(None) if asked_at >= landing => {
                    rec.result = Some(Learned::NotFound.encode());
                    rec.error = None;
                    let rec = StepRecord {
                        state: StepState::Done,
                        finished_at_ms: Some(self.now()),
                        ..rec
                    };
                    self.write_now(&RunChange::default(), Some(&rec)).await?;
                    crate::metrics::compensation("nothing_found");
                    tracing::info!(run = %self.record.id, step = %name, undone = %target.name,
                                   "the lookup found no effect after the landing window: nothing to undo");
                    return Ok(Outcome::Nothing);
                }
                Ok(None) => {
                    // A request the call sent may still land: ask again
                    // once it cannot (a long wait gives the run back).
                    tracing::info!(run = %self.record.id, step = %name, undone = %target.name,
                                   landing_ends_ms = landing,
                                   "not found yet; asking again after the landing window");
                    self.wait_until(landing).await?;
                }
                Err(StepError::Permanent(e)) => {
                    rec.error = Some(format!("lookup: {e}"));
                    rec.failures = rec.failures.saturating_add(1);
                    self.write_now(&RunChange::default(), Some(&rec)).await?;
                    crate::metrics::compensation("failed");
                    return Err(Stop::Attention {
                        step: name.as_str().to_owned(),
                        reason: format!(
                            "the lookup of {} failed for good ({e}); {check}",
                            target.name
                        ),
                    });
                }
                Err(e) => {
                    rec.error = Some(format!("lookup: {e}"));
                    rec.failures = rec.failures.saturating_add(1);
                    self.write_now(&RunChange::default(), Some(&rec)).await?;
                    last_error = rec.error;
                    self.pause(rec.failures).await?;
                }
            }
        }
    }

    fn known(name: &StepName, value: &Json) -> Result<Outcome, Stop> {
        serde_json::to_vec(value)
            .map(Outcome::Known)
            .map_err(|e| Stop::Attention {
                step: name.as_str().to_owned(),
                reason: format!("the lookup's result does not encode as JSON: {e}"),
            })
    }

    /// When a request the call of `target` sent can no longer land, on the
    /// run's clock: its record's last write (at or after its last attempt's
    /// start) plus the call timeout (no request of it is handed to the
    /// network later, see [`Run::timed`]) plus
    /// [`RunsConfig::landing_margin`](crate::RunsConfig::landing_margin)
    /// (the network and the other system still acting on it).
    pub(super) fn landing_ends(&self, target: &StepRecord) -> i64 {
        let ms = |d: std::time::Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4);
        target
            .updated_at_ms
            .saturating_add(ms(self.exec.config.call_timeout))
            .saturating_add(ms(self.exec.config.landing_margin))
    }

    /// A call's compensation, with the call's result: an external call with
    /// its own derived key, retried with it.
    async fn undo_call(
        &mut self,
        name: &StepName,
        key: &StepKey,
        undone: StepKey,
        f: &UndoCallFn,
        value: &[u8],
    ) -> Result<(), Stop> {
        let mut last_error: Option<String> = None;
        loop {
            self.next_attempt(name, true, last_error.as_deref())?;
            let mut rec = self.attempt_record(name, StepKind::Undo, key.as_str());
            self.start_attempt(&rec, false).await?;
            let ctx = UndoCtx {
                key: key.clone(),
                undone: undone.clone(),
                fence: self.lease.fence,
                attempt: rec.attempts,
            };
            failpoint::hit("steps.undo.before_call");
            let answer = self.timed(f(ctx, value)).await?;
            crate::metrics::attempt(name.as_str(), &answer);
            match answer {
                Ok(()) => {
                    failpoint::hit("steps.undo.after_call");
                    // What it undid stays on its record.
                    let result = rec.result.take().unwrap_or_else(|| b"null".to_vec());
                    let rec = self.done(rec, result);
                    self.write_now(&RunChange::default(), Some(&rec)).await?;
                    crate::metrics::compensation("done");
                    return Ok(());
                }
                Err(StepError::Permanent(e)) => {
                    rec.error = Some(e.clone());
                    self.write_now(&RunChange::default(), Some(&rec)).await?;
                    crate::metrics::compensation("failed");
                    return Err(Stop::Attention {
                        step: name.as_str().to_owned(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_lookup_learned_round_trips() {
        for learned in [
            Learned::Found(json!({"outcome": "paid", "payment_id": "pay_1"})),
            Learned::Found(Json::Null),
            Learned::NotFound,
        ] {
            assert_eq!(Learned::decode(&learned.encode()), Some(learned));
        }
        for other in [&b"null"[..], b"{}", b"{\"lookup\":\"maybe\"}", b"not json"] {
            assert_eq!(Learned::decode(other), None);
        }
    }
}
