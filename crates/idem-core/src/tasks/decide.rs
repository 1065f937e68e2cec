//! What a fenced write does to a task, decided from the task as it stands
//! (read under its row lock): no I/O, so every backend decides alike.

use super::records::{Fenced, Settle, TaskRecord, TaskState};

/// Whether the holder of `fence` holds `task` at `now_ms`: its fence, still
/// claimed, the lease not ended (on the database's clock).
pub fn holds(task: &TaskRecord, fence: i64, now_ms: i64) -> bool {
    task.fence == fence
        && task.state == TaskState::Claimed
        && task.lease_expires_at_ms.is_some_and(|until| until > now_ms)
}

/// The write a settle makes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SettleWrite {
    /// The lease runs until `until_ms`.
    Renew {
        /// The new end of the lease.
        until_ms: i64,
    },
    /// Done, with the settle's result.
    Complete,
    /// Ready again from `run_at_ms`, the error kept.
    Retry {
        /// When it may be claimed again.
        run_at_ms: i64,
    },
    /// Dead: no attempt left.
    Dead,
}

/// Why a settle writes nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A repeat of the completion that settled it: answered as it was.
    Repeated,
    /// The same fence completed it with another result.
    Mismatch,
    /// Not the live holder.
    LeaseLost,
}

impl Refusal {
    /// The answer, with the task as it stands.
    pub fn with(self, task: TaskRecord) -> Fenced {
        match self {
            Refusal::Repeated => Fenced::Repeated(task),
            Refusal::Mismatch => Fenced::Mismatch(task),
            Refusal::LeaseLost => Fenced::LeaseLost(task),
        }
    }
}

/// A settle's plan: a write, or an answer without one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SettlePlan {
    /// Write this, fenced by the task's fence.
    Write(SettleWrite),
    /// Write nothing, for this reason.
    Refuse(Refusal),
}

/// Decides what `settle` by the holder of `fence` does to `task` at `now_ms`.
/// A completion repeated by the fence that completed it answers as the first
/// did (or [`Fenced::Mismatch`] with another result), and so does a failure
/// repeated by the fence that reported it (the task ready or dead, no claim
/// since, the same error); anything else not by the live holder is
/// [`Fenced::LeaseLost`].
pub fn plan_settle(task: &TaskRecord, fence: i64, settle: &Settle<'_>, now_ms: i64) -> SettlePlan {
    if let Settle::Complete { result_hash, .. } = settle
        && task.state == TaskState::Done
        && task.fence == fence
    {
        return SettlePlan::Refuse(if task.result_hash.as_deref() == Some(result_hash) {
            Refusal::Repeated
        } else {
            Refusal::Mismatch
        });
    }
    if let Settle::Fail { error, .. } = settle
        && matches!(task.state, TaskState::Ready | TaskState::Dead)
        && task.fence == fence
        && task.last_error.as_deref() == Some(error)
    {
        return SettlePlan::Refuse(Refusal::Repeated);
    }
    if !holds(task, fence, now_ms) {
        return SettlePlan::Refuse(Refusal::LeaseLost);
    }
    SettlePlan::Write(match settle {
        Settle::Heartbeat { lease_ms } => SettleWrite::Renew {
            until_ms: now_ms.saturating_add(*lease_ms),
        },
        Settle::Complete { .. } => SettleWrite::Complete,
        Settle::Fail { retry_at_ms, .. } if task.attempt < task.max_attempts => {
            SettleWrite::Retry {
                run_at_ms: (*retry_at_ms).max(now_ms),
            }
        }
        Settle::Fail { .. } => SettleWrite::Dead,
    })
}
