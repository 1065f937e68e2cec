//! What steps and runs report: [`StepError`] from your closures, [`Stop`]
//! from the run's methods, [`Ended`] from a run's execution, and the errors
//! of starting and resolving runs.

use std::time::Duration;

use idem_core::steps::{Failure, RunState};
use idem_core::{Completion, StoreError};

/// How an external call failed, as the step's closure reports it. The kind
/// decides what the executor may do next, so choose it by what is known
/// about the effect, not by how the failure looked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StepError {
    /// The effect may have happened: a timeout, an answer lost with the
    /// connection, a 5xx after the request was sent, an answer that could
    /// not be read. A call is retried with the same key; a send asks its
    /// sink first; an at-most-once effect waits for an operator.
    #[error("outcome unknown: {0}")]
    Unknown(String),
    /// The effect certainly did not happen and may succeed later: a refused
    /// connection, a 429, a 503 the sink gave before doing anything.
    /// Retried (an at-most-once effect too: nothing was sent).
    #[error("not done, retryable: {0}")]
    Retry(String),
    /// The effect did not happen and never will for this input (a 4xx that
    /// is not about timing). The step fails for good and the run compensates.
    #[error("failed for good: {0}")]
    Permanent(String),
}

impl StepError {
    /// The message.
    pub fn detail(&self) -> &str {
        match self {
            Self::Unknown(d) | Self::Retry(d) | Self::Permanent(d) => d,
        }
    }
}

/// Why a run stopped moving forward. Your workflow propagates it with `?`
/// and builds one with [`Run::fail`](crate::Run::fail); the executor decides
/// what happens next.
#[derive(Debug)]
#[non_exhaustive]
pub enum Stop {
    /// The run fails: its completed steps are compensated (unless it passed
    /// its point of no return), then
    /// [`Workflow::failed`](crate::Workflow::failed) gives its final answer.
    /// Past its deadline a step stops with `Fail` and reason `deadline`.
    Fail(Failure),
    /// The run is compensating: forward steps that are not recorded stop
    /// here, so the compensations of what was done can run.
    Compensating,
    /// An operator must resolve `step` (`idem steps resolve`); the run is
    /// recorded as `needs_attention`.
    Attention {
        /// The step.
        step: String,
        /// Why.
        reason: String,
    },
    /// Another executor holds the run now (the fence moved) or the lease
    /// could not be renewed in time: nothing more is recorded by this one.
    LeaseLost,
    /// The run was given back to be resumed at `until_ms` (a long retry
    /// delay), by whichever executor takes it then.
    Released {
        /// When it is due (unix ms).
        until_ms: i64,
    },
    /// The store failed. Nothing was recorded out of order; the run resumes
    /// once its lease expires and the store is back.
    Store(StoreError),
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Fail(failure) => write!(f, "run fails: {}", failure.reason),
            Self::Compensating => f.write_str("run is compensating"),
            Self::Attention { step, reason } => write!(f, "step {step} needs attention: {reason}"),
            Self::LeaseLost => f.write_str("lease lost"),
            Self::Released { until_ms } => write!(f, "released until {until_ms}"),
            Self::Store(e) => write!(f, "store failed: {}", idem_core::ErrorChain(e)),
        }
    }
}

impl From<StoreError> for Stop {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

/// How one execution of a run ended (in this process).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Ended {
    /// The run is final; its outcome is stored on the key record.
    Finished(Completion),
    /// The run ended before anything was committed and its answer is one
    /// the caller does not keep (a validation 400): the key's claim and the
    /// run were rolled back, the key is not used up.
    Discarded(Completion),
    /// The first phase failed before anything was committed: the claim was
    /// rolled back, the key is not used up.
    Aborted {
        /// What failed, for logs.
        error: String,
        /// Whether the same request may succeed later (the store was busy
        /// or unavailable).
        retryable: bool,
    },
    /// Stopped at a step an operator must resolve.
    NeedsAttention {
        /// The step.
        step: String,
        /// Why.
        reason: String,
    },
    /// Another executor holds the run now; this one stopped.
    LeaseLost,
    /// Given back, due again at `until_ms`.
    Released {
        /// When (unix ms).
        until_ms: i64,
    },
    /// The store failed; the run resumes once its lease expires.
    StoreFailed {
        /// The error, for logs.
        error: String,
        /// A `COMMIT` was sent and not acknowledged.
        outcome_unknown: bool,
    },
    /// No workflow is registered for the run's operation here.
    NotRegistered,
}

/// Why [`Runs::start`](crate::Runs::start) could not start or resume a run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The key was used before with a different request.
    #[error("idempotency key reused with a different request")]
    FingerprintMismatch,
    /// Every run slot of this process is taken; nothing was written.
    #[error("every run slot is taken")]
    AtCapacity {
        /// When to try again.
        retry_after: Duration,
    },
    /// No workflow is registered for the operation.
    #[error("no workflow is registered for operation {0}")]
    NotRegistered(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why an operator's resolution was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResolveError {
    /// No such run.
    #[error("no run {0}")]
    NotFound(String),
    /// The run is not waiting for an operator.
    #[error("run {run} is {state}, not needs_attention: there is nothing to resolve")]
    NotBlocked {
        /// The run.
        run: String,
        /// Its state.
        state: RunState,
    },
    /// The blocked step produces a value the executor needs: an operator
    /// cannot say it was done, only that it was not (and may be retried).
    #[error(
        "step {step} of run {run} returns a value that cannot be made up: resolve it --as not-sent to run it again"
    )]
    ValueNeeded {
        /// The run.
        run: String,
        /// The step.
        step: String,
    },
    /// The run changed while the resolution was being written (an executor
    /// or another operator acted); read it again.
    #[error("run {0} changed meanwhile; look at it again and retry")]
    Changed(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}
