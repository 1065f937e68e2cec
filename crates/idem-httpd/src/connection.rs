//! One connection: the socket wrapper that times the request head and
//! notices a client that stops reading, and the hyper connection over it.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use hyper_util::rt::TokioIo;
use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, watch};
use tower::ServiceExt;

/// A response extension: close the connection instead of sending the
/// response (the sample upstream's lost answers; nothing else sets it).
#[derive(Debug, Clone, Copy)]
pub struct CloseWithoutAnswer;

/// Per-connection state shared by the socket wrapper, the service and the
/// header watchdog.
#[derive(Debug)]
struct Conn {
    /// When the request head now being read started (its first byte, or the
    /// accept); `None` while a request is being served or the connection is
    /// idle between requests.
    head_since: Mutex<Option<Instant>>,
    /// Requests between head and response.
    in_flight: AtomicUsize,
    /// Since when the socket has refused to take more of an answer (a
    /// client that does not read); `None` while writes go through.
    write_stalled_since: Mutex<Option<Instant>>,
}

impl Conn {
    fn bytes_arrived(&self) {
        if self.in_flight.load(Ordering::Acquire) == 0 {
            let mut since = self.head_since.lock().unwrap_or_else(|e| e.into_inner());
            since.get_or_insert_with(Instant::now);
        }
    }

    fn head_complete(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        *self.head_since.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    fn answered(&self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    fn head_overdue(&self, timeout: Duration) -> bool {
        self.head_since
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|since| since.elapsed() >= timeout)
    }

    fn write_progress(&self, blocked: bool) {
        let mut since = self
            .write_stalled_since
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if blocked {
            since.get_or_insert_with(Instant::now);
        } else {
            *since = None;
        }
    }

    fn write_overdue(&self, timeout: Duration) -> bool {
        self.write_stalled_since
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|since| since.elapsed() >= timeout)
    }
}

/// What a connection serves: the router and the server's middleware
/// around it.
pub(super) trait App:
    tower::Service<
        axum::http::Request<Body>,
        Response = axum::response::Response,
        Error = std::convert::Infallible,
        Future: Send + 'static,
    > + Clone
    + Send
    + 'static
{
}

impl<S> App for S where
    S: tower::Service<
            axum::http::Request<Body>,
            Response = axum::response::Response,
            Error = std::convert::Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
        + 'static
{
}

pub(super) async fn connection(
    stream: TcpStream,
    app: impl App,
    builder: Arc<hyper::server::conn::http1::Builder>,
    (header_timeout, write_timeout): (Duration, Duration),
    mut stopping: watch::Receiver<bool>,
    _permit: OwnedSemaphorePermit,
) {
    let conn = Arc::new(Conn {
        head_since: Mutex::new(Some(Instant::now())),
        in_flight: AtomicUsize::new(0),
        write_stalled_since: Mutex::new(None),
    });
    let peer = stream.peer_addr().ok().map(axum::extract::ConnectInfo);
    let io = TokioIo::new(Watched {
        inner: stream,
        conn: conn.clone(),
    });
    let service = {
        let conn = conn.clone();
        hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            conn.head_complete();
            let (app, conn) = (app.clone(), conn.clone());
            async move {
                let mut req = req.map(Body::new);
                if let Some(peer) = peer {
                    req.extensions_mut().insert(peer);
                }
                let res = app.oneshot(req).await;
                conn.answered();
                match res {
                    // Closed without an answer, as asked (`idem upstream
                    // --lose-first-answer`).
                    Ok(r) if r.extensions().get::<CloseWithoutAnswer>().is_some() => {
                        Err(std::io::Error::other("closed without an answer, as asked"))
                    }
                    Ok(r) => Ok(r),
                    Err(never) => match never {},
                }
            }
        })
    };
    let served = builder.serve_connection(io, service);
    let mut served = std::pin::pin!(served);
    let watchdog = std::pin::pin!(async {
        let tick = (header_timeout / 4).clamp(Duration::from_millis(100), Duration::from_secs(1));
        loop {
            tokio::time::sleep(tick).await;
            if conn.head_overdue(header_timeout) {
                return "did not send a request head in time";
            }
            if conn.write_overdue(write_timeout) {
                return "did not read its answer in time";
            }
        }
    });
    let mut watchdog = watchdog;
    let mut draining = *stopping.borrow();
    if draining {
        served.as_mut().graceful_shutdown();
    }
    loop {
        tokio::select! {
            result = &mut served => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            why = &mut watchdog => {
                tracing::debug!("closing a connection that {why}");
                return;
            }
            changed = stopping.changed(), if !draining => {
                if changed.is_err() || *stopping.borrow() {
                    draining = true;
                    served.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

pin_project! {
    /// The socket, telling the connection state when bytes arrive.
    struct Watched {
        #[pin]
        inner: TcpStream,
        conn: Arc<Conn>,
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        let result = this.inner.poll_read(cx, buf);
        if buf.filled().len() > before {
            this.conn.bytes_arrived();
        }
        result
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.project();
        let result = this.inner.poll_write(cx, buf);
        this.conn.write_progress(result.is_pending());
        result
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.project();
        let result = this.inner.poll_flush(cx);
        this.conn.write_progress(result.is_pending());
        result
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.project();
        let result = this.inner.poll_write_vectored(cx, bufs);
        this.conn.write_progress(result.is_pending());
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
