//! What a process manager and a load balancer ask a process: `/healthz`
//! (liveness: the process answers; always `ok`), `/readyz` (readiness: the
//! database answered a query within two seconds and, for a relay or a
//! consumer, JetStream answered a request — an API reports NATS without
//! depending on it) — and, for `idem relay` and `idem consume`, which serve
//! no API, a side listener (`--metrics-listen`) with both and `/metrics`.
//!
//! A process that is live but not ready keeps its work: the relay's events
//! wait in the outbox, the consumer's deliveries in the stream, a request
//! that reaches an API whose database is gone gets a 503. A load balancer
//! takes it out of rotation; a process manager restarts only a process that
//! stops answering `/healthz`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::sync::watch;

use crate::backend::Backend;
use crate::http_server::{self, Limits};
use crate::shutdown::stopped;

/// The broker's context once the process has connected and its streams
/// are ready (`None` until then).
pub type Broker = watch::Receiver<Option<idem_nats::Context>>;

/// How long `/readyz` waits for the database and for JetStream.
pub const DATABASE_WAIT: Duration = Duration::from_secs(2);

/// How long an answer of `/readyz` is reused: probes (which need no token)
/// cost the database one query a second at most, however many arrive.
const REUSE: Duration = Duration::from_secs(1);

/// Readiness over `store` and, when the process uses NATS, `broker`.
struct Ready<B> {
    store: B,
    broker: Option<Broker>,
    /// Whether the process is not ready without NATS (a relay, a consumer)
    /// or only reports it (an API: its events wait in the outbox).
    nats_gates: bool,
    last: tokio::sync::Mutex<Option<(tokio::time::Instant, &'static str, &'static str)>>,
}

/// `GET /readyz` over `store` and, when the process uses NATS, `broker`:
/// with `nats_gates` a process is not ready while JetStream does not
/// answer (a relay, a consumer); without, the NATS state is only reported
/// (an API serves without it).
pub fn router<B: Backend>(store: B, broker: Option<Broker>, nats_gates: bool) -> Router {
    Router::new()
        .route("/readyz", get(readyz::<B>))
        .with_state(Arc::new(Ready {
            store,
            broker,
            nats_gates,
            last: tokio::sync::Mutex::new(None),
        }))
}

/// What the database says.
fn database_state(
    result: Result<Result<(), idem_core::StoreError>, tokio::time::error::Elapsed>,
) -> &'static str {
    match result {
        Ok(Ok(())) => "ok",
        Ok(Err(e)) => {
            // The cause goes to the log, not to whoever asks.
            tracing::warn!(error = %idem_core::ErrorChain(&e), "readiness: the database refused");
            "unavailable"
        }
        Err(_) => "no answer",
    }
}

/// What NATS says: connected, JetStream answers a request about the events
/// stream, and the stream has a quorum. A cluster that lost two of three
/// nodes keeps the connection up, and the node left may still answer
/// about the stream (as its stalled leader): its answer says how many of
/// the stream's copies are current.
async fn nats_state(broker: Option<&Broker>) -> &'static str {
    let js = match broker {
        None => return "not used",
        Some(b) => match &*b.borrow() {
            None => return "connecting",
            Some(js) if idem_nats::is_connected(js) => js.clone(),
            Some(_) => return "disconnected",
        },
    };
    let quorum = idem_nats::stream_has_quorum(&js, crate::messaging::STREAM);
    match tokio::time::timeout(DATABASE_WAIT, quorum).await {
        Ok(Ok(true)) => "ok",
        Ok(Ok(false)) => "no quorum",
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "readiness: JetStream refused");
            "unavailable"
        }
        Err(_) => "no answer",
    }
}

async fn readyz<B: Backend>(State(ready): State<Arc<Ready<B>>>) -> Response {
    let (database, nats) = {
        // One check at a time; the others wait for it and take its answer.
        let mut last = ready.last.lock().await;
        match *last {
            Some((at, database, nats)) if at.elapsed() < REUSE => (database, nats),
            _ => {
                let (database, nats) = tokio::join!(
                    tokio::time::timeout(DATABASE_WAIT, ready.store.ping()),
                    nats_state(ready.broker.as_ref())
                );
                let database = database_state(database);
                *last = Some((tokio::time::Instant::now(), database, nats));
                (database, nats)
            }
        }
    };
    let nats_ok = !ready.nats_gates || matches!(nats, "ok" | "not used");
    if database == "ok" && nats_ok {
        let body = serde_json::json!({"status": "ready", "database": database, "nats": nats});
        return (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body.to_string(),
        )
            .into_response();
    }
    let mut fields = serde_json::Map::new();
    fields.insert("database".into(), database.into());
    fields.insert("nats".into(), nats.into());
    let detail = format!("database: {database}; nats: {nats}");
    let mut res = idem_http::problem_with(
        StatusCode::SERVICE_UNAVAILABLE,
        "not-ready",
        "Not ready",
        Some(&detail),
        fields,
    );
    res.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    res
}

/// `--metrics-listen` and who may scrape there, validated.
#[derive(Clone)]
pub struct SideListener {
    /// Where.
    pub listen: SocketAddr,
    /// `/metrics` without the token (`--public-metrics`), or behind it.
    pub access: crate::metrics::Access,
}

impl SideListener {
    /// From `idem relay`'s or `idem consume`'s flags: none without
    /// `--metrics-listen`; a non-loopback address needs the admin token or
    /// `--public-metrics` (the same rule as `idem serve`).
    pub fn from_flags(
        listen: Option<SocketAddr>,
        admin_token: Option<&str>,
        public_metrics: bool,
    ) -> anyhow::Result<Option<Self>> {
        let Some(listen) = listen else {
            return Ok(None);
        };
        if admin_token.is_none() && !public_metrics && !listen.ip().is_loopback() {
            anyhow::bail!(
                "--metrics-listen {listen} is not a loopback address: set --admin-token (or \
                 IDEM_ADMIN_TOKEN; generate one with: {}) so /metrics there is not open to \
                 the network, or --public-metrics to open it on purpose",
                crate::admin::token::GENERATE
            );
        }
        let token = admin_token
            .map(crate::admin::AdminToken::new)
            .transpose()
            .map_err(|e| anyhow::anyhow!("--metrics-listen: --admin-token: {e}"))?;
        let access = if public_metrics {
            crate::metrics::Access::Public
        } else {
            crate::metrics::Access::Token(crate::admin::Auth::new(
                token,
                crate::admin::AllowedHosts::default(),
                crate::admin::limit::Limits::default(),
            ))
        };
        Ok(Some(Self { listen, access }))
    }

    /// Binds now (a taken address fails the command at once), then serves
    /// `/healthz`, `/readyz` and `/metrics` until `shutdown`.
    pub async fn start<B: Backend>(
        self,
        store: B,
        broker: Broker,
        shutdown: watch::Receiver<bool>,
    ) -> anyhow::Result<()> {
        let (listener, bound) = http_server::bind(self.listen).await?;
        let metrics = crate::metrics::router(store.clone(), self.access, crate::metrics::install());
        let app = Router::new()
            .route("/healthz", get(|| async { "ok" }))
            .merge(router(store, Some(broker), true))
            .merge(metrics)
            .fallback(crate::routes::not_found)
            .layer(axum::middleware::from_fn(only_get));
        tracing::info!(listen = %bound, "serving /healthz, /readyz and /metrics");
        let limits = Limits {
            max_connections: 64,
            max_buffered_bytes: 1 << 20,
            max_buffered_bytes_per_peer: 1 << 17,
            ..Limits::default()
        };
        tokio::spawn(async move {
            http_server::serve(listener, app, limits, stopped(shutdown)).await;
        });
        Ok(())
    }
}

/// The side listener reads nothing: a request with a body or another
/// method than GET is refused before a route sees it.
async fn only_get(req: Request, next: axum::middleware::Next) -> Response {
    if req.method() != axum::http::Method::GET && req.method() != axum::http::Method::HEAD {
        return crate::routes::method_not_allowed().await;
    }
    next.run(req).await
}
