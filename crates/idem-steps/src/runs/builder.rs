//! [`RunsBuilder`]: settings, clock and workflows, checked before [`Runs`]
//! exists.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use idem_core::steps::RunStore;
use idem_core::{Clock, ConfigError, Engine, Operation, SharedClock};
use tokio::sync::Semaphore;

use super::{Registered, Runs, Shared};
use crate::config::{RunsConfig, WorkflowPolicy};
use crate::executor::Executor;
use crate::workflow::Workflow;

/// Builds [`Runs`]: its settings, its clock, its workflows.
pub struct RunsBuilder<S: RunStore> {
    store: S,
    config: RunsConfig,
    clock: SharedClock,
    workflows: HashMap<Operation, Registered<S>>,
}

impl<S: RunStore> RunsBuilder<S> {
    /// Settings other than the defaults.
    pub fn config(mut self, config: RunsConfig) -> Self {
        self.config = config;
        self
    }

    /// Another clock than the store's (tests pass a
    /// [`ManualClock`](idem_core::ManualClock)). Every executor sharing the
    /// store must read the same one.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = SharedClock::new(clock);
        self
    }

    /// Registers the workflow of `operation`: runs of keys scoped to it
    /// execute `workflow`.
    pub fn workflow(
        mut self,
        operation: Operation,
        workflow: impl Workflow<S>,
        policy: WorkflowPolicy,
    ) -> Self {
        self.workflows.insert(
            operation,
            Registered {
                workflow: Arc::new(workflow),
                policy,
            },
        );
        self
    }

    /// The executor, once every setting is within its bounds.
    pub fn build(self) -> Result<Runs<S>, ConfigError> {
        self.config.validate()?;
        for r in self.workflows.values() {
            r.policy.validate()?;
        }
        let holder = self.config.holder.clone().unwrap_or_else(|| {
            let random = uuid::Uuid::new_v4().simple().to_string();
            format!("{}-{}", std::process::id(), &random[..8])
        });
        let permits = Arc::new(Semaphore::new(self.config.max_concurrent));
        Ok(Runs {
            shared: Arc::new(Shared {
                engine: Engine::with_clock(self.store.clone(), self.clock.clone()),
                exec: Arc::new(Executor {
                    store: self.store,
                    clock: self.clock,
                    config: self.config,
                    holder,
                }),
                workflows: self.workflows,
                permits,
                namespace: tokio::sync::OnceCell::new(),
                waiters: Mutex::default(),
            }),
        })
    }
}

impl<S: RunStore> Runs<S> {
    /// A builder with the default settings, on the store's clock
    /// ([`KeyStore::clock`](idem_core::KeyStore::clock): the host's for
    /// SQLite, the database server's for PostgreSQL), so executors on hosts
    /// whose clocks disagree judge each other's leases alike.
    pub fn builder(store: S) -> RunsBuilder<S> {
        let clock = store.clock();
        RunsBuilder {
            store,
            config: RunsConfig::default(),
            clock,
            workflows: HashMap::new(),
        }
    }
}
