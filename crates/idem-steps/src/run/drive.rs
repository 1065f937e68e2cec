//! One execution of a run: the workflow from the top (recorded steps
//! return their results) with the heartbeat beside it; a panic blocks the
//! run for an operator.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt;
use idem_core::Clock;
use idem_core::steps::{Lease, Namespace, RunChange, RunRecord, RunState, RunStore};
use tokio::sync::watch;

use super::Run;
use super::end::{Keep, execute};
use super::lease::heartbeat;
use crate::error::Ended;
use crate::executor::Executor;
use crate::workflow::Workflow;

/// Executes one run to an end: the workflow from the top (recorded steps
/// return their results), then the final answer, compensation, a block for
/// an operator, or a stop.
pub(crate) async fn drive<S: RunStore>(
    exec: Arc<Executor<S>>,
    workflow: Arc<dyn Workflow<S>>,
    namespace: Namespace,
    record: RunRecord,
    lease: Lease,
    claim: Option<S::Tx>,
    keep: Keep,
) -> Ended {
    let (lost_tx, lost_rx) = watch::channel(false);
    let mut run = Run::new(
        exec.clone(),
        namespace,
        record,
        lease.clone(),
        claim,
        lost_rx,
    );
    let outcome = {
        let beat = heartbeat(exec.clone(), lease.clone(), run.beat.clone(), lost_tx);
        let work = AssertUnwindSafe(execute(&mut run, &*workflow, keep)).catch_unwind();
        tokio::pin!(beat, work);
        let mut beating = true;
        loop {
            tokio::select! {
                outcome = &mut work => break outcome,
                () = &mut beat, if beating => beating = false,
            }
        }
    };
    match outcome {
        Ok(ended) => ended,
        Err(_) => {
            // A panic in the workflow would repeat on every resume: the run
            // waits for an operator instead.
            let claim_open = run.claim_open;
            run.rollback_open().await;
            drop(run);
            tracing::error!(run = %lease.run, "the workflow panicked");
            if claim_open {
                return Ended::Aborted {
                    error: "the workflow panicked".into(),
                    retryable: false,
                };
            }
            let reason = "the workflow panicked";
            let change = RunChange {
                state: Some(RunState::NeedsAttention),
                attention: Some(Some(("-", reason))),
                ..RunChange::default()
            };
            let _ = exec
                .store
                .record_run(&lease, &change, None, exec.clock.now_ms())
                .await;
            Ended::NeedsAttention {
                step: "-".into(),
                reason: reason.into(),
            }
        }
    }
}
