//! The gateway's settings: the upstream, the limit of one forward, and the
//! keyed routes. [`RouteSpec`] is one route as an operator writes it (a
//! `[[gateway.routes]]` table of `idem serve --config`); [`RouteSpec::route`]
//! checks every value and gives the [`Route`] the gateway runs.

use std::collections::BTreeSet;
use std::time::Duration;

use axum::http::{HeaderName, Method};
use idem_core::leased::OnUnknown;
use idem_core::{ConfigError, FingerprintSpec, Operation, Policy, Tenant};
use idem_http::{RouteConfig, TenantSource};

pub use crate::path::PathPattern;
use serde::Deserialize;

/// The tenant of every request when the route names no other source.
pub const DEFAULT_TENANT: &str = "default";
/// The operation of the route `--upstream` alone sets up.
pub const DEFAULT_OPERATION: &str = "gateway";
/// Default lease of a forward: how long it may go without a heartbeat
/// before a retry counts it as abandoned.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(5);
/// Default limit of one forward, from the request sent to the answer read.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// The bounds of [`GatewayConfig::timeout`].
pub const TIMEOUT_RANGE: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_secs(3600));
/// The bounds of [`Route::lease`].
pub const LEASE_RANGE: (Duration, Duration) =
    (Duration::from_millis(500), Duration::from_secs(3600));
/// Default bound of the answer bytes the gateway holds at once
/// ([`GatewayConfig::max_held_bytes`]).
pub const DEFAULT_MAX_HELD_BYTES: usize = 256 << 20;
/// The largest [`GatewayConfig::max_held_bytes`].
pub const MAX_HELD_BYTES_LIMIT: usize = 16 << 30;
/// The statuses that say the upstream did not act on a request when a
/// route names none: `429 Too Many Requests`.
pub const DEFAULT_NOT_PROCESSED: [u16; 1] = [429];

/// The gateway: where to forward, and which routes hold keys.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// `http://HOST:PORT[/PREFIX]`.
    pub upstream: HttpBase,
    /// Keyed routes, the first match wins; anything else passes through.
    pub routes: Vec<Route>,
    /// The limit of one forward.
    pub timeout: Duration,
    /// Largest request body passed through on an unlisted route.
    pub max_body_bytes: usize,
    /// The answer bytes held at once, over every request: a keyed forward
    /// reserves its route's `max_response_bytes` before it is sent and
    /// keeps what it read until its client has it; a replay keeps its
    /// body's bytes the same way. Past it a request is refused with `503
    /// gateway-busy` before anything is sent. Pass-through answers are
    /// streamed and hold none.
    pub max_held_bytes: usize,
}

impl GatewayConfig {
    /// A gateway in front of `upstream` with the default routes (every POST
    /// and PATCH keyed, the key optional) and the default timeout.
    pub fn new(upstream: HttpBase, max_body_bytes: usize) -> Self {
        Self {
            upstream,
            routes: default_routes(),
            timeout: DEFAULT_TIMEOUT,
            max_body_bytes,
            max_held_bytes: DEFAULT_MAX_HELD_BYTES,
        }
    }

    /// The largest request body the gateway accepts on any route: a keyed
    /// route's `max_request_bytes`, or `max_body_bytes` passed through.
    pub fn largest_body(&self) -> usize {
        self.routes
            .iter()
            .map(|r| r.config.max_request_bytes)
            .fold(self.max_body_bytes, usize::max)
    }

    /// Checks the bounds and every route against the timeout; the error
    /// names the route by its index.
    pub fn validate(&self) -> Result<(), GatewayConfigError> {
        let (lo, hi) = TIMEOUT_RANGE;
        ConfigError::check_duration("gateway", "timeout", self.timeout, lo, hi)?;
        ConfigError::check_range("gateway", "max_body_bytes", self.max_body_bytes, 1, 1 << 30)?;
        ConfigError::check_range(
            "gateway",
            "max_held_bytes",
            self.max_held_bytes,
            1,
            MAX_HELD_BYTES_LIMIT,
        )?;
        for (i, route) in self.routes.iter().enumerate() {
            route
                .check_against(self)
                .map_err(|e| GatewayConfigError::Route(i, Box::new(e)))?;
        }
        Ok(())
    }
}

/// A setting the gateway cannot use.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GatewayConfigError {
    /// A value out of its bounds.
    #[error(transparent)]
    Invalid(#[from] ConfigError),
    /// A route's setting, with what is wrong (`lease: …`).
    #[error("{0}")]
    Setting(String),
    /// The route at this index (of [`GatewayConfig::routes`]).
    #[error("routes[{0}]: {1}")]
    Route(usize, Box<GatewayConfigError>),
}

fn setting(text: String) -> GatewayConfigError {
    GatewayConfigError::Setting(text)
}

/// A keyed route.
#[derive(Debug, Clone)]
pub struct Route {
    /// The method it applies to.
    pub method: Method,
    /// The path it applies to.
    pub path: PathPattern,
    /// Operation, key requirement, TTL and wait, tenant, stored statuses,
    /// fingerprint, body limits: the same settings as the HTTP layer's.
    pub config: RouteConfig,
    /// How long a forward may go without a heartbeat.
    pub lease: Duration,
    /// What happens when a forward's outcome is unknown (it may have
    /// reached the upstream and no answer came back): held for an operator,
    /// verified by a lookup, or forwarded again to an upstream that
    /// deduplicates.
    pub on_unknown: OnUnknown,
    /// The lookup of a `verify` route (`Some` exactly then).
    pub verify: Option<crate::verify::Verify>,
    /// The header the derived key is sent upstream in.
    pub key_header: HeaderName,
    /// Statuses that say the upstream did not act (the key is released, the
    /// answer passed on, not stored): by default 429.
    pub not_processed: BTreeSet<u16>,
    /// Statuses that say an earlier attempt with the key is still running
    /// upstream: passed on as `409 request-in-flight` with `Retry-After`,
    /// never stored. A 409 to a forwarded-again key on a `reforward` route
    /// counts as one too, unless marked `Idempotent-Replayed`.
    pub transient: BTreeSet<u16>,
}

impl Route {
    /// Whether the route covers a request with this method (in any
    /// letters' case: some servers read `post` as `POST`) and path (as
    /// sent: [`PathPattern::covers`]).
    pub fn matches(&self, method: &Method, path: &str) -> bool {
        self.method.as_str().eq_ignore_ascii_case(method.as_str()) && self.path.covers(path)
    }

    /// On a `reforward` route, a key that expires while its forward may
    /// still run would be claimed afresh and forwarded a second time, as a
    /// new request (the other policies hold a pending key until its
    /// outcome is known: [`idem_core::leased::claim_expires_at_ms`]); the
    /// answer bytes a forward reserves must fit in the gateway's budget.
    fn check_against(&self, gateway: &GatewayConfig) -> Result<(), GatewayConfigError> {
        if self.on_unknown.repeat_is_harmless()
            && self.config.policy.ttl < gateway.timeout + self.lease
        {
            return Err(setting(format!(
                "ttl must be at least the gateway's timeout plus the route's lease ({:?} + {:?}) \
                 on a reforward route: a key that expires while its forward may still run is \
                 claimed afresh",
                gateway.timeout, self.lease,
            )));
        }
        if self.config.max_response_bytes > gateway.max_held_bytes {
            return Err(setting(format!(
                "max_response_bytes ({}) is more than the gateway's max_held_bytes ({}): no \
                 forward could ever reserve its answer",
                self.config.max_response_bytes, gateway.max_held_bytes
            )));
        }
        Ok(())
    }
}

/// One route as an operator writes it: every key but `method`, `path` and
/// `operation` is optional. Unknown keys are refused. In code, name what
/// you set and take the rest from `..RouteSpec::default()` (whose empty
/// `method`, `path` and `operation` [`RouteSpec::route`] refuses).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSpec {
    /// `POST`, `PUT`, `PATCH`, `DELETE` (case-insensitive); safe methods are
    /// refused.
    pub method: String,
    /// `/v1/payments/{id}/refunds`, or `*` for every path.
    pub path: String,
    /// The operation keys are scoped to.
    pub operation: String,
    /// `required` (the default) or `optional`.
    pub key: Option<String>,
    /// How long a stored answer is replayed (default 24h).
    pub ttl: Option<String>,
    /// How long a forward may go without a heartbeat (default 5s).
    pub lease: Option<String>,
    /// How long a retry waits for a forward in flight before 409.
    pub wait: Option<String>,
    /// `reject` (the default), `verify` or `reforward`.
    pub on_unknown: Option<String>,
    /// `verify` routes: the lookup, `GET /path?query` with `{key}` (the
    /// derived key), `{/json/pointer}` (a field of the request body) or
    /// `{param}` (a `{param}` segment of `path`) in it.
    pub verify: Option<String>,
    /// `verify` routes: a JSON pointer into the lookup's 2xx answer; a
    /// value there (not null, not an empty array) means found, and is the
    /// answer stored. Without it a 2xx is found and a 404 is not.
    pub verify_found: Option<String>,
    /// `verify` routes: the status a found answer is stored with (200).
    pub verify_status: Option<u16>,
    /// `verify` routes: JSON pointers whose values a found resource must
    /// share with the request, or it is another intent's (default: the
    /// body fields the lookup names). Name a field only the caller's own
    /// resources have (a customer) when references may repeat across
    /// callers.
    pub verify_match: Option<Vec<String>>,
    /// `verify` routes: how long after an unknown outcome a request the
    /// gateway sent may still land upstream; a lookup that finds nothing
    /// before then is not trusted (default 60s).
    pub landing: Option<String>,
    /// The header the derived key is sent in (default `Idempotency-Key`).
    pub key_header: Option<String>,
    /// Statuses that say the upstream did not act: the key is released and
    /// the answer passed on (default `[429]`).
    pub not_processed: Option<Vec<u16>>,
    /// Statuses that say an earlier attempt with the key is still running
    /// upstream (default none besides the `reforward` 409 rule).
    pub transient: Option<Vec<u16>>,
    /// Response headers replayed besides the default allow-list.
    #[serde(default)]
    pub replay_headers: Vec<String>,
    /// JSON pointers left out of the fingerprint.
    #[serde(default)]
    pub ignore_fields: Vec<String>,
    /// A header a trusted component in front sets to the tenant.
    pub tenant_header: Option<String>,
    /// The tenant (the default of `tenant_header`, or the static one).
    pub tenant: Option<String>,
    /// 4xx statuses stored and replayed.
    pub store_statuses: Option<Vec<u16>>,
    /// Largest request body.
    pub max_request_bytes: Option<usize>,
    /// Largest answer stored.
    pub max_response_bytes: Option<usize>,
}

/// A duration setting within its bounds.
fn duration(
    field: &'static str,
    text: &str,
    lo: Duration,
    hi: Duration,
) -> Result<Duration, GatewayConfigError> {
    let d = humantime::parse_duration(text)
        .map_err(|e| setting(format!("{field}: {text:?} is not a duration ({e})")))?;
    ConfigError::check_duration("gateway.routes", field, d, lo, hi)?;
    Ok(d)
}

/// Every POST and PATCH, the key optional, one static tenant.
pub fn default_routes() -> Vec<Route> {
    let (Ok(tenant), Ok(operation)) = (
        Tenant::new(DEFAULT_TENANT),
        Operation::new(DEFAULT_OPERATION),
    ) else {
        unreachable!("the default tenant and operation are valid names");
    };
    let tenant = TenantSource::Static(tenant);
    [Method::POST, Method::PATCH]
        .into_iter()
        .map(|method| Route {
            method,
            path: PathPattern::any(),
            config: RouteConfig::optional(operation.clone(), tenant.clone()),
            lease: DEFAULT_LEASE,
            on_unknown: OnUnknown::Reject,
            verify: None,
            key_header: idem_http::IDEMPOTENCY_KEY,
            not_processed: DEFAULT_NOT_PROCESSED.into_iter().collect(),
            transient: BTreeSet::new(),
        })
        .collect()
}

impl RouteSpec {
    /// The route, every value checked; the error names the setting.
    pub fn route(self) -> Result<Route, GatewayConfigError> {
        let f = self;
        let method: Method = f
            .method
            .to_ascii_uppercase()
            .parse()
            .map_err(|_| setting(format!("method: {:?} is not a method", f.method)))?;
        if matches!(
            method,
            Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
        ) {
            return Err(setting(format!(
                "method: {method} is safe; only unsafe methods take keys"
            )));
        }
        let path = PathPattern::parse(&f.path).map_err(|e| setting(format!("path: {e}")))?;
        let operation =
            Operation::new(&f.operation).map_err(|e| setting(format!("operation: {e}")))?;
        let tenant = match (&f.tenant_header, &f.tenant) {
            (Some(h), default) => TenantSource::TrustedHeader {
                name: HeaderName::try_from(h.as_str())
                    .map_err(|_| setting(format!("tenant_header: {h:?} is not a header name")))?,
                default: default
                    .as_deref()
                    .map(Tenant::new)
                    .transpose()
                    .map_err(|e| setting(format!("tenant: {e}")))?,
            },
            (None, t) => TenantSource::Static(
                Tenant::new(t.as_deref().unwrap_or(DEFAULT_TENANT))
                    .map_err(|e| setting(format!("tenant: {e}")))?,
            ),
        };
        let mut config = match f.key.as_deref() {
            None | Some("required") => RouteConfig::required(operation, tenant),
            Some("optional") => RouteConfig::optional(operation, tenant),
            Some(other) => {
                return Err(setting(format!(
                    "key: {other:?}; expected \"required\" or \"optional\""
                )));
            }
        };
        config.methods = vec![method.clone()];
        let mut policy = Policy::default();
        if let Some(t) = &f.ttl {
            policy = policy.ttl(duration("ttl", t, Duration::from_secs(1), Policy::MAX_TTL)?);
        }
        if let Some(w) = &f.wait {
            policy.wait = duration("wait", w, Duration::ZERO, Policy::MAX_WAIT)?;
        }
        config.policy = policy;
        let mut spec = FingerprintSpec::default();
        for p in &f.ignore_fields {
            spec = spec
                .ignore_field(p)
                .ok_or_else(|| setting(format!("ignore_fields: {p:?} is not a JSON pointer")))?;
        }
        config.fingerprint = spec;
        if let Some(statuses) = f.store_statuses {
            if let Some(s) = statuses.iter().find(|s| !(400..=499).contains(*s)) {
                return Err(setting(format!(
                    "store_statuses: {s} is not a 4xx status (2xx and 3xx are always stored)"
                )));
            }
            config.store_client_errors = statuses.into_iter().collect();
        }
        if let Some(n) = f.max_request_bytes {
            config.max_request_bytes = n;
        }
        if let Some(n) = f.max_response_bytes {
            config.max_response_bytes = n;
        }
        for h in &f.replay_headers {
            let name = HeaderName::try_from(h.as_str())
                .map_err(|_| setting(format!("replay_headers: {h:?} is not a header name")))?;
            config = config
                .replay_header(name)
                .map_err(|e| setting(format!("replay_headers: {e}")))?;
        }
        config.validate().map_err(|e| setting(e.to_string()))?;
        let lease = match &f.lease {
            Some(l) => duration("lease", l, LEASE_RANGE.0, LEASE_RANGE.1)?,
            None => DEFAULT_LEASE,
        };
        let on_unknown = match f.on_unknown.as_deref() {
            None => OnUnknown::Reject,
            Some(name) => OnUnknown::parse(name).ok_or_else(|| {
                setting(format!(
                    "on_unknown: {name:?}; expected \"reject\", \"verify\" or \"reforward\""
                ))
            })?,
        };
        let verify = match (on_unknown, f.verify) {
            (OnUnknown::Verify, Some(lookup)) => Some(
                crate::verify::Verify::parse(
                    crate::verify::VerifySettings {
                        lookup: &lookup,
                        found: f.verify_found.as_deref(),
                        status: f.verify_status,
                        landing: f.landing.as_deref(),
                        matching: f.verify_match.as_deref(),
                    },
                    &path,
                )
                .map_err(setting)?,
            ),
            (OnUnknown::Verify, None) => {
                return Err(setting(
                    "verify: required with on_unknown = \"verify\" (the lookup that tells \
                     whether a forward landed, e.g. \"GET /v1/payments?reference={/reference}\")"
                        .into(),
                ));
            }
            (_, lookup) => {
                let stray = [
                    ("verify", lookup.is_some()),
                    ("verify_found", f.verify_found.is_some()),
                    ("verify_status", f.verify_status.is_some()),
                    ("landing", f.landing.is_some()),
                    ("verify_match", f.verify_match.is_some()),
                ];
                if let Some((name, _)) = stray.iter().find(|(_, set)| *set) {
                    return Err(setting(format!(
                        "{name}: only with on_unknown = \"verify\""
                    )));
                }
                None
            }
        };
        // A field the fingerprint ignores may differ between retries of one
        // key: a lookup by it would look up another intent's value.
        if let Some(v) = &verify {
            let overlaps = |a: &str, b: &str| {
                a == b || b.starts_with(&format!("{a}/")) || a.starts_with(&format!("{b}/"))
            };
            for ignored in &f.ignore_fields {
                if let Some(p) = v.pointers().find(|p| overlaps(ignored, p)) {
                    return Err(setting(format!(
                        "ignore_fields: {ignored:?} covers {p}, which the lookup or verify_match \
                         reads: retries of one key may differ there"
                    )));
                }
            }
        }
        let key_header = match &f.key_header {
            None => idem_http::IDEMPOTENCY_KEY,
            Some(h) => {
                let name = HeaderName::try_from(h.as_str())
                    .map_err(|_| setting(format!("key_header: {h:?} is not a header name")))?;
                if reserved_header(name.as_str()) {
                    return Err(setting(format!(
                        "key_header: {h:?} is a header the gateway or HTTP itself gives a \
                         meaning (framing, routing, credentials, encodings); name one of the \
                         upstream's own, such as Idempotency-Key or X-Request-Id"
                    )));
                }
                name
            }
        };
        let not_processed = statuses(
            "not_processed",
            f.not_processed
                .unwrap_or_else(|| DEFAULT_NOT_PROCESSED.to_vec()),
            &config.store_client_errors.iter().copied().collect(),
        )?;
        let mut taken: BTreeSet<u16> = config.store_client_errors.iter().copied().collect();
        taken.extend(&not_processed);
        let transient = statuses("transient", f.transient.unwrap_or_default(), &taken)?;
        Ok(Route {
            method,
            path,
            config,
            lease,
            on_unknown,
            verify,
            key_header,
            not_processed,
            transient,
        })
    }
}

/// Whether the derived key may not be sent under this (lowercase) header:
/// one that frames or routes the request, carries credentials or
/// encodings, or that the gateway sets itself.
fn reserved_header(name: &str) -> bool {
    const RESERVED: &[&str] = &[
        "accept-encoding",
        "authorization",
        "connection",
        "content-encoding",
        "content-length",
        "content-type",
        "cookie",
        "expect",
        "forwarded",
        "host",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "via",
    ];
    RESERVED.contains(&name) || name.starts_with("x-forwarded-") || name.starts_with("content-")
}

/// A list of 4xx/5xx statuses, none of them in `taken` (stored, or named
/// by another list).
fn statuses(
    field: &str,
    list: Vec<u16>,
    taken: &BTreeSet<u16>,
) -> Result<BTreeSet<u16>, GatewayConfigError> {
    for s in &list {
        if !(400..=599).contains(s) {
            return Err(setting(format!("{field}: {s} is not a 4xx or 5xx status")));
        }
        if taken.contains(s) {
            return Err(setting(format!(
                "{field}: {s} is stored (store_statuses) or already listed: one meaning per status"
            )));
        }
    }
    Ok(list.into_iter().collect())
}

/// A base URL `http://HOST:PORT[/PREFIX]` given by an operator (the
/// gateway's upstream, the drill's target, the checkout's peers), split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpBase {
    /// `HOST:PORT` to connect to (port 80 when none was given).
    pub authority: String,
    /// Prefix of every path, without its trailing `/` (empty for none).
    pub prefix: String,
}

impl HttpBase {
    /// Parses `url`; the error names `what` and the reason: not a URL,
    /// another scheme (https: not supported, a TLS proxy in between), no
    /// host, credentials (they would be logged with the URL), a query.
    pub fn parse(what: &str, url: &str) -> Result<Self, String> {
        let uri: axum::http::Uri = url.parse().map_err(|e| {
            format!("{what}: {url:?} is not a URL ({e}); expected http://HOST:PORT[/PREFIX]")
        })?;
        let authority = match (uri.scheme_str(), uri.authority()) {
            (Some("http"), Some(a)) if !a.host().is_empty() => a,
            (Some("https"), _) => {
                return Err(format!(
                    "{what} must be an http:// URL, got {url}: https is not supported; put a \
                     TLS-terminating proxy in between"
                ));
            }
            _ => {
                return Err(format!(
                    "{what} must be an http:// URL with a host (expected \
                     http://HOST:PORT[/PREFIX]), got {url}"
                ));
            }
        };
        if authority.as_str().contains('@') {
            return Err(format!("{what} must not hold credentials (user:password@)"));
        }
        if uri.query().is_some() {
            return Err(format!("{what} must not have a query string"));
        }
        Ok(Self {
            authority: match authority.port_u16() {
                Some(_) => authority.as_str().to_owned(),
                None => format!("{}:80", authority.host()),
            },
            prefix: uri.path().trim_end_matches('/').to_owned(),
        })
    }
}
