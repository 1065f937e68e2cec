//! [`IdempotencyLayer`], the [`Idempotency`] service and its [`ResponseFuture`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use idem_core::{BoxError, Clock, Engine, KeyStore, SharedClock};

use tracing::Instrument;

use crate::admission::admit;
use crate::config::RouteConfig;
use crate::execution::{execute, reject};
use crate::outcome::RequestOutcome;

/// Applies the idempotency contract to a service. One layer per route: the
/// [`RouteConfig`] names the operation keys are scoped to.
#[derive(Debug, Clone)]
pub struct IdempotencyLayer<S: KeyStore, C = SharedClock> {
    engine: Engine<S, C>,
    config: Arc<RouteConfig>,
}

impl<S: KeyStore> IdempotencyLayer<S> {
    /// A layer for one route, on the store's clock ([`KeyStore::clock`]: the
    /// host's for SQLite, the database server's for PostgreSQL). The
    /// settings are taken as they are; [`IdempotencyLayer::try_new`] checks
    /// them first.
    pub fn new(store: S, config: RouteConfig) -> Self {
        Self {
            engine: Engine::new(store),
            config: Arc::new(config),
        }
    }

    /// The layer, once [`RouteConfig::validate`] accepts `config`: use it
    /// when the settings come from a file or the environment.
    pub fn try_new(store: S, config: RouteConfig) -> Result<Self, crate::RouteConfigError> {
        config.validate()?;
        Ok(Self::new(store, config))
    }
}

impl<S: KeyStore, C: Clock + Clone> IdempotencyLayer<S, C> {
    /// The same layer on another clock (tests use a
    /// [`ManualClock`](idem_core::ManualClock) to pass a TTL without sleeping).
    pub fn with_clock<C2: Clock + Clone>(self, clock: C2) -> IdempotencyLayer<S, C2> {
        IdempotencyLayer {
            engine: Engine::with_clock(self.engine.store().clone(), clock),
            config: self.config,
        }
    }

    /// The route's configuration.
    pub fn config(&self) -> &RouteConfig {
        &self.config
    }
}

impl<S: KeyStore, C: Clock + Clone, I> tower::Layer<I> for IdempotencyLayer<S, C> {
    type Service = Idempotency<S, I, C>;
    fn layer(&self, inner: I) -> Self::Service {
        Idempotency {
            engine: self.engine.clone(),
            config: self.config.clone(),
            inner,
        }
    }
}

/// The service produced by [`IdempotencyLayer`].
#[derive(Debug, Clone)]
pub struct Idempotency<S: KeyStore, I, C = SharedClock> {
    engine: Engine<S, C>,
    config: Arc<RouteConfig>,
    inner: I,
}

impl<S: KeyStore, I, C> Idempotency<S, I, C> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &I {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut I {
        &mut self.inner
    }

    /// The wrapped service, without the idempotency contract: requests
    /// sent to it are no longer recorded under their keys.
    pub fn into_inner(self) -> I {
        self.inner
    }
}

/// The response future of [`Idempotency`].
pub struct ResponseFuture<R, E>(Pin<Box<dyn Future<Output = Result<R, E>> + Send>>);

impl<R, E> Future for ResponseFuture<R, E> {
    type Output = Result<R, E>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.0.as_mut().poll(cx)
    }
}

impl<R, E> std::fmt::Debug for ResponseFuture<R, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResponseFuture")
    }
}

impl<S, C, I, ReqB, ResB> tower::Service<Request<ReqB>> for Idempotency<S, I, C>
where
    S: KeyStore,
    C: Clock + Clone,
    I: tower::Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    I::Future: Send + 'static,
    I::Error: Send + 'static,
    ReqB: Body + From<Bytes> + Send + 'static,
    ReqB::Data: Send,
    ReqB::Error: Into<BoxError>,
    ResB: Body + From<Bytes> + Send + 'static,
    ResB::Data: Send,
    ResB::Error: Into<BoxError>,
{
    type Response = Response<ResB>;
    type Error = I::Error;
    type Future = ResponseFuture<Response<ResB>, I::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        // The clone that was driven to readiness serves this request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        if !self.config.methods.contains(req.method()) {
            return ResponseFuture(Box::pin(inner.call(req)));
        }
        let engine = self.engine.clone();
        let config = self.config.clone();
        ResponseFuture(Box::pin(handle(engine, config, inner, req)))
    }
}

/// Admission, then execution: the first rejection answers, else the request
/// runs through the engine.
async fn handle<S, C, I, ReqB, ResB>(
    engine: Engine<S, C>,
    config: Arc<RouteConfig>,
    inner: I,
    req: Request<ReqB>,
) -> Result<Response<ResB>, I::Error>
where
    S: KeyStore,
    C: Clock + Clone,
    I: tower::Service<Request<ReqB>, Response = Response<ResB>> + Send,
    I::Future: Send,
    ReqB: Body + From<Bytes> + Send,
    ReqB::Error: Into<BoxError>,
    ResB: Body + From<Bytes> + Send,
    ResB::Error: Into<BoxError>,
{
    let started = tokio::time::Instant::now();
    let span = request_span(&config);
    let answer = async {
        match admit(&config, req).await {
            Ok(admitted) => {
                record_admitted(&span, &admitted);
                execute(&engine, &config, inner, admitted).await
            }
            Err(rejection) => Ok(reject(rejection)),
        }
    }
    .instrument(span.clone())
    .await;
    // A handler's own error (after its rollback) has no outcome of the
    // layer's: it counts as `internal`.
    let outcome = match &answer {
        Ok(res) => res
            .extensions()
            .get::<RequestOutcome>()
            .copied()
            .unwrap_or(RequestOutcome::Internal),
        Err(_) => RequestOutcome::Internal,
    };
    span.record("outcome", tracing::field::display(outcome));
    outcome.record(&config.operation, started.elapsed());
    answer
}

/// The `idem.request` span of one request: its operation now; its tenant
/// and a short hash of its key once admission read them. Never the key
/// itself, nor a body.
pub fn request_span(config: &RouteConfig) -> tracing::Span {
    tracing::info_span!(
        "idem.request",
        operation = %config.operation,
        tenant = tracing::field::Empty,
        key_hash = tracing::field::Empty,
        outcome = tracing::field::Empty,
    )
}

/// Ends a request the layer's way for a service that answers it itself (a
/// gateway, runs' routes): the response's [`RequestOutcome`] (`internal`
/// when it carries none) goes into the span and the request counters.
pub fn record_answered<B>(
    span: &tracing::Span,
    operation: &idem_core::Operation,
    res: &http::Response<B>,
    elapsed: std::time::Duration,
) {
    let outcome = res
        .extensions()
        .get::<RequestOutcome>()
        .copied()
        .unwrap_or(RequestOutcome::Internal);
    span.record("outcome", tracing::field::display(outcome));
    outcome.record(operation, elapsed);
}

/// Fills the span's tenant and key hash from an admitted request.
pub fn record_admitted(span: &tracing::Span, admitted: &crate::Admitted) {
    // The key's hash is a SHA-256: not worth it for a span nobody records.
    if span.is_disabled() {
        return;
    }
    span.record("tenant", tracing::field::display(&admitted.tenant));
    if let Some(keyed) = &admitted.keyed {
        span.record(
            "key_hash",
            tracing::field::display(keyed.scope.key.short_hash()),
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use idem_core::Operation;
    use idem_sqlite::{SqliteConfig, SqliteStore};
    use tower::Layer;

    use super::*;
    use crate::config::TenantSource;

    /// A layer on a real SQLite file; the directory goes with the test.
    async fn layer() -> (idem_testkit::TempDir, IdempotencyLayer<SqliteStore>) {
        let dir = idem_testkit::TempDir::new("http-accessors");
        let store = SqliteStore::connect(&dir.sqlite_url(), SqliteConfig::default())
            .await
            .unwrap();
        let config = RouteConfig::required(
            Operation::new("orders.create").unwrap(),
            TenantSource::Extension,
        );
        (dir, IdempotencyLayer::new(store, config))
    }

    /// The service a test wraps: it only says who it is.
    #[derive(Debug, Clone, PartialEq)]
    struct Inner(&'static str);

    #[tokio::test]
    async fn get_ref_reads_the_wrapped_service() {
        let (_dir, layer) = layer().await;
        let svc = layer.layer(Inner("orders"));
        assert_eq!(svc.get_ref(), &Inner("orders"));
    }

    #[tokio::test]
    async fn get_mut_changes_the_wrapped_service() {
        let (_dir, layer) = layer().await;
        let mut svc = layer.layer(Inner("orders"));
        *svc.get_mut() = Inner("refunds");
        assert_eq!(svc.get_ref(), &Inner("refunds"));
    }

    #[tokio::test]
    async fn into_inner_gives_the_wrapped_service_back() {
        let (_dir, layer) = layer().await;
        let svc = layer.layer(Inner("orders"));
        assert_eq!(svc.into_inner(), Inner("orders"));
    }
}
