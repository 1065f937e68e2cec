//! The HTTP server of `idem serve`: hyper on a Tokio listener, with the
//! limits a server reachable from a network needs.
//!
//! - **Header read timeout**: a connection has this long to deliver a
//!   complete request head, counted from its first byte (for a new
//!   connection: from the accept). A slow-loris that never finishes its
//!   headers is closed.
//! - **Idle timeout**: a keep-alive connection with no request for this long
//!   is closed, and so is one whose client takes no bytes of its answer for
//!   this long (a client that never reads would hold its slot forever).
//! - **Body read timeout**: a request body must have arrived this long after
//!   its head; past it the request is answered `408 request-timeout`.
//! - **Connection cap**: beyond it a new connection is answered `503
//!   server-busy` with `Retry-After` and closed, instead of waiting in the
//!   accept queue until the file descriptors run out.
//! - **Buffered bytes cap**: request bodies being read at once share one
//!   budget; a body that would exceed it is answered `503 server-busy` with
//!   `Retry-After`, so many slow large uploads cannot exhaust memory. A
//!   declared `Content-Length` is reserved whole before the handler runs.
//!
//! Every value is bounded ([`Limits::validate`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body::Frame;
use hyper_util::rt::{TokioIo, TokioTimer};
use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tower::ServiceExt;

/// The server's limits. [`Limits::default`] holds the documented defaults.
#[derive(Debug, Clone)]
pub struct Limits {
    /// How long a request head may take from its first byte. Default 10 s.
    pub header_read_timeout: Duration,
    /// How long a keep-alive connection may sit without a request. Default 60 s.
    pub idle_timeout: Duration,
    /// How long a request body may take after its head. Default 30 s.
    pub body_read_timeout: Duration,
    /// Connections served at once. Default 1024.
    pub max_connections: usize,
    /// Request body bytes buffered at once, over all requests. Default 64 MiB.
    pub max_buffered_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            body_read_timeout: Duration::from_secs(30),
            max_connections: 1024,
            max_buffered_bytes: 64 << 20,
        }
    }
}

/// The most connections `--max-connections` accepts.
pub const MAX_CONNECTIONS_LIMIT: usize = 100_000;
/// The most bytes `--max-buffered-bytes` accepts.
pub const MAX_BUFFERED_BYTES_LIMIT: usize = 16 << 30;

impl Limits {
    /// Checks every bound, and that one request body of `max_body_bytes` fits
    /// in the buffered-bytes budget. The error names the flag.
    pub fn validate(&self, max_body_bytes: usize) -> Result<(), String> {
        let within = |flag: &str, d: Duration, lo: Duration, hi: Duration| {
            if d < lo || d > hi {
                Err(format!(
                    "{flag} must be between {} and {}, got {}",
                    crate::duration_text(lo),
                    crate::duration_text(hi),
                    crate::duration_text(d)
                ))
            } else {
                Ok(())
            }
        };
        let second = Duration::from_secs(1);
        within(
            "--header-read-timeout",
            self.header_read_timeout,
            second,
            Duration::from_secs(60),
        )?;
        within(
            "--idle-timeout",
            self.idle_timeout,
            second,
            Duration::from_secs(3600),
        )?;
        within(
            "--body-read-timeout",
            self.body_read_timeout,
            second,
            Duration::from_secs(3600),
        )?;
        if !(1..=MAX_CONNECTIONS_LIMIT).contains(&self.max_connections) {
            return Err(format!(
                "--max-connections must be between 1 and {MAX_CONNECTIONS_LIMIT}, got {}",
                self.max_connections
            ));
        }
        if self.max_buffered_bytes < max_body_bytes
            || self.max_buffered_bytes > MAX_BUFFERED_BYTES_LIMIT
        {
            return Err(format!(
                "--max-buffered-bytes must be between the largest body accepted ({max_body_bytes}) \
                 and {MAX_BUFFERED_BYTES_LIMIT}, got {}",
                self.max_buffered_bytes
            ));
        }
        Ok(())
    }
}

/// The soft limit on open files of this process, where the system says
/// (Linux: `/proc/self/limits`).
fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// Connections need file descriptors, and so do the database pool, the
/// broker and the log: a cap above what the process may open means accepts
/// fail (and the health check with them) before the cap answers 503.
fn check_descriptors(max_connections: usize) {
    const RESERVED: u64 = 64;
    if let Some(limit) = open_files_limit()
        && (max_connections as u64).saturating_add(RESERVED) > limit
    {
        tracing::warn!(
            max_connections,
            open_files_limit = limit,
            "--max-connections is above what the open-file limit leaves for connections; \
             raise it (ulimit -n) or lower --max-connections to at most {}",
            limit.saturating_sub(RESERVED)
        );
    }
}

/// Serves `app` on `listener` until `shutdown`, then stops accepting, lets
/// requests in progress finish (at most 30 s) and returns.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) {
    check_descriptors(limits.max_connections);
    let budget = Arc::new(Semaphore::new(limits.max_buffered_bytes));
    // The log outside the body guard, so it records the 408 or 503 the
    // guard answered.
    let app = app
        .layer(axum::middleware::from_fn_with_state(
            BodyGuard {
                budget,
                capacity: limits.max_buffered_bytes,
                timeout: limits.body_read_timeout,
            },
            guard_body,
        ))
        .layer(axum::middleware::from_fn(crate::logging::request_line));
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    // Answering a refused connection takes a moment; these are bounded too.
    let refusals = Arc::new(Semaphore::new(64));
    let (stop, stopping) = watch::channel(false);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        // hyper starts this timer whenever it waits for a request head, so
        // it is the idle timeout; the header timeout proper runs per
        // connection from the head's first byte (see `Watched`).
        .header_read_timeout(limits.idle_timeout)
        .max_buf_size(64 * 1024);
    let builder = Arc::new(builder);
    let mut shutdown = std::pin::pin!(shutdown);
    let mut accept_errors = 0u32;
    loop {
        let (stream, _) = tokio::select! {
            biased;
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => { accept_errors = 0; a }
                Err(e) => {
                    // Out of file descriptors, most likely: back off instead
                    // of spinning, and keep serving what is open.
                    accept_errors += 1;
                    if accept_errors == 1 || accept_errors.is_power_of_two() {
                        tracing::warn!(error = %e, count = accept_errors, "accept failed");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            refuse(stream, &refusals);
            continue;
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(connection(
            stream,
            app.clone(),
            builder.clone(),
            (limits.header_read_timeout, limits.idle_timeout),
            stopping.clone(),
            permit,
        ));
    }
    tracing::info!("shutting down: no new connections; finishing the requests in progress");
    drop(listener);
    let _ = stop.send(true);
    // Every connection holds a permit until it is done.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    if tokio::time::timeout(Duration::from_secs(30), connections.acquire_many(all))
        .await
        .is_err()
    {
        tracing::warn!("connections still open 30 s after shutdown; closing them");
    }
}

const BUSY_BODY: &str = r#"{"type":"https://idem.dev/problems/server-busy","title":"The server is busy","status":503,"detail":"too many connections; retry later"}"#;

/// Answers a connection over the cap with a 503 and closes it, without
/// reading its request beyond what it takes to close cleanly.
fn refuse(mut stream: TcpStream, refusals: &Arc<Semaphore>) {
    let Ok(slot) = refusals.clone().try_acquire_owned() else {
        return;
    };
    tokio::spawn(async move {
        let _slot = slot;
        let answer = format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/problem+json\r\n\
             retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{BUSY_BODY}",
            BUSY_BODY.len()
        );
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            stream.write_all(answer.as_bytes()).await?;
            stream.shutdown().await?;
            // Read what the client already sent, so closing is a FIN and not
            // a reset that could destroy the answer before it is read.
            let mut sink = [0u8; 4096];
            let mut left: usize = 64 * 1024;
            while left > 0 {
                match stream.read(&mut sink).await? {
                    0 => break,
                    n => left = left.saturating_sub(n),
                }
            }
            Ok::<_, std::io::Error>(())
        })
        .await;
    });
}

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

async fn connection(
    stream: TcpStream,
    app: Router,
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
                let res = app.oneshot(req.map(Body::new)).await;
                conn.answered();
                res
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

/// Why a request body was cut off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// It did not arrive within the body read timeout.
    Timeout,
    /// The buffered-bytes budget was spent.
    Budget,
}

#[derive(Debug, Clone)]
struct BodyGuard {
    budget: Arc<Semaphore>,
    /// The whole budget: a declared length above it cannot be reserved.
    capacity: usize,
    timeout: Duration,
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
async fn guard_body(State(guard): State<BodyGuard>, req: Request, next: Next) -> Response {
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
                crate::duration_text(guard.timeout)
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
