//! What a process manager and a load balancer ask a process: `/healthz`
//! (liveness: the process answers; always `ok`), `/readyz` (readiness: the
//! database answered a query within two seconds and, for a relay or a
//! consumer, JetStream answered about the events stream within a second
//! and a majority of its copies is live — an API reports NATS without
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
use crate::shutdown::stopped;
use idem_httpd::{self as http_server, Limits};

/// The broker once the process has connected and its streams (NATS) or
/// exchange (RabbitMQ) are ready (`None` until then).
pub type Broker = watch::Receiver<Option<crate::messaging::Broker>>;

/// How long `/readyz` waits for the database.
pub const DATABASE_WAIT: Duration = Duration::from_secs(2);

/// How long `/readyz` waits for JetStream's answer about the events
/// stream: its leader answers in milliseconds; a node left without the
/// leader answers nothing until an election it cannot win.
const JETSTREAM_WAIT: Duration = Duration::from_secs(1);

/// How long an answer of `/readyz` is reused: probes (which need no token)
/// cost the database and JetStream one request a second at most, however
/// many arrive. NATS's answer is reused no longer than it holds
/// ([`idem_nats::StreamQuorum::holds_for`]), and not at all once the
/// connection is lost.
const REUSE: Duration = Duration::from_secs(1);

/// Readiness over `store` and, when the process uses NATS, `broker`.
struct Ready<B> {
    store: B,
    broker: Option<Broker>,
    /// Whether the process is not ready without NATS (a relay, a consumer)
    /// or only reports it (an API: its events wait in the outbox).
    nats_gates: bool,
    /// The broker's name (`nats`, `rabbitmq`), when the process uses one.
    broker_name: Option<&'static str>,
    /// The last answers (one check at a time; the others wait for it).
    last: tokio::sync::Mutex<Last>,
}

/// One dependency's state, and until when it is reused.
#[derive(Clone, Copy)]
struct Answer {
    state: &'static str,
    until: tokio::time::Instant,
}

/// The answers `/readyz` gave last.
#[derive(Default)]
struct Last {
    database: Option<Answer>,
    nats: Option<Answer>,
}

/// `GET /readyz` over `store` and, when the process uses NATS, `broker`:
/// with `nats_gates` a process is not ready while JetStream does not
/// answer (a relay, a consumer); without, the NATS state is only reported
/// (an API serves without it).
pub fn router<B: Backend>(
    store: B,
    broker: Option<(Broker, &'static str)>,
    nats_gates: bool,
) -> Router {
    let (broker, broker_name) = broker.map_or((None, None), |(b, n)| (Some(b), Some(n)));
    Router::new()
        .route("/readyz", get(readyz::<B>))
        .with_state(Arc::new(Ready {
            store,
            broker,
            broker_name,
            nats_gates,
            last: tokio::sync::Mutex::new(Last::default()),
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

/// The link to the broker as it is now, read without asking it: the
/// broker to ask, or the state that answers for it.
fn link(broker: Option<&Broker>) -> Result<crate::messaging::Broker, &'static str> {
    match broker {
        None => Err("not used"),
        Some(b) => match &*b.borrow() {
            None => Err("connecting"),
            Some(b) if b.is_disconnected() => Err("disconnected"),
            Some(b) => Ok(b.clone()),
        },
    }
}

/// What the broker says about the demo's events, and how long that holds.
async fn broker_state(broker: &crate::messaging::Broker) -> (&'static str, Duration) {
    // Only the stream's name matters here, not its replicas.
    let routes = crate::messaging::routes(1);
    let (state, holds_for) = broker.readiness(&routes, JETSTREAM_WAIT).await;
    (state, holds_for.min(REUSE))
}

async fn readyz<B: Backend>(State(ready): State<Arc<Ready<B>>>) -> Response {
    let (database, nats) = {
        let mut last = ready.last.lock().await;
        let now = tokio::time::Instant::now();
        let link = link(ready.broker.as_ref());
        let reused = |a: Option<Answer>| a.filter(|a| a.until > now);
        let database = reused(last.database);
        // An answer given before the connection broke says nothing now.
        let nats = reused(last.nats).filter(|_| link.is_ok());
        let (database, nats) = tokio::join!(
            async {
                match database {
                    Some(a) => a,
                    None => Answer {
                        state: database_state(
                            tokio::time::timeout(DATABASE_WAIT, ready.store.ping()).await,
                        ),
                        until: tokio::time::Instant::now() + REUSE,
                    },
                }
            },
            async {
                match (nats, link) {
                    (Some(a), _) => a,
                    // Read afresh at every probe: it costs nothing.
                    (None, Err(state)) => Answer { state, until: now },
                    (None, Ok(b)) => {
                        let (state, holds_for) = broker_state(&b).await;
                        // "ok" holds from when it was asked, no longer
                        // than the stream's leader says; anything else
                        // from when it was known.
                        let until = match state {
                            "ok" => now + holds_for.min(REUSE),
                            _ => tokio::time::Instant::now() + REUSE,
                        };
                        Answer { state, until }
                    }
                }
            }
        );
        *last = Last {
            database: Some(database),
            nats: Some(nats),
        };
        (database.state, nats.state)
    };
    let nats_ok = !ready.nats_gates || matches!(nats, "ok" | "not used");
    // The broker by name, and its state under its name ("none" without).
    let name = ready.broker_name.unwrap_or("none");
    if database == "ok" && nats_ok {
        let mut body = serde_json::json!({"status": "ready", "database": database, "broker": name});
        if let Some(name) = ready.broker_name {
            body[name] = nats.into();
        }
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
    fields.insert("broker".into(), name.into());
    if ready.broker_name.is_some() {
        fields.insert(name.into(), nats.into());
    }
    let detail = format!("database: {database}; {name}: {nats}");
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
        broker: (Broker, &'static str),
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
