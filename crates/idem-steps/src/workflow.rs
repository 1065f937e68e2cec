//! [`Workflow`]: the code of one multi-step operation.

use idem_core::steps::{Failure, RunId, RunStore};
use idem_core::{BoxFuture, Completion, StoredResponse};

use crate::error::Stop;
use crate::run::Run;

/// The code of one operation that calls other systems, registered with
/// [`RunsBuilder::workflow`](crate::RunsBuilder::workflow) under its
/// operation name.
///
/// [`Workflow::run`] is executed again from the top whenever the run is
/// resumed — after a crash, a lost lease, a release — and every step it
/// already recorded returns its recorded result without running again. So:
/// give each step a fixed name (never one built from a counter, a time or a
/// random value), and do nothing with an effect outside a step.
pub trait Workflow<S: RunStore>: Send + Sync + 'static {
    /// The forward path: phases and steps, then the final answer, which is
    /// stored on the key record and replayed to every retry. A
    /// [`Completion::failed`] answer is final without compensation (a
    /// business error decided before anything needed undoing);
    /// `Err(run.fail(…))` compensates first.
    fn run<'r>(&'r self, run: &'r mut Run<S>) -> BoxFuture<'r, Result<Completion, Stop>>;

    /// The final answer of a run that failed, once its compensations ran.
    /// Phases may record the failure (an order marked failed); steps that
    /// call other systems may not run here.
    fn failed<'r>(
        &'r self,
        run: &'r mut Run<S>,
        failure: &'r Failure,
    ) -> BoxFuture<'r, Result<Completion, Stop>>;

    /// What a request that started (or resumed) the run gets when the run
    /// is still going when the answer is due: by default `202` with
    /// `{"run": …, "status": "running"}`. Not stored: a retry with the key
    /// gets `409` while the run lives and the final answer after.
    fn accepted(&self, run: &RunId) -> StoredResponse {
        StoredResponse {
            status: 202,
            headers: vec![("content-type".into(), "application/json".into())],
            body: serde_json::json!({"run": run.as_str(), "status": "running"})
                .to_string()
                .into_bytes(),
        }
    }
}
