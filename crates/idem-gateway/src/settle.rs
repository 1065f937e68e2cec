//! What an upstream answer means for the key (pure logic): final, not
//! processed, still in progress upstream, or an unknown outcome.

use axum::http::{HeaderMap, StatusCode};
use idem_core::leased::OnUnknown;

use crate::config::Route;

/// What an answer means for the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The intent's answer: stored and replayed.
    Store,
    /// The upstream did not act on it: the key goes back to where it was
    /// before this forward (released, or still unknown from an earlier
    /// one); the answer is passed on, not stored.
    NotProcessed,
    /// An earlier attempt with the key is still running upstream: nothing
    /// stored, the client told to retry.
    InProgress,
    /// The upstream may have acted: the key is kept (why).
    Unknown(String),
}

/// Reads an answer of `route`'s upstream. `again`: the derived key was
/// forwarded before (a takeover after an unknown outcome or a dead
/// gateway), so the upstream may still be running that earlier attempt.
pub fn verdict(route: &Route, status: StatusCode, headers: &HeaderMap, again: bool) -> Verdict {
    let code = status.as_u16();
    if route.not_processed.contains(&code) {
        return Verdict::NotProcessed;
    }
    if route.transient.contains(&code) {
        return Verdict::InProgress;
    }
    // An upstream that deduplicates by key (Stripe's contract) answers a
    // second request with a key whose first still runs with 409; a 409
    // it replays (marked so) is a stored answer like any other.
    if code == 409 && again && route.on_unknown == OnUnknown::Reforward && !replayed(headers) {
        return Verdict::InProgress;
    }
    if route.config.keeps(code, None) {
        return Verdict::Store;
    }
    if status.is_server_error() {
        return Verdict::Unknown(format!("status {code}"));
    }
    Verdict::NotProcessed
}

/// Whether an answer says it is a replay (`Idempotent-Replayed: true`, or
/// the `Idempotency-Replayed` some servers send).
fn replayed(headers: &HeaderMap) -> bool {
    ["idempotent-replayed", "idempotency-replayed"]
        .iter()
        .any(|h| {
            headers
                .get(*h)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
        })
}

/// An upstream's `Retry-After` in seconds (delta-seconds only), within 1 s
/// to 1 h; 1 s without one.
pub fn retry_after(headers: &HeaderMap) -> u64 {
    headers
        .get(axum::http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(1, |s| s.clamp(1, 3600))
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;
    use crate::RouteSpec;

    fn route(on_unknown: &str, extra: &str) -> Route {
        let text = format!(
            "method = \"POST\"\npath = \"/p\"\noperation = \"p\"\non_unknown = \"{on_unknown}\"\n{extra}"
        );
        let spec: RouteSpec = toml::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
        spec.route().unwrap_or_else(|e| panic!("{e}"))
    }

    fn v(r: &Route, status: u16, again: bool) -> Verdict {
        verdict(
            r,
            StatusCode::from_u16(status).unwrap(),
            &HeaderMap::new(),
            again,
        )
    }

    #[test]
    fn every_5xx_is_unknown_unless_the_route_says_it_was_not_processed() {
        let reject = route("reject", "");
        for s in [500, 502, 503, 504] {
            assert_eq!(
                v(&reject, s, false),
                Verdict::Unknown(format!("status {s}"))
            );
        }
        assert_eq!(
            v(&reject, 429, false),
            Verdict::NotProcessed,
            "429 by default"
        );
        let lb = route("reject", "not_processed = [503]");
        assert_eq!(v(&lb, 503, false), Verdict::NotProcessed);
        assert_eq!(
            v(&lb, 429, false),
            Verdict::NotProcessed,
            "a 4xx the route does not store"
        );
    }

    #[test]
    fn finals_are_stored_and_other_client_errors_were_not_processed() {
        let r = route("reject", "");
        for s in [200, 201, 204, 302, 402, 409, 410, 422] {
            assert_eq!(v(&r, s, false), Verdict::Store, "{s}");
        }
        for s in [400, 401, 403, 404, 405, 413] {
            assert_eq!(v(&r, s, false), Verdict::NotProcessed, "{s}");
        }
    }

    #[test]
    fn a_409_to_a_key_forwarded_again_is_in_progress_on_a_reforward_route_unless_replayed() {
        let r = route("reforward", "");
        assert_eq!(
            v(&r, 409, false),
            Verdict::Store,
            "a first forward's 409 is business"
        );
        assert_eq!(v(&r, 409, true), Verdict::InProgress);
        let mut replayed = HeaderMap::new();
        replayed.insert("idempotent-replayed", HeaderValue::from_static("true"));
        assert_eq!(
            verdict(&r, StatusCode::CONFLICT, &replayed, true),
            Verdict::Store,
            "a stored 409 the upstream replays"
        );
        let verify = route("verify", "verify = \"GET /p?k={key}\"\nlanding = \"1s\"");
        assert_eq!(
            v(&verify, 409, true),
            Verdict::Store,
            "verified as not landed: a forward again is a first for a non-deduplicating upstream"
        );
        let named = route("reject", "transient = [425]");
        assert_eq!(v(&named, 425, false), Verdict::InProgress);
    }

    #[test]
    fn retry_after_is_bounded() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h), 1);
        h.insert("retry-after", HeaderValue::from_static("7"));
        assert_eq!(retry_after(&h), 7);
        h.insert("retry-after", HeaderValue::from_static("999999"));
        assert_eq!(retry_after(&h), 3600);
        h.insert(
            "retry-after",
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&h), 1);
    }
}
