//! The idempotency gateway: `idem serve --upstream URL` puts the whole
//! `Idempotency-Key` contract in front of an HTTP API that has none.
//!
//! For a request on a keyed route ([`config::Route`]) it admits the request
//! as the HTTP layer does (key, tenant, body limit, fingerprint), then
//! claims the key **with a lease, committed before the upstream call**
//! ([`LeasedKeyStore::claim_leased`]), forwards the request with an
//! `Idempotency-Key` derived from the installation's namespace and the key's
//! scope (tenant, operation, key) — one key per intent, tenants never
//! collide — while a heartbeat renews the lease, and stores the answer
//! (status, allow-listed headers, body bytes) with the lease's token.
//!
//! - Same key and request again: the stored answer, `Idempotent-Replayed:
//!   true`. Another request: 422. Still forwarding: the retry waits up to
//!   the route's `wait` and replays, or gets 409 + `Retry-After`.
//! - The upstream refused the connection, timed out, broke off, answered a
//!   5xx or a 4xx the route does not store, or answered more than the route
//!   stores: the key is released (nothing stored), so a retry forwards again
//!   with the same derived key.
//! - The gateway died mid-forward: the record stays pending until its lease
//!   runs out; then a retry forwards again with the same key
//!   (`on_unknown = "reforward"`) or gets 409 `outcome-unknown` and the
//!   record waits for an operator (`"reject"`, `idem keys resolve`).
//!
//! Unlisted routes pass through untouched. Hop-by-hop headers are dropped,
//! `X-Forwarded-For`, `-Proto` and `-Host` set.

pub mod config;
mod forward;

pub use config::{GatewayConfig, GatewayConfigError, HttpBase, Route, RouteSpec};

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use http_body_util::BodyExt;
use idem_core::leased::{
    LeaseToken, LeasedClaim, LeasedDecision, LeasedKeyStore, OnAbandoned, leased_decision,
};
use idem_core::steps::{Namespace, StepKey, StepName};
use idem_core::{Clock, SystemClock};
use idem_http::{Keyed, Rejection, RequestOutcome};
use tracing::Instrument;

use forward::Upstream;

/// The gateway over a store.
pub struct Gateway<S> {
    store: S,
    namespace: Namespace,
    config: GatewayConfig,
    upstream: Upstream,
    step: StepName,
    clock: Arc<dyn Clock>,
}

impl<S: LeasedKeyStore> Gateway<S> {
    /// A gateway forwarding as `config` says, deriving keys in `namespace`.
    pub fn new(store: S, namespace: Namespace, config: GatewayConfig) -> Self {
        let upstream = Upstream::new(&config.upstream, config.timeout);
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
            clock: Arc::new(SystemClock),
        }
    }

    /// The clock leases and expiries are judged by. Several gateways on one
    /// database must read one clock: on PostgreSQL, the database's.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The service every path not served by Idem itself goes to.
    pub fn into_router(self) -> axum::Router {
        let gateway = Arc::new(self);
        axum::Router::new().fallback(move |req: Request| {
            let gateway = gateway.clone();
            async move { gateway.handle(req).await }
        })
    }

    async fn handle(&self, req: Request) -> Response {
        let path = req.uri().path().to_owned();
        let route = self
            .config
            .routes
            .iter()
            .find(|r| r.matches(req.method(), &path));
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
        let outcome = res
            .extensions()
            .get::<RequestOutcome>()
            .copied()
            .unwrap_or(RequestOutcome::Internal);
        span.record("outcome", tracing::field::display(outcome));
        outcome.record(&route.config.operation, started.elapsed());
        res
    }

    /// An unlisted route: forwarded as it came (its body bounded).
    async fn pass_through(&self, req: Request) -> Response {
        let (parts, body) = req.into_parts();
        let body = match http_body_util::Limited::new(body, self.config.max_body_bytes)
            .collect()
            .await
        {
            Ok(b) => b.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                return reject(Rejection::BodyTooLarge);
            }
            Err(_) => return reject(Rejection::UnreadableBody),
        };
        let key = parts.headers.get(idem_http::IDEMPOTENCY_KEY).cloned();
        self.upstream.pass(&parts, body, key.as_ref()).await
    }

    async fn keyed(
        &self,
        route: &Route,
        parts: &axum::http::request::Parts,
        body: Bytes,
        keyed: Keyed,
    ) -> Response {
        let Keyed { scope, fingerprint } = keyed;
        let policy = &route.config.policy;
        let lease_ms = millis(route.lease);
        let token = LeaseToken::new();
        let waiting_until = Instant::now() + policy.wait;
        let mut pause = Duration::from_millis(10);
        loop {
            let now = self.clock.now_ms();
            let claimed_at = Instant::now();
            let claim = self
                .store
                .claim_leased(
                    &scope,
                    &fingerprint,
                    policy,
                    &token,
                    now + lease_ms,
                    route.on_unknown,
                    now,
                )
                .await;
            let record = match claim {
                Err(e) => return reject(Rejection::for_store(&e)),
                Ok(LeasedClaim::TakenOver) => {
                    metrics::counter!(idem_steps::metrics::LEASE_TAKEOVERS_TOTAL).increment(1);
                    return self
                        .forward_leased(route, parts, body, &scope, &token, claimed_at)
                        .await;
                }
                Ok(LeasedClaim::Claimed) => {
                    return self
                        .forward_leased(route, parts, body, &scope, &token, claimed_at)
                        .await;
                }
                Ok(LeasedClaim::Existing(record)) => record,
            };
            let retry_after = match leased_decision(record, &fingerprint, now) {
                LeasedDecision::Replay(r) => {
                    return RequestOutcome::Replayed.mark(idem_http::replay(&r));
                }
                LeasedDecision::Mismatch => return reject(Rejection::FingerprintMismatch),
                LeasedDecision::Abandoned if route.on_unknown == OnAbandoned::Stop => {
                    return outcome_unknown();
                }
                // Abandoned with takeovers allowed: another claimer got it
                // between our statements; it is in flight.
                LeasedDecision::Abandoned => Duration::from_secs(1),
                LeasedDecision::InFlight { retry_after } => retry_after,
            };
            if Instant::now() + pause > waiting_until {
                return reject(Rejection::InFlight(retry_after));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }

    /// Forwards under the lease `token` holds, renewing it while the
    /// upstream works, then stores the answer or releases the key.
    async fn forward_leased(
        &self,
        route: &Route,
        parts: &axum::http::request::Parts,
        body: Bytes,
        scope: &idem_core::Scope,
        token: &LeaseToken,
        claimed_at: Instant,
    ) -> Response {
        idem_core::failpoint::hit("gateway.before_forward");
        let key = StepKey::derive(&self.namespace, scope, &self.step);
        let key_header = match HeaderValue::from_str(key.as_str()) {
            Ok(v) => v,
            Err(_) => return reject(Rejection::Internal),
        };
        // A lease is ours for its length from before the claim was sent.
        // A claim that took longer than a heartbeat's period (a stalled
        // database, a paused process) may have been taken over or resolved
        // meanwhile: then the lease is renewed, and so proven ours, before
        // sending. Otherwise no write is needed.
        if claimed_at.elapsed() >= route.lease / 3 {
            match self.renew(route, scope, token).await {
                Ok(true) => {}
                Ok(false) => return reject(Rejection::InFlight(Duration::from_secs(1))),
                Err(e) => {
                    self.release(scope, token).await;
                    return reject(Rejection::for_store(&e));
                }
            }
        }
        let sent = self.upstream.send_bounded(
            parts,
            body,
            Some(&key_header),
            route.config.max_response_bytes,
        );
        let answer = tokio::select! {
            answer = sent => answer,
            never = self.heartbeat(route, scope, token) => match never {},
        };
        idem_core::failpoint::hit("gateway.after_forward");
        let answer = match answer {
            Ok(a) => a,
            // Sent and no whole answer: the upstream may have acted. A
            // `reject` route keeps the record; its lease runs out and
            // retries get outcome-unknown, for an operator.
            Err(e) if route.on_unknown == OnAbandoned::Stop && e.may_have_acted() => {
                return e.into_response(true);
            }
            Err(e) => {
                self.release(scope, token).await;
                return e.into_response(false);
            }
        };
        let status = answer.status.as_u16();
        if !route.config.keeps(status, None) {
            self.release(scope, token).await;
            return RequestOutcome::NotStored.mark(answer.into_response());
        }
        let completion = route
            .config
            .completion(status, &answer.headers, &answer.body);
        match self
            .store
            .complete_leased(scope, token, &completion, self.clock.now_ms())
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                fence_rejected();
                tracing::warn!(
                    "a forward's answer was not stored: its lease was taken over; the retry \
                 that took it forwarded the same key"
                );
            }
            // The record stays pending until its lease runs out; a retry then
            // forwards the same key again (or gets outcome-unknown).
            Err(e) => tracing::warn!(
                error = &e as &(dyn std::error::Error + 'static),
                "a forward's answer could not be stored"
            ),
        }
        RequestOutcome::Executed.mark(answer.into_response())
    }

    /// Renews the lease every third of it while a forward runs; never
    /// ends. A lease lost (a retry took it over) is said once, and then
    /// nothing is renewed any more.
    async fn heartbeat(
        &self,
        route: &Route,
        scope: &idem_core::Scope,
        token: &LeaseToken,
    ) -> std::convert::Infallible {
        loop {
            tokio::time::sleep(route.lease / 3).await;
            match self.renew(route, scope, token).await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(
                        "a forward lost its lease (it outlived it and a retry took over); \
                         its answer will not be stored"
                    );
                    return std::future::pending().await;
                }
                Err(e) => tracing::warn!(
                    error = &e as &(dyn std::error::Error + 'static),
                    "could not renew a forward's lease"
                ),
            }
        }
    }

    /// Moves the lease a whole `lease` from now; whether it is still ours.
    async fn renew(
        &self,
        route: &Route,
        scope: &idem_core::Scope,
        token: &LeaseToken,
    ) -> Result<bool, idem_core::StoreError> {
        let now = self.clock.now_ms();
        let renewed = self
            .store
            .renew_leased(scope, token, now + millis(route.lease), now)
            .await;
        if let Ok(false) = renewed {
            fence_rejected();
        }
        renewed
    }

    async fn release(&self, scope: &idem_core::Scope, token: &LeaseToken) {
        if let Err(e) = self.store.release_leased(scope, token).await {
            // Not released: the lease runs out and a retry takes it over.
            tracing::warn!(
                error = &e as &(dyn std::error::Error + 'static),
                "could not release a key after a failed forward"
            );
        }
    }
}

fn reject(rejection: Rejection) -> Response {
    RequestOutcome::of(&rejection).mark(rejection.into_response())
}

/// 409 `outcome-unknown`: a forward's gateway died and the route does not
/// forward again by itself.
fn outcome_unknown() -> Response {
    let res = idem_http::problem::<Body>(
        StatusCode::CONFLICT,
        "outcome-unknown",
        "The outcome of the request is unknown",
        Some(
            "an earlier request with this Idempotency-Key was forwarded and its answer was \
             lost; this route does not forward it again by itself: an operator resolves it \
             (idem keys resolve), and then retries get the resolution",
        ),
        None,
    );
    RequestOutcome::OutcomeUnknown.mark(res)
}

/// Counts a write refused to a stale lease token (another claimer took the
/// key over), with the runs' refused fenced writes.
fn fence_rejected() {
    metrics::counter!(idem_steps::metrics::FENCE_REJECTIONS_TOTAL).increment(1);
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
