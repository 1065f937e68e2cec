//! The recording: fenced writes into the open transaction or one of their
//! own, step records, and what a step's result becomes on record.

use idem_core::steps::{Failure, RunChange, RunStore, StepKind, StepName, StepRecord, StepState};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::sync::atomic::Ordering;

use super::Run;
use crate::error::Stop;

impl<S: RunStore> Run<S> {
    pub(super) fn begin_step(&mut self, name: &str) -> Result<StepName, Stop> {
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

    pub(super) fn existing(&self, name: &StepName) -> Option<StepRecord> {
        self.record.step(name.as_str()).cloned()
    }

    /// The record of a step about to be attempted (its next attempt).
    pub(super) fn attempt_record(&self, name: &StepName, kind: StepKind, key: &str) -> StepRecord {
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

    pub(super) fn remember(&mut self, change: &RunChange<'_>, step: Option<&StepRecord>) {
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
    pub(super) async fn write(
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
                self.exec
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
    pub(super) async fn rollback_open(&mut self) {
        if let Some(tx) = self.open.take() {
            let _ = self.exec.store.rollback(tx).await;
        }
    }

    /// Commits the open transaction, if any.
    pub(super) async fn commit_open(&mut self) -> Result<(), Stop> {
        if let Some(tx) = self.open.take() {
            self.exec.store.commit(tx).await.map_err(Stop::Store)?;
            if self.claim_open {
                self.claim_open = false;
                self.beat.active.store(true, Ordering::SeqCst);
            }
        }
        Ok(())
    }

    /// A fenced write made durable now.
    pub(super) async fn write_now(
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
    pub(super) async fn write_lazily(
        &mut self,
        change: &RunChange<'_>,
        step: Option<&StepRecord>,
    ) -> Result<(), Stop> {
        if self.open.is_none() {
            self.open = Some(self.exec.store.begin().await.map_err(Stop::Store)?);
        }
        self.write(change, step).await
    }

    /// The open transaction, or a new one.
    pub(super) async fn tx(&mut self) -> Result<S::Tx, Stop> {
        match self.open.take() {
            Some(tx) => Ok(tx),
            None => self.exec.store.begin().await.map_err(Stop::Store),
        }
    }

    pub(super) fn decode<T: DeserializeOwned>(rec: &StepRecord) -> Result<T, Stop> {
        let bytes = rec.result.as_deref().unwrap_or(b"null");
        serde_json::from_slice(bytes).map_err(|e| Stop::Attention {
            step: rec.name.clone(),
            reason: format!(
                "its recorded result does not decode as this workflow's type ({e}): \
                 the workflow changed under a run in flight"
            ),
        })
    }

    pub(super) fn encode<T: Serialize>(step: &StepName, value: &T) -> Result<Vec<u8>, Stop> {
        serde_json::to_vec(value).map_err(|e| Stop::Attention {
            step: step.as_str().to_owned(),
            reason: format!("its result does not encode as JSON: {e}"),
        })
    }

    pub(super) fn failed_step(rec: &StepRecord) -> Stop {
        Stop::Fail(Failure {
            reason: "step_failed".into(),
            step: Some(rec.name.clone()),
            detail: rec.error.clone(),
        })
    }

    pub(super) fn done(&self, mut rec: StepRecord, result: Vec<u8>) -> StepRecord {
        rec.state = StepState::Done;
        rec.result = Some(result);
        rec.error = None;
        rec.finished_at_ms = Some(self.now());
        rec
    }

    // ---- the end ---------------------------------------------------------
}
