//! Execution: claim or replay an [`Admitted`] request's key, run the handler
//! in the transaction, and finish — store and commit, or roll back.

use std::panic::AssertUnwindSafe;

use bytes::Bytes;
use futures_util::FutureExt;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode, header};
use http_body::Body;
use http_body_util::{BodyExt, Limited};
use idem_core::{
    Aborted, Begun, BoxError, Clock, Engine, Error, Finished, KeyStore, ResourceRef, StoredRecord,
    StoredResponse,
};

use crate::admission::{Admitted, Keyed};
use crate::config::RouteConfig;
use crate::outcome::RequestOutcome;
use crate::problem::Rejection;
use crate::tx::{IdemTx, Open};
use crate::{Disposition, IDEMPOTENT_REPLAYED};

/// Runs an admitted request through `engine` and the handler `inner`.
///
/// With a key: claims it ([`Engine::begin`]) or replays the stored outcome
/// or answers the mismatch / in-flight problem; runs the handler with an
/// [`IdemTx`] and the [`Tenant`](idem_core::Tenant) in its extensions; and
/// stores the response and commits ([`Engine::finish`]), or rolls back
/// ([`Engine::abort`]) what the route does not keep. Without a key: the same
/// in a transaction that claims nothing ([`Engine::begin_unkeyed`]). Every
/// response carries a [`RequestOutcome`]. `Err` only when the handler
/// failed, after its transaction was rolled back.
///
/// # Cancel safety
/// Cancelling drops the open transaction, which rolls back: nothing the
/// handler wrote commits.
pub async fn execute<S, C, I, ReqB, ResB>(
    engine: &Engine<S, C>,
    config: &RouteConfig,
    inner: I,
    admitted: Admitted,
) -> Result<Response<ResB>, I::Error>
where
    S: KeyStore,
    C: Clock + Clone,
    I: tower::Service<Request<ReqB>, Response = Response<ResB>> + Send,
    I::Future: Send,
    ReqB: From<Bytes> + Send,
    ResB: Body + From<Bytes> + Send,
    ResB::Error: Into<BoxError>,
{
    let Admitted {
        mut parts,
        body,
        tenant,
        keyed,
    } = admitted;
    let Some(Keyed { scope, fingerprint }) = keyed else {
        return unkeyed(engine, config, inner, parts, body).await;
    };
    let claimed = match engine.begin(&scope, &fingerprint, &config.policy).await {
        Ok(Begun::Fresh(c)) => c,
        Ok(Begun::Replay(record)) => return Ok(RequestOutcome::Replayed.mark(replay(&record))),
        Err(e) => return Ok(reject(refusal(e))),
    };
    // What is stored is replayed to every retry, whatever it accepts: the
    // handler is asked for bytes every client can read (a compression
    // layer belongs outside this one).
    parts.headers.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
    let slot = IdemTx::new(Open::Keyed(claimed));
    parts.extensions.insert(slot.clone());
    parts.extensions.insert(tenant);
    let req = Request::from_parts(parts, ReqB::from(body));
    let (mut rparts, bytes) = match run_handler(engine, config, &slot, inner, req).await? {
        Ok(answer) => answer,
        Err(r) => return Ok(reject(r)),
    };
    let status = rparts.status.as_u16();
    let Some(Open::Keyed(claimed)) = slot.take().await else {
        return Ok(reject(Rejection::Internal));
    };
    if !config.keeps(status, rparts.extensions.remove::<Disposition>()) {
        match engine.abort(claimed).await {
            // Optimistic route: a concurrent duplicate committed first, and
            // this answer may well be a consequence of its effect.
            Ok(Aborted::Superseded(record)) => {
                return Ok(RequestOutcome::Superseded.mark(replay(&record)));
            }
            Err(Error::FingerprintMismatch) => {
                return Ok(reject(Rejection::FingerprintMismatch));
            }
            Ok(Aborted::RolledBack) => {}
            Err(e) => tracing::debug!(
                error = &e as &dyn std::error::Error,
                "rollback failed; the transaction is discarded with its connection"
            ),
        }
        let res = Response::from_parts(rparts, ResB::from(bytes));
        return Ok(RequestOutcome::NotStored.mark(res));
    }
    let mut completion = config.completion(status, &rparts.headers, &bytes);
    completion.resource = rparts.extensions.remove::<ResourceRef>();
    match engine.finish(claimed, &completion).await {
        Ok(Finished::Committed) => {}
        // Optimistic route: a concurrent duplicate committed first and this
        // request's writes were rolled back; its answer is the winner's.
        Ok(Finished::Superseded(record)) => {
            return Ok(RequestOutcome::Superseded.mark(replay(&record)));
        }
        Err(e) => return Ok(reject(refusal(e))),
    }
    let res = Response::from_parts(rparts, ResB::from(bytes));
    Ok(RequestOutcome::Executed.mark(res))
}

/// What the layer answers when the engine will not run or keep a request.
fn refusal(e: Error) -> Rejection {
    match e {
        Error::FingerprintMismatch => Rejection::FingerprintMismatch,
        Error::InFlight { retry_after } => Rejection::InFlight(retry_after),
        Error::Store(e) => Rejection::for_store(&e),
        // `Error` is non-exhaustive; a variant added later is a server fault
        // until the layer learns it.
        _ => Rejection::Internal,
    }
}

/// A rejection as a response, marked with what the layer did.
pub(crate) fn reject<B: From<Bytes>>(r: Rejection) -> Response<B> {
    let outcome = RequestOutcome::of(&r);
    outcome.mark(r.into_response())
}

/// Runs the handler and captures its answer, within the route's handler
/// timeout. `Ok(Err(rejection))` when the layer answers instead: the
/// response is over the capture cap, or the handler took too long. Either
/// way the transaction was rolled back first.
async fn run_handler<S, C, I, ReqB, ResB>(
    engine: &Engine<S, C>,
    config: &RouteConfig,
    slot: &IdemTx<S::Tx>,
    inner: I,
    req: Request<ReqB>,
) -> Result<Result<(http::response::Parts, Bytes), Rejection>, I::Error>
where
    S: KeyStore,
    C: Clock + Clone,
    I: tower::Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: Body,
    ResB::Error: Into<BoxError>,
{
    let answer = async {
        let res = call_in_tx(engine, slot, inner, req).await?;
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
            rollback(engine, slot).await;
            tracing::error!(error = %e, operation = %config.operation, "response not captured; rolled back");
            Ok(Err(Rejection::ResponseTooLarge))
        }
    }
}

/// Calls the handler with the transaction in its extensions. When the handler
/// fails or panics the transaction is rolled back first; the error is returned
/// and the panic resumed, so outer layers (e.g. `CatchPanic`) still see them.
async fn call_in_tx<S, C, I, ReqB, ResB>(
    engine: &Engine<S, C>,
    slot: &IdemTx<S::Tx>,
    mut inner: I,
    req: Request<ReqB>,
) -> Result<Response<ResB>, I::Error>
where
    S: KeyStore,
    C: Clock + Clone,
    I: tower::Service<Request<ReqB>, Response = Response<ResB>>,
{
    match AssertUnwindSafe(inner.call(req)).catch_unwind().await {
        Ok(Ok(res)) => Ok(res),
        Ok(Err(e)) => {
            rollback(engine, slot).await;
            Err(e)
        }
        Err(panic) => {
            rollback(engine, slot).await;
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

/// Rolls back whatever the slot still holds, through the engine.
async fn rollback<S: KeyStore, C: Clock + Clone>(engine: &Engine<S, C>, slot: &IdemTx<S::Tx>) {
    // A failed rollback still leaves nothing committed: the database
    // discards the transaction when the connection goes.
    match slot.take().await {
        Some(Open::Keyed(claimed)) => drop(engine.abort(claimed).await),
        Some(Open::Unkeyed(tx)) => drop(engine.abort_unkeyed(tx).await),
        None => {}
    }
}

/// A request without a key on a route where keys are optional: the handler
/// still gets a transaction, committed or rolled back by the same rule.
async fn unkeyed<S, C, I, ReqB, ResB>(
    engine: &Engine<S, C>,
    config: &RouteConfig,
    inner: I,
    mut parts: http::request::Parts,
    body: Bytes,
) -> Result<Response<ResB>, I::Error>
where
    S: KeyStore,
    C: Clock + Clone,
    I: tower::Service<Request<ReqB>, Response = Response<ResB>>,
    ReqB: From<Bytes>,
    ResB: From<Bytes>,
{
    let tx = match engine.begin_unkeyed().await {
        Ok(tx) => tx,
        Err(e) => return Ok(reject(Rejection::for_store(&e))),
    };
    let slot = IdemTx::new(Open::Unkeyed(tx));
    parts.extensions.insert(slot.clone());
    let req = Request::from_parts(parts, ReqB::from(body));
    let mut res = match tokio::time::timeout(
        config.handler_timeout,
        call_in_tx(engine, &slot, inner, req),
    )
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
    let result = match slot.take().await {
        Some(Open::Unkeyed(tx)) if keep => engine.commit_unkeyed(tx).await,
        Some(Open::Unkeyed(tx)) => engine.abort_unkeyed(tx).await,
        // Only this function fills the slot, and only with an unkeyed
        // transaction; a keyed one here would be a bug, and is rolled back.
        Some(Open::Keyed(claimed)) => {
            // Nothing committed either way (see `rollback`).
            let _ = engine.abort(claimed).await;
            Ok(())
        }
        None => Ok(()),
    };
    if let Err(e) = result {
        return Ok(reject(Rejection::for_store(&e)));
    }
    Ok(RequestOutcome::Unkeyed.mark(res))
}

/// Rebuilds a stored response, marked as a replay.
pub fn replay<B: From<Bytes>>(record: &StoredRecord) -> Response<B> {
    let Some(stored) = &record.response else {
        return reject(Rejection::Internal);
    };
    let mut res = stored_response(stored);
    res.headers_mut()
        .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    res
}

/// A stored response as an HTTP response: its status, its headers (those
/// that are no valid header are left out) and its exact body bytes.
pub fn stored_response<B: From<Bytes>>(stored: &StoredResponse) -> Response<B> {
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
    res
}
