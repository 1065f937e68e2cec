//! Authentication of the admin routes (`/admin/…`): a bearer token compared
//! in constant time, and a refusal of requests a web page sent from another
//! origin.
//!
//! Without a configured token the admin routes answer `401
//! admin-disabled`, saying how to enable them: loopback is not a security
//! boundary (a web page can POST to it, and DNS rebinding can read from it).

use std::fmt;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The shortest admin token accepted.
pub const MIN_TOKEN_LEN: usize = 16;
/// The longest admin token accepted.
pub const MAX_TOKEN_LEN: usize = 1024;

/// The admin bearer token. Only its SHA-256 is kept; `Debug` shows nothing.
#[derive(Clone)]
pub struct AdminToken([u8; 32]);

impl AdminToken {
    /// Validates a token: 16 to 1024 visible ASCII characters (it travels
    /// in a header).
    pub fn new(token: &str) -> Result<Self, String> {
        if token.len() < MIN_TOKEN_LEN || token.len() > MAX_TOKEN_LEN {
            return Err(format!(
                "--admin-token must be {MIN_TOKEN_LEN} to {MAX_TOKEN_LEN} characters, got {}",
                token.len()
            ));
        }
        if !token.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
            return Err("--admin-token must be visible ASCII (no spaces)".into());
        }
        Ok(Self(Sha256::digest(token.as_bytes()).into()))
    }

    /// Whether `candidate` is the token, in time independent of where they
    /// differ (both are hashed first, so their lengths leak nothing either).
    fn matches(&self, candidate: &[u8]) -> bool {
        let digest: [u8; 32] = Sha256::digest(candidate).into();
        bool::from(self.0[..].ct_eq(&digest[..]))
    }
}

impl fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AdminToken([redacted])")
    }
}

/// The path prefix the guard covers.
pub const PREFIX: &str = "/admin";

/// Puts every path under `/admin` behind the admin guard — routes that exist
/// and routes that do not alike, so the guard reveals nothing: a bearer token
/// when one is configured, `401 admin-disabled` when none is, and `403` for
/// requests whose `Origin` is foreign.
pub fn guarded(router: Router, token: Option<AdminToken>) -> Router {
    router.layer(axum::middleware::from_fn_with_state(Arc::new(token), guard))
}

fn is_admin(path: &str) -> bool {
    path.strip_prefix(PREFIX)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

async fn guard(State(token): State<Arc<Option<AdminToken>>>, req: Request, next: Next) -> Response {
    if !is_admin(req.uri().path()) {
        return next.run(req).await;
    }
    if foreign_origin(req.headers()) {
        return idem_http::problem(
            StatusCode::FORBIDDEN,
            "foreign-origin",
            "Admin requests from another origin are refused",
            Some("the Origin header names a site other than this server"),
            None,
        );
    }
    let Some(token) = token.as_ref() else {
        return unauthorized(
            "admin-disabled",
            "The admin API is disabled",
            "start idem serve with --admin-token or IDEM_ADMIN_TOKEN, then send \
             Authorization: Bearer <token>",
        );
    };
    let presented = bearer(req.headers());
    match presented {
        Some(candidate) if token.matches(candidate) => next.run(req).await,
        _ => unauthorized(
            "unauthorized",
            "A valid admin token is required",
            "send Authorization: Bearer <the token given to --admin-token>",
        ),
    }
}

/// The guard's refusal of a request outside `/admin` that needs the admin
/// token too (`/metrics`): the same answers as under `/admin` (403 foreign
/// origin, 401 admin-disabled without a token, 401 unauthorized), `None`
/// when the request may pass.
pub fn refusal(token: Option<&AdminToken>, headers: &HeaderMap) -> Option<Response> {
    if foreign_origin(headers) {
        return Some(idem_http::problem(
            StatusCode::FORBIDDEN,
            "foreign-origin",
            "Admin requests from another origin are refused",
            Some("the Origin header names a site other than this server"),
            None,
        ));
    }
    let Some(token) = token else {
        return Some(unauthorized(
            "admin-disabled",
            "The admin API is disabled",
            "start idem serve with --admin-token or IDEM_ADMIN_TOKEN (or --public-metrics for \
             /metrics), then send Authorization: Bearer <token>",
        ));
    };
    match bearer(headers) {
        Some(candidate) if token.matches(candidate) => None,
        _ => Some(unauthorized(
            "unauthorized",
            "A valid admin token is required",
            "send Authorization: Bearer <the token given to --admin-token>",
        )),
    }
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

/// Whether the request carries an `Origin` that is not this server's own
/// (`http(s)://<Host>`). Requests without `Origin` (curl, the CLI) pass;
/// browsers send it on cross-origin requests and on every POST.
fn foreign_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return false;
    };
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let origin = origin.to_str().ok();
    match (origin, host) {
        (Some(origin), Some(host)) => {
            let authority = origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"));
            authority.is_none_or(|a| !a.eq_ignore_ascii_case(host))
        }
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_bounded_and_compared_whole() {
        assert!(AdminToken::new("short").is_err());
        assert!(AdminToken::new("has a space in it!!").is_err());
        assert!(AdminToken::new(&"x".repeat(1025)).is_err());
        let t = AdminToken::new("0123456789abcdef").unwrap();
        assert!(t.matches(b"0123456789abcdef"));
        assert!(!t.matches(b"0123456789abcde"));
        assert!(!t.matches(b"0123456789abcdefg"));
        assert!(!t.matches(b""));
        assert_eq!(format!("{t:?}"), "AdminToken([redacted])");
    }

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
        assert!(is_admin("/admin"));
        assert!(is_admin("/admin/outbox"));
        assert!(is_admin("/admin/"));
        assert!(!is_admin("/administrator"));
        assert!(!is_admin("/v1/admin"));
    }

    #[test]
    fn origins() {
        let h = |origin: Option<&str>, host: Option<&str>| {
            let mut m = HeaderMap::new();
            if let Some(o) = origin {
                m.insert(header::ORIGIN, o.parse().unwrap());
            }
            if let Some(h) = host {
                m.insert(header::HOST, h.parse().unwrap());
            }
            foreign_origin(&m)
        };
        assert!(!h(None, Some("127.0.0.1:8080")), "no Origin: curl, the CLI");
        assert!(!h(Some("http://127.0.0.1:8080"), Some("127.0.0.1:8080")));
        assert!(!h(Some("https://Admin.Example"), Some("admin.example")));
        assert!(h(Some("http://evil.example"), Some("127.0.0.1:8080")));
        assert!(h(Some("null"), Some("127.0.0.1:8080")));
        assert!(h(Some("http://127.0.0.1:8080"), None));
        assert!(h(Some("http://127.0.0.1:8081"), Some("127.0.0.1:8080")));
    }
}
