//! The unversioned admin routes `/admin/v1` replaced (`/admin/outbox`,
//! `/admin/webhooks…`): each answers `410 Gone` as problem+json
//! (`route-retired`) naming its replacement, to every method, and does
//! nothing else — a retired replay replays nothing.
//!
//! The body carries `replacement` (the method and path of the `/admin/v1`
//! route) and `detail` (how the request changes, e.g. `delivery` became
//! `delivery_id`); a `Link: <…>; rel="successor-version"` header points at
//! the replacement too. docs/admin-api.md lists them ("Retired routes").

use axum::Router;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use serde_json::json;

/// The problem type slug of a retired route.
pub const SLUG: &str = "route-retired";

/// A retired route and what replaces it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retired {
    /// The retired path (any method).
    pub path: &'static str,
    /// The method and path of the `/admin/v1` route that replaces it.
    pub method: &'static str,
    /// The replacement's path.
    pub replacement: &'static str,
    /// How a request to the old route becomes one to the new.
    pub how: &'static str,
}

/// Every retired route, with its replacement.
pub const RETIRED: &[Retired] = &[
    Retired {
        path: "/admin/outbox",
        method: "GET",
        replacement: "/admin/v1/outbox",
        how: "the same figures (pending, oldest_pending_age_ms, dead, and the relay's \
              when it runs in this process)",
    },
    Retired {
        path: "/admin/webhooks",
        method: "GET",
        replacement: "/admin/v1/webhooks/receipts",
        how: "the same endpoint, state and limit parameters (limit 1 to 200) plus cursor; \
              the answer is {\"items\", \"next_cursor\"} instead of {\"data\"}",
    },
    Retired {
        path: "/admin/webhooks/receipt",
        method: "GET",
        replacement: "/admin/v1/webhooks/receipt",
        how: "?endpoint=&delivery_id= (the delivery parameter is now delivery_id)",
    },
    Retired {
        path: "/admin/webhooks/replay",
        method: "POST",
        replacement: "/admin/v1/webhooks/replay",
        how: "the body {\"endpoint\": …, \"delivery_id\": …} (was ?endpoint=&delivery=) \
              and an Idempotency-Key header; the replay is written to the audit log",
    },
    Retired {
        path: "/admin/webhooks/stats",
        method: "GET",
        replacement: "/admin/v1/webhooks/stats",
        how: "the same counters per endpoint",
    },
];

impl Retired {
    /// The `410` answer: problem+json naming the replacement.
    pub fn answer(&self) -> Response {
        let body = json!({
            "type": format!("{}{SLUG}", idem_http::TYPE_BASE),
            "title": "This admin route is retired",
            "status": 410,
            "detail": format!(
                "{} is retired; use {} {}: {} (docs/admin-api.md)",
                self.path, self.method, self.replacement, self.how
            ),
            "replacement": format!("{} {}", self.method, self.replacement),
        });
        let mut res = (
            StatusCode::GONE,
            [(header::CONTENT_TYPE, "application/problem+json")],
            body.to_string(),
        )
            .into_response();
        let link = format!("<{}>; rel=\"successor-version\"", self.replacement);
        if let Ok(v) = HeaderValue::try_from(link) {
            res.headers_mut().insert(header::LINK, v);
        }
        res
    }
}

/// Every retired route, answering `410` to any method.
pub fn router() -> Router {
    RETIRED.iter().fold(Router::new(), |r, old| {
        let old = *old;
        r.route(old.path, any(move || async move { old.answer() }))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_replacement_is_a_v1_route_and_paths_are_unique() {
        let mut paths: Vec<&str> = RETIRED.iter().map(|r| r.path).collect();
        paths.sort_unstable();
        paths.dedup();
        assert_eq!(paths.len(), RETIRED.len());
        for r in RETIRED {
            assert!(r.path.starts_with("/admin/") && !r.path.starts_with("/admin/v1"));
            assert!(r.replacement.starts_with(crate::v1::PREFIX), "{r:?}");
        }
    }
}
