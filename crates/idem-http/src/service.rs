//! [`IdempotencyLayer`], the [`Idempotency`] service and its [`ResponseFuture`].

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, header};
use http_body::Body;
use http_body_util::{BodyExt, Limited};
use idem_core::{
    Begun, BoxError, Claimed, Clock, Completion, Engine, Error, IdempotencyKey, KeyStore,
    RequestParts, ResourceRef, Scope, StoreError, StoredRecord, StoredResponse, SystemClock,
};

use crate::config::RouteConfig;
use crate::outcome::RequestOutcome;
use crate::problem::{Rejection, problem};
use crate::tx::IdemTx;
use crate::{Disposition, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};

/// Applies the idempotency contract to a service. One layer per route: the
/// [`RouteConfig`] names the operation keys are scoped to.
#[derive(Debug, Clone)]
pub struct IdempotencyLayer<S: KeyStore, C = SystemClock> {
    engine: Engine<S, C>,
    config: Arc<RouteConfig>,
}

impl<S: KeyStore> IdempotencyLayer<S> {
    /// A layer for one route, on the system clock.
    pub fn new(store: S, config: RouteConfig) -> Self {
        Self {
            engine: Engine::new(store),
            config: Arc::new(config),
        }
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
pub struct Idempotency<S: KeyStore, I, C = SystemClock> {
    engine: Engine<S, C>,
    config: Arc<RouteConfig>,
    inner: I,
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

/// What the client is told when the store fails. The error and its sources
/// are logged; the client gets only the problem type.
fn store_rejection(e: &StoreError) -> Rejection {
    let error = e as &(dyn std::error::Error + 'static);
    match e {
        StoreError::OutcomeUnknown { .. } => {
            tracing::warn!(error, "commit not acknowledged; outcome unknown");
            Rejection::OutcomeUnknown(Duration::from_secs(1))
        }
        e if e.retryable() => {
            tracing::warn!(error, "idempotency store unavailable");
            Rejection::StoreUnavailable(Duration::from_secs(1))
        }
        _ => {
            tracing::error!(error, "idempotency store failed");
            Rejection::Internal
        }
    }
}

/// Reads the key header: `Ok(None)` when absent, a rejection when sent twice or
/// malformed.
fn key_of(headers: &HeaderMap) -> Result<Option<IdempotencyKey>, Rejection> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    match (values.next(), values.next()) {
        (Some(_), Some(_)) => Err(Rejection::KeySentTwice),
        (Some(v), None) => IdempotencyKey::from_header(v.as_bytes())
            .map(Some)
            .map_err(Rejection::MalformedKey),
        (None, _) => Ok(None),
    }
}

/// A rejection as a response, marked with what the layer did.
fn reject<B: From<Bytes>>(r: Rejection) -> Response<B> {
    let outcome = RequestOutcome::of(&r);
    outcome.mark(r.into_response())
}

/// Whether the body is fingerprinted as JSON (`application/json`, `…+json`).
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|ct| {
            let essence = ct.split(';').next().unwrap_or("").trim();
            essence.eq_ignore_ascii_case("application/json")
                || essence.to_ascii_lowercase().ends_with("+json")
        })
        .unwrap_or(false)
}

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
    let (mut parts, body) = req.into_parts();
    let key = match key_of(&parts.headers) {
        Ok(None) if config.key_required => return Ok(reject(Rejection::MissingKey)),
        Ok(key) => key,
        Err(r) => return Ok(reject(r)),
    };
    let tenant = match config.tenant.resolve(&parts) {
        Ok(t) => t,
        Err(r) => return Ok(reject(r)),
    };
    let body = match Limited::new(body, config.max_request_bytes).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return Ok(reject(Rejection::BodyTooLarge));
        }
        Err(e) => {
            tracing::debug!(error = %e, "request body could not be read");
            let res = problem(
                StatusCode::BAD_REQUEST,
                "unreadable-body",
                "The request body could not be read",
                None,
                None,
            );
            return Ok(RequestOutcome::UnreadableBody.mark(res));
        }
    };
    let Some(key) = key else {
        return unkeyed(engine.store(), &config, inner, parts, body).await;
    };
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let fingerprint = config.fingerprint.fingerprint(&RequestParts {
        method: parts.method.as_str(),
        operation: &config.operation,
        target,
        json: is_json(&parts.headers),
        body: &body,
    });
    let scope = Scope::new(tenant.clone(), config.operation.clone(), key);
    let Claimed { tx, scope } = match engine.begin(&scope, &fingerprint, &config.policy).await {
        Ok(Begun::Fresh(c)) => c,
        Ok(Begun::Replay(record)) => return Ok(RequestOutcome::Replayed.mark(replay(&record))),
        Err(Error::FingerprintMismatch) => return Ok(reject(Rejection::FingerprintMismatch)),
        Err(Error::InFlight { retry_after }) => {
            return Ok(reject(Rejection::InFlight(retry_after)));
        }
        Err(Error::Store(e)) => return Ok(reject(store_rejection(&e))),
        Err(_) => return Ok(reject(Rejection::Internal)),
    };
    let slot = IdemTx::new(tx);
    parts.extensions.insert(slot.clone());
    parts.extensions.insert(tenant);
    let req = Request::from_parts(parts, ReqB::from(body));
    let (mut rparts, bytes) = match run_handler(engine.store(), &config, &slot, inner, req).await? {
        Ok(answer) => answer,
        Err(r) => return Ok(reject(r)),
    };
    let status = rparts.status.as_u16();
    let Some(tx) = slot.take().await else {
        return Ok(reject(Rejection::Internal));
    };
    if !config.keeps(status, rparts.extensions.remove::<Disposition>()) {
        if let Err(e) = engine.store().rollback(tx).await {
            tracing::debug!(
                error = &e as &dyn std::error::Error,
                "rollback failed; the transaction is discarded with its connection"
            );
        }
        let res = Response::from_parts(rparts, ResB::from(bytes));
        return Ok(RequestOutcome::NotStored.mark(res));
    }
    let headers = rparts
        .headers
        .iter()
        .filter(|(n, _)| config.replays(n))
        .filter_map(|(n, v)| Some((n.as_str().to_owned(), v.to_str().ok()?.to_owned())))
        .collect();
    let response = StoredResponse {
        status,
        headers,
        body: bytes.to_vec(),
    };
    let mut completion = if status < 400 {
        Completion::completed(response)
    } else {
        Completion::failed(response)
    };
    completion.resource = rparts.extensions.remove::<ResourceRef>();
    if let Err(e) = engine.finish(Claimed { tx, scope }, &completion).await {
        return Ok(reject(store_rejection(&e)));
    }
    let res = Response::from_parts(rparts, ResB::from(bytes));
    Ok(RequestOutcome::Executed.mark(res))
}

/// Runs the handler and captures its answer, within the route's handler
/// timeout. `Ok(Err(rejection))` when the layer answers instead: the
/// response is over the capture cap, or the handler took too long. Either
/// way the transaction was rolled back first.
async fn run_handler<S, I, ReqB, ResB>(
    store: &S,
    config: &RouteConfig,
    slot: &IdemTx<S::Tx>,
    inner: I,
    req: Request<ReqB>,
) -> Result<Result<(http::response::Parts, Bytes), Rejection>, I::Error>
where
    S: KeyStore,
    I: tower::Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: Body,
    ResB::Error: Into<BoxError>,
{
    let answer = async {
        let res = call_in_tx(store, slot, inner, req).await?;
        let (rparts, rbody) = res.into_parts();
        let collected = Limited::new(rbody, config.max_response_bytes)
            .collect()
            .await;
        Ok((rparts, collected))
    };
    match tokio::time::timeout(config.handler_timeout, answer).await {
        Err(_) => {
            discard(slot).await;
            tracing::warn!(operation = %config.operation, timeout = ?config.handler_timeout,
                           "handler timed out; rolled back");
            Ok(Err(Rejection::HandlerTimeout(config.handler_timeout)))
        }
        Ok(Err(e)) => Err(e),
        Ok(Ok((rparts, Ok(collected)))) => Ok(Ok((rparts, collected.to_bytes()))),
        Ok(Ok((_, Err(e)))) => {
            rollback(store, slot).await;
            tracing::error!(error = %e, operation = %config.operation, "response not captured; rolled back");
            Ok(Err(Rejection::ResponseTooLarge))
        }
    }
}

/// Calls the handler with the transaction in its extensions. When the handler
/// fails or panics the transaction is rolled back first; the error is returned
/// and the panic resumed, so outer layers (e.g. `CatchPanic`) still see them.
async fn call_in_tx<S, I, ReqB, ResB>(
    store: &S,
    slot: &IdemTx<S::Tx>,
    mut inner: I,
    req: Request<ReqB>,
) -> Result<Response<ResB>, I::Error>
where
    S: KeyStore,
    I: tower::Service<Request<ReqB>, Response = Response<ResB>>,
{
    match AssertUnwindSafe(inner.call(req)).catch_unwind().await {
        Ok(Ok(res)) => Ok(res),
        Ok(Err(e)) => {
            rollback(store, slot).await;
            Err(e)
        }
        Err(panic) => {
            rollback(store, slot).await;
            std::panic::resume_unwind(panic)
        }
    }
}

/// Drops the transaction without waiting for its `ROLLBACK`: after a
/// timeout the connection may be the thing that hangs, and the client has
/// waited long enough. The driver rolls a dropped transaction back when its
/// connection is next used; until then nothing of it is visible.
async fn discard<T>(slot: &IdemTx<T>) {
    drop(slot.take().await);
}

async fn rollback<S: KeyStore>(store: &S, slot: &IdemTx<S::Tx>) {
    if let Some(tx) = slot.take().await {
        // A failed rollback still leaves nothing committed: the database
        // discards the transaction when the connection goes.
        let _ = store.rollback(tx).await;
    }
}

/// A request without a key on a route where keys are optional: the handler
/// still gets a transaction, committed or rolled back by the same rule.
async fn unkeyed<S, I, ReqB, ResB>(
    store: &S,
    config: &RouteConfig,
    inner: I,
    mut parts: http::request::Parts,
    body: Bytes,
) -> Result<Response<ResB>, I::Error>
where
    S: KeyStore,
    I: tower::Service<Request<ReqB>, Response = Response<ResB>>,
    ReqB: From<Bytes>,
    ResB: From<Bytes>,
{
    let tx = match store.begin().await {
        Ok(tx) => tx,
        Err(e) => return Ok(reject(store_rejection(&e))),
    };
    let slot = IdemTx::new(tx);
    parts.extensions.insert(slot.clone());
    let req = Request::from_parts(parts, ReqB::from(body));
    let mut res =
        match tokio::time::timeout(config.handler_timeout, call_in_tx(store, &slot, inner, req))
            .await
        {
            Ok(res) => res?,
            Err(_) => {
                discard(&slot).await;
                return Ok(reject(Rejection::HandlerTimeout(config.handler_timeout)));
            }
        };
    let keep = config.keeps(
        res.status().as_u16(),
        res.extensions_mut().remove::<Disposition>(),
    );
    if let Some(tx) = slot.take().await {
        let result = if keep {
            store.commit(tx).await
        } else {
            store.rollback(tx).await
        };
        if let Err(e) = result {
            return Ok(reject(store_rejection(&e)));
        }
    }
    Ok(RequestOutcome::Unkeyed.mark(res))
}

/// Rebuilds a stored response, marked as a replay.
pub fn replay<B: From<Bytes>>(record: &StoredRecord) -> Response<B> {
    let Some(stored) = &record.response else {
        return reject(Rejection::Internal);
    };
    let mut res = Response::new(B::from(Bytes::from(stored.body.clone())));
    *res.status_mut() =
        StatusCode::from_u16(stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    for (n, v) in &stored.headers {
        if let (Ok(n), Ok(v)) = (
            HeaderName::try_from(n.as_str()),
            HeaderValue::try_from(v.as_str()),
        ) {
            res.headers_mut().append(n, v);
        }
    }
    res.headers_mut()
        .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_content_types() {
        let h = |ct: &str| {
            let mut m = HeaderMap::new();
            m.insert(header::CONTENT_TYPE, HeaderValue::from_str(ct).unwrap());
            is_json(&m)
        };
        assert!(h("application/json"));
        assert!(h("Application/JSON; charset=utf-8"));
        assert!(h("application/merge-patch+json"));
        assert!(!h("text/plain"));
        assert!(!h("application/jsonp"));
        assert!(!is_json(&HeaderMap::new()));
    }

    #[test]
    fn key_header_sent_twice_is_malformed() {
        let mut m = HeaderMap::new();
        assert_eq!(key_of(&m), Ok(None));
        m.append(IDEMPOTENCY_KEY, HeaderValue::from_static("a"));
        assert_eq!(key_of(&m).unwrap().unwrap().as_str(), "a");
        m.append(IDEMPOTENCY_KEY, HeaderValue::from_static("a"));
        assert_eq!(key_of(&m), Err(Rejection::KeySentTwice));
    }
}
