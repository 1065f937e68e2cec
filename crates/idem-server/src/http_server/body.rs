//! The request body guard: the body read deadline and the buffered-bytes
//! budget.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body::Frame;
use pin_project_lite::pin_project;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Why a request body was cut off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// It did not arrive within the body read timeout.
    Timeout,
    /// The buffered-bytes budget was spent.
    Budget,
}

#[derive(Debug, Clone)]
pub(super) struct BodyGuard {
    pub(super) budget: Arc<Semaphore>,
    /// The whole budget: a declared length above it cannot be reserved.
    pub(super) capacity: usize,
    pub(super) timeout: Duration,
}

fn server_busy() -> Response {
    idem_http::problem::<Body>(
        StatusCode::SERVICE_UNAVAILABLE,
        "server-busy",
        "The server is busy",
        Some("too many request bytes are being received at once; retry later"),
        Some(1),
    )
    .into_response()
}

/// Wraps each request body in the body read deadline and the shared budget;
/// when either cut the body off, the answer is 408 or 503 whatever the
/// handler made of the unreadable body (it never got a complete one, so it
/// could not have acted on it).
///
/// A body with a declared length reserves all of it before the handler
/// runs, or is answered 503 at once: uploads arriving together then cannot
/// each take a share and all fail half-read. A chunked body pays as it
/// arrives.
pub(super) async fn guard_body(guard: &BodyGuard, req: Request, next: Next) -> Response {
    if http_body::Body::is_end_stream(req.body()) {
        // No body (a GET, `Content-Length: 0`): nothing to bound.
        return next.run(req).await;
    }
    let declared = http_body::Body::size_hint(req.body())
        .exact()
        .and_then(|n| usize::try_from(n).ok())
        // Longer than the whole budget: the route's own limit answers 413
        // before reading it; the budget then only counts what is read.
        .filter(|&n| n <= guard.capacity);
    let mut prepaid = 0;
    let mut reserved = None;
    if let Some(n) = declared {
        let permit = u32::try_from(n)
            .ok()
            .and_then(|p| guard.budget.clone().try_acquire_many_owned(p).ok());
        let Some(permit) = permit else {
            return server_busy();
        };
        prepaid = n;
        reserved = Some(permit);
    }
    let cut = Arc::new(OnceLock::new());
    // Bytes read stay counted until the answer is ready: the handler holds
    // them until then, whatever happened to the body object.
    let held = Arc::new(Mutex::new(reserved));
    let req = req.map(|body| {
        Body::new(Guarded {
            inner: body,
            deadline: tokio::time::sleep(guard.timeout),
            budget: guard.budget.clone(),
            prepaid,
            held: held.clone(),
            cut: cut.clone(),
        })
    });
    let res = next.run(req).await;
    drop(held);
    match cut.get() {
        None => res,
        Some(Cut::Timeout) => idem_http::problem::<Body>(
            StatusCode::REQUEST_TIMEOUT,
            "request-timeout",
            "The request body was not received in time",
            Some(&format!(
                "the body must arrive within {} of the request head",
                idem_core::duration_text(guard.timeout)
            )),
            None,
        )
        .into_response(),
        Some(Cut::Budget) => server_busy(),
    }
}

pin_project! {
    struct Guarded {
        #[pin]
        inner: Body,
        #[pin]
        deadline: tokio::time::Sleep,
        budget: Arc<Semaphore>,
        // Bytes still covered by the reservation made for a declared length.
        prepaid: usize,
        held: Arc<Mutex<Option<OwnedSemaphorePermit>>>,
        cut: Arc<OnceLock<Cut>>,
    }
}

#[derive(Debug, thiserror::Error)]
#[error("request body cut off: {0:?}")]
struct CutOff(Cut);

impl http_body::Body for Guarded {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.project();
        if let Some(cut) = this.cut.get() {
            return Poll::Ready(Some(Err(CutOff(*cut).into())));
        }
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let read = frame.data_ref().map_or(0, Bytes::len);
                let covered = read.min(*this.prepaid);
                *this.prepaid -= covered;
                let n = read - covered;
                if n > 0 {
                    let permit = u32::try_from(n)
                        .ok()
                        .and_then(|n| this.budget.clone().try_acquire_many_owned(n).ok());
                    let Some(permit) = permit else {
                        let _ = this.cut.set(Cut::Budget);
                        return Poll::Ready(Some(Err(CutOff(Cut::Budget).into())));
                    };
                    let mut held = this.held.lock().unwrap_or_else(|e| e.into_inner());
                    match held.as_mut() {
                        Some(p) => p.merge(permit),
                        None => *held = Some(permit),
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                if this.deadline.poll(cx).is_ready() {
                    let _ = this.cut.set(Cut::Timeout);
                    return Poll::Ready(Some(Err(CutOff(Cut::Timeout).into())));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
