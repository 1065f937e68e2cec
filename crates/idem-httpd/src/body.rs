//! The request body guard: the body read deadline and the buffered-bytes
//! budget with its share per peer ([`idem_http::BodyBudget`]).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body::Frame;
use idem_http::{BodyBudget, OverBudget, Peer, Rejection, Reservation};
use pin_project_lite::pin_project;

/// Why a request body was cut off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// It did not arrive within the body read timeout.
    Timeout,
    /// The buffered-bytes budget, or the peer's share of it, was spent.
    Budget(OverBudget),
}

#[derive(Debug, Clone)]
pub(super) struct BodyGuard {
    pub(super) budget: BodyBudget,
    pub(super) timeout: Duration,
}

fn server_busy(why: OverBudget) -> Response {
    let detail = match why {
        OverBudget::Peer => {
            "too many request bytes are being received from this address at once; retry later"
        }
        OverBudget::Total => "too many request bytes are being received at once; retry later",
    };
    idem_http::problem::<Body>(
        StatusCode::SERVICE_UNAVAILABLE,
        "server-busy",
        "The server is busy",
        Some(detail),
        Some(1),
    )
    .into_response()
}

/// Wraps each request body in the body read deadline and the shared budget;
/// when either cut the body off, the answer is 408 or 503 whatever the
/// handler made of the unreadable body (it never got a complete one, so it
/// could not have acted on it).
///
/// Nothing is reserved before the route reads the body: a route refuses a
/// declared length over its own limit (413) without reading it, so such a
/// body costs nothing. At the first read a declared length is reserved
/// whole from the peer's share, or the body is cut (503): uploads arriving
/// together then cannot each take a part and all fail half-read. A chunked
/// body pays as it arrives, from the same share. A declared length over a
/// whole share is over every route's limit (the share is at least the
/// largest body accepted): 413 here, before routing.
///
/// An answer made before its request's body was read to the end says
/// `connection: close`: the connection cannot serve another request (the
/// rest of the body is still coming), and a client told nothing would send
/// its next request on a connection that is being closed.
pub(super) async fn guard_body(guard: &BodyGuard, req: Request, next: Next) -> Response {
    if http_body::Body::is_end_stream(req.body()) {
        // No body (a GET, `Content-Length: 0`): nothing to bound.
        return next.run(req).await;
    }
    if idem_http::declared_over(req.body(), guard.budget.per_peer()) {
        return closing(Rejection::BodyTooLarge.into_response());
    }
    // Within a share, so it fits a `usize`.
    let declared = http_body::Body::size_hint(req.body())
        .exact()
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(0);
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    let cut = Arc::new(OnceLock::new());
    let ended = Arc::new(AtomicBool::new(false));
    // Bytes read stay counted until the answer is ready: the handler holds
    // them until then, whatever happened to the body object.
    let held = Arc::new(Mutex::new(None));
    let req = req.map(|body| {
        Body::new(Guarded {
            inner: body,
            deadline: tokio::time::sleep(guard.timeout),
            budget: guard.budget.clone(),
            peer: Peer::of(peer),
            declared: Some(declared),
            prepaid: 0,
            held: held.clone(),
            cut: cut.clone(),
            ended: ended.clone(),
        })
    });
    let res = next.run(req).await;
    drop(held);
    let res = match cut.get() {
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
        Some(Cut::Budget(why)) => server_busy(*why),
    };
    if ended.load(Ordering::Acquire) {
        res
    } else {
        closing(res)
    }
}

/// `res`, saying that the connection closes after it.
fn closing(mut res: Response) -> Response {
    res.headers_mut().insert(
        axum::http::header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    res
}

pin_project! {
    struct Guarded {
        #[pin]
        inner: Body,
        #[pin]
        deadline: tokio::time::Sleep,
        budget: BodyBudget,
        peer: Peer,
        // The declared length, until the first read reserves it.
        declared: Option<usize>,
        // Bytes still covered by the reservation made for a declared length.
        prepaid: usize,
        held: Arc<Mutex<Option<Reservation>>>,
        cut: Arc<OnceLock<Cut>>,
        // Whether the body was read to its end.
        ended: Arc<AtomicBool>,
    }
}

#[derive(Debug, thiserror::Error)]
#[error("request body cut off: {0:?}")]
struct CutOff(Cut);

fn cut_off(cut: &OnceLock<Cut>, why: Cut) -> Poll<Option<Result<Frame<Bytes>, axum::BoxError>>> {
    let _ = cut.set(why);
    Poll::Ready(Some(Err(CutOff(why).into())))
}

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
        if let Some(declared) = this.declared.take() {
            // The first read: the declared length, whole, from the peer's
            // share (nothing for a chunked body).
            match this.budget.reserve(*this.peer, declared) {
                Ok(r) => {
                    *this.prepaid = r.bytes();
                    *this.held.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
                }
                Err(why) => return cut_off(this.cut, Cut::Budget(why)),
            }
        }
        let mut inner = this.inner;
        match inner.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let read = frame.data_ref().map_or(0, Bytes::len);
                let covered = read.min(*this.prepaid);
                *this.prepaid -= covered;
                let n = read - covered;
                if n > 0 {
                    let mut held = this.held.lock().unwrap_or_else(|e| e.into_inner());
                    let grown = match held.as_mut() {
                        Some(r) => r.grow(n),
                        None => this.budget.reserve(*this.peer, n).map(|r| *held = Some(r)),
                    };
                    if let Err(why) = grown {
                        return cut_off(this.cut, Cut::Budget(why));
                    }
                }
                if inner.is_end_stream() {
                    this.ended.store(true, Ordering::Release);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => {
                this.ended.store(true, Ordering::Release);
                Poll::Ready(None)
            }
            Poll::Pending => {
                if this.deadline.poll(cx).is_ready() {
                    return cut_off(this.cut, Cut::Timeout);
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
