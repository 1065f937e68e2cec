//! The request log: one line per request (`idem::request`, INFO), begun
//! as it arrives and written once it is answered.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::response::Response;
use idem_http::RequestOutcome;

/// Where the route a request matched is noted for its [`RequestLine`],
/// written outside the router: a request extension [`NoteRoute`] fills.
#[derive(Clone, Default)]
struct RouteSlot(Arc<OnceLock<MatchedPath>>);

/// The request log's line for one request, begun as it arrives and
/// written once it is answered: method, route (the matched pattern, not the
/// raw path), status, what the idempotency layer did, and the time taken.
pub struct RequestLine {
    started: Instant,
    method: axum::http::Method,
    route: RouteSlot,
}

impl RequestLine {
    /// Begins the line of `req`; `None` (and nothing done) when
    /// `idem::request` lines are filtered out (`RUST_LOG=warn`).
    pub fn begin(req: &mut Request) -> Option<Self> {
        if !tracing::enabled!(target: "idem::request", tracing::Level::INFO) {
            return None;
        }
        let route = RouteSlot::default();
        req.extensions_mut().insert(route.clone());
        Some(Self {
            started: Instant::now(),
            method: req.method().clone(),
            route,
        })
    }

    /// Writes the line for the answer `res`.
    pub fn end(self, res: &Response) {
        let route = self.route.0.get().map_or("unmatched", MatchedPath::as_str);
        let outcome = res
            .extensions()
            .get::<RequestOutcome>()
            .map_or("-", |o| o.as_str());
        tracing::info!(
            target: "idem::request",
            method = %self.method,
            %route,
            status = res.status().as_u16(),
            %outcome,
            duration_ms = %format_args!("{:.1}", self.started.elapsed().as_secs_f64() * 1000.0),
            "request"
        );
    }
}

/// A layer for each route of a router ([`axum::Router::layer`]): notes the
/// route a request matched for its [`RequestLine`] outside the router. It
/// wraps nothing else.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoteRoute;

impl<S> tower::Layer<S> for NoteRoute {
    type Service = Noted<S>;
    fn layer(&self, inner: S) -> Noted<S> {
        Noted(inner)
    }
}

/// The service of [`NoteRoute`].
#[derive(Debug, Clone)]
pub struct Noted<S>(S);

impl<S, B> tower::Service<axum::http::Request<B>> for Noted<S>
where
    S: tower::Service<axum::http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: axum::http::Request<B>) -> S::Future {
        let ext = req.extensions();
        if let (Some(slot), Some(route)) = (ext.get::<RouteSlot>(), ext.get::<MatchedPath>()) {
            let _ = slot.0.set(route.clone());
        }
        self.0.call(req)
    }
}
