//! [`bind`] and [`serve`]: the accept loop, the connection cap, the
//! request log's line and the body guard around every request, and the
//! graceful stop.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::TokioTimer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};

use crate::body::{BodyGuard, guard_body};
use crate::connection::connection;
use crate::limits::{Limits, check_descriptors};

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
    let line = crate::request_log::RequestLine::begin(&mut req);
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
