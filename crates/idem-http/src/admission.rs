//! Admission: what the layer checks before anything touches the store — the
//! key header, the tenant, the body limit and the fingerprint.
//!
//! [`admit`] turns a request into an [`Admitted`] one or a [`Rejection`],
//! without I/O beyond reading the body. [`execute`](crate::execute) then
//! claims the key and runs the handler; a gateway in front of another service
//! reuses admission alone.

use bytes::Bytes;
use http::{HeaderMap, Request, header};
use http_body::Body;
use idem_core::{BoxError, Fingerprint, IdempotencyKey, RequestParts, Scope, Tenant};

use crate::IDEMPOTENCY_KEY;
use crate::config::RouteConfig;
use crate::problem::Rejection;

/// A request that passed admission, with its body read whole.
#[derive(Debug)]
pub struct Admitted {
    /// The request's head, as it came.
    pub parts: http::request::Parts,
    /// The body, at most [`RouteConfig::max_request_bytes`].
    pub body: Bytes,
    /// The tenant, from the route's [`TenantSource`](crate::TenantSource).
    pub tenant: Tenant,
    /// The key's scope and the request's fingerprint; `None` for a request
    /// sent without a key on a route where keys are optional.
    pub keyed: Option<Keyed>,
}

/// What a request sent with a key is held to.
#[derive(Debug, Clone)]
pub struct Keyed {
    /// Tenant, the route's operation and the key.
    pub scope: Scope,
    /// Method, operation, target and body, hashed.
    pub fingerprint: Fingerprint,
}

/// Admits a request to a route: reads the key header (refused when sent
/// twice or malformed, or missing where required), resolves the tenant,
/// reads the body within the limit and fingerprints it. The checks run in
/// that order and the first failure is the answer.
///
/// # Cancel safety
/// Cancel safe: nothing has been written anywhere; the body read so far is
/// dropped.
pub async fn admit<B>(config: &RouteConfig, req: Request<B>) -> Result<Admitted, Rejection>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let (parts, body) = req.into_parts();
    let key = match key_of(&parts.headers)? {
        None if config.key_required => return Err(Rejection::MissingKey),
        key => key,
    };
    let tenant = config.tenant.resolve(&parts)?;
    let body = crate::body::read_body(body, config.max_request_bytes).await?;
    let keyed = key.map(|key| {
        let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let fingerprint = config.fingerprint.fingerprint(&RequestParts {
            method: parts.method.as_str(),
            operation: &config.operation,
            target,
            json: is_json(&parts.headers),
            body: &body,
        });
        Keyed {
            scope: Scope::new(tenant.clone(), config.operation.clone(), key),
            fingerprint,
        }
    });
    Ok(Admitted {
        parts,
        body,
        tenant,
        keyed,
    })
}

/// Reads the key header: `Ok(None)` when absent, a rejection when sent twice or
/// malformed.
fn key_of(headers: &HeaderMap) -> Result<Option<IdempotencyKey>, Rejection> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    match (values.next(), values.next()) {
        (Some(_), Some(_)) => Err(Rejection::KeySentTwice),
        (Some(v), None) => IdempotencyKey::from_header(v.as_bytes())
            .map(Some)
            .map_err(Rejection::MalformedKey),
        (None, _) => Ok(None),
    }
}

/// Whether the body is fingerprinted as JSON (`application/json`, `…+json`).
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|ct| {
            let essence = ct.split(';').next().unwrap_or("").trim();
            essence.eq_ignore_ascii_case("application/json")
                || essence.to_ascii_lowercase().ends_with("+json")
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn json_content_types() {
        let h = |ct: &str| {
            let mut m = HeaderMap::new();
            m.insert(header::CONTENT_TYPE, HeaderValue::from_str(ct).unwrap());
            is_json(&m)
        };
        assert!(h("application/json"));
        assert!(h("Application/JSON; charset=utf-8"));
        assert!(h("application/merge-patch+json"));
        assert!(!h("text/plain"));
        assert!(!h("application/jsonp"));
        assert!(!is_json(&HeaderMap::new()));
    }

    fn route(required: bool) -> RouteConfig {
        let op = idem_core::Operation::new("orders.create").unwrap();
        let tenant = crate::TenantSource::Static(Tenant::new("acme").unwrap());
        if required {
            RouteConfig::required(op, tenant)
        } else {
            RouteConfig::optional(op, tenant)
        }
    }

    fn post(key: Option<&str>, body: &'static str) -> Request<http_body_util::Full<Bytes>> {
        let mut b = Request::post("/orders").header(header::CONTENT_TYPE, "application/json");
        if let Some(key) = key {
            b = b.header(IDEMPOTENCY_KEY, key);
        }
        b.body(http_body_util::Full::new(Bytes::from_static(
            body.as_bytes(),
        )))
        .unwrap()
    }

    #[tokio::test]
    async fn admission_checks_key_then_body_and_fingerprints() {
        let a = admit(&route(true), post(Some("k-1"), r#"{"a":1}"#))
            .await
            .unwrap();
        let keyed = a.keyed.unwrap();
        assert_eq!(keyed.scope.key.as_str(), "k-1");
        assert_eq!(&a.body[..], br#"{"a":1}"#);
        let same = admit(&route(true), post(Some("k-1"), r#"{ "a" : 1 }"#))
            .await
            .unwrap();
        assert_eq!(same.keyed.unwrap().fingerprint, keyed.fingerprint);

        let missing = admit(&route(true), post(None, "{}")).await.unwrap_err();
        assert_eq!(missing, Rejection::MissingKey);
        let unkeyed = admit(&route(false), post(None, "{}")).await.unwrap();
        assert!(unkeyed.keyed.is_none());

        let mut small = route(true);
        small.max_request_bytes = 4;
        let big = admit(&small, post(Some("k-1"), r#"{"a":1}"#)).await;
        assert_eq!(big.unwrap_err(), Rejection::BodyTooLarge);
        // The key is checked before the body is read.
        let bad_key = admit(&small, post(Some(""), r#"{"a":1}"#)).await;
        assert!(matches!(bad_key, Err(Rejection::MalformedKey(_))));
    }

    #[test]
    fn key_header_sent_twice_is_malformed() {
        let mut m = HeaderMap::new();
        assert_eq!(key_of(&m), Ok(None));
        m.append(IDEMPOTENCY_KEY, HeaderValue::from_static("a"));
        assert_eq!(key_of(&m).unwrap().unwrap().as_str(), "a");
        m.append(IDEMPOTENCY_KEY, HeaderValue::from_static("a"));
        assert_eq!(key_of(&m), Err(Rejection::KeySentTwice));
    }
}
