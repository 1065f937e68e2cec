//! [`WorkflowService`]: a multi-step operation behind the `Idempotency-Key`
//! contract, as a tower service (mount it with axum's `post_service`).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::Full;
use idem_core::steps::RunStore;
use idem_core::{BoxError, Completion};
use idem_http::{
    Rejection, RequestOutcome, RouteConfig, RouteConfigError, admit, replay, stored_response,
};

use crate::error::{Ended, StartError};
use crate::run::end::Keep;
use crate::runs::{RunHandle, Runs, Started};

/// The route of one multi-step operation: the key header, the tenant, the
/// body limit and the fingerprint as [`RouteConfig`] says (admission is
/// `idem_http`'s), then the run:
///
/// - a fresh key claims the key, creates the run and runs its first phase in
///   one transaction, and executes the workflow in a task of its own; the
///   answer is the run's final outcome if it ends within
///   [`WorkflowService::respond_within`], else the workflow's
///   [`accepted`](crate::Workflow::accepted) answer (`202`, not stored);
/// - a retry gets the stored final outcome (`Idempotent-Replayed: true`),
///   or `409` + `Retry-After` while the run is live elsewhere, or resumes it
///   here when its executor died (its lease expired), or `409`
///   `needs-attention` while an operator must act;
/// - a different request with the key gets `422`, as everywhere.
///
/// Routes must require the key: a run without one could never be resumed.
pub struct WorkflowService<S: RunStore> {
    runs: Runs<S>,
    config: Arc<RouteConfig>,
    respond_within: Duration,
}

impl<S: RunStore> Clone for WorkflowService<S> {
    fn clone(&self) -> Self {
        Self {
            runs: self.runs.clone(),
            config: self.config.clone(),
            respond_within: self.respond_within,
        }
    }
}

impl<S: RunStore> std::fmt::Debug for WorkflowService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkflowService")
            .field("operation", &self.config.operation)
            .finish_non_exhaustive()
    }
}

/// Why a [`WorkflowService`] was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// The route's settings are out of bounds.
    #[error(transparent)]
    Route(#[from] RouteConfigError),
    /// The route does not require the key.
    #[error(
        "the route of {0} must require the Idempotency-Key: a run without a key can never be resumed"
    )]
    KeyOptional(String),
    /// No workflow is registered for the route's operation.
    #[error("no workflow is registered for operation {0}")]
    NotRegistered(String),
    /// The wait for the answer is out of bounds.
    #[error("respond_within must be between 0s and 60s")]
    RespondWithin,
}

impl<S: RunStore> WorkflowService<S> {
    /// Longest [`WorkflowService::respond_within`].
    pub const MAX_RESPOND_WITHIN: Duration = Duration::from_secs(60);

    /// The service for the route `config` (its operation's workflow must be
    /// registered with `runs`), answering within 10 s.
    pub fn new(runs: Runs<S>, config: RouteConfig) -> Result<Self, ServiceError> {
        config.validate()?;
        if !config.key_required {
            return Err(ServiceError::KeyOptional(config.operation.to_string()));
        }
        if runs.workflow(&config.operation).is_none() {
            return Err(ServiceError::NotRegistered(config.operation.to_string()));
        }
        Ok(Self {
            runs,
            config: Arc::new(config),
            respond_within: Duration::from_secs(10),
        })
    }

    /// How long a request that started or resumed a run waits for its end
    /// before it gets the `202` answer (the run goes on). 0 to 60 s.
    pub fn respond_within(mut self, wait: Duration) -> Result<Self, ServiceError> {
        if wait > Self::MAX_RESPOND_WITHIN {
            return Err(ServiceError::RespondWithin);
        }
        self.respond_within = wait;
        Ok(self)
    }

    /// The executor the service starts runs on.
    pub fn get_ref(&self) -> &Runs<S> {
        &self.runs
    }

    /// The executor the service starts runs on, mutably. A replacement must
    /// have the route's workflow registered (as [`WorkflowService::new`]
    /// checks): without it every request answers `500`.
    pub fn get_mut(&mut self) -> &mut Runs<S> {
        &mut self.runs
    }

    /// The executor, without the route: runs it already started go on.
    pub fn into_inner(self) -> Runs<S> {
        self.runs
    }
}

type Answer = Response<Full<Bytes>>;

fn reject(r: Rejection) -> Answer {
    RequestOutcome::of(&r).mark(r.into_response())
}

fn answer(outcome: RequestOutcome, completion: &Completion) -> Answer {
    outcome.mark(stored_response(&completion.response))
}

impl<S: RunStore> WorkflowService<S> {
    async fn handle<B>(self, req: Request<B>) -> Answer
    where
        B: Body + std::marker::Send,
        B::Error: Into<BoxError>,
    {
        let admitted = match admit(&self.config, req).await {
            Ok(a) => a,
            Err(r) => return reject(r),
        };
        idem_http::record_admitted(&tracing::Span::current(), &admitted);
        let Some(keyed) = admitted.keyed else {
            return reject(Rejection::MissingKey);
        };
        let route = self.config.clone();
        let keep: Keep = Arc::new(move |c: &Completion| route.keeps(c.response.status, None));
        let started = self
            .runs
            .start_with(
                &keyed.scope,
                &keyed.fingerprint,
                &self.config.policy,
                admitted.body.to_vec(),
                keep,
            )
            .await;
        let mut handle = match started {
            Ok(Started::Running(handle)) => handle,
            Ok(Started::Replay(record)) => return RequestOutcome::Replayed.mark(replay(&record)),
            Ok(Started::Busy {
                retry_after,
                attention: Some(_),
            }) => return reject(Rejection::NeedsAttention(retry_after)),
            Ok(Started::Busy { retry_after, .. }) => {
                return reject(Rejection::InFlight(retry_after));
            }
            Err(StartError::FingerprintMismatch) => return reject(Rejection::FingerprintMismatch),
            Err(StartError::AtCapacity { retry_after }) => {
                return reject(Rejection::AtCapacity(retry_after));
            }
            Err(StartError::Store(e)) => return reject(Rejection::for_store(&e)),
            Err(e) => {
                tracing::error!(error = %e, "the run could not start");
                return reject(Rejection::Internal);
            }
        };
        let running = |handle: &RunHandle| {
            let workflow = self.runs.workflow(&self.config.operation);
            match workflow {
                Some(w) => RequestOutcome::Accepted.mark(stored_response(&w.accepted(handle.id()))),
                None => reject(Rejection::Internal),
            }
        };
        match handle.ended(self.respond_within).await {
            Some(Ended::Finished(completion)) => answer(RequestOutcome::Executed, &completion),
            Some(Ended::Discarded(completion)) => answer(RequestOutcome::NotStored, &completion),
            Some(Ended::Aborted {
                retryable: true, ..
            }) => reject(Rejection::StoreUnavailable(Duration::from_secs(1))),
            Some(Ended::Aborted { error, .. }) => {
                tracing::error!(run = %handle.id(), error, "the run failed before its first commit");
                reject(Rejection::Internal)
            }
            Some(Ended::NeedsAttention { .. }) => {
                reject(Rejection::NeedsAttention(Duration::from_secs(60)))
            }
            Some(Ended::StoreFailed {
                outcome_unknown: true,
                ..
            }) => reject(Rejection::OutcomeUnknown(Duration::from_secs(1))),
            Some(Ended::StoreFailed { .. }) => {
                reject(Rejection::StoreUnavailable(Duration::from_secs(1)))
            }
            Some(Ended::LeaseLost | Ended::Released { .. } | Ended::NotRegistered) | None => {
                running(&handle)
            }
        }
    }
}

/// The response future of [`WorkflowService`].
pub struct ResponseFuture(
    Pin<Box<dyn Future<Output = Result<Answer, Infallible>> + std::marker::Send>>,
);

impl Future for ResponseFuture {
    type Output = Result<Answer, Infallible>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.0.as_mut().poll(cx)
    }
}

impl std::fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResponseFuture")
    }
}

impl<S, B> tower::Service<Request<B>> for WorkflowService<S>
where
    S: RunStore,
    B: Body + std::marker::Send + 'static,
    B::Data: std::marker::Send,
    B::Error: Into<BoxError>,
{
    type Response = Answer;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let this = self.clone();
        ResponseFuture(Box::pin(async move {
            // The idempotency layer's span and counters, for runs' routes.
            let started = tokio::time::Instant::now();
            let span = idem_http::request_span(&this.config);
            let operation = this.config.operation.clone();
            let res = tracing::Instrument::instrument(this.handle(req), span.clone()).await;
            idem_http::record_answered(&span, &operation, &res, started.elapsed());
            Ok(res)
        }))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use idem_core::steps::Failure;
    use idem_core::{BoxFuture, Operation, Tenant};
    use idem_http::TenantSource;
    use idem_sqlite::{SqliteConfig, SqliteStore};

    use super::*;
    use crate::config::WorkflowPolicy;
    use crate::error::Stop;
    use crate::run::Run;
    use crate::workflow::Workflow;

    /// A workflow these tests never run: they only read the service.
    struct Done;

    impl Workflow<SqliteStore> for Done {
        fn run<'r>(
            &'r self,
            _run: &'r mut Run<SqliteStore>,
        ) -> BoxFuture<'r, Result<Completion, Stop>> {
            Box::pin(async { Err(Stop::Fail(Failure::new("unused"))) })
        }

        fn failed<'r>(
            &'r self,
            _run: &'r mut Run<SqliteStore>,
            _failure: &'r Failure,
        ) -> BoxFuture<'r, Result<Completion, Stop>> {
            Box::pin(async { Err(Stop::Fail(Failure::new("unused"))) })
        }
    }

    /// The service of `orders.create` on a real SQLite file, its executor
    /// named `holder`; the directory goes with the test.
    async fn service(dir: &idem_testkit::TempDir, holder: &str) -> WorkflowService<SqliteStore> {
        let store = SqliteStore::connect(&dir.sqlite_url(), SqliteConfig::default())
            .await
            .unwrap();
        let op = Operation::new("orders.create").unwrap();
        let config = crate::config::RunsConfig {
            holder: Some(holder.into()),
            ..Default::default()
        };
        let runs = Runs::builder(store)
            .config(config)
            .workflow(op.clone(), Done, WorkflowPolicy::default())
            .build()
            .unwrap();
        let route = RouteConfig::required(op, TenantSource::Static(Tenant::new("acme").unwrap()));
        WorkflowService::new(runs, route).unwrap()
    }

    #[tokio::test]
    async fn get_ref_reads_the_executor() {
        let dir = idem_testkit::TempDir::new("steps-get-ref");
        let svc = service(&dir, "node-a").await;
        assert_eq!(svc.get_ref().holder(), "node-a");
    }

    #[tokio::test]
    async fn get_mut_swaps_the_executor() {
        let dir = idem_testkit::TempDir::new("steps-get-mut");
        let mut svc = service(&dir, "node-a").await;
        let other = service(&dir, "node-b").await.into_inner();
        *svc.get_mut() = other;
        assert_eq!(svc.get_ref().holder(), "node-b");
    }

    #[tokio::test]
    async fn into_inner_gives_the_executor_back() {
        let dir = idem_testkit::TempDir::new("steps-into-inner");
        let runs = service(&dir, "node-a").await.into_inner();
        assert_eq!(runs.holder(), "node-a");
        assert_eq!(
            runs.operations(),
            vec![Operation::new("orders.create").unwrap()]
        );
    }
}
