//! # idem-tasks
//!
//! Tasks for polling agents, on the database you have. An agent polls a
//! source (an inbox, an issue tracker, a long job), reports what changed,
//! and acts; several replicas poll one source, workers crash after acting
//! and before recording it, a paused worker wakes after its claim expired, a
//! tool call times out and is retried. [`Tasks`] makes each of those
//! harmless:
//!
//! - **Observations become tasks once.** A task is created under the
//!   observation's natural key: the same key in the same queue is the same
//!   task ([`Tasks::create`]); another payload under it is refused.
//! - **A poller's cursor moves with its observations**, in one transaction,
//!   only from the value the poller read ([`Tasks::observe`]).
//! - **Claims are fenced.** A claim holds a task for a lease judged by the
//!   database's clock and grows its fence; every later write names the
//!   fence, and a worker that lost its lease writes nothing
//!   ([`Tasks::claim`], [`Tasks::complete`]).
//! - **Actions happen once.** An action on another system gets a key derived
//!   from the task and the action's name (pass it downstream as
//!   `Idempotency-Key`) and an entry in the send-once ledger: a worker is
//!   told to go, that it was done, or that an earlier attempt's outcome is
//!   unknown ([`Tasks::action`]).
//!
//! With the `http` feature, [`http::router`] serves it all as JSON over
//! HTTP for agents written in any language (`idem serve` mounts it).
//!
//! ```no_run
//! # async fn agent(store: idem_sqlite::SqliteStore) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use idem_core::{IdempotencyKey, Tenant};
//! use idem_core::tasks::{ActionDecision, ActionMode, ActionName, QueueName, WorkerName};
//! use idem_tasks::{TaskSpec, Tasks, TasksConfig};
//!
//! let tasks = Tasks::new(store, TasksConfig::default()).await?;
//! let (tenant, queue) = (Tenant::new("acme")?, QueueName::new("triage")?);
//! let key = IdempotencyKey::new("github:issue:1842:updated:2026-12-04T10:00Z")?;
//! tasks.create(&tenant, &queue, &key, &TaskSpec::new(serde_json::json!({"issue": 1842}))).await?;
//!
//! let worker = WorkerName::new("agent-3")?;
//! for task in tasks.claim(&tenant, &queue, &worker, Duration::from_secs(30), 1).await? {
//!     let id = idem_core::tasks::TaskId::parse(&task.id)?;
//!     let notify = ActionName::new("notify")?;
//!     // The ask's own key: a retry of this ask (its answer lost) is told
//!     // what it was told; any other ask under this claim, `unknown`.
//!     let ask = IdempotencyKey::new(format!("agent-3:7f3a:ask:{}:{}", task.id, task.fence))?;
//!     let (key, decision, _) = tasks
//!         .action(&tenant, &id, task.fence, &notify, ActionMode::Verify, Some(&ask))
//!         .await?;
//!     if decision == ActionDecision::Go {
//!         // send the notification with `Idempotency-Key: {key}`, then:
//!         tasks.action_result(&tenant, &id, task.fence, &notify,
//!                             idem_core::tasks::ActionOutcome::Done, Some(&ask), None).await?;
//!     }
//!     tasks.complete(&tenant, &id, task.fence, &serde_json::json!({"notified": true})).await?;
//! }
//! # Ok(()) }
//! ```

mod config;
mod error;
#[cfg(feature = "http")]
pub mod http;
mod json;
mod service;

pub use config::{TaskSpec, TasksConfig};
pub use json::JsonText;

/// Tasks claimed, by queue (a counter).
pub const CLAIMED_TOTAL: &str = "idem_tasks_claimed_total";
/// Tasks claimed again after a lease ended or a failure, by queue (a
/// counter): attempts beyond the first.
pub const RECLAIMED_TOTAL: &str = "idem_tasks_reclaimed_total";
/// Tasks taken over because their holder's lease ended, by queue (a
/// counter).
pub const TAKEOVERS_TOTAL: &str = "idem_tasks_takeovers_total";
/// How long claimed tasks had been due when they were claimed, by queue (a
/// histogram: seconds since its `run_at`).
pub const CLAIM_LATENCY: &str = "idem_tasks_claim_latency_seconds";
/// Writes refused because the writer's fence was not the task's live claim
/// (a counter).
pub const FENCED_OUT_TOTAL: &str = "idem_tasks_fenced_out_total";
/// The values of the `queue` label, which requests name: recorded only for
/// a claim that got tasks (and, by `idem`, for queues with tasks in the
/// store), 500 at a time, the rest as `(other)` ([`idem_core::labels`]).
pub static QUEUE_LABELS: idem_core::labels::LabelValues =
    idem_core::labels::LabelValues::new("queue");
pub use error::TasksError;
pub use service::{Observation, Observed, Tasks};
