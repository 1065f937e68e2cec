//! [`Runs`]: the executor of one process — its workflows by operation, its
//! run slots, the runs it is executing. Built by `builder.rs`; `start.rs`
//! starts runs with their key (or resumes them), each executed by
//! `run::drive` in a task of its own.

pub(crate) mod builder;
mod start;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::steps::{Namespace, RunId, RunStore};
use idem_core::{Engine, Operation, Scope, SharedClock, StoredRecord};
use tokio::sync::{Semaphore, watch};

use crate::config::{RunsConfig, WorkflowPolicy};
use crate::error::Ended;
use crate::executor::Executor;
use crate::workflow::Workflow;

/// A workflow and its policy, under the operation it serves.
pub(crate) struct Registered<S: RunStore> {
    pub(crate) workflow: Arc<dyn Workflow<S>>,
    pub(crate) policy: WorkflowPolicy,
}

/// What the clones of one [`Runs`] share.
pub(crate) struct Shared<S: RunStore> {
    /// What the runs read: the store, the clock, the settings, the holder.
    pub(crate) exec: Arc<Executor<S>>,
    pub(crate) engine: Engine<S, SharedClock>,
    pub(crate) workflows: HashMap<Operation, Registered<S>>,
    pub(crate) permits: Arc<Semaphore>,
    /// The database's namespace, read once.
    namespace: tokio::sync::OnceCell<Namespace>,
    /// Runs executing in this process, for a retry that arrives meanwhile.
    waiters: Mutex<HashMap<RunId, watch::Receiver<Option<Ended>>>>,
}

impl<S: RunStore> Shared<S> {
    /// The database's namespace (read, or drawn, on first use).
    pub(crate) async fn namespace(&self) -> Result<Namespace, idem_core::StoreError> {
        self.namespace
            .get_or_try_init(|| self.exec.store.namespace())
            .await
            .cloned()
    }
}

/// The executor of multi-step runs in one process: a [`RunStore`] and the
/// [`Workflow`]s it runs, by operation. Cheap to clone.
///
/// - [`Runs::start`] claims an idempotency key and starts its run, or
///   replays the key's outcome, or resumes its run if the executor that
///   held it died (its lease expired).
/// - [`Runs::recovery`] is the worker that resumes runs nobody asks about.
/// - [`crate::resolve`] is the operator's way out of `needs_attention`.
pub struct Runs<S: RunStore> {
    pub(crate) shared: Arc<Shared<S>>,
}

impl<S: RunStore> Clone for Runs<S> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<S: RunStore> std::fmt::Debug for Runs<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runs")
            .field("holder", &self.shared.exec.holder)
            .field("operations", &self.operations())
            .finish_non_exhaustive()
    }
}

/// What [`Runs::start`] found.
#[derive(Debug)]
#[non_exhaustive]
pub enum Started {
    /// A run is executing here: a fresh one, or one taken over from an
    /// executor whose lease expired. Its [`RunHandle`] tells how it ends.
    Running(RunHandle),
    /// The key's run finished before: its stored outcome.
    Replay(StoredRecord),
    /// The key's run lives elsewhere (or its claim is in flight), or waits
    /// for an operator.
    Busy {
        /// When asking again makes sense.
        retry_after: Duration,
        /// Why the run waits for an operator, when it does.
        attention: Option<String>,
    },
}

/// A run executing in this process.
#[derive(Debug)]
pub struct RunHandle {
    id: RunId,
    resumed: bool,
    rx: watch::Receiver<Option<Ended>>,
}

impl RunHandle {
    /// The run.
    pub fn id(&self) -> &RunId {
        &self.id
    }

    /// Whether it was taken over from another executor rather than started.
    pub fn resumed(&self) -> bool {
        self.resumed
    }

    /// How this execution ended, if it ended within `within`. The run goes
    /// on after this returns `None`.
    pub async fn ended(&mut self, within: Duration) -> Option<Ended> {
        let waited = tokio::time::timeout(within, self.rx.wait_for(Option::is_some)).await;
        match waited {
            Ok(Ok(ended)) => ended.clone(),
            // The execution's task ended without a word: it panicked, and the
            // run was blocked for an operator (see `drive`).
            Ok(Err(_)) => Some(Ended::NeedsAttention {
                step: "-".into(),
                reason: "the workflow panicked".into(),
            }),
            Err(_) => None,
        }
    }
}

impl<S: RunStore> Runs<S> {
    /// The store.
    pub fn store(&self) -> &S {
        &self.shared.exec.store
    }

    /// This executor's name in leases.
    pub fn holder(&self) -> &str {
        &self.shared.exec.holder
    }

    /// The settings.
    pub fn config(&self) -> &RunsConfig {
        &self.shared.exec.config
    }

    /// The operations with a workflow here.
    pub fn operations(&self) -> Vec<Operation> {
        let mut ops: Vec<Operation> = self.shared.workflows.keys().cloned().collect();
        ops.sort();
        ops
    }

    /// The workflow of `operation`, if registered.
    pub fn workflow(&self, operation: &Operation) -> Option<Arc<dyn Workflow<S>>> {
        self.shared
            .workflows
            .get(operation)
            .map(|r| r.workflow.clone())
    }

    /// The id of the run of `scope` here (in this database's namespace).
    pub async fn run_id(&self, scope: &Scope) -> Result<RunId, idem_core::StoreError> {
        Ok(RunId::of(&self.shared.namespace().await?, scope))
    }
}
