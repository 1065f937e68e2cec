//! The capability a backend implements for runs ([`RunStore`](crate::steps::RunStore)), and what
//! its calls take and answer: leases, new runs, changes, the send-once
//! ledger's claims and entries.

use std::future::Future;

use crate::error::StoreError;
use crate::keys::KeyStore;
use crate::scope::{Operation, Scope};

use super::names::{Fence, Namespace, RunId};
use super::records::{Failure, Lease, RunRecord, StepRecord, corrupt};
use super::state::{MessageState, RunState};

/// A run to create, in the transaction that claims its key.
#[derive(Debug, Clone)]
pub struct NewRun<'a> {
    /// `RunId::of(scope)`.
    pub id: &'a RunId,
    /// The claimed scope.
    pub scope: &'a Scope,
    /// What it is started with.
    pub input: &'a [u8],
    /// The executor that starts it (holds the lease).
    pub holder: &'a str,
    /// Until when the first lease holds.
    pub locked_until_ms: i64,
    /// When it stops retrying and compensates.
    pub deadline_ms: i64,
    /// Retention once finished.
    pub ttl_ms: i64,
    /// Now.
    pub now_ms: i64,
}

/// What a fenced write changes on a run; `Default` changes nothing but
/// `updated_at_ms`. The write happens only while the run's fence is the
/// writer's.
#[derive(Debug, Clone, Default)]
pub struct RunChange<'a> {
    /// A new state.
    pub state: Option<RunState>,
    /// A new recovery point.
    pub recovery_point: Option<&'a str>,
    /// Why it fails (kept once set).
    pub failure: Option<&'a Failure>,
    /// `Some(Some((step, why)))` blocks the run at `step`; `Some(None)`
    /// clears a block.
    pub attention: Option<Option<(&'a str, &'a str)>>,
    /// Marks the point of no return as passed.
    pub no_return: bool,
    /// Moves the lease's end (a heartbeat; or when a released run is due).
    pub locked_until_ms: Option<i64>,
    /// Gives the lease up: no holder any more.
    pub release: bool,
    /// Adds one to the fence (operator actions: any executor still running
    /// the run is fenced out).
    pub bump_fence: bool,
    /// The run is final: it and its key record expire at this time.
    pub expires_at_ms: Option<i64>,
    /// Marks a message of the send-once ledger (this run's own).
    pub message: Option<(&'a str, MessageState)>,
}

/// A claim on a message id of the send-once ledger, before an attempt.
#[derive(Debug, Clone)]
pub struct MessageClaim<'a> {
    /// The message id (a step key, or an id derived from a business id).
    pub message_id: &'a str,
    /// The claiming run.
    pub run: &'a RunId,
    /// The claiming step.
    pub step: &'a str,
    /// Now.
    pub now_ms: i64,
    /// When the ledger may forget it.
    pub expires_at_ms: i64,
}

/// A message id's entry in the send-once ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentMessage {
    /// The message id.
    pub message_id: String,
    /// The run holding it.
    pub run_id: String,
    /// The step holding it.
    pub step: String,
    /// Where it is.
    pub state: MessageState,
    /// Attempts over all runs.
    pub attempts: u32,
    /// When it was first claimed (unix ms).
    pub created_at_ms: i64,
    /// When it was marked sent (unix ms).
    pub sent_at_ms: Option<i64>,
}

/// A send-once ledger row's columns, before validation.
#[derive(Debug, Clone, Default)]
#[allow(missing_docs)]
pub struct MessageColumns {
    pub message_id: String,
    pub run_id: String,
    pub step: String,
    pub state: String,
    pub attempts: i64,
    pub created_at_ms: i64,
    pub sent_at_ms: Option<i64>,
}

impl MessageColumns {
    /// Validates the columns.
    pub fn decode(self) -> Result<SentMessage, StoreError> {
        Ok(SentMessage {
            state: MessageState::parse(&self.state)
                .ok_or_else(|| corrupt(format!("message state {:?}", self.state)))?,
            message_id: self.message_id,
            run_id: self.run_id,
            step: self.step,
            attempts: u32::try_from(self.attempts).unwrap_or(u32::MAX),
            created_at_ms: self.created_at_ms,
            sent_at_ms: self.sent_at_ms,
        })
    }
}

/// Which runs [`RunStore::list_runs`](crate::steps::RunStore::list_runs) returns: newest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunFilter {
    /// Only runs in this state.
    pub state: Option<RunState>,
    /// At most this many (1 to 1000).
    pub limit: u32,
}

impl Default for RunFilter {
    fn default() -> Self {
        Self {
            state: None,
            limit: 100,
        }
    }
}

/// Runs and steps, stored in the same database as the key records and the
/// business data.
///
/// Every write of a run ([`RunStore::record_run_in`](crate::steps::RunStore::record_run_in), [`RunStore::record_run`](crate::steps::RunStore::record_run)) is
/// conditional on the writer's fence and reports `Ok(false)`, writing
/// nothing, when the fence moved. Takeovers ([`RunStore::take_over`](crate::steps::RunStore::take_over),
/// [`RunStore::claim_due`](crate::steps::RunStore::claim_due)) only take a live run whose lease expired, add one
/// to its fence, and never hand one run to two claimers (PostgreSQL: `FOR
/// UPDATE SKIP LOCKED`; SQLite: one writer at a time).
pub trait RunStore: KeyStore {
    /// This database's [`Namespace`](crate::steps::Namespace): drawn at random the first time it is
    /// asked for, kept for good. Every id an executor derives includes it.
    fn namespace(&self) -> impl Future<Output = Result<Namespace, StoreError>> + Send;

    /// In the transaction that claimed the run's key: creates the run (state
    /// `running`, the lease held by `run.holder`) and returns its fence: 1,
    /// or one more than the fence of a final run of the same id left from an
    /// expired key record, which it replaces (fences never go back). Keeps
    /// the key record from expiring while the run lives (its expiry is set
    /// when the run is final). A live run of the id is
    /// [`StoreError::Corrupt`].
    fn create_run<'a>(
        tx: &'a mut Self::Tx,
        run: &'a NewRun<'a>,
    ) -> impl Future<Output = Result<Fence, StoreError>> + Send + 'a;

    /// In `tx`: applies `change` to the run and upserts `step`, if the run's
    /// fence is still `lease.fence`; `Ok(false)` and nothing written when it
    /// is not. With `change.expires_at_ms` the key record's expiry moves too.
    fn record_run_in<'a>(
        tx: &'a mut Self::Tx,
        lease: &'a Lease,
        change: &'a RunChange<'a>,
        step: Option<&'a StepRecord>,
        now_ms: i64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'a;

    /// [`RunStore::record_run_in`](crate::steps::RunStore::record_run_in) as a transaction of its own.
    fn record_run(
        &self,
        lease: &Lease,
        change: &RunChange<'_>,
        step: Option<&StepRecord>,
        now_ms: i64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// In `tx`: claims `claim.message_id` in the send-once ledger for the
    /// run and step, unless another run holds it (`sending` or `sent`); a
    /// `not_sent` entry is anyone's. Returns the entry as it now stands.
    fn claim_message<'a>(
        tx: &'a mut Self::Tx,
        claim: &'a MessageClaim<'a>,
    ) -> impl Future<Output = Result<SentMessage, StoreError>> + Send + 'a;

    /// A message id's ledger entry.
    fn message(
        &self,
        message_id: &str,
    ) -> impl Future<Output = Result<Option<SentMessage>, StoreError>> + Send;

    /// Takes run `id` over for `holder` if it is live and its lease ended by
    /// `now_ms`: the fence grows by one, the lease holds until
    /// `locked_until_ms`. Returns the run with its steps, or `None`.
    fn take_over(
        &self,
        id: &RunId,
        holder: &str,
        now_ms: i64,
        locked_until_ms: i64,
    ) -> impl Future<Output = Result<Option<RunRecord>, StoreError>> + Send;

    /// Takes over up to `limit` live runs of `operations` whose lease ended
    /// by `now_ms`, oldest due first (see [`RunStore::take_over`](crate::steps::RunStore::take_over)). Runs
    /// another claimer is taking are skipped, never shared.
    fn claim_due(
        &self,
        operations: &[Operation],
        holder: &str,
        now_ms: i64,
        locked_until_ms: i64,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<RunRecord>, StoreError>> + Send;

    /// A run with its steps.
    fn load_run(
        &self,
        id: &RunId,
    ) -> impl Future<Output = Result<Option<RunRecord>, StoreError>> + Send;

    /// How many runs are in each state (states with none are left out):
    /// one grouped `COUNT`, for the metrics gauges.
    fn count_runs(&self) -> impl Future<Output = Result<Vec<(RunState, u64)>, StoreError>> + Send;

    /// Runs, newest first, without their steps.
    fn list_runs(
        &self,
        filter: &RunFilter,
    ) -> impl Future<Output = Result<Vec<RunRecord>, StoreError>> + Send;

    /// Deletes at most `limit` final runs (with their steps) whose retention
    /// ended by `now_ms`; returns how many.
    fn purge_runs(
        &self,
        now_ms: i64,
        limit: u32,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Deletes at most `limit` ledger entries whose retention ended by
    /// `now_ms`; returns how many.
    fn purge_messages(
        &self,
        now_ms: i64,
        limit: u32,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
}
