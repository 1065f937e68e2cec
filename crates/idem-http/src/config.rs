//! Per-route configuration: operation, key requirement, policy, tenant source,
//! limits and the replay allow-list.

use std::collections::HashSet;
use std::time::Duration;

use http::{HeaderMap, HeaderName, Method, header};
use idem_core::{Completion, FingerprintSpec, Operation, Policy, StoredResponse, Tenant};

use crate::problem::Rejection;

/// Headers that are never stored nor replayed, whatever the configuration
/// ([`idem_core::headers::NEVER_STORED`]).
pub const NEVER_REPLAYED: &[&str] = idem_core::headers::NEVER_STORED;

/// Where the tenant of a request comes from.
#[derive(Debug, Clone)]
pub enum TenantSource {
    /// Every request belongs to this tenant.
    Static(Tenant),
    /// A [`Tenant`] request extension set by your authentication middleware.
    Extension,
    /// A request header, trusted because a gateway in front sets it. Only for
    /// deployments where clients cannot reach the service directly.
    TrustedHeader {
        /// The header, e.g. `x-tenant-id`.
        name: HeaderName,
        /// The tenant when the header is absent.
        default: Option<Tenant>,
    },
}

impl TenantSource {
    /// Resolves the tenant of a request.
    pub fn resolve(&self, parts: &http::request::Parts) -> Result<Tenant, Rejection> {
        match self {
            Self::Static(t) => Ok(t.clone()),
            Self::Extension => parts
                .extensions
                .get::<Tenant>()
                .cloned()
                .ok_or(Rejection::TenantUnresolved),
            Self::TrustedHeader { name, default } => {
                let mut values = parts.headers.get_all(name).iter();
                match (values.next(), values.next()) {
                    // Two values: which one the trusted component set is
                    // unknowable, so neither is used.
                    (Some(_), Some(_)) => Err(Rejection::TenantSentTwice),
                    (Some(v), None) => v
                        .to_str()
                        .ok()
                        .and_then(|s| Tenant::new(s).ok())
                        .ok_or(Rejection::TenantUnresolved),
                    (None, _) => default.clone().ok_or(Rejection::TenantUnresolved),
                }
            }
        }
    }
}

/// Overrides what the layer does with a handler's response, set as a response
/// extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Store it (completed if < 400, failed otherwise) and commit.
    Store,
    /// Roll back the key and the handler's writes.
    Discard,
}

/// Per-route configuration.
#[derive(Debug, Clone)]
pub struct RouteConfig {
    /// The operation keys are scoped to.
    pub operation: Operation,
    /// Whether a request without a key is rejected (400) or run without
    /// idempotency (still in a transaction).
    pub key_required: bool,
    /// TTL and maximum wait.
    pub policy: Policy,
    /// Where the tenant comes from.
    pub tenant: TenantSource,
    /// Methods the layer applies to; others pass straight through. Default
    /// POST and PATCH; add PUT or DELETE to opt in.
    pub methods: Vec<Method>,
    /// Largest request body read (413 above). Default 1 MiB.
    pub max_request_bytes: usize,
    /// Largest response body stored for replay. Above it the layer rolls back
    /// and answers 500 `response-too-large`, so nothing happens that could not
    /// be replayed. Default 1 MiB.
    pub max_response_bytes: usize,
    /// Response headers stored and replayed (lowercase). Change it with
    /// [`RouteConfig::replay_header`], which refuses [`NEVER_REPLAYED`] ones.
    pub replay_headers: Vec<HeaderName>,
    /// 4xx statuses stored as failed outcomes and replayed.
    pub store_client_errors: HashSet<u16>,
    /// Fingerprint settings (ignored JSON fields).
    pub fingerprint: FingerprintSpec,
    /// How long the handler may take, its response body included. Past it
    /// the layer rolls back and answers 503 `handler-timeout`, so a handler
    /// stuck on a silent dependency never holds the key's transaction (and
    /// its row lock) open indefinitely. Default 30 s.
    pub handler_timeout: Duration,
}

/// A configuration error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RouteConfigError {
    /// A header that must never be replayed was allow-listed.
    #[error("header {0} may never be replayed")]
    ForbiddenReplayHeader(String),
    /// A setting is out of its range.
    #[error(transparent)]
    Invalid(#[from] idem_core::ConfigError),
}

/// The largest `max_request_bytes` and `max_response_bytes` accepted: a
/// body is buffered whole, so the bound is memory.
pub const MAX_BODY_LIMIT: usize = 1 << 30;

impl RouteConfig {
    /// A route whose requests must carry a key.
    pub fn required(operation: Operation, tenant: TenantSource) -> Self {
        Self {
            operation,
            key_required: true,
            policy: Policy::default(),
            tenant,
            methods: vec![Method::POST, Method::PATCH],
            max_request_bytes: 1 << 20,
            max_response_bytes: 1 << 20,
            // The headers that define the representation replayed, and
            // where it lives.
            replay_headers: vec![
                header::CONTENT_TYPE,
                header::CONTENT_ENCODING,
                header::CONTENT_LANGUAGE,
                header::CONTENT_DISPOSITION,
                header::CONTENT_LOCATION,
                header::VARY,
                header::LOCATION,
                header::ETAG,
                header::LINK,
            ],
            store_client_errors: [402, 409, 410, 422].into_iter().collect(),
            fingerprint: FingerprintSpec::default(),
            handler_timeout: Duration::from_secs(30),
        }
    }

    /// A route where the key is optional.
    pub fn optional(operation: Operation, tenant: TenantSource) -> Self {
        Self {
            key_required: false,
            ..Self::required(operation, tenant)
        }
    }

    /// Whether a response with `status` commits (stored for replay when keyed)
    /// or rolls back: the handler's [`Disposition`] wins, else 2xx/3xx and the
    /// configured 4xx statuses commit.
    pub fn keeps(&self, status: u16, disposition: Option<Disposition>) -> bool {
        match disposition {
            Some(d) => d == Disposition::Store,
            None => status < 400 || self.store_client_errors.contains(&status),
        }
    }

    /// What is stored of a kept answer: its status, the headers this route
    /// replays, its body; completed below 400, failed from 400.
    pub fn completion(&self, status: u16, headers: &HeaderMap, body: &[u8]) -> Completion {
        let response = StoredResponse {
            status,
            headers: headers
                .iter()
                .filter(|(n, _)| self.replays(n))
                .filter_map(|(n, v)| Some((n.as_str().to_owned(), v.to_str().ok()?.to_owned())))
                .collect(),
            body: body.to_vec(),
        };
        if status < 400 {
            Completion::completed(response)
        } else {
            Completion::failed(response)
        }
    }

    /// Whether a response header is stored and replayed.
    pub fn replays(&self, name: &HeaderName) -> bool {
        self.replay_headers.contains(name) && !NEVER_REPLAYED.contains(&name.as_str())
    }

    /// Checks every bound (called by [`IdempotencyLayer::try_new`](crate::IdempotencyLayer::try_new)):
    /// body limits 1 byte to 1 GiB, a handler timeout of 1 ms to 1 h, at
    /// least one method, stored client errors within 400–499, and no
    /// [`NEVER_REPLAYED`] header allow-listed.
    pub fn validate(&self) -> Result<(), RouteConfigError> {
        use idem_core::ConfigError as E;
        const C: &str = "RouteConfig";
        E::check_range(
            C,
            "max_request_bytes",
            self.max_request_bytes,
            1,
            MAX_BODY_LIMIT,
        )?;
        E::check_range(
            C,
            "max_response_bytes",
            self.max_response_bytes,
            1,
            MAX_BODY_LIMIT,
        )?;
        E::check_duration(
            C,
            "handler_timeout",
            self.handler_timeout,
            Duration::from_millis(1),
            Duration::from_secs(3600),
        )?;
        if self.methods.is_empty() {
            return Err(E::new(C, "methods", "at least one method", "none").into());
        }
        if let Some(s) = self
            .store_client_errors
            .iter()
            .find(|s| !(400..=499).contains(*s))
        {
            return Err(E::new(C, "store_client_errors", "statuses 400 to 499", s).into());
        }
        if let Some(h) = self
            .replay_headers
            .iter()
            .find(|h| NEVER_REPLAYED.contains(&h.as_str()))
        {
            return Err(RouteConfigError::ForbiddenReplayHeader(h.to_string()));
        }
        Ok(())
    }

    /// Adds a response header to replay; refuses the ones in [`NEVER_REPLAYED`].
    pub fn replay_header(mut self, name: HeaderName) -> Result<Self, RouteConfigError> {
        if NEVER_REPLAYED.contains(&name.as_str()) {
            return Err(RouteConfigError::ForbiddenReplayHeader(name.to_string()));
        }
        self.replay_headers.push(name);
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> RouteConfig {
        RouteConfig::required(
            Operation::new("op").unwrap(),
            TenantSource::Static(Tenant::new("t").unwrap()),
        )
    }

    #[test]
    fn secret_bearing_headers_cannot_be_allow_listed() {
        for name in NEVER_REPLAYED {
            let err = config()
                .replay_header(HeaderName::from_static(name))
                .unwrap_err();
            assert!(err.to_string().contains(name), "{err}");
        }
        let mut c = config()
            .replay_header(HeaderName::from_static("x-request-id"))
            .unwrap();
        assert!(c.replays(&HeaderName::from_static("x-request-id")));
        // Pushed past the builder, a forbidden header is still never replayed.
        c.replay_headers.push(header::SET_COOKIE);
        assert!(!c.replays(&header::SET_COOKIE));
    }

    #[test]
    fn what_commits_by_default_and_with_a_disposition() {
        let c = config();
        for status in [200, 201, 204, 302, 402, 409, 410, 422] {
            assert!(c.keeps(status, None), "{status} is kept");
        }
        for status in [400, 401, 403, 404, 429, 500, 503] {
            assert!(!c.keeps(status, None), "{status} rolls back");
        }
        assert!(c.keeps(500, Some(Disposition::Store)));
        assert!(!c.keeps(201, Some(Disposition::Discard)));
    }

    #[test]
    fn tenant_sources_resolve_or_reject() {
        let req = |h: Option<&str>| {
            let mut b = http::Request::builder();
            if let Some(h) = h {
                b = b.header("x-tenant-id", h);
            }
            b.body(()).unwrap().into_parts().0
        };
        let header = TenantSource::TrustedHeader {
            name: HeaderName::from_static("x-tenant-id"),
            default: None,
        };
        assert_eq!(header.resolve(&req(Some("acme"))).unwrap().as_str(), "acme");
        assert_eq!(header.resolve(&req(None)), Err(Rejection::TenantUnresolved));
        let mut twice = req(Some("acme"));
        twice.headers.append("x-tenant-id", "evil".parse().unwrap());
        assert_eq!(header.resolve(&twice), Err(Rejection::TenantSentTwice));
        assert_eq!(
            header.resolve(&req(Some("bad tenant"))),
            Err(Rejection::TenantUnresolved)
        );
        let mut parts = req(Some("ignored"));
        assert_eq!(
            TenantSource::Extension.resolve(&parts),
            Err(Rejection::TenantUnresolved),
            "the header is not read when the source is the extension"
        );
        parts.extensions.insert(Tenant::new("from-auth").unwrap());
        assert_eq!(
            TenantSource::Extension.resolve(&parts).unwrap().as_str(),
            "from-auth"
        );
    }

    #[test]
    fn validate_names_the_field_out_of_range() {
        assert!(config().validate().is_ok());
        let err = |c: RouteConfig| c.validate().unwrap_err().to_string();
        let mut c = config();
        c.max_request_bytes = 0;
        assert!(err(c).starts_with("RouteConfig.max_request_bytes must be between 1 and"));
        let mut c = config();
        c.handler_timeout = Duration::ZERO;
        assert!(err(c).starts_with("RouteConfig.handler_timeout must be between 1ms and 1h"));
        let mut c = config();
        c.methods.clear();
        assert!(err(c).contains("RouteConfig.methods"));
        let mut c = config();
        c.store_client_errors.insert(500);
        assert!(err(c).contains("RouteConfig.store_client_errors"));
        let mut c = config();
        c.replay_headers.push(header::SET_COOKIE);
        assert_eq!(err(c), "header set-cookie may never be replayed");
    }
}
