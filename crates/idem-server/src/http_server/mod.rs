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
//!   budget, and one peer (an IPv4 address, an IPv6 /64) holds at most its
//!   share of it; a body that would exceed either is answered `503
//!   server-busy` with `Retry-After`, so many slow large uploads cannot
//!   exhaust memory and one address cannot shut out the others. A declared
//!   `Content-Length` is checked against the route's limit before anything
//!   is reserved (`413`), then reserved whole when the route first reads
//!   the body; a chunked body is counted as it arrives.
//!
//! Every value is bounded ([`Limits::validate`]).

mod body;
mod connection;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::TokioTimer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};

use body::{BodyGuard, guard_body};
use connection::connection;

/// A response extension: close the connection instead of sending the
/// response (the sample upstream's lost answers; nothing else sets it).
#[derive(Debug, Clone, Copy)]
pub struct CloseWithoutAnswer;

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
    /// Of those, the most one peer holds at once. Default 8 MiB (an eighth).
    pub max_buffered_bytes_per_peer: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            body_read_timeout: Duration::from_secs(30),
            max_connections: 1024,
            max_buffered_bytes: 64 << 20,
            max_buffered_bytes_per_peer: 8 << 20,
        }
    }
}

/// The most connections `--max-connections` accepts.
pub const MAX_CONNECTIONS_LIMIT: usize = 100_000;
/// The most bytes `--max-buffered-bytes` accepts.
pub const MAX_BUFFERED_BYTES_LIMIT: usize = 16 << 30;

impl Limits {
    /// Checks every bound, and that one request body of `max_body_bytes`
    /// (the largest any route accepts) fits in one peer's share of the
    /// buffered-bytes budget. The error names the flag.
    pub fn validate(&self, max_body_bytes: usize) -> Result<(), String> {
        use crate::flags::within;
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
        if self.max_buffered_bytes_per_peer < max_body_bytes
            || self.max_buffered_bytes_per_peer > self.max_buffered_bytes
        {
            return Err(format!(
                "--max-buffered-bytes-per-peer must be between the largest body accepted \
                 ({max_body_bytes}) and --max-buffered-bytes ({}), got {}",
                self.max_buffered_bytes, self.max_buffered_bytes_per_peer
            ));
        }
        Ok(())
    }

    /// The default share of one peer: an eighth of `max_buffered_bytes`, but
    /// at least `max_body_bytes` (one body of the largest size a route
    /// accepts) and at most the whole.
    pub fn default_share(max_buffered_bytes: usize, max_body_bytes: usize) -> usize {
        (max_buffered_bytes / 8)
            .max(max_body_bytes)
            .min(max_buffered_bytes)
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

/// Listens on `addr`; the listener and the address it is bound to (the
/// port a `:0` drew), or an error naming the address.
pub async fn bind(
    addr: std::net::SocketAddr,
) -> anyhow::Result<(TcpListener, std::net::SocketAddr)> {
    use anyhow::Context;
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("failed to listen on {addr}"))?;
    let bound = listener
        .local_addr()
        .context("failed to read the bound address")?;
    Ok((listener, bound))
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
    // Validated by `Limits::validate` where a user sets them; a share over
    // the whole is the whole.
    let total = limits.max_buffered_bytes.max(1);
    let share = limits.max_buffered_bytes_per_peer.clamp(1, total);
    let budget = match idem_http::BodyBudget::new(total, share) {
        Ok(b) => b,
        Err(e) => {
            tracing::error!(error = %e, "not serving: the buffered-bytes budget is invalid");
            return;
        }
    };
    // The log outside the body guard, so it records the 408 or 503 the
    // guard answered.
    // Around the router, not on each of its routes (see `routes::service`).
    let guard = BodyGuard {
        budget,
        timeout: limits.body_read_timeout,
    };
    let app = tower::Layer::layer(&axum::middleware::from_fn_with_state(guard, edge), app);
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

/// What every request goes through first: its line in the request log,
/// written outside the body guard so it records the 408 or 503 the guard
/// answered; then the guard.
async fn edge(
    axum::extract::State(guard): axum::extract::State<BodyGuard>,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let line = crate::logging::RequestLine::begin(&mut req);
    let res = guard_body(&guard, req, next).await;
    if let Some(line) = line {
        line.end(&res);
    }
    res
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
