//! `idem tasks list|show|retry|resolve`: tasks of polling agents, for
//! operators.

use anyhow::{Context, bail};
use clap::Subcommand;
use idem_core::tasks::{ActionName, TaskFilter, TaskId, TaskState};
use idem_tasks::http::{event_json, task_json};
use idem_tasks::{Tasks, TasksConfig, TasksError};

use super::args::DbArgs;
use crate::backend::{Backend, Job};

/// `--as` of `idem tasks resolve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ResolveAs {
    /// It happened: the action is never performed again.
    Sent,
    /// It did not happen: the next worker performs it.
    NotSent,
}

/// `idem tasks`'s subcommands.
#[derive(Subcommand)]
pub enum TasksAction {
    /// List tasks, newest first, as JSON lines.
    List {
        #[command(flatten)]
        db: DbArgs,
        /// Only this queue.
        #[arg(long)]
        queue: Option<String>,
        /// Only this state: ready, claimed, done, dead or needs_attention.
        #[arg(long)]
        state: Option<String>,
        /// At most this many (1 to 1000).
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Show one task and its timeline (claims, takeovers, actions).
    Show {
        #[command(flatten)]
        db: DbArgs,
        /// The task's id (`tsk_…`).
        task: String,
    },
    /// Make a dead task (or one that needs attention) ready again, with one
    /// more attempt.
    Retry {
        #[command(flatten)]
        db: DbArgs,
        /// The task's id (`tsk_…`).
        task: String,
        /// Who retries it, for the task's timeline (default: $USER).
        #[arg(long)]
        actor: Option<String>,
    },
    /// After checking the other system by the action's key, record what
    /// became of the action whose outcome was unknown — `--as sent` (never
    /// performed again) or `--as not-sent` (performed by the next worker) —
    /// and make the task ready again.
    Resolve {
        #[command(flatten)]
        db: DbArgs,
        /// The task's id (`tsk_…`).
        task: String,
        /// The action's name.
        #[arg(long)]
        action: String,
        /// What the operator found.
        #[arg(long = "as", value_enum)]
        resolution: ResolveAs,
        /// Who resolves it, for the task's timeline (default: $USER).
        #[arg(long)]
        actor: Option<String>,
    },
}

impl TasksAction {
    /// Runs the subcommand.
    pub async fn run(self) -> anyhow::Result<()> {
        let (TasksAction::List { db, .. }
        | TasksAction::Show { db, .. }
        | TasksAction::Retry { db, .. }
        | TasksAction::Resolve { db, .. }) = &self;
        let db = db.open_existing().await?;
        db.run(self).await
    }
}

fn task_id(text: &str) -> anyhow::Result<TaskId> {
    TaskId::parse(text).map_err(anyhow::Error::msg)
}

fn refused(e: TasksError) -> anyhow::Error {
    match e {
        TasksError::Store(e) => anyhow::Error::new(e).context("the database failed"),
        other => anyhow::anyhow!("{other}"),
    }
}

/// The operator named in the timeline: `--actor`, else `$USER`, else
/// `idem tasks`; 1 to 64 characters.
fn actor(given: Option<String>) -> anyhow::Result<String> {
    let name = given
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "idem tasks".into());
    if name.is_empty() || name.len() > 64 || name.chars().any(char::is_control) {
        bail!("--actor must be 1 to 64 characters without control characters");
    }
    Ok(name)
}

impl Job for TasksAction {
    type Output = anyhow::Result<()>;
    async fn run<B: Backend>(self, store: B) -> anyhow::Result<()> {
        let tasks = Tasks::new(store.clone(), TasksConfig::default())
            .await
            .map_err(refused)?;
        match self {
            TasksAction::List {
                queue,
                state,
                limit,
                ..
            } => {
                let state = match state.as_deref() {
                    None => None,
                    Some(s) => Some(TaskState::parse(s).with_context(|| {
                        format!(
                            "--state {s}: expected ready, claimed, done, dead or needs_attention"
                        )
                    })?),
                };
                if let Some(q) = &queue {
                    idem_core::tasks::QueueName::new(q.clone())
                        .map_err(|e| anyhow::anyhow!("--queue: {e}"))?;
                }
                if !(1..=1000).contains(&limit) {
                    bail!("--limit must be between 1 and 1000");
                }
                let filter = TaskFilter {
                    queue,
                    state,
                    before: None,
                    limit,
                };
                for t in store.list_tasks(&filter).await? {
                    println!("{}", task_json(&t));
                }
            }
            TasksAction::Show { task, .. } => {
                let id = task_id(&task)?;
                let t = tasks.task_any(&id).await.map_err(refused)?;
                let events = store.task_events(id.as_str()).await?;
                let timeline: Vec<_> = events.iter().map(event_json).collect();
                let shown = task_json(&t)
                    .with("tenant", t.tenant.as_str())
                    .with("timeline", timeline);
                println!("{}", serde_json::to_string_pretty(&shown)?);
            }
            TasksAction::Retry {
                task, actor: who, ..
            } => {
                let id = task_id(&task)?;
                let who = actor(who)?;
                let mut tx = store.begin().await?;
                let retried = tasks.retry_in(&mut tx, &id, &who).await;
                let t = tasks.finish(tx, retried).await.map_err(refused)?;
                println!("{}", task_json(&t));
            }
            TasksAction::Resolve {
                task,
                action,
                resolution,
                actor: who,
                ..
            } => {
                let id = task_id(&task)?;
                let who = actor(who)?;
                let action =
                    ActionName::new(action).map_err(|e| anyhow::anyhow!("--action: {e}"))?;
                let sent = resolution == ResolveAs::Sent;
                let mut tx = store.begin().await?;
                let resolved = tasks.resolve_in(&mut tx, &id, &action, sent, &who).await;
                let t = tasks.finish(tx, resolved).await.map_err(refused)?;
                println!("{}", task_json(&t));
            }
        }
        Ok(())
    }
}
