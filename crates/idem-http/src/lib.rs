//! # Idem over HTTP
//!
//! [`IdempotencyLayer`] puts the `Idempotency-Key` contract in front of any tower
//! service (an axum `Router`, a `MethodRouter`, a hyper service). For each
//! unsafe request it parses the key, resolves the tenant, fingerprints the
//! request, claims the key in a database transaction, and hands that open
//! transaction to the handler as an [`IdemTx`] request extension. The handler's
//! writes and the stored response commit together; a retry gets the stored
//! response with `Idempotent-Replayed: true`.
//!
//! Failures are `application/problem+json` ([`Rejection`]): missing key 400,
//! malformed key 400, mismatch 422, in flight 409 + `Retry-After`, body too
//! large 413, store unavailable 503 + `Retry-After`.
//!
//! What is stored: 2xx and 3xx responses as completed; 4xx responses whose
//! status is in [`RouteConfig::store_client_errors`] (default 402, 409, 410,
//! 422) as failed; everything else (400 validation errors, 5xx, a panic) rolls
//! the key back with the handler's writes, so a retry executes again. A handler
//! can override this with a [`Disposition`] response extension.

mod problem;

use std::collections::HashSet;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body::Body;
use http_body_util::{BodyExt, Limited};
use idem_core::{
    Begun, Completion, Engine, Error, FingerprintSpec, IdempotencyKey, KeyStore, Operation, Policy,
    RequestParts, ResourceRef, Scope, StoreError, StoredRecord, StoredResponse, Tenant,
};
use tokio::sync::{MappedMutexGuard, Mutex, MutexGuard};

pub use problem::{Rejection, TYPE_BASE, problem};

/// The header carrying the key.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// Set to `true` on replayed responses.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// Headers that are never stored nor replayed, whatever the configuration.
pub const NEVER_REPLAYED: &[&str] = &[
    "set-cookie",
    "authorization",
    "www-authenticate",
    "proxy-authenticate",
    "proxy-authorization",
];

/// Where the tenant of a request comes from.
#[derive(Debug, Clone)]
pub enum TenantSource {
    /// Every request belongs to this tenant.
    Static(Tenant),
    /// A [`Tenant`] request extension set by your authentication middleware.
    Extension,
    /// A request header, trusted because a gateway in front sets it. Only for
    /// deployments where clients cannot reach the service directly.
    TrustedHeader {
        /// The header, e.g. `x-tenant-id`.
        name: HeaderName,
        /// The tenant when the header is absent.
        default: Option<Tenant>,
    },
}

impl TenantSource {
    /// Resolves the tenant of a request.
    pub fn resolve(&self, parts: &http::request::Parts) -> Result<Tenant, Rejection> {
        match self {
            Self::Static(t) => Ok(t.clone()),
            Self::Extension => parts
                .extensions
                .get::<Tenant>()
                .cloned()
                .ok_or(Rejection::TenantUnresolved),
            Self::TrustedHeader { name, default } => match parts.headers.get(name) {
                Some(v) => v
                    .to_str()
                    .ok()
                    .and_then(|s| Tenant::new(s).ok())
                    .ok_or(Rejection::TenantUnresolved),
                None => default.clone().ok_or(Rejection::TenantUnresolved),
            },
        }
    }
}

/// Overrides what the layer does with a handler's response, set as a response
/// extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Store it (completed if < 400, failed otherwise) and commit.
    Store,
    /// Roll back the key and the handler's writes.
    Discard,
}

/// Per-route configuration.
#[derive(Debug, Clone)]
pub struct RouteConfig {
    /// The operation keys are scoped to.
    pub operation: Operation,
    /// Whether a request without a key is rejected (400) or run without
    /// idempotency (still in a transaction).
    pub key_required: bool,
    /// TTL and maximum wait.
    pub policy: Policy,
    /// Where the tenant comes from.
    pub tenant: TenantSource,
    /// Methods the layer applies to; others pass straight through.
    pub methods: Vec<Method>,
    /// Largest request body read (413 above). Default 1 MiB.
    pub max_request_bytes: usize,
    /// Largest response body stored for replay. Above it the layer rolls back
    /// and answers 500 `response-too-large`, so nothing happens that could not
    /// be replayed. Default 1 MiB.
    pub max_response_bytes: usize,
    /// Response headers stored and replayed (lowercase).
    pub replay_headers: Vec<HeaderName>,
    /// 4xx statuses stored as failed outcomes and replayed.
    pub store_client_errors: HashSet<u16>,
    /// Fingerprint settings (ignored JSON fields).
    pub fingerprint: FingerprintSpec,
}

/// A configuration error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A header that must never be replayed was allow-listed.
    #[error("header {0} may never be replayed")]
    ForbiddenReplayHeader(String),
}

impl RouteConfig {
    /// A route whose requests must carry a key.
    pub fn required(operation: Operation, tenant: TenantSource) -> Self {
        Self {
            operation,
            key_required: true,
            policy: Policy::default(),
            tenant,
            methods: vec![Method::POST, Method::PATCH],
            max_request_bytes: 1 << 20,
            max_response_bytes: 1 << 20,
            replay_headers: vec![
                header::CONTENT_TYPE,
                header::LOCATION,
                header::ETAG,
                header::LINK,
            ],
            store_client_errors: [402, 409, 410, 422].into_iter().collect(),
            fingerprint: FingerprintSpec::default(),
        }
    }

    /// A route where the key is optional.
    pub fn optional(operation: Operation, tenant: TenantSource) -> Self {
        Self {
            key_required: false,
            ..Self::required(operation, tenant)
        }
    }

    /// Whether a response with `status` commits (stored for replay when keyed)
    /// or rolls back: the handler's [`Disposition`] wins, else 2xx/3xx and the
    /// configured 4xx statuses commit.
    fn keeps(&self, status: u16, disposition: Option<Disposition>) -> bool {
        match disposition {
            Some(d) => d == Disposition::Store,
            None => status < 400 || self.store_client_errors.contains(&status),
        }
    }

    /// Adds a response header to replay; refuses the ones in [`NEVER_REPLAYED`].
    pub fn replay_header(mut self, name: HeaderName) -> Result<Self, ConfigError> {
        if NEVER_REPLAYED.contains(&name.as_str()) {
            return Err(ConfigError::ForbiddenReplayHeader(name.to_string()));
        }
        self.replay_headers.push(name);
        Ok(self)
    }
}

/// The open transaction of the current request, as a request extension.
///
/// ```ignore
/// async fn create(Extension(tx): Extension<IdemTx<SqliteTx>>) -> Response {
///     let mut tx = tx.lock().await.unwrap();
///     sqlx::query("…").execute(&mut **tx).await?;
/// }
/// ```
pub struct IdemTx<T>(Arc<Mutex<Option<T>>>);

impl<T> Clone for IdemTx<T> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<T> std::fmt::Debug for IdemTx<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IdemTx")
    }
}

/// The transaction was already finished by the layer (the handler kept the
/// handle past its response).
#[derive(Debug, Clone, Copy)]
pub struct TxFinished;

impl<T> IdemTx<T> {
    fn new(tx: T) -> Self {
        Self(Arc::new(Mutex::new(Some(tx))))
    }

    /// Locks the transaction for use.
    pub async fn lock(&self) -> Result<MappedMutexGuard<'_, T>, TxFinished> {
        MutexGuard::try_map(self.0.lock().await, Option::as_mut).map_err(|_| TxFinished)
    }

    async fn take(&self) -> Option<T> {
        self.0.lock().await.take()
    }
}

/// Applies the idempotency contract to a service.
#[derive(Debug, Clone)]
pub struct IdempotencyLayer<S: KeyStore> {
    engine: Engine<S>,
    config: Arc<RouteConfig>,
}

impl<S: KeyStore> IdempotencyLayer<S> {
    /// A layer for one route.
    pub fn new(store: S, config: RouteConfig) -> Self {
        Self {
            engine: Engine::new(store),
            config: Arc::new(config),
        }
    }
}

impl<S: KeyStore, I> tower::Layer<I> for IdempotencyLayer<S> {
    type Service = Idempotency<S, I>;
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
pub struct Idempotency<S: KeyStore, I> {
    engine: Engine<S>,
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

impl<S, I, ReqB, ResB> tower::Service<Request<ReqB>> for Idempotency<S, I>
where
    S: KeyStore,
    I: tower::Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    I::Future: Send + 'static,
    I::Error: Send + 'static,
    ReqB: Body + From<Bytes> + Send + 'static,
    ReqB::Data: Send,
    ReqB::Error: Into<idem_core::BoxError>,
    ResB: Body + From<Bytes> + Send + 'static,
    ResB::Data: Send,
    ResB::Error: Into<idem_core::BoxError>,
{
    type Response = Response<ResB>;
    type Error = I::Error;
    type Future = ResponseFuture<Response<ResB>, I::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        if !self.config.methods.contains(req.method()) {
            let mut inner = inner;
            return ResponseFuture(Box::pin(inner.call(req)));
        }
        let engine = self.engine.clone();
        let config = self.config.clone();
        ResponseFuture(Box::pin(handle(engine, config, inner, req)))
    }
}

fn store_rejection(e: &StoreError) -> Rejection {
    if e.retryable() {
        Rejection::StoreUnavailable(Duration::from_secs(1))
    } else {
        tracing::error!(error = %e, "idempotency store failed");
        Rejection::Internal
    }
}

async fn handle<S, I, ReqB, ResB>(
    engine: Engine<S>,
    config: Arc<RouteConfig>,
    mut inner: I,
    req: Request<ReqB>,
) -> Result<Response<ResB>, I::Error>
where
    S: KeyStore,
    I: tower::Service<Request<ReqB>, Response = Response<ResB>> + Send,
    I::Future: Send,
    ReqB: Body + From<Bytes> + Send,
    ReqB::Error: Into<idem_core::BoxError>,
    ResB: Body + From<Bytes> + Send,
    ResB::Error: Into<idem_core::BoxError>,
{
    let (mut parts, body) = req.into_parts();
    let mut keys = parts.headers.get_all(IDEMPOTENCY_KEY).iter();
    let key = match (keys.next(), keys.next()) {
        (Some(_), Some(_)) => return Ok(Rejection::MalformedKey.into_response()),
        (Some(v), None) => match IdempotencyKey::from_header(v.as_bytes()) {
            Ok(k) => Some(k),
            Err(_) => return Ok(Rejection::MalformedKey.into_response()),
        },
        (None, _) if config.key_required => return Ok(Rejection::MissingKey.into_response()),
        (None, _) => None,
    };
    let tenant = match config.tenant.resolve(&parts) {
        Ok(t) => t,
        Err(r) => return Ok(r.into_response()),
    };
    let body = match Limited::new(body, config.max_request_bytes).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return Ok(Rejection::BodyTooLarge.into_response());
        }
        Err(e) => {
            tracing::debug!(error = %e, "request body could not be read");
            return Ok(problem(
                StatusCode::BAD_REQUEST,
                "unreadable-body",
                "The request body could not be read",
                None,
                None,
            ));
        }
    };
    let Some(key) = key else {
        return unkeyed(engine.store(), &config, inner, parts, body).await;
    };
    let json = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|ct| {
            let ct = ct
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            ct == "application/json" || ct.ends_with("+json")
        })
        .unwrap_or(false);
    let target = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let fingerprint = config.fingerprint.fingerprint(&RequestParts {
        method: parts.method.as_str(),
        operation: &config.operation,
        target,
        json,
        body: &body,
    });
    let scope = Scope::new(tenant.clone(), config.operation.clone(), key);
    let claimed = match engine.begin(&scope, &fingerprint, &config.policy).await {
        Ok(Begun::Fresh(c)) => c,
        Ok(Begun::Replay(record)) => return Ok(replay(&record)),
        Err(Error::FingerprintMismatch) => {
            return Ok(Rejection::FingerprintMismatch.into_response());
        }
        Err(Error::InFlight { retry_after }) => {
            return Ok(Rejection::InFlight(retry_after).into_response());
        }
        Err(Error::Store(e)) => return Ok(store_rejection(&e).into_response()),
        Err(_) => return Ok(Rejection::Internal.into_response()),
    };
    let idem_core::Claimed { tx, scope } = claimed;
    let slot = IdemTx::new(tx);
    parts.extensions.insert(slot.clone());
    parts.extensions.insert(tenant);
    let req = Request::from_parts(parts, ReqB::from(body));
    let outcome = AssertUnwindSafe(inner.call(req)).catch_unwind().await;
    let res = match outcome {
        Ok(Ok(res)) => res,
        Ok(Err(e)) => {
            rollback(engine.store(), &slot).await;
            return Err(e);
        }
        Err(panic) => {
            rollback(engine.store(), &slot).await;
            std::panic::resume_unwind(panic);
        }
    };
    let (mut rparts, rbody) = res.into_parts();
    let bytes = match Limited::new(rbody, config.max_response_bytes)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            rollback(engine.store(), &slot).await;
            tracing::error!(error = %e, operation = %config.operation, "response not captured; rolled back");
            return Ok(Rejection::ResponseTooLarge.into_response());
        }
    };
    let status = rparts.status.as_u16();
    let store = config.keeps(status, rparts.extensions.remove::<Disposition>());
    let Some(tx) = slot.take().await else {
        return Ok(Rejection::Internal.into_response());
    };
    if !store {
        let _ = engine.store().rollback(tx).await;
        return Ok(Response::from_parts(rparts, ResB::from(bytes)));
    }
    let headers = rparts
        .headers
        .iter()
        .filter(|(n, _)| config.replay_headers.contains(n) && !NEVER_REPLAYED.contains(&n.as_str()))
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
    let claimed = idem_core::Claimed { tx, scope };
    if let Err(e) = engine.finish(claimed, &completion).await {
        return Ok(store_rejection(&e).into_response());
    }
    Ok(Response::from_parts(rparts, ResB::from(bytes)))
}

async fn rollback<S: KeyStore>(store: &S, slot: &IdemTx<S::Tx>) {
    if let Some(tx) = slot.take().await {
        let _ = store.rollback(tx).await;
    }
}

async fn unkeyed<S, I, ReqB, ResB>(
    store: &S,
    config: &RouteConfig,
    mut inner: I,
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
        Err(e) => return Ok(store_rejection(&e).into_response()),
    };
    let slot = IdemTx::new(tx);
    parts.extensions.insert(slot.clone());
    let res = match AssertUnwindSafe(inner.call(Request::from_parts(parts, ReqB::from(body))))
        .catch_unwind()
        .await
    {
        Ok(Ok(res)) => res,
        Ok(Err(e)) => {
            rollback(store, &slot).await;
            return Err(e);
        }
        Err(panic) => {
            rollback(store, &slot).await;
            std::panic::resume_unwind(panic);
        }
    };
    let keep = match res.extensions().get::<Disposition>() {
        Some(d) => *d == Disposition::Store,
        None => {
            res.status().as_u16() < 400
                || config.store_client_errors.contains(&res.status().as_u16())
        }
    };
    if let Some(tx) = slot.take().await {
        let result = if keep {
            store.commit(tx).await
        } else {
            store.rollback(tx).await
        };
        if let Err(e) = result {
            return Ok(store_rejection(&e).into_response());
        }
    }
    Ok(res)
}

/// Rebuilds a stored response, marked as a replay.
pub fn replay<B: From<Bytes>>(record: &StoredRecord) -> Response<B> {
    let Some(stored) = &record.response else {
        return Rejection::Internal.into_response();
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
