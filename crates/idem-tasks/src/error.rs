//! [`TasksError`]: why a task operation changed nothing.

use idem_core::StoreError;
use idem_core::tasks::TaskState;

/// Why a task operation changed nothing. Each maps to one HTTP answer
/// ([`http`](crate::http)).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TasksError {
    /// Bad input (a name, a size, a duration): `400`.
    #[error("{0}")]
    Invalid(String),
    /// The key was used in this queue with another payload: `422`.
    #[error("the task key was used with another payload")]
    KeyReused,
    /// The poller's cursor is not at the value the observation expected:
    /// `409 cursor-moved`, with where it is (`None`: it has none).
    #[error("the cursor moved")]
    CursorMoved {
        /// The cursor as stored: JSON text, as the poller that moved it
        /// there wrote it.
        current: Option<String>,
    },
    /// The fence is not the task's, or its lease ended: `409 lease-lost`.
    #[error("the lease of fence {fence} is lost: the task is {state} at fence {current}")]
    LeaseLost {
        /// The fence the caller named.
        fence: i64,
        /// The task's fence now.
        current: i64,
        /// The task's state now.
        state: &'static str,
    },
    /// The task was completed by this fence with another result: `422`.
    #[error("the task was completed with another result")]
    ResultMismatch,
    /// A result for an action that was never attempted: `409 no-attempt`.
    #[error("the action was never attempted under this task")]
    NoAttempt,
    /// The ask's `Idempotency-Key` was told `go` under this fence with
    /// another body: `422 idempotency-key-reused`.
    #[error("the ask's key was used under this claim with another body")]
    AskKeyReused,
    /// A `not-sent` report under the fence whose `go` went to another ask
    /// (one the report's key does not name), which may still be performing
    /// the action: `409 attempt-in-flight`, nothing written.
    #[error("the action was told go to another ask of this claim")]
    AttemptInFlight,
    /// An operator's action does not apply to the task in its state (retry:
    /// dead or needs attention; resolve: needs attention with an unknown
    /// action): `409 not-applicable`.
    #[error("the task is {state}: {what}")]
    NotApplicable {
        /// The task's state.
        state: &'static str,
        /// What the action needs.
        what: &'static str,
    },
    /// No such task (for this tenant): `404`.
    #[error("no such task")]
    NotFound,
    /// The store failed: `503` (or `500` when it is no outage).
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl TasksError {
    pub(crate) fn invalid(what: impl std::fmt::Display) -> Self {
        TasksError::Invalid(what.to_string())
    }

    pub(crate) fn lease_lost(fence: i64, current: i64, state: TaskState) -> Self {
        TasksError::LeaseLost {
            fence,
            current,
            state: state.as_str(),
        }
    }
}
