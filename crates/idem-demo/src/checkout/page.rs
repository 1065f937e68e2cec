//! The checkout page: a cart in the browser whose `Idempotency-Key` is drawn
//! when the cart is created (`crypto.randomUUID()`, kept with the cart in
//! `localStorage`), and a Pay button that sends the order with it. A double
//! click, a reload and a retry send the same key, so they make one order. The
//! page, its script and its stylesheet are in the binary; the
//! Content-Security-Policy allows nothing but this origin.

use axum::Router;
use axum::response::Response;
use axum::routing::get;

const INDEX_HTML: &str = include_str!("page/index.html");
const APP_JS: &str = include_str!("page/app.js");
const APP_CSS: &str = include_str!("page/app.css");

/// Scripts, styles and `fetch` from this origin only; no inline code, no
/// frames, no other origin.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                       connect-src 'self'; img-src 'self'; base-uri 'none'; \
                       form-action 'self'; frame-ancestors 'none'";

/// The page at `/checkout` (and `/checkout/`), its script and its
/// stylesheet.
pub fn router() -> Router {
    let page = || async { asset("text/html; charset=utf-8", INDEX_HTML) };
    Router::new()
        .route("/checkout", get(page))
        .route("/checkout/", get(page))
        .route(
            "/checkout/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/checkout/app.css",
            get(|| async { asset("text/css; charset=utf-8", APP_CSS) }),
        )
}

/// One of the page's files, revalidated on every load (it changes with the
/// binary).
fn asset(content_type: &'static str, body: &'static str) -> Response {
    idem_admin::respond::embedded(content_type, body, CSP, "no-cache")
}
