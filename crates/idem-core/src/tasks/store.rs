//! [`TaskStore`]: what a backend implements for tasks, pollers' cursors and
//! the actions' ledger entries.

use crate::StoreError;
use crate::keys::KeyStore;

use super::records::{
    ActionDecision, ActionMode, ActionOutcome, ClaimRequest, CursorMove, Fenced, NewTask,
    PollerRecord, Settle, Steer, Steered, TaskEvent, TaskRecord, TaskState,
};

/// An action attempt to record in the send-once ledger.
#[derive(Clone, Debug)]
pub struct ActionAttempt<'a> {
    /// The caller's tenant: another tenant's task is missing to it.
    pub tenant: &'a str,
    /// The task.
    pub task: &'a str,
    /// The fence the worker holds.
    pub fence: i64,
    /// The action's name.
    pub action: &'a str,
    /// The action's derived key: its ledger entry.
    pub key: &'a str,
    /// What an unknown earlier outcome leads to.
    pub mode: ActionMode,
    /// The ask's own key (`Idempotency-Key`), if it has one: an ask told
    /// `go` is told so again only when repeated with the same key and body
    /// ([`AskHolder`](super::AskHolder)); a keyless ask is never a repeat.
    /// On a report, the key of the ask it reports for: only the ask told
    /// `go` under a fence gives that `go` back ([`may_give_back`](super::may_give_back)).
    pub ask: Option<&'a str>,
    /// Now (the database's clock).
    pub now_ms: i64,
    /// When the ledger may forget it.
    pub expires_at_ms: i64,
    /// What the worker says about a result it reports (kept in the
    /// timeline).
    pub detail: Option<&'a str>,
}

/// What an action attempt found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ActionClaim {
    /// The decision, and the task as it stands.
    Decided(ActionDecision, TaskRecord),
    /// The fence is not the task's, or its lease ended: nothing written.
    LeaseLost(TaskRecord),
    /// A result reported for an action never attempted: nothing written.
    NoAttempt(TaskRecord),
    /// The ask's key was told `go` under this fence with another body:
    /// nothing written.
    KeyReused(TaskRecord),
    /// A `not-sent` report under the fence whose `go` went to another ask
    /// (or to one the report does not name): that ask may still be
    /// performing the action, so nothing written.
    InFlight(TaskRecord),
    /// No such task.
    Missing,
}

/// Which tasks [`TaskStore::list_tasks`] returns: newest first.
#[derive(Clone, Debug, Default)]
pub struct TaskFilter {
    /// One queue, or every one.
    pub queue: Option<String>,
    /// One state, or every one.
    pub state: Option<TaskState>,
    /// Tasks created before this id's (a page's cursor).
    pub before: Option<(i64, String)>,
    /// At most this many.
    pub limit: u32,
}

/// Tasks, pollers' cursors and the actions' ledger, in one database with
/// the key records: a task is created, a cursor moved and a claim recorded
/// in the caller's transaction, so they commit with the request's key.
/// Every `now_ms` is the store's clock ([`KeyStore::clock`]).
pub trait TaskStore: KeyStore {
    /// In `tx`: creates the task unless its key was seen in its queue;
    /// returns the task as stored and whether this call created it.
    fn create_task<'a>(
        tx: &'a mut Self::Tx,
        task: &'a NewTask<'a>,
    ) -> impl Future<Output = Result<(TaskRecord, bool), StoreError>> + Send + 'a;

    /// In `tx`: moves poller `poller`'s cursor from `expected` (`None`: it
    /// has none) to `value`, only if it is at `expected` — the same text
    /// (the caller judges JSON values written otherwise).
    fn move_cursor<'a>(
        tx: &'a mut Self::Tx,
        tenant: &'a str,
        poller: &'a str,
        expected: Option<&'a str>,
        value: &'a str,
        now_ms: i64,
    ) -> impl Future<Output = Result<CursorMove, StoreError>> + Send + 'a;

    /// A poller's cursor.
    fn cursor(
        &self,
        tenant: &str,
        poller: &str,
    ) -> impl Future<Output = Result<Option<PollerRecord>, StoreError>> + Send;

    /// In `tx`: claims up to `claim.max` tasks of the queue that are ready
    /// by `now` or whose lease ended by `now`, highest priority and oldest
    /// first; each one's fence and attempt grow by one. A task past its
    /// `max_attempts` when its lease ends is dead instead. Tasks another
    /// claimer is taking are skipped, never shared.
    fn claim_tasks<'a>(
        tx: &'a mut Self::Tx,
        claim: &'a ClaimRequest<'a>,
    ) -> impl Future<Output = Result<Vec<TaskRecord>, StoreError>> + Send + 'a;

    /// In `tx`: the holder of `fence` renews, completes or fails the task
    /// (of `tenant`: another tenant's task is [`Fenced::Missing`]).
    fn settle<'a>(
        tx: &'a mut Self::Tx,
        tenant: &'a str,
        task: &'a str,
        fence: i64,
        settle: &'a Settle<'a>,
        now_ms: i64,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send + 'a;

    /// In `tx`: records an attempt of an action in the send-once ledger
    /// for the holder of `attempt.fence`, and decides: `go` once per fence
    /// (and again only for the exact replay of the ask told `go`,
    /// [`decide_ask`](super::decide_ask)), `done` once it was reported done,
    /// `unknown` for every other ask while an attempt's outcome is open.
    fn claim_action<'a>(
        tx: &'a mut Self::Tx,
        attempt: &'a ActionAttempt<'a>,
    ) -> impl Future<Output = Result<ActionClaim, StoreError>> + Send + 'a;

    /// In `tx`: the holder of `fence` reports what became of an action it
    /// attempted or verified: `done` marks its ledger entry sent (answered
    /// [`ActionDecision::Done`]), `not-sent` frees it for another attempt
    /// ([`ActionDecision::Ask`]: the next ask is told `go`; `Done` when it
    /// was marked sent before).
    fn record_action<'a>(
        tx: &'a mut Self::Tx,
        attempt: &'a ActionAttempt<'a>,
        outcome: ActionOutcome,
    ) -> impl Future<Output = Result<ActionClaim, StoreError>> + Send + 'a;

    /// In `tx`: an operator (`actor`, kept in the timeline) steers task
    /// `task` ([`Steer`]).
    fn steer<'a>(
        tx: &'a mut Self::Tx,
        task: &'a str,
        steer: Steer<'a>,
        actor: &'a str,
        now_ms: i64,
    ) -> impl Future<Output = Result<Steered, StoreError>> + Send + 'a;

    /// Whether a claim of `queue` of `tenant` at `now_ms` would find a
    /// task: one ready by then, or claimed with its lease ended. A read
    /// that takes no lock (a long-polling claim waits on it).
    fn has_due(
        &self,
        tenant: &str,
        queue: &str,
        now_ms: i64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// A task.
    fn load_task(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<Option<TaskRecord>, StoreError>> + Send;

    /// A task's timeline, oldest first, at most 1000 entries.
    fn task_events(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<Vec<TaskEvent>, StoreError>> + Send;

    /// Tasks, newest first.
    fn list_tasks(
        &self,
        filter: &TaskFilter,
    ) -> impl Future<Output = Result<Vec<TaskRecord>, StoreError>> + Send;

    /// Deletes up to `limit` done or dead tasks that finished at or before
    /// `before_ms`, with their timelines; returns how many.
    fn purge_tasks(
        &self,
        before_ms: i64,
        limit: u32,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// How many tasks each queue holds in each state.
    fn count_tasks(
        &self,
    ) -> impl Future<Output = Result<Vec<(String, TaskState, u64)>, StoreError>> + Send;
}
