//! [`Run`]: what a [`Workflow`](crate::Workflow) works through — phases,
//! calls, sends, compensations — and how each is recorded.
//!
//! One file per part of a run's life, each beside the state it changes
//! (the fields of [`Run`] are private to this module):
//!
//! - `record.rs`: the recording — fenced writes, the open transaction,
//!   step records;
//! - `attempt.rs`: attempts and their budgets, deadlines, backoff, the call
//!   timeout;
//! - `forward.rs`: phases and calls; `send.rs`: sends to sinks without
//!   keys; `undo.rs` and `compensate.rs`: compensations, registered and
//!   run;
//! - `lease.rs`: the lease as the executor and its heartbeat share it;
//! - `drive.rs` and `end.rs`: one execution, from the workflow's first line
//!   to how the run ends.

pub(crate) mod attempt;
mod compensate;
pub(crate) mod drive;
pub(crate) mod end;
pub(crate) mod forward;
mod lease;
mod record;
pub(crate) mod send;
pub(crate) mod undo;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64};

use idem_core::steps::{
    Failure, Fence, Lease, Namespace, RunId, RunRecord, RunStore, StepKey, StepName,
};
use idem_core::{Clock, Scope};
use tokio::sync::watch;

use self::lease::Beat;
use self::undo::Undo;
use crate::error::Stop;
use crate::executor::Executor;

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
    exec: Arc<Executor<S>>,
    /// The installation's namespace, in every key the run derives.
    namespace: Namespace,
    record: RunRecord,
    lease: Lease,
    beat: Arc<Beat>,
    lost: watch::Receiver<bool>,
    /// An open transaction: the key's claim until the first commit, then a
    /// phase's (committed before the next external call or at the end).
    open: Option<S::Tx>,
    claim_open: bool,
    mode: Mode,
    undo: Vec<Undo<S::Tx>>,
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
impl<S: RunStore> Run<S> {
    fn new(
        exec: Arc<Executor<S>>,
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
            exec,
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

    fn now(&self) -> i64 {
        self.exec.clock.now_ms()
    }
}
