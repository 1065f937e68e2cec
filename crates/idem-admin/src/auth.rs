//! Authentication of the admin routes (`/admin/…`) and the web console
//! (`/console/…`): a bearer token compared in constant time, or a console
//! session (cookie `idem_session`, kept server-side as a hash only, with a
//! per-session CSRF token every state-changing request must carry); a
//! refusal of requests naming a host not allowed ([`crate::hosts`], against
//! DNS rebinding) or sent by a web page of another origin; and a lockout of
//! sources guessing the token ([`crate::limit`]).
//!
//! Without a configured token the admin routes answer `401
//! admin-disabled`, saying a token must be configured (in words that name no
//! flag: this router may be mounted in any application; `idem serve` takes
//! `--admin-token`): loopback is not a security
//! boundary (a web page can POST to it, and DNS rebinding can read from it).
//! The console's login page says so too.

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::hosts::{AllowedHosts, host_or_origin_refusal};
use crate::limit::{self, Limiter, Source};
pub use crate::token::AdminToken;

/// The path prefix of the admin API the guard covers.
pub const PREFIX: &str = "/admin";
/// The path prefix of the web console the guard covers.
pub const CONSOLE: &str = "/console";
/// The console's session cookie.
pub const COOKIE: &str = "idem_session";
/// The header carrying a session's CSRF token.
pub const CSRF_HEADER: &str = "x-csrf-token";
/// The header naming the operator of a bearer-token request (audit log).
pub const ACTOR_HEADER: &str = "x-idem-actor";

/// Whether `name` is an acceptable actor name: 1 to 64 characters of
/// `[A-Za-z0-9 ._@-]`.
pub fn valid_actor(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b" ._@-".contains(&b))
}

/// How long a console session lives without a request.
pub const SESSION_IDLE: Duration = Duration::from_secs(8 * 3600);
/// How long a console session lives at most.
pub const SESSION_MAX: Duration = Duration::from_secs(12 * 3600);
/// The most console sessions kept; past it the least recently used goes.
pub const MAX_SESSIONS: usize = 256;

/// A console session as the guard found it: a request extension for the
/// console's own handlers (`/console/api/session`, logout).
#[derive(Clone)]
pub struct SessionInfo {
    /// The SHA-256 of the session id (the id itself is never kept).
    pub(crate) id_hash: [u8; 32],
    /// The name typed at login.
    pub actor: String,
    /// The session's CSRF token.
    pub csrf: String,
}

impl fmt::Debug for SessionInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionInfo")
            .field("actor", &self.actor)
            .finish_non_exhaustive()
    }
}

struct Session {
    actor: String,
    csrf: String,
    created: Instant,
    seen: Instant,
}

/// The console sessions, in memory (a restart logs everyone out), keyed by
/// the SHA-256 of the session id.
#[derive(Default)]
pub struct Sessions {
    map: Mutex<HashMap<[u8; 32], Session>>,
}

/// 32 random bytes from the operating system, as 64 lowercase hex digits.
fn random_hex() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn hash(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Session>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new session for `actor`: its id (for the cookie, not kept) and its
    /// CSRF token.
    pub fn create(&self, actor: &str) -> Result<(String, String), getrandom::Error> {
        self.create_at(actor, Instant::now())
    }

    fn create_at(&self, actor: &str, now: Instant) -> Result<(String, String), getrandom::Error> {
        let id = random_hex()?;
        let csrf = random_hex()?;
        let mut map = self.lock();
        map.retain(|_, s| live(s, now));
        while map.len() >= MAX_SESSIONS {
            let oldest = map.iter().min_by_key(|(_, s)| s.seen).map(|(k, _)| *k);
            match oldest {
                Some(k) => map.remove(&k),
                None => break,
            };
        }
        map.insert(
            hash(&id),
            Session {
                actor: actor.to_owned(),
                csrf: csrf.clone(),
                created: now,
                seen: now,
            },
        );
        Ok((id, csrf))
    }

    /// The live session of cookie value `id`, marked as used now.
    pub fn find(&self, id: &str) -> Option<SessionInfo> {
        self.find_at(id, Instant::now())
    }

    fn find_at(&self, id: &str, now: Instant) -> Option<SessionInfo> {
        if id.len() != 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let key = hash(id);
        let mut map = self.lock();
        let session = map.get_mut(&key)?;
        if !live(session, now) {
            map.remove(&key);
            return None;
        }
        session.seen = now;
        Some(SessionInfo {
            id_hash: key,
            actor: session.actor.clone(),
            csrf: session.csrf.clone(),
        })
    }

    /// Ends a session (logout).
    pub fn end(&self, id_hash: &[u8; 32]) {
        self.lock().remove(id_hash);
    }

    /// How many sessions are kept.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn live(s: &Session, now: Instant) -> bool {
    now.saturating_duration_since(s.seen) < SESSION_IDLE
        && now.saturating_duration_since(s.created) < SESSION_MAX
}

/// What the guard and the console's handlers share: the token, the
/// sessions, the attempt limiter and the allowed hosts.
pub struct Auth {
    /// The admin token, if configured.
    pub token: Option<AdminToken>,
    /// The console sessions.
    pub sessions: Sessions,
    /// The limiter of token guesses.
    pub limiter: Limiter,
    /// The hosts admin and console requests may name.
    pub hosts: AllowedHosts,
}

/// How a token comparison went.
pub enum Verdict {
    /// The right token.
    Accepted,
    /// A wrong one (counted).
    Refused,
    /// Not compared: the source, or everyone, is locked out for this long.
    LockedOut(Duration),
}

impl Auth {
    /// The guard's state, shared by the routes and `/metrics`.
    pub fn new(token: Option<AdminToken>, hosts: AllowedHosts, limits: limit::Limits) -> Arc<Self> {
        Arc::new(Self {
            token,
            sessions: Sessions::default(),
            limiter: Limiter::new(limits),
            hosts,
        })
    }

    /// Compares `candidate` with the admin token, if the limiter lets the
    /// request's source try (refused when no token is set); `via` names
    /// the way in for the metric (`console`, `bearer`).
    pub fn try_token(
        &self,
        candidate: &[u8],
        peer: Option<SocketAddr>,
        via: &'static str,
    ) -> Verdict {
        let Some(token) = &self.token else {
            return Verdict::Refused;
        };
        let now = Instant::now();
        let attempt = match self
            .limiter
            .attempt_at(Source::of(peer.map(|p| p.ip())), now)
        {
            Ok(a) => a,
            Err(wait) => {
                limit::count(via, "locked_out");
                return Verdict::LockedOut(wait);
            }
        };
        if token.matches(candidate) {
            self.limiter.succeeded_at(attempt, now);
            limit::count(via, "accepted");
            Verdict::Accepted
        } else {
            limit::count(via, "refused");
            Verdict::Refused
        }
    }
}

/// Who is acting, for the audit log: set as a request extension by the
/// authentication layer (the console's login name, or a bearer request's
/// `X-Idem-Actor`); `admin` when absent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor(pub String);

/// The peer address of a request, when the server recorded it.
pub fn peer(req: &Request) -> Option<SocketAddr> {
    req.extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0)
}

/// The guard's middleware over `router`, without mounting the console
/// ([`crate::guarded`] mounts both). [`Router::layer`] wraps each route:
/// to run the guard once around a whole service instead, use [`guard`]
/// (`axum::middleware::from_fn_with_state(auth, guard)`).
pub fn layer(router: Router, auth: Arc<Auth>) -> Router {
    router.layer(axum::middleware::from_fn_with_state(auth, guard))
}

#[derive(Debug, PartialEq, Eq)]
enum Area {
    Open,
    Admin,
    Console,
    ConsolePublic,
}

/// The console paths the guard lets through without credentials.
pub const PUBLIC: &[&str] = &["/console/login", "/console/app.css", "/console/favicon.svg"];

fn under(path: &str, prefix: &str) -> bool {
    path.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

fn area(path: &str) -> Area {
    if under(path, PREFIX) {
        Area::Admin
    } else if PUBLIC.contains(&path) {
        Area::ConsolePublic
    } else if under(path, CONSOLE) {
        Area::Console
    } else {
        Area::Open
    }
}

fn state_changing(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// A browser navigating to a console page (not the console's own API
/// calls): sent to the login page instead of a 401 document.
fn html_navigation(req: &Request) -> bool {
    matches!(*req.method(), Method::GET | Method::HEAD)
        && !under(req.uri().path(), "/console/api")
        && req
            .headers()
            .get(header::ACCEPT)
            .and_then(|a| a.to_str().ok())
            .is_some_and(|a| a.contains("text/html"))
}

/// The guard itself, as an axum middleware function for
/// `axum::middleware::from_fn_with_state(auth, guard)`: what [`layer`] puts
/// on each route, for a server that wraps its whole router once (every
/// path, routed or not, then passes through it).
pub async fn guard(State(auth): State<Arc<Auth>>, mut req: Request, next: Next) -> Response {
    let area = area(req.uri().path());
    if area == Area::Open {
        return next.run(req).await;
    }
    if let Some(refused) = host_or_origin_refusal(&auth.hosts, &req) {
        return refused;
    }
    if area == Area::ConsolePublic {
        return next.run(req).await;
    }
    let refuse = |req: &Request, slug: &str, title: &str, detail: &str| {
        if area == Area::Console && html_navigation(req) {
            to_login()
        } else {
            unauthorized(slug, title, detail)
        }
    };
    if auth.token.is_none() {
        return refuse(
            &req,
            "admin-disabled",
            "The admin API is disabled",
            "no admin token is configured on this server: configure one, then send \
             Authorization: Bearer <token>",
        );
    }
    let denied = |req: &Request| {
        refuse(
            req,
            "unauthorized",
            "A valid admin token is required",
            "send Authorization: Bearer <the admin token>, or log in at /console/login",
        )
    };
    let actor = if req.headers().contains_key(header::AUTHORIZATION) {
        let Some(candidate) = bearer(req.headers()) else {
            return denied(&req);
        };
        match auth.try_token(candidate, peer(&req), "bearer") {
            Verdict::Accepted => {}
            Verdict::Refused => return denied(&req),
            Verdict::LockedOut(wait) => return locked_out(wait),
        }
        req.headers()
            .get(ACTOR_HEADER)
            .and_then(|v| v.to_str().ok())
            .filter(|v| valid_actor(v))
            .unwrap_or("admin")
            .to_owned()
    } else {
        let Some(session) = session_cookie(req.headers()).and_then(|id| auth.sessions.find(id))
        else {
            return denied(&req);
        };
        if state_changing(req.method()) {
            let sent = req.headers().get(CSRF_HEADER).map(HeaderValue::as_bytes);
            let ok = sent.is_some_and(|s| bool::from(s.ct_eq(session.csrf.as_bytes())));
            if !ok {
                return idem_http::problem(
                    StatusCode::FORBIDDEN,
                    "csrf",
                    "A valid CSRF token is required",
                    Some("send the X-CSRF-Token header given by GET /console/api/session"),
                    None,
                );
            }
        }
        let actor = session.actor.clone();
        req.extensions_mut().insert(session);
        actor
    };
    req.extensions_mut().insert(Actor(actor));
    next.run(req).await
}

/// `303` to the console's login page.
fn to_login() -> Response {
    (
        StatusCode::SEE_OTHER,
        [
            (header::LOCATION, "/console/login"),
            (header::CACHE_CONTROL, "no-store"),
        ],
    )
        .into_response()
}

/// The value of cookie `idem_session`, if sent once.
fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    let mut found = None;
    for value in headers.get_all(header::COOKIE) {
        let Ok(value) = value.to_str() else { continue };
        for pair in value.split(';') {
            if let Some((name, v)) = pair.trim().split_once('=')
                && name == COOKIE
            {
                if found.is_some() {
                    return None;
                }
                found = Some(v);
            }
        }
    }
    found
}

/// The guard's refusal of a request outside `/admin` that needs the admin
/// token too (`/metrics`): the same answers as under `/admin` (host and
/// origin, 401 admin-disabled without a token, 401 unauthorized, 429 when
/// locked out), `None` when the request may pass.
pub fn refusal(auth: &Auth, req: &Request) -> Option<Response> {
    if let Some(refused) = host_or_origin_refusal(&auth.hosts, req) {
        return Some(refused);
    }
    if auth.token.is_none() {
        return Some(unauthorized(
            "admin-disabled",
            "The admin API is disabled",
            "no admin token is configured on this server: configure one (or make /metrics \
             public), then send Authorization: Bearer <token>",
        ));
    }
    let wrong = || {
        Some(unauthorized(
            "unauthorized",
            "A valid admin token is required",
            "send Authorization: Bearer <the admin token>",
        ))
    };
    let Some(candidate) = bearer(req.headers()) else {
        return wrong();
    };
    match auth.try_token(candidate, peer(req), "bearer") {
        Verdict::Accepted => None,
        Verdict::Refused => wrong(),
        Verdict::LockedOut(wait) => Some(locked_out(wait)),
    }
}

/// `429 too-many-attempts` with `Retry-After`: the token was not compared.
pub fn locked_out(wait: Duration) -> Response {
    idem_http::problem(
        StatusCode::TOO_MANY_REQUESTS,
        "too-many-attempts",
        "Too many wrong admin tokens",
        Some(
            "too many wrong tokens came from this address (or from everywhere): the token \
              is not checked until Retry-After has passed",
        ),
        Some(limit::retry_after_secs(wait)),
    )
}

/// The credentials of `Authorization: Bearer <token>` (the scheme is
/// case-insensitive, RFC 9110). Sent twice, it is refused: which one counts
/// would be a guess.
fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return None;
    };
    let value = value.as_bytes();
    let (scheme, rest) = value.split_at(value.iter().position(|&b| b == b' ')?);
    scheme
        .eq_ignore_ascii_case(b"bearer")
        .then(|| rest.trim_ascii())
}

fn unauthorized(slug: &str, title: &str, detail: &str) -> Response {
    let mut res = idem_http::problem(StatusCode::UNAUTHORIZED, slug, title, Some(detail), None);
    res.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"idem-admin\""),
    );
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_credentials() {
        let h = |values: &[&str]| {
            let mut m = HeaderMap::new();
            for v in values {
                m.append(header::AUTHORIZATION, v.parse().unwrap());
            }
            bearer(&m).map(|b| String::from_utf8_lossy(b).into_owned())
        };
        assert_eq!(h(&["Bearer abc"]).as_deref(), Some("abc"));
        assert_eq!(h(&["bearer abc"]).as_deref(), Some("abc"));
        assert_eq!(h(&["BEARER   abc "]).as_deref(), Some("abc"));
        assert_eq!(h(&["Basic abc"]), None);
        assert_eq!(h(&["Bearerabc"]), None);
        assert_eq!(h(&["Bearer abc", "Bearer abc"]), None, "sent twice");
        assert_eq!(h(&[]), None);
    }

    #[test]
    fn the_prefix_is_a_path_segment() {
        let guarded = |p: &str| area(p) != Area::Open;
        assert!(guarded("/admin"));
        assert!(guarded("/admin/outbox"));
        assert!(guarded("/admin/"));
        assert!(!guarded("/administrator"));
        assert!(!guarded("/v1/admin"));
        assert_eq!(area("/console"), Area::Console);
        assert_eq!(area("/console/app.js"), Area::Console);
        assert_eq!(area("/console/api/session"), Area::Console);
        assert_eq!(area("/console/login"), Area::ConsolePublic);
        assert_eq!(area("/console/app.css"), Area::ConsolePublic);
        assert_eq!(area("/console/login/x"), Area::Console);
        assert_eq!(area("/consoles"), Area::Open);
    }

    #[test]
    fn actor_names() {
        assert!(valid_actor("ops"));
        assert!(valid_actor("Ada Lovelace.ops_1@example-co"));
        assert!(valid_actor(&"a".repeat(64)));
        assert!(!valid_actor(""));
        assert!(!valid_actor(&"a".repeat(65)));
        assert!(!valid_actor("<script>"));
        assert!(!valid_actor("tab\there"));
        assert!(!valid_actor("é"));
    }

    #[test]
    fn sessions_expire_and_are_bounded() {
        let sessions = Sessions::default();
        let t0 = Instant::now();
        let (id, csrf) = sessions.create_at("ops", t0).unwrap();
        assert_eq!((id.len(), csrf.len()), (64, 64));
        assert_ne!(id, csrf);
        let found = sessions.find_at(&id, t0).unwrap();
        assert_eq!(
            (found.actor.as_str(), found.csrf.as_str()),
            ("ops", csrf.as_str())
        );
        assert_eq!(format!("{found:?}"), "SessionInfo { actor: \"ops\", .. }");
        assert!(
            sessions.find_at(&csrf, t0).is_none(),
            "the CSRF token is no session id"
        );
        assert!(sessions.find_at("not hex", t0).is_none());
        // Idle: used every 7 h it lives until the absolute limit (12 h).
        let h = |n: u64| t0 + Duration::from_secs(n * 3600);
        assert!(sessions.find_at(&id, h(7)).is_some());
        assert!(sessions.find_at(&id, h(11)).is_some());
        assert!(sessions.find_at(&id, h(12)).is_none(), "absolute expiry");
        assert!(sessions.is_empty(), "an expired session is dropped");
        let (idle, _) = sessions.create_at("ops", t0).unwrap();
        assert!(sessions.find_at(&idle, h(8)).is_none(), "idle expiry");
        // Bounded: the least recently used goes first.
        let (first, _) = sessions.create_at("a", t0).unwrap();
        for i in 0..MAX_SESSIONS {
            sessions
                .create_at("b", t0 + Duration::from_secs(1 + i as u64))
                .unwrap();
        }
        assert_eq!(sessions.len(), MAX_SESSIONS);
        assert!(sessions.find_at(&first, h(1)).is_none(), "evicted");
        // Logout.
        let (gone, _) = sessions.create_at("c", h(1)).unwrap();
        let info = sessions.find_at(&gone, h(1)).unwrap();
        sessions.end(&info.id_hash);
        assert!(sessions.find_at(&gone, h(1)).is_none());
    }

    #[test]
    fn session_cookies() {
        let h = |values: &[&str]| {
            let mut m = HeaderMap::new();
            for v in values {
                m.append(header::COOKIE, v.parse().unwrap());
            }
            session_cookie(&m).map(str::to_owned)
        };
        assert_eq!(h(&["idem_session=abc"]).as_deref(), Some("abc"));
        assert_eq!(h(&["a=1; idem_session=abc; b=2"]).as_deref(), Some("abc"));
        assert_eq!(h(&["a=1", "idem_session=abc"]).as_deref(), Some("abc"));
        assert_eq!(
            h(&["idem_session=abc; idem_session=def"]),
            None,
            "sent twice"
        );
        assert_eq!(h(&["xidem_session=abc"]), None);
        assert_eq!(h(&[]), None);
    }
}
