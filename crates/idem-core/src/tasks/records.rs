//! What a task store reads and writes: [`TaskState`], [`TaskRecord`] and its
//! columns, the inputs of its writes ([`NewTask`], [`ClaimRequest`],
//! [`Settle`]) and their outcomes ([`Fenced`], [`CursorMove`]).

use crate::StoreError;

fn corrupt(detail: String) -> StoreError {
    StoreError::Corrupt { detail }
}

/// Where a task is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaskState {
    /// Waiting for a worker (from `run_at` on).
    Ready,
    /// Held by a worker until its lease expires.
    Claimed,
    /// Completed: its result is kept.
    Done,
    /// Failed `max_attempts` times.
    Dead,
    /// An action's outcome is unknown and may not be retried: an operator
    /// decides.
    NeedsAttention,
}

impl TaskState {
    /// Every state, in the order reports list them.
    pub const ALL: [TaskState; 5] = [
        TaskState::Ready,
        TaskState::Claimed,
        TaskState::Done,
        TaskState::Dead,
        TaskState::NeedsAttention,
    ];

    /// The state as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Ready => "ready",
            TaskState::Claimed => "claimed",
            TaskState::Done => "done",
            TaskState::Dead => "dead",
            TaskState::NeedsAttention => "needs_attention",
        }
    }

    /// Parses a stored or requested state.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// Done or dead: nothing more happens to it unless an operator acts.
    pub fn is_final(self) -> bool {
        matches!(self, TaskState::Done | TaskState::Dead)
    }
}

/// How a worker wants an action whose earlier attempt's outcome is unknown
/// handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActionMode {
    /// Never perform it twice: an unknown outcome sends the task to
    /// [`TaskState::NeedsAttention`].
    AtMostOnce,
    /// The worker can ask the other system by the action's key: an unknown
    /// outcome is reported back to it to verify.
    Verify,
}

impl ActionMode {
    /// `at-most-once` or `verify`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "at-most-once" => Some(ActionMode::AtMostOnce),
            "verify" => Some(ActionMode::Verify),
            _ => None,
        }
    }

    /// The mode as the API names it.
    pub fn as_str(self) -> &'static str {
        match self {
            ActionMode::AtMostOnce => "at-most-once",
            ActionMode::Verify => "verify",
        }
    }
}

/// What a worker is told to do about an action.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActionDecision {
    /// The attempt is recorded: perform it now, with the action's key.
    Go,
    /// It was done: skip it.
    Done,
    /// An earlier attempt's outcome is unknown: verify it by the key
    /// (`verify`), or leave it to an operator (`at-most-once`).
    Unknown,
    /// Free to be attempted again (the answer to a `not-sent` report): ask,
    /// and the first ask is told [`ActionDecision::Go`].
    Ask,
}

impl ActionDecision {
    /// `go`, `done`, `unknown` or `ask`.
    pub fn as_str(self) -> &'static str {
        match self {
            ActionDecision::Go => "go",
            ActionDecision::Done => "done",
            ActionDecision::Unknown => "unknown",
            ActionDecision::Ask => "ask",
        }
    }
}

/// What a worker reports about an action it attempted or verified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActionOutcome {
    /// It happened.
    Done,
    /// It did not happen (the other system says so): it may be attempted
    /// again.
    NotSent,
}

impl ActionOutcome {
    /// `done` or `not-sent`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "done" => Some(ActionOutcome::Done),
            "not-sent" => Some(ActionOutcome::NotSent),
            _ => None,
        }
    }
}

/// A task as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskRecord {
    /// `tsk_…`.
    pub id: String,
    /// Its tenant.
    pub tenant: String,
    /// Its queue.
    pub queue: String,
    /// The key it was created with (the observation's natural key).
    pub key: String,
    /// The payload: JSON text.
    pub payload: String,
    /// The payload's fingerprint: another payload under the key is refused.
    pub payload_hash: String,
    /// Where it is.
    pub state: TaskState,
    /// Higher first.
    pub priority: i64,
    /// Not claimed before (unix ms, the database's clock).
    pub run_at_ms: i64,
    /// Claims so far (this one included while claimed).
    pub attempt: u32,
    /// Claims allowed before it is dead.
    pub max_attempts: u32,
    /// Grows by one on every claim; every write of a worker names it.
    pub fence: i64,
    /// The worker holding it, while claimed.
    pub holder: Option<String>,
    /// Until when the holder's lease runs (unix ms, the database's clock).
    pub lease_expires_at_ms: Option<i64>,
    /// The completed task's result: JSON text.
    pub result: Option<String>,
    /// The result's fingerprint: a repeated completion must carry the same.
    pub result_hash: Option<String>,
    /// The last failure a worker reported.
    pub last_error: Option<String>,
    /// Created (unix ms).
    pub created_at_ms: i64,
    /// Last changed (unix ms).
    pub updated_at_ms: i64,
    /// Done or dead at (unix ms).
    pub finished_at_ms: Option<i64>,
    /// How its latest claim took it: `claimed` (it was ready), `taken_over`
    /// (another holder's lease had ended) or `dead` (a lease ended on the
    /// last attempt); `None` before any claim.
    pub claim_kind: Option<String>,
}

/// A task row's columns, before validation.
#[derive(Clone, Debug, Default)]
#[allow(missing_docs)]
pub struct TaskColumns {
    pub id: String,
    pub tenant: String,
    pub queue: String,
    pub key: String,
    pub payload: String,
    pub payload_hash: String,
    pub state: String,
    pub priority: i64,
    pub run_at_ms: i64,
    pub attempt: i64,
    pub max_attempts: i64,
    pub fence: i64,
    pub holder: Option<String>,
    pub lease_expires_at_ms: Option<i64>,
    pub result: Option<String>,
    pub result_hash: Option<String>,
    pub last_error: Option<String>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub finished_at_ms: Option<i64>,
    pub claim_kind: Option<String>,
}

impl TaskColumns {
    /// Validates the columns.
    pub fn decode(self) -> Result<TaskRecord, StoreError> {
        let count =
            |what: &str, n: i64| u32::try_from(n).map_err(|_| corrupt(format!("task {what} {n}")));
        Ok(TaskRecord {
            state: TaskState::parse(&self.state)
                .ok_or_else(|| corrupt(format!("task state {:?}", self.state)))?,
            attempt: count("attempt", self.attempt)?,
            max_attempts: count("max_attempts", self.max_attempts)?,
            id: self.id,
            tenant: self.tenant,
            queue: self.queue,
            key: self.key,
            payload: self.payload,
            payload_hash: self.payload_hash,
            priority: self.priority,
            run_at_ms: self.run_at_ms,
            fence: self.fence,
            holder: self.holder,
            lease_expires_at_ms: self.lease_expires_at_ms,
            result: self.result,
            result_hash: self.result_hash,
            last_error: self.last_error,
            created_at_ms: self.created_at_ms,
            updated_at_ms: self.updated_at_ms,
            finished_at_ms: self.finished_at_ms,
            claim_kind: self.claim_kind,
        })
    }
}

/// A task to create (or to find, when its key was seen before).
#[derive(Clone, Debug)]
pub struct NewTask<'a> {
    /// Its derived id ([`TaskId::of`](super::TaskId::of)).
    pub id: &'a str,
    /// Its tenant.
    pub tenant: &'a str,
    /// Its queue.
    pub queue: &'a str,
    /// Its key.
    pub key: &'a str,
    /// JSON text.
    pub payload: &'a str,
    /// The payload's fingerprint.
    pub payload_hash: &'a str,
    /// Higher first.
    pub priority: i64,
    /// Not claimed before.
    pub run_at_ms: i64,
    /// Claims allowed before it is dead.
    pub max_attempts: u32,
    /// Now (the database's clock).
    pub now_ms: i64,
}

/// A claim of up to `max` ready tasks (or tasks whose lease expired).
#[derive(Clone, Debug)]
pub struct ClaimRequest<'a> {
    /// The tenant whose tasks are claimed.
    pub tenant: &'a str,
    /// The queue.
    pub queue: &'a str,
    /// The claiming worker.
    pub worker: &'a str,
    /// How long the lease runs.
    pub lease_ms: i64,
    /// At most this many tasks.
    pub max: u32,
    /// Now (the database's clock).
    pub now_ms: i64,
}

/// How a worker settles the task it holds.
#[derive(Clone, Debug)]
pub enum Settle<'a> {
    /// Renew the lease for `lease_ms`.
    Heartbeat {
        /// From now.
        lease_ms: i64,
    },
    /// Done, with a result (JSON text) and its fingerprint.
    Complete {
        /// JSON text.
        result: &'a str,
        /// The result's fingerprint: a repeat must carry the same.
        result_hash: &'a str,
    },
    /// Failed: retried at `retry_at_ms` while attempts remain, else dead.
    Fail {
        /// What went wrong (shown to operators).
        error: &'a str,
        /// When it may be claimed again.
        retry_at_ms: i64,
    },
}

/// The outcome of a write fenced by the task's fence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fenced {
    /// Written: the task as it now stands.
    Written(TaskRecord),
    /// Already so: a repeat of the write that settled it (the same fence
    /// and the same result), answered as the first was.
    Repeated(TaskRecord),
    /// The same fence completed it with another result.
    Mismatch(TaskRecord),
    /// The fence is not the task's, or its lease ended: nothing written.
    LeaseLost(TaskRecord),
    /// No such task.
    Missing,
}

/// A poller's cursor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PollerRecord {
    /// Its tenant.
    pub tenant: String,
    /// Its name.
    pub poller: String,
    /// The cursor: JSON text, as the poller that moved it there wrote it
    /// (compared as a JSON value, never as text, by `idem_tasks`).
    pub cursor: String,
    /// How many times it moved.
    pub version: i64,
    /// When it last moved (unix ms).
    pub updated_at_ms: i64,
}

/// The outcome of moving a poller's cursor from `expected` to `value`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CursorMove {
    /// Moved.
    Moved,
    /// It was at `value` already: a repeat of the move.
    AlreadyThere,
    /// It is somewhere else (`None`: no cursor yet): nothing written.
    Conflict(Option<String>),
}

/// One entry of a task's timeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskEvent {
    /// Its order within the task.
    pub seq: i64,
    /// `created`, `claimed`, `taken_over`, `completed`, `failed`, `dead`,
    /// `fenced_out`, `action`, `action_result`, `needs_attention`,
    /// `retried`, `resolved`.
    pub kind: String,
    /// The worker (or operator) that caused it.
    pub actor: Option<String>,
    /// The fence it carried.
    pub fence: Option<i64>,
    /// When (unix ms).
    pub at_ms: i64,
    /// More: an action's name and decision, an error.
    pub detail: Option<String>,
}

/// What an operator does to a task that workers cannot move on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Steer<'a> {
    /// A dead task, or one that needs attention, is ready again now, with
    /// one more attempt allowed.
    Retry,
    /// The operator checked the other system for an action whose outcome
    /// was unknown: `sent` (it happened: never performed again) or not (it
    /// may be performed again). The task is ready again.
    Resolve {
        /// The action's name.
        action: &'a str,
        /// The action's key: its ledger entry.
        key: &'a str,
        /// Whether it happened.
        sent: bool,
    },
}

/// The outcome of an operator's [`Steer`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Steered {
    /// Done: the task as it now stands (its fence grown, so a worker still
    /// writing under the old one is refused).
    Done(TaskRecord),
    /// The task is not in a state this applies to (retry: dead or needs
    /// attention; resolve: needs attention), or the action has no unknown
    /// attempt: nothing written.
    NotApplicable(TaskRecord),
    /// No such task.
    Missing,
}
