//! Tasks for polling agents: observations become tasks once, claims are
//! fenced, and actions on other systems happen once.
//!
//! An agent polls a source (an inbox, an issue tracker, a long job) and
//! reports what changed as **tasks**, each under the observation's natural
//! key: the same key in the same queue is the same task, whoever reports it
//! and however often ([`TaskId::of`] derives its id). A **poller's cursor**
//! moves in the transaction that creates the tasks, only from the value the
//! poller read ([`CursorMove`]), so replicas polling one source create each
//! task once and the cursor never moves backward.
//!
//! Workers **claim** tasks with a lease judged by the database's clock;
//! every claim grows the task's **fence**, and every write of a worker
//! names the fence it holds ([`Fenced`]): a paused worker that wakes after
//! another claimed the task writes nothing. An **action** on another system
//! (a notification, a tool call) has a key derived from the task and the
//! action's name ([`ActionKey`]) and an entry in the steps' send-once
//! ledger: a worker is told to perform it (`go`), that it was done, or that
//! an earlier attempt's outcome is unknown — to verify by the key, or to
//! leave to an operator ([`ActionMode`]). Under one fence `go` is told once,
//! whoever asks: again only to the exact replay of that ask ([`AskHolder`]).
//!
//! This module holds the types and the [`TaskStore`] a backend implements;
//! the service and its HTTP routes are the `idem-tasks` crate.
//!
//! ```
//! use idem_core::{IdempotencyKey, Tenant};
//! use idem_core::steps::Namespace;
//! use idem_core::tasks::{ActionKey, ActionName, QueueName, TaskId};
//! let ns = Namespace::new("agents-1")?;
//! let queue = QueueName::new("triage")?;
//! let key = IdempotencyKey::new("github:issue:1842:updated:2026-12-04T10:00Z")?;
//! let task = TaskId::of(&ns, &Tenant::new("acme")?, &queue, &key);
//! // Two pollers observing the same change name the same task…
//! assert_eq!(task, TaskId::of(&ns, &Tenant::new("acme")?, &queue, &key));
//! // …and every attempt of its action sends the same key.
//! let notify = ActionName::new("notify")?;
//! assert_eq!(ActionKey::derive(&ns, &task, &notify), ActionKey::derive(&ns, &task, &notify));
//! assert!(ActionKey::derive(&ns, &task, &notify).as_str().starts_with("idem:notify:"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod asks;
mod decide;
mod names;
mod records;
mod store;
#[cfg(test)]
mod tests;

pub use asks::{AskAnswer, AskHolder, decide_ask, held_by_claim, may_give_back};
pub use decide::{Refusal, SettlePlan, SettleWrite, holds, plan_settle};
pub use names::{ActionKey, ActionName, PollerName, QueueName, TaskId, TaskNameError, WorkerName};
pub use records::{
    ActionDecision, ActionMode, ActionOutcome, ClaimRequest, CursorMove, Fenced, NewTask,
    PollerRecord, Settle, Steer, Steered, TaskColumns, TaskEvent, TaskRecord, TaskState,
};
pub use store::{ActionAttempt, ActionClaim, TaskFilter, TaskStore};
