//! The web console at `/console`: its login, logout and session routes, and
//! its assets (`console/`: index.html, app.js, app.css), embedded in the
//! binary and served with a strict Content-Security-Policy. The console is a
//! client of the admin API (`/admin/v1`); the guard in front of both is
//! [`crate::auth`].

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use crate::auth::{Auth, COOKIE, SessionInfo, Verdict, valid_actor};

pub use crate::auth::PUBLIC;

/// The longest login form read.
pub const LOGIN_FORM_MAX: usize = 4096;

const INDEX: &str = include_str!("../console/index.html");
const APP_JS: &str = include_str!("../console/app.js");
const APP_CSS: &str = include_str!("../console/app.css");
const FAVICON: &str = include_str!("../console/favicon.svg");

/// Every console answer's policy: nothing but this server's own files, no
/// inline script or style, no framing.
pub const CSP: &str =
    "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// The console's routes; `auth` is the guard's state (sessions, token).
pub fn router(auth: Arc<Auth>) -> Router {
    Router::new()
        .route("/console", get(|| async { page(INDEX) }))
        .route("/console/", get(|| async { page(INDEX) }))
        .route(
            "/console/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/console/app.css",
            get(|| async { asset("text/css; charset=utf-8", APP_CSS) }),
        )
        .route(
            "/console/favicon.svg",
            get(|| async { asset("image/svg+xml", FAVICON) }),
        )
        .route("/console/login", get(login_page).post(login))
        .route("/console/logout", post(logout))
        .route("/console/api/session", get(session))
        .with_state(auth)
}

/// Marks the console's own answers (a login form with 401, say): they go
/// out as they are, not rewritten as problem documents.
#[derive(Clone, Copy, Debug)]
pub struct OwnAnswer;

fn secured(mut res: Response, cache: &'static str) -> Response {
    res.extensions_mut().insert(OwnAnswer);
    crate::respond::for_browser(res, CSP, cache)
}

fn page(html: &'static str) -> Response {
    html_status(StatusCode::OK, html.to_owned())
}

fn html_status(status: StatusCode, html: String) -> Response {
    secured(
        (
            status,
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            html,
        )
            .into_response(),
        "no-store",
    )
}

/// A script or stylesheet: revalidated on every load (it changes with the
/// binary), never stored by shared caches.
fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut res = crate::respond::embedded(content_type, body, CSP, "private, no-cache");
    res.extensions_mut().insert(OwnAnswer);
    res
}

/// The login page, with a fixed message (never an echo of input).
fn login_form(status: StatusCode, message: Option<&str>, enabled: bool) -> Response {
    let notice = match (enabled, message) {
        (false, _) => "<p class=\"error\" id=\"login-error\">The admin token is not configured: \
             configure one on this server to use the console.</p>"
            .to_owned(),
        (true, Some(m)) => format!("<p class=\"error\" id=\"login-error\">{m}</p>"),
        (true, None) => String::new(),
    };
    let disabled = if enabled { "" } else { " disabled" };
    html_status(
        status,
        format!(
            "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
<title>Idem console — log in</title><link rel=\"icon\" href=\"/console/favicon.svg\">\
<link rel=\"stylesheet\" href=\"/console/app.css\"></head>\
<body class=\"login\"><main class=\"login-box\"><h1>Idem console</h1>{notice}\
<form method=\"post\" action=\"/console/login\">\
<label>Operator name<input name=\"actor\" id=\"actor\" required maxlength=\"64\" \
autocomplete=\"username\"{disabled}></label>\
<label>Admin token<input name=\"token\" id=\"token\" type=\"password\" required \
autocomplete=\"current-password\"{disabled}></label>\
<button type=\"submit\" id=\"login\"{disabled}>Log in</button></form>\
<p class=\"hint\">The token is this server's admin token. \
The operator name is written to the audit log.</p></main></body></html>\n"
        ),
    )
}

async fn login_page(State(auth): State<Arc<Auth>>) -> Response {
    login_form(StatusCode::OK, None, auth.token.is_some())
}

const BAD_NAME: &str =
    "The operator name must be 1 to 64 characters: letters, digits, space, . _ @ -";

/// `POST /console/login`: a form with `token` and `actor`. The token is
/// compared in constant time; a good one starts a session (cookie) and goes
/// to the console, a bad one gets the form again with a generic error, and
/// a source locked out for guessing gets it with 429 and `Retry-After`,
/// the token not compared.
async fn login(State(auth): State<Arc<Auth>>, req: Request) -> Response {
    if auth.token.is_none() {
        return login_form(StatusCode::UNAUTHORIZED, None, false);
    }
    let peer = crate::auth::peer(&req);
    let form_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    if !form_type {
        return login_form(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Some("Send the login form."),
            true,
        );
    }
    // A form announced larger than the limit is refused unread.
    let too_large = idem_http::declared_over(req.body(), LOGIN_FORM_MAX);
    let body = match too_large {
        true => Err(()),
        false => axum::body::to_bytes(req.into_body(), LOGIN_FORM_MAX)
            .await
            .map_err(drop),
    };
    let Ok(body) = body else {
        return login_form(
            StatusCode::PAYLOAD_TOO_LARGE,
            Some("The form is too large."),
            true,
        );
    };
    let (mut token, mut actor) = (None, None);
    for (name, value) in form_urlencoded::parse(&body) {
        let slot = match name.as_ref() {
            "token" => &mut token,
            "actor" => &mut actor,
            _ => continue,
        };
        if slot.replace(value).is_some() {
            return login_form(StatusCode::BAD_REQUEST, Some("Send the form once."), true);
        }
    }
    let actor = actor.map(|a| a.trim().to_owned()).unwrap_or_default();
    let verdict = match token {
        Some(t) => auth.try_token(t.as_bytes(), peer, "console"),
        None => Verdict::Refused,
    };
    match verdict {
        Verdict::Accepted => {}
        Verdict::Refused => {
            tracing::warn!("console login refused: wrong admin token");
            return login_form(
                StatusCode::UNAUTHORIZED,
                Some("Login failed: the token is not valid."),
                true,
            );
        }
        Verdict::LockedOut(wait) => {
            let secs = crate::limit::retry_after_secs(wait);
            tracing::warn!(retry_after_secs = secs, "console login refused: locked out");
            let mut res = login_form(
                StatusCode::TOO_MANY_REQUESTS,
                Some(&format!(
                    "Too many failed logins: try again in {secs} s. The token was not checked."
                )),
                true,
            );
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
            return res;
        }
    }
    if !valid_actor(&actor) {
        return login_form(StatusCode::BAD_REQUEST, Some(BAD_NAME), true);
    }
    let (id, _csrf) = match auth.sessions.create(&actor) {
        Ok(s) => s,
        Err(e) => return crate::respond::internal(e),
    };
    tracing::info!(actor = %actor, "console login");
    let cookie = format!("{COOKIE}={id}; Path=/; Secure; HttpOnly; SameSite=Strict");
    let mut res = (StatusCode::SEE_OTHER, [(header::LOCATION, "/console/")]).into_response();
    if let Ok(v) = HeaderValue::try_from(cookie) {
        res.headers_mut().insert(header::SET_COOKIE, v);
    }
    secured(res, "no-store")
}

fn expired_cookie() -> HeaderValue {
    HeaderValue::from_static("idem_session=; Path=/; Secure; HttpOnly; SameSite=Strict; Max-Age=0")
}

/// `POST /console/logout` (behind the guard, so with the CSRF token): ends
/// the session and clears the cookie.
async fn logout(State(auth): State<Arc<Auth>>, req: Request<Body>) -> Response {
    if let Some(s) = req.extensions().get::<SessionInfo>() {
        auth.sessions.end(&s.id_hash);
        tracing::info!(actor = %s.actor, "console logout");
    }
    let mut res = crate::respond::ok(&json!({"logged_out": true}));
    res.headers_mut()
        .insert(header::SET_COOKIE, expired_cookie());
    secured(res, "no-store")
}

/// `GET /console/api/session`: who is logged in and the CSRF token to send
/// (`null` for a bearer-token request: it needs none).
async fn session(req: Request<Body>) -> Response {
    let session = req.extensions().get::<SessionInfo>();
    let actor = match (session, req.extensions().get::<crate::auth::Actor>()) {
        (Some(s), _) => s.actor.clone(),
        (None, Some(a)) => a.0.clone(),
        (None, None) => "admin".to_owned(),
    };
    let csrf = session.map(|s| s.csrf.clone());
    secured(
        crate::respond::ok(&json!({"actor": actor, "csrf": csrf})),
        "no-store",
    )
}
