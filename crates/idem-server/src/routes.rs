//! What every `idem serve` router gets around its routes: `/healthz`,
//! problem+json answers for unknown routes and methods and for panics, and a
//! log line per request.

use axum::Router;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::get;

use crate::admin::{self, AdminToken};

/// `api` with `/healthz`, `/admin/…` behind the admin guard, 404 and 405 as
/// problem+json, panics as a 500 problem, and the request log.
pub fn service(api: Router, admin_token: Option<AdminToken>) -> Router {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .merge(api)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed);
    admin::guarded(app, admin_token)
        .layer(axum::middleware::from_fn(crate::logging::request_line))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            |_: Box<dyn std::any::Any + Send>| panicked(),
        ))
}

async fn not_found() -> Response {
    idem_http::problem(
        StatusCode::NOT_FOUND,
        "not-found",
        "No such resource",
        None,
        None,
    )
}

async fn method_not_allowed() -> Response {
    idem_http::problem(
        StatusCode::METHOD_NOT_ALLOWED,
        "method-not-allowed",
        "This method is not allowed here",
        None,
        None,
    )
}

fn panicked() -> Response {
    tracing::error!("a handler panicked");
    idem_http::problem(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "Internal error",
        None,
        None,
    )
}
