//! The idempotency gateway: the whole `Idempotency-Key` contract in front
//! of an HTTP API that has none. `idem serve --upstream URL` serves it; a
//! Rust service mounts [`Gateway::into_router`] itself.
//!
//! For a request on a keyed route ([`config::Route`]) it admits the request
//! as the HTTP layer does (key, tenant, body limit, fingerprint), then
//! claims the key **with a lease, committed before the upstream call**
//! ([`LeasedKeyStore::claim_leased`]), forwards the request with a key
//! derived from the installation's namespace and the key's scope (tenant,
//! operation, key) — one key per intent, tenants never collide — while a
//! heartbeat renews the lease, and stores the answer (status, allow-listed
//! headers, body bytes) with the lease's token.
//!
//! - Same key and request again: the stored answer, `Idempotent-Replayed:
//!   true`. Another request: 422. Still forwarding: the retry waits up to
//!   the route's `wait` and replays, or gets 409 + `Retry-After`.
//! - **Not processed** — the connection was refused before anything was
//!   sent, or the upstream answered a status the route says means it did
//!   not act (429 by default, a 4xx the route does not store): the key is
//!   released and a retry forwards again.
//! - **In progress upstream** — a status the route names as transient, or
//!   a 409 to a key forwarded again on a `reforward` route: `409
//!   request-in-flight` with `Retry-After`, nothing stored.
//! - **Unknown outcome** — sent, then a timeout, a broken exchange, an
//!   answer over the route's limit, or a 5xx: the upstream may have acted,
//!   so the key is *kept* and the route's [`OnUnknown`] decides: `reject`
//!   (the default) holds it for an operator (`409 outcome-unknown`);
//!   `verify` asks the upstream's lookup ([`verify`]) and stores what it
//!   finds, forwarding again only once it is known the first did not land;
//!   `reforward`, for an upstream that deduplicates by key, forwards again
//!   with the same derived key. A gateway that died mid-forward leaves the
//!   same state once its lease runs out.
//!
//! What is stored is readable by every client: keyed forwards ask for
//! unencoded answers and decode gzip and deflate. The bytes of answers held
//! for clients are bounded ([`GatewayConfig::max_held_bytes`]); unlisted
//! routes pass through untouched and streamed. Hop-by-hop headers are
//! dropped, `X-Forwarded-For`, `-Proto` and `-Host` set. A path upstreams
//! may read otherwise than the routes do — a `..` above the root, a control
//! character raw or escaped (`/v1/payments%00`), a bad escape — is refused
//! with `400 invalid-path`, keyed route or not, and nothing is sent.

mod budget;
pub mod config;
mod forward;
mod keyed;
pub mod metrics;
mod path;
mod problems;
mod settle;
pub mod verify;

pub use config::{GatewayConfig, GatewayConfigError, HttpBase, Route, RouteSpec};
pub use idem_core::leased::OnUnknown;

use std::sync::Arc;
use std::time::Instant;

use axum::extract::Request;
use axum::response::Response;
use idem_core::leased::LeasedKeyStore;
use idem_core::steps::{Namespace, StepName};
use idem_core::{Clock, SharedClock};
use tracing::Instrument;

use budget::Budget;
use forward::Upstream;
use problems::reject;

/// The gateway over a store.
pub struct Gateway<S> {
    store: S,
    namespace: Namespace,
    config: GatewayConfig,
    upstream: Upstream,
    step: StepName,
    clock: SharedClock,
    budget: Budget,
}

impl<S: LeasedKeyStore> Gateway<S> {
    /// A gateway forwarding as `config` says, deriving keys in `namespace`.
    pub fn new(store: S, namespace: Namespace, config: GatewayConfig) -> Self {
        let upstream = Upstream::new(&config.upstream, config.timeout);
        let budget = Budget::new(config.max_held_bytes);
        let clock = store.clock();
        let Ok(step) = StepName::new("forward") else {
            unreachable!("\"forward\" is a valid step name");
        };
        Self {
            store,
            namespace,
            config,
            upstream,
            // The derived key is `idem:forward:<32 hex digits>`.
            step,
            clock,
            budget,
        }
    }

    /// The clock leases and expiries are judged by, instead of the
    /// store's ([`idem_core::KeyStore::clock`]: on PostgreSQL the
    /// database's, so several gateways on one database read one clock).
    pub fn with_clock(mut self, clock: impl Clock) -> Self {
        self.clock = SharedClock::new(clock);
        self
    }

    /// The service every path not served by Idem itself goes to.
    pub fn into_router(self) -> axum::Router {
        let gateway = Arc::new(self);
        axum::Router::new().fallback(move |req: Request| {
            let gateway = gateway.clone();
            // In a task of its own: a client that hangs up (a timeout, a
            // closed tab) drops this future, but not the forward it
            // started. The forward ends and its answer is stored, so the
            // client's retry gets it instead of an outcome made unknown by
            // the hang-up alone; the answer nobody reads is dropped, and
            // the bytes it held return to the budget.
            let work = tokio::spawn(async move { gateway.handle(req).await });
            async move {
                work.await
                    .unwrap_or_else(|_| reject(idem_http::Rejection::Internal))
            }
        })
    }

    async fn handle(&self, req: Request) -> Response {
        let path = req.uri().path();
        // Refused before any route is matched, keyed or not: never passed
        // through.
        if let Some(why) = path::unreadable(path) {
            return problems::invalid_path(why);
        }
        if path::climbs_above_root(path) {
            return problems::invalid_path("a .. segment of the path climbs above its root");
        }
        let route = self
            .config
            .routes
            .iter()
            .find(|r| r.matches(req.method(), path));
        let Some(route) = route else {
            return self.pass_through(req).await;
        };
        // The layer's span and counters, for the gateway's routes.
        let started = Instant::now();
        let span = idem_http::request_span(&route.config);
        let res = async {
            let admitted = match idem_http::admit(&route.config, req).await {
                Ok(a) => a,
                Err(rejection) => return reject(rejection),
            };
            idem_http::record_admitted(&span, &admitted);
            let (parts, body) = (admitted.parts, admitted.body);
            match admitted.keyed {
                Some(keyed) => self.keyed(route, &parts, body, keyed).await,
                None => self.upstream.pass(&parts, body, None).await,
            }
        }
        .instrument(span.clone())
        .await;
        idem_http::record_answered(&span, &route.config.operation, &res, started.elapsed());
        res
    }

    /// An unlisted route: forwarded as it came (its body bounded).
    async fn pass_through(&self, req: Request) -> Response {
        let (parts, body) = req.into_parts();
        let body = match idem_http::read_body(body, self.config.max_body_bytes).await {
            Ok(b) => b,
            Err(rejection) => return reject(rejection),
        };
        let key = parts.headers.get(idem_http::IDEMPOTENCY_KEY).cloned();
        self.upstream.pass(&parts, body, key.as_ref()).await
    }
}
