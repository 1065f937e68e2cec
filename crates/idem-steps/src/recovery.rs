//! [`Recovery`]: the worker that resumes runs whose executor went away.

use std::future::Future;
use std::time::Duration;

use idem_core::steps::{RunChange, RunStore};
use idem_core::{Clock, Pause, Polling, RoundLoop, Rounds};

use crate::run::end::Keep;
use crate::runs::Runs;

/// Resumes runs whose lease expired — their executor crashed, was killed,
/// or gave them back for a later retry — with a new fence, from their
/// recorded steps. It takes at most as many as this process has free run
/// slots, so it never runs more than
/// [`RunsConfig::max_concurrent`](crate::RunsConfig::max_concurrent) at
/// once. Several workers (processes) may share one database: a run is
/// taken by one of them only ([`RunStore::claim_due`]).
///
/// ```no_run
/// # async fn demo<S: idem_core::steps::RunStore>(runs: idem_steps::Runs<S>) {
/// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
/// tokio::spawn(runs.recovery().run(async { let _ = stopped.await; }));
/// # let _ = stop;
/// # }
/// ```
#[derive(Debug)]
pub struct Recovery<S: RunStore> {
    runs: Runs<S>,
}

impl<S: RunStore> Runs<S> {
    /// The worker that resumes runs whose lease expired (see [`Recovery`]).
    pub fn recovery(&self) -> Recovery<S> {
        Recovery::new(self.clone())
    }
}

impl<S: RunStore> Recovery<S> {
    fn new(runs: Runs<S>) -> Self {
        Self { runs }
    }

    /// Looks for due runs every [`RunsConfig::poll`](crate::RunsConfig::poll)
    /// until `shutdown` completes.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        RoundLoop::new(Polling).run(&mut self, shutdown).await;
    }

    /// Takes over the due runs this process has room for and starts them;
    /// returns how many.
    pub async fn recover_once(&mut self) -> Result<usize, idem_core::StoreError> {
        let shared = &self.runs.shared;
        let free = shared.permits.available_permits().min(64);
        if free == 0 {
            return Ok(0);
        }
        let namespace = shared.namespace().await?;
        let now = shared.exec.clock.now_ms();
        let runs = shared
            .exec
            .store
            .claim_due(
                &self.runs.operations(),
                &shared.exec.holder,
                now,
                now + shared.exec.lease_ms(),
                u32::try_from(free).unwrap_or(64),
            )
            .await?;
        let n = runs.len();
        crate::metrics::takeovers(n as u64);
        for record in runs {
            let Some(lease) = record.lease() else {
                continue;
            };
            match shared.permits.clone().try_acquire_owned() {
                Ok(permit) => {
                    tracing::info!(run = %record.id, fence = %record.fence, state = %record.state,
                                   "recovering a run whose lease expired");
                    let keep: Keep = std::sync::Arc::new(|_| true);
                    drop(self.runs.spawn(
                        namespace.clone(),
                        record,
                        lease,
                        None,
                        keep,
                        permit,
                        true,
                    ));
                }
                Err(_) => {
                    // No room after all (a request took the slot): give it
                    // back, due at once.
                    let change = RunChange {
                        release: true,
                        locked_until_ms: Some(now),
                        ..RunChange::default()
                    };
                    let _ = shared
                        .exec
                        .store
                        .record_run(&lease, &change, None, now)
                        .await;
                }
            }
        }
        Ok(n)
    }
}

impl<S: RunStore> Rounds for Recovery<S> {
    async fn round(&mut self) -> Pause {
        let poll = self.runs.config().poll;
        match self.recover_once().await {
            // A full batch: there may be more.
            Ok(n) if n >= 64 => Pause::None,
            Ok(_) => Pause::Sleep(poll),
            Err(e) => {
                tracing::warn!(error = %idem_core::ErrorChain(&e), "recovery could not look for due runs");
                Pause::Sleep(poll.max(Duration::from_secs(1)))
            }
        }
    }
}
