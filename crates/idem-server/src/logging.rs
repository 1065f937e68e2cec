//! Logs: `RUST_LOG` (`info` by default), colours only on a terminal, and one
//! line per request.

use std::io::IsTerminal;
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use idem_http::RequestOutcome;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::prelude::*;

/// Installs the log subscriber: the filter from `RUST_LOG` (a level such as
/// `debug`, or `info,idem_http=debug`; default `info`), written to stderr,
/// with colours only when stderr is a terminal.
pub fn init() {
    let (filter, bad) = match std::env::var("RUST_LOG") {
        Ok(s) if !s.trim().is_empty() => match s.parse::<Targets>() {
            Ok(t) => (t, None),
            Err(e) => (default_filter(), Some((s, e))),
        },
        _ => (default_filter(), None),
    };
    let stderr = std::io::stderr();
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(stderr.is_terminal()),
        )
        .with(filter)
        .init();
    if let Some((value, e)) = bad {
        tracing::warn!(RUST_LOG = %value, error = %e, "RUST_LOG is not a valid filter; logging at info");
    }
}

/// `info`, except the NATS client's own reconnect chatter (one line per
/// attempt; the relay and the consumer say what is wrong instead).
fn default_filter() -> Targets {
    Targets::new()
        .with_default(LevelFilter::INFO)
        .with_target("async_nats", LevelFilter::WARN)
}

/// Logs each request once it is answered: method, route (the matched
/// pattern, not the raw path), status, what the idempotency layer did, and
/// the time taken.
pub async fn request_line(req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = req.method().clone();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let res = next.run(req).await;
    let outcome = res
        .extensions()
        .get::<RequestOutcome>()
        .map_or("-", |o| o.as_str());
    tracing::info!(
        target: "idem::request",
        %method,
        %route,
        status = res.status().as_u16(),
        %outcome,
        duration_ms = %format_args!("{:.1}", started.elapsed().as_secs_f64() * 1000.0),
        "request"
    );
    res
}
