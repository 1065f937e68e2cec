//! What operators do to tasks workers cannot move on: retry, resolve.

use idem_core::steps::RunStore;
use idem_core::tasks::{ActionName, Steer, Steered, TaskId, TaskRecord, TaskState, TaskStore};

use super::Tasks;
use crate::TasksError;

impl<S: TaskStore + RunStore> Tasks<S> {
    /// In `tx`: an operator (`actor`, kept in the timeline) makes a dead
    /// task, or one that needs attention, ready again now with one more
    /// attempt.
    pub async fn retry_in(
        &self,
        tx: &mut S::Tx,
        id: &TaskId,
        actor: &str,
    ) -> Result<TaskRecord, TasksError> {
        let out = S::steer(tx, id.as_str(), Steer::Retry, actor, self.now_ms()).await?;
        Self::steered(out, "retry needs a dead task or one that needs attention")
    }

    /// In `tx`: an operator who checked the other system records what
    /// became of `action` of a task that needs attention — `sent` (never
    /// performed again) or not (performed again) — and the task is ready
    /// again.
    pub async fn resolve_in(
        &self,
        tx: &mut S::Tx,
        id: &TaskId,
        action: &ActionName,
        sent: bool,
        actor: &str,
    ) -> Result<TaskRecord, TasksError> {
        let key = self.action_key(id, action);
        let how = Steer::Resolve {
            action: action.as_str(),
            key: key.as_str(),
            sent,
        };
        let out = S::steer(tx, id.as_str(), how, actor, self.now_ms()).await?;
        let what = match &out {
            Steered::NotApplicable(t) if t.state == TaskState::NeedsAttention => {
                "this action has no attempt of unknown outcome; the task's timeline names the \
                 action that has (its needs_attention entry)"
            }
            _ => "resolve needs a task that needs attention",
        };
        Self::steered(out, what)
    }

    fn steered(out: Steered, what: &'static str) -> Result<TaskRecord, TasksError> {
        match out {
            Steered::Done(t) => Ok(t),
            Steered::NotApplicable(t) => Err(TasksError::NotApplicable {
                state: t.state.as_str(),
                what,
            }),
            Steered::Missing => Err(TasksError::NotFound),
        }
    }

    /// A task of any tenant, for operators.
    pub async fn task_any(&self, id: &TaskId) -> Result<TaskRecord, TasksError> {
        self.store
            .load_task(id.as_str())
            .await?
            .ok_or(TasksError::NotFound)
    }
}
