//! What every `idem serve` router gets around its routes: `/healthz`, the
//! admin guard, and problem+json answers for unknown routes and methods, for
//! axum's own rejections and for panics. (The request log and the body limits
//! are the server's: `http_server`.)

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http_body_util::BodyExt;
use idem_http::RequestOutcome;

use crate::admin::v1::outcomes::OutcomeRing;
use crate::admin::{self, Auth};

/// `api` with `/healthz`, `/admin/…` and `/console/…` behind the admin
/// guard of `auth` (shared with a guarded `/metrics`), and every error
/// as problem+json (404, 405, axum's rejections, panics). Paths `api` does
/// not serve go to `fallback` (the gateway) if given, else 404.
///
/// The middleware runs once around the whole router (the router is the
/// returned one's fallback), not on each route: [`Router::layer`] wraps
/// every route apart, and each wrapper clones the ones inside it per
/// request. Each route only notes itself for the request log
/// ([`idem_httpd::NoteRoute`]).
pub fn service(api: Router, auth: Arc<Auth>, fallback: Option<Router>) -> Router {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .merge(api);
    let app = match fallback {
        Some(gateway) => app.fallback_service(gateway),
        None => app
            .fallback(not_found)
            .method_not_allowed_fallback(method_not_allowed),
    };
    let app = admin::with_console(app, auth.clone()).layer(idem_httpd::NoteRoute);
    let around = tower::ServiceBuilder::new()
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            |_: Box<dyn std::any::Any + Send>| panicked(),
        ))
        .layer(axum::middleware::from_fn_with_state(
            std::sync::Arc::new(OutcomeRing::default()),
            answers,
        ))
        .layer(axum::middleware::from_fn_with_state(
            auth,
            admin::auth::guard,
        ))
        .service(app);
    Router::new().fallback_service(around)
}

/// 404 problem+json.
pub(crate) async fn not_found() -> Response {
    idem_http::problem(
        StatusCode::NOT_FOUND,
        "not-found",
        "No such resource",
        None,
        None,
    )
}

/// 405 problem+json.
pub(crate) async fn method_not_allowed() -> Response {
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

/// The longest plain-text error body rewritten as a problem's detail.
const PLAIN_ERROR_MAX: usize = 4096;

/// What each answer goes through once the router made it: the admin's
/// outcome ring counts what the idempotency layer did (what
/// [`admin::v1::outcomes::track`] does; the ring rides in the request for
/// the admin routes that read it), and the answer becomes problem+json if
/// it is an error that is not ([`problem_errors`]). One middleware for both:
/// each costs its own boxed futures per request.
async fn answers(State(ring): State<Arc<OutcomeRing>>, mut req: Request, next: Next) -> Response {
    req.extensions_mut().insert(ring.clone());
    let res = next.run(req).await;
    if let Some(outcome) = res.extensions().get::<RequestOutcome>() {
        ring.record(*outcome, admin::v1::host_now_ms());
    }
    problem_errors(res).await
}

/// Every error is problem+json: an error answer that is not one — axum's own
/// rejections of a query string or a path segment it cannot parse are plain
/// text — is rewritten as a problem of the same status, the text becoming its
/// detail (these texts describe the request, never the server).
async fn problem_errors(res: Response) -> Response {
    let status = res.status();
    let is_problem = res
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|ct| ct.as_bytes().starts_with(b"application/problem+json"));
    // A handler's own answer that the idempotency layer stored or replays
    // goes out byte for byte.
    let handler_answer = matches!(
        res.extensions().get::<RequestOutcome>(),
        Some(
            RequestOutcome::Executed
                | RequestOutcome::Replayed
                | RequestOutcome::Verified
                | RequestOutcome::Superseded
                | RequestOutcome::NotStored
                | RequestOutcome::Unkeyed
        )
    );
    // The console's login form answers 401 and 400 as pages.
    let console_page = res
        .extensions()
        .get::<crate::console::OwnAnswer>()
        .is_some();
    if !(status.is_client_error() || status.is_server_error())
        || is_problem
        || handler_answer
        || console_page
    {
        return res;
    }
    let small = http_body::Body::size_hint(res.body())
        .upper()
        .is_some_and(|n| n <= PLAIN_ERROR_MAX as u64);
    let (parts, body) = res.into_parts();
    let text = if small {
        body.collect()
            .await
            .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
            .unwrap_or_default()
    } else {
        String::new()
    };
    let detail: String = text
        .chars()
        .take(500)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let slug = match status.as_u16() {
        400 | 422 => "invalid-request",
        404 => "not-found",
        405 => "method-not-allowed",
        408 => "request-timeout",
        413 => "body-too-large",
        414 => "uri-too-long",
        415 => "unsupported-media-type",
        431 => "headers-too-large",
        s if s >= 500 => "internal",
        _ => "client-error",
    };
    // The same title as the handlers' own invalid-request problems.
    let title = match slug {
        "invalid-request" => "The request is invalid",
        _ => status.canonical_reason().unwrap_or("Error"),
    };
    let detail = (!detail.trim().is_empty()).then_some(detail.trim());
    let mut problem = idem_http::problem::<Body>(status, slug, title, detail, None).into_response();
    // Keep what the original said beyond its body (Allow on a 405, …).
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            problem.headers_mut().append(name.clone(), value.clone());
        }
    }
    problem.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    problem
}
