//! What a backend stores of a run and its steps: [`RunRecord`](crate::steps::RunRecord),
//! [`StepRecord`](crate::steps::StepRecord), [`Failure`](crate::steps::Failure), and the column sets the backends' decoders
//! fill ([`RunColumns`](crate::steps::RunColumns), [`StepColumns`](crate::steps::StepColumns)).

use crate::error::StoreError;
use crate::idempotency_key::IdempotencyKey;
use crate::scope::{Operation, Scope, Tenant};

use super::names::{Fence, RunId};
use super::state::{RunState, StepKind, StepState};

/// One step's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepRecord {
    /// The step's name.
    pub name: String,
    /// Its order of first appearance in the run (1, 2, …).
    pub seq: i64,
    /// What it does.
    pub kind: StepKind,
    /// Where it is.
    pub state: StepState,
    /// Attempts started so far.
    pub attempts: u32,
    /// Attempts that failed (answered with an error, or timed out); what a
    /// retry budget counts. An attempt cut short by a crash is not one.
    pub failures: u32,
    /// The key it sends downstream (or its message id).
    pub key: String,
    /// The fence of the executor that wrote this record last.
    pub fence: Fence,
    /// The recorded result (JSON), once `Done`. On the compensation of a
    /// call whose outcome was unknown (`undo`): what the call's lookup
    /// found, as soon as it is known (`{"lookup":"found","value":…}`, then
    /// kept once done; or `{"lookup":"not_found"}`, done: nothing undone).
    pub result: Option<Vec<u8>>,
    /// The last error, if an attempt failed.
    pub error: Option<String>,
    /// When its first attempt started (unix ms).
    pub started_at_ms: Option<i64>,
    /// When it was recorded done or failed (unix ms).
    pub finished_at_ms: Option<i64>,
    /// When the record last changed (unix ms).
    pub updated_at_ms: i64,
}

/// Why a run failed or is being compensated: stored with the run, so a
/// resumed executor fails it for the same reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// A short machine-readable reason (`card_declined`, `deadline`,
    /// `step_failed`).
    pub reason: String,
    /// The step it happened at, if any.
    pub step: Option<String>,
    /// What happened, for operators.
    pub detail: Option<String>,
}

impl Failure {
    /// A failure with only a reason.
    pub fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            step: None,
            detail: None,
        }
    }

    /// The stored form (JSON).
    pub fn to_json(&self) -> String {
        serde_json::json!({"reason": self.reason, "step": self.step, "detail": self.detail})
            .to_string()
    }

    /// Reads the stored form.
    pub fn from_json(text: &str) -> Option<Self> {
        let v: serde_json::Value = serde_json::from_str(text).ok()?;
        let text = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_owned);
        Some(Self {
            reason: text("reason")?,
            step: text("step"),
            detail: text("detail"),
        })
    }
}

/// A run as read from a store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRecord {
    /// Its id, derived from the scope.
    pub id: RunId,
    /// The scope whose key record carries its final outcome.
    pub scope: Scope,
    /// Where it is.
    pub state: RunState,
    /// What it was started with (the request body).
    pub input: Vec<u8>,
    /// The last step recorded done.
    pub recovery_point: Option<String>,
    /// Why it is compensating or failed.
    pub failure: Option<Failure>,
    /// The step an operator must resolve, in `needs_attention`.
    pub blocked_step: Option<String>,
    /// Why it needs attention.
    pub attention: Option<String>,
    /// Whether it passed its point of no return (no compensation after it).
    pub no_return: bool,
    /// The executor holding the lease, if any.
    pub holder: Option<String>,
    /// Until when the lease holds (unix ms); a released run is due then.
    pub locked_until_ms: i64,
    /// The current fence.
    pub fence: Fence,
    /// How often another executor took it over.
    pub takeovers: u32,
    /// After this (unix ms) it compensates instead of retrying, unless it
    /// passed its point of no return.
    pub deadline_ms: i64,
    /// How long its key record and its own record live once it finished.
    pub ttl_ms: i64,
    /// When it started (unix ms).
    pub created_at_ms: i64,
    /// When it last changed (unix ms).
    pub updated_at_ms: i64,
    /// When it finished (unix ms).
    pub finished_at_ms: Option<i64>,
    /// Its steps in order ([`RunStore::list_runs`](crate::steps::RunStore::list_runs) leaves them out).
    pub steps: Vec<StepRecord>,
}

impl RunRecord {
    /// The record of step `name`, if it has one.
    pub fn step(&self, name: &str) -> Option<&StepRecord> {
        self.steps.iter().find(|s| s.name == name)
    }

    /// The lease this record says is held (for the executor that just took it).
    pub fn lease(&self) -> Option<Lease> {
        Some(Lease {
            run: self.id.clone(),
            holder: self.holder.clone()?,
            fence: self.fence,
        })
    }
}

/// A run's columns as read from any backend, before validation.
#[derive(Debug, Clone, Default)]
#[allow(missing_docs)]
pub struct RunColumns {
    pub id: String,
    pub tenant_id: String,
    pub operation: String,
    pub idempotency_key: String,
    pub state: String,
    pub input: Vec<u8>,
    pub recovery_point: Option<String>,
    pub failure: Option<String>,
    pub blocked_step: Option<String>,
    pub attention: Option<String>,
    pub no_return: bool,
    pub holder: Option<String>,
    pub locked_until_ms: i64,
    pub fence: i64,
    pub takeovers: i64,
    pub deadline_ms: i64,
    pub ttl_ms: i64,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub finished_at_ms: Option<i64>,
}

pub(super) fn corrupt(detail: String) -> StoreError {
    StoreError::Corrupt { detail }
}

impl RunColumns {
    /// Validates the columns into a record (without steps).
    pub fn decode(self) -> Result<RunRecord, StoreError> {
        let scope = Scope::new(
            Tenant::new(self.tenant_id).map_err(|e| corrupt(format!("run tenant: {e}")))?,
            Operation::new(self.operation).map_err(|e| corrupt(format!("run operation: {e}")))?,
            IdempotencyKey::new(self.idempotency_key)
                .map_err(|e| corrupt(format!("run key: {e}")))?,
        );
        let failure = match self.failure {
            None => None,
            Some(text) => Some(
                Failure::from_json(&text)
                    .ok_or_else(|| corrupt(format!("run failure {text:?}")))?,
            ),
        };
        Ok(RunRecord {
            id: RunId::parse(&self.id).map_err(|e| corrupt(e.to_string()))?,
            scope,
            state: RunState::parse(&self.state)
                .ok_or_else(|| corrupt(format!("run state {:?}", self.state)))?,
            input: self.input,
            recovery_point: self.recovery_point,
            failure,
            blocked_step: self.blocked_step,
            attention: self.attention,
            no_return: self.no_return,
            holder: self.holder,
            locked_until_ms: self.locked_until_ms,
            fence: Fence(self.fence),
            takeovers: u32::try_from(self.takeovers).unwrap_or(u32::MAX),
            deadline_ms: self.deadline_ms,
            ttl_ms: self.ttl_ms,
            created_at_ms: self.created_at_ms,
            updated_at_ms: self.updated_at_ms,
            finished_at_ms: self.finished_at_ms,
            steps: Vec::new(),
        })
    }
}

/// A step's columns as read from any backend, before validation.
#[derive(Debug, Clone, Default)]
#[allow(missing_docs)]
pub struct StepColumns {
    pub run_id: String,
    pub name: String,
    pub seq: i64,
    pub kind: String,
    pub state: String,
    pub attempts: i64,
    pub failures: i64,
    pub step_key: String,
    pub fence: i64,
    pub result: Option<Vec<u8>>,
    pub error: Option<String>,
    pub started_at_ms: Option<i64>,
    pub finished_at_ms: Option<i64>,
    pub updated_at_ms: i64,
}

impl StepColumns {
    /// Validates the columns into a step record; returns its run's id too.
    pub fn decode(self) -> Result<(String, StepRecord), StoreError> {
        let record = StepRecord {
            kind: StepKind::parse(&self.kind)
                .ok_or_else(|| corrupt(format!("step kind {:?}", self.kind)))?,
            state: StepState::parse(&self.state)
                .ok_or_else(|| corrupt(format!("step state {:?}", self.state)))?,
            name: self.name,
            seq: self.seq,
            attempts: u32::try_from(self.attempts).unwrap_or(u32::MAX),
            failures: u32::try_from(self.failures).unwrap_or(u32::MAX),
            key: self.step_key,
            fence: Fence(self.fence),
            result: self.result,
            error: self.error,
            started_at_ms: self.started_at_ms,
            finished_at_ms: self.finished_at_ms,
            updated_at_ms: self.updated_at_ms,
        };
        Ok((self.run_id, record))
    }
}

/// Attaches decoded steps (in `seq` order) to their runs.
pub fn attach_steps(runs: &mut [RunRecord], steps: Vec<(String, StepRecord)>) {
    for (run_id, step) in steps {
        if let Some(run) = runs.iter_mut().find(|r| r.id.as_str() == run_id) {
            run.steps.push(step);
        }
    }
    for run in runs {
        run.steps.sort_by_key(|s| s.seq);
    }
}

/// A held lease: whose, and with which fence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The run.
    pub run: RunId,
    /// The executor holding it.
    pub holder: String,
    /// The fence it was taken with.
    pub fence: Fence,
}
